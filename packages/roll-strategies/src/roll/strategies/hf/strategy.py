"""HfInferStrategy: forward passes and generation with a plain transformers causal LM on one device.

Generation runs ``model.generate`` on chunks of left-padded prompts, each prompt expanded to
``num_return_sequences`` consecutive rows. Sampling parameters come only from roll's
:class:`~roll.strategies.config.GenerationConfig`: the model's own ``generation_config.json`` sampling defaults
are cleared at load time so a checkpoint cannot silently change them.

Rollout log-probs are log p(token) under softmax(raw_logits / temperature) (temperature 0 counts as 1): the
quantity ``ops.log_probs_from_logits`` gives on a forward pass, not the distribution after top-k/top-p/min-p or
the repetition penalty. They are recorded step by step by
:class:`~roll.strategies.hf._sampling.RawLogProbRecorder` rather than with ``output_logits=True``, which would
keep steps x rows x vocab float32 logits alive until generate() returns.

Rows with a seed of their own (the batch's ``sampling_seed`` column, see
:func:`~roll.strategies.generation.sample_seeds`) are drawn by :class:`~roll.strategies.hf._sampling.SeededRowSampler`
from per-row random streams (a hash of the row's seed and the decode step), so their tokens do not depend on the
other rows of the batch; generate() then runs greedy over its one-hot choice. Without the column the batch samples
from torch's generator, seeded by ``generation_config.seed`` when set.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from roll.protocol import DataProto
from roll.strategies.base import InferenceStrategy
from roll.strategies.batching import infer_plan, model_layout, restore_row_order, split_micro_batches
from roll.strategies.config import GenerationConfig
from roll.strategies.contract import (
    ForwardFunc,
    ModelForwardFunc,
    OffloadTarget,
    StrategyError,
    check_logits_to_keep,
)
from roll.strategies.generation import build_generation_output, sample_seeds
from roll.strategies.hf import _loading
from roll.strategies.hf._sampling import (
    RawLogProbRecorder,
    ResponseStopStrings,
    SampledRows,
    SeededRowSampler,
    build_logits_processors,
    cut_responses,
)
from roll.strategies.hf.config import HfInferConfig
from roll.strategies.ops import accepts_logits_to_keep
from roll.strategies.weight_sync.shared_weights import adopt_shared_weights, shared_layout

__all__ = ["HfInferStrategy"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG for one call without disturbing the process-wide RNG state afterwards."""
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class HfInferStrategy(InferenceStrategy):
    """The ``hf_infer`` backend: transformers forward + generate, weights updated in place."""

    strategy_name = "hf_infer"
    config: HfInferConfig

    def __init__(self, worker: Any, config: HfInferConfig) -> None:
        super().__init__(worker, config)
        self.model: Any = None
        self._keeps_logits = False  # whether the loaded model takes logits_to_keep
        self.stop_token_ids: list[int] = []
        self._offloaded = False
        # name -> parameter/buffer for update_weights, built on the first sync; dropped whenever the model moves
        # (module.to() replaces buffer objects) or is replaced.
        self._targets: dict[str, torch.Tensor] | None = None

    # --- lifecycle --------------------------------------------------------------------------------------
    def initialize(self) -> None:
        from transformers import GenerationConfig as HfGenerationConfig

        # Check both paths before the (slow) loads so a typo fails fast.
        _loading.require_folder(self.model_args.model_name_or_path, "model_args.model_name_or_path")
        self.device = _loading.choose_device(self.config)
        self._targets = None
        dtype = _loading.choose_dtype(self.model_args, self.config, self.device)
        if self.model_args.model_kind == "diffusion":
            from roll.strategies.diffusion._strategy import load_role_model

            self.model = load_role_model(self.model_args.model_name_or_path, dtype, train=False).to(self.device)
            logger.info("hf_infer loaded diffusion model %s on %s", self.model_args.model_name_or_path, self.device)
            return
        self.tokenizer = _loading.load_tokenizer(self.model_args)
        self.model = _loading.load_model(self.model_args, dtype, self.device)
        self._keeps_logits = accepts_logits_to_keep(self.model)
        self.stop_token_ids = _loading.stop_token_ids_of(self.tokenizer, self.model)
        # Only special-token ids survive: sampling defaults (and EOS, which generate() gets per call) would
        # otherwise be merged into every request by transformers.
        loaded = self.model.generation_config
        self.model.generation_config = HfGenerationConfig(
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=getattr(loaded, "bos_token_id", None),
            decoder_start_token_id=getattr(loaded, "decoder_start_token_id", None),
        )
        logger.info(
            "hf_infer loaded %s on %s (%s); stop tokens %s",
            self.model_args.model_name_or_path,
            self.device,
            dtype,
            self.stop_token_ids,
        )

    def shutdown(self) -> None:
        self.model = None
        self._targets = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _require_ready(self) -> Any:
        if self.model is None:
            raise StrategyError("hf_infer: the model is not loaded; call initialize() first")
        if self._offloaded:
            raise StrategyError("hf_infer: the model is offloaded to the CPU; call load_states() before using it")
        return self.model

    # --- compute ----------------------------------------------------------------------------------------
    def forward_step(
        self, batch: DataProto, forward_func: ForwardFunc, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Micro-batches of ``infer_batch_size`` rows (or a token budget, packed or not: see ``batching``);
        ``forward_func`` gets them on the model's device; outputs come back in the batch's row order."""
        model = self._require_ready()
        keep = check_logits_to_keep(logits_to_keep)
        plan = infer_plan(self.worker_config)
        micros, order = split_micro_batches(batch, plan)
        pad_id = getattr(self.tokenizer, "pad_token_id", None) or 0
        outputs: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for micro in micros:
                micro = micro.to(self.device)
                layout = model_layout(micro, keep, plan, pad_token_id=pad_id)
                extra = {"logits_to_keep": layout.keep} if layout.keep is not None and self._keeps_logits else {}
                inputs = {name: value for name, value in layout.inputs.items() if name != "segment_ids"}
                logits = model(**inputs, use_cache=False, **extra).logits.float()
                result = forward_func(micro, layout.restore(logits, self._keeps_logits))
                del logits  # the contract: one micro-batch's logits alive at a time
                for key, value in result.items():
                    outputs.setdefault(key, []).append(value.detach().cpu())
        return restore_row_order({key: torch.cat(values, dim=0) for key, values in outputs.items()}, order)

    def forward_model(self, batch: DataProto, forward_func: ModelForwardFunc) -> dict[str, torch.Tensor]:
        """``forward_func(micro, model_call)`` on micro-batches of ``infer_batch_size`` rows, without gradients."""
        from roll.strategies.diffusion._strategy import device_call

        call = device_call(self._require_ready(), self.device)
        outputs: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for micro in batch.split(self.worker_config.infer_batch_size):
                for key, value in forward_func(micro.to(self.device), call).items():
                    outputs.setdefault(key, []).append(value.detach().cpu())
        return {key: torch.cat(values, dim=0) for key, values in outputs.items()}

    def generate(self, batch: DataProto, generation_config: GenerationConfig) -> DataProto:
        """``num_return_sequences`` samples per prompt, laid out by :func:`build_generation_output`."""
        self._require_ready()
        seeds = sample_seeds(batch, generation_config)
        n = generation_config.num_return_sequences
        responses: list[list[int]] = []
        log_probs: list[list[float]] = []
        reasons: list[str] = []
        with torch.no_grad(), _seeded(generation_config.seed, self.device):
            for chunk in batch.split(self.config.generate_batch_size):
                done = len(responses)  # rows generated so far: the chunk's samples start there
                chunk_seeds = None if seeds is None else seeds[done : done + len(chunk) * n]
                rows = self._generate_chunk(chunk, generation_config, chunk_seeds)
                responses += rows.responses
                log_probs += rows.log_probs
                reasons += rows.finish_reasons
        return build_generation_output(
            batch,
            responses,
            log_probs if generation_config.logprobs else None,
            reasons,
            num_return_sequences=generation_config.num_return_sequences,
            max_new_tokens=generation_config.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
        )

    def _chunk_prompts(self, chunk: DataProto, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's prompts without all-padding leading columns, each repeated ``n`` times (consecutive)."""
        input_ids = chunk.batch["input_ids"].long()
        attention_mask = chunk.batch["attention_mask"].long()
        empty = (attention_mask.sum(dim=1) == 0).nonzero().flatten().tolist()
        if empty:
            raise StrategyError(f"hf_infer.generate: prompt rows {empty} of a chunk have no tokens (attention_mask 0)")
        first = int(attention_mask.any(dim=0).int().argmax())
        input_ids, attention_mask = input_ids[:, first:], attention_mask[:, first:]
        if n > 1:
            input_ids = input_ids.repeat_interleave(n, dim=0)
            attention_mask = attention_mask.repeat_interleave(n, dim=0)
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _hf_generation_config(self, config: GenerationConfig, stop_ids: list[int], *, draws: bool) -> Any:
        """``draws``: transformers samples (False: greedy, for greedy configs and for seeded rows, whose token the
        last processor has already chosen)."""
        from transformers import GenerationConfig as HfGenerationConfig

        # The processor chain comes from build_logits_processors, so transformers must build none: neutral values
        # wherever it would (top_k falls back to 50 when unset; warpers only exist when sampling).
        warpers = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if draws else {}
        return HfGenerationConfig(
            max_new_tokens=config.max_new_tokens,
            do_sample=draws,
            **warpers,
            repetition_penalty=1.0,
            num_beams=1,
            num_return_sequences=1,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=stop_ids or None,
            # Only the token ids are needed (log-probs come from the recorder); not returning the KV cache frees it.
            return_dict_in_generate=False,
            use_cache=True,
        )

    def _generate_chunk(self, chunk: DataProto, config: GenerationConfig, seeds: list[int] | None) -> SampledRows:
        from transformers.generation.stopping_criteria import StoppingCriteriaList

        input_ids, attention_mask = self._chunk_prompts(chunk, config.num_return_sequences)
        rows, prompt_length = input_ids.shape
        stop_ids = sorted(set(config.stop_token_ids) | (set() if config.ignore_eos else set(self.stop_token_ids)))
        recorder = RawLogProbRecorder(config.temperature or 1.0) if config.logprobs else None
        pad_lengths = (attention_mask == 0).sum(dim=1)
        stop_strings = (
            ResponseStopStrings(self.tokenizer, config.stop_strings, prompt_length, rows)
            if any(config.stop_strings)
            else None
        )
        sampler = SeededRowSampler(seeds) if seeds is not None else None
        sequences = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=self._hf_generation_config(config, stop_ids, draws=not config.greedy and sampler is None),
            logits_processor=build_logits_processors(config, pad_lengths, recorder, sampler),
            stopping_criteria=StoppingCriteriaList([stop_strings] if stop_strings else []),
        )
        generated = sequences[:, prompt_length:].cpu()
        log_probs = recorder.finish(sequences, prompt_length) if recorder is not None else None
        return cut_responses(
            generated, log_probs, stop_ids, stop_strings.stop_lengths if stop_strings is not None else None
        )

    # --- device memory ----------------------------------------------------------------------------------
    def offload_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        """Move the parameters to host memory (CUDA only; generate() keeps no KV cache between calls)."""
        targets = set(OffloadTarget) if include is None else set(include)
        if self.model is None or self.device.type != "cuda" or OffloadTarget.MODEL_PARAMS not in targets:
            return
        if not self._offloaded:
            self.model.to("cpu")
            self._offloaded = True
            self._targets = None
        torch.cuda.empty_cache()

    def load_states(self, include: Iterable[OffloadTarget] | None = None) -> None:
        targets = set(OffloadTarget) if include is None else set(include)
        if self.model is None or not self._offloaded or OffloadTarget.MODEL_PARAMS not in targets:
            return
        self.model.to(self.device)
        self._offloaded = False
        self._targets = None

    # --- weights in -------------------------------------------------------------------------------------
    def _named_targets(self) -> dict[str, torch.Tensor]:
        """The model's parameters and buffers by name (walking the module tree cost ~0.5 ms per bucket on a GPU)."""
        if self._targets is None:
            # remove_duplicate=False keeps both names of tied tensors (model.embed_tokens.weight and lm_head.weight).
            targets: dict[str, torch.Tensor] = dict(self.model.named_buffers(remove_duplicate=False))
            targets.update(self.model.named_parameters(remove_duplicate=False))
            self._targets = targets
        return self._targets

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the model's parameters/buffers of the same name (cast to their dtype/device)."""
        if self.model is None:
            raise StrategyError("hf_infer: update_weights before initialize(); the model is not loaded")
        targets = self._named_targets()
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = targets.get(name)
                if target is None:
                    known = ", ".join(list(targets)[:5])
                    raise StrategyError(
                        f"hf_infer.update_weights: the model has no parameter or buffer named {name!r} "
                        f"(it has e.g. {known}); send HF names without wrapper prefixes"
                    )
                if tuple(target.shape) != tuple(tensor.shape):
                    raise StrategyError(
                        f"hf_infer.update_weights: {name!r} has shape {tuple(tensor.shape)} but the model's is "
                        f"{tuple(target.shape)}; the sender and this model have different architectures"
                    )
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))

    def weight_share_key(self) -> tuple[str, int] | None:
        """On the CPU, a causal LM whose state dict is its parameters alone can share them (see the base class)."""
        model = self.model
        if model is None or self.device.type != "cpu" or not self.config.share_weights_on_node:
            return None
        if self.model_args.model_kind == "diffusion":
            return None
        names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        if any(name not in names for name in model.state_dict()):
            return None  # a persistent buffer is loaded into each engine's own copy
        return shared_layout(list(model.named_parameters()))

    def share_weights(self, path: str, offset: int, *, fill: bool) -> None:
        if self.weight_share_key() is None:
            raise StrategyError("this hf_infer engine cannot share its weights (see weight_share_key)")
        adopt_shared_weights(list(self.model.named_parameters()), path, offset, fill=fill)
        self._targets = None

    def process_weights_after_loading(self) -> None:
        """Nothing is cached from old weights (no KV cache survives a call); only release freed CUDA memory."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
