"""Bad input table: malformed configs and data files each give one clear error, and nothing starts.

Every case goes through the real `roll run` entry point in-process. The error must name the field, file or
row (and usually the fix); Ray must not have been started; the output directory must be untouched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import ray
import yaml

from roll.pipelines.cli import EXIT_CONFIG, main


def _snapshot(folder: Path) -> dict[str, str]:
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    data.mkdir()
    good = [{"prompt": f"What is {i} + 1?", "response": f"The answer is {i + 1}."} for i in range(8)]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in good))
    (data / "bad_json.jsonl").write_text(json.dumps(good[0]) + "\n" + "{not json\n")
    (data / "missing_key.jsonl").write_text(json.dumps(good[0]) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    (data / "wrong_type.jsonl").write_text(json.dumps({"prompt": 3, "response": "y"}) + "\n")
    (data / "empty.jsonl").write_text("")
    (data / "pairs.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n")
    ckpt = tmp_path / "previous" / "checkpoints" / "step-00000005"
    ckpt.mkdir(parents=True)
    (ckpt / "pipeline_state.json").write_text('{"step": 5}')
    return tmp_path


def sft_config(root: Path) -> dict:
    return {
        "pipeline_cls": "sft",
        "output_dir": str(root / "out"),
        "max_steps": 2,
        "sft_train": {
            "model_args": {"model_name_or_path": "tiny://nano?seed=0", "dtype": "float32"},
            "data_args": {"file_name": str(root / "data" / "train.jsonl"), "max_length": 64},
            "strategy_args": {"strategy_name": "fsdp2_train"},
        },
    }


def _set(config: dict, dotted: str, value) -> dict:
    node = config
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return config


_DELETE = object()

# (case id, edits to the SFT config or raw YAML text, CLI overrides, expected message fragments)
CASES = [
    ("typo-top-level", {"max_step": 3}, [], ["max_step: unknown field", "did you mean 'max_steps'"]),
    ("wrong-type", {"max_steps": "ten"}, [], ["max_steps: Input should be a valid integer", "'ten'"]),
    ("negative", {"save_steps": -1}, [], ["save_steps: Input should be greater than or equal to 0"]),
    (
        "typo-nested",
        {"sft_train.training_args.learning_rat": 0.1},
        [],
        ["sft_train.training_args.learning_rat", "'learning_rate'"],
    ),
    ("unknown-pipeline", {"pipeline_cls": "sfft"}, [], ["unknown pipeline_cls 'sfft'", "sft"]),
    ("missing-pipeline", {"pipeline_cls": _DELETE, "sft_train": _DELETE}, [], ["cannot tell which pipeline"]),
    (
        "unknown-backend",
        {"sft_train.strategy_args.strategy_name": "fsdp3"},
        [],
        ["sft_train", "unknown strategy 'fsdp3'", "fsdp2_train"],
    ),
    (
        "bad-backend-setting",
        {"sft_train.strategy_args.strategy_config": {"fsdp_sise": 2}},
        [],
        ["strategy_config.fsdp_sise: unknown field"],
    ),
    (
        "device-mapping",
        {"sft_train.device_mapping": [0, 1, 2], "sft_train.num_gpus_per_worker": 2},
        [],
        ["not a multiple of num_gpus_per_worker=2"],
    ),
    ("no-max-length", {"sft_train.data_args.max_length": _DELETE}, [], ["sft_train.data_args.max_length is required"]),
    (
        "missing-model",
        {"sft_train.model_args.model_name_or_path": "/nonexistent/model"},
        [],
        ["sft_train.model_args.model_name_or_path", "does not exist"],
    ),
    (
        "missing-data-file",
        {"sft_train.data_args.file_name": "{root}/data/nope.jsonl"},
        [],
        ["nope.jsonl", "data_args.file_name"],
    ),
    ("bad-json-line", {"sft_train.data_args.file_name": "{root}/data/bad_json.jsonl"}, [], ["bad_json.jsonl", "row 1"]),
    (
        "missing-key",
        {"sft_train.data_args.file_name": "{root}/data/missing_key.jsonl"},
        [],
        ["missing_key.jsonl row 1", "'response'"],
    ),
    (
        "wrong-row-type",
        {"sft_train.data_args.file_name": "{root}/data/wrong_type.jsonl"},
        [],
        ["wrong_type.jsonl row 0", "'prompt'"],
    ),
    ("empty-data", {"sft_train.data_args.file_name": "{root}/data/empty.jsonl"}, [], ["empty.jsonl"]),
    ("bad-override", {}, ["max_steps"], ["override 'max_steps' must look like field.path=value"]),
    ("override-into-scalar", {}, ["max_steps.x=1"], ["'max_steps' is not a section"]),
    (
        "bad-resume-path",
        {"resume_from_checkpoint": "{root}/nowhere"},
        [],
        ["resume_from_checkpoint", "not a complete checkpoint"],
    ),
    (
        "would-overwrite",
        {"output_dir": "{root}/previous"},
        [],
        ["already holds checkpoints", "resume_from_checkpoint=auto"],
    ),
    (
        "would-overwrite-checkpoint-dir",
        {"checkpoint_dir": "{root}/previous/checkpoints"},
        [],
        [
            "checkpoint_dir {root}/previous/checkpoints already holds checkpoints",
            "choose another exp_name/checkpoint_dir",
        ],
    ),
    (
        "checkpoint-dir-under-a-file",
        {"checkpoint_dir": "{root}/data/empty.jsonl/ckpt"},
        [],
        ["checkpoint_dir {root}/data/empty.jsonl/ckpt cannot be made", "checkpoint_config.output_dir in a ROLL file"],
    ),
    ("dpo-odd-micro-batch", "dpo", [], ["per_device_train_batch_size counts sequences and must be even"]),
    ("yaml-not-a-mapping", "- just\n- a list\n", [], ["must contain a mapping of config fields"]),
    ("yaml-syntax", "pipeline_cls: sft\n  bad: [indent\n", [], ["is not valid YAML"]),
]


def _materialize(case, root: Path) -> str:
    edits = case[1]
    path = root / "config.yaml"
    if edits == "dpo":
        config = {
            "pipeline_cls": "dpo",
            "output_dir": str(root / "out"),
            "actor_train": {
                "model_args": {"model_name_or_path": "tiny://nano?seed=0"},
                "training_args": {"per_device_train_batch_size": 3},
                "data_args": {"file_name": str(root / "data" / "pairs.jsonl"), "max_length": 32},
                "strategy_args": {"strategy_name": "fsdp2_train"},
            },
            "reference": {
                "model_args": {"model_name_or_path": "tiny://nano?seed=0"},
                "strategy_args": {"strategy_name": "hf_infer"},
            },
        }
        path.write_text(yaml.safe_dump(config))
    elif isinstance(edits, str):
        path.write_text(edits)
    else:
        config = sft_config(root)
        for key, value in edits.items():
            if isinstance(value, str):
                value = value.replace("{root}", str(root))
            _set(config, key, value)
        path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_error_and_starts_nothing(case, workspace, capsys):
    assert len(CASES) >= 15
    config_path = _materialize(case, workspace)
    before_out, before_prev = _snapshot(workspace / "out"), _snapshot(workspace / "previous")
    code = main(["run", config_path, *case[2]])
    error = capsys.readouterr().err
    assert code == EXIT_CONFIG, error
    assert sum(line.startswith("error: ") for line in error.splitlines()) == 1, error
    for fragment in case[3]:
        fragment = fragment.replace("{root}", str(workspace))
        assert fragment in error, f"{fragment!r} not in:\n{error}"
    assert not ray.is_initialized()
    assert _snapshot(workspace / "out") == before_out == {}
    assert _snapshot(workspace / "previous") == before_prev


def test_unknown_recipe_lists_the_recipes(capsys):
    assert main(["run", "no-such-recipe"]) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert "neither a config file nor a built-in recipe" in error and "sft-tiny" in error
