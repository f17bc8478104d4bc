"""The model both megatron strategies share: parallel groups and rank info, model chunks filled from the HF
checkpoint, Megatron inputs of a micro-batch (padded, trimmed or packed THD), and forward passes through megatron's
pipeline schedules."""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies.base import InferenceStrategy
from roll.strategies.batching import (
    MicroBatchPlan,
    MicroLayout,
    infer_plan,
    model_layout,
    restore_row_order,
    split_micro_batches,
)
from roll.strategies.contract import ForwardFunc, StrategyError, check_logits_to_keep
from roll.strategies.megatron import _engine
from roll.strategies.megatron._batching import (
    GatherContextParallel,
    PreparedInputs,
    check_batching,
    pad_micro_batches,
    prepare_inputs,
    restore_logits,
    sequence_multiple,
)
from roll.strategies.megatron._freeze import megatron_frozen_names
from roll.strategies.megatron._mapping import GptLayout, MegatronMapping
from roll.strategies.megatron._translate import (
    check_model_supported,
    check_parallel_fit,
    padded_vocab_size,
    rank_info_from_parallel_state,
    resolve_params_dtype,
)
from roll.strategies.megatron.config import MegatronConfig
from roll.strategies.varlen import varlen_kwargs

__all__ = ["MegatronModel"]

logger = logging.getLogger(__name__)

_Item = tuple[DataProto, PreparedInputs, int]  # micro-batch, its Megatron inputs, rows whose outputs count


class MegatronModel(InferenceStrategy):
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
        hf_config = AutoConfig.from_pretrained(
            path, trust_remote_code=self.model_args.trust_remote_code, **self.model_args.model_config_kwargs
        )
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
