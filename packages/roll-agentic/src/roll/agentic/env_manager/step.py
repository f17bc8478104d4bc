"""Step-wise samples (for GiGPO and step_reinforce): every turn is its own row.

Each turn's prompt is built fresh from the env instruction, the last ``history_length`` turns (observation,
action, reward) and the current observation, so prompts stay short however long the episode is. Every row carries
its ``step`` number, the ``state_hash`` of the observation it acted on (equal states of one group are compared by
GiGPO), its own reward (``scores`` and ``step_scores``) and the episode score (``episode_scores``).
"""

from __future__ import annotations

import hashlib

from roll.agentic.env_manager.base import EnvManager, EpisodeResult, EpisodeState, Turn
from roll.agentic.env_manager.chat import render_template
from roll.agentic.env_manager.samples import SampleRow, rows_to_batch
from roll.protocol import DataProto

__all__ = ["StepEnvManager", "state_hash"]

INVALID_HINT = " (this action was not valid: follow the required answer format)"


def state_hash(observation: str) -> str:
    """A stable id of an observation (the same in every process, unlike ``hash``)."""
    return hashlib.sha256(observation.encode("utf-8")).hexdigest()[:16]


class StepEnvManager(EnvManager):
    """One row per turn, with a sliding window of history in the prompt."""

    def _history(self, state: EpisodeState) -> tuple[str, int]:
        length = self.spec.history_length
        window: list[Turn] = state.turns[-length:] if length else []
        first_step = len(state.turns) - len(window) + 1
        entries = []
        for offset, turn in enumerate(window):
            action = turn.response_text.strip() + (INVALID_HINT if turn.action_valid is False else "")
            entries.append(
                f"(step: {first_step + offset}, observation: {turn.observation}, action: {action}, "
                f"reward: {turn.reward:g})"
            )
        return ", ".join(entries), len(window)

    def _current_observation(self, state: EpisodeState) -> str:
        return state.observation

    def build_prompt(self, state: EpisodeState) -> tuple[list[int], list[int]]:
        history, length = self._history(state)
        content = render_template(
            self.spec.agent_template or "",
            env_instruction=state.instruction,
            history=history,
            history_length=length,
            step_count=len(state.turns),
            current_step=len(state.turns) + 1,
            current_observation=self._current_observation(state),
            max_response_length=self.spec.max_tokens_per_step,
            suffix=str(state.info.get("suffix", "") or ""),
        )
        messages = []
        if self.spec.agent_system_template is not None:
            messages.append({"role": "system", "content": self.spec.agent_system_template})
        messages.append({"role": "user", "content": content})
        prompt = self.formatter.first_turn(messages)
        if self.send_messages:
            state.messages = messages
        return prompt, prompt

    def observe(self, state: EpisodeState, turn: Turn) -> None:
        turn.state_hash = state_hash(turn.observation)

    def formulate(self, state: EpisodeState, result: EpisodeResult) -> DataProto:
        turns = state.turns
        rows = [
            SampleRow(t.prompt_ids, t.response_ids, [1] * len(t.response_ids), t.log_probs, t.reward) for t in turns
        ]
        columns = self.common_columns(state, result, len(rows))
        columns["step"] = list(range(len(turns)))
        columns["state_hash"] = [t.state_hash or state_hash(t.observation) for t in turns]
        columns["step_scores"] = [t.reward for t in turns]
        columns["finish_reason"] = [t.finish_reason for t in turns]
        return rows_to_batch(rows, columns, self.pad_token_id)


class StepConcatEnvManager(StepEnvManager):
    """ROLL's StepConcatEnvManager (GEM's "concat" observation wrapper): step-wise rows whose ``{history}`` is the
    previous ``history_length - 1`` observations, one per line, without the actions (GEM observations already say
    what happened), and whose ``{current_observation}`` ends with the env's ``suffix``."""

    def _history(self, state: EpisodeState) -> tuple[str, int]:
        length = self.spec.history_length
        window: list[Turn] = state.turns[-(length - 1) :] if length > 1 else []
        return "\n".join(turn.observation for turn in window), len(window)

    def _current_observation(self, state: EpisodeState) -> str:
        return f"{state.observation}\n{state.info.get('suffix', '') or ''}"
