"""``roll --help``, ``roll --version`` and ``roll recipes`` answer without importing torch, Ray or transformers (what
made them take seconds). Checked by the modules a fresh interpreter has loaded, not by timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import roll.pipelines
from roll.pipelines.cli import EXIT_CONFIG
from roll.pipelines.recipes import list_recipes
from roll.runtime import ConfigError
from roll.runtime.testing import child_env

HEAVY = ("torch", "ray", "transformers", "tensordict", "vllm", "pyarrow")

_SCRIPT = """
import json, sys
from roll.pipelines.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = [name for name in {heavy!r} if name in sys.modules]
print("RESULT " + json.dumps({{"code": code, "heavy": heavy}}))
"""


def _run(*args: str, columns: int = 100) -> tuple[dict, str]:
    env = child_env(COLUMNS=str(columns))
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    result = json.loads(lines[-1].removeprefix("RESULT "))
    return result, "\n".join(lines[:-1])


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["recipes"], ["run", "--help"]])
def test_quick_commands_import_no_heavy_library(args):
    result, _ = _run(*args)
    assert result["code"] in (0, None)
    assert result["heavy"] == []


def test_version_names_each_roll_package():
    _, out = _run("--version")
    assert out.startswith(f"roll: roll-pipelines {roll.pipelines.__version__}")


def test_recipes_lists_every_recipe_with_its_description():
    _, out = _run("recipes")
    rows: dict[str, str] = {}
    for line in out.splitlines():  # a recipe's name starts its line; its description wraps under its column
        if line[0] != " ":
            name, text = line.split(None, 1)
            rows[name] = text
        else:
            rows[name] += " " + line.strip()
    assert set(rows) >= {"sft-tiny", "dpo-tiny", "rlvr-tiny", "rlvr-rollout-tiny"}
    assert rows["sft-tiny"].startswith("SFT of a tiny random-init model")
    # Every description whole (the recipes installed here: roll-agentic's only where it is), starting in one column
    # and wrapped there (COLUMNS is 100): some are longer than a line.
    assert rows == {name: " ".join(text.split()) for name, text in list_recipes().items()}
    starts = {len(line) - len(line[line.index(" ") :].lstrip()) for line in out.splitlines() if line[0] != " "}
    assert len(starts) == 1
    assert max(map(len, out.splitlines())) <= 100
    assert any(line[0] == " " for line in out.splitlines())


def test_lazy_package_exports_still_resolve():
    assert roll.pipelines.load_config.__module__ == "roll.pipelines.config"
    assert "run_config" in dir(roll.pipelines)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        roll.pipelines.nope  # noqa: B018


def test_exit_code_for_config_errors_is_config_errors():
    assert ConfigError.exit_code == EXIT_CONFIG


def test_help_names_every_kind_of_pipeline():
    from roll.pipelines.cli import build_parser

    description = build_parser().description or ""
    assert all(kind in description for kind in ("SFT", "DPO", "RLVR", "distillation", "agentic", "diffusion"))


def test_http_clients_log_warnings_only_unless_verbose(monkeypatch):
    """The mcp SDK's client (httpx2) logs each request at INFO: an MCP env would fill a run's log with them."""
    import logging

    from roll.pipelines.cli import QUIET_LOGGERS, main

    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    for logger in loggers:
        monkeypatch.setattr(logger, "level", logging.NOTSET)
    assert main(["recipes"]) == 0
    assert [logger.level for logger in loggers] == [logging.WARNING] * len(loggers)
    for logger in loggers:
        logger.setLevel(logging.NOTSET)
    assert main(["--verbose", "recipes"]) == 0
    assert [logger.level for logger in loggers] == [logging.NOTSET] * len(loggers)
