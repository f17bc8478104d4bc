"""Worker: the base class of every role's Ray actor.

A Worker knows its place in the cluster (rank, world size, :class:`RankInfo`), the torch.distributed rendezvous
(``MASTER_ADDR``/``MASTER_PORT``, set in its environment before its code runs) and its role's configuration.
Methods marked with ``@register`` become methods of the role's Cluster; everything else is private to the actor.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from roll.protocol import RankInfo, get_registration, register
from roll.protocol._dispatch import Dispatch
from roll.runtime._output import ENV_WORKER_LOG, redirect_worker_output
from roll.runtime.config import WorkerConfig

if TYPE_CHECKING:
    from roll.runtime._resources import NodeDevices

ENV_CLUSTER_NAME = "ROLL_CLUSTER_NAME"
ENV_WORKERS_ON_NODE = "ROLL_WORKERS_ON_NODE"  # how many of this role's workers share this worker's node


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _apply_num_threads(setting: int | str | None) -> None:
    """Size torch's intra-op pool (and OpenMP/MKL's, for libraries loaded later) as the role's config asks."""
    if setting is None:
        return  # Ray already set OMP_NUM_THREADS from the worker's logical CPUs
    if setting == "all":
        sharing = max(1, int(os.environ.get(ENV_WORKERS_ON_NODE, "1")))
        threads = max(1, usable_cores() // sharing)
    else:
        threads = int(setting)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:  # imported with the worker's module, so it read the old OMP_NUM_THREADS already
        torch.set_num_threads(threads)


def _release_accelerator_cache() -> None:
    # Only touch torch if the worker already imported it; a plain data-processing worker stays torch-free.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _resolve_nested_refs(value: Any) -> Any:
    ray = sys.modules["ray"]
    if isinstance(value, ray.ObjectRef):
        return ray.get(value)
    if isinstance(value, list | tuple):
        return type(value)(_resolve_nested_refs(v) for v in value)
    if isinstance(value, dict):
        return {k: _resolve_nested_refs(v) for k, v in value.items()}
    return value


def _wrap_registered(fn: Any) -> Any:
    """Apply ``prefetch`` and ``clear_cache`` around a registered method, keeping its registration."""
    registration = get_registration(fn)
    if registration is None or not (registration.prefetch or registration.clear_cache):
        return fn
    if getattr(fn, "__roll_wrapped__", False):
        return fn

    def before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if registration.prefetch:
            return _resolve_nested_refs(args), _resolve_nested_refs(kwargs)
        return args, kwargs

    if registration.is_async:

        @functools.wraps(fn)
        async def async_wrapper(self: Worker, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = before(args, kwargs)
            try:
                return await fn(self, *args, **kwargs)
            finally:
                if registration.clear_cache:
                    _release_accelerator_cache()

        wrapper = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(self: Worker, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = before(args, kwargs)
            try:
                return fn(self, *args, **kwargs)
            finally:
                if registration.clear_cache:
                    _release_accelerator_cache()

        wrapper = sync_wrapper
    wrapper.__roll_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


class Worker:
    """Base class of a role's actor. Subclass it and mark the role's operations with ``@register``.

    The runtime sets, before ``__init__`` runs: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``CUDA_VISIBLE_DEVICES`` for device workers, the cluster's ``env`` (e.g. ``ROLL_WORKER_LOG``: this worker's
    stdout and stderr go to that file, see :mod:`roll.runtime._output`) and the role's ``system_envs``. ``MASTER_ADDR`` and
    ``MASTER_PORT`` (torch.distributed's env:// rendezvous, chosen by rank 0) are set once every rank has started,
    before the first registered call: initialize process groups in ``initialize``, not in ``__init__``.

    ``self.nodes`` (set with the rendezvous address) lists each node's share of a device worker's devices, the
    worker's own node first; it has several entries only for a worker class whose :meth:`spans_nodes` allowed it.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if get_registration(value) is not None:
                setattr(cls, name, _wrap_registered(value))

    def __init__(self, worker_config: WorkerConfig) -> None:
        self.worker_config = worker_config
        self.cluster_name = os.environ.get(ENV_CLUSTER_NAME, worker_config.name)
        self.rank = int(os.environ.get("RANK", "0"))
        if os.environ.get(ENV_WORKER_LOG):  # first, so that what follows prints there too
            redirect_worker_output(os.environ[ENV_WORKER_LOG], f"{self.cluster_name}-{self.rank}")
        _apply_num_threads(worker_config.num_threads)
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.rank_info = RankInfo(rank=self.rank, world_size=self.world_size)
        self.settings: Any = None
        self.nodes: tuple[NodeDevices, ...] = ()
        self.logger = logging.getLogger(f"roll.worker.{self.cluster_name}.{self.rank}")

    @classmethod
    def spans_nodes(cls, worker_config: WorkerConfig) -> bool:
        """Whether a worker of this class, configured by ``worker_config``, may own devices on several nodes.

        False by default: a worker uses its devices from one process on one node. A class whose worker starts one
        engine over several nodes (its own processes on the other nodes' reservations, see ``self.nodes``) returns
        True, and the ResourceManager then places such a rank over nodes instead of refusing it.
        """
        return False

    @property
    def worker_name(self) -> str:
        return f"{self.cluster_name}-{self.rank}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        """Set up the role (load models, build strategies, ...). Subclasses call ``super().initialize(...)``.

        ``settings``: this role's own typed settings (e.g. its loss hyperparameters, already resolved), never a
        whole pipeline config; subclasses narrow the type.
        """
        self.settings = settings

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def get_rank_info(self) -> RankInfo:
        return self.rank_info

    def set_rank_info(self, rank_info: RankInfo) -> None:
        """Record this worker's real topology (a model-parallel strategy calls this during ``initialize``)."""
        if rank_info.rank != self.rank or rank_info.world_size != self.world_size:
            raise ValueError(
                f"{self.worker_name}: new RankInfo has rank {rank_info.rank}/{rank_info.world_size}, expected "
                f"{self.rank}/{self.world_size}"
            )
        self.rank_info = rank_info

    # --- runtime plumbing (not registered: the Cluster calls these on individual actors) ---------------------
    def _roll_node_address(self) -> str:
        """This worker's reachable IP, used by rank 0 as MASTER_ADDR."""
        import ray

        address: str = ray.util.get_node_ip_address()
        return address

    def _roll_free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def _roll_set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)

    def _roll_set_nodes(self, nodes: tuple[NodeDevices, ...]) -> None:
        self.nodes = tuple(nodes)


def registered_methods(worker_cls: type) -> dict[str, Any]:
    """Every ``@register``-ed method of a Worker class (including inherited ones), by name."""
    methods = {}
    for name, value in inspect.getmembers(worker_cls):
        registration = get_registration(value)
        if registration is not None:
            methods[name] = registration
    return methods
