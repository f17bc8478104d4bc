"""``agentic_rollout``: play env episodes with a policy and write the trajectories; nothing is trained.

Roles: ``actor_infer`` only, and not even that when ``train_env_manager.llm_proxy`` acts every turn (``openai``,
``random``): the run then starts no model workers; the tokenizer that renders prompts and writes the rollouts is
loaded from ``actor_infer.model_args`` in the driver, as always. Each step plays ``rollout.batch_size`` episodes of
``train_env_manager`` (ROLL's key; ``mode: val`` replays the same seeds every step and keeps faulted episodes as
failures) and writes ``rollouts/step-N.jsonl`` (sample rows, text decoded) and ``rollouts/step-N-episodes.jsonl``
(every episode, with why it ended). Totals over all steps go to ``summary.json``. ``rollout.max_faulted_steps`` steps in a row whose
episodes all faulted stop the run, as in ``agentic``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from roll.agentic.config import (
    PARSE_TOOL_CALL_DESCRIPTION,
    CustomEnvConfig,
    EnvManagerConfig,
    spread_parse_tool_call,
    spread_system_envs,
)
from roll.agentic.driver_envs import DriverEnvs
from roll.agentic.pipeline.config import FLAT_KEYS, AgenticConfig, AgenticRolloutSection
from roll.agentic.pipeline.lengths import length_checks, setup_checks
from roll.agentic.pipeline.rollouts import PolicyEndpoint, make_scheduler, write_rollout
from roll.agentic.policy import NoPolicyClient
from roll.agentic.pool import env_checks
from roll.agentic.scheduler.faulted_steps import FaultedSteps
from roll.pipelines.base import BasePipeline, Role
from roll.pipelines.config import BaseConfig, RoleConfig
from roll.pipelines.rlvr.workers import InferWorker
from roll.runtime import ConfigError

__all__ = ["AgenticRolloutConfig", "AgenticRolloutPipeline"]

logger = logging.getLogger(__name__)


class AgenticRolloutConfig(BaseConfig):
    flat_keys: ClassVar[Mapping[str, str]] = {
        "rollout_batch_size": "rollout.batch_size",
        "sequence_length": "rollout.sequence_length",
    }

    pipeline_cls: str = "agentic_rollout"
    actor_infer: RoleConfig = Field(
        description="The policy to roll out (hf_infer, vllm); generating_args per turn. With a train_env_manager."
        "llm_proxy of openai or random no worker starts: only model_args' tokenizer is read."
    )
    custom_envs: dict[str, CustomEnvConfig]
    train_env_manager: EnvManagerConfig = Field(description="The env groups to play.")
    mode: Literal["train", "val"] = Field(default="train", description="val: the same seeds every step.")
    rollout: AgenticRolloutSection = Field(default_factory=AgenticRolloutSection)
    max_steps: int = Field(default=1, ge=1, description="Batches to play.")
    export_hf: bool = Field(default=False, description="Unused: nothing is trained.")
    parse_tool_call_parameter_to_dict: bool = Field(default=False, description=PARSE_TOOL_CALL_DESCRIPTION)

    def deployment_checks(self) -> list[Callable[[], str | None]]:
        """``roll validate``: each env entry's type, env_config and tools (nothing built); the ROCK envs' SDK, agent
        config, task file and service; ``rollout.sequence_length`` against each env tag's first prompt and the
        model's positions."""
        from roll.agentic.env.rock.checks import rock_checks

        envs = DriverEnvs()  # a tag's env is built once for the random-action and first-prompt checks
        checks = env_checks(self.custom_envs, [self.train_env_manager], envs)  # with its llm_proxy random's envs
        return [*checks, *rock_checks(self.custom_envs), *self.length_checks(envs=envs), envs.close]

    def length_checks(self, tokenizer: Any = None, envs: DriverEnvs | None = None) -> list[Callable[[], str | None]]:
        """``rollout.sequence_length`` against each env tag's first prompt and the model's positions
        (:mod:`roll.agentic.pipeline.lengths`); ``tokenizer``: the pipeline's (else actor_infer's, where readable);
        ``envs``: the driver's envs, shared with the random-action checks."""
        managers = [("train_env_manager", self.train_env_manager, self.seed, self.mode)]
        return length_checks(self, managers, tokenizer_role="actor_infer", tokenizer=tokenizer, envs=envs)

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        cls._refuse_training_keys(data)
        return spread_system_envs(spread_parse_tool_call(super().derive_defaults(data)))

    @classmethod
    def _refuse_training_keys(cls, data: Mapping[str, Any]) -> None:
        """A training file run as ``agentic_rollout`` (e.g. ``pipeline_cls=agentic_rollout`` on an agentic recipe):
        one error naming the agentic pipeline's keys it has, rather than an unknown-field line for each."""
        ours = set(cls.model_fields) | set(cls.flat_keys)
        training = sorted(k for k in data if k not in ours and (k in AgenticConfig.model_fields or k in FLAT_KEYS))
        if training:
            raise ConfigError(
                f"{', '.join(training)}: keys of the agentic (training) pipeline; agentic_rollout plays "
                "train_env_manager's episodes with actor_infer and trains nothing (mode: val replays the same seeds "
                "every step): remove them, or run pipeline_cls: agentic"
            )

    @model_validator(mode="after")
    def _check_rollout(self) -> AgenticRolloutConfig:
        manager = self.train_env_manager
        missing = sorted(set(manager.tags) - set(self.custom_envs))
        if missing:
            raise ValueError(f"train_env_manager.tags {missing} are not in custom_envs ({sorted(self.custom_envs)})")
        manager.check_proxy_thinking("train_env_manager", self.custom_envs)
        # whole groups, within max_traj_per_env rounds: the scheduler asks the same of every step's batch
        manager.groups_for(self.rollout.batch_size, "rollout.batch_size (rollout_batch_size)", "train_env_manager")
        return self


class AgenticRolloutPipeline(BasePipeline):
    config_cls = AgenticRolloutConfig
    config: AgenticRolloutConfig

    def setup(self) -> None:
        cfg = self.config
        self.tokenizer = setup_checks(cfg, [cfg.train_env_manager], cfg.actor_infer.model_args)
        self.faulted_steps = FaultedSteps(cfg.rollout.max_faulted_steps, cfg.train_env_manager.name, self.output_dir)
        pad = self.tokenizer.pad_token_id
        pad_token_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self.open_session()
        remote = cfg.rollout.env_workers == "ray"
        proxy = cfg.train_env_manager.llm_proxy.proxy_type
        self.endpoint: PolicyEndpoint | None = None
        client: Any = NoPolicyClient()
        if proxy == "policy":
            clusters = self.create_clusters({"actor_infer": Role(InferWorker, cfg.actor_infer)})
            self.endpoint = PolicyEndpoint(clusters["actor_infer"], pad_token_id, remote=remote)
            client = self.endpoint.client
        else:
            logger.info("llm_proxy %s acts every turn: actor_infer is not started (only its tokenizer is used)", proxy)
        self.scheduler = make_scheduler(
            cfg.train_env_manager,
            cfg.custom_envs,
            self.tokenizer,
            client,
            generation_config=cfg.actor_infer.generating_args.model_copy(update={"num_return_sequences": 1}),
            sequence_length=cfg.rollout.sequence_length,
            mode=cfg.mode,
            seed=cfg.seed,
            resources=self.session.resources if remote else None,
        )
        self.totals: dict[str, float] = {}

    def data_state(self) -> dict[str, Any]:
        return {**self.scheduler.state(), "totals": dict(self.totals), "faulted_steps": self.faulted_steps.state()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        if state:
            self.scheduler.load_state(state)
            self.totals = dict(state.get("totals", {}))
            self.faulted_steps.load_state(state.get("faulted_steps", []))  # the streak goes on across a resume

    def step(self, step: int) -> dict[str, float]:
        out = self.scheduler.get_batch(self.config.rollout.batch_size, step)
        write_rollout(self.output_dir / "rollouts", f"step-{step:06d}", out, self.tokenizer)
        played = len(out.episodes)
        self.totals["episodes"] = self.totals.get("episodes", 0.0) + played
        self.totals["successes"] = self.totals.get("successes", 0.0) + sum(e.success for e in out.episodes)
        self.totals["env_faults"] = self.totals.get("env_faults", 0.0) + sum(e.faulted for e in out.episodes)
        return {**out.metrics, "rollout/faulted_steps_in_a_row": float(self.faulted_steps.record(step, out))}

    def run(self) -> dict[str, float]:
        start = self.resume()
        last: dict[str, float] = {}
        for step in self.steps(start):
            last = self.log_metrics(step, self.step(step))
            self.faulted_steps.check()
            self.do_checkpoint(step, force=step == self.max_steps)
        summary = {**self.totals, "success_rate": self.totals.get("successes", 0.0) / max(1.0, self.totals["episodes"])}
        (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return last

    def shutdown(self, graceful: bool = True) -> None:
        if getattr(self, "scheduler", None) is not None:
            with contextlib.suppress(Exception):  # workers may be gone after a failure; clusters go below
                self.scheduler.close()
        endpoint = getattr(self, "endpoint", None)
        if endpoint is not None:
            endpoint.close()
        super().shutdown(graceful)
