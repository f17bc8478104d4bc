"""hf_infer on a tiny CPU model: generation against hand-rolled references, stops, forward, weight updates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies import (
    GenerationConfig,
    ModelArgs,
    StrategyArgs,
    StrategyError,
    StrategyWorker,
    StrategyWorkerConfig,
    validate_strategy_config,
)
from roll.strategies.generation import SAMPLING_SEED_KEY
from roll.strategies.hf._loading import choose_dtype
from roll.strategies.hf.config import HfInferConfig
from roll.strategies.ops import log_probs_from_logits, response_logits
from roll.strategies.testing import spread_weights

PROMPTS = ["What is 12 + 7?", "the answer", "policy model token worker batch step"]


@pytest.fixture(scope="module")
def peaked_model(tiny_model: Path, tmp_path_factory) -> Path:
    """The tiny model with its weights spread out: a fresh init is nearly uniform and repeats one token."""
    return spread_weights(tiny_model, tmp_path_factory.mktemp("hf_infer") / "peaked")


def make_strategy(path: Path | str | None, *, infer_batch_size: int = 8, **strategy_config):
    config = StrategyWorkerConfig(
        name="hf",
        model_args=ModelArgs(model_name_or_path=None if path is None else str(path), dtype="float32"),
        infer_batch_size=infer_batch_size,
        strategy_args=StrategyArgs(strategy_name="hf_infer", strategy_config=strategy_config),
    )
    worker = StrategyWorker(config)
    worker.initialize()
    return worker.strategy


@pytest.fixture(scope="module")
def strategy(peaked_model: Path):
    return make_strategy(peaked_model)


@pytest.fixture(scope="module")
def reference(peaked_model: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(peaked_model, dtype=torch.float32).eval()


def prompt_batch(tokenizer, texts: list[str]) -> DataProto:
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    return DataProto.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}, {"text": list(texts)}
    )


@torch.no_grad()
def hand_rolled_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Argmax over the last position's logits, re-running the whole sequence each step (no cache, no padding)."""
    ids = torch.tensor([prompt])
    tokens, log_probs = [], []
    for _ in range(steps):
        logits = model(ids).logits[0, -1].float()
        token = int(logits.argmax())
        tokens.append(token)
        log_probs.append(float(torch.log_softmax(logits, dim=-1)[token]))
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokens, log_probs


def response_lists(out: DataProto) -> list[list[int]]:
    return [row[mask.bool()].tolist() for row, mask in zip(out["responses"], out["response_mask"])]


def test_greedy_equals_hand_rolled_loop_with_and_without_padding(strategy, reference):
    config = GenerationConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    batch = prompt_batch(strategy.tokenizer, PROMPTS)
    out = strategy.generate(batch, config)
    assert out["prompts"].shape == batch["input_ids"].shape and out["responses"].shape == (3, 6)
    assert out["text"].tolist() == PROMPTS
    assert out["finish_reason"].tolist() == ["length"] * 3
    for row, text in enumerate(PROMPTS):
        prompt = strategy.tokenizer(text)["input_ids"]
        expected, expected_lps = hand_rolled_greedy(reference, prompt, 6)
        assert response_lists(out)[row] == expected
        # Greedy log-probs are reported at temperature 1.
        torch.testing.assert_close(out["rollout_log_probs"][row], torch.tensor(expected_lps), atol=1e-4, rtol=0)
        alone = strategy.generate(prompt_batch(strategy.tokenizer, [text]), config)
        assert response_lists(alone)[0] == expected
    assert len({tuple(r) for r in response_lists(out)}) == 3  # the prompts lead to different answers


def test_seeded_sampling_is_reproducible_and_samples_differ(strategy):
    batch = prompt_batch(strategy.tokenizer, PROMPTS[:2])
    config = GenerationConfig(max_new_tokens=5, temperature=1.0, num_return_sequences=3, seed=7)
    rng_before = torch.random.get_rng_state()
    first = strategy.generate(batch, config)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the seed does not leak into the process RNG
    second = strategy.generate(batch, config)
    assert torch.equal(first["responses"], second["responses"])
    assert torch.equal(first["rollout_log_probs"], second["rollout_log_probs"])
    assert first["text"].tolist() == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    rows = [tuple(r) for r in response_lists(first)]
    assert len(set(rows[:3])) > 1 and len(set(rows[3:])) > 1
    other = strategy.generate(batch, config.model_copy(update={"seed": 8}))
    assert not torch.equal(first["responses"], other["responses"])


def seeded_batch(tokenizer, texts: list[str], seeds: list[int]) -> DataProto:
    batch = prompt_batch(tokenizer, texts)
    batch.batch[SAMPLING_SEED_KEY] = torch.tensor(seeds)
    return batch


@pytest.mark.parametrize("options", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 20, "top_p": 0.9}])
def test_seeded_rows_sample_the_same_tokens_in_any_batch_and_order(peaked_model, strategy, options):
    config = GenerationConfig(max_new_tokens=8, num_return_sequences=2, ignore_eos=True, **options)
    seeds = [101, 202, 303]
    rng_before = torch.random.get_rng_state()
    together = strategy.generate(seeded_batch(strategy.tokenizer, PROMPTS, seeds), config)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # every draw came from the rows' own generators
    order = [2, 0, 1]
    reordered = strategy.generate(
        seeded_batch(strategy.tokenizer, [PROMPTS[i] for i in order], [seeds[i] for i in order]), config
    )
    one_at_a_time = make_strategy(peaked_model, generate_batch_size=1)  # chunks of one row: no padding at all
    chunked = one_at_a_time.generate(seeded_batch(strategy.tokenizer, PROMPTS, seeds), config)
    for row, text in enumerate(PROMPTS):
        alone = strategy.generate(seeded_batch(strategy.tokenizer, [text], [seeds[row]]), config)
        for j in range(2):
            runs = [(together, 2 * row + j), (reordered, 2 * order.index(row) + j), (chunked, 2 * row + j)]
            for out, at in runs:
                assert response_lists(out)[at] == response_lists(alone)[j]
                torch.testing.assert_close(
                    out["rollout_log_probs"][at], alone["rollout_log_probs"][j], atol=1e-5, rtol=0
                )
    rows = response_lists(together)
    assert all(rows[2 * i] != rows[2 * i + 1] for i in range(3))  # seed and seed + 1: a prompt's samples differ
    other = strategy.generate(seeded_batch(strategy.tokenizer, PROMPTS, [s + 1000 for s in seeds]), config)
    assert all(a != b for a, b in zip(response_lists(other), rows))


def test_seeded_row_sampler_draws_from_each_rows_distribution_with_its_own_stream():
    from roll.strategies.hf._sampling import SeededRowSampler

    probs = torch.tensor([0.5, 0.0, 0.3, 0.2])
    rows = 4000
    out = SeededRowSampler(range(rows))(torch.zeros((rows, 1), dtype=torch.long), probs.log().expand(rows, -1))
    drawn = out.argmax(dim=-1)
    assert bool((out.isinf().sum(dim=-1) == 3).all()) and bool((out.max(dim=-1).values == 0).all())  # one-hot
    frequencies = torch.bincount(drawn, minlength=4) / rows
    assert frequencies[1] == 0  # a token without probability is never drawn
    torch.testing.assert_close(frequencies, probs, atol=0.03, rtol=0)
    # A row's draws depend on its seed alone: seed 7 draws the same sequence in row 0 of one batch and row 2 of another.
    uniform = torch.zeros((3, 50))
    alone, batched = SeededRowSampler([7]), SeededRowSampler([9, 8, 7])
    steps = [(alone(None, uniform[:1]).argmax(-1), batched(None, uniform).argmax(-1)) for _ in range(20)]
    assert [int(a[0]) for a, _ in steps] == [int(b[2]) for _, b in steps]
    assert len({int(a[0]) for a, _ in steps}) > 5


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.3, "top_k": 20, "min_p": 0.02, "repetition_penalty": 1.3},
    ],
)
@pytest.mark.parametrize("row_seeds", [None, [5, 6, 7]], ids=["batch_seed", "row_seeds"])
def test_rollout_log_probs_equal_a_forward_pass_at_the_sampling_temperature(strategy, reference, options, row_seeds):
    # Seeded rows are drawn by the last processor: the recorder still sees the raw distribution.
    batch = (
        prompt_batch(strategy.tokenizer, PROMPTS)
        if row_seeds is None
        else seeded_batch(strategy.tokenizer, PROMPTS, row_seeds)
    )
    config = GenerationConfig(max_new_tokens=6, num_return_sequences=2, seed=3, **options)
    out = strategy.generate(batch, config)
    with torch.no_grad():
        logits = reference(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits
    expected = log_probs_from_logits(response_logits(logits, 6), out["responses"], options["temperature"])
    mask = out["response_mask"].bool()
    assert mask.sum() > 0
    torch.testing.assert_close(out["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=0)
    assert out["rollout_log_probs"][~mask].abs().sum() == 0


def greedy_tokens(strategy, text: str, steps: int) -> list[int]:
    config = GenerationConfig(max_new_tokens=steps, temperature=0.0, ignore_eos=True)
    return response_lists(strategy.generate(prompt_batch(strategy.tokenizer, [text]), config))[0]


def test_stop_token_ids_cut_the_response_after_the_stop_token(strategy):
    text = PROMPTS[1]
    tokens = greedy_tokens(strategy, text, 6)
    stop = tokens[3]
    cut = tokens.index(stop) + 1
    config = GenerationConfig(max_new_tokens=6, temperature=0.0, stop_token_ids=[stop])
    out = strategy.generate(prompt_batch(strategy.tokenizer, [text]), config)
    assert response_lists(out)[0] == tokens[:cut]
    assert out["finish_reason"].tolist() == ["stop"]
    assert out["responses"][0, cut:].eq(strategy.tokenizer.pad_token_id).all()
    assert out["rollout_log_probs"][0, cut:].abs().sum() == 0


def test_eos_stops_generation_unless_ignored(strategy, monkeypatch):
    text = PROMPTS[2]
    tokens = greedy_tokens(strategy, text, 5)
    monkeypatch.setattr(strategy, "stop_token_ids", [tokens[1]])  # pretend the model's EOS is that token
    batch = prompt_batch(strategy.tokenizer, [text])
    stopped = strategy.generate(batch, GenerationConfig(max_new_tokens=5, temperature=0.0))
    assert response_lists(stopped)[0] == tokens[: tokens.index(tokens[1]) + 1]
    assert stopped["finish_reason"].tolist() == ["stop"]
    ignored = strategy.generate(batch, GenerationConfig(max_new_tokens=5, temperature=0.0, ignore_eos=True))
    assert response_lists(ignored)[0] == tokens
    assert ignored["finish_reason"].tolist() == ["length"]


def test_stop_strings_cut_at_the_token_completing_them_and_ignore_the_prompt(strategy):
    text = PROMPTS[0]
    tokens = greedy_tokens(strategy, text, 6)
    decode = strategy.tokenizer.decode
    stop = decode(tokens[2:4])
    assert stop.strip()
    cut = next(k for k in range(1, 7) if stop in decode(tokens[:k]))
    # "What is" occurs in the prompt only: it must not stop anything.
    config = GenerationConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True, stop_strings=["What is", stop])
    out = strategy.generate(prompt_batch(strategy.tokenizer, [text]), config)
    assert response_lists(out)[0] == tokens[:cut]
    assert out["finish_reason"].tolist() == ["stop"]


def test_max_new_tokens_is_respected_with_finish_reason_length(strategy):
    config = GenerationConfig(max_new_tokens=3, temperature=1.0, num_return_sequences=2, seed=0, ignore_eos=True)
    out = strategy.generate(prompt_batch(strategy.tokenizer, PROMPTS), config)
    assert out["responses"].shape == (6, 3)
    assert out["response_mask"].sum(-1).tolist() == [3] * 6
    assert out["finish_reason"].tolist() == ["length"] * 6


def test_forward_step_micro_batches_match_one_batch(strategy, reference, monkeypatch):
    batch = prompt_batch(strategy.tokenizer, PROMPTS)
    sizes: list[int] = []

    def forward_func(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        assert logits.dtype == torch.float32 and logits.shape[:2] == micro["input_ids"].shape
        sizes.append(len(micro))
        labels = micro["input_ids"][:, 1:]
        return {"log_probs": log_probs_from_logits(logits[:, :-1], labels), "last": logits[:, -1]}

    whole = strategy.forward_step(batch, forward_func)
    monkeypatch.setattr(strategy.worker_config, "infer_batch_size", 1)
    split = strategy.forward_step(batch, forward_func)
    assert sizes == [3, 1, 1, 1]
    for key in ("log_probs", "last"):
        torch.testing.assert_close(split[key], whole[key], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        mask = batch["attention_mask"]
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = reference(input_ids=batch["input_ids"], attention_mask=mask, position_ids=position_ids).logits
    torch.testing.assert_close(whole["last"], logits[:, -1], atol=1e-5, rtol=1e-5)


def test_update_weights_matches_a_reference_with_the_same_weights(peaked_model):
    from transformers import AutoModelForCausalLM

    strategy = make_strategy(peaked_model)
    target = AutoModelForCausalLM.from_pretrained(peaked_model, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in target.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    batch = prompt_batch(strategy.tokenizer, PROMPTS)
    grab = lambda micro, logits: {"logits": logits}  # noqa: E731
    before = strategy.forward_step(batch, grab)["logits"]
    # named_parameters() lists tied embeddings once, as model.embed_tokens.weight.
    strategy.update_weights((name, p.detach().clone()) for name, p in target.named_parameters())
    strategy.process_weights_after_loading()
    after = strategy.forward_step(batch, grab)["logits"]
    with torch.no_grad():
        expected = target(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=(batch["attention_mask"].cumsum(-1) - 1).clamp(min=0),
        ).logits
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(after[mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(before[mask], after[mask], atol=1e-3)

    # The tied output head under its own name updates the shared tensor, with a dtype cast.
    head = torch.randn(target.lm_head.weight.shape, generator=generator).to(torch.bfloat16)
    strategy.update_weights([("lm_head.weight", head)])
    assert torch.equal(strategy.model.get_input_embeddings().weight, head.float())

    with pytest.raises(StrategyError, match=r"no parameter or buffer named 'decoder\.bogus'.*model\."):
        strategy.update_weights([("decoder.bogus", torch.zeros(1))])
    with pytest.raises(StrategyError, match="shape"):
        strategy.update_weights([("lm_head.weight", torch.zeros(2, 2))])


def test_missing_model_path_names_the_field(tmp_path):
    for path in (None, tmp_path / "nowhere"):
        with pytest.raises(ConfigError, match=r"model_args\.model_name_or_path"):
            make_strategy(path)


def test_flash_attention_without_its_package_names_the_field_before_loading(tiny_model, monkeypatch):
    """hf_infer and fsdp2 load with transformers, which refused ``flash_attention_2`` without flash-attn deep in
    ``from_pretrained`` (an ImportError); the error now names the setting and the fix."""
    from roll.strategies import check_attention_installed, registry
    from roll.strategies.fsdp2 import _model as fsdp2_model
    from roll.strategies.hf._loading import load_model

    monkeypatch.setattr(registry, "_module_installed", lambda name: False)
    args = ModelArgs(model_name_or_path=str(tiny_model), dtype="float32", attn_implementation="flash_attention_2")
    fix = r"model_args\.attn_implementation='flash_attention_2' needs the 'flash_attn' module .* or set model_args\."
    with pytest.raises(ConfigError, match=fix):
        load_model(args, torch.float32, torch.device("cpu"))
    with pytest.raises(ConfigError, match=fix):
        fsdp2_model.load_model(args, torch.float32, train=True)
    with pytest.raises(ConfigError, match="'flash_attention_3' needs the 'flash_attn_interface' module"):
        check_attention_installed("flash_attention_3")
    for name in (None, "sdpa", "eager"):  # PyTorch's own kernels: nothing to install
        check_attention_installed(name)


def test_config_validation():
    config = validate_strategy_config("hf_infer", {"generate_batch_size": 4})
    assert isinstance(config, HfInferConfig) and config.devices_per_worker == 1
    with pytest.raises(ConfigError, match="bogus"):
        HfInferConfig(bogus=1)
    with pytest.raises(ConfigError, match="bogus"):
        StrategyWorkerConfig(
            name="x", strategy_args=StrategyArgs(strategy_name="hf_infer", strategy_config={"bogus": 1})
        )
    with pytest.raises(ConfigError):
        HfInferConfig(device="tpu")
    with pytest.raises(ConfigError):
        HfInferConfig(generate_batch_size=0)


def test_cpu_dtype_fallback():
    cpu = torch.device("cpu")
    assert choose_dtype(ModelArgs(dtype="float16"), HfInferConfig(), cpu) == torch.float32
    assert choose_dtype(ModelArgs(dtype="bfloat16"), HfInferConfig(cpu_bfloat16=False), cpu) == torch.float32
    assert choose_dtype(ModelArgs(dtype="bfloat16"), HfInferConfig(cpu_bfloat16=True), cpu) == torch.bfloat16
    assert choose_dtype(ModelArgs(dtype="float32"), HfInferConfig(), cpu) == torch.float32


def test_small_generate_batches_and_offload_noop_on_cpu(peaked_model, strategy):
    chunked = make_strategy(peaked_model, generate_batch_size=1)
    chunked.offload_states()  # nothing to move on the CPU; the model stays usable
    chunked.load_states()
    config = GenerationConfig(max_new_tokens=4, temperature=0.0, num_return_sequences=2)
    batch = prompt_batch(strategy.tokenizer, PROMPTS)
    assert torch.equal(chunked.generate(batch, config)["responses"], strategy.generate(batch, config)["responses"])


def test_repetition_penalty_ignores_left_padding():
    from roll.strategies.hf._sampling import RepetitionPenalty

    # Row 0 has one padding column holding token 0; row 1 really contains token 0.
    input_ids = torch.tensor([[0, 2, 3], [0, 2, 2]])
    scores = torch.tensor([[1.0, 1.0, 2.0, -2.0], [1.0, 1.0, 2.0, -2.0]])
    out = RepetitionPenalty(2.0, pad_lengths=torch.tensor([1, 0]))(input_ids, scores)
    assert out.tolist() == [[1.0, 1.0, 1.0, -4.0], [0.5, 1.0, 1.0, -2.0]]


def test_model_config_kwargs_override_the_hf_config_of_every_hf_loader(tiny_model: Path) -> None:
    """ROLL's ``model_args.model_config_kwargs`` (it was refused): set on the model's config before the weights load,
    by hf_infer's and fsdp2's loaders (a value head keeps its one label), and handed to vLLM and SGLang."""
    from roll.strategies.config import ModelArgs
    from roll.strategies.fsdp2 import _model as fsdp2_model
    from roll.strategies.hf import _loading
    from roll.strategies.sglang.config import SglangConfig

    plain = ModelArgs(model_name_or_path=str(tiny_model), dtype="float32")
    changed = plain.model_copy(update={"model_config_kwargs": {"rms_norm_eps": 0.5}})
    ids = torch.tensor([[5, 6, 7, 8]])
    before = _loading.load_model(plain, torch.float32, torch.device("cpu"))
    after = _loading.load_model(changed, torch.float32, torch.device("cpu"))
    assert (before.config.rms_norm_eps, after.config.rms_norm_eps) == (1e-6, 0.5)
    assert not torch.allclose(before(ids).logits, after(ids).logits)  # the same weights, another model
    critic = fsdp2_model.load_model(changed.model_copy(update={"model_head": "value"}), torch.float32, train=False)
    assert critic.config.num_labels == 1 and critic.config.rms_norm_eps == 0.5
    assert critic(ids).logits.shape == (1, 4, 1)
    assert SglangConfig().engine_args(changed, seed=0)["json_model_override_args"] == '{"rms_norm_eps": 0.5}'
    assert "json_model_override_args" not in SglangConfig().engine_args(plain, seed=0)
