"""Build tiny random-init causal LMs with a locally trained BPE tokenizer.

Everything is deterministic from the seed, so tests and recipes on different machines build the same model.
Head dim defaults to 64 because vLLM's CPU attention kernels accept it (16 is rejected). Digits are split
into single tokens, which makes arithmetic tasks learnable by very small models.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# ChatML. Tools (``apply_chat_template(..., tools=...)``) go in a system turn of their own, one JSON schema a line, and an
# assistant's ``tool_calls`` follow its content as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, as
# roll's parsers read them and its tool envs write them, so an agent-native episode on a tiny model shows the model its
# earlier calls as it wrote them. A message without content (None) prints nothing; messages without tools or calls
# render as plain ChatML.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is not none %}{{ message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    '<tool_call>{"name": {{ fn[\'name\'] | tojson }}, "arguments": '
    "{% if fn['arguments'] is string %}{{ fn['arguments'] }}{% else %}{{ fn['arguments'] | tojson }}{% endif %}"
    "}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

# Named sizes; "small" is ~20M parameters (used by the throughput benchmark).
TINY_PRESETS: dict[str, dict[str, int]] = {
    "nano": {
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 1,
        "intermediate_size": 256,
        "vocab_size": 512,
    },
    "micro": {
        "hidden_size": 256,
        "num_layers": 4,
        "num_heads": 4,
        "num_kv_heads": 2,
        "intermediate_size": 768,
        "vocab_size": 1024,
    },
    "small": {
        "hidden_size": 512,
        "num_layers": 6,
        "num_heads": 8,
        "num_kv_heads": 4,
        "intermediate_size": 1536,
        "vocab_size": 4096,
    },
}

_WORDS = [
    "the",
    "a",
    "an",
    "is",
    "are",
    "was",
    "what",
    "how",
    "many",
    "which",
    "number",
    "answer",
    "question",
    "sum",
    "total",
    "plus",
    "minus",
    "times",
    "add",
    "subtract",
    "result",
    "equals",
    "value",
    "reward",
    "policy",
    "model",
    "token",
    "worker",
    "cluster",
    "batch",
    "step",
    "train",
    "infer",
    "think",
    "solve",
    "please",
    "yes",
    "no",
    "true",
    "false",
    "first",
    "second",
    "third",
    "compute",
    "final",
    "box",
    "boxed",
    "so",
    "therefore",
    "because",
]


def default_corpus(seed: int = 0, size: int = 4000) -> list[str]:
    """Arithmetic Q&A, chat turns and English filler: enough for a useful tiny tokenizer."""
    rng = random.Random(seed)
    texts = []
    for _ in range(size):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        texts.append(f"What is {a} {op} {b}? The answer is \\boxed{{{value}}}.")
        texts.append(" ".join(rng.choices(_WORDS, k=rng.randint(4, 16))))
    texts.append("".join(chr(c) for c in range(32, 127)))
    return texts


def make_tokenizer(corpus: Iterable[str], vocab_size: int):
    """A byte-level BPE tokenizer (digits split) with ChatML special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(corpus), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token=None, unk_token=None
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def make_tiny_causal_lm(
    path: str | Path,
    *,
    preset: str = "nano",
    arch: str = "qwen2",
    head_dim: int = 64,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    overrides: dict[str, int] | None = None,
) -> Path:
    """Write a random-init causal LM and its tokenizer to ``path`` (HF format) and return the path.

    Idempotent: if ``path`` already holds a model built with the same settings, it is reused.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if preset not in TINY_PRESETS:
        raise ValueError(f"unknown tiny preset {preset!r}; choose one of {sorted(TINY_PRESETS)}")
    architectures = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    if arch not in architectures:
        raise ValueError(f"unknown tiny arch {arch!r}; choose one of {sorted(architectures)}")
    sizes = {**TINY_PRESETS[preset], **(overrides or {})}
    texts = list(corpus) if corpus is not None else default_corpus(seed)
    settings = {
        "sizes": sizes,
        "arch": arch,
        "head_dim": head_dim,
        "max_pos": max_position_embeddings,
        "tie": tie_word_embeddings,
        "seed": seed,
        "corpus": hashlib.sha256("\n".join(texts).encode()).hexdigest(),
        "chat_template": hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()[:16],
    }
    path = Path(path)
    stamp = path / "roll_tiny.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("fingerprint") == _fingerprint(settings):
        return path
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = make_tokenizer(texts, sizes["vocab_size"])
    config_cls, model_cls = architectures[arch]
    config = config_cls(
        vocab_size=sizes["vocab_size"],
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_layers"],
        num_attention_heads=sizes["num_heads"],
        num_key_value_heads=sizes["num_kv_heads"],
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = model_cls(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    num_params = sum(p.numel() for p in model.parameters())
    stamp.write_text(
        json.dumps({"fingerprint": _fingerprint(settings), "num_parameters": num_params, **settings}, indent=1)
    )
    return path


def spread_weights(model: Path | str, out: Path | str, *, scale: float = 0.15, seed: int = 0) -> Path:
    """Write ``model`` with Gaussian noise (std ``scale``, seeded) added to its matrices to ``out`` and return it.

    A fresh tiny init predicts a near-uniform distribution and repeats one token greedily; spread weights give the
    peaked, varied distributions that sampling tests and benchmarks need. The tokenizer is copied alongside.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    network = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in network.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=generator) * scale)
    out = Path(out)
    network.save_pretrained(out)
    AutoTokenizer.from_pretrained(model).save_pretrained(out)
    return out
