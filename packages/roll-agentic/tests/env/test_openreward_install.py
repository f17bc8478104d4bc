"""``python -m roll.agentic.env.openreward_install``: the SDK without its dependencies, then those but sse-starlette."""

from __future__ import annotations

import subprocess
import sys

import pytest

from roll.agentic.env import openreward_install
from roll.agentic.env.openreward_install import sdk_requirements, sdk_spec

SDK_REQUIRES = [
    "aiohttp>=3.13.2",
    "SSE_Starlette==2.3.6",
    "pydantic>=2.11.5",
    'tomli>=2; python_version < "3.11"',
    'pytest>=7.0.0; extra == "dev"',
    "tavily-python>=0.7.0; extra == 'search'",
]


def test_the_sdks_requirements_but_its_extras_and_sse_starlette() -> None:
    assert sdk_requirements(SDK_REQUIRES) == [
        "aiohttp>=3.13.2",
        "pydantic>=2.11.5",
        'tomli>=2; python_version < "3.11"',
    ]


def test_the_sdk_spec_comes_from_roll_agentics_openreward_extra() -> None:
    requires = ["pydantic>=2", "mcp>=1.9; extra == 'mcp'", "openreward<0.2,>=0.1.160; extra == 'openreward'"]
    assert sdk_spec(requires) == "openreward<0.2,>=0.1.160"
    with pytest.raises(SystemExit, match="no openreward extra"):
        sdk_spec(["pydantic>=2"])


def test_main_installs_the_sdk_bare_then_its_requirements_with_the_pip_arguments(monkeypatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "check_call", lambda cmd: calls.append(cmd) or 0)
    # (roll-agentic's and the SDK's metadata: tests also run from sources, without an installed roll-agentic)
    monkeypatch.setattr(openreward_install, "sdk_spec", lambda: "openreward<0.2,>=0.1.160")
    monkeypatch.setattr(openreward_install, "sdk_requirements", lambda: ["aiohttp>=3.13.2", "pydantic>=2.11.5"])
    assert openreward_install.main(["torch==2.13.0"]) == 0
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    assert calls == [
        [*pip, "--no-deps", "openreward<0.2,>=0.1.160"],
        [*pip, "torch==2.13.0", "aiohttp>=3.13.2", "pydantic>=2.11.5"],
    ]
