"""Each experiment tracker for real: roll's Tracker logs a short run, the test reads the tracker's own files back.

Each tracker runs in a subprocess with its own HOME (W&B, SwanLab and trackio keep state there and in module globals),
offline or local. The packages are optional extras (``roll-pipelines[trackers]``), outside the Pants resolve: these
tests carry the ``extra`` marker, skip where the package is missing, and ``./tools/dev test`` runs them in the dev venv.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.extra("trackers")

EXP = "tracked-run"
CONFIG = {"seed": 7, "actor_train": {"lr": 0.001, "name": "actor"}}
STEPS = {
    1: {"loss": 1.0, "reward": 0.25, "val/accuracy": 0.5, "len@max": 12, "done": True, "tag": "text, not a number"},
    2: {"loss": 0.5, "reward": 0.5, "val/accuracy": 0.625, "len@max": 9, "done": False, "tag": "x"},
    3: {"loss": 0.25, "reward": 0.75, "val/accuracy": 0.75, "len@max": 7, "done": True, "tag": "y"},
}
# What every backend must hold: the numeric metrics of each step (bools as 0/1; strings are not scalars).
EXPECTED = {
    step: {k: float(v) for k, v in metrics.items() if not isinstance(v, str)} for step, metrics in STEPS.items()
}
KWARGS = {"wandb": {"mode": "offline", "project": "roll-tests"}, "swanlab": {"mode": "offline"}}
PACKAGES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
    "swanlab": "swanlab",
}

_SCRIPT = """
import json, sys
from pathlib import Path
from roll.pipelines.tracking import Tracker

out, name, steps, config, kwargs = Path(sys.argv[1]), sys.argv[2], *map(json.loads, sys.argv[3:])
tracker = Tracker(out, [name], exp_name={exp!r}, config=config, tracker_kwargs=kwargs)
for step, metrics in steps.items():
    tracker.log(int(step), metrics)
tracker.finish()
"""


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> Callable[[str], Path]:
    """``logged(tracker)``: the output folder of a 3-step run logged to that tracker (once per module)."""
    done: dict[str, Path] = {}

    def run(name: str) -> Path:
        pytest.importorskip(PACKAGES[name], reason=f"tracker {name!r} needs roll-pipelines[{name}]")
        if name not in done:
            root = tmp_path_factory.mktemp(name)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "SWANLAB_"))}
            env.update(HOME=str(root / "home"), TRACKIO_DIR=str(root / "trackio"), WANDB_SILENT="true")
            script = textwrap.dedent(_SCRIPT.format(exp=EXP))
            args = [str(root / "out"), name, json.dumps(STEPS), json.dumps(CONFIG), json.dumps(KWARGS)]
            proc = subprocess.run(
                [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600
            )
            assert proc.returncode == 0, f"logging to {name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
            done[name] = root
        return done[name]

    return run


def _leveldb_records(path: Path, ident: bytes) -> Iterator[bytes]:
    """The records of a LevelDB-log-framed file (W&B's ``.wandb``, SwanLab's ``.swanlab``): a 7-byte file header,
    then 32 KiB blocks of chunks ``crc32 (4) | length (2) | type (1) | data``; type 1 is a whole record, 2/3/4 the
    first/middle/last piece of one."""
    data = path.read_bytes()
    assert data[:4] == ident, f"{path} does not start with {ident!r}"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding: the rest of the block is empty
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield pending
            pending = b""


def _assert_series(got: dict[int, dict[str, float]], rename: Callable[[str], str] = lambda k: k) -> None:
    for step, metrics in EXPECTED.items():
        want = {rename(k): v for k, v in metrics.items()}
        assert got.get(step) == pytest.approx(want), f"step {step}: {got.get(step)} != {want}"


def test_tensorboard_event_files_hold_every_scalar(logged):
    root = logged("tensorboard")  # first: it skips the test where the package is missing
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(root / "out" / "tensorboard"))
    events.Reload()
    got: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            got.setdefault(event.step, {})[tag] = event.value
    _assert_series(got)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:mlflow")  # SQLAlchemy's, raised inside MLflow's store
def test_mlflow_store_in_the_output_folder_holds_metrics_and_flattened_config(logged):
    out = logged("mlflow") / "out"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(EXP).experiment_id])
    assert run.info.run_name == EXP and run.info.status == "FINISHED"
    assert run.data.params == {"seed": "7", "actor_train.lr": "0.001", "actor_train.name": "actor"}
    got: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for point in client.get_metric_history(run.info.run_id, key):
            got.setdefault(point.step, {})[key] = point.value
    _assert_series(got, rename=lambda k: k.replace("@", "_"))  # MLflow refuses '@' in keys


def test_wandb_offline_run_file_holds_history_and_config(logged):
    (run_file,) = (logged("wandb") / "out" / "wandb").glob("offline-run-*/run-*.wandb")
    from wandb.proto import wandb_internal_pb2

    got: dict[int, dict[str, float]] = {}
    config: dict[str, object] = {}
    for raw in _leveldb_records(run_file, b":W&B"):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            got[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({"/".join(u.nested_key) or u.key: json.loads(u.value_json) for u in updates})
    _assert_series(got)
    assert config["seed"] == 7 and config["actor_train"] == CONFIG["actor_train"]


def test_trackio_local_database_holds_metrics_and_config(logged):
    database = logged("trackio") / "trackio" / f"{EXP}.db"
    with sqlite3.connect(database) as conn:
        rows = conn.execute("SELECT step, metrics FROM metrics ORDER BY step").fetchall()
        (config,) = conn.execute("SELECT config FROM configs").fetchone()
    _assert_series({step: json.loads(metrics) for step, metrics in rows})
    assert {k: v for k, v in json.loads(config).items() if not k.startswith("_")} == CONFIG


def test_swanlab_offline_run_file_holds_scalars(logged):
    (run_file,) = (logged("swanlab") / "out" / "swanlog").glob("run-*/run-*.swanlab")
    from swanlab.proto.swanlab.record.v1 import record_pb2

    got: dict[int, dict[str, float]] = {}
    for raw in _leveldb_records(run_file, b":SWL"):
        record = record_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "scalar":
            got.setdefault(record.scalar.step, {})[record.scalar.key] = record.scalar.value.number
    _assert_series(got)
    assert (run_file.parent / "files" / "config.yaml").is_file()
