"""The diffusion pipelines' configs: recipes load, roles become diffusion roles, bad combinations fail with the
field named, and model references resolve or reject bad settings (no Ray, no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipelines.assets import resolve_model_uri
from roll.pipelines.config import load_config
from roll.pipelines.diffusion.config import DiffusionPretrainConfig, DMDConfig, ODEDistillConfig, RewardFLConfig
from roll.pipelines.diffusion.teacher import PretrainSettings
from roll.pipelines.registry import resolve_pipeline
from roll.runtime import ConfigError

pytestmark = pytest.mark.extra("diffusers")  # diffusers is outside the Pants resolve


@pytest.mark.parametrize(
    ("recipe", "config_cls", "trained"),
    [
        ("diffusion-pretrain-tiny", DiffusionPretrainConfig, {"denoiser": 2000}),
        ("diffusion-reward-fl-tiny", RewardFLConfig, {"actor_train": 50}),
        ("diffusion-dmd-tiny", DMDConfig, {"generator": 400, "fake_score": 2000}),
        ("diffusion-ode-distill-tiny", ODEDistillConfig, {"student": 200}),
    ],
)
def test_recipes_load_as_their_pipeline_with_diffusion_roles(recipe, config_cls, trained):
    config = load_config(recipe)
    assert type(config) is config_cls and resolve_pipeline(config.pipeline_cls).config_cls is config_cls
    for name in config_cls.model_roles:
        assert getattr(config, name).model_args.model_kind == "diffusion"
    for name, steps in trained.items():
        assert getattr(config, name).training_args.max_steps == steps
    # a dumped config loads back to the same config
    assert config_cls.model_validate(config.model_dump()) == config


def test_ode_recipe_draws_each_teacher_row_about_once():
    """The ODE recipe's trajectory pool holds at least as many (trajectory, segment) rows as its run draws: with a
    small pool (256) the student fit the training trajectories (4-step MSE 0.08x the start) but not held-out
    noise (0.42x); see docs/results/diffusion.md."""
    o = load_config("diffusion-ode-distill-tiny")
    drawn = o.max_steps * o.ode.batch_size
    assert o.ode.num_trajectories * o.ode.student_steps >= drawn == 12_800


def test_fake_score_schedule_counts_its_updates_per_step():
    config = load_config("diffusion-dmd-tiny", ["dmd.fake_updates=3"])
    assert (config.generator.training_args.max_steps, config.fake_score.training_args.max_steps) == (400, 1200)


def test_bad_combinations_name_the_field():
    with pytest.raises(ConfigError, match="grad_steps=11 exceeds sample_steps=10"):
        load_config("diffusion-reward-fl-tiny", ["reward_fl.grad_steps=11"])
    with pytest.raises(ConfigError, match="generator needs a training strategy"):
        load_config("diffusion-dmd-tiny", ["generator.strategy_args.strategy_name=hf_infer"])
    with pytest.raises(ConfigError, match="model_kind must be 'diffusion'"):
        load_config("diffusion-ode-distill-tiny", ["teacher.model_args.model_kind=causal_lm"])
    with pytest.raises(ConfigError, match="not a multiple of logging_steps"):
        load_config("diffusion-dmd-tiny", ["eval_steps=30"])
    with pytest.raises(ConfigError, match="student_steps=50 must be below"):
        load_config("diffusion-ode-distill-tiny", ["ode.student_steps=50"])


def test_pretrain_recipe_matches_the_in_process_reference_settings():
    """The recipe trains the teacher the measured results used (pretrain_teacher's defaults, cache
    teacher-50910038d5bd): same model, scheduler, seed, steps, batch, AdamW (no decay), clip and EMA."""
    config = load_config("diffusion-pretrain-tiny")
    reference = PretrainSettings()
    assert reference.fingerprint() == "50910038d5bd"
    args = config.denoiser.training_args
    assert config.denoiser.model_args.model_name_or_path == (
        f"tiny-diffusion://{reference.preset}?scheduler={reference.scheduler}&seed={reference.seed}"
        f"&image_size={reference.image_size}"
    )
    assert (config.max_steps, config.pretrain.batch_size, config.seed) == (reference.steps, reference.batch_size, 0)
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm) == (reference.learning_rate, 0.0, 1.0)
    assert (args.lr_scheduler_type, args.warmup_steps, args.warmup_ratio) == ("constant", 0, 0.0)
    assert (config.pretrain.ema_decay, config.denoiser.world_size, config.denoiser.num_threads) == (0.999, 1, 1)
    assert config.denoiser.training_args.per_device_train_batch_size == reference.batch_size  # one micro-batch
    # one FSDP unit: per-block units reorder the sums of the UNet's skip-connection gradients (not bit for bit)
    assert config.denoiser.strategy_args.strategy_config == {"wrap_blocks": False}
    assert config.flat_keys["ema_decay"] == "pretrain.ema_decay"
    assert load_config("diffusion-pretrain-tiny", ["ema_decay=0.99"]).pretrain.ema_decay == 0.99


@pytest.mark.parametrize("recipe", ["diffusion-reward-fl-tiny", "diffusion-dmd-tiny", "diffusion-ode-distill-tiny"])
def test_distillation_recipes_name_the_pretrain_recipe_as_teacher(recipe):
    config = load_config(recipe)
    paths = {role.model_args.model_name_or_path for role in config.roles().values() if role.model_args}
    assert paths - {None} == {"recipe://diffusion-pretrain-tiny"}


def test_tiny_diffusion_references_build_a_model_folder_or_name_the_bad_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path))
    path = resolve_model_uri("tiny-diffusion://unet-nano?scheduler=ddim&seed=3&image_size=16")
    assert path is not None and (tmp_path / "tiny-diffusion") in Path(path).parents
    from roll.strategies.diffusion import load_scheduler

    assert type(load_scheduler(path)).__name__ == "DDIMScheduler"
    with pytest.raises(ConfigError, match=r"unknown settings \['stepz'\]"):
        resolve_model_uri("tiny-diffusion://unet-nano?stepz=10")
    with pytest.raises(ConfigError, match="must be integers"):
        resolve_model_uri("tiny-diffusion://unet-nano?seed=x")
    with pytest.raises(ConfigError, match="unknown model reference"):
        resolve_model_uri("diffusion-teacher://unet-nano?steps=2000")
