"""AdamW and the learning-rate schedule of a training role."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from roll.runtime import ConfigError

if TYPE_CHECKING:
    from roll.strategies.config import TrainingArgs

__all__ = ["build_optimizer", "build_scheduler", "lr_factor"]


def build_optimizer(model: nn.Module, args: TrainingArgs) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; biases and norm weights (1-D) are not decayed, as is customary."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    if not decay and not no_decay:
        raise ConfigError("the model has no trainable parameters; check model_args (LoRA target modules?)")
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
    )


def lr_factor(step: int, *, kind: str, warmup: int, total: int | None, min_ratio: float) -> float:
    """Multiplier of the base LR for optimizer step ``step`` (0-based).

    Warmup ramps linearly to 1 over ``warmup`` steps (step 0 already gets 1/warmup, so no step is wasted at lr 0);
    then ``linear``/``cosine`` decay to ``min_ratio`` at ``total`` steps and stay there.
    """
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant" or total is None:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, args: TrainingArgs) -> LambdaLR:
    """A LambdaLR following :func:`lr_factor` for ``args``' schedule."""
    if args.schedule_uses_max_steps and args.max_steps is None:
        raise ConfigError(
            f"training_args.lr_scheduler_type={args.lr_scheduler_type!r} with warmup_ratio={args.warmup_ratio} needs "
            "training_args.max_steps (the number of optimizer steps); set it, or use a constant schedule"
        )
    warmup = args.warmup_steps
    if not warmup and args.warmup_ratio > 0 and args.max_steps is not None:
        warmup = math.ceil(args.warmup_ratio * args.max_steps)
    # functools.partial (not a lambda) so LambdaLR.state_dict can include it.
    factor = functools.partial(
        lr_factor, kind=args.lr_scheduler_type, warmup=warmup, total=args.max_steps, min_ratio=args.min_lr_ratio
    )
    return LambdaLR(optimizer, factor)
