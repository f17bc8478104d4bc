"""The reward worker contract shared by every scorer, and the name -> worker registry.

A reward worker is a model-free Ray actor. The RLVR pipeline calls ``compute_rewards(batch)`` on the cluster
(``Dispatch.DP_MP_COMPUTE``: rows are split across workers and collected back in order). Each row is one sampled
response with non-tensor columns ``prompt``, ``response_text``, ``tag`` and task fields (``ground_truth``,
``test_cases``, ...), plus the tensor ``response_mask``. The result has the same rows, a float32 tensor
``scores`` (B,) and a non-tensor ``reward_info`` (a short reason per row). A row whose scoring raises scores 0
with the exception as its reason; rows are never dropped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from numbers import Real
from typing import Any, ClassVar

import numpy as np
import torch

from roll.runtime import ConfigError, DataProto, Dispatch, Registry, Worker, import_target, register

logger = logging.getLogger(__name__)

__all__ = [
    "REWARDS",
    "RewardWorker",
    "batch_rows",
    "resolve_reward_worker",
    "rewards_to_dataproto",
    "safe_score",
]

REWARDS: Registry[type] = Registry("reward", entry_point_group="roll.rewards")
REWARDS.register("math", "roll.pipelines.rewards.math:MathRewardWorker")
REWARDS.register("code", "roll.pipelines.rewards.code:CodeSandboxRewardWorker")
REWARDS.register("python", "roll.pipelines.rewards.python_fn:PythonFunctionRewardWorker")
REWARDS.register("llm_judge", "roll.pipelines.rewards.llm_judge:LLMJudgeRewardWorker")
REWARDS.register("llm_judge_api", "roll.pipelines.rewards.judge_api:ApiJudgeRewardWorker")
REWARDS.register("crossthinkqa", "roll.pipelines.rewards.choice:CrossThinkQARewardWorker")
REWARDS.register("multiple_choice", "roll.pipelines.rewards.choice:MultipleChoiceRewardWorker")
REWARDS.register("general_val", "roll.pipelines.rewards.choice:GeneralValRewardWorker")
REWARDS.register("ifeval", "roll.pipelines.rewards.ifeval:IFEvalRewardWorker")

ScoredRow = tuple[float, str]


def _plain(value: Any) -> Any:
    """numpy scalars/arrays from a non-tensor column as plain Python values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def batch_rows(batch: DataProto) -> list[dict[str, Any]]:
    """One dict per row with every non-tensor column, plus ``response_length`` when ``response_mask`` is present."""
    columns = {key: batch.non_tensor_batch[key] for key in batch.non_tensor_batch}
    rows = [{key: _plain(values[i]) for key, values in columns.items()} for i in range(len(batch))]
    if "response_mask" in batch.batch.keys():
        lengths = batch.batch["response_mask"].reshape(len(batch), -1).sum(dim=-1).tolist()
        for row, length in zip(rows, lengths):
            row.setdefault("response_length", int(length))
    return rows


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def safe_score(result: Any, source: str = "scorer") -> ScoredRow:
    """``result`` (a number or ``(number, reason)``) as ``(float, str)``; anything else scores 0 with a reason."""
    info: Any = ""
    score = result
    if isinstance(result, tuple | list) and len(result) == 2:
        score, info = result
    if not isinstance(score, Real):
        return 0.0, f"{source} returned {type(result).__name__} {_short(result)}, expected a float or (float, str)"
    value = float(score)
    if not math.isfinite(value):
        return 0.0, f"{source} returned a non-finite score {value}"
    return value, str(info)


def rewards_to_dataproto(results: list[ScoredRow]) -> DataProto:
    """The compute_rewards output: float32 ``scores`` (B,) and non-tensor ``reward_info``."""
    scores = torch.tensor([score for score, _ in results], dtype=torch.float32)
    infos = np.empty(len(results), dtype=object)
    infos[:] = [info for _, info in results]
    return DataProto.from_dict({"scores": scores}, {"reward_info": infos})


class RewardWorker(Worker):
    """Base of reward workers. Subclasses implement :meth:`score_row` (or :meth:`score_rows` for batch scoring).

    Settings come from the role config: ``worker_config.reward_type`` (registry name) and
    ``worker_config.reward_kwargs`` (a dict). ``reward_kwargs`` keys a subclass accepts are those of its
    ``default_kwargs``; ``num_workers`` (threads scoring rows in parallel, default 2) is common to all. Unknown
    keys raise :class:`ConfigError`. Configuration happens in ``initialize`` (or lazily on the first call).
    """

    default_kwargs: ClassVar[dict[str, Any]] = {}
    common_kwargs: ClassVar[dict[str, Any]] = {"num_workers": 2}
    # Row fields the scorer needs; each inner tuple is satisfied by any one of its names. Pipelines check
    # their prompts against it before starting, so a forgotten column fails at load time, not as zero rewards.
    required_fields: ClassVar[tuple[tuple[str, ...], ...]] = ()

    def __init__(self, worker_config: Any) -> None:
        super().__init__(worker_config)
        self.reward_type: str = getattr(worker_config, "reward_type", None) or type(self).__name__
        self.reward_kwargs: dict[str, Any] = {}
        self._configured = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        """Read and validate ``reward_kwargs``, then run :meth:`setup`."""
        super().initialize(settings)
        self._configure()

    def _configure(self) -> None:
        if self._configured:
            return
        given = dict(getattr(self.worker_config, "reward_kwargs", None) or {})
        known = {**self.common_kwargs, **self.default_kwargs}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ConfigError(
                f"{self.worker_name}: unknown reward_kwargs {unknown} for reward type {self.reward_type!r}; "
                f"known keys: {sorted(known)}"
            )
        self.reward_kwargs = {**known, **given}
        workers = self.reward_kwargs["num_workers"]
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError(f"reward_kwargs.num_workers must be a positive integer, got {workers!r}")
        self.setup(self.reward_kwargs)
        self._configured = True

    def setup(self, kwargs: dict[str, Any]) -> None:
        """Hook: validate and store subclass settings (``kwargs`` has every key, defaults filled in)."""

    def score_row(self, row: dict[str, Any]) -> ScoredRow:
        """Hook: score one row (a dict of its non-tensor columns). Return ``(score, reason)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement score_row or score_rows")

    def score_rows(self, rows: list[dict[str, Any]]) -> list[ScoredRow]:
        """Hook: score all rows of this worker's shard. The default scores each row with :meth:`score_row` on
        ``num_workers`` threads; a row that raises scores 0 with the exception as its reason."""
        guarded = self._guarded(self.score_row)
        workers = min(self.reward_kwargs.get("num_workers", 1), len(rows))
        if workers <= 1:
            return [guarded(row) for row in rows]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{self.worker_name}-score") as pool:
            return list(pool.map(guarded, rows))

    def _guarded(self, fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], ScoredRow]:
        def run(row: dict[str, Any]) -> ScoredRow:
            try:
                return safe_score(fn(row), type(self).__name__)
            except Exception as e:
                logger.warning("%s: scoring a row failed: %r", self.worker_name, e, exc_info=True)
                return 0.0, f"scoring error: {type(e).__name__}: {e}"[:300]

        return run

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE, clear_cache=False)
    def compute_rewards(self, batch: DataProto) -> DataProto:
        """Score every row of ``batch``: float32 ``scores`` (B,) and ``reward_info`` (str per row)."""
        self._configure()
        rows = batch_rows(batch)
        try:
            results = self.score_rows(rows)
            if len(results) != len(rows):
                raise RuntimeError(f"score_rows returned {len(results)} results for {len(rows)} rows")
        except Exception as e:
            # A batch-level scorer failed: score row by row so one bad row cannot zero the whole batch.
            logger.warning("%s: score_rows failed (%r); retrying row by row", self.worker_name, e)
            single = self._guarded(lambda row: self.score_rows([row])[0])
            results = [single(row) for row in rows]
        return rewards_to_dataproto([safe_score(result, type(self).__name__) for result in results])


def resolve_reward_worker(name: str) -> type[RewardWorker]:
    """A reward worker class from a registered name (``REWARDS``) or a ``"package.module:Class"`` path."""
    if name in REWARDS:
        cls = REWARDS.get(name)
    elif ":" in name or "." in name:
        cls = import_target(name, "reward_type")
    else:
        raise ConfigError(f"unknown reward_type {name!r}; use one of {REWARDS.names()} or 'package.module:Class'")
    if not (isinstance(cls, type) and issubclass(cls, RewardWorker)):
        raise ConfigError(f"reward_type {name!r} resolves to {cls!r}, which is not a RewardWorker subclass")
    return cls
