"""HF <-> Megatron-core GPT parameter names and tensors for Llama / Qwen2 / Qwen3-style dense models.

Pure torch (no megatron import), so it is tested on any machine. Megatron names are *global* (layer ``i`` is
the model's i-th layer); :func:`to_global_name` / :func:`to_local_name` translate a pipeline stage's local
layer numbers.

Layouts (full, unsharded tensors):

* ``self_attention.linear_qkv`` fuses q/k/v *per query group*: for each of the ``G`` key/value heads, its
  ``H/G`` query heads, then its key head, then its value head (``head_dim`` rows each). This is the order
  megatron's ``SelfAttention.get_query_key_value_tensors`` splits, and it keeps every query group on one TP
  rank. The Qwen2 q/k/v biases are fused the same way.
* ``mlp.linear_fc1`` stacks ``[gate; up]`` (megatron's gated-linear-unit order: ``act(x[:F]) * x[F:]``).
* Embedding and output rows are padded with zeros to ``padded_vocab_size``; export drops the padding.
* Tied embeddings: HF has no ``lm_head.weight``; megatron has ``output_layer.weight`` only on the last pipeline
  stage when ``pp > 1``, loaded from ``model.embed_tokens.weight`` and never exported.

Layer-norm names depend on the layer spec: ``spec="local"`` (megatron-core modules, ``get_gpt_layer_local_spec``)
has ``input_layernorm.weight`` / ``pre_mlp_layernorm.weight``; ``spec="transformer_engine"``
(``get_gpt_layer_with_transformer_engine_spec``) fuses them into ``self_attention.linear_qkv.layer_norm_weight``
/ ``mlp.linear_fc1.layer_norm_weight``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "GptLayout",
    "HfAssembler",
    "MegatronMapping",
    "ParamSpec",
    "Spec",
    "fuse_qkv",
    "split_qkv",
    "to_global_name",
    "to_local_name",
]

Spec = Literal["local", "transformer_engine"]
Kind = Literal["copy", "qkv", "fc1", "vocab"]

EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT_LAYER = "output_layer.weight"
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.")


@dataclass(frozen=True)
class GptLayout:
    """The shapes that decide names and fused layouts of a dense GPT model."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_layernorm: bool = False
    spec: Spec = "local"

    @classmethod
    def from_hf_config(cls, hf_config: Any, *, spec: Spec = "local", padded_vocab_size: int | None = None) -> GptLayout:
        """Read a transformers Llama/Qwen2/Qwen3/Mistral config."""
        heads = hf_config.num_attention_heads
        model_type = getattr(hf_config, "model_type", "")
        return cls(
            num_layers=hf_config.num_hidden_layers,
            hidden_size=hf_config.hidden_size,
            num_attention_heads=heads,
            num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
            ffn_hidden_size=hf_config.intermediate_size,
            vocab_size=hf_config.vocab_size,
            padded_vocab_size=padded_vocab_size or hf_config.vocab_size,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama-style configs say so with attention_bias.
            qkv_bias=model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
            qk_layernorm=model_type == "qwen3",
            spec=spec,
        )

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups


@dataclass(frozen=True)
class ParamSpec:
    """One Megatron parameter: its HF sources, how they combine, and its tensor-parallel split dimension."""

    megatron_name: str
    hf_names: tuple[str, ...]
    kind: Kind
    tp_dim: int | None
    exported: bool = True


# --- fused layouts -------------------------------------------------------------------------------------------
def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GptLayout) -> torch.Tensor:
    """HF q/k/v projections (weights ``(n*d, hidden)`` or biases ``(n*d,)``) -> megatron's grouped linear_qkv."""
    groups, per_group, d = layout.num_query_groups, layout.heads_per_group, layout.head_dim
    rest = q.shape[1:]
    fused = torch.cat(
        [q.reshape(groups, per_group * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)], dim=1
    )
    return fused.reshape(groups * (per_group + 2) * d, *rest)


def split_qkv(fused: torch.Tensor, layout: GptLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv`. Also splits a TP shard if ``layout`` describes that shard's groups."""
    per_group, d = layout.heads_per_group, layout.head_dim
    rest = fused.shape[1:]
    grouped = fused.reshape(-1, (per_group + 2) * d, *rest)
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        raise ValueError(f"vocabulary tensor has {tensor.shape[0]} rows, more than the padded size {rows}")
    padding = tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])
    return torch.cat([tensor, padding], dim=0)


# --- layer numbering ----------------------------------------------------------------------------------------
def to_global_name(local_name: str, layer_numbers: Sequence[int]) -> str:
    """``decoder.layers.{j}.x`` of a model chunk -> global name; ``layer_numbers[j]`` is layer j's global index."""
    match = _LAYER_RE.match(local_name)
    if match is None:
        return local_name
    return f"decoder.layers.{layer_numbers[int(match.group(1))]}.{local_name[match.end() :]}"


def to_local_name(global_name: str, layer_numbers: Sequence[int]) -> str | None:
    """Inverse of :func:`to_global_name`; None if the layer is not in this chunk."""
    match = _LAYER_RE.match(global_name)
    if match is None:
        return global_name
    try:
        local = list(layer_numbers).index(int(match.group(1)))
    except ValueError:
        return None
    return f"decoder.layers.{local}.{global_name[match.end() :]}"


# --- the mapping --------------------------------------------------------------------------------------------
def _layer_specs(layout: GptLayout, i: int) -> list[ParamSpec]:
    mg, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
    attn = f"{hf}self_attn."
    te = layout.spec == "transformer_engine"
    input_norm = "self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"
    qkv = tuple(f"{attn}{p}_proj.weight" for p in "qkv")
    specs = [
        ParamSpec(mg + input_norm, (hf + "input_layernorm.weight",), "copy", None),
        ParamSpec(mg + "self_attention.linear_qkv.weight", qkv, "qkv", 0),
    ]
    if layout.qkv_bias:
        bias = tuple(f"{attn}{p}_proj.bias" for p in "qkv")
        specs.append(ParamSpec(mg + "self_attention.linear_qkv.bias", bias, "qkv", 0))
    if layout.qk_layernorm:
        specs.append(ParamSpec(mg + "self_attention.q_layernorm.weight", (attn + "q_norm.weight",), "copy", None))
        specs.append(ParamSpec(mg + "self_attention.k_layernorm.weight", (attn + "k_norm.weight",), "copy", None))
    fc1 = (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight")
    specs += [
        ParamSpec(mg + "self_attention.linear_proj.weight", (attn + "o_proj.weight",), "copy", 1),
        ParamSpec(mg + mlp_norm, (hf + "post_attention_layernorm.weight",), "copy", None),
        ParamSpec(mg + "mlp.linear_fc1.weight", fc1, "fc1", 0),
        ParamSpec(mg + "mlp.linear_fc2.weight", (hf + "mlp.down_proj.weight",), "copy", 1),
    ]
    return specs


class MegatronMapping:
    """Every parameter of a Megatron GPTModel for ``layout`` (canonical order) and its HF conversion."""

    def __init__(self, layout: GptLayout) -> None:
        self.layout = layout
        embed = "model.embed_tokens.weight"
        specs = [ParamSpec(EMBEDDING, (embed,), "vocab", 0)]
        for i in range(layout.num_layers):
            specs += _layer_specs(layout, i)
        specs.append(ParamSpec(FINAL_NORM, ("model.norm.weight",), "copy", None))
        tied = layout.tie_word_embeddings
        specs.append(ParamSpec(OUTPUT_LAYER, (embed if tied else "lm_head.weight",), "vocab", 0, exported=not tied))
        self.specs: list[ParamSpec] = specs
        self._by_name = {s.megatron_name: s for s in specs}
        self._consumers: dict[str, list[str]] = {}
        for s in specs:
            for hf_name in s.hf_names:
                self._consumers.setdefault(hf_name, []).append(s.megatron_name)

    def __contains__(self, megatron_name: object) -> bool:
        return megatron_name in self._by_name

    def spec(self, megatron_name: str) -> ParamSpec:
        try:
            return self._by_name[megatron_name]
        except KeyError:
            raise KeyError(f"{megatron_name!r} is not a parameter of this GPT layout") from None

    def consumers(self, hf_name: str) -> list[str]:
        """Megatron parameters built from ``hf_name`` (empty for names the model does not use)."""
        return self._consumers.get(hf_name, [])

    @property
    def hf_names(self) -> list[str]:
        """Every HF tensor a full model state dict has, in canonical order."""
        names: list[str] = []
        for s in self.specs:
            if s.exported:
                names.extend(s.hf_names)
        return names

    def to_megatron(self, megatron_name: str, get_hf: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """The full megatron tensor of ``megatron_name``, reading its HF sources with ``get_hf``."""
        s = self.spec(megatron_name)
        sources = [get_hf(name) for name in s.hf_names]
        if s.kind == "qkv":
            q, k, v = sources
            return fuse_qkv(q, k, v, self.layout)
        if s.kind == "fc1":
            return torch.cat(sources, dim=0)
        if s.kind == "vocab":
            return _pad_rows(sources[0], self.layout.padded_vocab_size)
        return sources[0]

    def to_hf(self, megatron_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """HF (name, tensor) pairs of a full megatron tensor; empty for a tied output layer."""
        s = self.spec(megatron_name)
        if not s.exported:
            return []
        if s.kind == "qkv":
            return list(zip(s.hf_names, split_qkv(tensor, self.layout)))
        if s.kind == "fc1":
            return list(zip(s.hf_names, torch.chunk(tensor, 2, dim=0)))
        if s.kind == "vocab":
            return [(s.hf_names[0], tensor[: self.layout.vocab_size])]
        return [(s.hf_names[0], tensor)]

    def hf_to_megatron(self, hf_state: Mapping[str, torch.Tensor], names: Iterable[str] | None = None):
        """Full megatron tensors (dict) for ``names`` (default: every parameter) from an HF state dict."""
        wanted = [s.megatron_name for s in self.specs] if names is None else list(names)
        return {name: self.to_megatron(name, hf_state.__getitem__) for name in wanted}

    def megatron_to_hf(self, megatron_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """An HF state dict from full megatron tensors (names not in the layout are rejected)."""
        out: dict[str, torch.Tensor] = {}
        for name, tensor in megatron_state.items():
            out.update(self.to_hf(name, tensor))
        return out


class HfAssembler:
    """Builds megatron tensors from HF tensors that arrive in any order (weight-sync buckets).

    :meth:`add` keeps each HF tensor until every megatron parameter that uses it is complete, and returns the
    parameters completed by this tensor. HF names the model does not use are reported by :meth:`add` as
    ignored (returned in ``unknown``) so callers can warn once.
    """

    def __init__(self, mapping: MegatronMapping, wanted: Iterable[str] | None = None) -> None:
        self.mapping = mapping
        self.wanted = None if wanted is None else set(wanted)
        self._held: dict[str, torch.Tensor] = {}
        self._borrowed: set[str] = set()  # held tensors that are still the caller's memory
        self._done: set[str] = set()
        self.unknown: list[str] = []

    def add(self, hf_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        consumers = self.mapping.consumers(hf_name)
        if not consumers:
            self.unknown.append(hf_name)
            return []
        if not self._wanted(consumers):
            return []  # used by the model, but by no parameter of this rank (another pipeline stage)
        self._held[hf_name] = tensor
        self._borrowed.add(hf_name)
        ready = []
        for name in self._wanted(consumers):
            sources = self.mapping.spec(name).hf_names
            if all(source in self._held for source in sources):
                ready.append((name, self.mapping.to_megatron(name, self._held.__getitem__)))
                self._done.add(name)
        self._release(hf_name)
        return ready

    def _wanted(self, names: list[str]) -> list[str]:
        return names if self.wanted is None else [n for n in names if n in self.wanted]

    def _release(self, hf_name: str) -> None:
        # A tensor is dropped once all of its (wanted) consumers were built; then the bucket can be freed.
        for source in {s for name in self.mapping.consumers(hf_name) for s in self.mapping.spec(name).hf_names}:
            if source in self._held and all(n in self._done for n in self._wanted(self.mapping.consumers(source))):
                del self._held[source]

    @property
    def pending(self) -> list[str]:
        """HF names held while waiting for the other parts of a fused parameter."""
        return sorted(self._held)

    def own_pending(self) -> int:
        """Replace the held tensors by copies: a weight-sync bucket's memory is reused once the bucket is loaded.
        Returns how many were copied (those added since the last call)."""
        fresh = self._borrowed & self._held.keys()
        for name in fresh:
            self._held[name] = self._held[name].clone()
        self._borrowed.clear()
        return len(fresh)

    def reset(self) -> None:
        """Start a new sync (completed parameters may arrive again)."""
        self._held.clear()
        self._borrowed.clear()
        self._done.clear()
        self.unknown.clear()
