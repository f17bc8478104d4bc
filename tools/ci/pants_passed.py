"""pytest plugin for ``./tools/dev test``: leave out the tests that already passed in this run's Pants pass.

``./tools/dev test`` runs every package's tests in Pants' sandboxes first (``pants test --test-report``, which writes
one JUnit XML file per batch into a folder it empties beforehand), then with plain pytest in the dev venv. Loaded
with ``-p tools.ci.pants_passed`` and ``ROLL_TEST_PASSED_REPORTS=<that folder>``, this plugin deselects, in the
plain pass, each test whose report says it passed under Pants: every test then runs once, in the sandbox where it
can and in the dev venv where it cannot (tests of optional backends, which skip under Pants; the whole-pipeline and
slow tests, which the Pants pass leaves out). A test that was skipped, failed or errored under Pants, or that no
report names, runs here as before; an unreadable report makes this pass run everything (and says so).

Reports name a test as JUnit does (pytest's ``junitxml``): its node id with ``/`` read as ``.`` in the path, ``.py``
dropped, the ``::`` parts before the last as ``classname`` and the last (with its parameters) as ``name``. Both
passes run from the repository root, whose pyproject.toml makes it pytest's rootdir, so the node ids agree.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

__all__ = ["junit_address", "passed_in_reports"]

ENV = "ROLL_TEST_PASSED_REPORTS"


def junit_address(nodeid: str) -> tuple[str, str]:
    """``(classname, name)`` of a pytest node id, as pytest's JUnit XML writes them."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def passed_in_reports(folder: Path) -> set[tuple[str, str]]:
    """The ``(classname, name)`` of every test case that passed in the JUnit XML files of ``folder`` (one with a
    ``failure``, ``error`` or ``skipped`` element did not). ``ET.ParseError`` for a file that is not XML."""
    passed: set[tuple[str, str]] = set()
    for report in sorted(folder.glob("*.xml")):
        for case in ET.parse(report).iter("testcase"):
            if not any(child.tag in ("failure", "error", "skipped") for child in case):
                passed.add((case.get("classname", ""), case.get("name", "")))
    return passed


class _PantsPassed:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.note = ""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        try:
            passed = passed_in_reports(self.folder)
        except (OSError, ET.ParseError) as e:
            self.note = f"{ENV}: could not read the Pants reports in {self.folder} ({e}); every test runs here"
            return
        keep: list[pytest.Item] = []
        done: list[pytest.Item] = []
        for item in items:
            (done if junit_address(item.nodeid) in passed else keep).append(item)
        if done:
            config.hook.pytest_deselected(items=done)
            items[:] = keep
        self.note = f"{len(done)} tests passed in this run's Pants pass ({self.folder}) and were not run again"

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.note:
            terminalreporter.write_line(self.note)


def pytest_configure(config: pytest.Config) -> None:
    folder = os.environ.get(ENV)
    if folder:
        config.pluginmanager.register(_PantsPassed(Path(folder)), "roll-pants-passed")
