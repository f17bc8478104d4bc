"""BasePipeline: what every driver-side algorithm shares (see the programming-model reference, "Pipeline").

A pipeline is built in explicit steps, nothing hidden in a constructor::

    with SFTPipeline(config) as pipeline:    # __init__ only stores the (asset-resolved) config
        pipeline.setup()                     # the subclass's ordered steps: data, session, roles, wiring
        pipeline.run()                       # resume, the loop, the last checkpoint and export
                                             # __exit__: shutdown() on every path

A subclass's ``setup`` loads its data first (so a data error surfaces before anything starts), then calls
:meth:`open_session` (output folder checks, config.yaml, Ray, resources, tracker, checkpoints), then
:meth:`create_clusters` with each role's worker class, config and own settings, then wires weight updates
(:meth:`set_model_update_pair`) and checkpointed roles (:meth:`set_checkpoint_clusters`).
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import yaml

from roll.pipelines.checkpoint import CheckpointManager, PipelineState
from roll.pipelines.config import FOLDER_FIX, BaseConfig, RoleConfig, folder_problem
from roll.pipelines.metrics import reduce_metrics
from roll.pipelines.plots import write_plots
from roll.pipelines.summary import STEPS_TOTAL_KEY
from roll.pipelines.tracking import Tracker, set_aside_metrics
from roll.runtime import ENV_WORKER_LOG, Cluster, ConfigError, ResourceManager, init, materialize_all
from roll.strategies import ModelUpdateGroup
from roll.strategies.weight_sync import weight_sync_env

__all__ = ["BasePipeline", "Role", "Session", "Terminated", "set_seed", "stop_on_sigterm"]

logger = logging.getLogger(__name__)
_clock = time.perf_counter  # the step timer's clock (a seam for tests)
# A normal shutdown still closes weight channels politely, but never waits on a stuck worker for long.
_CLOSE_TIMEOUT_S = 60.0


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Terminated(KeyboardInterrupt):
    """SIGTERM reached a running pipeline (``timeout``, Slurm, Kubernetes): it unwinds as Ctrl-C does, so the
    workers are stopped and the last complete checkpoint stays the resume point."""


def stop_on_sigterm() -> Any:
    """Make SIGTERM raise :class:`Terminated` in the driver; returns the handler it replaced (None off the main
    thread, where handlers cannot be set).

    Called after ``ray.init``, whose own handler ends the process from native code without unwinding: no
    ``finally`` runs, workers are not stopped, and the exit reads as a crash. A second SIGTERM ends the process
    at once (the default action), for a supervisor that insists.
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated(f"stopped by signal {signal.Signals(signum).name}")

    return signal.signal(signal.SIGTERM, handler)


@dataclass(frozen=True)
class Role:
    """A role to create: its worker class (a ``worker_cls`` in the role's config wins), config and own settings.

    ``settings`` is what the workers' ``initialize`` receives: that role's typed, resolved settings (None when
    the worker needs none), never the pipeline config.
    """

    worker_cls: type | str
    config: RoleConfig
    settings: Any = None


def _check_folder(path: Path, field: str) -> None:
    problem = folder_problem(path)
    if problem is not None:
        raise ConfigError(f"{field} {path} cannot be made: {problem}; {FOLDER_FIX[field]}")


@dataclass
class Session:
    """What a started pipeline holds: its output folder, checkpoints, Ray resources and trackers."""

    output_dir: Path
    checkpoints: CheckpointManager
    resume_path: Path | None
    resources: ResourceManager
    tracker: Tracker
    previous_sigterm: Any = None  # the SIGTERM handler open() replaced, put back by close()

    @property
    def worker_log(self) -> Path:
        """Where the workers' stdout and stderr go (third-party library output); roll's warnings stay on the console."""
        return self.output_dir / "workers.log"

    @property
    def worker_env(self) -> dict[str, str]:
        """Environment variables every worker of this session gets (a role's ``system_envs`` override them)."""
        # weight_sync_env: memcpy settings for the processes that copy weights into and out of sync buckets.
        return {ENV_WORKER_LOG: str(self.worker_log.resolve()), **weight_sync_env()}

    @classmethod
    def open(cls, config: BaseConfig) -> Session:
        """Check the output folder and resume path, write config.yaml, start Ray, resources and tracking."""
        output_dir = config.resolved_output_dir
        checkpoints = CheckpointManager(config.resolved_checkpoint_dir, config.max_ckpt_to_keep)
        if not config.resume_from_checkpoint and checkpoints.complete():
            field = "output_dir" if config.checkpoint_dir is None else "checkpoint_dir"
            folder = output_dir if config.checkpoint_dir is None else checkpoints.root
            raise ConfigError(
                f"{field} {folder} already holds checkpoints of an earlier run; set resume_from_checkpoint=auto to "
                f"continue it, or choose another exp_name/{field}"
            )
        resume_path = checkpoints.resolve(config.resume_from_checkpoint)  # a bad path fails before anything starts
        if resume_path is None and config.resume_from_checkpoint == "auto":
            logger.warning(
                "resume_from_checkpoint=auto: no complete checkpoint in %s; starting at step 0", checkpoints.root
            )
        set_seed(config.seed)
        _check_folder(checkpoints.root, "checkpoint_dir")  # made at the first checkpoint
        output_dir.mkdir(parents=True, exist_ok=True)
        if resume_path is None:  # a run killed before its first checkpoint left rows this run would repeat
            set_aside_metrics(output_dir)
        dumped = config.model_dump(mode="json")
        (output_dir / "config.yaml").write_text(yaml.safe_dump(dumped, sort_keys=False))
        checkpoints.clean_incomplete()
        init()
        previous_sigterm = stop_on_sigterm()
        resources = ResourceManager(num_nodes=config.num_nodes, num_gpus_per_node=config.num_gpus_per_node)
        tracker = Tracker(
            output_dir, config.track_with, exp_name=config.exp_name, config=dumped, tracker_kwargs=config.tracker_kwargs
        )
        session = cls(output_dir, checkpoints, resume_path, resources, tracker, previous_sigterm)
        logger.info("workers' library output (warnings, notices) goes to %s", session.worker_log)
        return session

    def close(self, *, plots: bool) -> None:
        if self.previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self.previous_sigterm)
            self.previous_sigterm = None
        self.resources.destroy()
        self.tracker.finish()
        if plots and self.tracker.metrics_path.is_file():
            try:
                write_plots(self.tracker.metrics_path, self.output_dir / "plots")
            except Exception as e:  # plots are a convenience; never mask the run's own outcome
                logger.warning("could not write plots: %s", e)


class BasePipeline:
    """Subclasses set ``config_cls`` and implement :meth:`setup` and :meth:`run`; they describe the algorithm."""

    config_cls: ClassVar[type[BaseConfig]] = BaseConfig

    def __init__(self, config: BaseConfig) -> None:
        """Store ``config`` (with its assets already resolved, see :mod:`roll.pipelines.launcher`); start nothing."""
        self.config = config
        self.output_dir = config.resolved_output_dir
        # The last step; a pipeline whose length depends on its data sets it in setup().
        self.max_steps: int = config.max_steps
        self.state = PipelineState()
        self.clusters: dict[str, Cluster] = {}
        self._session: Session | None = None
        self._checkpoint_clusters: list[Cluster] = []
        self._update_groups: list[ModelUpdateGroup] = []
        self._closed = False
        # Wall seconds of the finished loop steps (resumed runs continue the count) and the running step's start.
        self._steps_done_s = 0.0
        self._step_started: float | None = None

    # --- setup steps ------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Build the pipeline in order: data, :meth:`open_session`, roles, wiring (see the module docstring)."""
        raise NotImplementedError

    def open_session(self) -> Session:
        """Output folder checks, config.yaml, Ray, resources, tracker; call it after the data has loaded."""
        if self._session is None:
            self._session = Session.open(self.config)
        return self._session

    @property
    def session(self) -> Session:
        if self._session is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must call open_session() before this")
        return self._session

    def create_clusters(self, roles: Mapping[str, Role]) -> dict[str, Cluster]:
        """Create every role's cluster concurrently, then initialize each with its own settings, concurrently."""
        created: dict[str, Cluster] = {}
        resources = self.session.resources

        def build(item: tuple[str, Role]) -> tuple[str, Cluster]:
            key, role = item
            worker_cls = role.config.worker_cls or role.worker_cls
            return key, Cluster(role.config.name, worker_cls, resources, role.config, env=self.session.worker_env)

        with ThreadPoolExecutor(max_workers=max(1, len(roles))) as pool:
            futures = [pool.submit(build, item) for item in roles.items()]
            errors = []
            for future in futures:
                try:
                    key, cluster = future.result()
                    created[key] = cluster
                except Exception as e:  # collect, so every created cluster is shut down before raising
                    errors.append(e)
        self.clusters.update(created)
        if errors:
            raise errors[0]
        materialize_all(*[created[key].initialize(roles[key].settings, blocking=False) for key in created])
        return created

    def set_model_update_pair(
        self, src_cluster: Cluster, tgt_cluster: Cluster, frequency: int = 1, **kwargs: Any
    ) -> None:
        self._update_groups.append(self._update_group(src_cluster, tgt_cluster, frequency=frequency, **kwargs))

    @staticmethod
    def _update_group(src_cluster: Cluster, tgt_cluster: Cluster, **kwargs: Any) -> ModelUpdateGroup:
        """A weight-sync group in the target role's bucket size (``model_update_buffer_size_mb``)."""
        role = getattr(tgt_cluster, "worker_config", None)
        bucket_mb = getattr(role, "model_update_buffer_size_mb", 256)
        return ModelUpdateGroup(src_cluster, tgt_cluster, bucket_size_mb=bucket_mb, **kwargs)

    def copy_weights(self, src_cluster: Cluster, tgt_cluster: Cluster) -> dict[str, float]:
        """One weight sync outside the per-step pairs (e.g. a reference taking the trained policy's weights); its
        channel is closed after it. Returns the sync's ``weight_sync/*`` metrics."""
        group = self._update_group(src_cluster, tgt_cluster)
        try:
            return group.update(0, force=True)
        finally:
            group.close()

    def set_checkpoint_clusters(self, *clusters: Cluster) -> None:
        self._checkpoint_clusters.extend(clusters)

    # --- weight updates ---------------------------------------------------------------------------------
    def model_update(self, step: int, *, force: bool = False) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for group in self._update_groups:
            metrics.update(group.update(step, force=force))
        return metrics

    # --- checkpoints and resume -------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        """Data cursors to save (subclasses override)."""
        return {}

    def load_data_state(self, state: dict[str, Any]) -> None:
        """Restore data cursors (subclasses override)."""

    def algorithm_state(self) -> dict[str, Any]:
        """Algorithm state to save, e.g. an adaptive KL coefficient (subclasses override)."""
        return {}

    def load_algorithm_state(self, state: dict[str, Any]) -> None:
        """Restore algorithm state (subclasses override)."""

    def do_checkpoint(self, step: int, *, force: bool = False) -> Path | None:
        """Checkpoint if ``save_steps`` says so (or ``force``); atomic, with retention."""
        every = self.config.save_steps
        if not force and not (every and step % every == 0):
            return None
        checkpoints = self.session.checkpoints
        folder = checkpoints.begin(step)
        pending = [
            cluster.save_checkpoint(str(folder / cluster.name), blocking=False) for cluster in self._checkpoint_clusters
        ]
        for call in pending:
            call.materialize()
        self.state.step = step
        self.state.data_state = self.data_state()
        self.state.algorithm_state = self.algorithm_state()
        path = checkpoints.commit(step, self.state)
        logger.info("checkpoint %s written", path)
        return path

    def resume(self) -> int:
        """Restore the checkpoint selected by ``resume_from_checkpoint``; returns the step to continue after."""
        session = self.session
        path = session.resume_path
        if path is None:
            return 0
        self.state = session.checkpoints.load_state(path)
        pending = [
            cluster.load_checkpoint(str(path / cluster.name), blocking=False) for cluster in self._checkpoint_clusters
        ]
        for call in pending:
            call.materialize()
        self.load_data_state(self.state.data_state)
        self.load_algorithm_state(self.state.algorithm_state)
        session.tracker.truncate_after(self.state.step)
        logger.info("resumed from %s at step %d", path, self.state.step)
        return self.state.step

    # --- loop helpers -----------------------------------------------------------------------------------
    def steps(self, start: int) -> Iterator[int]:
        """Steps ``start+1 .. max_steps`` with their progress on stderr: a bar (ETA) on a terminal, plain periodic
        lines when stderr goes to a file or a pipe. Each step's wall time (the loop body: step, validation,
        logging, checkpoint) adds to ``time/steps_total_s``, which :meth:`log_metrics` records."""
        from roll.pipelines.progress import step_progress

        total = self.max_steps
        history = self.state.metrics_history
        self._steps_done_s = float(history[-1].get(STEPS_TOTAL_KEY, 0.0)) if history else 0.0
        with step_progress(total, start, self.config.exp_name) as bar:
            for step in range(start + 1, total + 1):
                self._step_started = _clock()
                try:
                    yield step
                finally:
                    self._steps_done_s += _clock() - self._step_started
                    self._step_started = None
                bar.update(1)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Reduce (lists -> mean / @max / @min / @sum), record in history and trackers, every ``logging_steps``.

        Inside :meth:`steps` the row also gets ``time/steps_total_s``: the wall seconds of all loop steps so far
        (this one up to now), so the end-of-run summary is right whatever ``logging_steps`` skips.
        """
        reduced = reduce_metrics(metrics)
        if self._step_started is not None:
            reduced[STEPS_TOTAL_KEY] = self._steps_done_s + _clock() - self._step_started
        self.state.metrics_history.append({"step": step, **reduced})
        if step % self.config.logging_steps == 0 or step == self.max_steps:
            self.session.tracker.log(step, reduced)
        return reduced

    def export_hf(self, cluster: Cluster) -> Path:
        path = self.output_dir / "hf_export"
        cluster.export_hf(str(path))
        return path

    # --- lifecycle --------------------------------------------------------------------------------------
    def run(self) -> Any:
        raise NotImplementedError

    def shutdown(self, graceful: bool = True) -> None:
        """Stop every role and flush tracking; safe to call more than once, and before or after a failed setup.

        ``graceful=False`` (after an error or Ctrl-C) makes no call to the workers: one may still be busy with
        the interrupted step (generation, training) and would answer only when it ends. Killing the actors
        releases their weight channels too.
        """
        if self._closed:
            return
        self._closed = True
        for group in self._update_groups if graceful else []:
            try:
                group.close(timeout_s=_CLOSE_TIMEOUT_S)
            except Exception as e:  # workers may already be gone after a failure
                logger.debug("closing %s failed: %s", group.group, e)
        for cluster in self.clusters.values():
            cluster.shutdown()
        if self._session is not None:
            self._session.close(plots=self.config.plots)

    def __enter__(self) -> BasePipeline:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.shutdown(graceful=exc_type is None)
