"""ROLL's ``sokoban_tool_call``: Sokoban whose moves are calls of a ``move_player`` function tool.

The agent-native interface of :class:`~roll.agentic.env.sokoban_native.SokobanNativeEnv` (rooms, rewards,
``format_penalty``, ``system_template``, ``max_steps``, ... are its), with the moves offered as one OpenAI function
tool, ``move_player(direction)`` (``up``, ``down``, ``left`` or ``right``; any case), listed in the reset
``info["tools"]`` for the chat template or a chat API. The reply is read with roll's tool-call reader
(:func:`~roll.agentic.env.tool_calls.assistant_message`: Hermes ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`` JSON, as vLLM's hermes parser and the chat proxy write it, or Qwen3-Coder ``<function=...>`` blocks).

A turn adds the reply as an assistant message (its ``tool_calls`` included) and then:

* a valid call: the move is played (reward as ``sokoban_native_env``'s move); a ``tool`` message answering the call
  says what happened and shows the new room;
* a call of another tool, or ``direction`` missing or not one of the four: nothing moves, the turn costs what an
  invalid action costs in ``sokoban_native_env`` (the step penalty plus ``format_penalty``) and counts toward
  ``max_steps``; the ``tool`` message answering the call names the mistake. With ``full_history: true`` (ROLL's
  key) that round is taken out of the history instead: the assistant and tool messages are removed and a user
  message says that the call was invalid and was removed (ROLL uses this so its message tracker sees a fork);
* no call (a plain answer), or ``<tool_call>`` blocks none of which parses: the same cost, and a user message asks
  for a ``move_player`` call (kept whatever ``full_history`` is, as in ROLL: there is no call to answer).

Several calls in one reply: the first is played (ROLL plays the first too); each further call is answered by a
``tool`` message saying it was not played (one move per turn), so the history keeps every call and answers each, as
OpenAI's chat API requires (ROLL keeps only the first call in the history).

Differences from ROLL's ``SokobanToolCallEnv`` (``roll/pipeline/agentic/env/sokoban/tool_call_env.py``), which
takes structured OpenAI messages where roll's envs take the reply's text: an invalid turn costs and counts like
``sokoban_native_env``'s invalid action (ROLL: ``format_penalty`` alone, and the game's step counter does not move);
the tool message carries the room and no user message repeats it after a valid call (ROLL shows the room twice per
turn); ``observation_suffix`` (default none) and ``env_instruction`` are honoured (ROLL overwrites them); and
``action_pattern`` is refused (ROLL accepts it and never uses it).
"""

from __future__ import annotations

import json
from typing import Any

from roll.agentic.env.base import keys_passed_on
from roll.agentic.env.sokoban import SokobanEnv
from roll.agentic.env.sokoban_native import SokobanNativeEnv
from roll.agentic.env.tool_calls import assistant_message
from roll.runtime import ConfigError

__all__ = ["DIRECTIONS", "MOVE_PLAYER", "SokobanToolCallEnv", "read_move"]

DIRECTIONS = ("up", "down", "left", "right")
MOVE_PLAYER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "move_player",
        "description": "Move the player one square in a direction; a box in the way is pushed if it can move.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": list(DIRECTIONS), "description": "Where to move."}},
            "required": ["direction"],
        },
    },
}
TOOL_INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. When you are "
    "right next to a box, you can push it by moving in the same direction. You cannot push a box through a wall, and "
    "you cannot pull a box. Move with the move_player tool."
)
TOOL_RULE = "Take every move by calling the move_player tool with a direction (up, down, left or right), one per reply."
NO_CALL = "No move_player call found in your reply. Call the move_player tool to move."
BAD_CALL = (
    'Your tool call could not be read. Write it as <tool_call>{"name": "move_player", "arguments": {"direction": '
    '"left"}}</tool_call>.'
)
NOT_PLAYED = "Error: not played. One move per reply: only the first move_player call of a reply is played."
_GAME_MOVES = {"up": "Up", "down": "Down", "left": "Left", "right": "Right"}

StepResult = tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]


def read_move(call: dict[str, Any]) -> tuple[str | None, str]:
    """The direction of a parsed call (``{"function": {"name", "arguments": <JSON string>}}``), or ``None`` and what
    is wrong with it."""
    name = call["function"]["name"]
    if name != "move_player":
        return None, f"unknown tool {name!r}; the only tool is move_player."
    arguments: Any = call["function"]["arguments"]
    # Two decodes: the call's JSON string, then arguments a model wrote as a JSON string (OpenAI's own wire form).
    for _ in range(2):
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                break
    if not isinstance(arguments, dict) or "direction" not in arguments:
        return None, 'move_player takes {"direction": ...}, one of up, down, left, right.'
    direction = arguments["direction"]
    if not isinstance(direction, str) or direction.strip().lower() not in DIRECTIONS:
        return None, f"direction {direction!r} is not one of up, down, left, right."
    return direction.strip().lower(), ""


class SokobanToolCallEnv(SokobanNativeEnv):
    """Sokoban moved by ``move_player`` tool calls (ROLL's keys: ``full_history`` and ``sokoban_native_env``'s)."""

    def __init__(
        self,
        full_history: bool = False,
        env_instruction: str | None = None,
        observation_suffix: str = "",
        action_pattern: str | None = None,
        **native: Any,
    ) -> None:
        if not isinstance(full_history, bool):
            raise ConfigError(f"sokoban_tool_call full_history={full_history!r} must be true or false")
        if action_pattern is not None:
            raise ConfigError(
                f"sokoban_tool_call action_pattern={action_pattern!r}: moves are move_player tool calls, not text; "
                "remove action_pattern (or use sokoban_native_env for <answer> moves)"
            )
        env_instruction = TOOL_INSTRUCTION if env_instruction is None else env_instruction
        super().__init__(observation_suffix=observation_suffix, env_instruction=env_instruction, **native)
        self.full_history = full_history

    def reset(self, seed: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        room, info = self.game.reset(seed)
        self.episodes += 1
        self.messages = [
            {"role": "system", "content": f"{self.system_template}\n\n{info['env_instruction']}\n\n{TOOL_RULE}"},
            {"role": "user", "content": f"Here is the current state:\n{self._shown(room)}"},
        ]
        return list(self.messages), {"tools": [MOVE_PLAYER], "success": False}

    def _shown(self, room: str) -> str:
        return f"{room}\n\n{self.observation_suffix}" if self.observation_suffix else room

    def step(self, action: str) -> StepResult:
        reply = assistant_message(action)
        calls = reply.tool_calls
        if not calls:  # a plain answer, or <tool_call> blocks none of which parses
            room, reward, terminated, truncated, info = self.game.step("")
            self.messages.append(reply.message)
            problem = NO_CALL if reply.valid else BAD_CALL
            self.messages.append({"role": "user", "content": f"{problem}\n\nCurrent state:\n{self._shown(room)}"})
            return self._answer(reward, terminated, truncated, info, valid=False)
        direction, problem = read_move(calls[0])
        # The game's own <answer> reading plays the move; "" is its invalid action (step penalty + format_penalty).
        move = f"<answer>{_GAME_MOVES[direction]}</answer>" if direction is not None else ""
        room, reward, terminated, truncated, info = self.game.step(move)
        if direction is None and self.full_history:
            self.messages.append(
                {
                    "role": "user",
                    "content": f"Your last move_player call was invalid: {problem} That round was removed from the "
                    f"conversation; call move_player again.\n\nCurrent state:\n{self._shown(room)}",
                }
            )
            return self._answer(reward, terminated, truncated, info, valid=False)
        if direction is None:
            result = f"Error: {problem} Nothing moved."
        elif not info["action_is_effective"]:
            result = f"Moved {direction}: blocked, the player did not move."
        else:
            result = f"Moved {direction}." + (" All boxes are on targets: solved." if self.game.success else "")
        self.messages.append(reply.message)
        self._tool_message(calls[0], f"{result}\n\nCurrent state:\n{self._shown(room)}")
        for call in calls[1:]:
            self._tool_message(call, NOT_PLAYED)
        return self._answer(reward, terminated, truncated, info, valid=direction is not None)

    def _tool_message(self, call: dict[str, Any], content: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})

    def _answer(
        self, reward: float, terminated: bool, truncated: bool, info: dict[str, Any], *, valid: bool
    ) -> StepResult:
        metrics = dict(info.get("metrics") or {})
        metrics.update(
            action_is_valid=float(valid),
            success=float(self.game.success),
            raw_reward=float(reward),
            task_id=float(self.episodes),
        )
        info = {**info, "action_is_valid": valid, "metrics": metrics}
        return list(self.messages), reward, terminated, truncated, info


# Its keys are its own, SokobanNativeEnv's and SokobanEnv's (the ``**native`` above passes them on).
SokobanToolCallEnv.__signature__ = keys_passed_on(SokobanToolCallEnv, SokobanNativeEnv, SokobanEnv)  # type: ignore[attr-defined]
