"""The RLVR pipeline: RL with verifiable rewards (PPO, GRPO, REINFORCE++, RLOO, GSPO, DAPO-style sampling).

One step::

    rollouts = actor_infer.generate(prompts); rewards[domain].compute_rewards(rollouts)   (+ dynamic sampling)
    ref_log_probs = reference.compute_log_probs(rollouts)        if KL is on
    teacher_log_probs = teacher.compute_log_probs(rollouts)      on-policy distillation (opd; rlvr/opd.py);
                                                                 several teachers: each on its routed rows
    old_log_probs = actor_train.compute_log_probs(rollouts)      (or the rollout engine's)
    values = critic.compute_values(rollouts)                     for GAE
    advantages = estimator(scores, masks, KL, values)
    critic.train_step(rollouts, plan); actor_train.train_step(rollouts, plan)
    model_update(actor_train -> actor_infer)                     every rollout.model_update_frequency steps
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from roll.pipelines.algorithms import make_kl_controller
from roll.pipelines.algorithms.roll_knobs import RunningMoments
from roll.pipelines.base import BasePipeline, Role
from roll.pipelines.data import PromptCollator
from roll.pipelines.engines import EnginePool
from roll.pipelines.evaluation import grade_rollouts, share
from roll.pipelines.rewards import resolve_reward_worker
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.async_mode import async_step, make_scheduler
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.rlvr.opd import teacher_role_name
from roll.pipelines.rlvr.rollout import (
    PromptSource,
    Rollouts,
    check_reward_fields,
    route_domain_column,
    step_generation_config,
)
from roll.pipelines.rlvr.scheduler import RequestScheduler
from roll.pipelines.rlvr.teacher_routing import TeacherRouter
from roll.pipelines.rlvr.teacher_scoring import TeacherScoring
from roll.pipelines.rlvr.validation import validate_policy
from roll.pipelines.rlvr.workers import ActorWorker, CriticWorker, InferWorker, PolicyWorker
from roll.pipelines.rollout_mock import RolloutMock
from roll.pipelines.stages import StepTimer, UpdatePlan, is_eval_step, load_splits
from roll.pipelines.tokenizers import load_tokenizer
from roll.protocol import DataProto
from roll.runtime import PendingCall, materialize_all

__all__ = ["RLVRPipeline"]

_DUMPED_INTS = ("group_index", "policy_version", "staleness")


class RLVRPipeline(BasePipeline):
    config_cls = RLVRConfig
    config: RLVRConfig
    engines: EnginePool  # async mode only

    def setup(self) -> None:
        cfg = self.config
        # 1. data: prompts (checked against what each reward domain needs) before anything starts
        data_args = cfg.actor_train.require_data()
        data_args = data_args.model_copy(
            update={"max_prompt_length": data_args.max_prompt_length or cfg.rollout.prompt_length}
        )
        self.tokenizer = load_tokenizer(cfg.actor_train.model_args)
        self.splits = load_splits(data_args, "prompt", self.tokenizer)
        rewards = route_domain_column([self.splits.train, self.splits.eval], cfg.rewards)
        if rewards is not cfg.rewards:  # rows that name their domain: every tag-routing site sees their tags
            self.config = cfg = cfg.model_copy(update={"rewards": rewards})
        reward_workers = {domain: resolve_reward_worker(reward.reward_type) for domain, reward in cfg.rewards.items()}
        check_reward_fields(self.splits.train, cfg.rewards, reward_workers)
        check_reward_fields(self.splits.eval, cfg.rewards, reward_workers)
        self.collator = PromptCollator(self.tokenizer.pad_token_id, cfg.rollout.prompt_length)
        self.prompts = PromptSource(
            self.splits.train,
            cfg.rewards,
            cfg.rollout.domain_interleave_probs,
            self.collator,
            batch_size=cfg.rollout.batch_size,
            seed=data_args.seed,
            shuffle=data_args.shuffle,
        )
        # 2. session; 3. roles, each with its own settings
        self.open_session()
        roles = {"actor_train": Role(ActorWorker, cfg.actor_train, cfg.actor_settings())}
        if not cfg.asynchrony.enabled:  # async mode runs the inference role as independent engines (below)
            roles["actor_infer"] = Role(InferWorker, cfg.actor_infer)
        if cfg.needs_reference and cfg.reference is not None:
            roles["reference"] = Role(PolicyWorker, cfg.reference, cfg.reference_settings())
        if cfg.critic is not None:
            roles["critic"] = Role(CriticWorker, cfg.critic, cfg.critic_settings())
        teachers = cfg.teacher_roles() if cfg.opd.on else {}
        for name, teacher in teachers.items():  # one role per teacher: "teacher", or "teacher/<name>" for several
            roles[teacher_role_name(name)] = Role(PolicyWorker, teacher, cfg.teacher_settings())
        for domain, reward in cfg.rewards.items():
            roles[f"reward/{domain}"] = Role(reward_workers[domain], reward)
        clusters = self.create_clusters(roles)
        self.actor_train, self.actor_infer = clusters["actor_train"], clusters.get("actor_infer")
        self.reference = clusters.get("reference")
        self.critic = clusters.get("critic")
        self.teachers = TeacherScoring(
            {name: clusters[teacher_role_name(name)] for name in teachers},
            TeacherRouter(
                {domain: reward.tag_included for domain, reward in cfg.rewards.items()},
                {name: teacher.tag_included for name, teacher in teachers.items()},
                pure=cfg.opd.pure,
            ),
        )
        # 4. wiring
        reward_clusters = {domain: clusters[f"reward/{domain}"] for domain in cfg.rewards}
        self.rollouts = Rollouts(self.actor_infer, reward_clusters, cfg.rewards, self.tokenizer)  # type: ignore[arg-type]
        self.scheduler: RequestScheduler | None = None
        if cfg.asynchrony.enabled:
            self.scheduler = make_scheduler(self)
        elif self.actor_infer is not None:
            self.set_model_update_pair(self.actor_train, self.actor_infer, frequency=cfg.rollout.model_update_frequency)
        self.set_checkpoint_clusters(*[c for c in (self.actor_train, self.critic) if c is not None])
        self.rollout_mock = RolloutMock(cfg.rollout_mock, "rlvr")
        kl = cfg.kl
        self.kl_ctrl = make_kl_controller(kl.ctrl_type, kl.init_coef, kl.target, kl.horizon)
        self.running = {domain: RunningMoments() for domain in cfg.rewards}  # norm_*_type: running

    # --- state ------------------------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        if self.scheduler is not None:
            return {"prompts": self.prompts.state_dict(), "async": self.scheduler.state_dict()}
        return {"prompts": self.prompts.state_dict()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state["prompts"])
        if self.scheduler is not None and "async" in state:
            self.scheduler.load_state_dict(state["async"])

    def algorithm_state(self) -> dict[str, Any]:
        running = {domain: moments.state_dict() for domain, moments in self.running.items()}
        return {"kl_ctrl": self.kl_ctrl.state_dict(), "running": running}

    def load_algorithm_state(self, state: dict[str, Any]) -> None:
        if "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        for domain, moments in state.get("running", {}).items():
            if domain in self.running:
                self.running[domain].load_state_dict(moments)

    # --- one step ---------------------------------------------------------------------------------------
    def update_plan(self, batch: DataProto, step: int) -> UpdatePlan:
        """This step's mini-batches and epochs; the seed makes its shuffles differ from other steps'."""
        update = self.config.update
        return UpdatePlan(
            num_mini_batches=update.num_mini_batches(len(batch)),
            epochs=update.epochs,
            seed=self.config.seed * 100_003 + step,
        )

    def old_log_probs_from_train_forward(self, plan: UpdatePlan) -> bool:
        """One on-policy update in 'auto' mode: the training forward's own (detached) log-probs are the old ones,
        exactly, so no recompute pass is needed (see CorrectionSection.old_log_probs_recompute)."""
        cfg = self.config
        auto = cfg.correction.old_log_probs_recompute == "auto"
        # Async samples come from older policies: the behaviour log-probs are the rollout engine's.
        return auto and not cfg.asynchrony.enabled and not cfg.recompute_old_log_probs(plan.num_mini_batches)

    def score_with_models(self, batch: DataProto, plan: UpdatePlan) -> None:
        """Reference and teacher log-probs (KL, OPD), old log-probs (a recompute pass, or the engine's) and values
        (GAE), at once."""
        routes, pending = self.teachers.start(batch)
        if self.reference is not None:
            pending["ref"] = self.reference.compute_log_probs(batch, blocking=False)
        if self.config.recompute_old_log_probs(plan.num_mini_batches):
            pending["old"] = self.actor_train.compute_log_probs(batch, blocking=False)
        if self.critic is not None:
            pending["values"] = self.critic.compute_values(batch, blocking=False)
        results = dict(zip(pending, materialize_all(*pending.values())))
        self.teachers.put(batch, routes, results)
        if "ref" in results:
            batch.batch["ref_log_probs"] = results["ref"].batch["log_probs"]
            if "full_log_probs" in results["ref"].batch.keys():  # kl penalty 'full'
                batch.batch["ref_full_log_probs"] = results["ref"].batch["full_log_probs"]
        if "old" in results:
            batch.batch["old_log_probs"] = results["old"].batch["log_probs"]
            batch.batch["entropy"] = results["old"].batch["entropy"]
            if "full_log_probs" in results["old"].batch.keys():
                batch.batch["old_full_log_probs"] = results["old"].batch["full_log_probs"]
        else:
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        if "values" in results:
            batch.batch["values"] = results["values"].batch["values"]

    def start_train(self, batch: DataProto, plan: UpdatePlan, step: int, *, on_policy: bool) -> list[PendingCall]:
        """Start the critic's and (after critic_warmup) the policy's updates, side by side."""
        pending = []
        if self.critic is not None:
            pending.append(self.critic.train_step(batch, plan, blocking=False))
        if step > self.config.update.critic_warmup:
            pending.append(self.actor_train.train_step(batch, plan, on_policy, blocking=False))
        return pending

    def train(self, batch: DataProto, plan: UpdatePlan, step: int) -> dict[str, Any]:
        """The critic's and (after critic_warmup) the policy's updates, side by side.

        A batch whose every sample is masked out of the loss (overlong / difficulty / length masks) trains nothing:
        the step is skipped and ``train/skipped_no_tokens`` is 1.
        """
        if float(batch.batch["response_mask"].sum()) == 0:
            return {"train/skipped_no_tokens": 1.0}
        pending = self.start_train(batch, plan, step, on_policy=self.old_log_probs_from_train_forward(plan))
        metrics: dict[str, Any] = {}
        for result in materialize_all(*pending):
            metrics.update(result.meta_info.get("metrics", {}))
        return metrics

    def validate(self) -> dict[str, float]:
        if not self.splits.eval:
            return {}
        return validate_policy(
            self.rollouts,
            self.splits.eval,
            self.collator,
            self.config,
            teacher_kl=(lambda batch: self.teachers.kl_sums(batch, self.actor_train)) if self.teachers else None,
        )

    def step(self, step: int) -> dict[str, Any]:
        """One step of the module docstring's algorithm; the engine gets the new weights at its end."""
        cfg = self.config
        if self.scheduler is not None:
            return async_step(self, step)
        timer, metrics = StepTimer(), {}
        started = time.perf_counter()
        with timer.phase("rollout"):  # generate + rewards (+ dynamic sampling), or replay a dump (rollout_mock)
            batch, rollout_found = self.collect_rollouts(step)
        metrics.update(rollout_found)
        if batch is not None:  # dynamic sampling may keep no informative group
            metrics.update(rollout_metrics(batch, scored=cfg.opd.rollouts_scored))
            if cfg.rollout.dump:
                self._dump(step, batch)
            plan = self.update_plan(batch, step)
            with timer.phase("log_probs"):  # reference, old log-probs, values
                self.score_with_models(batch, plan)
            metrics.update(entropy_metric(batch))
            with timer.phase("advantage"):
                metrics.update(compute_training_targets(batch, cfg, self.kl_ctrl.value, self.running))
            if "actor/kl" in metrics:
                self.kl_ctrl.update(metrics["actor/kl"], len(batch))
            with timer.phase("train"):  # critic.train_step, actor_train.train_step
                metrics.update(self.train(batch, plan, step))
            elapsed = time.perf_counter() - started
            tokens = float(batch.batch["response_mask"].sum())
            metrics["throughput/samples_per_s"] = len(batch) / elapsed
            metrics["throughput/tokens_per_s"] = tokens / elapsed
        evaluate = is_eval_step(step, cfg.eval_steps, self.max_steps)
        with timer.phase("weight_sync"):  # validation must see this step's policy: it forces a sync
            metrics.update(self.model_update(step, force=evaluate))
        if evaluate:
            with timer.phase("validation"):
                metrics.update(self.validate())
        metrics.update(timer.times)
        metrics["time/step_s"] = time.perf_counter() - started
        return metrics

    def collect_rollouts(self, step: int) -> tuple[DataProto | None, dict[str, Any]]:
        """This step's scored rollouts and their metrics: generated (and dumped, rollout_mock dump) or replayed."""
        cfg, mock = self.config, self.rollout_mock
        if mock.replaying:
            dump = mock.load(step)
            return dump.batch, dump.metrics
        rollout = self.rollouts.collect(
            self.prompts,
            step_generation_config(cfg.actor_infer.generating_args, cfg.seed, step),
            dynamic_sampling=cfg.dynamic_sampling.enabled,
            max_rounds=cfg.dynamic_sampling.max_generation_rounds,
            score=cfg.opd.rollouts_scored,
            filter_groups=not cfg.opd.pure,
        )
        if mock.dumping:
            mock.dump(step, rollout.batch, rollout.metrics)
        return rollout.batch, rollout.metrics

    def _dump(self, step: int, batch: DataProto) -> None:
        folder = self.output_dir / "rollouts"
        folder.mkdir(exist_ok=True)
        columns = batch.non_tensor_batch
        with (folder / f"step-{step:06d}.jsonl").open("w") as sink:
            for i in range(len(batch)):
                row = {k: columns[k][i] for k in ("prompt", "response_text", "reward_info", "tag") if k in columns}
                row.update({k: int(batch.batch[k][i]) for k in _DUMPED_INTS if k in batch.batch.keys()})
                sink.write(json.dumps({**row, "score": float(batch.batch["scores"][i])}, default=str) + "\n")

    def run(self) -> dict[str, float]:
        start = self.resume()
        last: dict[str, float] = {}
        if start > 0 and self.scheduler is not None:  # the engines restarted with the initial weights
            self.engines.sync(self.actor_train, 256 << 20)
            self.scheduler.restart_at(start)  # the policy trained by `start` steps
        elif start > 0:
            self.model_update(start, force=True)  # the engine restarted with the initial weights
        else:
            self.log_metrics(0, {**self.validate(), **self.splits.metrics})
        for step in self.steps(start):
            last = self.log_metrics(step, self.step(step))
            self.do_checkpoint(step, force=step == self.max_steps)
        if self.config.export_hf:
            self.export_hf(self.actor_train)
        return last


def rollout_metrics(batch: DataProto, *, scored: bool = True) -> dict[str, float]:
    """Lengths of a step's kept samples and, when ``scored``, score, accuracy, correctness and format
    (format-insensitive answers), overall and per tag."""
    data = batch.batch
    lengths = data["response_mask"].float().sum(-1)
    scores = data["scores"].float()
    out = {
        "rollout/response_length": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/samples": float(len(batch)),
    }
    if not scored:
        return out
    out["rollout/score"] = float(scores.mean())
    out["rollout/accuracy"] = float((scores >= 1.0 - 1e-6).float().mean())
    correct, formatted = grade_rollouts(batch)
    out["rollout/correct"] = share(correct) or 0.0
    format_share = share(formatted)
    if format_share is not None:
        out["rollout/format"] = format_share
    for tag in sorted(set(batch.non_tensor_batch["tag"])):
        rows = torch.tensor([t == tag for t in batch.non_tensor_batch["tag"]])
        out[f"rollout/score/{tag}"] = float(scores[rows].mean())
    return out


def entropy_metric(batch: DataProto) -> dict[str, float]:
    """The policy's mean token entropy, when a recompute pass measured it."""
    if "entropy" not in batch.batch.keys():
        return {}
    mask = batch.batch["response_mask"].float()
    return {"actor/entropy": float((batch.batch["entropy"] * mask).sum() / mask.sum().clamp(min=1))}
