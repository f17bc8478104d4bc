"""roll's Sokoban MCP server, in-process (the SDK's in-memory client): ROLL's JSON answers, the local env's rooms,
games that end, and tool errors for moves it cannot make."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from roll.agentic.env import SokobanEnv

pytestmark = pytest.mark.extra("mcp")


@pytest.fixture(autouse=True)
def _needs_mcp() -> None:
    pytest.importorskip("mcp")  # per test: a module skipped whole collects nothing, a failure under Pants


def _play(calls: list[tuple[str, dict[str, Any]]], **settings: Any) -> list[Any]:
    """Each call's JSON answer, or ``"error: <text>"`` for a tool error, from one session of a fresh server."""
    from mcp import Client

    from roll.agentic.env.sokoban_mcp_server import build_server

    async def run() -> list[Any]:
        out: list[Any] = []
        async with Client(build_server(**settings)) as client:
            for name, arguments in calls:
                result = await client.call_tool(name, arguments)
                text = result.content[0].text
                out.append(f"error: {text}" if getattr(result, "is_error", False) else json.loads(text))
        return out

    return asyncio.run(run())


def test_reset_and_play_answer_rolls_keys_with_the_local_envs_room() -> None:
    reset, moved = _play([("reset", {"seed": 2}), ("play", {"action": 3})])
    local = SokobanEnv(max_steps=100)
    assert reset == {
        "Observation": local.reset(2)[0],
        "Reward": 0.0,
        "Game End": False,
        "info": {"success": False, "action_is_effective": False, "steps": 0},
    }
    room, reward, _, _, info = local.step("<answer>Left</answer>")
    assert moved["Observation"] == room and moved["Reward"] == pytest.approx(reward) and moved["Game End"] is False
    assert moved["info"] == {
        "success": False,
        "action_is_effective": info["action_is_effective"],
        "action_is_valid": True,
        "steps": 1,
    }


def test_moves_it_cannot_make_are_tool_errors() -> None:
    answers = _play(
        [("play", {"action": 1}), ("reset", {}), ("play", {"action": 9}), ("play", {"action": 2}), ("play", {"action": 2})],
        max_steps=2,
    )  # fmt: skip
    assert answers[0] == "error: Error executing tool play: no game in this session: call reset first"
    assert isinstance(answers[1]["Observation"], str)  # no seed: a random room
    assert answers[2].startswith("error: Error executing tool play: action 9 is not one of")
    assert answers[3]["Game End"] is False and answers[4]["Game End"] is True  # --max-steps 2: ends unsolved
    assert answers[4]["info"]["success"] is False


def test_a_solved_game_ends_and_takes_no_more_moves() -> None:
    local = SokobanEnv()
    local.reset(7)
    ids = {"Up": 1, "Down": 2, "Left": 3, "Right": 4}
    moves = [("play", {"action": ids[move]}) for move in local.solution() or []]
    answers = _play([("reset", {"seed": 7}), *moves, ("play", {"action": 1})])
    assert answers[-2]["Game End"] is True and answers[-2]["info"]["success"] is True
    assert answers[-2]["Reward"] == pytest.approx(10.9)
    assert answers[-1] == "error: Error executing tool play: the game has ended: call reset for a new one"


def test_the_command_line_refuses_bad_settings() -> None:
    from roll.agentic.env.sokoban_mcp_server import main

    with pytest.raises(SystemExit):
        main(["--max-steps", "0"])
