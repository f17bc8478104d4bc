"""Workers shared by several pipelines."""

from __future__ import annotations

from roll.pipelines.workers.logprob import LogProbWorker, sequence_log_prob_forward

__all__ = ["LogProbWorker", "sequence_log_prob_forward"]
