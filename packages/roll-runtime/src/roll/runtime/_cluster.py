"""Cluster: one role as a group of Worker actors, called like the role itself.

``cluster.train_step(batch)`` runs the worker method ``train_step`` on every rank according to its
``@register`` contract (dispatch, execution, collection) and blocks for the collected result;
``cluster.train_step(batch, blocking=False)`` returns a :class:`PendingCall` instead.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

import ray

from roll.protocol import Execute, RankInfo, Registration, collect_ranks
from roll.runtime._calls import PendingCall, wait_all
from roll.runtime._resources import Placement, ResourceManager
from roll.runtime._worker import ENV_CLUSTER_NAME, ENV_WORKERS_ON_NODE, Worker, registered_methods
from roll.runtime.config import WorkerConfig
from roll.runtime.errors import ConfigError, RpcTimeoutError, WorkerLostError

logger = logging.getLogger(__name__)

# Methods after which a worker's RankInfo may have changed (a strategy sets its real topology there).
_TOPOLOGY_METHODS = frozenset({"initialize"})
# Values cheap enough to send inline to every rank rather than through one shared object-store entry.
_INLINE_TYPES = (type(None), bool, int, float, str, bytes)

_claimed_ports: set[tuple[str, int]] = set()
_claimed_lock = threading.Lock()


def resolve_class(target: type | str) -> type:
    """A class from itself or from ``"pkg.module.Class"`` / ``"pkg.module:Class"``."""
    if isinstance(target, type):
        return target
    module_name, _, attr = target.replace(":", ".").rpartition(".")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"worker_cls {target!r} cannot be imported ({e}); check the dotted path") from e


class MethodProxy:
    """Calls one registered worker method on the cluster. Reserved keyword arguments: ``blocking``, ``timeout``."""

    def __init__(self, cluster: Cluster, name: str, registration: Registration, doc: str | None) -> None:
        self._cluster = cluster
        self._name = name
        self.registration = registration
        self.__name__ = name
        self.__doc__ = doc

    def __call__(self, *args: Any, blocking: bool = True, timeout: float | None = None, **kwargs: Any) -> Any:
        return self._cluster._call(self._name, self.registration, args, kwargs, blocking=blocking, timeout=timeout)

    def __repr__(self) -> str:
        return f"<{self._cluster.name}.{self._name} {self.registration.dispatch_mode!r}>"


class Cluster:
    """One role: ``world_size`` Worker actors placed by a ResourceManager, with a proxy per registered method."""

    def __init__(
        self,
        name: str,
        worker_cls: type[Worker] | str,
        resource_manager: ResourceManager,
        worker_config: WorkerConfig,
    ) -> None:
        self.name = name
        self.worker_config = worker_config
        self.worker_cls = resolve_class(worker_cls)
        if not issubclass(self.worker_cls, Worker):
            raise ConfigError(f"{name}.worker_cls {self.worker_cls.__qualname__} must subclass roll.runtime.Worker")
        self.resource_manager = resource_manager
        self.timeout_s = worker_config.rpc_timeout_s
        self._registrations = registered_methods(self.worker_cls)
        self.placements = resource_manager.allocate(worker_config)
        self._master: tuple[str, int] | None = None
        self.workers: list[ray.actor.ActorHandle] = []
        self._rank_infos: list[RankInfo] = []
        self._topology_refs: list[ray.ObjectRef] | None = None
        self.last_call_stats: dict[str, int] = {}
        self._create_workers()
        for method, registration in self._registrations.items():
            doc = getattr(getattr(self.worker_cls, method), "__doc__", None)
            setattr(self, method, MethodProxy(self, method, registration, doc))

    # --- topology ---------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.workers)

    @property
    def rank_infos(self) -> list[RankInfo]:
        if self._topology_refs is not None:
            refs, self._topology_refs = self._topology_refs, None
            wait_all(refs, list(range(len(refs))), cluster=self.name, method="initialize", timeout_s=self.timeout_s)
            self._rank_infos = self._fetch_rank_infos()
        return self._rank_infos

    @property
    def dp_size(self) -> int:
        return self.rank_infos[0].dp_size or 1

    @property
    def tp_size(self) -> int:
        return self.rank_infos[0].tp_size

    @property
    def pp_size(self) -> int:
        return self.rank_infos[0].pp_size

    @property
    def cp_size(self) -> int:
        return self.rank_infos[0].cp_size

    @property
    def master_address(self) -> tuple[str, int]:
        """(MASTER_ADDR, MASTER_PORT) of this role's torch.distributed rendezvous."""
        assert self._master is not None
        return self._master

    def _fetch_rank_infos(self) -> list[RankInfo]:
        refs = [w.get_rank_info.remote() for w in self.workers]
        return wait_all(
            refs, list(range(len(refs))), cluster=self.name, method="get_rank_info", timeout_s=self.timeout_s
        )

    # --- creation ---------------------------------------------------------------------------------------
    def _actor_env(self, placement: Placement) -> dict[str, str]:
        env = {
            "RANK": str(placement.rank),
            "WORLD_SIZE": str(len(self.placements)),
            "LOCAL_RANK": "0",
            ENV_CLUSTER_NAME: self.name,
            ENV_WORKERS_ON_NODE: str(sum(p.node_id == placement.node_id for p in self.placements)),
        }
        if placement.local_devices:
            env["CUDA_VISIBLE_DEVICES"] = placement.visible_devices
            # Ray would overwrite CUDA_VISIBLE_DEVICES with the token GPU share it granted; we pin devices ourselves.
            env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
        env.update(self.worker_config.system_envs)
        return env

    def _spawn(self, placement: Placement, max_concurrency: int) -> ray.actor.ActorHandle:
        options = dict(placement.actor_options)
        options.update(
            name=f"{self.name}-{placement.rank}",
            max_concurrency=max_concurrency,
            runtime_env={"env_vars": self._actor_env(placement)},
        )
        try:
            return ray.remote(self.worker_cls).options(**options).remote(self.worker_config)
        except ValueError as e:
            if "already taken" in str(e) or "already exists" in str(e):
                raise ConfigError(
                    f"a Ray actor named {options['name']!r} already exists; give this role a unique name "
                    f"(two clusters named {self.name!r}?)"
                ) from e
            raise

    def _create_workers(self) -> None:
        has_async = any(r.is_async for r in self._registrations.values())
        max_concurrency = self.worker_config.max_concurrency or (1000 if has_async else 1)
        start_timeout = self.worker_config.start_timeout_s
        try:
            # All actors start in parallel; the rendezvous address is pushed to them before any call is made.
            self.workers = [self._spawn(p, max_concurrency) for p in self.placements]
            first = self.workers[0]
            address, port = self._wait_start([first.__ray_call__.remote(_rendezvous_address)], start_timeout)[0]
            self._master = self._claim(address, port, first, start_timeout)
            master_env = {"MASTER_ADDR": self._master[0], "MASTER_PORT": str(self._master[1])}
            self._wait_start([w._roll_set_env.remote(master_env) for w in self.workers], start_timeout)
            self._rank_infos = self._fetch_rank_infos()
        except BaseException:
            self.shutdown()
            raise

    def _wait_start(self, refs: list[ray.ObjectRef], timeout_s: float) -> list[Any]:
        try:
            return wait_all(refs, list(range(len(refs))), cluster=self.name, method="__init__", timeout_s=timeout_s)
        except (RpcTimeoutError, WorkerLostError) as e:
            options = self.placements[0].actor_options
            hint = (
                f"The workers could not be scheduled: each asks for num_cpus={options['num_cpus']}, "
                f"num_gpus={options['num_gpus']}, and the cluster has {ray.available_resources()} available."
            )
            if isinstance(e, RpcTimeoutError):
                raise RpcTimeoutError(self.name, "__init__", e.pending_ranks, timeout_s, hint) from None
            if "schedul" in e.remote_traceback:
                raise WorkerLostError(self.name, e.rank, "__init__", f"{e.remote_traceback} {hint}") from None
            raise  # the worker's constructor failed: its own error says why

    def _claim(self, address: str, port: int, first: ray.actor.ActorHandle, timeout_s: float) -> tuple[str, int]:
        # Ports picked concurrently by different clusters on one node could collide; keep them unique per driver.
        for _ in range(16):
            with _claimed_lock:
                if (address, port) not in _claimed_ports:
                    _claimed_ports.add((address, port))
                    return address, port
            port = self._wait_start([first._roll_free_port.remote()], timeout_s)[0]
        raise ConfigError(f"{self.name}: could not find a free rendezvous port on {address}")

    # --- calls ------------------------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        registration: Registration,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        blocking: bool,
        timeout: float | None,
    ) -> Any:
        infos = self.rank_infos
        mode = registration.dispatch_mode
        per_rank = mode.dispatch(args, kwargs, infos)
        if registration.execute_mode is Execute.RANK_ZERO:
            per_rank, ranks, collected = per_rank[:1], [0], [0]
        else:
            ranks = list(range(len(infos)))
            collected = collect_ranks(mode, infos)
        per_rank = self._share_repeated_args(per_rank)
        refs = [getattr(self.workers[r], method).remote(*a, **k) for r, (a, k) in zip(ranks, per_rank)]
        if method in _TOPOLOGY_METHODS:
            self._topology_refs = refs
        if registration.execute_mode is Execute.RANK_ZERO:

            def collect(outputs: list[Any]) -> Any:
                return outputs[0]
        else:

            def collect(outputs: list[Any]) -> Any:
                return mode.collect(outputs, infos)

        timeout_s = self.timeout_s if timeout is None else timeout
        if not blocking:
            return PendingCall(
                [refs[r] for r in collected],
                refs,
                ranks,
                collect,
                cluster=self.name,
                method=method,
                timeout_s=timeout_s,
            )
        outputs = wait_all(refs, ranks, cluster=self.name, method=method, timeout_s=timeout_s)
        if method in _TOPOLOGY_METHODS:
            self._topology_refs = None
            self._rank_infos = self._fetch_rank_infos()
        return collect(outputs)

    def _share_repeated_args(self, per_rank: list[tuple[tuple, dict]]) -> list[tuple[tuple, dict]]:
        """Put each non-trivial object that several ranks receive into the object store once, and pass the ref."""
        counts: dict[int, int] = {}
        for args, kwargs in per_rank:
            for value in (*args, *kwargs.values()):
                if not isinstance(value, _INLINE_TYPES):
                    counts[id(value)] = counts.get(id(value), 0) + 1
        shared = {key for key, n in counts.items() if n > 1}
        self.last_call_stats = {"object_store_puts": 0}
        if not shared:
            return per_rank
        refs: dict[int, ray.ObjectRef] = {}

        def swap(value: Any) -> Any:
            key = id(value)
            if key not in shared:
                return value
            if key not in refs:
                refs[key] = ray.put(value)
            return refs[key]

        out = [(tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}) for args, kwargs in per_rank]
        self.last_call_stats["object_store_puts"] = len(refs)
        return out

    def execute_all(
        self, method: str, *args: Any, blocking: bool = True, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Call any actor method on every rank with the same arguments; returns the list of results."""
        refs = [getattr(w, method).remote(*args, **kwargs) for w in self.workers]
        if not blocking:
            ranks = list(range(len(refs)))
            return PendingCall(
                refs, refs, ranks, list, cluster=self.name, method=method, timeout_s=timeout or self.timeout_s
            )
        return wait_all(
            refs, list(range(len(refs))), cluster=self.name, method=method, timeout_s=timeout or self.timeout_s
        )

    def execute_rank_zero(
        self, method: str, *args: Any, blocking: bool = True, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Call any actor method on rank 0 only; returns its result."""
        ref = getattr(self.workers[0], method).remote(*args, **kwargs)
        if not blocking:
            return ref
        return wait_all([ref], [0], cluster=self.name, method=method, timeout_s=timeout or self.timeout_s)[0]

    def shutdown(self) -> None:
        """Stop every worker actor of this role. Safe to call twice."""
        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception as e:  # an actor that is already gone is the goal, not a failure
                logger.debug("killing %s failed: %s", self.name, e)
        self.workers = []
        if self._master is not None:
            with _claimed_lock:
                _claimed_ports.discard(self._master)

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, worker_cls={self.worker_cls.__qualname__}, world_size={self.world_size})"


def _rendezvous_address(worker: Worker) -> tuple[str, int]:
    return worker._roll_node_address(), worker._roll_free_port()


def cluster_names(clusters: Sequence[Cluster]) -> list[str]:
    return [c.name for c in clusters]
