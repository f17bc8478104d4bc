"""ROLL's agentic example files' top-level keys through roll's ROLL loader: values ROLL acts on reach the agentic
config (not dropped as the RLVR meaning of the same key)."""

from __future__ import annotations

from pathlib import Path

from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config

# trimmed from ROLL's examples/qwen2.5-0.5B-agentic/agent_val_frozen_lake.yaml
AGENTIC = """
exp_name: lake
rollout_batch_size: 8
val_batch_size: 8
sequence_length: 8192
adv_estimator: grpo
actor_train:
  model_args: {model_name_or_path: tiny://nano}
  strategy_args: {strategy_name: fsdp2_train}
actor_infer:
  model_args: {model_name_or_path: tiny://nano}
  strategy_args: {strategy_name: hf_infer}
train_env_manager:
  num_env_groups: 2
  group_size: 4
  tags: [Lake]
  generating_args: {max_new_tokens: 16}
custom_envs:
  Lake: {env_type: frozen_lake, env_manager_cls: traj}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent_val_lake.yaml"
    path.write_text(text)
    return path


def test_sequence_length_is_the_agentic_episode_limit(tmp_path: Path) -> None:
    # ROLL's env managers stop an episode whose next turn would pass sequence_length; it used to be dropped as
    # "RLVR lengths are ..." and episodes were cut at roll's default 1024 instead of the file's 8192.
    path = _write(tmp_path, AGENTIC)
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert (rows["sequence_length"].status, rows["sequence_length"].target) == ("mapped", "rollout.sequence_length")
    assert load_config(path).rollout.sequence_length == 8192
    assert load_config(path, ["sequence_length=2048"]).rollout.sequence_length == 2048
