"""ROLL's YAML files load as roll configs: Hydra composition, pipeline inference, a report row for every key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from roll.pipelines.cli import main
from roll.pipelines.compat import compose_file, infer_pipeline, translate
from roll.pipelines.config import load_config, read_config_source
from roll.runtime import ConfigError

FIXTURES = Path(__file__).parent / "fixtures"
TOTAL = FIXTURES / "roll" / "example_total_rl_options.yaml"
TINY = FIXTURES / "tiny" / "rlvr_tiny.yaml"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- Hydra composition ----------------------------------------------------------------------------------------
def test_defaults_merge_relative_files_with_self_last(tmp_path: Path) -> None:
    _write(tmp_path / "conf" / "base.yaml", "a: 1\nnested: {x: 1, y: 2}\n")
    _write(tmp_path / "conf" / "group" / "opt.yaml", "z: 3\n")
    main_file = _write(
        tmp_path / "run" / "main.yaml",
        "defaults:\n  - ../conf/base@_here_\n  - ../conf/group: opt\n  - _self_\nhydra: {run: {dir: .}}\n"
        "a: 2\nnested: {y: 5}\nref: ${nested.x}\ntext: run-${a}\n",
    )
    data, referenced = compose_file(main_file)
    assert data == {"a": 2, "nested": {"x": 1, "y": 5}, "group": {"z": 3}, "ref": 1, "text": "run-2"}
    assert referenced == {"nested", "a"}


def test_interpolation_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"b: interpolation \$\{missing\} refers to a key that does not exist"):
        compose_file(_write(tmp_path / "x.yaml", "b: ${missing}\n"))
    with pytest.raises(ConfigError, match="cycle"):
        compose_file(_write(tmp_path / "y.yaml", "a: ${b}\nb: ${a}\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        compose_file(_write(tmp_path / "z.yaml", "defaults:\n  - nothere@_here_\n"))


def test_env_resolver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLL_TEST_VALUE", "7")
    data, _ = compose_file(_write(tmp_path / "e.yaml", "a: ${oc.env:ROLL_TEST_VALUE}\nb: ${oc.env:ROLL_NOPE,3}\n"))
    assert data == {"a": "7", "b": 3}


# --- pipeline inference ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("keys", "pipeline"),
    [
        ({"rewards": {}, "actor_train": {}}, "rlvr"),
        ({"sft_train": {}}, "sft"),
        ({"actor_train": {}, "reference": {}, "beta": 0.1}, "dpo"),
        ({"actor_infer": {}}, "rlvr_rollout"),
        ({"train_env_manager": {}, "actor_train": {}}, "agentic"),
        ({"train_env_manager": {}, "actor_infer": {}}, "agentic_rollout"),  # ROLL's agentic rollout launcher
        ({"teacher": {}, "student": {}}, "distill"),
        ({"teacher": {}, "student_train": {}, "rewards": {}}, "rlvr"),  # ROLL's on-policy distill launcher
        ({"teacher": {}, "student_train": {}, "pure_opd_pipeline_type": "agentic"}, "agentic"),
    ],
)
def test_pipeline_is_inferred_from_the_shape(keys: dict, pipeline: str) -> None:
    assert infer_pipeline(keys)[0] == pipeline


def test_pipeline_override_wins() -> None:
    _data, _, translation = read_config_source(TINY, ["pipeline_cls=rlvr"])
    assert translation is not None and translation.reason == "pipeline_cls given"


# --- the docs example with every RL option ---------------------------------------------------------------------
def test_total_rl_options_has_no_unknown_key() -> None:
    data, referenced = compose_file(TOTAL)
    translation = translate(data, referenced)
    assert translation.pipeline == "rlvr"
    assert [row.key for row in translation.rows if row.status == "unknown"] == []
    by_key = {row.key: row for row in translation.rows}
    assert by_key["dual_clip_loss"].status == "mapped"
    assert translation.data["dual_clip_loss"] == pytest.approx(1.4)  # 1 + 2 * pg_clip (0.2), as ROLL
    assert by_key["logging_dir"].status == "ignored" and by_key["logging_dir"].note
    assert by_key["actor_train.model_args.dtype"].status == "renamed"
    assert translation.data["actor_train"]["model_args"]["dtype"] == "bfloat16"
    assert translation.data["actor_train"]["model_args"]["gradient_checkpointing"] is True  # disable_...: false
    assert translation.data["actor_infer"]["strategy_args"]["strategy_config"]["engine_kwargs"] == {"block_size": 16}
    assert translation.data["actor_train"]["data_args"]["eval_file_name"] == ["data/math_benchmarks.jsonl"]
    # every key the file has is reported (the (x) rows are ROLL defaults written in)
    top_level = {row.key.split(".")[0] for row in translation.rows if not row.key.startswith("(")}
    assert top_level == set(data)


def test_total_rl_options_loads() -> None:
    config = load_config(TOTAL)
    assert config.pipeline_cls == "rlvr"
    assert config.advantage.estimator == "grpo" and config.advantage.whiten and config.advantage.clip == 2.0
    assert config.kl.use_loss and config.kl.loss_coef == 0.001 and config.kl.penalty == "kl"
    assert config.advantage.lam == 0.95  # ROLL's default, not roll's
    assert config.overlong.mask_truncated and config.sample_mask.difficulty
    assert (config.sample_mask.difficulty_low, config.sample_mask.difficulty_high) == (0.1, 0.95)
    assert config.actor_infer.generating_args.num_return_sequences == 8
    assert config.actor_infer.generating_args.max_new_tokens == 4096
    assert config.rewards["crossthinkqa"].reward_type == "crossthinkqa"
    assert config.rewards["crossthinkqa"].reward_kwargs == {"mode": "soft"}
    assert config.rewards["math_rule"].reward_type == "math"
    assert config.rewards["ifeval"].reward_type == "ifeval"
    assert config.rewards["ifeval"].reward_kwargs == {}  # ROLL's IFEval worker does not read reward_type
    # ROLL's code reward is all-or-nothing (roll's default would give partial credit)
    assert config.rewards["code_sandbox"].reward_type == "code"
    assert config.rewards["code_sandbox"].reward_kwargs == {"partial_credit": False}
    data_args = config.actor_train.data_args
    assert data_args is not None and data_args.optional_keys == ["test_cases", "case_type"]  # the code rows' own
    assert config.actor_train.model_args.model_name_or_path == "Qwen/Qwen2.5-7B"
    # ROLL's actor steps once per per_device_train_batch_size x gradient_accumulation_steps rows of each of its 16
    # data-parallel ranks: 1 x 32 x 16 = 512 rows, the whole step of 64 prompts x 8 answers here, and 4 steps with 8
    assert config.update.mini_batch_size == 512 and config.update.num_mini_batches(64 * 8) == 1
    config = load_config(TOTAL, ["actor_train.training_args.gradient_accumulation_steps=8"])
    assert config.update.mini_batch_size == 128 and config.update.num_mini_batches(64 * 8) == 4


@pytest.mark.parametrize(
    ("worker_cls", "given", "expected"),
    [
        (
            "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker",
            {"pg_variant": "topr", "topr_negative_weight": 0.5},
            "topr",
        ),
        ("roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker", {}, "vanilla"),  # ActorPGWorker's default
        (None, {"pg_variant": "cispo"}, "ppo"),  # ROLL's plain ActorWorker does not read pg_variant
    ],
)
def test_pg_variant_follows_rolls_actor_worker(worker_cls: str | None, given: dict, expected: str) -> None:
    data, referenced = compose_file(TOTAL)
    data["actor_train"].pop("worker_cls", None)
    if worker_cls:
        data["actor_train"]["worker_cls"] = worker_cls
    data["actor_train"].update(given)
    data["pg_variant"] = "kimi15"  # top level: only an interpolation source in ROLL
    translation = translate(data, referenced)
    assert translation.problems == []
    config = load_config(data)
    assert config.policy_loss.variant == expected
    settings = config.actor_settings()
    assert settings.pg_variant == expected
    if "topr_negative_weight" in given:
        assert settings.pg_params.topr_negative_weight == 0.5


def test_dpo_example_round_trips_through_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = FIXTURES / "roll" / "qwen2.5-3B_dpo_megatron.yaml"
    out = tmp_path / "converted.yaml"
    assert main(["convert", str(source), "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert "unknown" not in report.split("-- ")[-1]
    direct, converted = load_config(source), load_config(out)
    assert converted == direct
    assert direct.pipeline_cls == "dpo" and direct.loss.beta == 0.1 and direct.loss.loss_type == "sigmoid"
    assert direct.actor_train.data_args is not None and direct.actor_train.data_args.max_length == 512
    assert yaml.safe_load(out.read_text())["pipeline_cls"] == "dpo"
    # overrides of roll's own fields are in the output too (it printed the file's num_gpus_per_node: 8)
    overrides = ["num_gpus_per_node=0", "actor_train.device_mapping=null", "pretrain=tiny://nano"]
    assert main(["convert", str(source), *overrides, "-o", str(out)]) == 0
    written = yaml.safe_load(out.read_text())
    assert written["num_gpus_per_node"] == 0 and written["actor_train"]["device_mapping"] is None
    assert written["actor_train"]["model_args"]["model_name_or_path"] == "tiny://nano"
    assert load_config(out) == load_config(source, overrides)


# --- errors ---------------------------------------------------------------------------------------------------
def test_unknown_key_names_the_nearest_known_one(tmp_path: Path) -> None:
    data, _ = compose_file(TINY)
    data["ppo_epoch"] = 2
    data["actor_train"]["model_args"]["dtpye"] = "fp32"
    with pytest.raises(ConfigError) as info:
        load_config(data)
    text = str(info.value)
    assert "ppo_epoch: unknown: unknown key; did you mean 'ppo_epochs'?" in text
    assert "actor_train.model_args.dtpye: unknown: unknown key; did you mean 'dtype'?" in text


def test_deepspeed_names_the_replacement_and_unsupported_knobs_fail() -> None:
    data, _ = compose_file(TINY)
    data["actor_train"]["strategy_args"] = {"strategy_name": "deepspeed_train"}
    data["adv_estimator"] = "gigpo"
    data["reward_system_config"] = {"url": "http://rewards"}
    with pytest.raises(ConfigError) as info:
        load_config(data)
    text = str(info.value)
    assert "use strategy_name fsdp2_train" in text
    assert "estimator 'gigpo'" in text and "reward_system_config: unsupported" in text


def test_default_values_of_unsupported_knobs_are_ignored_with_a_reason() -> None:
    data, referenced = compose_file(TINY)
    data.update(
        {"async_generation_ratio": 0, "reward_system_config": {}, "reward_shift": True, "use_reward_scaling": 1}
    )
    data.update({"minibatch_data_iter_num": 2, "mask_type": "all", "dataset_filter": {"source": "x.jsonl"}})
    rows = {row.key: row for row in translate(data, referenced).rows}
    assert rows["async_generation_ratio"].status == "ignored" and "ROLL's default" in rows["reward_system_config"].note
    # keys ROLL itself drops or never reads: ignored whatever their value, saying so
    assert rows["reward_shift"].status == "ignored" and "drops it" in rows["reward_shift"].note
    assert rows["use_reward_scaling"].status == "ignored" and "no ROLL pipeline code" in rows["use_reward_scaling"].note
    data["rewards"]["math_rule"]["format_pattern"] = "^<answer>.*</answer>$"  # computed by ROLL's worker, then dropped
    rows = {row.key: row for row in translate(data, referenced).rows}
    assert rows["rewards.math_rule.format_pattern"].status == "ignored"
    # RLVRConfig fields only declared in ROLL (they were refused here as if ROLL did something with them)
    for key in ("minibatch_data_iter_num", "mask_type", "dataset_filter"):
        assert rows[key].status == "ignored" and "RLVRConfig that no ROLL pipeline code reads" in rows[key].note


def test_checkpoint_config_output_dir_is_where_checkpoints_go() -> None:
    """ROLL copies each checkpoint into ``checkpoint_config.output_dir`` (its file_system uploader) and deletes the
    local one; roll writes them there directly (it ignored the key, so a ROLL user found no checkpoint where the
    file said)."""
    data, referenced = compose_file(TINY)
    data["checkpoint_config"] = {
        "type": "file_system",
        "output_dir": "/shared/ckpt/tiny",
        "async_upload": True,
        "keep_local_file": False,
    }
    translation = translate(data, referenced)
    assert translation.data["checkpoint_dir"] == "/shared/ckpt/tiny"
    rows = {row.key: row for row in translation.rows}
    assert (rows["checkpoint_config.output_dir"].status, rows["checkpoint_config.output_dir"].target) == (
        "implemented-as",
        "checkpoint_dir",
    )
    assert rows["checkpoint_config.async_upload"].status == "ignored"
    assert "no second copy" in rows["checkpoint_config.keep_local_file"].note
    assert not translation.problems
    # ROLL's registry holds file_system only: another uploader fails there and here
    data["checkpoint_config"] = {"type": "oss", "output_dir": "oss://bucket/ckpt"}
    problems = translate(data, referenced).problems
    assert [(p.key, p.status) for p in problems] == [("checkpoint_config.type", "unsupported")]
    assert "file_system only" in problems[0].note
    data["checkpoint_config"] = {}  # ROLL's default: no upload, roll's own folder
    translation = translate(data, referenced)
    assert "checkpoint_dir" not in translation.data and not translation.problems


def test_model_config_kwargs_and_additional_target_become_the_roles_own() -> None:
    """ROLL's ``model_args.model_config_kwargs`` (read by its loaders' AutoConfig) and ``additional_target`` (peft's
    modules_to_save) were refused; they are now each role's own (roll-strategies' test_hf_infer.py, test_vllm.py and
    test_fsdp2.py check the backends apply them). ``adapter_name_or_path`` stays refused: ROLL reads it nowhere."""
    overrides = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    config = load_config(TINY, [f"actor_train.model_args.model_config_kwargs={overrides}"])
    assert config.actor_train.model_args.model_config_kwargs == overrides
    assert config.actor_infer.model_args.model_config_kwargs == {}
    data, referenced = compose_file(TINY)
    data["actor_train"]["model_args"].update(
        {"lora_rank": 8, "lora_target": "all-linear", "additional_target": "lm_head"}
    )
    translation = translate(data, referenced)
    assert translation.data["actor_train"]["model_args"]["lora_modules_to_save"] == "lm_head"
    assert load_config(translation.data).actor_train.model_args.lora_modules_to_save == ["lm_head"]
    data["actor_train"]["model_args"]["adapter_name_or_path"] = "lora/"
    (problem,) = translate(data, referenced).problems
    assert problem.key == "actor_train.model_args.adapter_name_or_path" and "no ROLL code reads it" in problem.note


def test_rolls_api_judge_is_the_llm_judge_api_reward() -> None:
    """ROLL's LLM judge in api mode (judge_model_type api, its default, with judge_api_url) was refused ("a remote
    judge API"); it is roll's llm_judge_api reward (rewards/test_judge_api.py runs it against a local server)."""
    data, referenced = compose_file(TINY)
    data["rewards"]["helpful"] = {
        "worker_cls": "roll.pipeline.rlvr.rewards.llm_judge_reward_worker.LLMJudgeRewardWorker",
        "judge_prompt": "Qwen2.5-7B-Instruct-RLVR-prompt",
        "judge_api_url": "https://judge.example/v1",
        "judge_api_key": "k",
        "judge_model_name": "qwen-judge",
        "model_args": {"model_name_or_path": "${reward_pretrain}"},
        "generating_args": {"max_new_tokens": 100},
        "tag_included": ["chat"],
        "world_size": 2,
    }
    translation = translate(data, referenced)
    assert not translation.problems
    domain = load_config(translation.data).rewards["helpful"]
    assert (domain.reward_type, domain.world_size) == ("llm_judge_api", 2)
    assert domain.reward_kwargs == {
        "api_url": "https://judge.example/v1",
        "api_key": "k",
        "model": "qwen-judge",
        "prompt_style": "ROLL/Qwen2.5-7B-Instruct-RLVR-prompt",
    }
    rows = {row.key: row for row in translation.rows}
    assert rows["rewards.helpful.generating_args"].status == "ignored"  # ROLL's API judge sends none of them
    # the inference mode keeps the judge model in the run; the API keys are then unused, as in ROLL
    data["rewards"]["helpful"]["judge_model_type"] = "inference"
    translation = translate(data, referenced)
    rows = {row.key: row for row in translation.rows}
    assert translation.data["rewards"]["helpful"]["reward_type"] == "llm_judge"
    assert rows["rewards.helpful.judge_api_url"].status == "ignored"


def test_validate_names_a_checkpoint_folder_that_cannot_be_made(tmp_path: Path, capsys) -> None:
    blocker = _write(tmp_path / "a-file", "")
    overrides = [f"output_dir={tmp_path}/out", f"checkpoint_config.output_dir={blocker}/ckpt"]
    assert main(["validate", str(TINY), *overrides]) == 2  # on the run's machine: an error (Ray is not started)
    err = capsys.readouterr().err
    assert f"checkpoint_dir {blocker}/ckpt: {blocker} is a file, not a folder" in err
    assert "set checkpoint_dir (checkpoint_config.output_dir in a ROLL file) to a folder this machine can write" in err
    assert main(["validate", "--no-ray", str(TINY), *overrides]) == 0  # away from it: a warning
    assert f"warning: checkpoint_dir {blocker}/ckpt: {blocker} is a file" in capsys.readouterr().out


# --- validate --no-ray and a run ------------------------------------------------------------------------------
def test_validate_no_ray_warns_on_unavailable_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = FIXTURES / "roll" / "qwen2.5-3B_dpo_megatron.yaml"
    assert main(["validate", "--no-ray", str(source)]) == 0
    out = capsys.readouterr().out
    assert "ROLL config, run as pipeline dpo" in out
    # A hub id is fetched at run time; the megatron backend and the data file are not on this machine: warnings.
    assert "actor_train.model_args.model_name_or_path: Qwen/Qwen2.5-3B-Instruct is downloaded at run time" in out
    assert "warning: strategy 'megatron_train' (actor_train.strategy_args.strategy_name) needs an optional" in out
    assert "warning: actor_train.data_args.file_name lists 'data/comparison_gpt4_data_zh.json'" in out


def test_tiny_roll_format_file_translates_knobs(tmp_path: Path) -> None:
    config = load_config(TINY)
    assert config.advantage.estimator == "reinforce"
    assert (config.advantage.norm_mean_type, config.advantage.norm_std_type) == ("group", None)
    assert config.policy_loss.dual_clip == pytest.approx(1.4)
    assert config.actor_train.model_args.model_name_or_path == "tiny://nano?seed=0"
    assert config.actor_train.model_args.dtype == "float32"
    assert config.rollout.batch_size == 2 and config.group_size == 2


@pytest.mark.pipeline_run
@pytest.mark.slow
def test_roll_format_file_runs_one_step(tmp_path: Path, ray_env: None) -> None:
    from roll.pipelines.launcher import run_config
    from roll.pipelines.tracking import read_metrics

    overrides = [f"output_dir={tmp_path}", f"checkpoint_config.output_dir={tmp_path}/ckpt/${{exp_name}}"]
    config = load_config(TINY, [*overrides, "actor_train.name=compat-train", "actor_infer.name=compat-infer"])
    run_config(config)
    assert (tmp_path / "ckpt" / config.exp_name / "latest").read_text() == "step-00000001"  # ROLL's checkpoint folder
    assert not (tmp_path / "checkpoints").exists()
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert metrics[-1]["step"] == 1
    assert metrics[-1]["rollout/samples"] == 4
    assert "train/skipped_no_tokens" not in metrics[-1] and metrics[-1]["actor/grad_norm"] >= 0  # it trained


# --- distill and on-policy distillation files -----------------------------------------------------------------
DISTILL = """
hydra: {run: {dir: .}}
exp_name: kd
student_pretrain: tiny://nano
teacher_pretrain: tiny://nano
logits_topk: 8
distill_loss_weight: 0.85
kd_objective: forward_kl
logits_transfer_backend: nccl-only
question_key: question_zh
answer_key: answer_zh
student:
  model_args: {dtype: fp32}
  data_args: {template: qwen2_5, file_name: [data/train.jsonl], preprocessing_num_workers: 4}
  strategy_args: {strategy_name: fsdp2_train}
  device_mapping: list(range(0,2))
teacher:
  data_args: {template: qwen2_5}
  strategy_args: {strategy_name: hf_infer}
  device_mapping: list(range(0,2))
"""


def test_distill_file_maps_rolls_keys(tmp_path: Path) -> None:
    path = _write(tmp_path / "distill.yaml", DISTILL)
    data, referenced = compose_file(path)
    translation = translate(data, referenced)
    assert translation.pipeline == "distill" and translation.problems == []
    config = load_config(path)
    assert config.student.model_args.model_name_or_path == "tiny://nano"
    assert config.teacher.model_args.model_name_or_path == "tiny://nano"
    args = config.student.data_args
    assert (args.prompt_key, args.response_key, args.max_length) == ("question_zh", "answer_zh", 2048)
    assert config.distill.logits_topk == 8 and config.distill.distill_loss_weight == 0.85
    assert config.num_nodes == 1 and config.num_gpus_per_node == 8  # derived from device_mapping, as ROLL
    rows = {row.key: row for row in translation.rows}
    assert rows["logits_transfer_backend"].status == "ignored"


def test_onpolicy_distill_file_is_pure_opd_rlvr() -> None:
    data, referenced = compose_file(TINY)
    data["student_train"] = data.pop("actor_train")
    data["student_infer"] = data.pop("actor_infer")
    data["teacher"] = {
        "model_args": {"model_name_or_path": "tiny://nano"},
        "strategy_args": {"strategy_name": "hf_infer"},
    }
    translation = translate(data, referenced)
    assert translation.pipeline == "rlvr" and translation.problems == []
    config = load_config(data)
    assert config.opd.pure and config.teacher is not None
    # ROLL's pure OPD scores the training rollouts (logged, not trained on): written in
    assert config.opd.score_rollouts
    # ROLL's multi-teacher dict: renamed to roll's teachers, one role each, routed by tag_included
    data["teacher"] = {"t1": dict(data["teacher"]), "t2": {**data["teacher"], "tag_included": ["math"]}}
    translation = translate(data, referenced)
    assert translation.problems == []
    assert [(row.status, row.target) for row in translation.rows if row.key == "teacher"] == [("renamed", "teachers")]
    assert any(row.key == "teachers.t2.tag_included" and row.status == "kept" for row in translation.rows)
    config = load_config(data)
    assert config.teacher is None and sorted(config.teacher_roles()) == ["t1", "t2"]
    assert config.teacher_roles()["t2"].tag_included == ["math"]


def test_batching_keys_become_the_roles_batching_settings() -> None:
    data, referenced = compose_file(TINY)
    data["actor_train"].update(
        {
            "use_dynamic_batching_in_train": True,
            "max_tokens_per_microbatch_in_train": 512,
            "sequence_length_round_in_train": 8,
            "use_dynamic_batching_in_infer": False,
            "max_tokens_per_microbatch_in_infer": 0,
            "use_sequence_packing": False,
            "use_remove_padding": True,
            "sequence_packing_args": {"algorithm": "load_balance"},
        }
    )
    translation = translate(data, referenced)
    assert translation.data["actor_train"]["batching"] == {
        "dynamic_batching_in_train": True,
        "max_tokens_per_microbatch_in_train": 512,
        "sequence_length_round_in_train": 8,
        "dynamic_batching_in_infer": False,
        "sequence_packing": True,  # use_remove_padding turns packing on whatever use_sequence_packing says
    }
    rows = {row.key: row for row in translation.rows}
    assert rows["actor_train.use_dynamic_batching_in_train"].status == "renamed"
    assert rows["actor_train.max_tokens_per_microbatch_in_infer"].status == "ignored"
    assert rows["actor_train.sequence_packing_args"].status == "ignored"
    assert not translation.problems


# --- Ulysses sequence parallelism ------------------------------------------------------------------------------
def _ulysses_file(actor_size: int, world: int) -> dict:
    data, _ = compose_file(TINY)
    data["actor_train"]["model_args"]["ulysses_size"] = actor_size
    data["actor_train"]["world_size"] = world
    data["actor_infer"]["model_args"]["ulysses_size"] = 2  # hf_infer: ROLL reads it in its FSDP2 strategy only
    return data


def test_ulysses_size_maps_to_the_fsdp2_strategy_and_is_validated() -> None:
    from roll.pipelines.validate import validate_deployment

    data = _ulysses_file(2, 2)
    translation = translate(data, set())
    rows = {row.key: row for row in translation.rows}
    assert translation.problems == []
    assert rows["actor_train.model_args.ulysses_size"].status == "renamed"
    assert (
        rows["actor_train.model_args.ulysses_size"].target == "actor_train.strategy_args.strategy_config.ulysses_size"
    )
    assert rows["actor_infer.model_args.ulysses_size"].status == "ignored"
    config = load_config(data)
    assert config.actor_train.strategy_args.strategy_config["ulysses_size"] == 2
    assert "ulysses_size" not in config.actor_infer.strategy_args.strategy_config
    validate_deployment(config, check_ray=False)  # tiny://nano: 2 heads, 1 kv head (repeated) over 2 ranks

    with pytest.raises(ConfigError, match="ulysses_size=2 must divide actor_train's world size 3"):
        validate_deployment(load_config(_ulysses_file(2, 3)), check_ray=False)
    with pytest.raises(ConfigError, match="num_attention_heads=2 is not divisible by ulysses_size=4"):
        validate_deployment(load_config(_ulysses_file(4, 4)), check_ray=False)


def test_ulysses_override_named_by_the_error_wins_over_the_files_model_args(tmp_path: Path) -> None:
    from roll.pipelines.validate import validate_deployment

    path = tmp_path / "roll.yaml"
    path.write_text(yaml.safe_dump(_ulysses_file(2, 1)))
    where = "actor_train.strategy_args.strategy_config.ulysses_size"
    with pytest.raises(ConfigError, match=rf"set {where} to a divisor of 1, or set actor_train.world_size"):
        validate_deployment(load_config(str(path)), check_ray=False)

    _, _, translation = read_config_source(str(path), [f"{where}=1"])
    assert translation is not None
    row = {row.key: row for row in translation.rows}["actor_train.model_args.ulysses_size"]
    assert (row.status, row.note) == ("ignored", f"{where}=1 is given and wins")
    config = load_config(str(path), [f"{where}=1"])
    assert config.actor_train.strategy_args.strategy_config["ulysses_size"] == 1
    validate_deployment(config, check_ray=False)
