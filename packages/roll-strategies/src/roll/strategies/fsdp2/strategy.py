"""FSDP2 strategies: data-parallel training with sharded parameters, and sharded reference-model forwards.

Every rank holds 1/fsdp_size of each parameter (``fully_shard`` per decoder layer, then the root); the ranks of a
role form one data-parallel group. All forward/backward passes are collectives, so every rank runs the same
number of micro-batches: a rank with fewer rows repeats one of its micro-batches with zero weight.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies.base import TrainStrategy
from roll.strategies.batching import MicroBatchPlan, PaddingStats, split_micro_batches, train_plan
from roll.strategies.contract import (
    LossFunc,
    LossScale,
    ModelLossFunc,
    OffloadTarget,
    StrategyError,
    check_logits_to_keep,
    split_micro_metrics,
)
from roll.strategies.fsdp2._base import Fsdp2Model
from roll.strategies.fsdp2._checkpoint import export_hf_folder, load_training_state, save_training_state
from roll.strategies.fsdp2._optim import build_optimizer, build_scheduler
from roll.strategies.fsdp2._weights import iter_full_weights, load_full_weights
from roll.strategies.fsdp2._writer import Fsdp2WeightWriter
from roll.strategies.fsdp2.config import Fsdp2Config

logger = logging.getLogger(__name__)

__all__ = ["Fsdp2InferStrategy", "Fsdp2TrainStrategy"]


class Fsdp2InferStrategy(Fsdp2Model):
    """``fsdp2_infer``: a sharded model for forward passes only (e.g. the reference policy)."""

    strategy_name = "fsdp2_infer"
    config: Fsdp2Config

    def initialize(self) -> None:
        self._load(train=False)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full tensors (every rank receives the same ones) into this rank's shards."""
        load_full_weights(self.model, named_tensors)

    def offload_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        if include is None or OffloadTarget.MODEL_PARAMS in set(include):
            self._move_model(torch.device("cpu"))

    def load_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        if include is None or OffloadTarget.MODEL_PARAMS in set(include):
            self._move_model(self.device)

    def shutdown(self) -> None:
        self.model = None  # type: ignore[assignment]
        gc.collect()


class Fsdp2TrainStrategy(Fsdp2Model, TrainStrategy):
    """``fsdp2_train``: AdamW on float32 master shards, mixed-precision compute, DCP checkpoints."""

    strategy_name = "fsdp2_train"
    config: Fsdp2Config

    def initialize(self) -> None:
        self._load(train=True)
        args = self.worker_config.training_args
        self.optimizer = build_optimizer(self.model, args)
        self.scheduler = build_scheduler(self.optimizer, args)

    def set_learning_rate(self, lr: float) -> None:
        if not (math.isfinite(lr) and lr > 0):
            raise ConfigError(f"learning rate must be a positive number, got {lr!r}")
        factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        self.scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)
        for group in self.optimizer.param_groups:
            group["initial_lr"] = lr
            group["lr"] = lr * factor

    # --- compute ----------------------------------------------------------------------------------------
    def _global_counts(self, batch: DataProto, num_micros: int, key: str | None) -> tuple[int, int, int]:
        """(global loss tokens, global rows, micro-batches every rank runs); fails on all ranks if one is empty."""
        if key is None:
            tokens = len(batch)
        elif key in batch.batch.keys():
            tokens = int((batch.batch[key] != 0).sum())
        else:
            raise StrategyError(f"loss_mask_key={key!r} is not a tensor of the batch ({batch.keys()})")
        total_tokens, total_rows = self._dp_sum([float(tokens), float(len(batch))])
        most_micros, neg_fewest_rows = self._all_reduce([float(num_micros), -float(len(batch))], dist.ReduceOp.MAX)
        if neg_fewest_rows >= 0:
            raise StrategyError(
                f"train_step got no rows on at least one of {self.dp_size} data-parallel ranks; give every rank at "
                "least one row (the mini-batch must have at least as many rows as the role has workers)"
            )
        return round(total_tokens), round(total_rows), int(most_micros)

    def train_step(
        self,
        batch: DataProto,
        loss_func: LossFunc,
        *,
        loss_mask_key: str | None = None,
        logits_to_keep: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step over the local rows of the mini-batch; see the loss normalization in contract.py."""
        keep = check_logits_to_keep(logits_to_keep)
        plan = train_plan(self.worker_config)
        return self._train(
            batch, lambda micro, scale: loss_func(micro, self._logits(micro, keep, plan), scale), loss_mask_key, plan
        )

    def train_model_step(
        self, batch: DataProto, loss_func: ModelLossFunc, *, loss_mask_key: str | None = None
    ) -> dict[str, float]:
        """One optimizer step where ``loss_func(micro, model_call, scale)`` calls the model itself."""
        call = self._model_call()
        plan = MicroBatchPlan(rows=self.worker_config.training_args.per_device_train_batch_size)
        return self._train(
            batch, lambda micro, scale: loss_func(micro.to(self.device), call, scale), loss_mask_key, plan
        )

    def _train(
        self,
        batch: DataProto,
        micro_loss: Callable[[DataProto, LossScale], tuple[torch.Tensor, dict[str, float]]],
        loss_mask_key: str | None,
        plan: MicroBatchPlan,
    ) -> dict[str, float]:
        self.model.train()
        args = self.worker_config.training_args
        self._check_sp_rows(batch)
        micros, _ = split_micro_batches(batch, plan)  # the loss is a sum over rows: their order does not matter
        self.padding = PaddingStats()
        num_tokens, num_seqs, num_steps = self._global_counts(batch, len(micros), loss_mask_key)
        scale = LossScale(num_tokens=num_tokens, num_seqs=num_seqs)
        loss_sum = 0.0
        metric_sums: dict[str, float] = {}
        for index in range(num_steps):
            real = index < len(micros)
            micro = micros[index] if real else micros[-1]
            loss, metrics = micro_loss(micro, scale)
            # FSDP averages gradients over all ranks but the loss is already a share of the global loss (and the ranks
            # of a Ulysses group each hold the gradient of their own slice of the sequence: they add up).
            (loss * (self.worker.world_size if real else 0.0)).backward()
            if real:
                loss_sum += float(loss.detach())
                for name, value in metrics.items():
                    metric_sums[name] = metric_sums.get(name, 0.0) + float(value)
            del loss
        grad_norm = self._clip_gradients(args.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("skipping the optimizer step: the gradient norm is %s", grad_norm)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        out, shares = split_micro_metrics(metric_sums, len(micros))
        names = sorted(shares)  # the same loss function on every rank: the same names
        totals = self._dp_sum([loss_sum, *(shares[name] for name in names)])
        out.update(zip(names, totals[1:]))
        out.update(loss=totals[0], grad_norm=grad_norm, lr=float(lr))
        if plan.max_tokens is not None or plan.packing:
            out.update(
                {"batching/micro_batches": float(len(micros)), "batching/padded_fraction": self.padding.padded_fraction}
            )
        return out

    def _clip_gradients(self, max_norm: float | None) -> float:
        """Total gradient norm over all shards; gradients are scaled down to ``max_norm`` when it is set."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        if max_norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return float(norm)

    # --- weights out ------------------------------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter_full_weights(self.model, self.compute_dtype)

    def weight_writer(self) -> Fsdp2WeightWriter:
        return Fsdp2WeightWriter(self.model, self.compute_dtype)

    def _meta(self) -> dict[str, Any]:
        return {
            "world_size": self.worker.world_size,
            "fsdp_size": self.config.fsdp_size or self.worker.world_size,
            "lora_rank": self.model_args.lora_rank,
        }

    def save_checkpoint(self, path: str) -> None:
        save_training_state(path, self.model, self.optimizer, self.scheduler, self._meta())

    def load_checkpoint(self, path: str) -> None:
        load_training_state(path, self.model, self.optimizer, self.scheduler, self._meta())

    def export_hf(self, path: str) -> None:
        if self.model_args.model_kind == "diffusion":
            from roll.strategies.diffusion._strategy import export_diffusion_folder

            source = self.model_args.model_name_or_path
            export_diffusion_folder(path, self.model, self.named_weights(), source, rank=self.worker.rank)
            return
        export_hf_folder(
            path,
            self.named_weights(),
            self.hf_config,
            dtype=self.compute_dtype,
            tokenizer=self.tokenizer,
            generation_config=self.generation_config,
            max_shard_size=self.config.export_max_shard_size,
        )

    # --- device memory ----------------------------------------------------------------------------------
    def offload_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        targets = set(OffloadTarget) if include is None else set(include)
        if OffloadTarget.MODEL_PARAMS in targets:
            self._move_model(torch.device("cpu"))
        if OffloadTarget.OPTIMIZER_STATES in targets:
            self._move_optimizer(torch.device("cpu"))

    def load_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        targets = set(OffloadTarget) if include is None else set(include)
        if OffloadTarget.MODEL_PARAMS in targets:
            self._move_model(self.device)
        if OffloadTarget.OPTIMIZER_STATES in targets:
            self._move_optimizer(self.device)

    def _move_optimizer(self, device: torch.device) -> None:
        if self.device.type != "cuda":
            return  # states already live in host memory
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device, non_blocking=True)
        torch.cuda.synchronize(self.device)

    def shutdown(self) -> None:
        self.optimizer = None  # type: ignore[assignment]
        self.scheduler = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
        gc.collect()
