"""The RLVR pipeline: RL with verifiable rewards (PPO, GRPO, REINFORCE++, RLOO, GSPO, DAPO-style sampling).

One step::

    rollouts = actor_infer.generate(prompts); rewards[domain].compute_rewards(rollouts)   (+ dynamic sampling)
    ref_log_probs = reference.compute_log_probs(rollouts)        if KL is on
    old_log_probs = actor_train.compute_log_probs(rollouts)      (or the rollout engine's)
    values = critic.compute_values(rollouts)                     for GAE
    advantages = estimator(scores, masks, KL, values)
    critic.train_step(rollouts); actor_train.train_step(rollouts)
    model_update(actor_train -> actor_infer)                     every model_update_frequency steps
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch

from roll.pipelines.algorithms import make_kl_controller
from roll.pipelines.base import BasePipeline
from roll.pipelines.data import PromptCollator, load_task_rows, prepare_examples
from roll.pipelines.rewards import resolve_reward_worker
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.rlvr.rollout import PromptSource, Rollouts, check_reward_fields
from roll.pipelines.rlvr.validation import validate_policy
from roll.pipelines.rlvr.workers import ActorWorker, CriticWorker, InferWorker, PolicyWorker
from roll.pipelines.tokenizers import load_tokenizer
from roll.protocol import DataProto
from roll.runtime import materialize_all

__all__ = ["RLVRPipeline"]


class _Timer:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.times[f"time/{name}_s"] = self.times.get(f"time/{name}_s", 0.0) + time.perf_counter() - start


class RLVRPipeline(BasePipeline):
    config_cls = RLVRConfig
    config: RLVRConfig

    def prepare_data(self) -> None:
        cfg = self.config
        data_args = cfg.actor_train.data_args
        self.tokenizer = load_tokenizer(cfg.actor_train.model_args)
        args = data_args.model_copy(update={"max_prompt_length": data_args.max_prompt_length or cfg.prompt_length})
        rows = load_task_rows(args, "prompt")
        self.train_prompts, report = prepare_examples(rows, "prompt", self.tokenizer, args, name="train")
        self.data_metrics = report.as_metrics("data/train")
        self.val_prompts = []
        if data_args.eval_file_name:
            val_rows = load_task_rows(args, "prompt", split="eval")
            self.val_prompts, val_report = prepare_examples(val_rows, "prompt", self.tokenizer, args, name="eval")
            self.data_metrics.update(val_report.as_metrics("data/eval"))
        workers = {domain: resolve_reward_worker(reward.reward_type) for domain, reward in cfg.rewards.items()}
        check_reward_fields(self.train_prompts, cfg.rewards, workers)
        check_reward_fields(self.val_prompts, cfg.rewards, workers)
        self.collator = PromptCollator(self.tokenizer.pad_token_id, cfg.prompt_length)
        self.prompts = PromptSource(
            self.train_prompts,
            cfg.rewards,
            cfg.domain_interleave_probs,
            self.collator,
            batch_size=cfg.rollout_batch_size,
            seed=data_args.seed,
            shuffle=data_args.shuffle,
        )

    def __init__(self, config: RLVRConfig) -> None:
        super().__init__(config)
        roles: dict[str, tuple[Any, Any]] = {
            "actor_train": (ActorWorker, config.actor_train),
            "actor_infer": (InferWorker, config.actor_infer),
        }
        if config.needs_reference:
            roles["reference"] = (PolicyWorker, config.reference)
        if config.critic is not None:
            roles["critic"] = (CriticWorker, config.critic)
        for domain, reward in config.rewards.items():
            roles[f"reward/{domain}"] = (resolve_reward_worker(reward.reward_type), reward)
        clusters = self.create_clusters_parallel(roles)
        self.actor_train, self.actor_infer = clusters["actor_train"], clusters["actor_infer"]
        self.reference = clusters.get("reference")
        self.critic = clusters.get("critic")
        self.reward_clusters = {d: clusters[f"reward/{d}"] for d in config.rewards}
        self.rollouts = Rollouts(self.actor_infer, self.reward_clusters, config.rewards, self.tokenizer)
        self.set_model_update_pair(self.actor_train, self.actor_infer, frequency=config.model_update_frequency)
        self.set_checkpoint_clusters(*[c for c in (self.actor_train, self.critic) if c is not None])
        self.kl_ctrl = make_kl_controller(config.kl_ctrl_type, config.init_kl_coef, config.target_kl, config.kl_horizon)

    # --- state ------------------------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        return {"prompts": self.prompts.state_dict()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state["prompts"])

    def algorithm_state(self) -> dict[str, Any]:
        return {"kl_ctrl": self.kl_ctrl.state_dict()}

    def load_algorithm_state(self, state: dict[str, Any]) -> None:
        if "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])

    # --- one step ---------------------------------------------------------------------------------------
    def _score_with_models(self, batch: DataProto, timer: _Timer) -> None:
        cfg = self.config
        recompute = cfg.recompute_old_log_probs(batch.meta_info["num_mini_batches"])
        # Without a recompute in 'auto' mode the update is one on-policy step: the training forward's own
        # log-probs (detached) are exactly the old policy's, so the loss uses them (ratio 1).
        batch.meta_info["old_log_probs_from_train_forward"] = (
            not recompute and cfg.enable_old_logprobs_recompute == "auto"
        )
        pending = {}
        if self.reference is not None:
            pending["ref"] = self.reference.compute_log_probs(batch, blocking=False)
        if recompute:
            pending["old"] = self.actor_train.compute_log_probs(batch, blocking=False)
        if self.critic is not None:
            pending["values"] = self.critic.compute_values(batch, blocking=False)
        results = dict(zip(pending, timer("log_probs", lambda: materialize_all(*pending.values()))))
        if "ref" in results:
            batch.batch["ref_log_probs"] = results["ref"].batch["log_probs"]
        if "old" in results:
            batch.batch["old_log_probs"] = results["old"].batch["log_probs"]
            batch.batch["entropy"] = results["old"].batch["entropy"]
        else:
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        if "values" in results:
            batch.batch["values"] = results["values"].batch["values"]

    def _train(self, batch: DataProto, step: int, timer: _Timer) -> dict[str, Any]:
        cfg = self.config
        batch.meta_info["seed"] = cfg.seed * 100_003 + step
        metrics: dict[str, Any] = {}
        pending = {}
        if self.critic is not None:
            pending["critic"] = self.critic.train_step(batch, blocking=False)
        if step > cfg.critic_warmup:
            pending["actor"] = self.actor_train.train_step(batch, blocking=False)
        for result in timer("train", lambda: materialize_all(*pending.values())):
            metrics.update(result.meta_info.get("metrics", {}))
        return metrics

    def _rollout_metrics(self, batch: DataProto) -> dict[str, float]:
        data = batch.batch
        lengths = data["response_mask"].float().sum(-1)
        scores = data["scores"].float()
        out = {
            "rollout/score": float(scores.mean()),
            "rollout/accuracy": float((scores >= 1.0 - 1e-6).float().mean()),
            "rollout/response_length": float(lengths.mean()),
            "rollout/response_length_max": float(lengths.max()),
            "rollout/samples": float(len(batch)),
        }
        for tag in sorted(set(batch.non_tensor_batch["tag"])):
            rows = torch.tensor([t == tag for t in batch.non_tensor_batch["tag"]])
            out[f"rollout/score/{tag}"] = float(scores[rows].mean())
        return out

    def _dump(self, step: int, batch: DataProto) -> None:
        folder = self.output_dir / "rollouts"
        folder.mkdir(exist_ok=True)
        columns = batch.non_tensor_batch
        with (folder / f"step-{step:06d}.jsonl").open("w") as sink:
            for i in range(len(batch)):
                row = {k: columns[k][i] for k in ("prompt", "response_text", "reward_info", "tag") if k in columns}
                sink.write(json.dumps({**row, "score": float(batch.batch["scores"][i])}, default=str) + "\n")

    def validate(self) -> dict[str, float]:
        if not self.val_prompts:
            return {}
        return validate_policy(self.rollouts, self.val_prompts, self.collator, self.config)

    def step(self, step: int) -> dict[str, Any]:
        """Rollout, scoring, advantages and updates of one step; then the engine gets the new weights."""
        cfg = self.config
        timer = _Timer()
        metrics: dict[str, Any] = {}
        started = time.perf_counter()
        result = timer(
            "rollout",
            lambda: self.rollouts.collect(
                self.prompts,
                cfg.actor_infer.generating_args,
                dynamic_sampling=cfg.dynamic_sampling,
                max_rounds=cfg.max_num_gen_batches,
            ),
        )
        metrics.update(result.metrics)
        batch = result.batch
        if batch is not None:
            metrics.update(self._rollout_metrics(batch))
            if cfg.rollout_dump:
                self._dump(step, batch)
            samples = len(batch)
            batch.meta_info["num_mini_batches"] = max(1, -(-samples // (cfg.ppo_mini_batch_size or samples)))
            self._score_with_models(batch, timer)
            if "entropy" in batch.batch.keys():
                mask = batch.batch["response_mask"].float()
                metrics["actor/entropy"] = float((batch.batch["entropy"] * mask).sum() / mask.sum().clamp(min=1))
            metrics.update(timer("advantage", lambda: compute_training_targets(batch, cfg, self.kl_ctrl.value)))
            if "actor/kl" in metrics:
                self.kl_ctrl.update(metrics["actor/kl"], len(batch))
            metrics.update(self._train(batch, step, timer))
            tokens = float(batch.batch["response_mask"].sum())
            elapsed = time.perf_counter() - started
            metrics.update(
                {"throughput/samples_per_s": len(batch) / elapsed, "throughput/tokens_per_s": tokens / elapsed}
            )
        evaluate = (cfg.eval_steps and step % cfg.eval_steps == 0) or step == cfg.max_steps
        # Validation must see this step's policy, so it forces a sync even between update steps.
        metrics.update(timer("weight_sync", lambda: self.model_update(step, force=bool(evaluate))))
        if evaluate:
            metrics.update(timer("validation", self.validate))
        metrics.update(timer.times)
        metrics["time/step_s"] = time.perf_counter() - started
        return metrics

    def run(self) -> dict[str, float]:
        start = self.resume()
        last: dict[str, float] = {}
        if start > 0:
            self.model_update(start, force=True)  # the engine restarted with the initial weights
        else:
            self.log_metrics(0, {**self.validate(), **self.data_metrics})
        for step in self.steps(start):
            last = self.log_metrics(step, self.step(step))
            self.do_checkpoint(step, force=step == self.config.max_steps)
        if self.config.export_hf:
            self.export_hf(self.actor_train)
        return last
