"""Configs of the diffusion pipelines (``diffusion_pretrain``, ``diffusion_reward_fl``, ``diffusion_dmd``,
``diffusion_ode_distill``):
their model roles (diffusers models, ``model_kind: diffusion`` filled in), an algorithm section each, and the
evaluation section they share. Workers get their own settings from ``*_settings()``, never the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from roll.pipelines.config import BaseConfig, RoleConfig, raw_section, raw_value
from roll.pipelines.diffusion.workers import DiffusionSettings, RewardFLSettings
from roll.pipelines.rewards.image_worker import ImageRewardSettings
from roll.runtime import RollModel

__all__ = [
    "DMDConfig",
    "DMDSection",
    "DiffusionEvalSection",
    "DiffusionPretrainConfig",
    "ODEDistillConfig",
    "ODEDistillSection",
    "PretrainSection",
    "RewardFLConfig",
    "RewardFLSection",
]

Conditions = Literal["all", "train", "heldout"]


class DiffusionEvalSection(RollModel):
    """Evaluation at step 0, every ``eval_steps`` and at the end: fixed noise and conditions, so values compare."""

    num_samples: int = Field(default=128, ge=8, description="Samples drawn from fixed noise per evaluation.")
    noise_seed: int = Field(default=4321, description="Seed of the evaluation noise (never used for training).")
    conditions: Conditions | None = Field(
        default=None, description="Conditions of the evaluation prompts; None: the pipeline's default."
    )
    condition_seed: int = Field(default=99, description="Order of the evaluation conditions.")
    grid_images: int = Field(default=64, ge=0, description="Samples in the PNG grid written to plots/ (0: none).")
    denoising_levels: int = Field(default=8, ge=1, description="Noise levels of the held-out denoising loss.")


class _DiffusionConfig(BaseConfig):
    """What the diffusion pipelines share: image size, evaluation and the model roles' kind."""

    image_size: Literal[16, 32] = Field(default=16, description="Side of the square shape images.")
    evaluation: DiffusionEvalSection = Field(default_factory=DiffusionEvalSection)
    model_roles: ClassVar[tuple[str, ...]] = ()
    trained_roles: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Model roles load diffusers models (``model_kind: diffusion``); each trained role's LR schedule runs one
        optimizer step per pipeline step."""
        data = super().derive_defaults(data)
        for role in cls.model_roles:
            args = raw_section(data, role, "model_args", create=True) if raw_section(data, role) is not None else None
            if args is not None:
                args.setdefault("model_kind", "diffusion")
        for role in cls.trained_roles:
            cls.fill_schedule_length(data, role, cls.updates_per_step(data, role))
        return data

    @classmethod
    def updates_per_step(cls, data: dict[str, Any], role: str) -> Any:
        """Optimizer steps ``role`` takes per pipeline step (its LR schedule's length is max_steps times this)."""
        return 1

    @model_validator(mode="after")
    def _check_models(self) -> _DiffusionConfig:
        if self.eval_steps and self.eval_steps % self.logging_steps:
            raise ValueError(
                f"eval_steps={self.eval_steps} is not a multiple of logging_steps={self.logging_steps}: evaluation "
                "metrics are written on logging steps only; make logging_steps divide eval_steps"
            )
        for name in self.model_roles:
            role: RoleConfig = getattr(self, name)
            if role.model_args.model_kind != "diffusion":
                raise ValueError(f"{name}.model_args.model_kind must be 'diffusion' (a diffusers model folder)")
            if role.strategy_args is None:
                raise ValueError(f"{name}.strategy_args is required (fsdp2_train to train, fsdp2_infer or hf_infer)")
            trains = role.strategy_args.strategy_name.endswith("_train")
            if (name in self.trained_roles) != trains:
                want = "a training strategy (fsdp2_train)" if name in self.trained_roles else "an inference strategy"
                raise ValueError(f"{name} needs {want}; it has {role.strategy_args.strategy_name!r}")
        return self

    def settings_of(self, role: str) -> DiffusionSettings:
        """The settings every diffusion worker gets: its scheduler folder (the role's own model) and image size."""
        path = getattr(self, role).model_args.model_name_or_path
        return DiffusionSettings(scheduler_path=path, image_size=self.image_size)


class PretrainSection(RollModel):
    """Denoising pretraining of a class-conditional model on the shapes data, with an EMA of its weights (the EMA is
    what is evaluated and exported: the teacher of the other diffusion recipes)."""

    batch_size: int = Field(
        default=32, ge=1, description="Training images per optimizer step (drawn with replacement)."
    )
    ema_decay: float = Field(
        default=0.999, ge=0, lt=1, description="EMA decay, with the warm-up (1 + u) / (10 + u) while that is lower."
    )
    sample_steps: int = Field(default=50, ge=1, description="Sampler steps of the evaluation samples (grid, FD, MMD).")
    heldout_seed: int = Field(
        default=0,
        description="Noise seed of val/denoising_loss: every held-out image at each of evaluation.denoising_levels "
        "levels (the same triples at every evaluation).",
    )


class DiffusionPretrainConfig(_DiffusionConfig):
    flat_keys: ClassVar[Mapping[str, str]] = {"ema_decay": "pretrain.ema_decay"}
    model_roles: ClassVar[tuple[str, ...]] = ("denoiser",)
    trained_roles: ClassVar[tuple[str, ...]] = ("denoiser",)

    pipeline_cls: str = "diffusion_pretrain"
    denoiser: RoleConfig = Field(
        description="The trained model (fsdp2_train), e.g. a random-init tiny-diffusion://unet-nano folder."
    )
    pretrain: PretrainSection = Field(default_factory=PretrainSection)


class RewardFLSection(RollModel):
    """Reward feedback learning: sample with gradients through the last ``grad_steps`` steps, ascend the reward."""

    batch_size: int = Field(default=16, ge=1, description="Prompts (noise + condition) per optimizer step.")
    sample_steps: int = Field(default=10, ge=1, description="Deterministic sampler steps (train and eval).")
    grad_steps: int = Field(default=4, ge=1, description="Last sampler steps that backpropagate (truncated BPTT).")
    kl_coef: float = Field(default=0.02, ge=0, description="Weight of the L2 pull towards the frozen start model.")
    reward_weight: float = Field(default=1.0, gt=0)
    train_conditions: Conditions = Field(default="train", description="Conditions of training prompts.")

    @model_validator(mode="after")
    def _check_steps(self) -> RewardFLSection:
        if self.grad_steps > self.sample_steps:
            raise ValueError(f"grad_steps={self.grad_steps} exceeds sample_steps={self.sample_steps}; lower it")
        return self


class RewardFLConfig(_DiffusionConfig):
    flat_keys: ClassVar[Mapping[str, str]] = {"kl_coef": "reward_fl.kl_coef", "grad_steps": "reward_fl.grad_steps"}
    model_roles: ClassVar[tuple[str, ...]] = ("actor_train",)
    trained_roles: ClassVar[tuple[str, ...]] = ("actor_train",)

    pipeline_cls: str = "diffusion_reward_fl"
    actor_train: RoleConfig = Field(description="The fine-tuned model (fsdp2_train); also its frozen reference.")
    reward: RoleConfig = Field(description="The role that scores evaluation samples (no model of its own).")
    reward_model: ImageRewardSettings = Field(default_factory=ImageRewardSettings)
    reward_fl: RewardFLSection = Field(default_factory=RewardFLSection)

    def actor_settings(self) -> RewardFLSettings:
        s = self.reward_fl
        return RewardFLSettings(
            **vars(self.settings_of("actor_train")),
            reward=self.reward_model,
            sample_steps=s.sample_steps,
            grad_steps=s.grad_steps,
            kl_coef=s.kl_coef,
            reward_weight=s.reward_weight,
        )


class DMDSection(RollModel):
    """Distribution matching distillation into a 1-4-step generator."""

    batch_size: int = Field(default=32, ge=1, description="Generator samples per step.")
    teacher_steps: int = Field(default=50, ge=2, description="Teacher sampler steps (regression targets, baseline).")
    regression_weight: float = Field(default=0.25, ge=0, description="Weight of the MSE to paired teacher outputs.")
    regression_pairs: int = Field(
        default=512, ge=1, description="(noise, teacher output) pairs made at setup; each step draws batch_size."
    )
    fake_updates: int = Field(default=1, ge=1, description="Fake-score optimizer steps per generator step.")
    student_steps: int = Field(
        default=1,
        ge=1,
        le=4,
        description="Generator sampler steps (fixed timesteps from noise; gradients through the last step only).",
    )


class DMDConfig(_DiffusionConfig):
    flat_keys: ClassVar[Mapping[str, str]] = {"regression_weight": "dmd.regression_weight"}
    model_roles: ClassVar[tuple[str, ...]] = ("generator", "fake_score", "teacher")
    trained_roles: ClassVar[tuple[str, ...]] = ("generator", "fake_score")

    pipeline_cls: str = "diffusion_dmd"
    generator: RoleConfig = Field(
        description="The 1-4-step student (fsdp2_train), usually initialised from the teacher."
    )
    fake_score: RoleConfig = Field(description="The online score model of generator samples (fsdp2_train).")
    teacher: RoleConfig = Field(description="The frozen multi-step teacher: the real score (fsdp2_infer/hf_infer).")
    dmd: DMDSection = Field(default_factory=DMDSection)

    @classmethod
    def updates_per_step(cls, data: dict[str, Any], role: str) -> Any:
        return raw_value(data, "dmd", "fake_updates", default=1) if role == "fake_score" else 1


class ODEDistillSection(RollModel):
    """The student learns the teacher's ODE: from a teacher state at a student boundary, one student step should land
    on the teacher's state at the next boundary."""

    batch_size: int = Field(default=64, ge=1, description="(state, next state) pairs per optimizer step.")
    teacher_steps: int = Field(default=50, ge=2, description="Teacher solver steps between noise and image.")
    student_steps: int = Field(default=4, ge=1, description="Student sampler steps (boundaries on the teacher's).")
    num_trajectories: int = Field(default=1024, ge=1, description="Teacher trajectories made at setup.")
    trajectory_seed: int = Field(default=0, description="Seed of the trajectories' noise and conditions.")

    @model_validator(mode="after")
    def _check_steps(self) -> ODEDistillSection:
        if self.student_steps >= self.teacher_steps:
            raise ValueError(f"student_steps={self.student_steps} must be below teacher_steps={self.teacher_steps}")
        return self


class ODEDistillConfig(_DiffusionConfig):
    flat_keys: ClassVar[Mapping[str, str]] = {"student_steps": "ode.student_steps"}
    model_roles: ClassVar[tuple[str, ...]] = ("student", "teacher")
    trained_roles: ClassVar[tuple[str, ...]] = ("student",)

    pipeline_cls: str = "diffusion_ode_distill"
    student: RoleConfig = Field(description="The few-step student (fsdp2_train), usually initialised from the teacher.")
    teacher: RoleConfig = Field(description="The frozen multi-step teacher (fsdp2_infer or hf_infer).")
    ode: ODEDistillSection = Field(default_factory=ODEDistillSection)
