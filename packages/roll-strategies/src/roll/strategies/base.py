"""The Strategy contracts: one model backend behind a stable Worker API.

A Worker says *what* to compute (a forward function, a loss function) and passes the options that change the
computation as typed arguments (see :mod:`roll.strategies.contract`); its strategy decides *how* on its backend
(HF, FSDP2, vLLM, SGLang, Megatron). Workers and pipelines never branch on the backend's name.

Batch conventions every backend follows
---------------------------------------
Model inputs (B rows, T positions): ``input_ids`` (int64), ``attention_mask`` (0/1) and optionally
``position_ids``; prompts are left-padded, responses right-padded.

``generate(batch, generation_config)`` takes left-padded prompts (``input_ids``, ``attention_mask``) and
returns ``num_return_sequences`` rows per prompt (a prompt's samples are consecutive) with:
``prompts`` (R, P), ``responses`` (R, max_new_tokens) right-padded with the pad token, ``input_ids`` =
prompts + responses, ``attention_mask``, ``position_ids``, ``response_mask`` (R, max_new_tokens),
``rollout_log_probs`` (R, max_new_tokens; sampled tokens' log-probs under the sampling temperature, 0 on
padding) and the non-tensor column ``finish_reason`` ("stop" or "length"); every other column of the input
is repeated alongside. An optional input column ``sampling_seed`` (one integer per prompt) gives each prompt its
own random stream (sample j draws with ``seed + j``; see :func:`~roll.strategies.generation.sample_seeds`): hf_infer,
vllm and sglang then sample a row's tokens independently of the other rows in the batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from roll.protocol import DataProto, RankInfo
from roll.strategies.config import GenerationConfig, StrategyWorkerConfig
from roll.strategies.contract import (
    ForwardFunc,
    LossFunc,
    ModelForwardFunc,
    ModelLossFunc,
    OffloadTarget,
    StrategyError,
)

if TYPE_CHECKING:
    from roll.runtime import RollModel, Worker
    from roll.strategies.weight_sync.writer import WeightWriter

__all__ = ["InferenceStrategy", "TrainStrategy"]


class InferenceStrategy(ABC):
    """A model backend that can run forward passes and (optionally) generate, and receive new weights."""

    strategy_name: ClassVar[str] = ""
    is_training: ClassVar[bool] = False

    def __init__(self, worker: Worker, config: RollModel) -> None:
        self.worker = worker
        self.worker_config: StrategyWorkerConfig = worker.worker_config  # type: ignore[assignment]
        self.config = config
        self.model_args = self.worker_config.model_args
        self.tokenizer: Any = None
        self.device = torch.device("cpu")

    # --- lifecycle --------------------------------------------------------------------------------------
    @abstractmethod
    def initialize(self) -> None:
        """Load the model (and set ``self.tokenizer``); update the worker's RankInfo if the backend shards it."""

    @property
    def rank_info(self) -> RankInfo:
        return self.worker.rank_info

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release backend resources (engines, process groups)."""

    # --- compute ----------------------------------------------------------------------------------------
    @abstractmethod
    def forward_step(
        self, batch: DataProto, forward_func: ForwardFunc, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Run the model over ``batch`` in micro-batches without gradients; concatenate ``forward_func`` outputs.

        ``logits_to_keep=k``: ``forward_func`` reads only the last k positions, so a backend may compute those only.
        """

    def forward_model(self, batch: DataProto, forward_func: ModelForwardFunc) -> dict[str, torch.Tensor]:
        """Run ``forward_func(micro, model_call)`` over ``batch`` in micro-batches without gradients and concatenate
        its outputs; for models the function calls itself (``model_args.model_kind: diffusion``)."""
        raise StrategyError(f"{self.strategy_name} cannot run model functions (forward_model)")

    def generate(self, batch: DataProto, generation_config: GenerationConfig) -> DataProto:
        raise StrategyError(
            f"{self.strategy_name} does not generate; use an inference backend such as vllm or hf_infer"
        )

    # --- device memory ----------------------------------------------------------------------------------
    def offload_states(self, include: Iterable[OffloadTarget] | None = None) -> None:  # noqa: B027
        """Move states off the accelerator (no-op where there is nothing to move, e.g. on CPU)."""

    def load_states(self, include: Iterable[OffloadTarget] | None = None) -> None:  # noqa: B027
        """Bring offloaded states back."""

    # --- weights in -------------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new values for the named parameters (HF names). Called once per bucket during a weight sync.

        The tensors are views of a shared transfer buffer that is reused as soon as the call returns: copy what
        must outlive the call (e.g. a tensor buffered until the rest of its layer arrives).
        """
        raise StrategyError(f"{self.strategy_name} cannot receive weights")

    def process_weights_after_loading(self) -> None:  # noqa: B027
        """Finish a weight sync (e.g. reset caches computed with the old weights)."""

    def abort_weight_update(self) -> None:  # noqa: B027
        """A weight sync stopped after some ``update_weights`` calls: drop its partial state, so the next sync
        starts clean. The worker refuses to compute with this strategy until a later sync completes."""

    def weight_share_key(self) -> tuple[str, int] | None:
        """(layout key, bytes) when this engine can keep its weights in memory shared with other engines of the
        same key on its node (:mod:`roll.strategies.weight_sync.shared_weights`); None (the default) when not."""
        return None

    def share_weights(self, path: str, offset: int, *, fill: bool) -> None:
        """Rebind every parameter to a view of the file ``path`` (from byte ``offset``, in the order and page
        alignment of the key's layout), first copying the current values in when ``fill``."""
        raise StrategyError(f"{self.strategy_name} cannot share its weights with other engines")


class TrainStrategy(InferenceStrategy):
    """A backend that also trains: optimizer steps, checkpoints, and exporting weights."""

    is_training: ClassVar[bool] = True

    @abstractmethod
    def train_step(
        self,
        batch: DataProto,
        loss_func: LossFunc,
        *,
        loss_mask_key: str | None = None,
        logits_to_keep: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step over ``batch`` (split into micro-batches of ``per_device_train_batch_size``).

        ``loss_func`` gets each micro-batch with its :class:`~roll.strategies.contract.LossScale`, whose
        ``num_tokens`` counts the non-zero entries of ``batch[loss_mask_key]`` (rows when None) over the whole
        mini-batch on every data-parallel rank. ``logits_to_keep`` as in :meth:`forward_step`.

        Returns metrics: at least ``loss`` (mini-batch loss over all data-parallel ranks), ``grad_norm``, ``lr``.
        """

    def train_model_step(
        self, batch: DataProto, loss_func: ModelLossFunc, *, loss_mask_key: str | None = None
    ) -> dict[str, float]:
        """Like :meth:`train_step`, but ``loss_func(micro, model_call, scale)`` calls the model itself, as often as
        the algorithm needs (a diffusion sampler with gradients through its last steps, a one-step generator)."""
        raise StrategyError(f"{self.strategy_name} cannot train with model functions (train_model_step)")

    def set_learning_rate(self, lr: float) -> None:
        """Make ``lr`` the base learning rate of every parameter group from the next optimizer step on (e.g. a
        behaviour-cloning warm-up at one rate, then RL at another). The schedule keeps its position: its factor
        (warm-up ramp, decay) applies to the new base. Optimizer state (Adam moments) is kept."""
        raise StrategyError(
            f"{self.strategy_name} cannot change its learning rate during a run; use fsdp2_train, or give the "
            "warm-up and the training the same training_args.learning_rate"
        )

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Write model, optimizer, LR scheduler and RNG states under ``path`` (every rank calls this)."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote, so training continues exactly."""

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) parameters with HF names, for weight sync and export.

        A collective: every rank must iterate it to the end; tensors are only meaningful on rank 0.
        """

    def weight_writer(self) -> WeightWriter:
        """How weight sync reads this backend's full weights. The default gathers them through
        :meth:`named_weights`; a sharded backend may let every rank write its own shards in place instead."""
        from roll.strategies.weight_sync.writer import GatheredWriter

        return GatheredWriter(self.named_weights)

    @abstractmethod
    def export_hf(self, path: str) -> None:
        """Save the current model (and tokenizer) as an HF folder that transformers and vLLM load."""
