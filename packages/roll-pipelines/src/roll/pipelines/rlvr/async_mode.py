"""Async RLVR (``asynchrony.generation_ratio`` set): rollouts of later steps are generated while step k trains.

One async step::

    batch = scheduler.next_batch(train_version=k - 1)    groups at most `ratio` versions old; generation goes on
    log-probs / advantages / train, pumping the scheduler while the training cluster works
    scheduler.drain(); engines.sync(actor_train)          running segments end (partial rollouts), weights copied
    validation (every eval_steps); scheduler.resume()     unfinished samples continue under the new weights

Off-policy correction: the behaviour policy's log-probs are the rollout engine's (``rollout_log_probs``), so PPO's
ratio (and truncated IS, when on) corrects for staleness; the on-policy shortcut of the synchronous step is off.
Every sample's ``policy_version`` and ``staleness`` are in the batch; the bound is asserted when a group is taken.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ray

from roll.pipelines.base import Role
from roll.pipelines.engines import EnginePool
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.scheduler import RequestScheduler
from roll.pipelines.rlvr.workers import InferWorker
from roll.pipelines.stages import StepTimer, is_eval_step
from roll.runtime import Cluster, PendingCall, materialize_all

if TYPE_CHECKING:
    from roll.pipelines.rlvr.pipeline import RLVRPipeline

__all__ = ["async_step", "make_scheduler"]


def make_scheduler(pipeline: RLVRPipeline) -> RequestScheduler:
    """``actor_infer.world_size`` one-rank engines and the scheduler that feeds them."""
    cfg = pipeline.config
    role = cfg.actor_infer

    def make_engine(name: str) -> Cluster:
        engine = role.model_copy(update={"name": name, "world_size": 1})
        return pipeline.create_clusters({name: Role(InferWorker, engine)})[name]

    sync = cfg.asynchrony
    pool = EnginePool(
        make_engine,
        role.name,
        role.world_size or 1,
        request_timeout_s=sync.request_timeout_s,
        max_restarts=sync.max_restarts,
    )
    pipeline.engines = pool
    pipeline.rollouts.actor_infer = pool  # type: ignore[assignment]  # validation batches go to an engine
    return RequestScheduler(
        pool,
        pipeline.rollouts,
        pipeline.prompts,
        pipeline.collator,
        role.generating_args,
        ratio=sync.generation_ratio or 0,
        segment_tokens=sync.partial_rollout_tokens,
        requests_per_call=sync.requests_per_call,
        dynamic_sampling=cfg.dynamic_sampling.enabled,
        seed=cfg.seed,
        max_generation_rounds=cfg.dynamic_sampling.max_generation_rounds,
    )


def _wait_pumping(scheduler: RequestScheduler, calls: list[PendingCall]) -> list[Any]:
    """Results of ``calls``; generation goes on (the scheduler is pumped) until they are done."""
    refs = [ref for call in calls for ref in call]
    while refs:
        _, refs = ray.wait(refs, num_returns=len(refs), timeout=0)
        if refs:
            scheduler.pump()
    return materialize_all(*calls)


def async_step(pipeline: RLVRPipeline, step: int) -> dict[str, Any]:
    """One asynchronous step (module docstring)."""
    cfg, scheduler = pipeline.config, pipeline.scheduler
    assert scheduler is not None
    timer, metrics = StepTimer(), {}
    started = time.perf_counter()
    with timer.phase("rollout"):  # only the wait for enough fresh groups: generation itself never stops
        batch = scheduler.next_batch(train_version=step - 1)
    staleness = batch.batch["staleness"]
    bound = scheduler.buffer.bound
    if int(staleness.max()) > bound or int(staleness.min()) < 0:
        raise AssertionError(f"step {step}: staleness {staleness.tolist()} outside [0, {bound}]")
    from roll.pipelines.rlvr.pipeline import entropy_metric, rollout_metrics

    metrics.update(rollout_metrics(batch))
    if cfg.rollout.dump:
        pipeline._dump(step, batch)
    if pipeline.rollout_mock.dumping:
        pipeline.rollout_mock.dump(step, batch)
    metrics["async/batch_staleness_max"] = float(staleness.max())
    metrics["async/batch_staleness_mean"] = float(staleness.float().mean())
    plan = pipeline.update_plan(batch, step)
    with timer.phase("log_probs"):
        pipeline.score_with_models(batch, plan)
    metrics.update(entropy_metric(batch))
    with timer.phase("advantage"):
        metrics.update(compute_training_targets(batch, cfg, pipeline.kl_ctrl.value, pipeline.running))
    if "actor/kl" in metrics:
        pipeline.kl_ctrl.update(metrics["actor/kl"], len(batch))
    with timer.phase("train"):
        if float(batch.batch["response_mask"].sum()) == 0:  # every sample masked out of the loss
            metrics["train/skipped_no_tokens"] = 1.0
        else:
            for result in _wait_pumping(scheduler, pipeline.start_train(batch, plan, step, on_policy=False)):
                metrics.update(result.meta_info.get("metrics", {}))
    elapsed = time.perf_counter() - started
    metrics["throughput/samples_per_s"] = len(batch) / elapsed
    metrics["throughput/tokens_per_s"] = float(batch.batch["response_mask"].sum()) / elapsed
    with timer.phase("weight_sync"):  # the engines pause only for the running segments and the copy
        scheduler.drain()
        metrics.update(
            pipeline.engines.sync(
                pipeline.actor_train, getattr(cfg.actor_infer, "model_update_buffer_size_mb", 256) << 20
            )
        )
    if is_eval_step(step, cfg.eval_steps, pipeline.max_steps):
        with timer.phase("validation"):
            metrics.update(pipeline.validate())
    scheduler.resume()
    metrics.update(scheduler.metrics())
    metrics.update(timer.times)
    metrics["time/step_s"] = time.perf_counter() - started
    return metrics
