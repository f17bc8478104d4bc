"""tools/bench is a package: every benchmark runs as ``python -m tools.bench.<name>`` with no sys.path edits, and
reporting (tables, the RESULT line, a result file) is shared, separate from measuring."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tools.bench._report import emit_result, table

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(p.stem for p in (REPO / "tools" / "bench").glob("[!_]*.py"))


def test_the_benchmarks_are_found():
    assert {"protocol", "dispatch", "strategies", "rlvr_vs_trl"} <= set(BENCHES)


def _help(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"tools.bench.{name}", "--help"], cwd=REPO, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def help_runs(request: pytest.FixtureRequest) -> dict[str, subprocess.CompletedProcess[str]]:
    """``python -m tools.bench.<name> --help`` of each selected benchmark, one process per core at a time: most of
    each run is importing torch, so running them side by side halves their time on two cores."""
    names = [
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module and item.originalname == "test_every_benchmark_runs_as_a_module"
    ]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(names, pool.map(_help, names)))


@pytest.mark.parametrize("name", BENCHES)
def test_every_benchmark_runs_as_a_module(name: str, help_runs: dict[str, subprocess.CompletedProcess[str]]):
    done = help_runs[name]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--result-file" in done.stdout


def test_no_benchmark_edits_sys_path():
    edits = re.compile(r"sys\.path\.(insert|append|extend)\(")
    offenders = [p.name for p in (REPO / "tools" / "bench").glob("*.py") if edits.search(p.read_text())]
    assert offenders == []


def test_the_result_line_and_file_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    result = {"benchmark": "x", "ratio": 1.25, "path": tmp_path}
    emit_result(result, tmp_path / "out" / "result.json")
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("RESULT ")
    assert json.loads(line[len("RESULT ") :]) == json.loads((tmp_path / "out" / "result.json").read_text())
    assert json.loads((tmp_path / "out" / "result.json").read_text())["path"] == str(tmp_path)
    assert table([["a", 1.5]], ["name", "value"]).splitlines() == ["name  value", "----  -----", "a       1.5"]


def test_a_verl_side_that_cannot_run_is_an_error_entry_not_a_crash(monkeypatch: pytest.MonkeyPatch):
    from tools.bench import _sides

    def no_venv(log):
        raise RuntimeError("could not create the verl venv at X: pip failed")

    monkeypatch.setattr(_sides, "ensure_verl_venv", no_venv)
    assert _sides.run_verl_side("protocol", [], timeout_s=5) == {
        "error": "could not create the verl venv at X: pip failed"
    }

    monkeypatch.setattr(_sides, "ensure_verl_venv", lambda log: Path(sys.executable))
    failed = _sides.run_verl_side("no_such_side_module", [], timeout_s=60)
    assert failed["error"].startswith("verl side failed: side benchmark exited with rc=1")
