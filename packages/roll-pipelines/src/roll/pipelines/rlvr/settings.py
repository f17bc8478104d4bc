"""What each RLVR worker is told at ``initialize``: its own settings, resolved from the config, checked here.

A worker never reads the pipeline config or another role's section: :class:`~roll.pipelines.rlvr.config.RLVRConfig`
builds these (``actor_settings()``, ``policy_settings()``, ``critic_settings()``) with every default and cross-role
value already resolved (e.g. the sampling temperature, taken from ``actor_infer``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from roll.pipelines.algorithms import KD_OBJECTIVES, LOSS_AGG_MODES
from roll.pipelines.algorithms.pg_variants import PG_VARIANTS, PGVariantParams
from roll.runtime import ConfigError

__all__ = ["ActorSettings", "CriticSettings", "PolicySettings"]


def _positive(owner: str, name: str, value: float | None, *, above: float = 0.0) -> None:
    if value is not None and not value > above:
        raise ConfigError(f"{owner}.{name} must be greater than {above:g}, got {value!r}")


@dataclass(frozen=True)
class PolicySettings:
    """A policy that scores responses (the reference): log-probs at the temperature the rollouts were sampled at."""

    temperature: float = 1.0
    full_distribution: bool = False  # also return the whole log-softmax per position (kl penalty 'full')
    dense_topk: int | None = None  # dense OPD teacher: also the top-k distribution per position (0: whole vocab)

    def __post_init__(self) -> None:
        _positive("PolicySettings", "temperature", self.temperature)
        if self.dense_topk is not None and (isinstance(self.dense_topk, bool) or self.dense_topk < 0):
            raise ConfigError(
                f"PolicySettings.dense_topk must be None or >= 0 (0: whole vocabulary), got {self.dense_topk!r}"
            )


@dataclass(frozen=True)
class ActorSettings:
    """The trained policy's loss: PPO-clip family (clip-higher, dual clip, GSPO) or another of ROLL's pg_variants
    (vanilla, tis, topr, cispo, kimi15; constants in ``pg_params``), per-sample difficulty/length weights of the
    policy loss (ROLL's), KL loss and entropy bonus. ROLL's ``rl_loss_coef`` scales the policy-gradient + KL terms
    (not the entropy bonus); ``positive_loss_coef`` / ``topr_negative_loss_coef`` add ROLL's score-split terms
    (:func:`~roll.pipelines.algorithms.pg_variants.score_split_loss`).

    ``temperature``: that of the rollouts (greedy sampling counts as 1); ``kl_loss_coef`` 0 means no KL loss term.
    """

    temperature: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    importance_sampling: Literal["token", "sequence"] = "token"
    loss_agg_mode: str = "token-mean"
    entropy_coef: float = 0.0
    kl_loss_coef: float = 0.0
    kl_penalty: str = "k3"
    pg_variant: str = "ppo"
    pg_params: PGVariantParams = field(default_factory=PGVariantParams)
    difficulty_loss_weight: bool = False
    length_loss_weight: bool = False
    full_distribution: bool = False  # compute_log_probs also returns whole distributions (kl penalty 'full')
    rl_loss_coef: float = 1.0
    positive_loss_coef: float = 0.0
    topr_negative_loss_coef: float = 0.0
    opd_dense_objective: str | None = None  # dense OPD: the KD divergence to the teacher's distributions
    opd_dense_coef: float = 0.0  # its weight (the teacher's opd_kl_coef)

    def __post_init__(self) -> None:
        _positive("ActorSettings", "temperature", self.temperature)
        if self.opd_dense_objective is not None and self.opd_dense_objective not in KD_OBJECTIVES:
            raise ConfigError(
                f"ActorSettings.opd_dense_objective must be None or one of {KD_OBJECTIVES}, "
                f"got {self.opd_dense_objective!r}"
            )
        if self.pg_variant not in PG_VARIANTS:
            raise ConfigError(f"ActorSettings.pg_variant must be one of {PG_VARIANTS}, got {self.pg_variant!r}")
        _positive("ActorSettings", "clip_low", self.clip_low)
        _positive("ActorSettings", "clip_high", self.clip_high)
        _positive("ActorSettings", "dual_clip", self.dual_clip, above=1.0)
        if self.importance_sampling not in ("token", "sequence"):
            raise ConfigError(
                f"ActorSettings.importance_sampling must be 'token' or 'sequence', got {self.importance_sampling!r}"
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ConfigError(
                f"ActorSettings.loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}"
            )
        for name in (
            "entropy_coef",
            "kl_loss_coef",
            "rl_loss_coef",
            "positive_loss_coef",
            "topr_negative_loss_coef",
            "opd_dense_coef",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"ActorSettings.{name} must be >= 0, got {getattr(self, name)!r}")

    @property
    def kl_loss_on(self) -> bool:
        return self.kl_loss_coef > 0


@dataclass(frozen=True)
class CriticSettings:
    """The value model's loss: clipped value loss (``value_clip`` None: plain squared error)."""

    value_clip: float | None = 0.5

    def __post_init__(self) -> None:
        _positive("CriticSettings", "value_clip", self.value_clip)
