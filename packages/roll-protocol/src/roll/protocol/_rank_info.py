"""Where one worker sits in its cluster's parallel topology."""

from __future__ import annotations

from dataclasses import dataclass

from roll.protocol.errors import ProtocolError


@dataclass(frozen=True)
class RankInfo:
    """A worker's rank and its data/tensor/pipeline/context-parallel coordinates.

    The defaults describe pure data parallelism (``dp_rank = rank``, ``dp_size = world_size``). A strategy that
    shards a model (Megatron TP/PP/CP, ...) replaces it with its real topology; dispatch and collection read it.
    """

    rank: int = 0
    world_size: int = 1
    # Left out (None), they default to rank / world_size; __post_init__ resolves them, so they are always ints.
    dp_rank: int = None  # type: ignore[assignment]
    dp_size: int = None  # type: ignore[assignment]
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1

    def __post_init__(self) -> None:
        if self.dp_rank is None:
            object.__setattr__(self, "dp_rank", self.rank)
        if self.dp_size is None:
            object.__setattr__(self, "dp_size", self.world_size)
        for name in ("dp", "tp", "pp", "cp"):
            rank, size = getattr(self, f"{name}_rank"), getattr(self, f"{name}_size")
            if size < 1 or not 0 <= rank < size:
                raise ProtocolError(f"RankInfo {name}_rank={rank} is outside [0, {name}_size={size})")
        if not 0 <= self.rank < self.world_size:
            raise ProtocolError(f"RankInfo rank={self.rank} is outside [0, world_size={self.world_size})")
        product = self.dp_size * self.tp_size * self.pp_size * self.cp_size
        if product != self.world_size:
            raise ProtocolError(
                f"RankInfo sizes do not multiply to world_size: dp {self.dp_size} x tp {self.tp_size} x pp "
                f"{self.pp_size} x cp {self.cp_size} = {product}, world_size = {self.world_size}"
            )

    @property
    def is_pipeline_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_collect_rank(self) -> bool:
        """True for the one rank per data-parallel replica whose output counts (tp 0, cp 0, last pipeline stage)."""
        return self.tp_rank == 0 and self.cp_rank == 0 and self.is_pipeline_last_stage

    @property
    def is_dispatch_first_rank(self) -> bool:
        """True for the rank that receives the data under DP_MP_DISPATCH_FIRST (tp 0, cp 0, pp 0)."""
        return self.tp_rank == 0 and self.cp_rank == 0 and self.pp_rank == 0
