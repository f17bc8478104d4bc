"""Reward scoring for RLVR: rule-based math, sandboxed code execution, user Python functions and LLM judges.

Workers (``REWARDS`` names): ``"math"`` -> :class:`MathRewardWorker`, ``"code"`` -> :class:`CodeSandboxRewardWorker`,
``"python"`` -> :class:`PythonFunctionRewardWorker`, ``"llm_judge"`` -> :class:`LLMJudgeRewardWorker` (a judge model
served by any inference strategy). Each takes a DataProto of sampled responses in ``compute_rewards`` and returns
float32 ``scores`` and a ``reward_info`` reason per row (see :mod:`.base`).
"""

from __future__ import annotations

from roll.pipelines.rewards.base import (
    REWARDS,
    RewardWorker,
    batch_rows,
    resolve_reward_worker,
    rewards_to_dataproto,
    safe_score,
)
from roll.pipelines.rewards.code import CodeSandboxRewardWorker, CodeTest, code_score, extract_code, parse_test_cases
from roll.pipelines.rewards.judge_text import (
    DEFAULT_JUDGE_TEMPLATE,
    format_judge_prompt,
    judge_verdict,
    parse_judge_score,
)
from roll.pipelines.rewards.llm_judge import LLMJudgeRewardWorker
from roll.pipelines.rewards.math import MathRewardWorker, answers_match, extract_answer, extract_boxed, math_score
from roll.pipelines.rewards.python_fn import (
    PythonFunctionRewardWorker,
    call_reward_function,
    exact_match,
    length_penalty,
    load_reward_function,
)
from roll.pipelines.rewards.sandbox import SandboxLimits, SandboxResult, run_untrusted, sandbox_layers

__all__ = [
    "DEFAULT_JUDGE_TEMPLATE",
    "REWARDS",
    "CodeSandboxRewardWorker",
    "CodeTest",
    "LLMJudgeRewardWorker",
    "MathRewardWorker",
    "PythonFunctionRewardWorker",
    "RewardWorker",
    "SandboxLimits",
    "SandboxResult",
    "answers_match",
    "batch_rows",
    "call_reward_function",
    "code_score",
    "exact_match",
    "extract_answer",
    "extract_boxed",
    "extract_code",
    "format_judge_prompt",
    "judge_verdict",
    "length_penalty",
    "load_reward_function",
    "math_score",
    "parse_judge_score",
    "parse_test_cases",
    "resolve_reward_worker",
    "rewards_to_dataproto",
    "run_untrusted",
    "safe_score",
    "sandbox_layers",
]
