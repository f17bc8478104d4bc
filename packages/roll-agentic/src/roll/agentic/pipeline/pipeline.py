"""The agentic pipeline: multi-turn RL on environments (ROLL's ``AgenticPipeline``).

One step::

    episodes = train_scheduler.get_batch(rollout_batch_size)   # env groups play against actor_infer, turn by turn
    ref_log_probs = reference.compute_log_probs(samples)       if kl.use_loss or kl.in_reward
    teacher_log_probs = teacher.compute_log_probs(samples)     on-policy distillation (opd): each teacher on the
                                                               episodes of its env tags
    old_log_probs = actor_train.compute_log_probs(samples)     when the update is not one on-policy step
    values = critic.compute_values(samples)                    for GAE
    advantages = estimator(samples)                            trajectory-wise (grpo, reinforce, gae,
                                                               agentic_reinforce) or step-wise (gigpo, step_reinforce)
    critic.train_step(samples, plan); actor_train.train_step(samples, plan)
    model_update(actor_train -> actor_infer); policy version += 1
    val_scheduler.get_batch()                                  every eval_steps, on held-out env seeds
                                                               (OPD: + val/kl_to_teacher on those episodes)

With ``asynchrony.generation_ratio`` (ROLL's ``async_generation_ratio``) > 0 the episodes come from
:class:`~roll.agentic.scheduler.background.BackgroundRollouts`: env groups keep playing while the actor trains, at
most ``ratio`` policy versions stale; generation is paused for the weight sync and validation at each step's end.
``rollout_mock`` dumps each step's batch, or replays dumped batches instead of playing (roll.pipelines.rollout_mock).

Before step 1, ``warmup.steps`` behaviour-cloning steps on a scripted policy's episodes (optional; with
``warmup.cache`` trained once and reused, :mod:`roll.agentic.pipeline.warmup_cache`); a reference then takes the
warmed-up weights (``warmup.reference: warmed``), so the KL term anchors RL on the clone. Env faults
(an env that raises, hangs past ``step_timeout_s`` or returns malformed output) end their episode with a reason;
training replaces the group, validation counts the episode as failed; both are in the step's metrics. A step that
faults left with nothing to train is skipped; ``rollout.max_faulted_steps`` such steps in a row stop the run
(:mod:`roll.agentic.scheduler.faulted_steps`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from roll.agentic.pipeline.adjust import adjust_batch, batch_unit
from roll.agentic.pipeline.advantage import attach_step_returns, compute_agentic_targets
from roll.agentic.pipeline.config import VAL_SEED_OFFSET, AgenticConfig
from roll.agentic.pipeline.lengths import setup_checks
from roll.agentic.pipeline.rollouts import PolicyEndpoint, make_scheduler, write_rollout
from roll.agentic.pipeline.warmup_cache import WarmupCache
from roll.agentic.pipeline.workers import AgenticActorWorker
from roll.agentic.policy import MockPolicyClient, NoPolicyClient
from roll.agentic.scheduler import RolloutBatch, RolloutScheduler
from roll.agentic.scheduler.background import BackgroundRollouts
from roll.agentic.scheduler.faulted_steps import FaultedSteps
from roll.pipelines.algorithms import make_kl_controller
from roll.pipelines.base import BasePipeline, Role
from roll.pipelines.rlvr.opd import kl_metrics, teacher_role_name
from roll.pipelines.rlvr.teacher_routing import TeacherRouter
from roll.pipelines.rlvr.teacher_scoring import TeacherScoring
from roll.pipelines.rlvr.workers import CriticWorker, InferWorker, PolicyWorker
from roll.pipelines.rollout_mock import RolloutMock
from roll.pipelines.stages import StepTimer, UpdatePlan, is_eval_step
from roll.protocol import DataProto
from roll.runtime import import_target, materialize_all

__all__ = ["AgenticPipeline", "adjust_batch"]

logger = logging.getLogger(__name__)
RL_ELAPSED = "time/rl_elapsed_s"
"""RL wall time since the run's first RL step, resumed runs included (what ``max_rl_time_s`` bounds)."""


class AgenticPipeline(BasePipeline):
    config_cls = AgenticConfig
    config: AgenticConfig

    def setup(self) -> None:
        cfg = self.config
        # 1. tokenizer and envs first: a bad env config, or a sequence_length that does not fit an env's first prompt
        # or the model, fails before anything starts
        self.tokenizer = setup_checks(cfg, cfg.env_managers(), cfg.actor_train.model_args)
        self.faulted_steps = FaultedSteps(cfg.rollout.max_faulted_steps, cfg.train_env_manager.name, self.output_dir)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self.generation_config = cfg.actor_infer.generating_args.model_copy(update={"num_return_sequences": 1})
        kl = cfg.kl  # the in-reward KL's coefficient (kl.in_reward); saved with checkpoints
        self.kl_ctrl = make_kl_controller(kl.ctrl_type, kl.init_coef, kl.target, kl.horizon)
        # 2. session; 3. roles
        self.open_session()
        roles = {
            "actor_train": Role(AgenticActorWorker, cfg.actor_train, cfg.actor_settings()),
            "actor_infer": Role(InferWorker, cfg.actor_infer),
        }
        if cfg.needs_reference and cfg.reference is not None:
            roles["reference"] = Role(PolicyWorker, cfg.reference, cfg.policy_settings())
        if cfg.critic is not None:
            roles["critic"] = Role(CriticWorker, cfg.critic, cfg.critic_settings())
        teachers = cfg.teacher_roles() if cfg.opd.on else {}
        for name, teacher in teachers.items():  # one role per teacher: "teacher", or "teacher/<name>" for several
            roles[teacher_role_name(name)] = Role(PolicyWorker, teacher, cfg.teacher_settings())
        clusters = self.create_clusters(roles)
        self.actor_train, self.actor_infer = clusters["actor_train"], clusters["actor_infer"]
        self.reference, self.critic = clusters.get("reference"), clusters.get("critic")
        teacher_clusters = {name: clusters[teacher_role_name(name)] for name in teachers}
        routing = (cfg.env_tag_domains(), cfg.teacher_tags_of())
        self.teachers = TeacherScoring(teacher_clusters, TeacherRouter(*routing, pure=cfg.opd.pure))
        # validation episodes of tags no teacher takes are left out of val/kl_to_teacher, not refused
        self.val_teachers = TeacherScoring(teacher_clusters, TeacherRouter(*routing, pure=False))
        # 4. wiring: weight sync, checkpoints, one policy endpoint and scheduler per mode
        self.set_model_update_pair(self.actor_train, self.actor_infer, frequency=cfg.rollout.model_update_frequency)
        self.set_checkpoint_clusters(*[c for c in (self.actor_train, self.critic) if c is not None])
        remote = cfg.rollout.env_workers == "ray"
        self.background: BackgroundRollouts | None = None  # async rollouts: started by run()
        self.buffer_state: dict[str, Any] | None = None  # a resumed async run's buffer counters (load_data_state)
        self.rollout_mock = RolloutMock(cfg.rollout_mock, "agentic")
        self.val_mock = RolloutMock(cfg.rollout_mock, "agentic", scope="val")
        gated = cfg.asynchrony.enabled
        # a weight sync's pause waits for the running requests at most as long as one actor_infer call may take
        pause_timeout = cfg.actor_infer.rpc_timeout_s
        self.endpoints = {
            "train": PolicyEndpoint(
                self.actor_infer, self.pad_token_id, remote=remote, gated=gated, pause_timeout_s=pause_timeout
            )
        }
        self.train_scheduler = self._scheduler(cfg.train_env_manager, "train", cfg.seed)
        self.val_scheduler: RolloutScheduler | None = None
        if cfg.val_env_manager is not None:
            if cfg.val_env_manager.llm_proxy.proxy_type == "policy":  # a proxy (openai, random) needs no endpoint
                self.endpoints["val"] = PolicyEndpoint(self.actor_infer, self.pad_token_id, remote=remote)
            self.val_scheduler = self._scheduler(cfg.val_env_manager, "val", cfg.seed + VAL_SEED_OFFSET)

    def _scheduler(self, manager: Any, mode: str, seed: int) -> RolloutScheduler:
        cfg = self.config
        return make_scheduler(
            manager,
            cfg.custom_envs,
            self.tokenizer,
            self.endpoints[mode].client if mode in self.endpoints else NoPolicyClient(),
            generation_config=self.generation_config,
            sequence_length=cfg.rollout.sequence_length,
            mode=mode,
            seed=seed,
            resources=self.session.resources if cfg.rollout.env_workers == "ray" else None,
        )

    # --- state ------------------------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        # async: with the rounds played or playing but not trained on, which a resumed run plays again
        rounds = self.background.state() if self.background is not None else self.train_scheduler.state()
        return {**rounds, "faulted_steps": self.faulted_steps.state()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        if state:
            self.train_scheduler.load_state(state)
            self.buffer_state = state.get("buffer")  # async: the background rollouts' buffer starts from it
            self.faulted_steps.load_state(state.get("faulted_steps", []))  # the streak goes on across a resume

    def algorithm_state(self) -> dict[str, Any]:
        return {"kl_ctrl": self.kl_ctrl.state_dict()}

    def load_algorithm_state(self, state: dict[str, Any]) -> None:
        if "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])

    # --- pieces of a step -------------------------------------------------------------------------------
    def batch_unit(self) -> int:
        """ROLL's batch unit for batch_adjust_mode random_sample (see roll.agentic.pipeline.adjust)."""
        cfg = self.config
        args, dp = cfg.actor_train.training_args, self.actor_train.dp_size or 1
        infer = [cfg.actor_train.infer_batch_size * dp]
        for role, cluster in ((cfg.reference, self.reference), (cfg.critic, self.critic)):
            if role is not None and cluster is not None:
                infer.append(role.infer_batch_size * (cluster.dp_size or 1))
        if cfg.critic is not None and self.critic is not None:
            critic = cfg.critic.training_args
            infer.append(
                critic.per_device_train_batch_size * critic.gradient_accumulation_steps * (self.critic.dp_size or 1)
            )
        return batch_unit(args.per_device_train_batch_size * args.gradient_accumulation_steps * dp, infer)

    def update_plan(self, batch: DataProto, step: int) -> UpdatePlan:
        update = self.config.update
        return UpdatePlan(update.num_mini_batches(len(batch)), update.epochs, self.config.seed * 100_003 + step)

    def score_with_models(self, batch: DataProto, plan: UpdatePlan) -> bool:
        """Reference and teacher log-probs, old log-probs (unless the update is one on-policy step) and values, at
        once. Returns whether the training forward supplies the old log-probs itself."""
        routes, pending = self.teachers.start(batch)
        # async samples come from older policies: their behaviour log-probs are the rollout engine's
        on_policy = not self.config.asynchrony.enabled and not self.config.recompute_old_log_probs(
            plan.num_mini_batches
        )
        if self.reference is not None:
            pending["ref"] = self.reference.compute_log_probs(batch, blocking=False)
        if not on_policy:
            pending["old"] = self.actor_train.compute_log_probs(batch, blocking=False)
        if self.critic is not None:
            pending["values"] = self.critic.compute_values(batch, blocking=False)
        results = dict(zip(pending, materialize_all(*pending.values())))
        self.teachers.put(batch, routes, results)
        if "ref" in results:
            batch.batch["ref_log_probs"] = results["ref"].batch["log_probs"]
        batch.batch["old_log_probs"] = (
            results["old"].batch["log_probs"] if "old" in results else batch.batch["rollout_log_probs"]
        )
        if "values" in results:
            batch.batch["values"] = results["values"].batch["values"]
        return on_policy

    def train(self, batch: DataProto, plan: UpdatePlan, step: int, on_policy: bool) -> dict[str, Any]:
        pending = []
        if self.critic is not None:
            pending.append(self.critic.train_step(batch, plan, blocking=False))
        if step > self.config.update.critic_warmup:
            pending.append(self.actor_train.train_step(batch, plan, on_policy, blocking=False))
        metrics: dict[str, Any] = {}
        for result in materialize_all(*pending):
            metrics.update(result.meta_info.get("metrics", {}))
        return metrics

    def sync_weights(self, step: int, *, force: bool) -> dict[str, float]:
        """Weights to actor_infer (every model_update_frequency steps, or ``force``); with async rollouts always,
        and only inside :meth:`generation_paused`."""
        force = force or self.background is not None
        metrics = self.model_update(step, force=force)
        if metrics or force:
            for endpoint in self.endpoints.values():
                endpoint.set_policy_version(step)
            if self.background is not None:
                self.background.set_version(step)
        return metrics

    @contextlib.contextmanager
    def generation_paused(self) -> Iterator[None]:
        """Async rollouts: no training-rollout request runs inside (weight sync, validation); a no-op otherwise."""
        if self.background is None:
            yield
            return
        endpoint = self.endpoints["train"]
        endpoint.pause()
        try:
            yield
        finally:
            endpoint.resume()

    def take_rollouts(self, step: int) -> RolloutBatch:
        """This step's trajectories: played (async: taken from the background rollouts), or replayed from a
        rollout_mock dump; dumped in rollout_mock dump mode."""
        mock = self.rollout_mock
        if mock.replaying:
            dump = mock.load(step)
            return RolloutBatch(dump.batch, [], dict(dump.metrics))
        if self.background is not None:
            rollout = self.background.take(step, self.config.asynchrony.take_timeout_s)
        else:
            rollout = self.train_scheduler.get_batch(self.config.rollout.batch_size, step)
        if mock.dumping:
            mock.dump(step, rollout.batch, rollout.metrics)
        return rollout

    def validate(self, step: int) -> dict[str, float]:
        if self.val_scheduler is None:
            return {}
        mock = self.val_mock  # ROLL's rollout_mock covers the validation scheduler too (dump_dir/val)
        if mock.replaying:
            return dict(mock.load(step).metrics)
        out = self.val_scheduler.get_batch(self.config.rollout.val_batch_size, step)
        if mock.dumping:
            mock.dump(step, out.batch, out.metrics)
        if self.config.rollout.dump:
            write_rollout(self.output_dir / "rollouts", f"val-step-{step:06d}", out, self.tokenizer)
        return {**out.metrics, **self.kl_to_teachers(out.batch)}

    def kl_to_teachers(self, batch: DataProto | None) -> dict[str, float]:
        """On-policy distillation: ``val/kl_to_teacher`` (and per named teacher ``val/kl_to_teacher/<name>``), the
        token mean of ``log p_student - log p_teacher`` over the validation episodes' assistant tokens, student
        log-probs from actor_train; an estimate of the reverse KL when validation samples at the training
        temperature. Episodes of env tags no teacher takes are left out; {} without teachers or episodes."""
        if not self.val_teachers or batch is None or len(batch) == 0:
            return {}
        sums = self.val_teachers.kl_sums(batch, self.actor_train)
        if sum(tokens for _, tokens in sums.values()) == 0:
            return {}
        return kl_metrics(sums, "val/kl_to_teacher")

    def step(self, step: int) -> dict[str, Any]:
        cfg = self.config
        timer, metrics = StepTimer(), {}
        started = time.perf_counter()
        with timer.phase("rollout"):
            rollout = self.take_rollouts(step)
        metrics.update(rollout.metrics)
        metrics["rollout/faulted_steps_in_a_row"] = float(self.faulted_steps.record(step, rollout))
        if cfg.rollout.dump:
            write_rollout(self.output_dir / "rollouts", f"step-{step:06d}", rollout, self.tokenizer)
        batch = rollout.batch
        if batch is not None:
            rows = len(batch)
            attach_step_returns(batch, cfg)  # on the whole rollout, before rows are dropped or copied
            batch = adjust_batch(
                batch,
                self.actor_train.dp_size or 1,
                cfg.update.batch_adjust_mode,
                unit=self.batch_unit(),
                seed=cfg.seed * 100_003 + step,
            )
            metrics["rollout/batch_adjust_delta"] = float(len(batch) - rows)
            versions = [int(v) for v in batch.non_tensor_batch["policy_version"]]
            metrics["rollout/policy_lag"] = float(step - 1 - min(versions))
            plan = self.update_plan(batch, step)
            with timer.phase("log_probs"):
                on_policy = self.score_with_models(batch, plan)
            with timer.phase("advantage"):
                metrics.update(compute_agentic_targets(batch, cfg, self.kl_ctrl.value))
                if cfg.kl.in_reward_on:
                    self.kl_ctrl.update(metrics["actor/kl"], len(batch))
            with timer.phase("train"):
                metrics.update(self.train(batch, plan, step, on_policy))
            metrics["rollout/samples"] = float(len(batch))
            metrics["rollout/response_tokens"] = float(batch.batch["response_mask"].sum())
        evaluate = is_eval_step(step, cfg.eval_steps, self.max_steps)
        with self.generation_paused():
            with timer.phase("weight_sync"):
                metrics.update(self.sync_weights(step, force=evaluate))
            if evaluate:
                with timer.phase("validation"):
                    metrics.update(self.validate(step))
        metrics.update(timer.times)
        metrics["time/step_s"] = time.perf_counter() - started
        return metrics

    # --- warm-up ----------------------------------------------------------------------------------------
    def warm_up(self) -> dict[str, Any]:
        """Behaviour cloning of ``warmup.policy`` on the training envs (separate seeds, groups of
        ``warmup.group_size`` episodes per layout): each step plays ``episodes_per_step`` episodes with it and takes
        one on-policy step with advantage 1 on its tokens (the PPO loss at ratio 1 is then the negative
        log-likelihood's gradient)."""
        warm = self.config.warmup
        policy = import_target(warm.policy, "warmup.policy")(**warm.policy_kwargs)
        client = MockPolicyClient(self.tokenizer, policy, seed=warm.seed)
        manager = self.config.warmup_env_manager()
        scheduler = make_scheduler(
            manager,
            self.config.custom_envs,
            self.tokenizer,
            client,
            generation_config=self.generation_config,
            sequence_length=self.config.rollout.sequence_length,
            mode="train",
            seed=warm.seed,
            resources=None,
        )
        started = time.perf_counter()
        metrics: dict[str, Any] = {}
        size = manager.group_size
        episodes = max(size, warm.episodes_per_step // size * size)
        updates = 0
        recent_nll: list[float] = []  # since the last log line (the last window is what warmup/nll reports)
        if warm.learning_rate is not None:
            self.actor_train.set_learning_rate(warm.learning_rate)
        try:
            for step in range(1, warm.steps + 1):
                out = scheduler.get_batch(episodes, step)
                if out.batch is None:
                    continue
                batch = adjust_batch(out.batch, self.actor_train.dp_size or 1, "delete")
                batch.batch["advantages"] = batch.batch["response_mask"].float()
                plan = UpdatePlan(min(warm.num_mini_batches, len(batch)), 1, warm.seed + step)
                result = self.actor_train.train_step(
                    batch, plan, old_log_probs_from_train_forward=True, behaviour_cloning=True
                )
                updates += plan.num_mini_batches
                trained = result.meta_info.get("metrics", {})
                recent_nll.extend(-value for value in trained.get("actor/log_prob", [0.0]))  # before each update
                metrics = {
                    "warmup/expert_success": out.metrics.get("rollout/success", 0.0),
                    "warmup/nll": recent_nll,
                    "warmup/learning_rate": trained.get("actor/lr", [0.0]),
                }
                if step % 10 == 0 or step == warm.steps:
                    logger.info(
                        "warm-up step %d/%d (%.0f s), training NLL %.4f over the last %d mini-batches",
                        step,
                        warm.steps,
                        time.perf_counter() - started,
                        sum(recent_nll) / len(recent_nll),
                        len(recent_nll),
                    )
                    recent_nll = []
        finally:
            scheduler.close()
            if warm.learning_rate is not None:
                self.actor_train.set_learning_rate(self.config.actor_train.training_args.learning_rate)
        metrics["time/warmup_s"] = time.perf_counter() - started
        metrics["warmup/optimizer_steps"] = float(updates)
        return metrics

    def cached_warm_up(self) -> dict[str, Any]:
        """:meth:`warm_up`, or its saved result (``warmup.cache``; :mod:`roll.agentic.pipeline.warmup_cache`)."""
        cache = WarmupCache(self.config)
        saved = cache.metrics()
        if saved is not None:
            started = time.perf_counter()
            self.actor_train.load_checkpoint(str(cache.checkpoint))
            if self.config.warmup.learning_rate is not None:  # the key leaves RL's rate out: the entry holds another's
                self.actor_train.set_learning_rate(self.config.actor_train.training_args.learning_rate)
            logger.info("warm-up loaded from the cache: %s", cache.folder)
            loaded = {"warmup/cached": 1.0, "warmup/trained_s": saved.get("time/warmup_s", 0.0)}
            return {**saved, **loaded, "time/warmup_s": time.perf_counter() - started}
        metrics = self.warm_up()
        staged = cache.staging()
        self.actor_train.save_checkpoint(str(staged / "actor_train"))
        logger.info("warm-up saved to the cache: %s", cache.commit(staged, metrics))
        return {**metrics, "warmup/cached": 0.0}

    @property
    def anchors_reference(self) -> bool:
        """Whether the reference takes the warmed-up weights (``warmup.reference: warmed``)."""
        warm = self.config.warmup
        return self.reference is not None and warm.steps > 0 and warm.reference == "warmed"

    def trained_warm_up(self) -> dict[str, Any]:
        """The warm-up (cached or not), then the reference anchored on it when :attr:`anchors_reference`."""
        metrics = self.cached_warm_up() if self.config.warmup.cache else self.warm_up()
        if self.anchors_reference:
            metrics.update(self.anchor_reference())
        return metrics

    def anchor_reference(self) -> dict[str, float]:
        """Copy actor_train's weights into the reference (one weight sync), so that the KL term measures the
        distance from the warmed-up policy rather than from the model before behaviour cloning."""
        assert self.reference is not None
        synced = self.copy_weights(self.actor_train, self.reference)
        logger.info("reference anchored on the warmed-up policy (%.2f s)", synced["weight_sync/seconds"])
        return {"warmup/reference_sync_s": synced["weight_sync/seconds"]}

    # --- loop -------------------------------------------------------------------------------------------
    def run(self) -> dict[str, float]:
        if self.session.resume_path is not None and self.anchors_reference:
            # no checkpoint holds the warmed-up weights the reference had: warm up again (or load the cached
            # warm-up), hand them over, then let the checkpoint replace actor_train's state
            if not self.config.warmup.cache:
                logger.warning("resuming: warming up again for the reference (warmup.cache: true avoids it)")
            elif (cache := WarmupCache(self.config)).metrics() is None:
                logger.warning(
                    "resuming: the warm-up cache has no entry for this config and code (key %s under %s; the code or "
                    "a setting the warm-up depends on changed since the run started, or the cache was cleared): "
                    "warming up again, so the reference is anchored on a retrained clone, which may differ from the "
                    "one this run started from",
                    cache.key,
                    cache.root,
                )
            self.trained_warm_up()
        start = self.resume()
        last: dict[str, float] = {}
        if start > 0:
            self.sync_weights(start, force=True)
        else:
            first: dict[str, Any] = {}
            if self.config.warmup.steps > 0:
                first.update(self.trained_warm_up())
                self.sync_weights(0, force=True)
            self.log_metrics(0, {**first, **self.validate(0)})
        ratio = self.config.asynchrony.generation_ratio
        if ratio:
            self.background = BackgroundRollouts(
                self.train_scheduler,
                batch_size=self.config.rollout.batch_size,
                ratio=ratio,
                version=start,
                buffer_state=self.buffer_state,
            )
        # a resumed run's RL time goes on from its checkpoint's, so max_rl_time_s bounds the run, not each start
        self.rl_started = time.perf_counter() - self.rl_time_spent()
        limit = self.config.max_rl_time_s
        for step in self.steps(start):
            metrics = self.step(step)
            elapsed = time.perf_counter() - self.rl_started
            out_of_time = limit is not None and elapsed >= limit and step < self.max_steps
            if out_of_time and not is_eval_step(step, self.config.eval_steps, self.max_steps):
                with self.generation_paused():
                    metrics.update(self.sync_weights(step, force=True))
                    metrics.update(self.validate(step))
            metrics[RL_ELAPSED] = elapsed
            last = self.log_metrics(step, metrics)
            self.faulted_steps.check()  # env faults left step after step with nothing to train: stop, metrics kept
            self.do_checkpoint(step, force=step == self.max_steps or out_of_time)
            if out_of_time:
                break
        if self.config.export_hf:
            self.export_hf(self.actor_train)
        return last

    def rl_time_spent(self) -> float:
        """The RL wall time of the steps before this start (``time/rl_elapsed_s`` of the checkpoint's last step; 0
        in a new run)."""
        for row in reversed(self.state.metrics_history):
            if RL_ELAPSED in row:
                return float(row[RL_ELAPSED])
        return 0.0

    def shutdown(self, graceful: bool = True) -> None:
        background = getattr(self, "background", None)
        if background is not None:
            with contextlib.suppress(Exception):
                background.close()
        for scheduler in (getattr(self, "train_scheduler", None), getattr(self, "val_scheduler", None)):
            if scheduler is not None:
                with contextlib.suppress(Exception):  # workers may be gone after a failure; clusters go below
                    scheduler.close()
        for endpoint in getattr(self, "endpoints", {}).values():
            endpoint.close()
        super().shutdown(graceful)
