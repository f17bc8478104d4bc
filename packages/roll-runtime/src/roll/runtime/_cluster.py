"""Cluster: one role as a group of Worker actors, called like the role itself.

``cluster.train_step(batch)`` runs the worker method ``train_step`` on every rank according to its
``@register`` contract (dispatch, execution, collection) and blocks for the collected result;
``cluster.train_step(batch, blocking=False)`` returns a :class:`PendingCall` instead.

A Cluster owns its actors like a file owns its descriptor: ``shutdown()``, leaving a ``with Cluster(...)`` block, or
dropping the last reference to it kills them and frees their names (no reference cycle keeps a dropped cluster
alive until the garbage collector runs).

Registered methods are attributes of the cluster's class: ``Cluster(name, EchoWorker, ...)`` is an instance of a
subclass made once per worker class, with one :class:`RemoteMethod` descriptor per registered method, so ``dir()``,
``help()`` and ``inspect.signature`` show them. For type checkers ``Cluster`` is generic in its worker class:
``cluster.method(EchoWorker.tag_rows)`` is a :class:`MethodProxy` whose arguments are checked against the worker
method's; plain attribute calls (``cluster.tag_rows(...)``) type-check too, with unchecked arguments.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, cast

import ray
from ray import ObjectRef
from ray.actor import ActorHandle

from roll.protocol import Execute, RankInfo, Registration, collect_ranks, get_registration
from roll.runtime._calls import PendingCall, wait_all
from roll.runtime._methods import MethodProxy, RemoteMethod, class_for, proxy_signature
from roll.runtime._resources import Placement, ResourceManager
from roll.runtime._worker import ENV_CLUSTER_NAME, ENV_WORKERS_ON_NODE, Worker, registered_methods
from roll.runtime.config import WorkerConfig
from roll.runtime.errors import ConfigError, RpcTimeoutError, WorkerLostError
from roll.runtime.registry import import_target

__all__ = ["Cluster", "MethodProxy", "RemoteMethod"]

logger = logging.getLogger(__name__)

W = TypeVar("W", bound=Worker)
P = ParamSpec("P")

# Methods after which a worker's RankInfo may have changed (a strategy sets its real topology there).
_TOPOLOGY_METHODS = frozenset({"initialize"})
# Values cheap enough to send inline to every rank rather than through one shared object-store entry.
_INLINE_TYPES = (type(None), bool, int, float, str, bytes)

_claimed_ports: set[tuple[str, int]] = set()
_claimed_lock = threading.Lock()


def _resolve_worker_cls(name: str, target: type[Worker] | str) -> type[Worker]:
    if isinstance(target, str):
        target = import_target(target, f"{name}.worker_cls")
    if not (isinstance(target, type) and issubclass(target, Worker)):
        shown = target.__qualname__ if isinstance(target, type) else repr(target)
        raise ConfigError(f"{name}.worker_cls {shown} must subclass roll.runtime.Worker")
    return target


class _Actors:
    """What a cluster must give back when it goes: its actors and its rendezvous port. Shared by the cluster and
    its finalizer (which must not reference the cluster itself)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.workers: list[ActorHandle[Any]] = []
        self.master: tuple[str, int] | None = None

    def release(self) -> None:
        workers, self.workers = self.workers, []
        for worker in workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception as e:  # an actor that is already gone is the goal, not a failure
                logger.debug("killing %s failed: %s", self.name, e)
        if self.master is not None:
            with _claimed_lock:
                _claimed_ports.discard(self.master)
            self.master = None


class Cluster(Generic[W]):
    """One role: ``world_size`` Worker actors placed by a ResourceManager, with a proxy per registered method.

    Use it as a context manager (``with Cluster(...) as cluster:``) or call :meth:`shutdown`; a cluster that is
    dropped also frees its actors and their names.
    """

    if TYPE_CHECKING:
        # Registered methods are descriptors of the per-worker-class subclass; type checkers see them as proxies
        # with unchecked arguments. Use ``cluster.method(Worker.fn)`` for checked ones.
        def __getattr__(self, name: str) -> MethodProxy[...]: ...

    def __new__(cls, name: str, worker_cls: type[W] | str, *args: Any, **kwargs: Any) -> Cluster[W]:
        base = cls.__dict__.get("_roll_base", cls)  # a per-worker-class subclass knows the class it was made from
        return super().__new__(class_for(base, _resolve_worker_cls(name, worker_cls)))

    def __init__(
        self,
        name: str,
        worker_cls: type[W] | str,
        resource_manager: ResourceManager,
        worker_config: WorkerConfig,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: environment variables for every worker (the role's ``system_envs`` override them)."""
        self.name = name
        self.worker_config = worker_config
        self.env = dict(env or {})
        self.worker_cls: type[W] = _resolve_worker_cls(name, worker_cls)  # type: ignore[assignment]
        self.resource_manager = resource_manager
        self.timeout_s = worker_config.rpc_timeout_s
        self._registrations = registered_methods(self.worker_cls)
        self.placements = resource_manager.allocate(
            worker_config, spans_nodes=self.worker_cls.spans_nodes(worker_config)
        )
        self._actors = _Actors(name)
        self._finalizer: weakref.finalize[[], Cluster[Any]] | None = weakref.finalize(self, self._actors.release)
        self._finalizer.atexit = False  # at interpreter exit Ray stops the driver's actors itself
        self._rank_infos: list[RankInfo] = []
        self._topology_refs: list[ObjectRef[Any]] | None = None
        self.last_call_stats: dict[str, int] = {}
        self._create_workers()

    # --- resource handling ------------------------------------------------------------------------------
    @property
    def workers(self) -> list[ActorHandle[Any]]:
        """The actor handles, by rank (empty once shut down)."""
        return self._actors.workers

    @property
    def _master(self) -> tuple[str, int] | None:
        return self._actors.master

    def shutdown(self) -> None:
        """Stop every worker actor of this role and free their names. Safe to call twice."""
        self._actors.release()

    def __enter__(self) -> Cluster[W]:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    def method(self, fn: Callable[Concatenate[W, P], Any]) -> MethodProxy[P]:
        """The proxy of a registered method, named by the worker class's own function: ``cluster.method(
        EchoWorker.tag_rows)``. Type checkers then check the call's arguments against ``tag_rows``'s."""
        name = getattr(fn, "__name__", None)
        registration = get_registration(fn)
        if name is None or registration is None or name not in self._registrations:
            raise ConfigError(
                f"{fn!r} is not a registered method of {self.worker_cls.__qualname__}; "
                f"registered: {sorted(self._registrations)}"
            )
        method = getattr(self.worker_cls, name)
        return MethodProxy(self, name, self._registrations[name], doc=method.__doc__, signature=proxy_signature(method))

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
        if self._master is None:
            raise ConfigError(f"cluster {self.name!r} is shut down; it has no rendezvous address")
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
        env.update(self.env)
        env.update(self.worker_config.system_envs)
        return env

    def _spawn(self, placement: Placement, max_concurrency: int) -> ActorHandle[Any]:
        options = dict(placement.actor_options)
        options.update(
            name=f"{self.name}-{placement.rank}",
            max_concurrency=max_concurrency,
            runtime_env={"env_vars": self._actor_env(placement)},
        )
        try:
            actor_cls: Any = ray.remote(self.worker_cls)  # ray's types do not follow options(**dict)
            return cast("ActorHandle[Any]", actor_cls.options(**options).remote(self.worker_config))
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
            for placement in self.placements:
                self._actors.workers.append(self._spawn(placement, max_concurrency))
            first = self.workers[0]
            address, port = self._wait_start([first.__ray_call__.remote(_rendezvous_address)], start_timeout)[0]
            master = self._actors.master = self._claim(address, port, first, start_timeout)
            master_env = {"MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])}
            self._wait_start([w._roll_set_env.remote(master_env) for w in self.workers], start_timeout)
            nodes = [(w, p.nodes) for w, p in zip(self.workers, self.placements) if p.nodes]
            if nodes:
                self._wait_start([w._roll_set_nodes.remote(shares) for w, shares in nodes], start_timeout)
            self._rank_infos = self._fetch_rank_infos()
        except BaseException:
            self.shutdown()
            raise

    def _wait_start(self, refs: list[ObjectRef[Any]], timeout_s: float) -> list[Any]:
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

    def _claim(self, address: str, port: int, first: ActorHandle[Any], timeout_s: float) -> tuple[str, int]:
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
        if not self.workers:
            raise WorkerLostError(self.name, 0, method, "the cluster was shut down")
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
                owner=self,
            )
        outputs = wait_all(refs, ranks, cluster=self.name, method=method, timeout_s=timeout_s)
        if method in _TOPOLOGY_METHODS:
            self._topology_refs = None
            self._rank_infos = self._fetch_rank_infos()
        return collect(outputs)

    def _share_repeated_args(
        self, per_rank: list[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
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
        refs: dict[int, ObjectRef[Any]] = {}

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
                refs,
                refs,
                ranks,
                list,
                cluster=self.name,
                method=method,
                timeout_s=timeout or self.timeout_s,
                owner=self,
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

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, worker_cls={self.worker_cls.__qualname__}, world_size={self.world_size})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A cluster handed to another process (e.g. as an argument of a worker call) is a view of the same actors:
        # it can call them, and shutdown() on it stops them, but dropping the copy does not (only the original's
        # owner decides that).
        state = {k: v for k, v in self.__dict__.items() if k != "_finalizer"}
        return _restore, (type(self).__dict__.get("_roll_base", type(self)), self.worker_cls, state)


def _restore(base: type[Cluster[Any]], worker_cls: type[Worker], state: dict[str, Any]) -> Cluster[Any]:
    cluster: Cluster[Any] = object.__new__(class_for(base, worker_cls))
    cluster.__dict__.update(state)
    cluster._finalizer = None
    return cluster


def _rendezvous_address(worker: Worker) -> tuple[str, int]:
    return worker._roll_node_address(), worker._roll_free_port()
