"""Trajectory-wise samples: a whole multi-turn conversation is one row.

The prompt is the opening (system message, instruction and first observation); the response is every assistant
turn with the environment's messages in between. The loss mask covers assistant tokens only; ``scores`` is the
episode score (the sum of step rewards), which the reward code puts on the row's last token. Per-step rewards are
kept in the non-tensor column ``step_scores``.
"""

from __future__ import annotations

from typing import Any

from roll.agentic.env_manager.base import EnvManager, EpisodeResult, EpisodeState, Turn
from roll.agentic.env_manager.chat import render_template
from roll.agentic.env_manager.samples import SampleRow, rows_to_batch
from roll.protocol import DataProto

__all__ = ["TrajEnvManager"]


class TrajEnvManager(EnvManager):
    """One conversation per episode; each turn's prompt continues the previous one token for token."""

    def _user_message(self, state: EpisodeState) -> str:
        turn = len(state.turns)
        return render_template(
            self.spec.agent_template or "",
            observation=state.observation,
            turn_idx=turn + 1,
            actions_left=self.spec.max_steps - turn,
            max_response_length=self.spec.max_tokens_per_step,
            suffix=str(state.info.get("suffix", "") or ""),
        )

    def build_prompt(self, state: EpisodeState) -> tuple[list[int], list[int]]:
        if not state.turns:
            messages = []
            system, opening = self.spec.agent_system_template, f"{state.instruction}\n" if state.instruction else ""
            if self.spec.env_instruction_in_system and state.instruction:  # ROLL's GEMRunner layout
                system = f"{system}\n\n{state.instruction}" if system is not None else state.instruction
                opening = ""
            if system is not None:
                messages.append({"role": "system", "content": system})
            messages.append({"role": "user", "content": opening + self._user_message(state)})
            prompt = self.formatter.first_turn(messages)
            if self.send_messages:  # only a chat proxy reads them; kept otherwise they grow every turn for nothing
                state.messages = messages
            return prompt, prompt
        last = state.turns[-1]
        if last.next_is_tool_result:
            message = {"role": "tool", "content": state.observation}
        else:
            message = {"role": "user", "content": self._user_message(state)}
        prompt = self.formatter.next_turn([message], last.response_ids)
        if self.send_messages:
            state.messages += self._chat_messages(state, last, message)
        return prompt, state.context + prompt

    def _chat_messages(self, state: EpisodeState, last: Turn, message: dict[str, str]) -> list[dict[str, Any]]:
        """The last answer and the env's ``message`` as chat messages. An answer whose structured calls the env ran
        goes back with its ``tool_calls`` (ids ``call_<turn>_<index>``: the same episode sends the same ids), each
        answered by its own result when the env reports one per call (``info["tool_outputs"]``); else the one
        result follows, and the proxy sends that turn as text (calls written out, result as a user message)."""
        if not last.tool_calls or not last.next_is_tool_result:
            return [{"role": "assistant", "content": last.response_text}, message]
        turn = len(state.turns) - 1
        calls = [
            {"id": f"call_{turn}_{i}", "type": "function", "function": dict(call)}
            for i, call in enumerate(last.tool_calls)
        ]
        assistant = {"role": "assistant", "content": last.content, "tool_calls": calls}
        outputs = state.info.get("tool_outputs")
        if not isinstance(outputs, list) or len(outputs) != len(calls):
            return [assistant, message]
        results = [
            {"role": "tool", "tool_call_id": call["id"], "content": str(output)} for call, output in zip(calls, outputs)
        ]
        return [assistant, *results]

    def observe(self, state: EpisodeState, turn: Turn) -> None:
        state.context.extend(turn.prompt_ids)
        state.context.extend(turn.response_ids)

    def formulate(self, state: EpisodeState, result: EpisodeResult) -> DataProto:
        turns = state.turns
        response, mask, log_probs = [], [], []
        for i, turn in enumerate(turns):
            if i > 0:  # the environment's message between two assistant turns: attended, not trained on
                response += turn.prompt_ids
                mask += [0] * len(turn.prompt_ids)
                log_probs += [0.0] * len(turn.prompt_ids)
            response += turn.response_ids
            mask += [1] * len(turn.response_ids)
            log_probs += turn.log_probs
        row = SampleRow(turns[0].prompt_ids, response, mask, log_probs, result.episode_score)
        columns = self.common_columns(state, result, 1)
        columns["step_scores"] = [[t.reward for t in turns]]
        columns["finish_reason"] = [turns[-1].finish_reason]
        return rows_to_batch([row], columns, self.pad_token_id)
