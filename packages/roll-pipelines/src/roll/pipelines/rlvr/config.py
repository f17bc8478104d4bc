"""RLVR configuration: roles, reward domains, and every algorithm knob (PPO, GRPO, REINFORCE++, RLOO, GSPO, DAPO)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from roll.pipelines.config import BaseConfig, RoleConfig
from roll.strategies import GenerationConfig

__all__ = ["RLVRConfig", "RewardConfig"]


class RewardConfig(RoleConfig):
    """One reward domain: a cluster of reward workers and the sample tags routed to it."""

    reward_type: str = Field(default="math", description="Registered reward: math, code, python, llm_judge, ...")
    reward_kwargs: dict[str, Any] = Field(default_factory=dict, description="Settings of that reward (see its docs).")
    tag_included: list[str] = Field(default_factory=list, description="Sample tags scored here (default: the domain).")


class RLVRConfig(BaseConfig):
    pipeline_cls: str = "rlvr"
    # --- roles ------------------------------------------------------------------------------------------
    actor_train: RoleConfig = Field(description="The trained policy (e.g. fsdp2_train); its data_args hold prompts.")
    actor_infer: RoleConfig = Field(description="The rollout engine (e.g. vllm); generating_args set sampling.")
    reference: RoleConfig | None = Field(
        default=None, description="Frozen reference policy; only created when KL is on."
    )
    critic: RoleConfig | None = Field(default=None, description="Value model; required by adv_estimator=gae.")
    rewards: dict[str, RewardConfig] = Field(description="Reward domains: {math: {...}, code: {...}}.")
    domain_interleave_probs: dict[str, float] | None = Field(
        default=None, description="Share of each domain in a rollout batch (default: as sampled from the data)."
    )
    # --- batch sizes ------------------------------------------------------------------------------------
    rollout_batch_size: int = Field(default=64, ge=1, description="Prompts per step; each gets n samples.")
    prompt_length: int = Field(default=256, ge=1, description="Longest prompt in tokens (longer prompts are dropped).")
    response_length: int = Field(default=256, ge=1, description="max_new_tokens of rollouts.")
    ppo_epochs: int = Field(default=1, ge=1)
    ppo_mini_batch_size: int | None = Field(
        default=None, ge=1, description="Samples per optimizer step (default: the whole rollout batch, one step)."
    )
    # --- advantages and rewards -------------------------------------------------------------------------
    adv_estimator: Literal["gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"] = "grpo"
    gamma: float = Field(default=1.0, ge=0, le=1)
    lambd: float = Field(default=1.0, ge=0, le=1)
    norm_std: bool = Field(default=True, description="GRPO: divide by the group std (False: Dr. GRPO style).")
    reward_norm: Literal["none", "group", "batch"] = Field(
        default="none", description="Normalize scores before the estimator (GRPO/RLOO normalize by group anyway)."
    )
    reward_clip: float | None = Field(default=None, gt=0)
    whiten_advantages: bool = False
    advantage_clip: float | None = Field(default=None, gt=0)
    # --- KL ---------------------------------------------------------------------------------------------
    kl_penalty: Literal["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs"] = "k3"
    add_token_level_kl: bool = Field(default=False, description="KL as a per-token reward penalty (PPO style).")
    use_kl_loss: bool = Field(default=False, description="KL as a loss term with kl_loss_coef (GRPO style).")
    init_kl_coef: float = Field(default=0.05, ge=0)
    kl_ctrl_type: Literal["fixed", "adaptive"] = "fixed"
    target_kl: float | None = Field(default=None, gt=0)
    kl_horizon: int | None = Field(default=None, ge=1)
    kl_loss_coef: float = Field(default=0.001, ge=0)
    # --- policy loss ------------------------------------------------------------------------------------
    pg_clip: float = Field(default=0.2, gt=0)
    pg_clip_low: float | None = Field(default=None, gt=0, description="Default pg_clip.")
    pg_clip_high: float | None = Field(default=None, gt=0, description="Default pg_clip; raise it for clip-higher.")
    dual_clip_loss: float | None = Field(default=None, gt=1, description="Dual-clip bound c for negative advantages.")
    importance_sampling: Literal["token", "sequence"] = Field(default="token", description="'sequence' is GSPO.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    entropy_loss_coef: float = Field(default=0.0, ge=0)
    value_clip: float | None = Field(default=0.5, gt=0)
    critic_warmup: int = Field(default=0, ge=0, description="Steps that train only the critic.")
    enable_old_logprobs_recompute: bool | Literal["auto"] = Field(
        default="auto",
        description=(
            "Recompute old log-probs with actor_train before training (False: use the rollout engine's). 'auto' "
            "recomputes only when the update is not one on-policy step (ppo_epochs > 1, several mini-batches, "
            "truncated IS, KL in the reward); otherwise the training forward's own log-probs, detached, are the "
            "old ones, which is exact and saves a forward pass over the batch."
        ),
    )
    # --- rollout / inference mismatch ---------------------------------------------------------------------
    tis_cap: float | None = Field(default=None, gt=0, description="Truncated importance sampling cap (None: off).")
    tis_level: Literal["token", "sequence"] = "token"
    tis_mode: Literal["truncate", "mask"] = "truncate"
    # --- DAPO-style dynamic sampling and overlong handling ------------------------------------------------
    dynamic_sampling: bool = Field(default=False, description="Drop groups whose rewards all agree; refill the batch.")
    max_num_gen_batches: int = Field(default=4, ge=1, description="Generation rounds per step with dynamic sampling.")
    mask_truncated: bool = Field(default=False, description="Exclude responses cut at response_length from the loss.")
    overlong_buffer_len: int | None = Field(default=None, ge=1, description="DAPO soft overlong penalty window.")
    overlong_penalty_factor: float = Field(default=1.0, ge=0)
    # --- validation -------------------------------------------------------------------------------------
    val_batch_size: int = Field(default=128, ge=1)
    val_generating_args: GenerationConfig | None = Field(
        default=None, description="Sampling for validation (default: greedy); num_return_sequences k gives pass@k."
    )
    model_update_frequency: int = Field(default=1, ge=1, description="Sync actor_train -> actor_infer every N steps.")
    rollout_dump: bool = Field(default=False, description="Write every step's samples to rollouts/step-N.jsonl.")

    @property
    def kl_in_reward(self) -> bool:
        return self.add_token_level_kl and self.init_kl_coef > 0

    def recompute_old_log_probs(self, num_mini_batches: int) -> bool:
        """Whether a step with this many mini-batches needs actor_train's log-probs before it trains."""
        if self.enable_old_logprobs_recompute != "auto":
            return self.enable_old_logprobs_recompute
        off_policy = self.ppo_epochs > 1 or num_mini_batches > 1
        needs_them_first = self.tis_cap is not None or (self.kl_in_reward and self.needs_reference)
        return off_policy or needs_them_first

    @property
    def needs_reference(self) -> bool:
        return self.kl_in_reward or (self.use_kl_loss and self.kl_loss_coef > 0)

    @property
    def group_size(self) -> int:
        return self.actor_infer.generating_args.num_return_sequences

    @model_validator(mode="after")
    def _check_rlvr(self) -> RLVRConfig:
        if self.actor_train.data_args is None:
            raise ValueError("actor_train.data_args is required: file_name with prompts (and eval_file_name)")
        if not self.rewards:
            raise ValueError("rewards needs at least one domain, e.g. rewards: {math: {reward_type: math}}")
        if self.needs_reference and self.reference is None:
            raise ValueError("KL is on (add_token_level_kl or use_kl_loss) but no reference role is configured")
        if self.adv_estimator == "gae" and self.critic is None:
            raise ValueError("adv_estimator=gae needs a critic role (model_args.model_head: value)")
        if self.adv_estimator in ("grpo", "rloo", "reinforce_plus_plus_baseline") and self.group_size < 2:
            raise ValueError(
                f"adv_estimator={self.adv_estimator} compares samples of one prompt: set "
                f"actor_infer.generating_args.num_return_sequences >= 2"
            )
        if self.domain_interleave_probs is not None:
            unknown = sorted(set(self.domain_interleave_probs) - set(self.rewards))
            if unknown:
                raise ValueError(
                    f"domain_interleave_probs names {unknown}, which are not reward domains {sorted(self.rewards)}"
                )
        if self.kl_ctrl_type == "adaptive" and (self.target_kl is None or self.kl_horizon is None):
            raise ValueError("kl_ctrl_type=adaptive needs target_kl and kl_horizon")
        for domain, reward in self.rewards.items():
            if not reward.tag_included:
                object.__setattr__(reward, "tag_included", [domain])
        object.__setattr__(self.actor_infer.generating_args, "max_new_tokens", self.response_length)
        samples = self.rollout_batch_size * self.group_size
        mini = self.ppo_mini_batch_size or samples
        updates = self.ppo_epochs * -(-samples // mini)
        self.fill_training_steps(self.actor_train, updates_per_step=updates)
        if self.critic is not None:
            self.fill_training_steps(self.critic, updates_per_step=updates)
        return self
