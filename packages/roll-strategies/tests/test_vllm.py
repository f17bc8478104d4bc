"""The vllm backend on CPU, checked against plain transformers on the same tiny fp32 model.

One engine serves the whole module (starting it takes 20-60 s); tests that change its weights restore them.
"""

from __future__ import annotations

import copy
import os

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
)
from roll.strategies.generation import SAMPLING_SEED_KEY
from roll.strategies.ops import log_probs_from_logits, position_ids_from_attention_mask
from roll.strategies.vllm import VllmConfig
from roll.strategies.weights import iter_buckets

pytestmark = pytest.mark.extra("vllm")

PAD = 3  # the tiny tokenizer's <|pad|>
PROMPTS = [[5, 6, 7, 8], [100, 200, 300], [42], [17, 250, 401, 77, 9, 64]]


# --- helpers --------------------------------------------------------------------------------------------
def left_padded(prompts: list[list[int]]) -> DataProto:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask}, {"uid": [f"p{i}" for i in range(len(prompts))]}
    )


def hf_greedy(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def hf_token_log_probs(model, ids: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token t | its prefix) for every position (0 at position 0), as a trainer would compute it."""
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)
        ).logits.float()
    out = torch.zeros(ids.shape)
    out[:, 1:] = log_probs_from_logits(logits[:, :-1], ids[:, 1:], temperature)
    return out


def vllm_greedy(strategy, prompts: list[list[int]], steps: int = 8) -> list[list[int]]:
    out = strategy.generate(
        left_padded(prompts), GenerationConfig(max_new_tokens=steps, temperature=0.0, ignore_eos=True)
    )
    return out["responses"].tolist()


# --- fixtures -------------------------------------------------------------------------------------------
# Both ways a CPU engine can take synced weights: copied into plain linear weights in place, or each layer
# re-materialized and re-packed for oneDNN by vLLM's layerwise reload.
@pytest.fixture(scope="module", params=[True, False], ids=["in_place", "layerwise"])
def engine(request, tiny_model):
    pytest.importorskip("vllm")
    settings = {"max_model_len": 256, "kv_cache_space_gb": 1, "cpu_plain_linear": request.param}
    config = StrategyWorkerConfig(
        name="rollout",
        model_args=ModelArgs(model_name_or_path=str(tiny_model), dtype="float32"),
        strategy_args=StrategyArgs(strategy_name="vllm", strategy_config=settings),
    )
    threads = torch.get_num_threads()
    worker = StrategyWorker(config)
    worker.initialize()
    assert torch.get_num_threads() == threads, "starting the engine changed this process's torch threads"
    assert worker.strategy._in_place == request.param
    yield worker.strategy
    worker.strategy.shutdown()
    # The in-process engine must not leave its process group behind for later tests.
    assert not torch.distributed.is_initialized()


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


# --- config (no vLLM needed) ----------------------------------------------------------------------------
def test_config_validates_and_derives_devices_per_worker():
    assert VllmConfig(tensor_parallel_size=2, pipeline_parallel_size=2).devices_per_worker == 4
    assert VllmConfig().engine_in_process and not VllmConfig(in_process=False).engine_in_process
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        VllmConfig(gpu_memory_utilization=0)
    with pytest.raises(ConfigError, match="model_args.dtype"):
        VllmConfig(engine_kwargs={"dtype": "float16"})
    with pytest.raises(ConfigError, match="logprobs_mode"):
        VllmConfig(engine_kwargs={"logprobs_mode": "raw_logprobs", "max_num_batched_tokens": 512})
    assert VllmConfig(engine_kwargs={"max_num_batched_tokens": 512}).engine_kwargs == {"max_num_batched_tokens": 512}
    with pytest.raises(ConfigError, match="tensor_parallel"):
        VllmConfig(tensor_parallel=2)
    role = StrategyWorkerConfig(
        device_mapping=[0, 1, 2, 3],
        strategy_args=StrategyArgs(strategy_name="vllm", strategy_config={"tensor_parallel_size": 2}),
    )
    assert (role.num_gpus_per_worker, role.world_size) == (2, 2)


def test_a_gpu_block_size_is_left_to_vllm_on_cpu(caplog):
    """ROLL's GPU files set block_size 16 (kept by roll's translation as engine_kwargs.block_size); vLLM's CPU
    attention refused it at engine start ("No common block size for 16"), so such a file's rollouts failed on a CPU.
    A CPU engine now leaves it to vLLM, with a warning naming the key; a size the CPU takes is kept."""
    from roll.strategies.vllm.config import cpu_block_size

    with caplog.at_level("WARNING", logger="roll.strategies.vllm.config"):
        assert cpu_block_size({"seed": 0, "block_size": 16}) == {"seed": 0}
    assert "engine_kwargs.block_size=16 (ROLL's strategy_config.block_size) is not a multiple of 32" in caplog.text
    assert cpu_block_size({"block_size": 64}) == {"block_size": 64}
    assert cpu_block_size({"seed": 0}) == {"seed": 0}


def test_model_config_kwargs_reach_vllm_as_hf_overrides():
    """ROLL's ``model_args.model_config_kwargs`` become the engine's ``hf_overrides`` (set there only)."""
    with pytest.raises(ConfigError, match="model_args.model_config_kwargs"):
        VllmConfig(engine_kwargs={"hf_overrides": {"rms_norm_eps": 0.5}})
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from roll.strategies.vllm.strategy import VllmStrategy

    args = ModelArgs(model_name_or_path="m", model_config_kwargs={"rms_norm_eps": 0.5})
    owner = SimpleNamespace(config=VllmConfig(), model_args=args)
    assert VllmStrategy._engine_kwargs(owner, on_gpu=False)["hf_overrides"] == {"rms_norm_eps": 0.5}
    owner.model_args = ModelArgs(model_name_or_path="m")
    assert "hf_overrides" not in VllmStrategy._engine_kwargs(owner, on_gpu=False)


# --- generation -----------------------------------------------------------------------------------------
def test_greedy_generation_matches_transformers(engine, hf_model):
    assert vllm_greedy(engine, PROMPTS) == [hf_greedy(hf_model, p, 8) for p in PROMPTS]


def test_generation_layout_and_logprobs_of_greedy_tokens(engine, hf_model):
    out = engine.generate(left_padded(PROMPTS[:2]), GenerationConfig(max_new_tokens=5, temperature=0.0))
    assert out["prompts"].shape == (2, 4) and out["responses"].shape == (2, 5) and out["input_ids"].shape == (2, 9)
    assert out["uid"].tolist() == ["p0", "p1"]
    assert torch.equal(out["attention_mask"][:, 4:], out["response_mask"])
    assert out["attention_mask"][1, :4].tolist() == [0, 1, 1, 1]
    # Greedy log-probs are under the untempered distribution.
    expected = hf_token_log_probs(hf_model, out["input_ids"], out["attention_mask"])[:, 4:]
    torch.testing.assert_close(out["rollout_log_probs"], expected * out["response_mask"], atol=1e-4, rtol=0)


def test_seeded_sampling_is_reproducible_and_log_probs_follow_temperature(engine, hf_model):
    config = GenerationConfig(max_new_tokens=12, temperature=0.8, num_return_sequences=4, seed=11, ignore_eos=True)
    first = engine.generate(left_padded(PROMPTS[:3]), config)
    again = engine.generate(left_padded(PROMPTS[:3]), config)
    other = engine.generate(left_padded(PROMPTS[:3]), config.model_copy(update={"seed": 12}))
    assert len(first) == 12 and first["uid"].tolist() == ["p0"] * 4 + ["p1"] * 4 + ["p2"] * 4
    assert torch.equal(first["responses"], again["responses"])
    assert not torch.equal(first["responses"], other["responses"])
    assert len({tuple(r) for r in first["responses"][:4].tolist()}) > 1, "a prompt's samples should differ"
    # Prompt i's samples sit at rows 4i..4i+3 and continue prompt i.
    assert torch.equal(first["prompts"][4:8], left_padded(PROMPTS[:3])["input_ids"][1:2].expand(4, -1))
    expected = hf_token_log_probs(hf_model, first["input_ids"], first["attention_mask"], temperature=0.8)
    width = first["prompts"].shape[1]
    torch.testing.assert_close(first["rollout_log_probs"], expected[:, width:], atol=1e-3, rtol=0)
    assert first["finish_reason"].tolist() == ["length"] * 12


def test_seeded_sampling_of_more_prompt_tokens_than_one_engine_step_takes(engine):
    # vLLM's CPU default budget is 4096 tokens per engine step; a batch past it was prefilled in chunks, and after a
    # partial prefill vLLM rewinds a seeded request's generator, which a CPU torch.Generator cannot do.
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 400, (48,), generator=generator).tolist() for _ in range(96)]
    config = GenerationConfig(max_new_tokens=4, temperature=1.0, num_return_sequences=2, seed=7, ignore_eos=True)
    first = engine.generate(left_padded(prompts), config)
    again = engine.generate(left_padded(prompts), config)
    assert len(first) == 192 and first["responses"].shape == (192, 4)
    assert torch.equal(first["responses"], again["responses"])


def test_seeded_rows_sample_the_same_tokens_in_any_batch_and_order(engine):
    config = GenerationConfig(max_new_tokens=8, temperature=1.0, num_return_sequences=2, ignore_eos=True)
    seeds = [31, 42, 53, 64]

    def run(
        rows: list[int], config: GenerationConfig = config
    ) -> dict[tuple[int, int], tuple[list[int], torch.Tensor]]:
        batch = left_padded([PROMPTS[r] for r in rows])
        batch.batch[SAMPLING_SEED_KEY] = torch.tensor([seeds[r] for r in rows])
        out = engine.generate(batch, config)
        return {
            (r, j): (out["responses"][2 * i + j].tolist(), out["rollout_log_probs"][2 * i + j])
            for i, r in enumerate(rows)
            for j in range(2)
        }

    together = run([0, 1, 2, 3])
    alone = {key: value for r in range(4) for key, value in run([r]).items()}
    for other in (run([3, 1, 0, 2]), alone, run([0, 1, 2, 3], config.model_copy(update={"seed": 5}))):
        for key, (tokens, log_probs) in together.items():
            assert other[key][0] == tokens
            torch.testing.assert_close(other[key][1], log_probs, atol=1e-4, rtol=0)
    assert all(together[(r, 0)][0] != together[(r, 1)][0] for r in range(4))  # seed and seed + 1 differ


def test_stop_token_ids_end_the_response_with_the_stop_token(engine):
    config = GenerationConfig(max_new_tokens=16, temperature=1.0, seed=5, ignore_eos=True)
    tokens = engine.generate(left_padded(PROMPTS[:1]), config)["responses"][0].tolist()
    cut = next(k for k in range(3, 16) if tokens[k] not in tokens[:k])
    out = engine.generate(left_padded(PROMPTS[:1]), config.model_copy(update={"stop_token_ids": [tokens[cut]]}))
    assert out["responses"][0, : cut + 1].tolist() == tokens[: cut + 1]
    assert out["response_mask"][0].sum() == cut + 1
    assert out["responses"][0, cut + 1 :].eq(PAD).all() and out["rollout_log_probs"][0, cut + 1 :].eq(0).all()
    assert out["finish_reason"].tolist() == ["stop"]


def test_stop_strings_keep_the_token_that_completes_them(engine):
    decode = engine.tokenizer.decode
    config = GenerationConfig(max_new_tokens=24, temperature=1.0, seed=3, num_return_sequences=4, ignore_eos=True)
    samples = engine.generate(left_padded(PROMPTS[:1]), config)["responses"].tolist()
    # A word-like token whose text first appears exactly when it is generated.
    row, cut, stop = next(
        (row, k, decode([tokens[k]]))
        for row, tokens in enumerate(samples)
        for k in range(2, 24)
        if decode([tokens[k]]).isascii() and decode([tokens[k]]).isalpha() and len(decode([tokens[k]])) >= 2
        if decode([tokens[k]]) not in decode(tokens[:k]) + decode([tokens[k]])[:-1]
    )
    out = engine.generate(left_padded(PROMPTS[:1]), config.model_copy(update={"stop_strings": [stop]}))
    assert out["responses"][row, : cut + 1].tolist() == samples[row][: cut + 1]
    assert out["response_mask"][row].sum() == cut + 1
    assert out["finish_reason"][row] == "stop"


def test_max_new_tokens_finishes_with_length(engine):
    out = engine.generate(left_padded(PROMPTS), GenerationConfig(max_new_tokens=3, seed=0, ignore_eos=True))
    assert out["response_mask"].sum(-1).tolist() == [3] * 4
    assert out["finish_reason"].tolist() == ["length"] * 4


def test_bad_requests_raise_strategy_errors(engine):
    with pytest.raises(StrategyError, match="temperature"):
        engine.generate(left_padded(PROMPTS[:1]), GenerationConfig(max_new_tokens=2, temperature=3.0))
    with pytest.raises(StrategyError, match="rejected"):
        engine.generate(left_padded([list(range(10, 310))]), GenerationConfig(max_new_tokens=2))
    with pytest.raises(StrategyError, match="score_tokens"):
        engine.forward_step(left_padded(PROMPTS), lambda micro, logits: {})


# --- scoring and memory ---------------------------------------------------------------------------------
def test_score_tokens_matches_transformers(engine, hf_model):
    rollout = engine.generate(left_padded(PROMPTS), GenerationConfig(max_new_tokens=6, seed=1, stop_token_ids=[7, 8]))
    batch = rollout.select(batch_keys=["input_ids", "attention_mask"])
    scores = engine.score_tokens(batch)
    mask = batch["attention_mask"]
    expected = hf_token_log_probs(hf_model, batch["input_ids"], mask)
    first = mask.argmax(-1)
    expected[torch.arange(len(mask)), first] = 0.0  # a row's first token has no prefix
    torch.testing.assert_close(scores, expected * mask, atol=1e-3, rtol=0)
    assert scores[mask == 0].eq(0).all()


def test_offload_and_load_are_noops_on_cpu(engine, hf_model):
    engine.offload_states()
    engine.load_states()
    assert vllm_greedy(engine, PROMPTS[:1], 4) == [hf_greedy(hf_model, PROMPTS[0], 4)]


# --- weight sync ----------------------------------------------------------------------------------------
def push(engine, named_tensors, bucket_bytes: int) -> int:
    buckets = list(iter_buckets(named_tensors, bucket_bytes))
    for bucket in buckets:
        engine.update_weights(bucket)
    engine.process_weights_after_loading()
    return len(buckets)


def test_weight_sync_in_buckets_matches_transformers(engine, hf_model):
    original = vllm_greedy(engine, PROMPTS)
    perturbed = copy.deepcopy(hf_model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in perturbed.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    # named_parameters lists the tied embedding once (no lm_head.weight); 40 kB buckets cut q/k/v of a layer apart.
    names = [name for name, _ in perturbed.named_parameters()]
    assert "lm_head.weight" not in names and perturbed.config.tie_word_embeddings
    buckets = list(iter_buckets(perturbed.named_parameters(), 40_000))
    assert any("q_proj.weight" in n for n, _ in buckets[1]) and not any("k_proj" in n for n, _ in buckets[1])
    engine.update_weights(buckets[0])
    with pytest.raises(StrategyError, match="process_weights_after_loading"):
        vllm_greedy(engine, PROMPTS[:1], 2)
    for bucket in buckets[1:]:
        engine.update_weights(bucket)
    engine.process_weights_after_loading()

    synced = vllm_greedy(engine, PROMPTS)
    assert synced == [hf_greedy(perturbed, p, 8) for p in PROMPTS]
    assert synced != original
    rollout = engine.generate(left_padded(PROMPTS), GenerationConfig(max_new_tokens=6, temperature=0.7, seed=2))
    expected = hf_token_log_probs(perturbed, rollout["input_ids"], rollout["attention_mask"], temperature=0.7)
    width = rollout["prompts"].shape[1]
    torch.testing.assert_close(
        rollout["rollout_log_probs"], expected[:, width:] * rollout["response_mask"], atol=1e-3, rtol=0
    )

    # Back to the original weights in one bucket, as a state dict (which does list lm_head.weight).
    assert push(engine, hf_model.state_dict().items(), 1 << 30) == 1
    assert vllm_greedy(engine, PROMPTS) == original


def test_weight_sync_survives_bucket_memory_reused_after_each_call(engine, hf_model):
    """Weight sync hands out views of a slot that is overwritten by a later bucket as soon as update_weights
    returns: the engine must copy what it keeps (layers completed by a later bucket) before returning."""
    original = vllm_greedy(engine, PROMPTS)
    perturbed = copy.deepcopy(hf_model)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in perturbed.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    slot = None
    for bucket in iter_buckets(perturbed.state_dict().items(), 40_000):
        views = [(name, tensor.detach().clone()) for name, tensor in bucket]
        engine.update_weights(views)
        for _, tensor in views:  # the next bucket lands in this memory
            tensor.fill_(float("nan"))
        slot = views
    engine.process_weights_after_loading()
    assert slot is not None
    synced = vllm_greedy(engine, PROMPTS)
    assert synced == [hf_greedy(perturbed, p, 8) for p in PROMPTS] != original
    push(engine, hf_model.state_dict().items(), 1 << 30)
    assert vllm_greedy(engine, PROMPTS) == original


def test_a_repeated_bucket_layout_is_replayed_and_matches_transformers(engine, hf_model):
    """In place, the second sync of a bucket layout replays the copies the first made (no load_weights)."""
    if not engine._in_place:
        pytest.skip("only in-place engines replay their loads")
    from roll.strategies.vllm import _inplace

    original = vllm_greedy(engine, PROMPTS)
    before = engine._rpc(_inplace.replay_counts)
    for seed in (11, 12, 13):  # recorded, recorded again and compared, replayed
        perturbed = copy.deepcopy(hf_model)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in perturbed.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
        # 30 kB buckets: a layout no other test uses, with q/k/v and gate/up split across buckets.
        push(engine, perturbed.named_parameters(), 30_000)
        assert vllm_greedy(engine, PROMPTS) == [hf_greedy(perturbed, p, 8) for p in PROMPTS] != original
    replayable, not_replayable = engine._rpc(_inplace.replay_counts)
    assert replayable > before[0] and not_replayable == before[1] == 0  # every layout of this model replays
    # The replayed copies of the model's tensors were plain memmoves (whole or in pieces), never torch's copy_.
    copies = engine._rpc(_inplace.replay_copy_counts)
    assert copies["memmove"] + copies["split"] > 0 and copies["torch"] == 0
    push(engine, hf_model.state_dict().items(), 1 << 30)
    assert vllm_greedy(engine, PROMPTS) == original


def _engine_pid(worker) -> int:
    return os.getpid()


def _parameter_addresses(worker) -> list[int]:
    return [param.data_ptr() for param in worker.model_runner.get_model().parameters()]


def test_in_place_parameters_start_on_pages(engine):
    """Copies from bucket slots (tensors mostly at 1 KiB multiples of a page) into page-aligned parameters stay
    clear of 4K aliasing; the layerwise engine's parameters are vLLM's own."""
    addresses = engine._rpc(_parameter_addresses)
    assert len(addresses) > 5
    assert all(address % 4096 == 0 for address in addresses) == engine._in_place


def test_the_engine_copies_weights_in_the_worker_process_so_the_worker_environment_applies(engine):
    """The engine core is not a child process: weight_sync_env()'s GLIBC_TUNABLES, given to the worker at its
    start, is what the engine's copies run under."""
    assert engine._rpc(_engine_pid) == os.getpid()


def test_a_sync_aborted_midway_refuses_to_generate_until_a_complete_sync(engine, hf_model):
    original = vllm_greedy(engine, PROMPTS)
    buckets = list(iter_buckets(hf_model.state_dict().items(), 40_000))
    for bucket in buckets[: len(buckets) // 2]:
        engine.update_weights([(name, tensor * 0.5) for name, tensor in bucket])
    engine.abort_weight_update()
    with pytest.raises(StrategyError, match="stopped midway"):
        vllm_greedy(engine, PROMPTS[:1], 2)
    with pytest.raises(StrategyError, match="stopped midway"):
        engine.process_weights_after_loading()
    assert push(engine, hf_model.state_dict().items(), 40_000) == len(buckets)
    assert vllm_greedy(engine, PROMPTS) == original
