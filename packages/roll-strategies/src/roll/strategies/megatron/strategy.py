"""megatron_train / megatron_infer: Llama/Qwen-style models on megatron-core with TP / PP / CP / DP.

Each worker is one Megatron rank on one GPU. ``initialize`` builds the parallel groups from the config, records
the worker's real RankInfo (dispatch sends each data-parallel replica its rows and collects from the last
pipeline stage), builds ``GPTModel`` chunks from the HF config and fills them from the HF checkpoint.

Training uses megatron's DDP and optimizer (``DistributedOptimizer`` when ``use_distributed_optimizer``: fp32
master weights sharded over data parallel, gradient-norm clipping across model-parallel ranks) and its pipeline
schedules (``get_forward_backward_func``). ``loss_func`` / ``forward_func`` receive float32 logits over the
full vocabulary and sequence: TP shards are gathered by the output layer, CP chunks by an all-gather whose
backward keeps each rank's own part. Every rank of a replica computes the same loss; gradients come out as the
plain sum the loss-normalization contract defines (see ``_batching.loss_scale``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from roll.protocol import DataProto
from roll.strategies.base import TrainStrategy
from roll.strategies.batching import MicroBatchPlan, split_micro_batches, train_plan
from roll.strategies.contract import (
    LossFunc,
    LossScale,
    OffloadTarget,
    StrategyError,
    check_logits_to_keep,
    split_micro_metrics,
)
from roll.strategies.megatron import _engine, _state
from roll.strategies.megatron._base import MegatronModel
from roll.strategies.megatron._batching import PreparedInputs, count_loss_tokens, loss_scale
from roll.strategies.megatron._hf_io import write_hf_folder
from roll.strategies.megatron._mapping import HfAssembler

__all__ = ["MegatronInferStrategy", "MegatronTrainStrategy"]

logger = logging.getLogger(__name__)


class MegatronInferStrategy(MegatronModel):
    """``megatron_infer``: forward passes only (e.g. a reference policy), receiving HF-named weights."""

    strategy_name = "megatron_infer"

    def initialize(self) -> None:
        self._setup(train=False)
        self._params = _engine.local_parameters(self.chunks)
        self._assembler: HfAssembler | None = None

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Full HF tensors (every rank receives all): fuse q/k/v and gate/up, then copy this rank's shard."""
        if self._assembler is None:
            self._assembler = HfAssembler(self.mapping, wanted=self._params)
        info = self.rank_info
        for hf_name, tensor in named_tensors:
            ready = self._assembler.add(hf_name, tensor)
            _engine.copy_full_tensors(self._params, self.mapping, ready, info.tp_rank, info.tp_size)
        self._assembler.own_pending()  # the bucket's memory is reused after this call

    def abort_weight_update(self) -> None:
        self._assembler = None  # a new sync starts from scratch

    def process_weights_after_loading(self) -> None:
        assembler, self._assembler = self._assembler, None
        if assembler is None:
            return
        if assembler.unknown:
            unknown = assembler.unknown
            logger.warning("weight sync sent %d tensors the model does not use, e.g. %s", len(unknown), unknown[:3])
        if assembler.pending:
            raise StrategyError(
                "weight sync ended before every part of a fused parameter arrived; holding "
                f"{assembler.pending[:6]} without their partners (q/k/v or gate/up must all be sent)"
            )

    def offload_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        if self.device.type == "cuda" and (include is None or OffloadTarget.MODEL_PARAMS in set(include)):
            _engine.move_model(self.chunks, torch.device("cpu"), grads=False)

    def load_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        if self.device.type == "cuda" and (include is None or OffloadTarget.MODEL_PARAMS in set(include)):
            _engine.move_model(self.chunks, self.device, grads=False)

    def shutdown(self) -> None:
        self._params = {}
        self._free()


class MegatronTrainStrategy(MegatronModel, TrainStrategy):
    """``megatron_train``: megatron DDP + optimizer, pipeline schedules, dist_checkpointing checkpoints."""

    strategy_name = "megatron_train"

    def initialize(self) -> None:
        self._setup(train=True)
        args = self.worker_config.training_args
        self.optimizer, self.scheduler = _engine.build_optimizer(self.chunks, args, self.config, self.params_dtype)
        self.global_step = 0

    # --- training -----------------------------------------------------------------------------------------
    def _global_counts(self, batch: DataProto, loss_mask_key: str | None) -> LossScale:
        """Loss tokens and rows of the mini-batch over all data-parallel replicas; fails everywhere if one is empty."""
        group = parallel_state.get_data_parallel_group()
        tokens = count_loss_tokens(batch, loss_mask_key)
        sums = torch.tensor([tokens, len(batch)], dtype=torch.int64, device=self.device)
        fewest = torch.tensor([len(batch)], dtype=torch.int64, device=self.device)
        dist.all_reduce(sums, group=group)
        dist.all_reduce(fewest, op=dist.ReduceOp.MIN, group=group)
        if int(fewest) == 0:
            raise StrategyError(
                f"train_step got no rows on at least one of {self.rank_info.dp_size} data-parallel replicas; the "
                "mini-batch must have at least one row per replica"
            )
        return LossScale(num_tokens=int(sums[0]), num_seqs=int(sums[1]))

    def _train_micro_batches(self, batch: DataProto, plan: MicroBatchPlan) -> list[tuple[DataProto, int]]:
        size = plan.rows
        if plan.max_tokens is not None:  # token budget (PP=1, checked at setup); the loss is a sum over rows
            return self._with_fillers([(micro, len(micro)) for micro in split_micro_batches(batch, plan)[0]])
        if self.rank_info.pp_size > 1 and len(batch) % size:
            raise StrategyError(
                f"with pipeline parallelism every micro-batch must have per_device_train_batch_size={size} rows, but "
                f"this rank got {len(batch)} rows; make the rows per data-parallel replica a multiple of {size}"
            )
        return self._with_fillers([(micro, len(micro)) for micro in batch.split(size)])

    def train_step(
        self,
        batch: DataProto,
        loss_func: LossFunc,
        *,
        loss_mask_key: str | None = None,
        logits_to_keep: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step over this replica's rows; see the loss normalization in contract.py.

        Logits cover every position whatever ``logits_to_keep`` says (see :meth:`forward_step`).
        """
        check_logits_to_keep(logits_to_keep)
        counts = self._global_counts(batch, loss_mask_key)
        plan = train_plan(self.worker_config)
        micros = self._train_micro_batches(batch, plan)
        scale = loss_scale(self.rank_info.dp_size, len(micros))

        def reduce(micro: DataProto, prepared: PreparedInputs, real: int, output: torch.Tensor):
            loss, metrics = loss_func(micro, self._full_logits(output, prepared), counts)
            if not real:  # a filler micro-batch: runs through the schedule, contributes nothing
                return loss * 0.0, None
            return loss * scale, (float(loss.detach()), {k: float(v) for k, v in metrics.items()})

        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()  # type: ignore[operator]  # megatron DDP's method, hidden by Module.__getattr__
        self.optimizer.zero_grad()
        items = [(micro, self._prepare(micro, plan), real) for micro, real in micros]
        results = [r for r in self._schedule(items, reduce, forward_only=False) if r is not None]
        lr = float(self.optimizer.param_groups[0]["lr"])
        updated, grad_norm, _ = self.optimizer.step()
        if updated:
            self.scheduler.step(increment=1)
        else:
            logger.warning("optimizer step skipped: non-finite gradients (fp16 loss scale lowered)")
        self.global_step += 1
        return self._step_metrics(results, grad_norm, lr)

    def _step_metrics(self, results: list[Any], grad_norm: float | None, lr: float) -> dict[str, float]:
        out: dict[str, float] = {"grad_norm": float("nan") if grad_norm is None else float(grad_norm), "lr": lr}
        if not self.rank_info.is_pipeline_last_stage:
            return out  # the last stage's metrics are the ones collected
        sums: dict[str, float] = {}
        for _, metrics in results:
            for name, value in metrics.items():
                sums[name] = sums.get(name, 0.0) + value
        means, shares = split_micro_metrics(sums, len(results))
        out.update(means)
        names = sorted(shares)  # the same loss function on every rank: the same names
        totals = torch.tensor(
            [sum(loss for loss, _ in results), *(shares[name] for name in names)],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(totals, group=parallel_state.get_data_parallel_group())
        out["loss"] = float(totals[0])
        out.update({name: float(total) for name, total in zip(names, totals[1:])})
        return out

    # --- weights out / checkpoints ------------------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return _state.iter_hf_weights(self.chunks, self.mapping)

    def save_checkpoint(self, path: str) -> None:
        extra = {"global_step": self.global_step, "layout": self.layout, "config": self.config.model_dump()}
        _state.save_training_state(path, self.chunks, self.optimizer, self.scheduler, extra)

    def load_checkpoint(self, path: str) -> None:
        extra = _state.load_training_state(path, self.chunks, self.optimizer, self.scheduler)
        self.global_step = int(extra.get("global_step", 0))

    def export_hf(self, path: str) -> None:
        weights = self.named_weights()
        if dist.get_rank() == 0:
            write_hf_folder(
                path,
                weights,
                copy.deepcopy(self.hf_config),
                tokenizer=self.tokenizer,
                generation_config=self.generation_config,
                max_shard_bytes=self.config.export_max_shard_size_mb * 1024**2,
            )
        else:
            for _ in weights:  # take part in the gathers
                pass
        dist.barrier()

    # --- device memory ------------------------------------------------------------------------------------
    def offload_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        targets = set(OffloadTarget) if include is None else set(include)
        if self.device.type != "cuda":
            return
        if OffloadTarget.MODEL_PARAMS in targets:
            _engine.move_model(self.chunks, torch.device("cpu"), grads=True)
        if OffloadTarget.OPTIMIZER_STATES in targets:
            self.optimizer.offload_to_cpu()

    def load_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        targets = set(OffloadTarget) if include is None else set(include)
        if self.device.type != "cuda":
            return
        if OffloadTarget.MODEL_PARAMS in targets:
            _engine.move_model(self.chunks, self.device, grads=True)
        if OffloadTarget.OPTIMIZER_STATES in targets:
            self.optimizer.restore_from_cpu()

    def shutdown(self) -> None:
        self.optimizer = None
        self.scheduler = None
        self._free()
