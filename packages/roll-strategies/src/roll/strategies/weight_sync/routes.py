"""Which path each receiver's weights take, decided from where the processes run (pure functions, no Ray).

Rank 0 of the training role owns the bucket ring. A receiver reads the ring in place when it can map the ring's
memory: on the same node for host memory (``/dev/shm``), on the same GPU for device memory (CUDA IPC, colocated
engines). Every other receiver gets each bucket by a broadcast (gloo on CPU, NCCL on GPU) from rank 0, which
relays what the writers put in the ring. Training ranks on rank 0's node all write their own shards into the ring
when the backend can (``writes_shards``); otherwise they gather full tensors and rank 0 writes them. Near
receivers of one node whose engines can share one copy of their weights (equal share keys, see
:mod:`.shared_weights`) read the ring through their lowest rank alone; the others follow it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roll.runtime import ConfigError

__all__ = ["TRANSPORTS", "Endpoint", "Routes", "plan_routes"]

# "shared_memory": /dev/shm on CPU, CUDA IPC on GPU; "collective": gloo/NCCL broadcast; "auto" mixes them by topology.
TRANSPORTS = ("auto", "shared_memory", "collective", "object_store")


@dataclass(frozen=True)
class Endpoint:
    """Where one worker runs: its Ray node, its process, its device (``"cpu"`` or ``"cuda"``) and GPU UUID."""

    node: str
    pid: int
    device: str = "cpu"
    gpu: str | None = None


@dataclass(frozen=True)
class Routes:
    storage: str  # "host" (/dev/shm slots) or "cuda" (slots on rank 0's GPU, shared by CUDA IPC)
    writers: tuple[int, ...]  # training ranks that map the ring and write into it
    local_writes: bool  # each writer writes its own shards (else rank 0 writes gathered tensors)
    readers: tuple[int, ...]  # receiver ranks that read the ring in place
    broadcast: tuple[int, ...]  # receiver ranks that get buckets by broadcast (ranks 1.. of the collective group)
    shares: tuple[tuple[int, int], ...] = ()  # (follower, leader): the follower's engine uses the leader's weights

    @property
    def relay(self) -> bool:
        """Whether rank 0 also reads the ring, to broadcast each bucket."""
        return bool(self.broadcast)

    @property
    def ring_readers(self) -> int:
        return len(self.readers) + int(self.relay)

    def leader_of(self, rank: int) -> int | None:
        """The receiver whose weights ``rank``'s engine shares, or None."""
        return next((leader for follower, leader in self.shares if follower == rank), None)

    def followers_of(self, rank: int) -> list[int]:
        return [follower for follower, leader in self.shares if leader == rank]

    def describe(self) -> str:
        writes = "its own shards" if self.local_writes else "gathered tensors"
        shared = "".join(f"; receiver {f} shares receiver {lead}'s weights" for f, lead in self.shares)
        return (
            f"{self.storage} ring written by train ranks {list(self.writers)} ({writes}); read in place by "
            f"receivers {list(self.readers)}; broadcast to receivers {list(self.broadcast)}{shared}"
        )


def _shares_memory(owner: Endpoint, other: Endpoint) -> bool:
    if owner.device == "cuda":
        return other.device == "cuda" and owner.gpu is not None and owner.gpu == other.gpu
    return other.device != "cuda" and owner.node == other.node


def plan_routes(
    senders: list[Endpoint],
    receivers: list[Endpoint],
    transport: str,
    *,
    writes_shards: bool,
    share_keys: Sequence[str | None] | None = None,
) -> Routes:
    """The routes for ``transport`` ("auto", "shared_memory" or "collective"); see the module docstring.

    ``share_keys``: per receiver, the key under which its engine can share its weights with engines of equal key
    on its node (None: it keeps its own).
    """
    if transport not in ("auto", "shared_memory", "collective"):
        raise ConfigError(f"transport must be one of {TRANSPORTS[:3]} here, got {transport!r}")
    if not senders or not receivers:
        raise ConfigError("weight sync needs at least one training and one inference worker")
    owner = senders[0]
    storage = "cuda" if owner.device == "cuda" else "host"
    near = [rank for rank, endpoint in enumerate(receivers) if _shares_memory(owner, endpoint)]
    if transport == "collective":
        near = []
    elif transport == "shared_memory" and len(near) < len(receivers):
        far = [rank for rank in range(len(receivers)) if rank not in near]
        what = "GPU" if storage == "cuda" else "node"
        raise ConfigError(
            f"transport 'shared_memory' needs every inference worker on the training rank 0's {what}; workers "
            f"{far} are not: use transport 'auto' (broadcast to those) or 'collective'"
        )
    shares: list[tuple[int, int]] = []
    if storage == "host" and share_keys is not None:
        leaders: dict[tuple[str, str], int] = {}
        for rank in near:
            key = share_keys[rank]
            if key is None:
                continue
            leader = leaders.setdefault((receivers[rank].node, key), rank)
            if leader != rank:
                shares.append((rank, leader))
    followers = {follower for follower, _ in shares}
    same_node = [rank for rank, endpoint in enumerate(senders) if endpoint.node == owner.node]
    # One rank owns every shard; several ranks can share the slot only through host memory of one node.
    local = writes_shards and (len(senders) == 1 or (storage == "host" and len(same_node) == len(senders)))
    return Routes(
        storage=storage,
        writers=tuple(range(len(senders))) if local else (0,),
        local_writes=local,
        readers=tuple(rank for rank in near if rank not in followers),
        broadcast=tuple(rank for rank in range(len(receivers)) if rank not in near),
        shares=tuple(shares),
    )
