"""Configs accept ROLL's keys (as in examples/config/traj_envs.yaml) and reject mistakes with clear messages."""

from __future__ import annotations

import pytest
import yaml

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig, RewardNormalizationConfig
from roll.runtime import ConfigError

# The FrozenLake and Sokoban entries of ROLL's traj_envs.yaml after interpolation, and its env managers.
ROLL_YAML = """
custom_envs:
  SimpleSokoban:
    env_type: sokoban
    max_steps: 10
    max_tokens_per_step: 64
    env_manager_cls: roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager
    agent_runner_cls: null
    use_thread_lock: true
    agent_system_template: You're a helpful assistant. You are a good game player.
    agent_template: "Turn {turn_idx}:\\nObservation:\\n{observation}\\nYou have {actions_left} actions left.
      Max response length: {max_response_length} words (tokens).\\nDecide the next action:"
    env_config:
      action_pattern: <answer>(.*?)</answer>
      max_steps: 10
      format_penalty: -0.15
      dim_room: [6, 6]
      num_boxes: 1
      grid_lookup: {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
  FrozenLakeThink:
    env_type: frozen_lake
    max_steps: 10
    max_tokens_per_step: 64
    env_manager_cls: roll.pipeline.agentic.env_manager.step_env_manager.StepEnvManager
    history_length: 5
    env_config:
      action_pattern: <think>(.*?)</think>\\s*<answer>(.*?)</answer>
      max_steps: 10
      format_penalty: -0.01
      is_slippery: false
train_env_manager:
  max_env_num_per_worker: 16
  num_env_groups: 128
  group_size: 8
  tags: [SimpleSokoban]
  num_groups_partition: [128]
  generating_args: {max_new_tokens: 128, top_p: 0.99, top_k: 100, temperature: 0.99, num_return_sequences: 1}
val_env_manager:
  max_env_num_per_worker: 32
  num_env_groups: 1024
  group_size: 1
  tags: [SimpleSokoban, FrozenLakeThink]
  num_groups_partition: [512, 512]
reward_normalization:
  grouping: traj_group_id
  method: mean_std
"""


def test_roll_yaml_validates() -> None:
    raw = yaml.safe_load(ROLL_YAML)
    envs = {tag: CustomEnvConfig.model_validate(entry) for tag, entry in raw["custom_envs"].items()}
    assert envs["SimpleSokoban"].env_manager_cls == "traj" and envs["FrozenLakeThink"].env_manager_cls == "step"
    assert envs["SimpleSokoban"].env_config["grid_lookup"][0] == "W"
    train = EnvManagerConfig.model_validate(raw["train_env_manager"])
    assert (train.world_size, train.num_envs, train.generating_args.top_k) == (64, 1024, 100)
    val = EnvManagerConfig.model_validate({**raw["val_env_manager"], "name": "val_env"})
    assert val.world_size == 32
    # The envs build from ROLL's env_config keys and play with their patterns and vocab.
    from roll.agentic.pool import build_env

    sokoban = build_env(envs["SimpleSokoban"])
    observation, _ = sokoban.reset(seed=0)
    assert set(observation.replace("\n", "")) <= set("W.GCBA@")
    lake = build_env(envs["FrozenLakeThink"])
    lake.reset(seed=0)
    assert lake.step("<answer>Up</answer>")[4]["action_is_valid"] is False  # the think block is required
    assert lake.step("<think>go</think><answer>Up</answer>")[4]["action_is_valid"] is True
    norm = RewardNormalizationConfig.model_validate(raw["reward_normalization"])
    assert (norm.norm_mean_type, norm.norm_std_type) == ("group", "group")


def test_reward_normalization_explicit_types_win_and_aliases() -> None:
    norm = RewardNormalizationConfig(grouping="tags", method="mean_std", norm_std_type=None, norm_mean_type="batch")
    assert norm.grouping == "tag" and norm.norm_mean_type == "batch" and norm.norm_std_type == "group"
    assert RewardNormalizationConfig().norm_mean_type is None  # identity by default
    with pytest.raises(ConfigError, match="method"):
        RewardNormalizationConfig(method="zscore")


def test_mistakes_are_reported() -> None:
    with pytest.raises(ConfigError, match="roll runs ROLL's GEMRunner .* only; ToolCallRunner and the ROCK"):
        CustomEnvConfig(env_type="sokoban", agent_runner_cls="roll.pipeline.agentic.agent_runner.GEMRunner")
    proxy = "roll.pipeline.agentic.env_manager.proxy_env_manager.ProxyEnvManager"
    with pytest.raises(ConfigError, match="drives an agent runner: roll supports it with agent_runner_cls"):
        CustomEnvConfig(env_type="sokoban", env_manager_cls=proxy)
    gem = CustomEnvConfig(
        env_type="sokoban",
        env_manager_cls=proxy,
        agent_runner_cls="roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner",
    )
    assert (gem.env_manager_cls, gem.env_instruction_in_system) == ("traj", True)
    native = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"
    assert CustomEnvConfig(env_type="sokoban_native_env", env_manager_cls=native).env_manager_cls == "agent_native"
    with pytest.raises(ConfigError, match=r"env_config.agent_config: Field required"):
        CustomEnvConfig(env_type="rock_tb_native_env", env_manager_cls=native)
    with pytest.raises(ConfigError, match=r"'atropos_env' answers with chat message lists, .* traj manager cannot"):
        CustomEnvConfig(env_type="atropos_env", env_config={"atropos_env_path": "m:E"})
    assert CustomEnvConfig(env_type="atropos_env", env_manager_cls=native).env_manager_cls == "agent_native"
    with pytest.raises(ConfigError, match=r"fields \['turn_idx'\] that the step manager does not fill"):
        CustomEnvConfig(env_type="sokoban", env_manager_cls="step", agent_template="Turn {turn_idx}")
    with pytest.raises(ConfigError, match="show_env_instruction is false but agent_template names"):
        CustomEnvConfig(env_type="sokoban", env_manager_cls="step", show_env_instruction=False)
    with pytest.raises(ConfigError, match="show_env_instruction is false but env_instruction_in_system"):
        CustomEnvConfig(env_type="sokoban", env_instruction_in_system=True, show_env_instruction=False)
    assert not CustomEnvConfig(
        env_type="sokoban", env_manager_cls="step", agent_template="{current_observation}", show_env_instruction=False
    ).show_env_instruction
    with pytest.raises(ConfigError, match="max_stepz"):
        CustomEnvConfig(env_type="sokoban", max_stepz=3)
    with pytest.raises(ConfigError, match="tags is empty"):
        EnvManagerConfig()
    with pytest.raises(ConfigError, match="num_return_sequences must be 1"):
        EnvManagerConfig(tags=["a"], generating_args={"num_return_sequences": 4})


def test_default_templates_follow_the_manager() -> None:
    assert "{observation}" in CustomEnvConfig(env_type="x").agent_template
    assert "{history}" in CustomEnvConfig(env_type="x", env_manager_cls="step").agent_template
