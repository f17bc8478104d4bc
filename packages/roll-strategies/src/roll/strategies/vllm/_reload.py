"""In-place weight reload, streamed bucket by bucket: functions run inside vLLM's workers via collective_rpc.

vLLM's own ``reload_weights`` treats each call as a complete reload: a layer that receives only part of its
checkpoint tensors in one call (e.g. ``q_proj`` without ``k_proj``/``v_proj``, both feeding the fused
``qkv_proj``) is finalized with uninitialized memory in the missing part (measured: the model then emits
token 0 only). Weight sync delivers buckets that cut through layers, so a sync is one reload spread over
several calls instead: :func:`begin_reload` once, :func:`load_bucket` per bucket, :func:`finish_reload` once.
vLLM buffers each layer's tensors until the layer is complete, then re-runs its post-load processing (CPU
weight repacking, quantization), so no extra copy of the model is held.

vLLM versions without the layerwise reload machinery fall back to calling ``model.load_weights`` per bucket,
which is right for unquantized models whose layers keep no processed copy of their weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["abort_reload", "begin_reload", "finish_reload", "load_bucket", "reset_after_reload", "with_tied_lm_head"]


def _layerwise() -> Any:
    try:
        from vllm.model_executor.model_loader import reload
    except ImportError:
        return None
    return reload if hasattr(reload, "initialize_layerwise_reload") else None


class _BufferOnlyLayers(logging.Filter):
    """vLLM warns 'Failed to load weights' for layers whose only tensors are computed buffers (rotary caches):
    a checkpoint never holds those, and vLLM keeps the existing ones, so the warning is noise on every sync."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("RotaryEmbedding: Failed to load weights")


def _quiet_buffer_warnings() -> None:
    target = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _BufferOnlyLayers) for f in target.filters):
        target.addFilter(_BufferOnlyLayers())


def begin_reload(worker: Any) -> list[str]:
    """Prepare every layer to receive new weights; returns the model's parameter names (for a completeness check)."""
    from vllm.config import set_current_vllm_config

    model = worker.model_runner.get_model()
    _quiet_buffer_warnings()
    reload = _layerwise()
    if reload is not None:
        with set_current_vllm_config(worker.vllm_config):
            reload.initialize_layerwise_reload(model)
    return [name for name, _ in model.named_parameters()]


def _pending_layers(model: torch.nn.Module) -> Iterator[Any]:
    """Reload infos of the layers that buffered tensors and wait for the rest of their weights."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        return
    for module in model.modules():
        info = LAYERWISE_INFO.get(module)
        if info is not None and info.loaded_weights:
            yield info


def _storage(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # meta or subclass tensors
        return 0


def _own_buffered(model: torch.nn.Module, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> int:
    """Copy the bucket's tensors that incomplete layers keep for later: the bucket's memory is reused after the
    call (weight sync hands out views of a shared slot). Returns how many were copied."""
    storages = {_storage(tensor) for _, tensor in named_tensors} - {0}
    copied = 0
    for info in _pending_layers(model):
        for _, bound in info.loaded_weights:
            for key, value in bound.arguments.items():
                if isinstance(value, torch.Tensor) and _storage(value) in storages:
                    bound.arguments[key] = value.clone()
                    copied += 1
    return copied


def load_bucket(worker: Any, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> list[str]:
    """Feed one bucket (HF names) to the model's loader; returns the vLLM parameter names it filled.

    The tensors may be views of memory that is overwritten once this returns; what the layerwise loader keeps
    for incomplete layers is copied first.
    """
    from vllm.config import set_current_vllm_config

    model = worker.model_runner.get_model()
    with set_current_vllm_config(worker.vllm_config), torch.no_grad():
        loaded = model.load_weights(iter(named_tensors))
        _own_buffered(model, named_tensors)
    return sorted(loaded or ())


def abort_reload(worker: Any) -> int:
    """Forget the tensors buffered by a sync that stopped midway, so the next sync starts every layer over.

    Layers that were completed stay as loaded; incomplete ones keep waiting for their weights (their old values
    are still saved), so the next ``begin_reload`` + full sync restores a consistent model. Returns how many
    layers were reset.
    """
    model = worker.model_runner.get_model()
    reset = 0
    for info in _pending_layers(model):
        info.loaded_weights = []
        info.load_numel = 0
        reset += 1
    return reset


def finish_reload(worker: Any) -> None:
    """Process the layers still waiting (attention, partly loaded ones) and drop caches built on old weights."""
    from vllm.config import set_current_vllm_config

    runner = worker.model_runner
    reload = _layerwise()
    if reload is not None:
        with set_current_vllm_config(worker.vllm_config):
            reload.finalize_layerwise_reload(runner.get_model(), worker.vllm_config.model_config)
    reset_after_reload(worker)


def reset_after_reload(worker: Any) -> None:
    """The resets vLLM's reload_weights does after loading (LoRA state, encoder and multimodal caches)."""
    runner = worker.model_runner
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
        method = getattr(runner, reset, None)
        if method is not None:
            method()


def with_tied_lm_head(named_tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Feed ``lm_head.weight`` in the same bucket as the input embedding it is tied to, and only there.

    With tied embeddings vLLM's ``lm_head`` layer shares the embedding's parameter but is reloaded as a layer of
    its own: it keeps its old processed weights (e.g. the CPU GEMM's packed copy) unless it is fed too. Trainers
    usually send the embedding only (``named_parameters`` lists a tied tensor once), so the head is added next to
    it. A trainer that sends the head as well may put it in another bucket (fsdp2's ``named_weights`` lists it
    last); vLLM's loader rejects such a bucket ("'lm_head.weight' was skipped because it is tied to
    'model.embed_tokens.weight' ... not found in the checkpoint"), so a head without its embedding is dropped:
    the embedding's own bucket feeds it.
    """
    # HF names the input embedding "<prefix>embed_tokens.weight" in Llama-style models (Qwen, Mistral, ...).
    embedding = next((tensor for name, tensor in named_tensors if name.endswith("embed_tokens.weight")), None)
    if embedding is None:
        return [(name, tensor) for name, tensor in named_tensors if name != "lm_head.weight"]
    if any(name == "lm_head.weight" for name, _ in named_tensors):
        return named_tensors
    return [*named_tensors, ("lm_head.weight", embedding)]
