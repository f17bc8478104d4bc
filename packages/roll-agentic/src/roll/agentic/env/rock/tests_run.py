"""Running a terminal-bench / SWE-bench task's tests in its sandbox, and reading the verdict.

A task's files live on this machine under one of ``test_files``: ``<folder>/<task_name>/run-tests.sh`` and an
optional ``<folder>/<task_name>/tests/`` folder (and ``solution.sh`` for ``exp_mode: eval_gt``). The tests folder is
packed, uploaded to ``/tests`` and unpacked there, ``run-tests.sh`` is uploaded beside it and run from the project
folder. The verdict follows ROLL's ``SandboxManagerV2._parse_test_results``: the output after the last section
marker ("SWEBench results starts here", "short test summary info", "test session starts") is read; it passes when
it says "All tests passed", or has "PASSED" and no "FAILED", or "PASS" and no "FAIL".
"""

from __future__ import annotations

import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from roll.agentic.env.rock.sandbox import SandboxClient

__all__ = ["TestResult", "find_task_dir", "passed", "run_solution", "run_task_tests"]

REMOTE_TESTS = "/tests"
_SECTIONS = ("SWEBench results starts here", "short test summary info", "test session starts")


@dataclass
class TestResult:
    resolved: bool
    output: str
    failure: str = ""  # "" or why the tests could not run (then resolved is False)


def passed(output: str) -> bool:
    """ROLL's reading of a test log."""
    for marker in _SECTIONS:
        if marker in output:
            output = output.split(marker)[-1]
    if "All tests passed" in output:
        return True
    return ("PASSED" in output and "FAILED" not in output) or ("PASS" in output and "FAIL" not in output)


def find_task_dir(test_files: list[str], task_name: str) -> Path | None:
    for folder in test_files:
        candidate = Path(folder) / task_name
        if candidate.is_dir():
            return candidate
    return None


def run_task_tests(
    sandbox: SandboxClient, test_files: list[str], task_name: str, project_path: str, timeout: float
) -> TestResult:
    """Upload and run the task's tests; every failure to run them is a failed (unresolved) result, never raised."""
    task_dir = find_task_dir(test_files, task_name)
    if task_dir is None or not (task_dir / "run-tests.sh").is_file():
        return TestResult(False, "", f"test_files_not_found: no {task_name}/run-tests.sh under {test_files}")
    try:
        code, output = sandbox.run(f"mkdir -p {REMOTE_TESTS}", timeout)
        if code != 0:
            return TestResult(False, output, "test_directory_creation_failed")
        tests = task_dir / "tests"
        if tests.is_dir():
            with tempfile.TemporaryDirectory() as tmp:
                archive = Path(tmp) / f"{task_name}_tests.tar.gz"
                with tarfile.open(archive, "w:gz") as tar:
                    tar.add(tests, arcname="tests")
                sandbox.upload(str(archive), f"{REMOTE_TESTS}/{archive.name}")
            code, output = sandbox.run(f"cd {REMOTE_TESTS} && tar -xzf {archive.name} && rm {archive.name}", timeout)
            if code != 0:
                return TestResult(False, output, "test_file_upload_failed")
        sandbox.upload(str(task_dir / "run-tests.sh"), f"{REMOTE_TESTS}/run-tests.sh")
        code, output = sandbox.run(f"cd {project_path} && bash {REMOTE_TESTS}/run-tests.sh", timeout)
    except TimeoutError:
        return TestResult(False, "", "test_timeout")
    except Exception as e:  # a sandbox or service fault: the episode fails, the run goes on
        return TestResult(False, "", f"unknown_test_error: {type(e).__name__}: {e}")
    return TestResult(passed(output), output)


def run_solution(
    sandbox: SandboxClient, test_files: list[str], task_name: str, project_path: str, timeout: float
) -> str:
    """exp_mode eval_gt: run the task's ``solution.sh`` in the project folder; '' or why it failed."""
    task_dir = find_task_dir(test_files, task_name)
    if task_dir is None or not (task_dir / "solution.sh").is_file():
        return f"solution_not_found: no {task_name}/solution.sh under {test_files}"
    target = f"{project_path}/solution.sh"
    try:
        sandbox.upload(str(task_dir / "solution.sh"), target)
        code, output = sandbox.run(f"cd {project_path} && bash {target}", timeout)
    except Exception as e:
        return f"solution_failed: {type(e).__name__}: {e}"
    return "" if code == 0 else f"solution_failed: exit code {code}: {output[-500:]}"
