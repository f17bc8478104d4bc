"""``rollout.dump`` files: one row per sample and every episode; a step without samples leaves no rows file."""

from __future__ import annotations

import json
from pathlib import Path

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.pipeline.rollouts import write_rollout
from roll.agentic.policy import MockPolicyClient, ScriptedPolicy
from roll.agentic.scheduler import RolloutBatch, RolloutScheduler
from roll.strategies import GenerationConfig


def test_a_step_without_samples_leaves_no_rows_of_an_earlier_run(tokenizer, tmp_path: Path) -> None:
    """A resumed run (or a rerun in the same output_dir) whose step kept no group wrote that step's episodes but
    left the interrupted run's ``step-N.jsonl`` beside them, rows that this run never trained on."""
    config = EnvManagerConfig(num_env_groups=2, group_size=2, tags=["Lake"])
    client = MockPolicyClient(tokenizer, ScriptedPolicy(lambda prompt: "<answer>Up</answer>"))
    scheduler = RolloutScheduler.local(
        config,
        {"Lake": CustomEnvConfig(env_type="frozen_lake", max_steps=2)},
        tokenizer,
        client,
        generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=1024,
    )
    try:
        out = scheduler.get_batch(4)
    finally:
        scheduler.close()
    write_rollout(tmp_path, "step-000003", out, tokenizer)  # the interrupted run's step 3
    rows = [json.loads(line) for line in (tmp_path / "step-000003.jsonl").open()]
    assert len(rows) == 4 and all(row["prompt"] and row["response"] for row in rows)

    write_rollout(tmp_path, "step-000003", RolloutBatch(None, out.episodes), tokenizer)  # the resumed run's
    assert not (tmp_path / "step-000003.jsonl").exists()
    episodes = [json.loads(line) for line in (tmp_path / "step-000003-episodes.jsonl").open()]
    assert len(episodes) == 4
