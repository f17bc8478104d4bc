"""rollout.sequence_length checked at load time: each env tag's first prompt (as its env manager renders it) plus a
turn's tokens, and the model's positions; by ``roll validate`` and by the pipeline's setup, before workers start."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from roll.agentic import driver_envs
from roll.agentic.pipeline import AgenticConfig, AgenticPipeline
from roll.agentic.pipeline.config import VAL_SEED_OFFSET
from roll.agentic.pipeline.lengths import max_positions
from roll.agentic.policy import GenerateRequest, GenerateResult, MockPolicyClient, ScriptedPolicy
from roll.agentic.scheduler import RolloutScheduler
from roll.pipelines.validate import validate_deployment
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig

LAKE = {"env_type": "frozen_lake", "env_config": {"size": 3}, "max_tokens_per_step": 16}
SPECS = {
    "traj": LAKE,
    "step": {**LAKE, "env_manager_cls": "step"},
    "sokoban": {"env_type": "sokoban", "env_config": {"dim_room": [6, 6], "num_boxes": 1}, "max_tokens_per_step": 16},
    "tools": {**LAKE, "tool_wrapper": {"tool_configs": [{"tool_id": "python_code"}]}},
}


class _Recorder:
    def __init__(self, inner) -> None:
        self.inner, self.requests = inner, []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        return await self.inner.generate(request)


def _config(spec: dict, *, model: str = "/models/not-here", **extra) -> AgenticConfig:
    role = {"model_args": {"model_name_or_path": model}}
    data = {
        "actor_train": role,
        "actor_infer": {**role, "generating_args": {"max_new_tokens": 16}},
        "custom_envs": {"Env": spec},
        "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["Env"]},
        "rollout_batch_size": 1,
        "advantage": {"estimator": "reinforce"},
        **extra,
    }
    return AgenticConfig.model_validate(data)


def _lines(config: AgenticConfig, tokenizer) -> list[str]:
    return [line for check in config.length_checks(tokenizer) if (line := check())]


def _first_request(tokenizer, config: AgenticConfig) -> list[int]:
    """The first prompt a real rollout of ``config``'s training envs sends to the policy."""
    client = _Recorder(MockPolicyClient(tokenizer, ScriptedPolicy(lambda prompt: "<answer>Up</answer>")))
    scheduler = RolloutScheduler.local(
        config.train_env_manager, config.custom_envs, tokenizer, client,
        generation_config=GenerationConfig(max_new_tokens=16), sequence_length=4096, seed=config.seed,
    )  # fmt: skip
    try:
        scheduler.get_batch(1)
    finally:
        scheduler.close()
    return client.requests[0].prompt_ids


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_the_check_counts_the_prompt_the_env_manager_sends(tokenizer, kind) -> None:
    config = _config(SPECS[kind])
    sent = len(_first_request(tokenizer, config))
    lines = _lines(config, tokenizer)
    assert (
        f"Env: first prompt {sent} tokens + 16 per turn (max_tokens_per_step=16) fit in sequence_length 1024" in lines
    )
    exact = _config(SPECS[kind], sequence_length=sent + 16)
    assert f"Env: first prompt {sent} tokens" in _lines(exact, tokenizer)[-1]
    short = _config(SPECS[kind], sequence_length=sent + 15)
    with pytest.raises(ConfigError) as caught:
        _lines(short, tokenizer)
    message = str(caught.value)
    assert "env tag 'Env' (train_env_manager): its first prompt (seed " in message
    assert (
        f"is {sent} tokens, and with one turn's 16 new tokens (max_tokens_per_step=16) it needs {sent + 16}" in message
    )
    assert (
        f"over rollout.sequence_length (ROLL's sequence_length)={sent + 15}: raise rollout.sequence_length" in message
    )
    assert "shorten the tag's agent_system_template, agent_template or env instruction" in message


def test_the_tool_prompt_is_counted(tokenizer) -> None:
    plain, tools = (len(_first_request(tokenizer, _config(SPECS[k]))) for k in ("traj", "tools"))
    assert tools > plain + 20  # the python_code tool's description is part of the first prompt


def test_a_smaller_max_new_tokens_is_the_turns_budget(tokenizer) -> None:
    config = _config(
        LAKE, actor_infer={"model_args": {"model_name_or_path": "/m"}, "generating_args": {"max_new_tokens": 4}}
    )
    line = _lines(config, tokenizer)[-1]
    assert "+ 4 per turn (actor_infer.generating_args.max_new_tokens=4)" in line
    # a manager's own generating_args sample its turns (ROLL's precedence), so they set the turn's budget
    own = {"num_env_groups": 1, "group_size": 1, "tags": ["Env"], "generating_args": {"max_new_tokens": 2}}
    line = _lines(_config(LAKE, train_env_manager=own), tokenizer)[-1]
    assert "+ 2 per turn (train_env_manager.generating_args.max_new_tokens=2)" in line


def test_val_tags_are_checked_with_the_val_seeds(tokenizer) -> None:
    val = {"num_env_groups": 2, "group_size": 1, "tags": ["Val"]}
    config = _config(LAKE, custom_envs={"Env": LAKE, "Val": {**LAKE, "agent_template": "{observation}" * 40}},
                     val_env_manager=val, val_batch_size=2, sequence_length=512)  # fmt: skip
    with pytest.raises(ConfigError, match=r"env tag 'Val' \(val_env_manager\): its first prompt \(seed \d+\) is"):
        _lines(config, tokenizer)


def test_a_tag_shared_by_train_and_val_is_checked_with_each_managers_turn_budget(tokenizer) -> None:
    """A tag checked once per tag took the training manager's budget only: a val manager sampling longer turns on the
    same tag passed the check and its episodes were cut at their first turn."""
    plain = {"env_type": "frozen_lake", "env_config": {"size": 3}}
    val = {"num_env_groups": 1, "group_size": 1, "tags": ["Env"], "generating_args": {"max_new_tokens": 400}}
    config = _config(plain, val_env_manager=val, val_batch_size=1, sequence_length=450)  # the prompt: 356 tokens
    with pytest.raises(ConfigError, match=r"env tag 'Env' \(val_env_manager\): its first .* one turn's 128 new tokens"):
        _lines(config, tokenizer)
    config = _config(plain, val_env_manager={**val, "generating_args": {"max_new_tokens": 16}}, val_batch_size=1,
                     sequence_length=450)  # fmt: skip
    assert len([line for line in _lines(config, tokenizer) if line.startswith("Env:")]) == 1  # one budget, one check


class IndexedEnv:
    """Picks its item by seed (as dataset envs do): the item's length grows with the seed."""

    seed_is_index = True

    def reset(self, seed=None):
        return "Up " * (1 + seed % 500), {}

    def step(self, action):
        return "done", 1.0, True, False, {}


def test_a_val_tag_that_picks_items_by_seed_is_checked_on_item_0(tokenizer) -> None:
    indexed = {"env_type": f"{__name__}:IndexedEnv", "max_tokens_per_step": 16}
    val = {"num_env_groups": 1, "group_size": 1, "tags": ["Items"]}
    config = _config(LAKE, custom_envs={"Env": LAKE, "Items": indexed}, val_env_manager=val, val_batch_size=1)
    client = _Recorder(MockPolicyClient(tokenizer, ScriptedPolicy(lambda prompt: "<answer>Up</answer>")))
    scheduler = RolloutScheduler.local(
        config.val_env_manager, config.custom_envs, tokenizer, client,
        generation_config=GenerationConfig(max_new_tokens=16), sequence_length=4096, mode="val",
        seed=config.seed + VAL_SEED_OFFSET,
    )  # fmt: skip
    try:
        scheduler.get_batch(1)
    finally:
        scheduler.close()
    sent = len(client.requests[0].prompt_ids)
    assert f"Items: first prompt {sent} tokens + 16 per turn" in _lines(config, tokenizer)[-1]


class _BrokenEnv:
    def __init__(self) -> None:
        raise OSError("no route to the env service")

    def reset(self, seed=None): ...

    def step(self, action): ...


class _SlowEnv(_BrokenEnv):
    def __init__(self) -> None:
        import time

        time.sleep(5)


def test_envs_not_built_here_are_skipped_with_a_note(tokenizer, monkeypatch) -> None:
    broken = _config({"env_type": f"{__name__}:_BrokenEnv"})
    assert _lines(broken, tokenizer)[-1] == (
        "Env: first prompt not checked here (building its env failed: OSError: no route to the env service); "
        "its first turn checks it"
    )
    monkeypatch.setattr(driver_envs, "BUILD_TIMEOUT_S", 0.2)
    slow = _config({"env_type": f"{__name__}:_SlowEnv"})
    assert "(building its env took over 0.2 s)" in _lines(slow, tokenizer)[-1]


class _UnreachableAtReset(_BrokenEnv):
    def __init__(self) -> None:
        pass

    def reset(self, seed=None):
        from roll.pipelines.validate import ServiceUnreachableError

        raise ServiceUnreachableError("the game server does not answer from here")


def test_an_env_that_refuses_its_settings_at_reset_fails_the_check(tokenizer) -> None:
    """frozen_lake's split draws layouts at reset: settings with no layout in the split (size 2, a 1% val split)
    raised at every episode's reset, and the load-time check only noted it (the run then started its workers and
    faulted every episode). The check now fails, naming the tag; an error about this machine stays a note."""
    lake = {**LAKE, "env_config": {"size": 2, "split": "val", "val_fraction": 0.01}}
    with pytest.raises(
        ConfigError,
        match=r"^env tag 'Env': its reset \(seed \d+\) refuses the settings: frozen_lake size=2 p=0.8: no layout of "
        r"split='val' in 10000 draws",
    ):
        _lines(_config(lake), tokenizer)
    line = _lines(_config({"env_type": f"{__name__}:_UnreachableAtReset"}), tokenizer)[-1]
    assert line.startswith("Env: first prompt not checked here (its reset failed (env_error: reset() raised ")
    assert "ServiceUnreachableError: the game server does not answer from here" in line


def test_a_gem_env_that_loads_a_hub_dataset_is_not_built() -> None:
    pytest.importorskip("gem")
    spec = {"env_type": "gem:math:GSM8K", "agent_template": "{observation}"}
    line = _config(spec).length_checks(object())[-1]()
    assert line == (
        "Env: first prompt not checked here (the GEM env loads the hub dataset 'axon-rl/GSM-8k' when built); "
        "its first turn checks it"
    )


def test_a_roll_dataset_env_with_a_hub_dataset_is_not_built(monkeypatch) -> None:
    # roll validate away from the cluster must not download a dataset to count one prompt (its own check_args only
    # looks in the cache); a local dataset file is read and counted as for any env
    from roll.agentic.env import dataset

    monkeypatch.setattr(dataset, "read_source", lambda *a, **k: pytest.fail("the hub dataset was read"))
    spec = {"env_type": "roll_math", "env_config": {"dataset_name": "open-r1/DAPO-Math-17k-Processed"}}
    line = _config(spec).length_checks(object())[-1]()
    assert line == (
        "Env: first prompt not checked here (its env loads the hub dataset 'open-r1/DAPO-Math-17k-Processed' when "
        "built); its first turn checks it"
    )


# --- dataset envs: the longest rows ------------------------------------------------------------------------------
def _questions(path: Path, long_row: int = 7, rows: int = 10) -> str:
    """A jsonl of ``rows`` short math questions but for row ``long_row``, which is long."""
    questions = [
        {"problem": ("What is 12 * 34? " * 30 if i == long_row else f"What is {i} + 1?"), "answer": str(i + 1)}
        for i in range(rows)
    ]
    path.write_text("".join(json.dumps(q) + "\n" for q in questions))
    return str(path)


def _math(dataset: str) -> dict:
    return {"env_type": "roll_math", "env_config": {"dataset_name": dataset}, "max_tokens_per_step": 16}


def test_a_dataset_env_is_checked_on_its_longest_row(tokenizer, tmp_path: Path) -> None:
    dataset = _questions(tmp_path / "q.jsonl")
    # the prompt the env manager sends for row 7: a dataset holding row 7 alone
    alone = _questions(tmp_path / "alone.jsonl", long_row=0, rows=1)
    sent = len(_first_request(tokenizer, _config(_math(alone))))
    question = len(tokenizer("What is 12 * 34? " * 30, add_special_tokens=False)["input_ids"])
    line = _lines(_config(_math(dataset)), tokenizer)[-1]
    assert line == (
        f"Env: longest first prompt {sent} tokens (row 7 of {dataset}, question {question} tokens, the longest of its "
        "10 rows) + 16 per turn (max_tokens_per_step=16) fit in sequence_length 1024"
    )
    assert "fit" in _lines(_config(_math(dataset), sequence_length=sent + 16), tokenizer)[-1]
    with pytest.raises(ConfigError) as caught:
        _lines(_config(_math(dataset), sequence_length=sent + 15), tokenizer)
    fits = sent + 15 - 16 - (sent - question)
    assert str(caught.value) == (
        f"env tag 'Env' (train_env_manager): row 7 of {dataset} (its question is {question} tokens, the longest of its "
        f"10 rows) makes a first prompt of {sent} tokens, and with one turn's 16 new tokens (max_tokens_per_step=16) it "
        f"needs {sent + 16}, over rollout.sequence_length (ROLL's sequence_length)={sent + 15}: raise "
        f"rollout.sequence_length to at least {sent + 16}, or filter the dataset (1 of its 10 rows has a question over "
        f"the {fits} tokens that fit)"
    )
    # room for 3 question tokens: every row's question is longer
    with pytest.raises(ConfigError, match=r"\(10 of its 10 rows have questions over the 3 tokens that fit\)$"):
        _lines(_config(_math(dataset), sequence_length=sent - question + 16 + 3), tokenizer)


def test_the_first_episodes_row_alone_would_have_passed(tokenizer, tmp_path: Path) -> None:
    # what the check did before: the prompt of the first episode a rollout plays (a short row) fits ...
    config = _config(_math(_questions(tmp_path / "q.jsonl")))
    first = len(_first_request(tokenizer, config))
    # ... but row 7 would not, later in the run
    with pytest.raises(ConfigError, match=r"row 7 of .*q\.jsonl \(its question is \d+ tokens"):
        _lines(_config(_math(_questions(tmp_path / "q.jsonl")), sequence_length=first + 16), tokenizer)


def test_a_large_dataset_counts_its_longest_rows_by_characters(tokenizer, tmp_path: Path, monkeypatch) -> None:
    from roll.agentic.env import dataset as dataset_module

    monkeypatch.setattr(dataset_module, "COUNTED_CHARS", 100)
    monkeypatch.setattr(dataset_module, "CANDIDATE_ROWS", 3)
    dataset = _questions(tmp_path / "q.jsonl")
    line = _lines(_config(_math(dataset)), tokenizer)[-1]
    assert "(row 7 of " in line and "the longest of the 3 longest by characters of its 10)" in line
    with pytest.raises(ConfigError, match=r"or filter the dataset \(at least 1 of its 10 rows has a question over"):
        _lines(_config(_math(dataset), sequence_length=300), tokenizer)
    # a sequence_length that even the template alone does not fit: filtering would not help
    with pytest.raises(ConfigError, match=r"or shorten the tag's .*\(the prompt without the question is \d+ tokens\)$"):
        _lines(_config(_math(dataset), sequence_length=40), tokenizer)


def test_a_dataset_that_does_not_read_is_skipped_with_a_note(tokenizer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "What is 1 + 1?"}\n')
    line = _lines(_config(_math(str(bad))), tokenizer)[-1]
    assert line.startswith("Env: first prompt not checked here (reading its dataset failed: DataError: roll_math: ")
    assert "missing key 'answer'" in line


@pytest.mark.parametrize(("engine", "key"), [("vllm", "max_model_len"), ("sglang", "context_length")])
def test_an_engine_capped_below_sequence_length_is_an_error(tokenizer, engine, key) -> None:
    infer = {
        "model_args": {"model_name_or_path": "/models/not-here"},
        "generating_args": {"max_new_tokens": 16},
        "strategy_args": {"strategy_name": engine, "strategy_config": {key: 1024}},
    }
    config = _config(LAKE, actor_infer=infer, sequence_length=2048)
    with pytest.raises(ConfigError) as e:
        [check() for check in config.length_checks(tokenizer)]
    assert str(e.value) == (
        f"actor_infer.strategy_args.strategy_config.{key}=1024 is below rollout.sequence_length (ROLL's "
        f"sequence_length)=2048: the engine would refuse an episode's later turns; raise {key} to at least 2048, or "
        "lower rollout.sequence_length to 1024"
    )
    infer["strategy_args"]["strategy_config"][key] = 2048
    lines = _lines(_config(LAKE, actor_infer=infer, sequence_length=2048), tokenizer)
    assert not any(key in (line or "") for line in lines)


# --- the model's positions ---------------------------------------------------------------------------------------
def test_max_positions_reads_rope_scaling() -> None:
    assert max_positions(SimpleNamespace(max_position_embeddings=1024)) == (1024, 1024, "")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    assert max_positions(SimpleNamespace(max_position_embeddings=1024, rope_parameters=yarn)) == (
        1024, 4096, "yarn RoPE scaling x4 of 1024",
    )  # fmt: skip
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert max_positions(SimpleNamespace(max_position_embeddings=131072, rope_scaling=llama3))[:2] == (131072, 131072)
    default = {"rope_type": "default", "rope_theta": 1e6}
    assert max_positions(SimpleNamespace(max_position_embeddings=512, rope_parameters=default)) == (512, 512, "")
    assert max_positions(SimpleNamespace(n_positions=2048)) == (2048, 2048, "")


@pytest.fixture
def model_folder(tmp_path: Path, tokenizer) -> Path:
    """A local model folder with a config (1024 positions) and the tokenizer: enough for roll validate's checks."""
    from transformers import Qwen2Config

    Qwen2Config(vocab_size=512, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=1024).save_pretrained(tmp_path)  # fmt: skip
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_roll_validate_checks_prompts_and_positions(model_folder: Path) -> None:
    lines = validate_deployment(_config(LAKE, model=str(model_folder)), check_ray=False)
    assert "actor_train.model_args.model_name_or_path: sequence_length 1024 within the model's 1024 positions" in lines
    assert any(line.startswith("Env: first prompt ") and line.endswith("fit in sequence_length 1024") for line in lines)
    with pytest.raises(ConfigError) as caught:
        validate_deployment(_config(LAKE, model=str(model_folder), sequence_length=2048), check_ray=False)
    assert str(caught.value) == (
        f"rollout.sequence_length (ROLL's sequence_length)=2048 exceeds the 1024 positions of the model of "
        f"actor_train.model_args.model_name_or_path ({model_folder}): lower rollout.sequence_length to 1024 or less, "
        "or use a model with a longer context"
    )


def test_rope_scaling_makes_a_longer_sequence_a_warning(model_folder: Path) -> None:
    import json

    path = model_folder / "config.json"
    data = json.loads(path.read_text())
    data["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024}
    path.write_text(json.dumps(data))
    lines = validate_deployment(_config(LAKE, model=str(model_folder), sequence_length=2048), check_ray=False)
    assert (
        "warning: rollout.sequence_length (ROLL's sequence_length)=2048 is beyond the model's "
        "max_position_embeddings=1024 (actor_train.model_args.model_name_or_path), within the 2048 its yarn RoPE "
        "scaling x2 of 1024 reaches; quality there depends on the model"
    ) in lines
    with pytest.raises(ConfigError, match="exceeds the 2048 positions"):
        validate_deployment(_config(LAKE, model=str(model_folder), sequence_length=2049), check_ray=False)


def test_the_pipeline_stops_before_any_worker_starts(model_folder: Path, tmp_path: Path) -> None:
    config = _config(LAKE, model=str(model_folder), sequence_length=32, output_dir=str(tmp_path / "out"))
    pipeline = AgenticPipeline(config)
    with pytest.raises(ConfigError, match=r"env tag 'Env' \(train_env_manager\): its first prompt"):
        pipeline.setup()
    assert not pipeline.clusters and pipeline._session is None
