"""``sokoban_tool_call`` through the chat proxy (``llm_proxy`` openai, ``api: chat``): the hosted model answers with
native ``tool_calls``, the env reads them back as Hermes text, and every request carries ``move_player`` and a history
whose ``tool`` messages answer the calls (the local endpoint refuses what OpenAI would, conftest.chat_schema_error)."""

from __future__ import annotations

import json

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env.sokoban import read_room
from roll.agentic.env.sokoban_gen import solve
from roll.agentic.env.sokoban_tool_call import MOVE_PLAYER
from roll.agentic.scheduler import RolloutScheduler
from roll.agentic.tools import format_tool_call
from roll.strategies import GenerationConfig

SPEC = CustomEnvConfig(
    env_type="sokoban_tool_call",
    env_config={"max_steps": 30, "dim_room": [7, 7], "num_boxes": 2, "search_depth": 10, "format_penalty": -0.15},
    max_steps=30,
    env_manager_cls="agent_native",
)


def move(direction: str) -> tuple[str, str]:
    return "move_player", json.dumps({"direction": direction})


def hosted_player(body: dict) -> dict:
    """Turn 0: an invalid direction; turn 1: two moves at once; then one move of a shortest solution of the room in
    the last message that shows one (the tool message of the move played, the user message at the start)."""
    messages = body["messages"]
    turn = sum(m["role"] == "assistant" for m in messages)
    shown = next(m["content"] for m in reversed(messages) if "state:\n" in m["content"])
    room = read_room(shown.split("state:\n")[-1].split("\n"))
    assert room is not None, shown
    plan = solve(room, max_depth=40)
    assert plan, shown
    calls = [move("north")] if turn == 0 else [move(d.lower()) for d in (plan * 2)[: 2 if turn == 1 else 1]]
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"chatcmpl-{turn}-{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(calls)
        ],
    }
    return {"choices": [{"message": message, "finish_reason": "tool_calls"}]}


def test_a_hosted_model_solves_sokoban_with_native_tool_calls(tokenizer, endpoint) -> None:
    endpoint.answer = hosted_player
    proxy = {"proxy_type": "openai", "proxy_config": {"api": "chat", "max_retries": 0, "base_url": endpoint.url,
                                                      "model_name": "hosted"}}  # fmt: skip
    config = EnvManagerConfig(num_env_groups=1, group_size=1, tags=["Sokoban"], llm_proxy=proxy)
    scheduler = RolloutScheduler.local(
        config, {"Sokoban": SPEC}, tokenizer, None, generation_config=GenerationConfig(max_new_tokens=256),
        sequence_length=8192, mode="val",
    )  # fmt: skip
    try:
        out = scheduler.get_batch(1)
    finally:
        scheduler.close()
    bodies = [body for _, body, _ in endpoint.seen]
    assert len(bodies) >= 3 and all(body["tools"] == [MOVE_PLAYER] for body in bodies)
    columns = out.batch.non_tensor_batch
    assert list(columns["success"]) == [True] * len(bodies) and list(columns["step"]) == list(range(len(bodies)))
    scores = out.batch.batch["scores"].tolist()
    assert scores[0] == -0.1 - 0.15 and scores[-1] > 10  # the invalid direction's cost; the solving move's bonus
    # the last request's history: each call answered by a tool message with roll's id for it
    last = bodies[-1]["messages"]
    assert [m["role"] for m in last[:7]] == ["system", "user", "assistant", "tool", "assistant", "tool", "tool"]
    assert last[2]["tool_calls"][0]["id"] == "move_player_0" and last[3]["tool_call_id"] == "move_player_0"
    assert last[3]["content"].startswith("Error: direction 'north' is not one of up, down, left, right.")
    # the env numbers each turn's calls from 0: an id an earlier turn sent gets a suffix (OpenAI refuses a repeated
    # tool_call_id), its results answer the new id
    assert [c["id"] for c in last[4]["tool_calls"]] == ["move_player_0-1", "move_player_1"]
    assert [m["tool_call_id"] for m in last[5:7]] == ["move_player_0-1", "move_player_1"]
    assert last[5]["content"].startswith("Moved ") and last[6]["content"].startswith("Error: not played.")
    assert all(set(m) == {"role", "tool_call_id", "content"} for m in last if m["role"] == "tool")
    # the sample's response is the call as the env read it: Hermes JSON, ended with EOS
    written = format_tool_call("move_player", {"direction": "north"})
    mask = out.batch.batch["response_mask"][0].bool()
    assert tokenizer.decode(out.batch.batch["responses"][0][mask]) == written + tokenizer.eos_token
