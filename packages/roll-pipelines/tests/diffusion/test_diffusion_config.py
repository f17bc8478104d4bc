"""The diffusion pipelines' configs: recipes load, roles become diffusion roles, bad combinations fail with the
field named, and teacher references reject unknown settings (no Ray, no training)."""

from __future__ import annotations

import pytest

from roll.pipelines.config import load_config
from roll.pipelines.diffusion.config import DMDConfig, ODEDistillConfig, RewardFLConfig
from roll.pipelines.diffusion.teacher import teacher_uri_path
from roll.pipelines.registry import resolve_pipeline
from roll.runtime import ConfigError

pytestmark = pytest.mark.extra("diffusers")  # diffusers is outside the Pants resolve


@pytest.mark.parametrize(
    ("recipe", "config_cls", "trained"),
    [
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


def test_teacher_references_reject_unknown_settings():
    with pytest.raises(ConfigError, match="bad teacher settings"):
        teacher_uri_path("diffusion-teacher://unet-nano?stepz=10")
    with pytest.raises(ConfigError, match="is not a diffusion-teacher"):
        teacher_uri_path("tiny://nano")
