"""On-policy distillation (OPD) in RLVR: the student samples, frozen teachers score the samples' log-probs, and
the per-token reverse-KL estimate becomes (part of) the advantage.

ROLL's keys and semantics:

* ``is_pure_opd: true`` (``opd.pure``): ``advantage = -opd_kl_coef * (log p_student - log p_teacher)`` per token
  (``opd.penalty`` picks the KL estimate; ``k1`` is that log-ratio). The reward domains and the advantage
  estimator take no part in training: training rollouts are not scored at all, and the reward domains only
  score validation. ROLL's ``student_train`` / ``student_infer`` spellings of ``actor_train`` / ``actor_infer``
  are accepted in this mode.
* ``use_opd: true`` (``opd.mixed``): the estimator's reward-based advantage minus ``opd_kl_coef`` times the same
  KL estimate (before whitening and clipping), as ROLL adds it.
* Several teachers (ROLL's ``teacher: {name: role, ...}``, roll's ``teachers``): each is its own role, scoring
  only the rows routed to it (see :mod:`roll.pipelines.rlvr.teacher_routing`); a row's OPD term is the sum over
  its teachers of ``-opd_kl_coef_t * KL_t``, as ROLL's ``compute_advantage`` sums them.

Dense OPD (roll's own option, ``opd.dense_objective``; ROLL has no equivalent): the sampled-token estimate gives
one noisy scalar per position, and when the student samples a wrong token it only pushes that token down. With
``opd.dense_objective`` set, the teacher also returns its next-token distribution at every sampled position (its
top ``opd.dense_topk`` ids renormalised, or the whole vocabulary), and the student's loss adds ``opd_kl_coef`` times
that divergence (``roll.pipelines.algorithms.opd_dense_divergence``) over the response tokens: every id of the
teacher's support gets a gradient. ``opd.dense_mode`` says whether it replaces the sampled-token advantage (pure
OPD then has no policy-gradient signal) or is added to it. One teacher only.

The student's log-probs are the old log-probs of the step (a recompute pass or the rollout engine's); the teachers
score at the sampling temperature, as the reference does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from roll.pipelines.algorithms import masked_mean, opd_advantages
from roll.pipelines.config import RoleConfig
from roll.pipelines.rlvr.settings import PolicySettings
from roll.pipelines.rlvr.teacher_routing import scatter_rows
from roll.runtime import RollModel

__all__ = [
    "OPD_FLAT_KEYS",
    "SINGLE_TEACHER",
    "TEACHER_TOPK_INDICES",
    "TEACHER_TOPK_LOG_PROBS",
    "OPDSection",
    "TeacherConfig",
    "apply_opd",
    "check_opd_teachers",
    "dense_coef",
    "is_teacher_dict",
    "kl_metrics",
    "map_student_roles",
    "put_teacher_distributions",
    "split_teacher_dict",
    "teacher_kl_sums",
    "teacher_log_probs_key",
    "teacher_role_name",
    "teacher_rows_key",
    "teacher_settings",
    "teachers_of",
]

OPD_FLAT_KEYS: dict[str, str] = {"is_pure_opd": "opd.pure", "use_opd": "opd.mixed", "opd_kl_penalty": "opd.penalty"}
SINGLE_TEACHER = "teacher"  # the name of the one teacher of a ``teacher:`` role
DenseObjective = Literal[
    "forward_kl", "reverse_kl", "adaptive_kl", "skewed_forward_kl", "skewed_reverse_kl", "js_divergence"
]  # KD_OBJECTIVES
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"  # (B, R, k) float32: dense OPD's teacher distributions
TEACHER_TOPK_INDICES = "teacher_topk_indices"  # (B, R, k) int64 ids; absent for the whole vocabulary


class TeacherConfig(RoleConfig):
    """An OPD teacher: a frozen model that scores the student's samples (e.g. hf_infer or fsdp2_infer)."""

    opd_kl_coef: float = Field(default=1.0, ge=0, description="Weight of this teacher's reverse-KL term.")
    tag_included: list[str] = Field(
        default_factory=list,
        description="ROLL's teacher routing: this teacher scores the rows of every reward domain whose "
        "tag_included shares a tag with this list (empty: every row).",
    )


class OPDSection(RollModel):
    """On-policy distillation: pure (the teacher's KL is the whole advantage) or mixed (added to the reward's)."""

    pure: bool = Field(default=False, description="is_pure_opd: advantage = -coef * KL(student || teacher) only.")
    mixed: bool = Field(default=False, description="use_opd: reward-based advantage - coef * KL(student || teacher).")
    penalty: Literal["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs"] = Field(
        default="k1", description="The per-token KL estimate; k1 is log p_student - log p_teacher."
    )
    dense_objective: DenseObjective | None = Field(
        default=None,
        description="roll's dense OPD (not in ROLL): the teacher ships its next-token distribution at every sampled "
        "response position and the student's loss adds teacher-coef x this divergence (a KD objective: forward_kl, "
        "reverse_kl, ...) between the two distributions there. None: ROLL's sampled-token estimator only.",
    )
    dense_topk: int = Field(
        default=0,
        ge=0,
        description="Dense OPD: the teacher's top-k ids per position, renormalised (0: the whole vocabulary, exact; "
        "sends rows x response_length x vocab float32 per step, so only for small vocabularies).",
    )
    dense_mode: Literal["replace", "add"] = Field(
        default="replace",
        description="Dense OPD: replace the sampled-token OPD advantage by the dense loss (pure OPD: the policy "
        "gradient term is then 0), or add the dense loss to it.",
    )

    score_rollouts: bool = Field(
        default=False,
        description="Pure OPD: score the training rollouts with the reward domains as well, for the rollout/score, "
        "rollout/correct and rollout/format metrics only (the advantage stays the teachers' KL; no group filter "
        "runs). ROLL's pure OPD always scores them (true is written in for ROLL files); off, no reward runs on "
        "training rollouts.",
    )

    @model_validator(mode="after")
    def _exclusive(self) -> OPDSection:
        if self.pure and self.mixed:
            raise ValueError(
                "is_pure_opd (opd.pure) and use_opd (opd.mixed) are exclusive: pure OPD trains on the teacher's KL "
                "alone, mixed OPD adds it to the reward-based advantage; set only one"
            )
        if self.dense_objective is None and (self.dense_topk != 0 or self.dense_mode != "replace"):
            raise ValueError(
                "opd.dense_topk / opd.dense_mode are set but opd.dense_objective is not (they only shape dense OPD): "
                "set opd.dense_objective (e.g. forward_kl), or drop them"
            )
        if self.score_rollouts and not self.pure:
            raise ValueError(
                "opd.score_rollouts applies to pure OPD (is_pure_opd) only: other runs score their rollouts anyway; "
                "drop it or set is_pure_opd"
            )
        if self.dense_objective is not None and not self.on:
            raise ValueError(
                "opd.dense_objective needs on-policy distillation: set is_pure_opd (opd.pure) or use_opd (opd.mixed)"
            )
        return self

    @property
    def rollouts_scored(self) -> bool:
        """Whether the reward domains score the training rollouts (always, but in pure OPD without score_rollouts)."""
        return not self.pure or self.score_rollouts

    @property
    def dense(self) -> bool:
        """Whether the student's loss has the dense per-position divergence to the teacher."""
        return self.dense_objective is not None

    @property
    def sampled(self) -> bool:
        """Whether the sampled-token estimator enters the advantage (ROLL's OPD; off when dense replaces it)."""
        return self.on and not (self.dense and self.dense_mode == "replace")

    @property
    def on(self) -> bool:
        return self.pure or self.mixed


def teachers_of(
    teacher: TeacherConfig | None, teachers: Mapping[str, TeacherConfig] | None
) -> dict[str, TeacherConfig]:
    """The OPD teachers by name: ``teachers``, or ``{"teacher": teacher}`` for the single one."""
    if teachers:
        return dict(teachers)
    return {SINGLE_TEACHER: teacher} if teacher is not None else {}


def check_opd_teachers(
    section: OPDSection, teacher: TeacherConfig | None, teachers: Mapping[str, TeacherConfig] | None
) -> dict[str, TeacherConfig]:
    """The teachers of a config whose OPD is ``section``, after the checks every OPD pipeline makes: one spelling
    of the teachers, a teacher when OPD is on, one teacher for dense OPD."""
    if teacher is not None and teachers:
        raise ValueError("teacher (one teacher) and teachers (several) are both set; keep only one")
    found = teachers_of(teacher, teachers)
    if section.on and not found:
        raise ValueError(
            "is_pure_opd / use_opd need a teacher role (teacher: {model_args: ..., strategy_args: ...}, or "
            "several: teachers: {name: {..., tag_included: [...]}})"
        )
    if section.dense and len(found) != 1:
        raise ValueError(
            f"opd.dense_objective supports one teacher (teacher: ...), got {len(found)} ({sorted(found)}); "
            f"use one teacher or drop opd.dense_objective"
        )
    return found


def dense_coef(section: OPDSection, teachers: Mapping[str, TeacherConfig]) -> float:
    """Dense OPD's weight in the student's loss: the (single) teacher's opd_kl_coef; 0 without dense OPD."""
    return next(iter(teachers.values())).opd_kl_coef if section.dense and teachers else 0.0


def teacher_settings(section: OPDSection, temperature: float) -> PolicySettings:
    """A teacher's scoring: log-probs of the samples at the sampling ``temperature`` and, for dense OPD, its top-k
    (or whole) next-token distributions."""
    return PolicySettings(temperature=temperature, dense_topk=section.dense_topk if section.dense else None)


def map_student_roles(data: dict[str, Any]) -> None:
    """ROLL's pure-OPD role names: ``student_train`` -> ``actor_train``, ``student_infer`` -> ``actor_infer``."""
    for student, actor in (("student_train", "actor_train"), ("student_infer", "actor_infer")):
        if student not in data:
            continue
        if data.get(actor) is not None:
            raise ValueError(f"{student} and {actor} name the same role and both are set; keep only one")
        data[actor] = data.pop(student)


def is_teacher_dict(value: Any) -> bool:
    """Whether a raw ``teacher`` section is ROLL's multi-teacher dict (``{name: role, ...}``), not one role."""
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(v, Mapping) for v in value.values())
        and not set(value) & set(TeacherConfig.model_fields)
    )


def split_teacher_dict(data: dict[str, Any]) -> None:
    """ROLL's ``teacher: {teacher_32B: {...}, teacher_14B: {...}}`` -> roll's ``teachers`` (one role each)."""
    if not is_teacher_dict(data.get("teacher")):
        return
    if data.get("teachers") is not None:
        raise ValueError("teacher (a dict of teachers, ROLL's spelling) and teachers are both set; keep only one")
    data["teachers"] = data.pop("teacher")


def teacher_log_probs_key(name: str) -> str:
    """The batch column holding ``name``'s log-probs (``teacher_log_probs`` for the single ``teacher``)."""
    return "teacher_log_probs" if name == SINGLE_TEACHER else f"teacher_log_probs_{name}"


def teacher_role_name(name: str) -> str:
    """The pipeline role (cluster) of teacher ``name``: ``teacher``, or ``teacher/<name>`` for one of several."""
    return SINGLE_TEACHER if name == SINGLE_TEACHER else f"teacher/{name}"


def teacher_rows_key(name: str) -> str:
    """The (batch,) bool column of the rows routed to ``name`` (absent: every row)."""
    return "teacher_rows" if name == SINGLE_TEACHER else f"teacher_rows_{name}"


def put_teacher_distributions(batch: Any, result: Any, rows: torch.Tensor) -> None:
    """Dense OPD: the teacher's ``topk_log_probs`` (and ``topk_indices``) from its scoring ``result`` (DataProtos)
    into ``batch`` as :data:`TEACHER_TOPK_LOG_PROBS` / :data:`TEACHER_TOPK_INDICES`, zeros on the rows it did not
    score (``rows`` is False there; the student's loss masks them out by ``teacher_rows``)."""
    every = bool(rows.all())
    log_probs = result.batch["topk_log_probs"].float()
    if not every:
        log_probs = scatter_rows(log_probs, rows)
    batch.batch[TEACHER_TOPK_LOG_PROBS] = log_probs
    if "topk_indices" in result.batch.keys():
        indices = result.batch["topk_indices"].long()
        if not every:
            full = torch.zeros((len(rows), *indices.shape[1:]), dtype=torch.long)
            full[rows] = indices
            indices = full
        batch.batch[TEACHER_TOPK_INDICES] = indices


def _routed(data: Any, name: str, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, routed): ``name``'s (batch,) rows and the float (batch, T) mask of its tokens among ``mask``."""
    key = teacher_rows_key(name)
    rows = data[key].bool() if key in data.keys() else torch.ones(len(mask), dtype=torch.bool)
    return rows, mask.float() * rows[:, None].float()


def teacher_kl_sums(data: Any, mask: torch.Tensor, names: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Per teacher: the sum of ``log p_student - log p_teacher`` (``old_log_probs`` against its column) over its
    rows' tokens of ``mask``, and their count."""
    student = data["old_log_probs"].float()
    out: dict[str, tuple[float, float]] = {}
    for name in names:
        _, routed = _routed(data, name, mask)
        log_ratio = torch.where(routed > 0, student - data[teacher_log_probs_key(name)].float(), 0.0)
        out[name] = (float(log_ratio.sum()), float(routed.sum()))
    return out


def kl_metrics(sums: Mapping[str, tuple[float, float]], prefix: str) -> dict[str, float]:
    """Token means of :func:`teacher_kl_sums`: ``<prefix>`` over every teacher's rows and, for named teachers
    (several), ``<prefix>/<name>``. A teacher that scored no tokens (no row routed to it) has no ``<prefix>/<name>``:
    a 0.0 there would read as a student matching that teacher, and would pull its mean over domains down."""
    out = {
        f"{prefix}/{name}": total / tokens
        for name, (total, tokens) in sums.items()
        if (len(sums) > 1 or name != SINGLE_TEACHER) and tokens > 0
    }
    out[prefix] = sum(t for t, _ in sums.values()) / max(sum(n for _, n in sums.values()), 1.0)
    return out


def apply_opd(
    data: Any, advantages: torch.Tensor | None, mask: torch.Tensor, section: OPDSection, coefs: Mapping[str, float]
) -> tuple[torch.Tensor, dict[str, float]]:  # data: the batch's TensorDict
    """The OPD advantage (pure: ``advantages`` is None) or the mixed one, from ``old_log_probs`` and each teacher's
    log-probs (``coefs``: teacher name -> opd_kl_coef) on its routed rows; a row routed to no teacher gets 0.
    When dense OPD replaces the estimator (``section.sampled`` false) the OPD term is 0 (metrics still reported).

    Metrics: the teachers' KL on their rows (``opd/reverse_kl``, and per teacher ``opd/reverse_kl/<name>`` with
    ``opd/samples/<name>`` when there are several), ``opd/advantage_mean``."""
    student = data["old_log_probs"].float()
    opd = torch.zeros_like(student)
    metrics = kl_metrics(teacher_kl_sums(data, mask, list(coefs)), "opd/reverse_kl")
    if not section.sampled:  # dense OPD replaces the estimator: the actor's loss carries the teacher's signal
        metrics["opd/advantage_mean"] = 0.0
        return (opd if advantages is None else advantages), metrics
    for name, coef in coefs.items():
        rows, routed = _routed(data, name, mask)
        term = opd_advantages(student, data[teacher_log_probs_key(name)].float(), routed, coef, section.penalty)
        opd = opd + torch.where(routed > 0, term, torch.zeros_like(term))  # unrouted rows hold no teacher values
        if len(coefs) > 1 or name != SINGLE_TEACHER:
            metrics[f"opd/samples/{name}"] = float(rows.sum())
    metrics["opd/advantage_mean"] = float(masked_mean(opd, mask))
    return (opd if advantages is None else advantages + opd), metrics
