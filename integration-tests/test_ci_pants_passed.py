"""tools/ci/pants_passed.py: the plain-pytest pass of ``./tools/dev test`` leaves out exactly the tests that a JUnit
report of the Pants pass says passed, and runs the rest (skipped, failed, errored, xfailed, never reported)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.ci.pants_passed import junit_address, passed_in_reports

REPO = Path(__file__).resolve().parents[1]

# Every shape of node id a report can name: module functions, parameters (with "::", "/" and "." inside), classes,
# nested classes, a package folder whose name has a dash; and every outcome.
TESTS = """
import pytest

def test_passes():
    pass

@pytest.mark.parametrize("x", ["a::b", "c/d.py", 3])
def test_params(x):
    pass

class TestOuter:
    def test_in_class(self):
        pass

    class TestInner:
        def test_nested(self):
            pass

def test_skipped():
    pytest.skip("no backend")

@pytest.mark.xfail(reason="known")
def test_xfails():
    assert False

def test_fails():
    assert False

@pytest.fixture
def broken():
    raise RuntimeError("setup")

def test_errors(broken):
    pass
"""
PASSED = {
    "test_passes",
    "test_params[a::b]",
    "test_params[c/d.py]",
    "test_params[3]",
    "TestOuter::test_in_class",
    "TestOuter::TestInner::test_nested",
}
NOT_PASSED = {"test_skipped", "test_xfails", "test_fails", "test_errors"}


def _pytest(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tools.ci.pants_passed", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "ROLL_TEST_PASSED_REPORTS": "", **(env or {})},
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("proj")
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    tests = root / "packages" / "roll-x" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_shapes.py").write_text(TESTS)
    return root


def _ids(names: set[str]) -> set[str]:
    return {f"packages/roll-x/tests/test_shapes.py::{name}" for name in names}


def _ran(run: subprocess.CompletedProcess[str]) -> set[str]:
    """The node ids of ``-v``'s result lines."""
    return {m[1] for m in re.finditer(r"^(packages/\S+::\S+) (?:PASSED|FAILED|SKIPPED|XFAIL|ERROR)", run.stdout, re.M)}


def test_the_addresses_are_the_ones_pytest_writes(project: Path) -> None:
    reports = project / "reports"
    reports.mkdir()
    run = _pytest(project, "packages/roll-x/tests", f"--junitxml={reports / 'batch.xml'}")
    assert run.returncode == 1, run.stdout  # test_fails and test_errors
    assert passed_in_reports(reports) == {junit_address(nodeid) for nodeid in _ids(PASSED)}
    assert junit_address("packages/roll-x/tests/test_shapes.py::TestOuter::test_in_class") == (
        "packages.roll-x.tests.test_shapes.TestOuter",
        "test_in_class",
    )


def test_the_passed_tests_are_deselected_and_the_others_run(project: Path) -> None:
    reports = project / "reports2"
    reports.mkdir()
    _pytest(project, "packages/roll-x/tests", f"--junitxml={reports / 'batch.xml'}")
    (reports / "other-batch.xml").write_text('<?xml version="1.0"?><testsuites><testsuite tests="0"/></testsuites>')
    run = _pytest(project, "packages/roll-x/tests", "-v", env={"ROLL_TEST_PASSED_REPORTS": str(reports)})
    assert _ran(run) == _ids(NOT_PASSED), run.stdout
    assert f"6 tests passed in this run's Pants pass ({reports}) and were not run again" in run.stdout
    assert "6 deselected" in run.stdout


def test_no_reports_or_an_unreadable_one_runs_everything(project: Path) -> None:
    everything = _ids(PASSED | NOT_PASSED)
    absent = _pytest(project, "packages/roll-x/tests", "-v", env={"ROLL_TEST_PASSED_REPORTS": str(project / "none")})
    assert _ran(absent) == everything
    assert "0 tests passed in this run's Pants pass" in absent.stdout

    broken = project / "broken"
    broken.mkdir()
    (broken / "batch.xml").write_text("<testsuites><testcase")
    run = _pytest(project, "packages/roll-x/tests", "-v", env={"ROLL_TEST_PASSED_REPORTS": str(broken)})
    assert _ran(run) == everything
    assert f"could not read the Pants reports in {broken}" in run.stdout
    assert "every test runs here" in run.stdout
