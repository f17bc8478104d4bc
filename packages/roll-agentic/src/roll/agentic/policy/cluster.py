"""Serve per-turn requests with an inference Cluster's batch ``generate`` (hf_infer, vllm, mock_infer, ...).

Requests wait in a micro-queue: when the engine is free, everything queued (up to ``max_batch_size``, after at
most ``batch_wait_s`` of gathering) goes out as one left-padded batch per distinct generation config, and each
caller gets its row back. Seeded requests travel as the batch's ``sampling_seed`` column, so a request samples the
same tokens whichever requests it is batched with (unseeded ones go in batches of their own). This keeps roll's
existing batch API usable for agentic rollouts; a per-request engine client (continuous batching, abort on weight
sync) can replace it behind the same protocol.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import torch

from roll.agentic.policy.protocol import GenerateRequest, GenerateResult
from roll.protocol import DataProto, pad_dataproto_to_divisor
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig
from roll.strategies.generation import SAMPLING_SEED_KEY

__all__ = ["ClusterPolicyClient", "prompts_to_batch"]

logger = logging.getLogger(__name__)


def prompts_to_batch(prompts: list[list[int]], pad_token_id: int) -> DataProto:
    """Left-padded ``input_ids``/``attention_mask``/``position_ids`` for a strategy's ``generate``."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": positions})


@dataclass
class _Pending:
    request: GenerateRequest
    future: asyncio.Future[GenerateResult]


class ClusterPolicyClient:
    """A PolicyClient over ``cluster.generate(batch, generation_config)`` (an ``actor_infer`` role).

    Picklable until first used, so it can be built on the driver and shipped to EnvironmentWorkers (each then
    batches its own envs' requests). ``policy_version`` is stamped on every result; the pipeline raises it after
    each weight sync with :meth:`set_policy_version`.
    """

    def __init__(
        self,
        cluster: Any,
        *,
        pad_token_id: int,
        max_batch_size: int = 256,
        batch_wait_s: float = 0.002,
        policy_version: int = 0,
    ) -> None:
        if max_batch_size < 1 or batch_wait_s < 0:
            raise ConfigError("ClusterPolicyClient needs max_batch_size >= 1 and batch_wait_s >= 0")
        self.cluster, self.pad_token_id = cluster, pad_token_id
        self.max_batch_size, self.batch_wait_s = max_batch_size, batch_wait_s
        self.policy_version = policy_version
        self._queue: list[_Pending] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self.batches_sent = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_queue=[], _wakeup=None, _worker=None)  # loop-bound state stays behind
        return state

    def set_policy_version(self, version: int) -> None:
        self.policy_version = version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if request.generation_config.num_return_sequences != 1:
            raise ConfigError("agentic requests sample one response: set num_return_sequences to 1")
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._serve())
        pending = _Pending(request, loop.create_future())
        self._queue.append(pending)
        assert self._wakeup is not None
        self._wakeup.set()
        return await pending.future

    async def _serve(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self.batch_wait_s > 0:
                await asyncio.sleep(self.batch_wait_s)  # let requests of the same moment join the batch
            while self._queue:
                batch, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
                await self._run(batch)

    async def _run(self, batch: list[_Pending]) -> None:
        by_config: dict[tuple[str, bool], list[_Pending]] = {}
        for item in batch:
            key = (item.request.generation_config.model_dump_json(), item.request.seed is None)
            by_config.setdefault(key, []).append(item)
        for items in by_config.values():
            items = [item for item in items if not item.future.done()]  # a cancelled caller wants no answer
            if not items:
                continue
            try:
                results = await asyncio.to_thread(self._generate, [i.request for i in items])
            except Exception as e:  # every waiting env learns of the engine failure
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            for item, result in zip(items, results):
                if not item.future.done():
                    item.future.set_result(result)

    def _generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        config: GenerationConfig = requests[0].generation_config
        batch = prompts_to_batch([r.prompt_ids for r in requests], self.pad_token_id)
        if requests[0].seed is not None:  # a batch is all seeded or all not (see _run)
            batch.batch[SAMPLING_SEED_KEY] = torch.tensor([r.seed for r in requests], dtype=torch.long)
        dp_size = getattr(self.cluster, "dp_size", 1) or 1
        batch, pad = pad_dataproto_to_divisor(batch, dp_size)  # every data-parallel rank gets a row
        out = self.cluster.generate(batch, config)
        self.batches_sent += 1
        responses, mask = out.batch["responses"], out.batch["response_mask"].bool()
        log_probs = out.batch["rollout_log_probs"] if "rollout_log_probs" in out.batch.keys() else None
        reasons = out.non_tensor_batch["finish_reason"]
        results = []
        for row, request in enumerate(requests):
            valid = mask[row]
            results.append(
                GenerateResult(
                    request.request_id,
                    responses[row][valid].tolist(),
                    None if log_probs is None else log_probs[row][valid].tolist(),
                    str(reasons[row]),  # type: ignore[arg-type]
                    self.policy_version,
                )
            )
        if pad:
            logger.debug("padded a generation batch of %d with %d rows for dp=%d", len(requests), pad, dp_size)
        return results
