"""Starting or joining Ray.

The embedded default is a private local Ray: no dashboard, token auth off (it is reachable only from this
machine), and more logical CPUs than cores, because roll's CPU workers mostly wait on each other and a
laptop should fit a handful of roles. Setting ``RAY_ADDRESS`` (or passing ``address=``) joins an existing
cluster instead.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "roll"
_MIN_LOCAL_CPUS = 16


@dataclass(frozen=True)
class RayInfo:
    """What :func:`init` connected to."""

    address: str
    namespace: str
    embedded: bool
    num_cpus: float
    num_gpus: float


def _local_cpus(requested: int | None) -> int:
    if requested is not None:
        return requested
    return max(_MIN_LOCAL_CPUS, 4 * (os.cpu_count() or 1))


def init(
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    object_store_memory: int | None = None,
    **ray_kwargs: Any,
) -> RayInfo:
    """Connect to Ray: join ``address`` / ``$RAY_ADDRESS`` if given, else start an embedded local Ray.

    Idempotent: if Ray is already initialized in this process, its connection is reused as is.
    """
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            logger.info("joining Ray cluster at %s", address)
            ray.init(address=address, namespace=namespace, **ray_kwargs)
        else:
            # Token auth guards a cluster others can reach; an embedded Ray listens only locally, and the token
            # file it would write to the home directory surprises users. The variable must exist before ray.init.
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(
                # "local": a new private instance even when another Ray runs on this machine (Ray would join it).
                address="local",
                num_cpus=_local_cpus(num_cpus),
                num_gpus=num_gpus,
                namespace=namespace,
                include_dashboard=False,
                object_store_memory=object_store_memory,
                **ray_kwargs,
            )
    context = ray.get_runtime_context()
    resources = ray.cluster_resources()
    return RayInfo(
        address=context.gcs_address,
        namespace=context.namespace,
        embedded=not (address or os.environ.get("RAY_ADDRESS")),
        num_cpus=resources.get("CPU", 0.0),
        num_gpus=resources.get("GPU", 0.0),
    )


def shutdown() -> None:
    """Disconnect from Ray (and stop it if it was embedded)."""
    if ray.is_initialized():
        ray.shutdown()
