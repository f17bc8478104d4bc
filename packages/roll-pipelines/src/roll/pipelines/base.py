"""BasePipeline: what every driver-side algorithm shares (see the programming-model reference, "Pipeline").

Seeding, Ray and the ResourceManager, parallel cluster creation, weight-update pairs, checkpoint clusters with
exact resume (roles' states + data cursors + RNG + metrics), tracking, a progress bar, and shutdown on every
path: use a pipeline as a context manager, or call :meth:`shutdown` in a ``finally``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import yaml

from roll.pipelines.assets import resolve_assets
from roll.pipelines.checkpoint import CheckpointManager, PipelineState
from roll.pipelines.config import BaseConfig, RoleConfig
from roll.pipelines.metrics import reduce_metrics
from roll.pipelines.plots import write_plots
from roll.pipelines.tracking import Tracker
from roll.runtime import Cluster, ConfigError, ResourceManager, init, materialize_all
from roll.strategies import ModelUpdateGroup

__all__ = ["BasePipeline", "set_seed"]

logger = logging.getLogger(__name__)
# A normal shutdown still closes weight channels politely, but never waits on a stuck worker for long.
_CLOSE_TIMEOUT_S = 60.0


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class BasePipeline:
    """Subclasses set ``config_cls`` and implement :meth:`run`; they describe the algorithm, nothing else."""

    config_cls: ClassVar[type[BaseConfig]] = BaseConfig

    def __init__(self, config: BaseConfig) -> None:
        self.config = config
        self.output_dir = config.resolved_output_dir
        self.checkpoints = CheckpointManager(self.output_dir / "checkpoints", config.max_ckpt_to_keep)
        self._check_output_dir()
        # A bad resume path must fail before anything starts.
        self._resume_path = self.checkpoints.resolve(config.resume_from_checkpoint)
        set_seed(config.seed)
        resolve_assets(config)
        # Data problems must surface before anything starts or any file is written.
        self.prepare_data()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        self.checkpoints.clean_incomplete()
        init()
        self.resource_manager = ResourceManager(num_nodes=config.num_nodes, num_gpus_per_node=config.num_gpus_per_node)
        self.state = PipelineState()
        self.tracker = Tracker(
            self.output_dir,
            config.track_with,
            exp_name=config.exp_name,
            config=config.model_dump(mode="json"),
            tracker_kwargs=config.tracker_kwargs,
        )
        self.clusters: dict[str, Cluster] = {}
        self._checkpoint_clusters: list[Cluster] = []
        self._update_groups: list[ModelUpdateGroup] = []
        self._progress: Any = None
        self._closed = False

    def _check_output_dir(self) -> None:
        if self.config.resume_from_checkpoint or not self.checkpoints.complete():
            return
        raise ConfigError(
            f"output_dir {self.output_dir} already holds checkpoints of an earlier run; set "
            f"resume_from_checkpoint=auto to continue it, or choose another exp_name/output_dir"
        )

    def prepare_data(self) -> None:
        """Load and validate datasets (and tokenizers); runs before Ray starts or any output is written."""

    # --- roles ------------------------------------------------------------------------------------------
    def create_clusters_parallel(self, roles: dict[str, tuple[type | str, RoleConfig]]) -> dict[str, Cluster]:
        """Create every role's cluster concurrently, then initialize them concurrently."""
        created: dict[str, Cluster] = {}

        def build(item: tuple[str, tuple[type | str, RoleConfig]]) -> tuple[str, Cluster]:
            key, (worker_cls, role) = item
            return key, Cluster(role.name, role.worker_cls or worker_cls, self.resource_manager, role)

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
        materialize_all(*[cluster.initialize(self.config, blocking=False) for cluster in created.values()])
        return created

    # --- weight updates ---------------------------------------------------------------------------------
    def set_model_update_pair(
        self, src_cluster: Cluster, tgt_cluster: Cluster, frequency: int = 1, **kwargs: Any
    ) -> None:
        role = getattr(tgt_cluster, "worker_config", None)
        bucket_mb = getattr(role, "model_update_buffer_size_mb", 256)
        self._update_groups.append(
            ModelUpdateGroup(src_cluster, tgt_cluster, frequency=frequency, bucket_size_mb=bucket_mb, **kwargs)
        )

    def model_update(self, step: int, *, force: bool = False) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for group in self._update_groups:
            metrics.update(group.update(step, force=force))
        return metrics

    # --- checkpoints and resume -------------------------------------------------------------------------
    def set_checkpoint_clusters(self, *clusters: Cluster) -> None:
        self._checkpoint_clusters.extend(clusters)

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
        folder = self.checkpoints.begin(step)
        pending = [
            cluster.save_checkpoint(str(folder / cluster.name), blocking=False) for cluster in self._checkpoint_clusters
        ]
        for call in pending:
            call.materialize()
        self.state.step = step
        self.state.data_state = self.data_state()
        self.state.algorithm_state = self.algorithm_state()
        path = self.checkpoints.commit(step, self.state)
        logger.info("checkpoint %s written", path)
        return path

    def resume(self) -> int:
        """Restore the checkpoint selected by ``resume_from_checkpoint``; returns the step to continue after."""
        path = self._resume_path
        if path is None:
            return 0
        self.state = self.checkpoints.load_state(path)
        pending = [
            cluster.load_checkpoint(str(path / cluster.name), blocking=False) for cluster in self._checkpoint_clusters
        ]
        for call in pending:
            call.materialize()
        self.load_data_state(self.state.data_state)
        self.load_algorithm_state(self.state.algorithm_state)
        self.tracker.truncate_after(self.state.step)
        logger.info("resumed from %s at step %d", path, self.state.step)
        return self.state.step

    # --- loop helpers -----------------------------------------------------------------------------------
    def steps(self, start: int) -> Iterator[int]:
        """Steps ``start+1 .. max_steps`` with a progress bar (ETA) on stderr."""
        from tqdm import tqdm

        total = self.config.max_steps
        with tqdm(
            total=total, initial=start, desc=self.config.exp_name, unit="step", dynamic_ncols=True, leave=True
        ) as bar:
            self._progress = bar
            for step in range(start + 1, total + 1):
                yield step
                bar.update(1)
        self._progress = None

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Reduce (lists -> mean / @max / @min / @sum), record in history and trackers, every ``logging_steps``."""
        reduced = reduce_metrics(metrics)
        self.state.metrics_history.append({"step": step, **reduced})
        if step % self.config.logging_steps == 0 or step == self.config.max_steps:
            self.tracker.log(step, reduced)
        return reduced

    def export_hf(self, cluster: Cluster) -> Path:
        path = self.output_dir / "hf_export"
        cluster.export_hf(str(path))
        return path

    # --- lifecycle --------------------------------------------------------------------------------------
    def run(self) -> Any:
        raise NotImplementedError

    def shutdown(self, graceful: bool = True) -> None:
        """Stop every role and flush tracking; safe to call more than once.

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
        self.resource_manager.destroy()
        self.tracker.finish()
        if self.config.plots and self.tracker.metrics_path.is_file():
            try:
                write_plots(self.tracker.metrics_path, self.output_dir / "plots")
            except Exception as e:  # plots are a convenience; never mask the run's own outcome
                logger.warning("could not write plots: %s", e)

    def __enter__(self) -> BasePipeline:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.shutdown(graceful=exc_type is None)
