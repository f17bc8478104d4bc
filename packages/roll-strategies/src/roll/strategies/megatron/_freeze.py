"""``freeze_module_prefix`` on megatron_train: which megatron-core parameters a prefix freezes.

Pure torch (no megatron import). ROLL's megatron path matches prefixes against the megatron-core model's own
parameter names (``embedding.word_embeddings.weight``, ``decoder.layers.3.mlp.linear_fc1.weight``,
``output_layer.weight``); roll matches them on the *global* names (layer numbers of the whole model, where ROLL
sees a pipeline stage's local numbers) and also accepts the HF names the same file would use on fsdp2_train
(``model.embed_tokens``, ``model.layers.3.mlp``): a megatron parameter is then frozen when every HF tensor it is
built from matches. A prefix that covers only part of a fused parameter (``...self_attn.q_proj`` of the fused
``linear_qkv``, ``mlp.gate_proj`` of ``linear_fc1``) cannot be honoured and is an error, as is a prefix that
matches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from roll.runtime import ConfigError
from roll.strategies.freezing import unmatched_prefix_error
from roll.strategies.megatron._mapping import MegatronMapping

__all__ = ["megatron_frozen_names"]


def _by_hf_names(mapping: MegatronMapping, prefix: str) -> set[str]:
    frozen: set[str] = set()
    for spec in mapping.specs:
        hits = [name for name in spec.hf_names if name.startswith(prefix)]
        if not hits:
            continue
        if len(hits) < len(spec.hf_names):
            raise ConfigError(
                f"model_args.freeze_module_prefix: {prefix!r} matches {hits} but megatron fuses them with "
                f"{[n for n in spec.hf_names if n not in hits]} into {spec.megatron_name}, which can only be frozen "
                "whole; widen the prefix to the whole module (e.g. the layer's self_attn or mlp) or use fsdp2_train"
            )
        frozen.add(spec.megatron_name)
    return frozen


def megatron_frozen_names(mapping: MegatronMapping, prefixes: Sequence[str]) -> set[str]:
    """Global megatron names of the parameters ``prefixes`` freeze (megatron-core or HF name form)."""
    megatron_names = [spec.megatron_name for spec in mapping.specs]
    frozen: set[str] = set()
    for prefix in prefixes:
        matched = {name for name in megatron_names if name.startswith(prefix)} | _by_hf_names(mapping, prefix)
        if not matched:
            hf_names = [name for spec in mapping.specs for name in spec.hf_names]
            raise unmatched_prefix_error(prefix, [*megatron_names, *hf_names], form="megatron-core or HF")
        frozen |= matched
    if len(frozen) == len(megatron_names):
        raise ConfigError(
            f"model_args.freeze_module_prefix={list(prefixes)} freezes every parameter; leave some modules out of it"
        )
    return frozen
