"""LLM-as-judge reward: a model reads (prompt, response, optional reference) and answers with a score.

The judge is an inference role like any other: its reward domain's config carries ``model_args`` and
``strategy_args`` (``hf_infer``, ``vllm``, ``sglang``, ``mock_infer``...), so the judge runs through the same
strategies as the policy. Each ``compute_rewards`` call renders one judge prompt per row, sends all rows of the
worker's shard to the backend in ONE ``generate`` call, and parses a number out of every answer::

    rewards:
      helpful:
        reward_type: llm_judge
        model_args: {model_name_or_path: /models/judge, dtype: bfloat16}
        strategy_args: {strategy_name: vllm, strategy_config: {max_model_len: 4096}}
        reward_kwargs: {max_score: 10, max_new_tokens: 128, reference_key: ground_truth}

``reward_kwargs`` (defaults in :attr:`LLMJudgeRewardWorker.default_kwargs`):

* ``prompt_template``: placeholders ``{prompt}``, ``{response}`` (required), ``{reference}``, ``{max_score}``,
  ``{min_score}``; write literal braces as ``{{`` and ``}}``. ``system_prompt`` and ``apply_chat_template``
  control how the text is wrapped for a chat model;
* ``reference_key``: the row column holding a reference answer (default ``ground_truth``); rows without it get
  ``no_reference_text`` in its place, so a reference is never required;
* ``score_pattern``: a regex whose first group (or group ``score``) is the number; by default
  ``Score: 7`` / ``Rating: 7`` (the last one wins), else ``\\boxed{7}``, else ``7/<max_score>``;
* ``min_score`` / ``max_score``: the judge's scale; a parsed value v becomes ``(v - min) / (max - min)`` in
  [0, 1]; a value outside the scale counts as unparseable;
* ``unparseable_score``: the reward when no valid number is found (default 0.0); the reason says why and quotes
  the judge's answer;
* ``max_new_tokens`` (64), ``temperature`` (0.0: greedy) and ``generation`` (any other
  :class:`~roll.strategies.GenerationConfig` field, e.g. ``{top_p: 0.9, stop_strings: ["\\n\\n"]}``). The role's
  own ``generating_args`` are not used: set these instead, so judge sampling has one place;
* ``max_prompt_length``: judge prompts with more tokens are not sent; they get ``unparseable_score``;
* ``reason_chars``: how much of the judge's answer to quote in ``reward_info`` (0: none);
* ``prompt_style``: ``roll`` (all of the above) or one of ROLL's judges, ``ROLL/<judge_prompt name>`` (e.g.
  ``ROLL/Qwen2.5-7B-Instruct-RLVR-prompt``, ``ROLL/default``): ROLL's template and its yes/no reading of the answer
  (:mod:`roll.pipelines.rewards.judge_styles`); ``prompt_template``, ``score_pattern``, ``min_score``,
  ``max_score`` and ``no_reference_text`` do not apply there.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, ClassVar

from roll.pipelines.data import DataArgs, PromptCollator, encode_prompt
from roll.pipelines.rewards.base import RewardWorker, ScoredRow
from roll.pipelines.rewards.judge_styles import format_roll_judge_prompt, roll_judge_template, roll_yes_no_verdict
from roll.pipelines.rewards.judge_text import (
    DEFAULT_JUDGE_TEMPLATE,
    check_judge_template,
    format_judge_prompt,
    judge_verdict,
)
from roll.protocol import Dispatch, register
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig, StrategyWorker

__all__ = ["JudgeScoring", "LLMJudgeRewardWorker"]

logger = logging.getLogger(__name__)


def _number(kwargs: dict[str, Any], key: str) -> float:
    value = kwargs[key]
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(f"reward_kwargs.{key} must be a finite number, got {value!r}")
    return float(value)


class JudgeScoring:
    """The judge prompt of a row and the reading of the judge's answer, for a judge served by a strategy
    (:class:`LLMJudgeRewardWorker`) or over HTTP (:class:`~roll.pipelines.rewards.judge_api.ApiJudgeRewardWorker`);
    mixed into a :class:`RewardWorker`, whose ``setup`` calls :meth:`setup_judge`."""

    judge_kwargs: ClassVar[dict[str, Any]] = {
        "prompt_template": DEFAULT_JUDGE_TEMPLATE,
        "system_prompt": None,
        "reference_key": "ground_truth",
        "no_reference_text": "(none given)",
        "score_pattern": None,
        "min_score": 0.0,
        "max_score": 10.0,
        "unparseable_score": 0.0,
        "max_new_tokens": 64,
        "temperature": 0.0,
        "reason_chars": 120,
        "prompt_style": "roll",
    }
    # reward_kwargs of roll's own style that a ROLL style has no use for
    _ROLL_STYLE_ONLY: ClassVar[tuple[str, ...]] = (
        "prompt_template",
        "score_pattern",
        "min_score",
        "max_score",
        "no_reference_text",
    )
    reward_kwargs: dict[str, Any]
    pattern: re.Pattern[str] | None = None
    roll_template: str | None = None  # the template of a ROLL/<name> prompt_style

    def setup_judge(self, kwargs: dict[str, Any]) -> None:
        self.roll_template = self._roll_style(kwargs)
        check_judge_template(kwargs["prompt_template"])
        self.min_score, self.max_score = _number(kwargs, "min_score"), _number(kwargs, "max_score")
        if self.max_score <= self.min_score:
            raise ConfigError(
                f"reward_kwargs.max_score={kwargs['max_score']} must be larger than min_score={kwargs['min_score']}"
            )
        self.unparseable_score = _number(kwargs, "unparseable_score")
        pattern = kwargs["score_pattern"]
        self.pattern = None
        if pattern is not None:
            try:
                self.pattern = re.compile(pattern, re.IGNORECASE)
            except (re.error, TypeError) as e:
                raise ConfigError(f"reward_kwargs.score_pattern {pattern!r} is not a valid regex: {e}") from None
        value = kwargs["reason_chars"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"reward_kwargs.reason_chars must be an integer >= 0, got {value!r}")

    def _roll_style(self, kwargs: dict[str, Any]) -> str | None:
        """The template of a ROLL prompt_style (None for roll's own); its unused roll-style kwargs must be unset."""
        style = kwargs["prompt_style"]
        if style == "roll":
            return None
        try:
            template = roll_judge_template(str(style))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        changed = [key for key in self._ROLL_STYLE_ONLY if kwargs[key] != self.judge_kwargs[key]]
        if changed:
            raise ConfigError(
                f"reward_kwargs {changed} are roll's own judge settings, unused with prompt_style {style!r} (ROLL's "
                f"template and yes/no answers); remove them or use prompt_style 'roll'"
            )
        return template

    def judge_prompt(self, row: dict[str, Any]) -> str:
        """The judge prompt text of one row (before the chat template)."""
        kwargs = self.reward_kwargs
        if self.roll_template is not None:
            return format_roll_judge_prompt(self.roll_template, row, kwargs["reference_key"])
        return format_judge_prompt(
            kwargs["prompt_template"],
            row,
            reference_key=kwargs["reference_key"],
            no_reference_text=kwargs["no_reference_text"],
            max_score=self.max_score,
            min_score=self.min_score,
        )

    def verdict(self, text: str, finish_reason: str) -> ScoredRow:
        """The score and reason of the judge's answer ``text``."""
        chars = self.reward_kwargs["reason_chars"]
        if self.roll_template is not None:
            return roll_yes_no_verdict(text, unparseable_score=self.unparseable_score, reason_chars=chars)
        return judge_verdict(
            text,
            max_score=self.max_score,
            min_score=self.min_score,
            pattern=self.pattern,
            unparseable_score=self.unparseable_score,
            finish_reason=finish_reason,
            reason_chars=chars,
        )


class LLMJudgeRewardWorker(JudgeScoring, RewardWorker, StrategyWorker):
    """Scores rows with a judge model served by the role's strategy (see the module docstring).

    Needs no row fields: the reference column (``reference_key``) is used when present.
    """

    required_fields: ClassVar[tuple[tuple[str, ...], ...]] = ()
    default_kwargs: ClassVar[dict[str, Any]] = {
        **JudgeScoring.judge_kwargs,
        "apply_chat_template": True,
        "generation": {},
        "max_prompt_length": 4096,
    }

    def __init__(self, worker_config: Any) -> None:
        super().__init__(worker_config)
        self.tokenizer: Any = None
        self.generation_config: GenerationConfig | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        """Validate ``reward_kwargs`` first (a typo fails before a slow model load), then build the strategy."""
        self._check_role()
        self._configure()
        super().initialize(settings)  # RewardWorker -> StrategyWorker: creates and loads the strategy
        self.tokenizer = self.strategy.tokenizer if self.strategy.tokenizer is not None else self._load_tokenizer()

    def _check_role(self) -> None:
        role: Any = self.worker_config  # the reward domain's role config (model_args, strategy_args)
        where = getattr(role, "name", "llm_judge")
        if getattr(role, "strategy_args", None) is None:
            raise ConfigError(
                f"{where}: reward_type llm_judge needs a model: set strategy_args (e.g. {{strategy_name: vllm}} or "
                f"hf_infer) and model_args.model_name_or_path on this reward domain"
            )
        path = getattr(role.model_args, "model_name_or_path", None)
        if path and "://" in path:
            raise ConfigError(
                f"{where}.model_args.model_name_or_path={path!r} was not resolved to a local folder; this pipeline "
                f"does not resolve model references for reward roles, so give a local path"
            )
        if "generating_args" in role.model_fields_set:
            raise ConfigError(
                f"{where}: llm_judge takes its sampling settings from reward_kwargs (max_new_tokens, temperature, "
                f"generation), not generating_args; move them there"
            )

    def _load_tokenizer(self) -> Any:
        # Backends without a tokenizer of their own (mock_infer) still need one to render and decode text.
        from roll.pipelines.tokenizers import load_tokenizer

        model_args: Any = getattr(self.worker_config, "model_args", None)
        if model_args is None or not model_args.tokenizer_path:
            raise ConfigError(
                f"{self.worker_name}: {self.strategy.strategy_name} has no tokenizer; set model_args.model_name_or_path "
                f"(or tokenizer_name_or_path) of the judge"
            )
        return load_tokenizer(model_args)

    def setup(self, kwargs: dict[str, Any]) -> None:
        self.setup_judge(kwargs)
        value = kwargs["max_prompt_length"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"reward_kwargs.max_prompt_length must be an integer >= 1, got {value!r}")
        self.generation_config = self._generation_config(kwargs)
        self.data_args = DataArgs(
            file_name="<llm_judge>",
            system_prompt=kwargs["system_prompt"],
            apply_chat_template=bool(kwargs["apply_chat_template"]),
            default_tag="judge",
        )

    @staticmethod
    def _generation_config(kwargs: dict[str, Any]) -> GenerationConfig:
        extra = kwargs["generation"]
        if not isinstance(extra, dict):
            raise ConfigError(f"reward_kwargs.generation must be a mapping of GenerationConfig fields, got {extra!r}")
        clashes = sorted({"max_new_tokens", "temperature"} & set(extra))
        if clashes:
            raise ConfigError(
                f"reward_kwargs.generation must not set {clashes}; set reward_kwargs.{clashes[0]} instead"
            )
        if extra.get("num_return_sequences", 1) != 1:
            raise ConfigError("llm_judge asks for one answer per row: remove generation.num_return_sequences")
        settings = {
            "logprobs": False,  # the judge's token log-probs are never used
            **extra,
            "max_new_tokens": kwargs["max_new_tokens"],
            "temperature": kwargs["temperature"],
            "num_return_sequences": 1,
        }
        try:
            return GenerationConfig(**settings)
        except ConfigError as e:
            raise ConfigError(f"llm_judge generation settings (reward_kwargs): {e}") from None

    # --- scoring ----------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of a judge prompt: with the chat template (and ``system_prompt``) when asked for and present."""
        return encode_prompt({"prompt": text}, self.tokenizer, self.data_args)["prompt_ids"]

    def generate_answers(self, prompt_ids: list[list[int]]) -> list[tuple[str, str]]:
        """The judge's ``(answer text, finish_reason)`` for every prompt, from ONE backend ``generate`` call."""
        if not prompt_ids:
            return []
        pad = self.tokenizer.pad_token_id
        if pad is None:  # padded positions are masked out, so any id will do
            pad = self.tokenizer.eos_token_id or 0
        if self.generation_config is None:
            raise RuntimeError(f"{self.worker_name}: generate_answers() before setup(); initialize the worker first")
        collator = PromptCollator(pad, max(map(len, prompt_ids)), pad_to_longest=True)
        out = self.strategy.generate(collator([{"prompt_ids": ids} for ids in prompt_ids]), self.generation_config)
        responses = [row[mask.bool()].tolist() for row, mask in zip(out.batch["responses"], out.batch["response_mask"])]
        answers = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return [(answer, str(reason)) for answer, reason in zip(answers, out.non_tensor_batch["finish_reason"])]

    def score_rows(self, rows: list[dict[str, Any]]) -> list[ScoredRow]:
        """Judge every row of this worker's shard in one generation; over-long judge prompts are not sent."""
        kwargs = self.reward_kwargs
        limit = kwargs["max_prompt_length"]
        encoded = [self.encode(self.judge_prompt(row)) for row in rows]
        sent = [i for i, ids in enumerate(encoded) if len(ids) <= limit]
        answers = dict(zip(sent, self.generate_answers([encoded[i] for i in sent])))
        results: list[ScoredRow] = []
        for i, ids in enumerate(encoded):
            if i not in answers:
                reason = (
                    f"judge prompt has {len(ids)} tokens > max_prompt_length={limit}; not judged "
                    f"(raise reward_kwargs.max_prompt_length)"
                )
                results.append((self.unparseable_score, reason))
                continue
            text, finish_reason = answers[i]
            results.append(self.verdict(text, finish_reason))
        return results
