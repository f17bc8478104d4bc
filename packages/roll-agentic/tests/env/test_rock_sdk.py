"""RockSandbox (roll's client of ROCK's SDK) against an in-process fake of the ROCK service's sandbox endpoints.

The real SDK code runs (rl-rock's ``Sandbox.start`` / ``get_status`` / ``stop`` over HTTP). Only start and stop are
served: ROCK's agent install and its model service run commands inside the sandbox, which this fake does not emulate
(the episode logic above them is tested with the scripted sandbox, tests/env_manager/test_rock_env.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("rock.sdk.sandbox.client")

from roll.agentic.env.rock.config import RockEnvConfig
from roll.agentic.env.rock.sandbox import RockSandbox
from roll.agentic.env.rock.testing import FakeRockService

pytestmark = pytest.mark.extra("rock")


@pytest.fixture
def rock_service() -> Iterator[FakeRockService]:
    with FakeRockService() as service:
        yield service


def _config(url: str) -> RockEnvConfig:
    return RockEnvConfig.model_validate(
        {
            "dataset_name": "unused.jsonl",
            "agent_config": {"agent_type": "default"},
            "sandbox_base_url": url,
            "xrl_authorization": "Bearer t0k",
            "auto_clear_seconds": 600,
            "startup_timeout": 20,
            "timeout": 20,
        }
    )


def test_start_and_stop_go_to_the_service(rock_service: FakeRockService) -> None:
    box = RockSandbox("swebench/sweb.eval:t1", _config(rock_service.url))
    box.start()
    assert box.sandbox_id == "sb-1"
    box.stop()
    box.stop()  # twice is harmless
    names = rock_service.names
    assert names[0] == "start_async" and names[-1] == "stop" and names.count("stop") == 1
    start = rock_service.calls[0].body
    assert (start["image"], start["auto_clear_time"]) == ("swebench/sweb.eval:t1", 10)
    assert rock_service.calls[0].headers.get("XRL-Authorization") == "Bearer t0k"
    assert rock_service.calls[-1].body == {"sandbox_id": "sb-1"}


def test_a_sandbox_that_fails_to_start_is_still_stopped(rock_service: FakeRockService) -> None:
    rock_service.pull_fails = True
    box = RockSandbox("no/such:image", _config(rock_service.url))
    with pytest.raises(Exception, match="no such image"):
        box.start()
    box.stop()
    assert rock_service.names[-1] == "stop"
    assert rock_service.calls[-1].body == {"sandbox_id": "sb-1"}
