"""roll.runtime: build distributed Ray applications as Pipeline -> Cluster -> Worker.

Needs only roll-protocol, ray and pydantic: importing it never pulls in a model library.
"""

from __future__ import annotations

from roll.protocol import DataProto, Dispatch, Execute, RankInfo, register
from roll.runtime._bootstrap import RayInfo, init, shutdown
from roll.runtime._calls import PendingCall, materialize_all, materialize_concat
from roll.runtime._cluster import Cluster, MethodProxy, RemoteMethod
from roll.runtime._output import ENV_WORKER_LOG
from roll.runtime._planning import NodeShare, plan_devices
from roll.runtime._resources import (
    GPU_SHARE_PER_ACTOR,
    NodeDevices,
    NodeInfo,
    Placement,
    ResourceManager,
    cpu_workers_fix,
)
from roll.runtime._worker import Worker
from roll.runtime.config import RollModel, WorkerConfig, parse_device_mapping
from roll.runtime.errors import (
    ConfigError,
    MissingExtraError,
    ModuleImportError,
    ProtocolError,
    RollError,
    RpcTimeoutError,
    WorkerError,
    WorkerLostError,
    import_extra,
)
from roll.runtime.registry import Registry, import_module_of, import_target

__version__ = "0.1.0"

__all__ = [
    "ENV_WORKER_LOG",
    "GPU_SHARE_PER_ACTOR",
    "Cluster",
    "ConfigError",
    "DataProto",
    "Dispatch",
    "Execute",
    "MethodProxy",
    "MissingExtraError",
    "ModuleImportError",
    "NodeDevices",
    "NodeInfo",
    "NodeShare",
    "PendingCall",
    "Placement",
    "ProtocolError",
    "RankInfo",
    "RayInfo",
    "Registry",
    "RemoteMethod",
    "ResourceManager",
    "RollError",
    "RollModel",
    "RpcTimeoutError",
    "Worker",
    "WorkerConfig",
    "WorkerError",
    "WorkerLostError",
    "cpu_workers_fix",
    "import_extra",
    "import_module_of",
    "import_target",
    "init",
    "materialize_all",
    "materialize_concat",
    "parse_device_mapping",
    "plan_devices",
    "register",
    "shutdown",
]
