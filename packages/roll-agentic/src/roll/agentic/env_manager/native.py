"""ROLL's ``AgentNativeStepEnvManager``: step-wise samples of envs whose observation is the whole conversation.

An agent-native env (see :mod:`roll.agentic.env.tool_calls`) answers ``reset`` and ``step`` with the list of chat
messages so far (system / user / assistant / tool, assistant ``tool_calls`` included) and gives its tools in the
reset ``info["tools"]``. Every turn the manager renders that list afresh with the tokenizer's chat template,
tools included and with the generation prompt (``apply_chat_template(messages, tools=tools,
add_generation_prompt=True)``, after ROLL's ``convert_list_content_str``; the tag's ``enable_thinking``, false unless
set as in ROLL, goes to a template that reads it), samples a reply
and hands the decoded reply to the env, which reads it (tool calls, an ``<answer>``, ...) and answers with the
next message list. Each turn is one sample row (prompt = that turn's rendering, response = the sampled tokens,
score = that turn's reward), laid out as :class:`~roll.agentic.env_manager.step.StepEnvManager`'s rows
(``step``, ``state_hash`` of the message list, ``step_scores``, ``episode_scores``).

Follows ROLL's ``roll/pipeline/agentic/env_manager/agent_native_env_manager.py`` (``format_messages``,
``make_decision``, ``step``, ``formulate_rollouts``). The env spec's ``parse_tool_call_arguments`` is ROLL's
``parse_tool_call_parameter_to_dict``.
"""

from __future__ import annotations

import json
from typing import Any

from roll.agentic.env.tool_calls import normalize_messages
from roll.agentic.env_manager.base import EpisodeState
from roll.agentic.env_manager.step import StepEnvManager
from roll.agentic.policy.protocol import ChatTools
from roll.agentic.tools.parsing import format_tool_call
from roll.pipelines.data.templates import for_template, thinking_kwargs
from roll.runtime import ConfigError

__all__ = ["AgentNativeStepEnvManager", "render_messages"]


def render_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    parse_tool_call_arguments: bool,
    enable_thinking: bool | None = False,
) -> list[int]:
    """Token ids of ``messages`` (with ``tools``) ending with the assistant generation prompt; ``enable_thinking``
    (None: the template's default) goes to a template that reads it."""

    ids = tokenizer.apply_chat_template(
        for_template(tokenizer, normalize_messages(messages, parse_tool_call_arguments)),
        tools=tools,
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
        **thinking_kwargs(tokenizer, enable_thinking),
    )
    if isinstance(ids, dict) or (ids and isinstance(ids[0], list)):
        raise ConfigError("apply_chat_template returned a batch or a dict; expected one list of token ids")
    return [int(i) for i in ids]


class AgentNativeStepEnvManager(StepEnvManager):
    """One row per turn; each prompt is the env's message list rendered with the chat template and its tools."""

    #: The env's observations are message lists (the runner checks them and passes them on as JSON text).
    message_observations = True

    def build_prompt(self, state: EpisodeState) -> tuple[list[int], list[int]]:
        if not state.turns:  # ROLL keeps the tools of the reset info for the whole episode
            tools = state.info.get("tools") or []
            if not isinstance(tools, list):
                raise ConfigError(f"env {self.spec.env_type!r}: reset info['tools'] must be a list, got {tools!r:.80}")
            self._tools: list[dict[str, Any]] = tools
        messages = json.loads(state.observation)
        tokenizer, spec = self.formatter.tokenizer, self.spec
        prompt = render_messages(tokenizer, messages, self._tools, spec.parse_tool_call_arguments, spec.enable_thinking)
        if self.send_messages:
            state.messages = messages
        return prompt, prompt

    def chat_tools(self, state: EpisodeState) -> ChatTools:
        """The reset's tools; a structured call is written as Hermes ``<tool_call>`` JSON, which
        :func:`~roll.agentic.env.tool_calls.assistant_message` reads back (the env's messages then carry it)."""
        return ChatTools(self._tools, format_tool_call)
