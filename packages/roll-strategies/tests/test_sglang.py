"""sglang backend: config, GenerationConfig -> SGLang requests, output parsing, import guards, GPU runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from roll.protocol import DataProto
from roll.runtime import ConfigError, MissingExtraError
from roll.strategies import (
    STRATEGIES,
    GenerationConfig,
    ModelArgs,
    OffloadTarget,
    StrategyArgs,
    StrategyError,
    StrategyWorkerConfig,
)
from roll.strategies.registry import create_strategy, validate_strategy_config
from roll.strategies.sglang import SglangConfig
from roll.strategies.sglang.config import (
    check_engine_result,
    memory_tags,
    parse_engine_output,
    sampling_params,
    sampling_requests,
)

HAS_SGLANG = importlib.util.find_spec("sglang") is not None


# --- config ---------------------------------------------------------------------------------------------------
def test_config_defaults_and_devices_per_worker():
    config = SglangConfig()
    assert config.devices_per_worker == 1 and config.enable_memory_saver
    assert SglangConfig(tp_size=4).devices_per_worker == 4


def test_role_gets_one_engine_per_tp_group():
    role = StrategyWorkerConfig(
        device_mapping=[0, 1, 2, 3],
        strategy_args=StrategyArgs(strategy_name="sglang", strategy_config={"tp_size": 2}),
    )
    assert role.num_gpus_per_worker == 2 and role.world_size == 2
    assert role.devices_of(1) == [2, 3]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mem_fraction_static": 1.0}, "mem_fraction_static"),
        ({"mem_fraction_static": 0.0}, "mem_fraction_static"),
        ({"tp_size": 0}, "tp_size"),
        ({"dtype": "int8"}, "dtype"),
        ({"dp_size": 2}, "unknown field"),
        ({"engine_kwargs": {"dp_size": 2}}, "one engine per worker"),
        ({"engine_kwargs": {"tp_size": 2}}, "strategy_config.tp_size"),
        ({"engine_kwargs": {"model_path": "/x"}}, "model_name_or_path"),
        ({"engine_kwargs": {"mem_fraction_static": 0.5}}, "duplicates strategy_config.mem_fraction_static"),
    ],
)
def test_config_rejects_bad_settings(settings, message):
    with pytest.raises(ConfigError, match=message):
        SglangConfig(**settings)
    with pytest.raises(ConfigError, match=r"strategy_config.*sglang"):
        validate_strategy_config("sglang", settings)


def test_engine_args_combine_model_args_and_settings():
    model_args = ModelArgs(model_name_or_path="/models/m", tokenizer_name_or_path="/tok", dtype="float16")
    config = SglangConfig(tp_size=2, context_length=4096, engine_kwargs={"schedule_policy": "lpm"})
    args = config.engine_args(model_args, seed=7)
    assert args["model_path"] == "/models/m" and args["tokenizer_path"] == "/tok"
    assert args["tp_size"] == 2 and args["base_gpu_id"] == 0 and args["dtype"] == "float16"
    assert args["context_length"] == 4096 and args["schedule_policy"] == "lpm" and args["random_seed"] == 7
    assert "max_running_requests" not in args  # unset options keep SGLang's defaults
    assert SglangConfig(dtype="bfloat16").engine_args(model_args, seed=0)["dtype"] == "bfloat16"


# --- GenerationConfig -> SGLang -------------------------------------------------------------------------------
def test_sampling_params_map_every_generation_setting():
    config = GenerationConfig(
        max_new_tokens=32,
        temperature=0.7,
        top_p=0.9,
        top_k=50,
        min_p=0.05,
        repetition_penalty=1.1,
        stop_strings=["</answer>"],
        stop_token_ids=[7, 9],
        ignore_eos=True,
        seed=100,
    )
    params = sampling_params(config, sample_index=3)
    assert params == {
        "max_new_tokens": 32,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 50,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "ignore_eos": True,
        "n": 1,
        "stop": ["</answer>"],
        "stop_token_ids": [7, 9],
        "sampling_seed": 103,
    }


def test_default_and_greedy_sampling_params():
    params = sampling_params(GenerationConfig(temperature=0.0))
    assert params["temperature"] == 0.0 and params["top_k"] == -1  # SGLang: 0 is greedy, -1 the whole vocabulary
    assert "stop" not in params and "stop_token_ids" not in params and "sampling_seed" not in params


def test_requests_keep_a_prompts_samples_consecutive():
    config = GenerationConfig(num_return_sequences=3, seed=10)
    input_ids, params = sampling_requests([[1, 2], [3]], config)
    assert input_ids == [[1, 2]] * 3 + [[3]] * 3
    assert [p["sampling_seed"] for p in params] == [10, 11, 12, 13, 14, 15]  # samples differ under a fixed seed
    assert all(p["n"] == 1 for p in params)
    assert sampling_requests([], config) == ([], [])


def test_per_sample_seeds_replace_the_configured_seed():
    config = GenerationConfig(num_return_sequences=2, seed=10)
    _, params = sampling_requests([[1, 2], [3]], config, seeds=[70, 71, 5, 6])
    assert [p["sampling_seed"] for p in params] == [70, 71, 5, 6]
    with pytest.raises(StrategyError, match="3 seeds for 4 samples"):
        sampling_requests([[1, 2], [3]], config, seeds=[1, 2, 3])


def _output(tokens, reason, logprobs=True, ids=True):
    meta = {"finish_reason": reason}
    if logprobs:
        meta["output_token_logprobs"] = [(-0.1 * (i + 1), t, None) for i, t in enumerate(tokens)]
    out = {"text": "", "meta_info": meta}
    if ids:
        out["output_ids"] = tokens
    return out


def test_parse_engine_output():
    tokens, logprobs, reason = parse_engine_output(
        _output([5, 6, 2], {"type": "stop", "matched": 2}), with_logprobs=True
    )
    assert tokens == [5, 6, 2] and logprobs == pytest.approx([-0.1, -0.2, -0.3]) and reason == "stop"
    tokens, logprobs, reason = parse_engine_output(_output([5], {"type": "length", "length": 1}), with_logprobs=False)
    assert (tokens, logprobs, reason) == ([5], None, "length")
    # Older outputs without output_ids: the ids come with the log-probs.
    assert parse_engine_output(_output([4, 3], {"type": "stop"}, ids=False), with_logprobs=True)[0] == [4, 3]
    with pytest.raises(StrategyError, match="abort"):
        parse_engine_output(_output([1], {"type": "abort", "message": "oom"}), with_logprobs=True)
    with pytest.raises(StrategyError, match="return_logprob"):
        parse_engine_output(_output([1], {"type": "stop"}, logprobs=False), with_logprobs=True)
    with pytest.raises(StrategyError, match="neither"):
        parse_engine_output(_output([1], {"type": "stop"}, logprobs=False, ids=False), with_logprobs=False)


def test_engine_results_and_memory_tags():
    check_engine_result((True, "ok"), "update")
    check_engine_result(None, "flush")
    check_engine_result(SimpleNamespace(success=True), "flush")
    with pytest.raises(StrategyError, match="update_weights_from_tensor failed: shape mismatch"):
        check_engine_result((False, "shape mismatch"), "update_weights_from_tensor")
    with pytest.raises(StrategyError, match="flush_cache failed"):
        check_engine_result({"success": False}, "flush_cache")
    assert memory_tags(None) is None
    assert memory_tags([OffloadTarget.MODEL_PARAMS, OffloadTarget.KV_CACHE]) == ["weights", "kv_cache"]
    assert memory_tags([OffloadTarget.OPTIMIZER_STATES]) == []


# --- import guards --------------------------------------------------------------------------------------------
def test_package_and_config_do_not_import_sglang():
    code = (
        "import sys, roll.strategies.sglang, roll.strategies.sglang.config\n"
        "print(sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(HAS_SGLANG, reason="sglang is installed")
def test_selecting_sglang_without_it_names_the_extra():
    with pytest.raises(MissingExtraError) as info:
        STRATEGIES.get("sglang")
    assert "pip install 'roll-strategies[sglang]'" in str(info.value)
    worker = SimpleNamespace(
        worker_config=StrategyWorkerConfig(name="rollout", strategy_args=StrategyArgs(strategy_name="sglang")),
        rank=0,
        world_size=1,
    )
    with pytest.raises(MissingExtraError, match=r"pip install 'roll-strategies\[sglang\]'"):
        create_strategy(worker)


# --- GPU: a real engine ---------------------------------------------------------------------------------------
@pytest.fixture
def sglang_worker(tiny_model):
    pytest.importorskip("sglang")
    from roll.strategies import StrategyWorker

    config = StrategyWorkerConfig(
        name="rollout",
        model_args=ModelArgs(model_name_or_path=str(tiny_model), dtype="bfloat16"),
        strategy_args=StrategyArgs(strategy_name="sglang", strategy_config={"mem_fraction_static": 0.3}),
    )
    worker = StrategyWorker(config)
    worker.initialize()
    yield worker
    worker.strategy.shutdown()


def _prompts() -> DataProto:
    ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask}, {"uid": ["a", "b"]})


@pytest.mark.gpu
def test_gpu_sglang_generates_and_syncs_weights(sglang_worker, tiny_model):
    from transformers import AutoModelForCausalLM

    strategy = sglang_worker.strategy
    config = GenerationConfig(max_new_tokens=8, num_return_sequences=2, temperature=1.0)
    out = strategy.generate(_prompts(), config)
    assert len(out) == 4 and out["uid"].tolist() == ["a", "a", "b", "b"]
    assert out["responses"].shape == (4, 8) and set(out["finish_reason"].tolist()) <= {"stop", "length"}
    assert (out["rollout_log_probs"] <= 0).all()
    assert (out["rollout_log_probs"] * (1 - out["response_mask"])).abs().sum() == 0

    greedy = GenerationConfig(max_new_tokens=8, temperature=0.0)
    before = strategy.generate(_prompts(), greedy)["responses"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight))  # tied: changes every prediction
    strategy.offload_states()
    strategy.load_states([OffloadTarget.MODEL_PARAMS])
    strategy.update_weights([(n, t.cuda()) for n, t in model.state_dict().items()])
    strategy.load_states([OffloadTarget.KV_CACHE])
    strategy.process_weights_after_loading()
    after = strategy.generate(_prompts(), greedy)["responses"]
    assert not torch.equal(before, after)
