"""The OPD teachers' clusters at work: each scores the log-probs of the rows routed to it, side by side with the
step's other scoring calls, and its results land in the batch as the OPD advantage reads them.

Shared by the pipelines that run on-policy distillation (RLVR, agentic); the routing itself is
:class:`~roll.pipelines.rlvr.teacher_routing.TeacherRouter`, the advantage :func:`~roll.pipelines.rlvr.opd.apply_opd`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from roll.pipelines.rlvr.opd import (
    put_teacher_distributions,
    teacher_kl_sums,
    teacher_log_probs_key,
    teacher_rows_key,
)
from roll.pipelines.rlvr.teacher_routing import TeacherRouter, scatter_rows
from roll.protocol import DataProto
from roll.runtime import PendingCall, materialize_all

__all__ = ["TeacherScoring"]


class TeacherScoring:
    """The teachers (name -> cluster with ``compute_log_probs``) and the router that picks each one's rows by tag."""

    def __init__(self, clusters: Mapping[str, Any], router: TeacherRouter) -> None:
        self.clusters = dict(clusters)
        self.router = router

    def __bool__(self) -> bool:
        return bool(self.clusters)

    def start(self, batch: DataProto) -> tuple[dict[str, torch.Tensor], dict[str, PendingCall]]:
        """Each teacher's rows of ``batch`` (by its ``tag`` column) and its log-prob call on just those rows (no call
        for a teacher with none); the calls are keyed ``teacher:<name>``."""
        routes = self.router.masks(batch.non_tensor_batch["tag"]) if self.clusters else {}
        pending = {}
        for name, cluster in self.clusters.items():
            rows = routes[name]
            if bool(rows.any()):
                routed = batch if bool(rows.all()) else batch.select_idxs(rows)
                pending[f"teacher:{name}"] = cluster.compute_log_probs(routed, blocking=False)
        return routes, pending

    @staticmethod
    def put(batch: DataProto, routes: Mapping[str, torch.Tensor], results: Mapping[str, Any]) -> None:
        """Each teacher's log-probs into ``batch`` (0 on the rows it did not score) with its rows mask, and dense
        OPD's distributions where the (single) teacher returned them."""
        width = batch.batch["response_mask"].shape[1]
        for name, rows in routes.items():
            result = results.get(f"teacher:{name}")
            values = result.batch["log_probs"] if result is not None else torch.zeros(0, width)
            batch.batch[teacher_log_probs_key(name)] = values if bool(rows.all()) else scatter_rows(values, rows)
            batch.batch[teacher_rows_key(name)] = rows
            if result is not None and "topk_log_probs" in result.batch.keys():  # dense OPD (one teacher)
                put_teacher_distributions(batch, result, rows)

    def kl_sums(self, batch: DataProto, student: Any) -> dict[str, tuple[float, float]]:
        """Validation: per teacher, the sum of ``log p_student - log p_teacher`` over its rows' response tokens and
        their count; the student's log-probs from ``student`` (actor_train), scored beside the teachers'."""
        routes, pending = self.start(batch)
        pending["old"] = student.compute_log_probs(batch, blocking=False)
        results = dict(zip(pending, materialize_all(*pending.values())))
        self.put(batch, routes, results)
        batch.batch["old_log_probs"] = results["old"].batch["log_probs"]
        return teacher_kl_sums(batch.batch, batch.batch["response_mask"], list(self.clusters))
