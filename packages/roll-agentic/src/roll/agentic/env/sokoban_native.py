"""ROLL's ``sokoban_native_env``: text Sokoban played through the agent-native (message-list) interface.

Each ``reset``/``step`` returns the whole conversation: a system message (``system_template``, a blank line, the
game's instructions), a user message with the room, then per turn the model's reply as an assistant message and a
user message with the new room. ``info["tools"]`` is empty (moves are ``<answer>Up</answer>`` replies, as in
:class:`~roll.agentic.env.sokoban.SokobanEnv`, whose rooms, rewards and ``format_penalty`` it uses). Played by the
``agent_native`` env manager (ROLL's ``AgentNativeStepEnvManager``).

Following ROLL's ``SokobanNativeEnv`` (``roll/pipeline/agentic/env/sokoban/native_env.py``), except that the
"last action is not valid" reminder is added after an *invalid* action (ROLL's test is inverted and adds it after
valid ones).
"""

from __future__ import annotations

from typing import Any

from roll.agentic.env.base import keys_passed_on
from roll.agentic.env.sokoban import SokobanEnv

__all__ = ["SokobanNativeEnv"]

DEFAULT_NATIVE_SYSTEM = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high reward in the game."
)
INVALID_TIP = (
    "\n\n<system-reminder>\n(IMPORTANT TIPS: the last action is not valid, your new response *must* strictly adhere "
    "to the format according system-reminder.)</system-reminder>\n\n"
)


class SokobanNativeEnv:
    """Sokoban with message-list observations (ROLL's keys: ``system_template``, ``observation_suffix``, and
    :class:`SokobanEnv`'s ``dim_room``, ``num_boxes``, ``search_depth``, ``max_steps``, ``format_penalty``, ...)."""

    def __init__(
        self,
        max_steps: int = 10,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 300,
        format_penalty: float = -0.1,
        system_template: str | None = None,
        observation_suffix: str | None = None,
        group_id: int = 0,
        num_env_groups: int = 1,
        mode: str = "train",
        debug: bool = False,
        **sokoban: Any,
    ) -> None:
        # group_id / num_env_groups / mode / debug: ROLL's SokobanNativeEnv stores them and never reads them.
        del group_id, num_env_groups, mode, debug
        self.game = SokobanEnv(
            dim_room=dim_room,
            num_boxes=num_boxes,
            search_depth=search_depth,
            max_steps=max_steps,
            format_penalty=format_penalty,
            **sokoban,
        )
        self.system_template = system_template if system_template is not None else DEFAULT_NATIVE_SYSTEM
        if observation_suffix is None:
            observation_suffix = (
                "\n\n<system-reminder>\nIMPORTANT: Ensure that your response is the format of '<answer> [your "
                "answer] </answer>',  with no extra text, eg. <answer>Right</answer>.\nYour available actions "
                f"are:\n{', '.join(SokobanEnv.ACTIONS)}\n. </system-reminder>\n\nDecide the next action:\n"
            )
        self.observation_suffix = observation_suffix
        self.messages: list[dict[str, Any]] = []
        self.episodes = 0

    @property
    def uses_global_rng(self) -> bool:
        return self.game.uses_global_rng

    def reset(self, seed: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        room, info = self.game.reset(seed)
        self.episodes += 1
        self.messages = [
            {"role": "system", "content": f"{self.system_template}\n\n{info['env_instruction']}"},
            {"role": "user", "content": f"Here is the current state:\n{room}\n\n{self.observation_suffix}"},
        ]
        return list(self.messages), {"tools": [], "success": False}

    def step(self, action: str) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        self.messages.append({"role": "assistant", "content": action})
        room, reward, terminated, truncated, info = self.game.step(action)
        content = f"Current state:\n{room}\n\n{self.observation_suffix}"
        if not info.get("action_is_valid", False):
            content = INVALID_TIP + content
        self.messages.append({"role": "user", "content": content})
        metrics = dict(info.get("metrics") or {})
        metrics.update(success=float(self.game.success), raw_reward=float(reward), task_id=float(self.episodes))
        return list(self.messages), reward, terminated, truncated, {**info, "metrics": metrics}

    def close(self) -> None:
        self.game.close()


# Its keys are its own and SokobanEnv's (the ``**sokoban`` above passes them on).
SokobanNativeEnv.__signature__ = keys_passed_on(SokobanNativeEnv, SokobanEnv)  # type: ignore[attr-defined]
