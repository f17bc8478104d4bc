"""What travels between a Worker and its strategy on each call, as types: functions, counts and options.

A Worker hands its strategy a function and the options that change what the strategy computes, all as typed
arguments of the call (see :class:`~roll.strategies.base.InferenceStrategy`)::

    strategy.forward_step(batch, forward_func, logits_to_keep=k)
    strategy.train_step(batch, loss_func, loss_mask_key="response_mask", logits_to_keep=k)

``batch.meta_info`` carries metrics and user-level data only; a strategy never reads an option from it.

Functions
---------
``forward_func(micro_batch, logits)`` and ``loss_func(micro_batch, logits, scale)`` receive float32 logits of
shape (b, T, V) for one micro-batch and must not keep them: the strategy frees each micro-batch's logits before
the next one. With ``logits_to_keep=k`` a backend may compute and pass only the last k positions, (b, k, V), so
functions index positions from the end.

Loss normalization
------------------
``loss_func`` gets the mini-batch's global counts as a :class:`LossScale`: ``num_tokens`` (non-zero entries of
``batch[loss_mask_key]`` over the whole mini-batch on every data-parallel rank; rows when no key is given) and
``num_seqs`` (rows of the whole mini-batch). A loss normalized by those counts is the micro-batch's exact share of
the mini-batch loss, so results do not depend on how rows are split into micro-batches or ranks.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import torch

from roll.protocol import DataProto
from roll.runtime import RollError

__all__ = [
    "SHARE",
    "ForwardFunc",
    "LossFunc",
    "LossScale",
    "ModelCall",
    "ModelForwardFunc",
    "ModelLossFunc",
    "OffloadTarget",
    "StrategyError",
    "check_logits_to_keep",
    "split_micro_metrics",
]


class StrategyError(RollError):
    """A strategy was asked for something its backend cannot do, or its backend failed."""


class OffloadTarget(enum.StrEnum):
    """What ``offload_states`` / ``load_states`` move between the device and host memory."""

    MODEL_PARAMS = "model_params"
    OPTIMIZER_STATES = "optimizer_states"
    KV_CACHE = "kv_cache"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LossScale:
    """The counts a loss divides by so that each micro-batch contributes its exact share of the mini-batch loss.

    ``num_tokens``: non-zero entries of the loss mask over the whole mini-batch on every data-parallel rank (rows
    when the train step has no ``loss_mask_key``); ``num_seqs``: rows of the whole mini-batch.
    """

    num_tokens: int
    num_seqs: int

    def __post_init__(self) -> None:
        if not _is_int(self.num_tokens) or self.num_tokens < 0:
            raise StrategyError(f"LossScale.num_tokens must be an integer >= 0, got {self.num_tokens!r}")
        if not _is_int(self.num_seqs) or self.num_seqs < 1:
            raise StrategyError(f"LossScale.num_seqs must be an integer >= 1, got {self.num_seqs!r}")


SHARE = "@share"
"""Suffix of a loss function's metric that is, like the loss itself, its micro-batch's share of a mini-batch total
(e.g. a policy-gradient term divided by the LossScale counts): strategies sum it over the micro-batches and the
data-parallel ranks and report the total without the suffix. Any other metric is a per-micro-batch value (a clip
fraction, a mean entropy), averaged over the rank's micro-batches."""


def split_micro_metrics(sums: Mapping[str, float], micro_batches: int) -> tuple[dict[str, float], dict[str, float]]:
    """``(means, shares)`` of a rank's loss-function metrics summed over its ``micro_batches`` micro-batches: the
    per-micro-batch metrics averaged, the :data:`SHARE` ones (suffix dropped) still to be summed over the ranks."""
    means = {name: total / micro_batches for name, total in sums.items() if not name.endswith(SHARE)}
    shares = {name.removesuffix(SHARE): total for name, total in sums.items() if name.endswith(SHARE)}
    return means, shares


ModelCall: TypeAlias = Callable[..., torch.Tensor]
"""The loaded model as a function of its inputs, on the strategy's device: for a diffusion model
``model_call(sample, timesteps, class_labels) -> prediction`` (whatever the diffusers class)."""

ModelForwardFunc: TypeAlias = Callable[[DataProto, ModelCall], dict[str, torch.Tensor]]
"""``forward_func(micro_batch, model_call) -> {name: tensor with one row per micro-batch row}`` (no gradients).
For models that are called several times per row (a diffusion sampler), not once on token ids."""

ModelLossFunc: TypeAlias = Callable[[DataProto, ModelCall, LossScale], tuple[torch.Tensor, dict[str, float]]]
"""``loss_func(micro_batch, model_call, scale) -> (loss, metrics)``: the micro-batch's share of the loss, computed
by calling the model as often as the algorithm needs (e.g. the last K steps of a sampler)."""

ForwardFunc: TypeAlias = Callable[[DataProto, torch.Tensor], dict[str, torch.Tensor]]
"""``forward_func(micro_batch, logits) -> {name: tensor with one row per micro-batch row}``."""

LossFunc: TypeAlias = Callable[[DataProto, torch.Tensor, LossScale], tuple[torch.Tensor, dict[str, float]]]
"""``loss_func(micro_batch, logits, scale) -> (loss, metrics)``; the loss is the micro-batch's share, and so is any
metric named with the :data:`SHARE` suffix."""


def check_logits_to_keep(value: int | None) -> int | None:
    """``value`` if it is None or a positive number of positions; a StrategyError otherwise."""
    if value is not None and (not _is_int(value) or value < 1):
        raise StrategyError(f"logits_to_keep must be a positive number of positions (or None for all), got {value!r}")
    return value
