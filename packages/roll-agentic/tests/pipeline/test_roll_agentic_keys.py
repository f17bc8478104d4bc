"""ROLL's agentic example files' top-level keys through roll's ROLL loader: values ROLL acts on reach the agentic
config (not dropped as the RLVR meaning of the same key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config
from roll.runtime import ConfigError

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


def test_rolls_agentic_defaults_are_written_in(tmp_path: Path) -> None:
    # ROLL's agentic examples leave loss_agg_mode out: ROLL's actor then aggregates seq-mean-token-mean, and roll's
    # default (token-mean) weighed long episodes more. A file without reward_normalization is not normalized in ROLL.
    text = AGENTIC.replace("rollout_batch_size: 8\nval_batch_size: 8\n", "")
    path = _write(tmp_path, text + "use_kl_loss: true\nreference:\n  model_args: {model_name_or_path: tiny://nano}\n")
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert rows["(loss_agg_mode)"].status == "implemented-as"
    config = load_config(path)
    assert config.policy_loss.loss_agg_mode == "seq-mean-token-mean"
    assert (config.rollout.batch_size, config.rollout.val_batch_size) == (128, 128)
    assert (config.kl.use_loss, config.kl.loss_coef, config.needs_reference) == (True, 0.0, False)
    norm = config.reward_normalization
    assert (norm.grouping, norm.method, norm.norm_mean_type, norm.norm_std_type) == ("batch", "identity", None, None)
    assert config.advantage.estimator == "grpo"  # the file's own keys win


def test_a_file_without_adv_estimator_gets_rolls_gae(tmp_path: Path) -> None:
    path = _write(tmp_path, AGENTIC.replace("adv_estimator: grpo\n", ""))
    data = translate(*compose_file(path)).data
    assert (data["adv_estimator"], data["lambd"]) == ("gae", 0.95)


def test_the_files_values_win_over_rolls_defaults(tmp_path: Path) -> None:
    extra = "loss_agg_mode: token-mean\nreward_normalization: {grouping: traj_group_id, method: mean_std}\n"
    config = load_config(_write(tmp_path, AGENTIC + extra))
    assert config.policy_loss.loss_agg_mode == "token-mean"
    assert (config.rollout.batch_size, config.rollout.val_batch_size) == (8, 8)
    assert (config.reward_normalization.grouping, config.reward_normalization.method) == ("traj_group_id", "mean_std")


def test_a_files_partial_reward_normalization_gets_rolls_defaults_for_the_rest(tmp_path: Path) -> None:
    # ROLL's field defaults (batch, identity) fill what a ROLL file's section leaves out, not roll's grpo defaults
    config = load_config(_write(tmp_path, AGENTIC + "reward_normalization: {method: mean_std}\n"))
    assert (config.reward_normalization.grouping, config.reward_normalization.method) == ("batch", "mean_std")
    config = load_config(_write(tmp_path, AGENTIC + "reward_normalization: {grouping: tags}\n"))
    assert (config.reward_normalization.grouping, config.reward_normalization.method) == ("tag", "identity")


def test_rolls_env_defaults_are_written_into_its_env_configs(tmp_path: Path) -> None:
    # ROLL's traj_envs.yaml SimpleSokoban leaves search_depth out (ROLL: 300 reverse moves; roll's env: 30); a
    # frozen_lake without is_slippery is slippery in ROLL and not in roll's env.
    sokoban = "  Box: {env_type: sokoban, env_config: {dim_room: [6, 6], num_boxes: 1}}\n"
    path = _write(tmp_path, AGENTIC + sokoban)
    config = load_config(path)
    assert config.custom_envs["Lake"].env_config == {"is_slippery": True}
    assert config.custom_envs["Box"].env_config == {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 300}
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert "search_depth" in rows["(custom_envs.Box.env_config)"].note
    given = AGENTIC.replace("env_type: frozen_lake,", "env_type: frozen_lake, env_config: {is_slippery: false},")
    assert load_config(_write(tmp_path, given)).custom_envs["Lake"].env_config == {"is_slippery": False}


def test_rolls_agentic_config_fields_have_a_status_not_unknown_key(tmp_path: Path) -> None:
    # Fields of ROLL's AgenticConfig / EnvManagerConfig / RewardNormalizationConfig used to fail as "unknown key;
    # did you mean 'add_len_reward'?" (use_token_reward) or "unknown field" (group_size_redundancy, now a field).
    extra = (
        "use_token_reward: false\ndirty_data_mask: false\nopen_feedback_turn: false\nexp_mode: train\n"
        "partial_gpu_mode: true\nenv_monitor: {enable: true, hung_timeout: 3600}\n"
        "reward_normalization: {grouping: traj_group_id, method: mean, global_scale_factor: 2.0}\n"
    )
    text = AGENTIC.replace(
        "  group_size: 4\n", "  group_size: 4\n  group_size_redundancy: 0\n  llm_proxy: {proxy_type: policy}\n"
    )
    path = _write(tmp_path, text + extra)
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    for key in ("use_token_reward", "partial_gpu_mode", "env_monitor", "reward_normalization.global_scale_factor"):
        assert rows[key].status == "ignored", key
    assert rows["train_env_manager.llm_proxy"].status == "kept"
    assert load_config(path).reward_normalization.method == "mean"


def test_rolls_redundant_episodes_are_honoured(tmp_path: Path) -> None:
    # ROLL's group_size_redundancy was refused (unsupported); roll's env manager now plays it (test_scheduler.py).
    text = AGENTIC.replace("  group_size: 4\n", "  group_size: 4\n  group_size_redundancy: 2\n")
    manager = load_config(_write(tmp_path, text)).train_env_manager
    assert (manager.group_size, manager.group_size_redundancy, manager.envs_per_group) == (4, 2, 6)
    assert manager.num_envs == manager.num_env_groups * 6


def test_rolls_random_proxy_plays_validation_and_is_refused_for_training(tmp_path: Path) -> None:
    # ROLL's llm_proxy {proxy_type: random} (its proxy_config unread): the env's random actions, a baseline read.
    val = (
        "val_env_manager:\n  num_env_groups: 2\n  group_size: 4\n  tags: [Lake]\n"
        "  llm_proxy: {proxy_type: random, proxy_config: {unused: 1}}\n"
    )
    path = _write(tmp_path, AGENTIC + val)
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert (
        rows["val_env_manager.llm_proxy"].status == "kept"
        and "proxy_config dropped" in rows["val_env_manager.llm_proxy"].note
    )
    config = load_config(path)
    assert (config.val_env_manager.llm_proxy.proxy_type, config.train_env_manager.llm_proxy.proxy_type) == (
        "random",
        "policy",
    )
    text = AGENTIC.replace("  group_size: 4\n", "  group_size: 4\n  llm_proxy: {proxy_type: random}\n")
    with pytest.raises(ConfigError, match="train_env_manager.llm_proxy.proxy_type is random"):
        load_config(_write(tmp_path, text))
    # ROLL's openai proxy settings are roll's too; ROLL's proxy talks chat with thinking off: both written in
    served = "{proxy_type: openai, proxy_config: {base_url: 'http://localhost:8000/v1', model_name: m, timeout: 5}}"
    path = _write(tmp_path, AGENTIC + val.replace("{proxy_type: random, proxy_config: {unused: 1}}", served))
    config = load_config(path)
    assert config.val_env_manager.llm_proxy.proxy_config == {
        "base_url": "http://localhost:8000/v1",
        "model_name": "m",
        "timeout": 5,
        "api": "chat",
        "enable_thinking": False,
    }
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert "'api': 'chat'" in rows["(val_env_manager.llm_proxy.proxy_config)"].note
    # a file that names its api keeps it, and one on roll's completions api is given no chat-only key (roll refuses
    # enable_thinking there: it would not be read)
    path = _write(tmp_path, AGENTIC + val.replace(
        "{proxy_type: random, proxy_config: {unused: 1}}", served.replace("timeout: 5", "api: completions")
    ))  # fmt: skip
    proxy_config = load_config(path).val_env_manager.llm_proxy.proxy_config
    assert proxy_config == {"base_url": "http://localhost:8000/v1", "model_name": "m", "api": "completions"}


def test_rolls_precedence_between_manager_and_actor_infer_sampling(tmp_path: Path) -> None:
    # ROLL: without actor_infer.generating_args the training manager's become actor_infer's (a manager without its
    # own then samples with them); with them, both managers sample with actor_infer's and their own are dropped.
    managers = AGENTIC.replace("generating_args: {max_new_tokens: 16}", "generating_args: {temperature: 0.7}")
    managers += "val_env_manager:\n  num_env_groups: 8\n  group_size: 1\n  tags: [Lake]\n"
    path = _write(tmp_path, managers)
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert rows["train_env_manager.generating_args"].target == "actor_infer.generating_args"
    config = load_config(path)
    assert config.actor_infer.generating_args.temperature == 0.7
    assert config.val_env_manager.turn_generation(config.actor_infer.generating_args).temperature == 0.7
    assert config.sampling_temperature == 0.7

    both = managers.replace(
        "strategy_args: {strategy_name: hf_infer}",
        "strategy_args: {strategy_name: hf_infer}\n  generating_args: {temperature: 0.9}",
    ).replace(
        "  group_size: 1\n  tags: [Lake]\n", "  group_size: 1\n  tags: [Lake]\n  generating_args: {temperature: 0.2}\n"
    )
    path = _write(tmp_path, both)
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert rows["train_env_manager.generating_args"].status == "ignored"
    assert rows["val_env_manager.generating_args"].status == "ignored"
    config = load_config(path)
    assert config.train_env_manager.generating_args is None and config.val_env_manager.generating_args is None
    assert config.sampling_temperature == 0.9


def test_rolls_tool_wrappers_read_gems_tags(tmp_path: Path) -> None:
    # ROLL's tools are GEM's (<code>/<python>, <search>): a ROLL file's tool_wrapper gets tool_format gem; one that
    # sets tool_format keeps it.
    tools = (
        "  Calc:\n    env_type: tool_math\n    tool_wrapper:\n      wrapper_args: {max_tool_uses: 1}\n"
        "      tool_configs: [{tool_id: python_code, tool_args: {timeout: 5}}]\n"
        "  Plain:\n    env_type: tool_math\n    tool_wrapper:\n      wrapper_args: {tool_format: hermes}\n"
        "      tool_configs: [{tool_id: python_code}]\n"
    )
    path = _write(tmp_path, AGENTIC + tools)
    config = load_config(path)
    assert config.custom_envs["Calc"].tool_wrapper.wrapper_args == {"max_tool_uses": 1, "tool_format": "gem"}
    assert config.custom_envs["Plain"].tool_wrapper.wrapper_args == {"tool_format": "hermes"}
    assert config.custom_envs["Lake"].tool_wrapper is None
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert "gem" in rows["(custom_envs.Calc.tool_wrapper.wrapper_args.tool_format)"].note
    assert "(custom_envs.Plain.tool_wrapper.wrapper_args.tool_format)" not in rows


def test_rolls_env_config_enable_thinking_is_the_tags_setting(tmp_path: Path) -> None:
    # ROLL's proxy env manager reads enable_thinking from the tag's env_config (default false); roll's envs take no
    # such argument, so it moves to custom_envs.<tag>.enable_thinking.
    think = "  Think: {env_type: frozen_lake, env_config: {enable_thinking: true, is_slippery: false}}\n"
    path = _write(tmp_path, AGENTIC + think)
    config = load_config(path)
    assert config.custom_envs["Think"].enable_thinking is True
    assert config.custom_envs["Think"].env_config == {"is_slippery": False}
    assert config.custom_envs["Lake"].enable_thinking is False  # ROLL's default and roll's
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    row = rows["custom_envs.Think.env_config.enable_thinking"]
    assert (row.status, row.target) == ("implemented-as", "custom_envs.Think.enable_thinking")
    both = "  Think: {env_type: frozen_lake, enable_thinking: false, env_config: {enable_thinking: true}}\n"
    with pytest.raises(ConfigError, match=r"custom_envs.Think.env_config.enable_thinking.*contradicts"):
        load_config(_write(tmp_path, AGENTIC + both))


def test_a_flat_key_override_takes_rolls_value_as_the_files_own_does(tmp_path: Path) -> None:
    # dual_clip_loss=true (ROLL's bool; ROLL's agentic examples carry it as a commented line) failed with
    # "policy_loss.dual_clip: Input should be greater than 1 (got: True)"; target_kl=0.05 set a target without ROLL's
    # adaptive controller; pg_clip_low=0.1 narrowed the clip although ROLL reads it only with use_pg_clip_range:
    # flat-key overrides of a ROLL file were applied after its translation, with roll's meaning of the value.
    path = _write(tmp_path, AGENTIC)
    config = load_config(path, ["dual_clip_loss=true", "target_kl=0.05", "pg_clip_low=0.1", "rollout_batch_size=16"])
    assert config.policy_loss.dual_clip == pytest.approx(1 + 2 * 0.2)
    assert (config.kl.ctrl_type, config.kl.target, config.kl.horizon) == ("adaptive", 0.05, 10000)
    assert config.policy_loss.clip_low is None
    assert config.rollout.batch_size == 16
    assert load_config(path, ["use_pg_clip_range=true", "pg_clip_low=0.1"]).policy_loss.clip_low == 0.1
    assert load_config(path, ["policy_loss.clip_low=0.1"]).policy_loss.clip_low == 0.1  # roll's field: as given


def test_value_clip_reaches_the_agentic_critic_with_rolls_default(tmp_path: Path) -> None:
    # ROLL's critic clips its value loss only when value_clip is set (default None); roll's agentic critic always
    # clipped at 0.5 and a ROLL file's value_clip failed as "unknown key; did you mean 'advantage_clip'?".
    gae = AGENTIC.replace("adv_estimator: grpo", "adv_estimator: gae") + (
        "critic:\n  model_args: {model_name_or_path: tiny://nano, model_head: value}\n"
        "  strategy_args: {strategy_name: fsdp2_train}\n"
    )
    config = load_config(_write(tmp_path, gae))
    assert config.critic_settings().value_clip is None
    assert load_config(_write(tmp_path, gae + "value_clip: 0.2\n")).critic_settings().value_clip == 0.2
    assert load_config(_write(tmp_path, gae), ["value_clip=0.3"]).critic_settings().value_clip == 0.3


@pytest.mark.parametrize("value", [True, False])
def test_a_roll_files_whiten_rewards_reaches_the_agentic_advantage(tmp_path: Path, value: bool) -> None:
    # ROLL's agentic pipeline whitens the token rewards when whiten_rewards is set; a ROLL agentic file with the key
    # (even at ROLL's default, false) failed: "whiten_rewards: unknown key; did you mean 'whiten_advantages'?".
    config = load_config(_write(tmp_path, AGENTIC + f"whiten_rewards: {str(value).lower()}\n"))
    assert config.advantage.whiten_rewards is value


def test_rlvr_keys_rolls_agentic_pipeline_never_reads_are_ignored_not_unknown(tmp_path: Path) -> None:
    # A ROLL agentic file with PPOConfig's RLVR keys (copied from an RLVR file; ROLL's agentic pipeline reads none of
    # them) failed to load: "norm_mean_type: unknown key; did you mean 'mask_type'?", "response_length: ... 'response_key'?".
    text = AGENTIC + "norm_mean_type: group\nnorm_std_type: group\nprompt_length: 2048\nresponse_length: 1024\n"
    path = _write(tmp_path, text)
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert rows["norm_mean_type"].status == "ignored" and "reward_normalization" in rows["norm_mean_type"].note
    assert rows["response_length"].status == "ignored" and "max_tokens_per_step" in rows["response_length"].note
    config = load_config(path)
    assert config.reward_normalization.norm_mean_type is None  # the file's reward_normalization (ROLL's default)
    assert config.rollout.sequence_length == 8192


def test_rolls_backward_batch_is_the_mini_batch_and_sizes_the_schedule(tmp_path: Path) -> None:
    # ROLL's actor_train takes an optimizer step per per_device_train_batch_size x gradient_accumulation_steps rows of
    # each data-parallel rank; roll took one step per RL step whatever a ROLL file said. Here 2 x 4 rows on each of
    # 8 GPUs / tensor-parallel 2 = 4 ranks: 32 rows a step, so 64 trajectories make 2 optimizer steps, and the
    # schedule is ROLL's max_steps x rollout_batch_size x ppo_epochs / 32.
    text = AGENTIC.replace("rollout_batch_size: 8\nval_batch_size: 8\n", "rollout_batch_size: 64\nval_batch_size: 8\n")
    text = text.replace(
        "  strategy_args: {strategy_name: fsdp2_train}\n",
        "  strategy_args:\n    strategy_name: megatron_train\n    strategy_config: {tensor_model_parallel_size: 2}\n"
        "  device_mapping: list(range(0,8))\n"
        "  training_args: {per_device_train_batch_size: 2, gradient_accumulation_steps: 4, lr_scheduler_type: cosine}\n",
    )
    text = text.replace("num_env_groups: 2\n", "num_env_groups: 16\n") + "max_steps: 10\nppo_epochs: 2\n"
    path = _write(tmp_path, text)
    rows = {row.key: row for row in translate(*compose_file(path)).rows}
    assert rows["(backward batch)"].target == "update.mini_batch_size"
    assert "x 4 data-parallel rank(s)" in rows["(backward batch)"].note
    config = load_config(path)
    assert config.update.mini_batch_size == 32 and config.update.num_mini_batches(64) == 2
    assert config.actor_train.training_args.max_steps == 10 * 64 * 2 // 32
    assert load_config(path, ["max_steps=5"]).actor_train.training_args.max_steps == 5 * 64 * 2 // 32
    # ROLL's 500 steps when the file sets none (roll's default is 100), and the schedule sized for them
    config = load_config(_write(tmp_path, text.replace("max_steps: 10\n", "")))
    assert config.max_steps == 500 and config.actor_train.training_args.max_steps == 500 * 64 * 2 // 32
    # a file's own mini-batch size (verl's ppo_mini_batch_size) and schedule length are kept
    path = _write(tmp_path, text.replace("lr_scheduler_type: cosine}", "lr_scheduler_type: cosine, max_steps: 7}"))
    assert load_config(path, ["ppo_mini_batch_size=16"]).update.mini_batch_size == 16
    assert load_config(path).actor_train.training_args.max_steps == 7


def test_rolls_onpolicy_distill_launcher_file_for_agentic_is_pure_opd_on_env_tags(tmp_path: Path) -> None:
    # ROLL's examples/start_onpolicy_distill_pipeline.py with pure_opd_pipeline_type: agentic: student_train /
    # student_infer roles, a dict of teachers routed by env tag, is_pure_opd forced on
    text = AGENTIC.replace("actor_train:", "student_train:").replace("actor_infer:", "student_infer:")
    text += """pure_opd_pipeline_type: agentic
custom_envs:
  Lake: {env_type: frozen_lake, env_manager_cls: traj}
  Box: {env_type: sokoban, env_manager_cls: traj}
teacher:
  lake_teacher:
    model_args: {model_name_or_path: tiny://nano}
    strategy_args: {strategy_name: hf_infer}
    tag_included: [Lake]
    opd_kl_coef: 0.5
  box_teacher:
    model_args: {model_name_or_path: tiny://nano}
    strategy_args: {strategy_name: hf_infer}
    tag_included: [Box]
"""
    text = text.replace("  tags: [Lake]\n", "  tags: [Lake, Box]\n")
    text = text.replace("custom_envs:\n  Lake: {env_type: frozen_lake, env_manager_cls: traj}\n", "", 1)
    path = _write(tmp_path, text)
    translation = translate(*compose_file(path))
    assert translation.pipeline == "agentic" and translation.problems == []
    rows = {row.key: row for row in translation.rows}
    assert rows["student_train"].target == "actor_train" and rows["teacher"].target == "teachers"
    config = load_config(path)
    assert config.opd.pure  # the launcher's is_pure_opd
    assert config.teacher_tags_of() == {"lake_teacher": ["Lake"], "box_teacher": ["Box"]}
    assert config.teacher_roles()["lake_teacher"].opd_kl_coef == 0.5
    assert config.actor_train.model_args.model_name_or_path == "tiny://nano"
