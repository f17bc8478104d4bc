"""The model both FSDP2 strategies share: process group, device mesh and Ulysses group, loading and sharding (causal
LMs and diffusers models), and micro-batched forward passes in which every rank runs the same number of
collectives."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist

from roll.protocol import DataProto, RankInfo
from roll.strategies.base import InferenceStrategy
from roll.strategies.batching import (
    MicroBatchPlan,
    PaddingStats,
    infer_plan,
    model_layout,
    restore_row_order,
    split_micro_batches,
)
from roll.strategies.contract import ForwardFunc, ModelForwardFunc, StrategyError, check_logits_to_keep
from roll.strategies.freezing import freeze_by_prefix
from roll.strategies.fsdp2 import _model
from roll.strategies.fsdp2.config import Fsdp2Config
from roll.strategies.ops import accepts_logits_to_keep, packed_attention_mask
from roll.strategies.ulysses import UlyssesGroup, check_same_rows
from roll.strategies.varlen import register_varlen_sdpa, varlen_kwargs

logger = logging.getLogger(__name__)

__all__ = ["Fsdp2Model"]


class Fsdp2Model(InferenceStrategy):
    """Loading, sharding and micro-batched forward passes shared by both FSDP2 strategies."""

    config: Fsdp2Config
    model: torch.nn.Module
    padding: PaddingStats  # tokens the last forward_step / train_step computed, real and padding
    sp: UlyssesGroup | None = None  # the Ulysses sequence-parallel group (ulysses_size > 1)

    def _load(self, *, train: bool) -> None:
        """Join the process group, load tokenizer and model (LoRA-wrapped when training with lora_rank), shard it."""
        worker = self.worker
        self.padding = PaddingStats()
        self.device = _model.pick_device(worker.local_rank)
        _model.init_process_group(self.config, self.device, worker.rank, worker.world_size)
        self.mesh = _model.build_mesh(self.config, self.device, worker.world_size)
        # Parameters are sharded over the whole world; a Ulysses group of ulysses_size consecutive ranks shares
        # one data-parallel rank (same rows, a slice of the sequence each).
        self.sp = _model.build_ulysses_group(self.config, self.model_args, worker.rank, worker.world_size)
        sp_size = self.config.ulysses_size
        worker.set_rank_info(
            RankInfo(
                rank=worker.rank,
                world_size=worker.world_size,
                dp_rank=worker.rank // sp_size,
                dp_size=worker.world_size // sp_size,
                cp_rank=worker.rank % sp_size,
                cp_size=sp_size,
            )
        )
        _model.set_seed(self.worker_config.training_args.seed)
        self.compute_dtype, reduce_dtype = _model.resolve_dtypes(self.config, self.model_args, self.device)
        if self.model_args.model_kind == "diffusion":
            self._load_diffusion(train=train, reduce_dtype=reduce_dtype)
            return
        self.tokenizer = _model.load_tokenizer(self.model_args)
        # Training keeps float32 master weights (the optimizer updates them); FSDP casts them to compute dtype.
        model = _model.load_model(self.model_args, torch.float32 if train else self.compute_dtype, train=train)
        self.hf_config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        packing = self.worker_config.batching.sequence_packing
        if self.sp is not None:  # whole-sequence attention over head slices (padded and packed rows)
            _model.use_ulysses_attention(model, self.sp)
        elif packing and self.model_args.attn_implementation in (None, "sdpa", "eager"):
            # Packed rows attend per sequence (cu_seqlens) instead of through a dense block-diagonal mask.
            _model.hf_model(model).set_attn_implementation(register_varlen_sdpa())  # type: ignore[operator]
        if train and self.model_args.freeze_module_prefix:
            freeze_by_prefix(model, self.model_args.freeze_module_prefix)  # HF names, before sharding
        if self.model_args.lora_rank > 0:
            if train:
                model = _model.apply_lora(model, self.model_args)
            else:
                logger.info("fsdp2_infer runs the base model; lora_rank=%d is ignored", self.model_args.lora_rank)
        self._keeps_logits = accepts_logits_to_keep(_model.hf_model(model))
        self.model = _model.shard_model(
            model, self.mesh, self.config, param_dtype=self.compute_dtype, reduce_dtype=reduce_dtype
        )

    def _load_diffusion(self, *, train: bool, reduce_dtype: torch.dtype) -> None:
        """A diffusers model (no tokenizer), its blocks sharded like decoder layers (``wrap_modules`` = block classes)."""
        from roll.strategies.diffusion import shard_diffusion_model
        from roll.strategies.diffusion._strategy import load_role_model

        model = load_role_model(
            self.model_args.model_name_or_path, torch.float32 if train else self.compute_dtype, train=train
        )
        if train and self.model_args.freeze_module_prefix:
            freeze_by_prefix(model, self.model_args.freeze_module_prefix)
        self.hf_config, self.generation_config, self._keeps_logits = model.config, None, False
        self.model = shard_diffusion_model(
            model,
            self.mesh,
            block_classes=self.config.wrap_modules,
            wrap_blocks=self.config.wrap_blocks,
            reshard_after_forward=self.config.reshard_after_forward,
            param_dtype=self.compute_dtype,
            reduce_dtype=reduce_dtype,
        )

    def _model_call(self) -> Any:
        from roll.strategies.diffusion._strategy import device_call

        return device_call(self.model, self.device)

    @property
    def dp_size(self) -> int:
        return self.worker.world_size // self.config.ulysses_size

    def _all_reduce(self, values: list[float], op: Any) -> list[float]:
        """Reduce a few numbers over every rank of the role (a no-op on one rank)."""
        if self.worker.world_size == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def _dp_sum(self, values: list[float]) -> list[float]:
        """Sum over the data-parallel ranks: the ranks of a Ulysses group hold the same rows, so each counts once."""
        return [total / self.config.ulysses_size for total in self._all_reduce(values, dist.ReduceOp.SUM)]

    def _num_micro_batches(self, local: int) -> int:
        """The largest number of micro-batches any rank has: every rank must run that many forward passes."""
        return int(self._all_reduce([float(local)], dist.ReduceOp.MAX)[0])

    def _logits(self, micro: DataProto, keep: int | None, plan: MicroBatchPlan) -> torch.Tensor:
        """float32 logits (b, T, V) of one micro-batch, or (b, k, V) with ``keep=k``, laid out as ``plan`` says
        (rows as given, a trimmed window, or packed) and mapped back onto the rows as given."""
        layout = model_layout(micro, keep, plan, pad_token_id=self._pad_id)
        inputs: dict[str, Any] = {name: value.to(self.device) for name, value in layout.inputs.items()}
        self.padding.real += layout.real_tokens
        self.padding.computed += layout.computed_tokens
        if self.sp is not None:  # this rank's slice of the sequence; the logits of all (kept) positions come back
            kept = layout.keep if self._keeps_logits else None
            logits = _model.ulysses_logits(self.model, inputs, self.sp, self._pad_id, kept)
            return layout.restore(logits, kept is not None)
        segments = inputs.pop("segment_ids", None)
        if segments is not None:  # rows already packed by the data: several examples per row, each attending itself
            inputs["attention_mask"] = packed_attention_mask(segments, self.compute_dtype)
        if layout.row_index is not None:  # packed: sequence bounds for varlen attention
            inputs.update(varlen_kwargs(inputs["position_ids"]))
        if layout.keep is not None and self._keeps_logits:
            inputs["logits_to_keep"] = layout.keep  # the head runs on those positions only
        logits = self.model(**inputs, use_cache=False).logits.float()
        return layout.restore(logits, self._keeps_logits)

    @property
    def _pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0

    def _dummy_micro(self) -> DataProto:
        """A one-token batch for ranks that ran out of rows but must join the collectives."""
        ids = torch.zeros(1, 1, dtype=torch.long)
        return DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def forward_step(
        self, batch: DataProto, forward_func: ForwardFunc, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Micro-batches of ``infer_batch_size`` rows (or a token budget, see ``batching``) without gradients;
        outputs concatenated on the CPU in the batch's row order."""
        keep = check_logits_to_keep(logits_to_keep)
        self.model.eval()
        self._check_sp_rows(batch)
        plan = infer_plan(self.worker_config)
        micros, order = split_micro_batches(batch, plan)
        self.padding = PaddingStats()
        outputs: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for index in range(self._num_micro_batches(len(micros))):
                if index >= len(micros):
                    self._logits(micros[-1] if micros else self._dummy_micro(), keep, plan)
                    continue
                logits = self._logits(micros[index], keep, plan)
                for key, value in forward_func(micros[index], logits).items():
                    outputs.setdefault(key, []).append(value.detach().cpu())
                del logits
        return restore_row_order({key: torch.cat(values) for key, values in outputs.items()}, order)

    def _check_sp_rows(self, batch: DataProto) -> None:
        if self.sp is not None:
            check_same_rows(batch.batch["input_ids"] if len(batch) else None, self.sp)

    def _check_rows(self, local_rows: int) -> int:
        """The most micro-batches any rank has; fails on every rank if one has no rows (model functions cannot run
        a stand-in micro-batch)."""
        most, neg_fewest = self._all_reduce([float(local_rows), -float(local_rows)], dist.ReduceOp.MAX)
        if neg_fewest >= 0:
            raise StrategyError(
                f"{self.strategy_name} got no rows on at least one of {self.dp_size} data-parallel ranks; give "
                "every rank at least one row"
            )
        return int(most)

    def forward_model(self, batch: DataProto, forward_func: ModelForwardFunc) -> dict[str, torch.Tensor]:
        """``forward_func(micro, model_call)`` on micro-batches of ``infer_batch_size`` rows, without gradients."""
        self.model.eval()
        micros = batch.split(self.worker_config.infer_batch_size) if len(batch) else []
        self._check_rows(len(batch))
        num = self._num_micro_batches(len(micros))
        call = self._model_call()
        outputs: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for index in range(num):
                result = forward_func(micros[min(index, len(micros) - 1)].to(self.device), call)
                if index < len(micros):  # a rank with fewer micro-batches repeats its last one for the collectives
                    for key, value in result.items():
                        outputs.setdefault(key, []).append(value.detach().cpu())
        return {key: torch.cat(values) for key, values in outputs.items()}

    def _move_model(self, device: torch.device) -> None:
        if self.device.type == "cuda":
            _model.reshard(self.model)
            self.model.to(device)
