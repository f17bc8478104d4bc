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
import gc
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies.base import InferenceStrategy, TrainStrategy
from roll.strategies.batching import (
    MicroBatchPlan,
    MicroLayout,
    infer_plan,
    model_layout,
    restore_row_order,
    split_micro_batches,
    train_plan,
)
from roll.strategies.contract import (
    ForwardFunc,
    LossFunc,
    LossScale,
    OffloadTarget,
    StrategyError,
    check_logits_to_keep,
)
from roll.strategies.megatron import _engine, _state
from roll.strategies.megatron._batching import (
    GatherContextParallel,
    PreparedInputs,
    check_batching,
    count_loss_tokens,
    loss_scale,
    pad_micro_batches,
    prepare_inputs,
    restore_logits,
    sequence_multiple,
)
from roll.strategies.megatron._freeze import megatron_frozen_names
from roll.strategies.megatron._hf_io import write_hf_folder
from roll.strategies.megatron._mapping import GptLayout, HfAssembler, MegatronMapping
from roll.strategies.megatron._translate import (
    check_model_supported,
    check_parallel_fit,
    padded_vocab_size,
    rank_info_from_parallel_state,
    resolve_params_dtype,
)
from roll.strategies.megatron.config import MegatronConfig
from roll.strategies.varlen import varlen_kwargs

__all__ = ["MegatronInferStrategy", "MegatronTrainStrategy"]

logger = logging.getLogger(__name__)

_Item = tuple[DataProto, PreparedInputs, int]  # micro-batch, its Megatron inputs, rows whose outputs count


class _MegatronModel(InferenceStrategy):
    """Setup, micro-batch preparation and scheduled forward passes shared by both megatron strategies."""

    config: MegatronConfig
    chunks: list[torch.nn.Module]

    def _setup(self, *, train: bool) -> None:
        from transformers import AutoConfig, AutoTokenizer

        path = self.model_args.model_name_or_path
        if not path:
            raise ConfigError("model_args.model_name_or_path is not set; point it at a local HF model folder")
        if self.model_args.lora_rank > 0:
            raise StrategyError("the megatron backend does not train LoRA adapters; set lora_rank=0 or use fsdp2")
        if self.model_args.gradient_checkpointing and self.config.recompute_granularity is None:
            logger.warning("model_args.gradient_checkpointing is ignored; set strategy_config.recompute_granularity")
        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=self.model_args.trust_remote_code)
        check_model_supported(hf_config)
        check_batching(self.worker_config.batching, self.config)
        worker, args = self.worker, self.worker_config.training_args
        self.device = _engine.init_parallel(self.config, worker.rank, worker.world_size, worker.local_rank, args.seed)
        worker.set_rank_info(rank_info_from_parallel_state(parallel_state, worker.rank, worker.world_size))
        vocab = padded_vocab_size(
            hf_config.vocab_size, self.config.make_vocab_size_divisible_by, self.config.tensor_model_parallel_size
        )
        self.layout = GptLayout.from_hf_config(hf_config, spec=self.config.transformer_impl, padded_vocab_size=vocab)
        check_parallel_fit(self.layout, self.config)
        self.mapping = MegatronMapping(self.layout)
        self.hf_config = hf_config
        self.params_dtype = resolve_params_dtype(self.config, self.model_args.dtype)
        self.chunks: list[Any] = _engine.build_model_chunks(
            self.config, self.layout, hf_config, self.params_dtype, self.device
        )
        _engine.load_hf_weights(self.chunks, self.mapping, path)
        if train:
            self._freeze(self.model_args.freeze_module_prefix)
            self.chunks = _engine.wrap_ddp(self.chunks, self.config)
        self.tokenizer = AutoTokenizer.from_pretrained(
            self.model_args.tokenizer_path, trust_remote_code=self.model_args.trust_remote_code
        )
        self.generation_config = _load_generation_config(path)
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        logger.info("megatron rank %s ready: %s", worker.rank, self.rank_info)

    def _freeze(self, prefixes: list[str] | None) -> None:
        """freeze_module_prefix: before DDP and the optimizer, so frozen parameters get no grads or state."""
        if not prefixes:
            return
        names = megatron_frozen_names(self.mapping, prefixes)  # checked against the whole model on every rank
        local = _engine.local_parameters(self.chunks)
        for name, param in local.items():
            if name in names:
                param.requires_grad_(False)
        logger.info("froze %d local parameters (prefixes %s)", sum(n in names for n in local), prefixes)

    # --- micro-batches ------------------------------------------------------------------------------------
    def _prepare(self, micro: DataProto, plan: MicroBatchPlan | None = None) -> PreparedInputs:
        """Megatron inputs of one micro-batch: rows as given, or (``plan`` with a token budget / packing) the
        columns holding real tokens, or the rows packed into one THD sequence."""
        keys = micro.batch.keys()
        if "input_ids" not in keys:
            raise StrategyError(f"{self.strategy_name} needs an 'input_ids' tensor; the batch has {micro.keys()}")
        info = self.rank_info
        multiple = sequence_multiple(info.tp_size, self.config.sequence_parallel, info.cp_size)
        layout = None
        if plan is not None and (plan.packing or plan.max_tokens is not None):
            round_to = math.lcm(plan.round_to, multiple)
            layout = model_layout(micro, None, replace(plan, round_to=round_to), pad_token_id=self._pad_id)
        if layout is not None and plan is not None and plan.packing:
            return self._packed_inputs(layout)
        source = micro.batch if layout is None else layout.inputs
        ids = source["input_ids"]
        prepared = prepare_inputs(
            ids,
            source["attention_mask"] if "attention_mask" in source.keys() else torch.ones_like(ids),
            multiple=multiple,
            cp_rank=info.cp_rank,
            cp_size=info.cp_size,
            pad_token_id=self._pad_id,
        )
        prepared.input_ids = prepared.input_ids.to(self.device)
        prepared.position_ids = prepared.position_ids.to(self.device)
        prepared.layout = layout
        return prepared

    def _packed_inputs(self, layout: MicroLayout) -> PreparedInputs:
        from megatron.core.packed_seq_params import PackedSeqParams

        ids, positions = layout.inputs["input_ids"], layout.inputs["position_ids"]
        bounds = varlen_kwargs(positions)
        cu_seqlens, longest = bounds["cu_seq_lens_q"].to(self.device), bounds["max_length_q"]
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            max_seqlen_q=longest,
            max_seqlen_kv=longest,
        )
        length = ids.shape[1]
        return PreparedInputs(
            input_ids=ids.to(self.device),
            position_ids=positions.to(self.device),
            shifts=torch.zeros(1, dtype=torch.long),
            length=length,
            padded_length=length,
            layout=layout,
            packed_seq_params=params,
        )

    def _full_logits(self, output: torch.Tensor, prepared: PreparedInputs) -> torch.Tensor:
        """float32 (b, T, V) logits of the micro-batch as given (un-rolled, un-padded, CP chunks gathered)."""
        if self.rank_info.cp_size > 1:
            output = GatherContextParallel.apply(output, parallel_state.get_context_parallel_group())
        logits = restore_logits(output, prepared, self.layout.vocab_size)
        return logits if prepared.layout is None else prepared.layout.restore(logits)

    def _schedule(self, items: list[_Item], reduce: Callable[..., Any], *, forward_only: bool) -> list[Any]:
        """Run megatron's pipeline schedule over ``items``; returns ``reduce``'s outputs (last stage only)."""

        def step(data_iterator: Iterator[_Item], model: torch.nn.Module):
            micro, prepared, real = next(data_iterator)
            extra = {} if prepared.packed_seq_params is None else {"packed_seq_params": prepared.packed_seq_params}
            output = model(prepared.input_ids, prepared.position_ids, None, runtime_gather_output=True, **extra)
            return output, partial(reduce, micro, prepared, real)

        return get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=[iter(items) for _ in self.chunks],  # each virtual stage walks the micro-batches
            model=self.chunks,
            num_microbatches=len(items),
            seq_length=items[0][1].padded_length,
            micro_batch_size=len(items[0][0]),
            forward_only=forward_only,
            collect_non_loss_data=forward_only,
        )

    def _with_fillers(self, micros: list[tuple[DataProto, int]]) -> list[tuple[DataProto, int]]:
        """Add zero-weight copies of the last micro-batch until the schedule has enough (interleaved PP needs pp)."""
        needed = self.config.pipeline_model_parallel_size if self.config.virtual_pipeline_model_parallel_size else 1
        return micros + [(micros[-1][0], 0)] * max(0, needed - len(micros))

    def forward_step(
        self, batch: DataProto, forward_func: ForwardFunc, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        """No-grad micro-batches of ``infer_batch_size`` rows; outputs on the last pipeline stage (else {}).

        Logits always cover every position (``logits_to_keep`` is checked, then allowed by the contract to be
        ignored): functions index positions from the end.
        """
        check_logits_to_keep(logits_to_keep)
        if len(batch) == 0:
            return {}
        for chunk in self.chunks:
            chunk.eval()
        size = min(self.worker_config.infer_batch_size, len(batch))
        plan = replace(infer_plan(self.worker_config), rows=size)
        order = None
        if self.rank_info.pp_size > 1:
            micros = pad_micro_batches(batch, size)  # pipeline stages exchange fixed-shape activations
        else:
            split, order = split_micro_batches(batch, plan)
            micros = [(micro, len(micro)) for micro in split]
        micros = self._with_fillers(micros)
        items = [(micro, self._prepare(micro, plan), real) for micro, real in micros]

        def reduce(micro: DataProto, prepared: PreparedInputs, real: int, output: torch.Tensor, **_: Any):
            outputs = forward_func(micro, self._full_logits(output, prepared))
            return {key: value[:real].detach().cpu() for key, value in outputs.items()}

        with torch.no_grad():
            results = self._schedule(items, reduce, forward_only=True)
        if not self.rank_info.is_pipeline_last_stage or not results:
            return {}
        return restore_row_order({key: torch.cat([r[key] for r in results]) for key in results[0]}, order)

    def _free(self) -> None:
        self.chunks = []
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _load_generation_config(path: str) -> Any:
    from transformers import GenerationConfig as HfGenerationConfig

    try:
        return HfGenerationConfig.from_pretrained(path)
    except OSError:
        return None


class MegatronInferStrategy(_MegatronModel):
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


class MegatronTrainStrategy(_MegatronModel, TrainStrategy):
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
        for _, metrics in results:
            for name, value in metrics.items():
                out[name] = out.get(name, 0.0) + value / len(results)
        loss = torch.tensor([sum(loss for loss, _ in results)], dtype=torch.float64, device=self.device)
        dist.all_reduce(loss, group=parallel_state.get_data_parallel_group())
        out["loss"] = float(loss)
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
