"""Workers shared by several pipelines."""

from __future__ import annotations

from roll.pipelines.workers.generation import greedy_decode, next_token_forward
from roll.pipelines.workers.logprob import LogProbWorker, sequence_log_prob_forward

__all__ = ["LogProbWorker", "greedy_decode", "next_token_forward", "sequence_log_prob_forward"]
