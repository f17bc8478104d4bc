"""In-place weight sync for CPU engines whose layers need no post-load processing.

On CPU, vLLM repacks every unquantized linear weight into a oneDNN handler after loading and drops the original
tensor, so a reload must rebuild each layer from scratch (materialize, copy, repack: measured ~10x the cost of
copying the bytes, plus fresh page faults every sync). With :func:`plain_cpu_linears` active while the engine
loads, linear layers keep their weight tensor and run ``torch.nn.functional.linear`` on it; a sync is then the
model's own ``load_weights`` copying each tensor straight into the live parameter (q/k/v and gate/up into their
fused slices), with nothing to redo afterwards; from the second sync on those copies are replayed without
``load_weights`` (``_replay``).

:func:`in_place_ready` checks, per engine, that every layer is in that state (unquantized, plain linear); the
strategy falls back to the layerwise reload of ``_reload`` otherwise. Engines in that state on one node can share
one copy of their weights (:func:`share_layout`, :func:`share_parameters`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from roll.strategies.vllm._replay import ReplayCache
from roll.strategies.weight_sync.shared_weights import adopt_shared_weights, page_align_parameters, shared_layout

__all__ = [
    "align_parameters",
    "in_place_ready",
    "load_in_place",
    "parameter_names",
    "plain_cpu_linears",
    "replay_copy_counts",
    "replay_counts",
    "share_layout",
    "share_parameters",
]

_UNQUANTIZED = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
_REPLAY_ATTR = "_roll_weight_replay"  # the engine worker's ReplayCache


@contextlib.contextmanager
def plain_cpu_linears() -> Iterator[None]:
    """While the engine loads: 2-D unquantized CPU GEMMs run F.linear on the kept weight (no oneDNN packing)."""
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm

    def plain(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2 or getattr(layer, "_cpu_skip_gemm_dispatch", False):
            original(layer, remove_weight)
            return
        setattr(layer, "cpu_linear", torch.nn.functional.linear)  # noqa: B010  # an attribute vLLM reads, not a submodule

    utils.dispatch_cpu_unquantized_gemm = plain
    try:
        yield
    finally:
        utils.dispatch_cpu_unquantized_gemm = original


def in_place_ready(worker: Any) -> list[str]:
    """Why this engine's model cannot take weights in place ([] when it can): the first few offending layers."""
    model = worker.model_runner.get_model()
    reasons = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None:
            continue
        kind = type(method).__name__
        if kind in _UNQUANTIZED:
            weight = getattr(module, "weight", None)
            plain = getattr(module, "cpu_linear", torch.nn.functional.linear) is torch.nn.functional.linear
            if not plain or weight is None or weight.numel() == 0:
                reasons.append(f"{name}: packed CPU GEMM")
        elif "KVCache" not in kind:  # KV-cache scales of attention are not weights a sync sends
            reasons.append(f"{name}: {kind}")
    return reasons[:8]


def align_parameters(worker: Any) -> None:
    """Start every parameter on a page (one private buffer): bucket tensors sit at page offsets that are mostly
    multiples of 1 KiB, and copies into parameters at other offsets fell into the 4K-aliasing band a quarter of
    the time (split into slower ordinary-store pieces, ``weight_sync.memcopy``)."""
    page_align_parameters(list(worker.model_runner.get_model().named_parameters()))


def share_layout(worker: Any) -> tuple[str, int] | None:
    """This engine's :func:`~roll.strategies.weight_sync.shared_weights.shared_layout`."""
    return shared_layout(list(worker.model_runner.get_model().named_parameters()))


def share_parameters(worker: Any, path: str, start: int, fill: bool) -> None:
    """Rebind this engine's parameters to the shared file ``path`` (see ``weight_sync.shared_weights``)."""
    adopt_shared_weights(list(worker.model_runner.get_model().named_parameters()), path, start, fill=fill)


def parameter_names(worker: Any) -> list[str]:
    return [name for name, _ in worker.model_runner.get_model().named_parameters()]


def load_in_place(worker: Any, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> list[str]:
    """Copy one bucket (HF names) into the live parameters; returns the vLLM parameter names it filled.

    The first bucket of each layout goes through the model's ``load_weights``; later ones replay the copies it
    made (see ``_replay``).
    """
    from vllm.config import set_current_vllm_config

    model = worker.model_runner.get_model()

    def load_weights(tensors: Sequence[tuple[str, torch.Tensor]]) -> list[str]:
        with set_current_vllm_config(worker.vllm_config), torch.no_grad():
            return sorted(model.load_weights(iter(tensors)) or ())

    cache = getattr(worker, _REPLAY_ATTR, None)
    if cache is None:
        cache = ReplayCache()
        setattr(worker, _REPLAY_ATTR, cache)
    return cache.load(model, named_tensors, load_weights)


def replay_counts(worker: Any) -> tuple[int, int]:
    """(bucket layouts this engine replays, layouts it loads through ``load_weights`` every time)."""
    cache = getattr(worker, _REPLAY_ATTR, None)
    return (0, 0) if cache is None else cache.counts()


def replay_copy_counts(worker: Any) -> dict[str, int]:
    """How this engine's replayed copies ran so far: ``memmove`` (whole), ``split`` (memmove in pieces, see
    :mod:`roll.strategies.weight_sync.memcopy`), ``torch`` (torch's ``copy_``), and ``bytes`` by memmove."""
    cache = getattr(worker, _REPLAY_ATTR, None)
    if cache is None:
        return {"memmove": 0, "split": 0, "torch": 0, "bytes": 0}
    counts = cache.memmoves
    return {"memmove": counts.whole, "split": counts.split, "torch": cache.torch_copies, "bytes": counts.bytes}
