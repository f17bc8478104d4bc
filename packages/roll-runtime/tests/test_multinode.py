"""Multi-node placement on a simulated Ray cluster (2 nodes x 4 fake GPUs), run in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def report() -> dict:
    probe = Path(__file__).with_name("_multinode_probe.py")
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=600, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"probe failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("REPORT "))


def test_device_mapping_places_workers_on_the_right_nodes_and_devices(report):
    node_a, node_b = report["nodes"]
    assert report["total_devices"] == 8
    workers = sorted(report["gpu"], key=lambda w: w["rank"])
    assert [w["node_id"] for w in workers] == [node_a, node_a, node_b, node_b]
    assert [w["visible"] for w in workers] == ["0,1", "2,3", "0,1", "2,3"]
    assert len({tuple(w["master"]) for w in workers}) == 1


def test_roles_can_share_devices(report):
    node_a, _ = report["nodes"]
    (worker,) = report["colocated"]
    assert worker["node_id"] == node_a and worker["visible"] == "2,3"


def test_cpu_workers_spread_across_nodes(report):
    nodes = [w["node_id"] for w in sorted(report["cpu"], key=lambda w: w["rank"])]
    assert len(set(nodes)) == 2
    assert nodes.count(nodes[0]) == 2
    assert all(w["visible"] in (None, "") for w in report["cpu"])


def test_impossible_mappings_are_config_errors(report):
    beyond, spanning = report["errors"]
    assert "uses device ids [8], but the Ray cluster has 8 devices (2 node(s) x 4 GPUs" in beyond
    assert "would span nodes [0, 1]" in spanning and "at most 4 devices" in spanning


def test_a_worker_that_spans_nodes_runs_on_its_first_node_and_reserves_the_others(report):
    node_a, node_b = report["nodes"]
    (worker,) = report["spanning"]["where"]
    assert worker["node_id"] == node_a and worker["visible"] == "2,3"
    (helpers,) = report["spanning"]["helpers"]
    assert [(h["node_rank"], h["node_id"], h["global"], h["local"]) for h in helpers] == [
        (0, node_a, [2, 3], [2, 3]),
        (1, node_b, [4, 5], [0, 1]),
    ]
    # A process started in a node's reservation lands on that node and sees that node's share of the devices.
    assert [h["helper"] for h in helpers] == [
        {"node_id": node_a, "visible": "2,3"},
        {"node_id": node_b, "visible": "0,1"},
    ]
