"""Per-request rollouts for async RLVR: prompts become requests, finished groups go to the replay buffer.

Every prompt admitted (under the ``async_generation_ratio`` rule of :mod:`roll.pipelines.rlvr.replay`) becomes
``n`` sample requests. Requests go to idle engines a few at a time (:class:`~roll.pipelines.engines.EnginePool`)
in *segments* of at most ``partial_rollout_tokens`` new tokens, so a weight sync never waits for more than one
segment: :meth:`RequestScheduler.drain` lets the running segments end, the pipeline copies the weights, and
unfinished samples continue from their prefix under the new weights (tokens and log-probs kept; a sample's
``policy_version`` is the oldest version among its tokens, ``async/resumed_across_sync`` counts the samples that
crossed a version boundary).

A group is scored as soon as its last sample finishes; dynamic sampling discards it there if its rewards all agree
(its place is given back, so another prompt tops the batch up). Requests of an engine that died or hung are
re-issued. Accounting is exact and checked at every step: each admitted group is trained on, discarded, ready, or
still generating, and each sample finishes exactly once.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from roll.pipelines.algorithms import zero_variance_group_mask
from roll.pipelines.data import PromptCollator
from roll.pipelines.engines import EnginePool
from roll.pipelines.rlvr.replay import FinishedGroup, ReplayBuffer
from roll.pipelines.rlvr.rollout import PromptSource, Rollouts
from roll.protocol import DataProto
from roll.runtime import RollError
from roll.strategies import GenerationConfig
from roll.strategies.generation import build_generation_output, compact_generation_padding
from roll.strategies.requests import GenerateRequest, GenerateResult

__all__ = ["AccountingError", "RequestScheduler"]

logger = logging.getLogger(__name__)
_POLL_S = 0.2


class AccountingError(RollError):
    """A prompt or sample was lost or counted twice: a scheduler bug."""


@dataclass
class _Sample:
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: set[int] = field(default_factory=set)
    finish_reason: str = ""


@dataclass
class _Group:
    key: int
    example: int
    samples: list[_Sample]
    done: int = 0


class RequestScheduler:
    """Feeds an :class:`EnginePool` from a :class:`PromptSource` and fills a :class:`ReplayBuffer` (see above)."""

    def __init__(
        self,
        pool: EnginePool,
        rollouts: Rollouts,
        source: PromptSource,
        collator: PromptCollator,
        generation_config: GenerationConfig,
        *,
        ratio: float,
        segment_tokens: int | None,
        requests_per_call: int,
        dynamic_sampling: bool,
        seed: int,
        max_generation_rounds: int = 4,
    ) -> None:
        self.pool, self.rollouts, self.source, self.collator = pool, rollouts, source, collator
        self.config = generation_config
        self.n = generation_config.num_return_sequences
        self.segment_tokens = segment_tokens
        self.requests_per_call = requests_per_call
        self.dynamic_sampling = dynamic_sampling
        self.max_generation_rounds = max_generation_rounds
        self.seed = seed
        self.buffer: ReplayBuffer[DataProto] = ReplayBuffer(sum(source.quotas.values()), ratio)
        self.queue: deque[GenerateRequest] = deque()
        self.groups: dict[int, _Group] = {}
        self.supply: deque[int] = deque()  # example indices drawn from the source, not yet admitted
        self.replay: deque[tuple[int, int]] = deque()
        """Groups ``(key, example)`` a checkpoint carried over (admitted, not trained on): admitted again first."""
        self.paused = False
        self.next_group = 0
        self.finished_samples = 0
        self.reissued = 0
        self.segments = 0
        self.resumed_across_sync = 0
        self.filtered = 0

    # --- admission and dispatch ----------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.buffer.may_admit(self.pool.version):
            if self.replay:  # a resumed run: the same group again, so the same request ids and sampling seeds
                key, example = self.replay.popleft()
            else:
                if not self.supply:
                    self.supply.extend(self.source.next_indices())
                example = self.supply.popleft()
                key, self.next_group = self.next_group, self.next_group + 1
            self.groups[key] = _Group(key, example, [_Sample() for _ in range(self.n)])
            prompt = list(self.source.examples[example]["prompt_ids"])
            for j in range(self.n):
                seed = (self.seed * 1_000_003 + key * 257 + j) % 2**31
                self.queue.append(
                    GenerateRequest(f"{key}/{j}", prompt, self.config, segment_tokens=self.segment_tokens, seed=seed)
                )
            self.buffer.admit()

    def _dispatch(self) -> None:
        if self.paused:
            return
        for engine in self.pool.idle():
            if not self.queue:
                return
            take = [self.queue.popleft() for _ in range(min(self.requests_per_call, len(self.queue)))]
            self.pool.submit(engine, take)
            self.segments += len(take)

    # --- results -------------------------------------------------------------------------------------------
    def pump(self, timeout_s: float = _POLL_S) -> None:
        """Admit, dispatch, and take in what the engines finished within ``timeout_s`` (re-issuing lost work)."""
        self._admit()
        self._dispatch()
        polled = self.pool.poll(timeout_s)
        if polled.lost:
            self.reissued += len(polled.lost)
            self.queue.extendleft(reversed(polled.lost))  # first in line, in their order
        owners = {r.request_id: r for r in polled.lost}
        for result in polled.results:
            self._take_result(result, owners)
        self._admit()
        self._dispatch()

    def _take_result(self, result: GenerateResult, owners: dict[str, GenerateRequest]) -> None:
        key, j = (int(x) for x in result.request_id.split("/"))
        group = self.groups.get(key)
        if group is None or group.samples[j].finish_reason:
            raise AccountingError(f"sample {result.request_id} finished twice (or was never admitted)")
        if result.request_id in owners:
            raise AccountingError(f"sample {result.request_id} both finished and was handed back as lost")
        sample = group.samples[j]
        sample.tokens += result.token_ids
        sample.log_probs += list(result.log_probs or [0.0] * len(result.token_ids))
        sample.versions.add(result.policy_version)
        if result.finish_reason == "abort":  # only the segment ended: continue from the prefix
            prefix = GenerateRequest(
                result.request_id,
                list(self.source.examples[group.example]["prompt_ids"]),
                self.config,
                sample.tokens,
                sample.log_probs,
                self.segment_tokens,
                (self.seed * 1_000_003 + key * 257 + j + 7919 * len(sample.tokens)) % 2**31,
            )
            self.queue.appendleft(prefix)
            return
        sample.finish_reason = result.finish_reason
        self.finished_samples += 1
        self.resumed_across_sync += len(sample.versions) > 1
        group.done += 1
        if group.done == self.n:
            self._finish_group(self.groups.pop(key))

    def _finish_group(self, group: _Group) -> None:
        prompt = self.collator([self.source.examples[group.example]])
        batch = build_generation_output(
            prompt,
            [s.tokens for s in group.samples],
            [s.log_probs for s in group.samples],
            [s.finish_reason for s in group.samples],
            num_return_sequences=self.n,
            max_new_tokens=self.config.max_new_tokens,
            pad_token_id=self.collator.pad_token_id,
        )
        version = min(min(s.versions) for s in group.samples)
        batch.batch["group_index"] = torch.full((self.n,), group.key, dtype=torch.long)
        batch.batch["policy_version"] = torch.tensor([min(s.versions) for s in group.samples], dtype=torch.long)
        responses = [s.tokens for s in group.samples]
        batch.non_tensor_batch["response_text"] = np.array(
            self.rollouts.tokenizer.batch_decode(responses, skip_special_tokens=True), dtype=object
        )
        batch = self.rollouts.score(batch)
        if self.dynamic_sampling and not bool(
            zero_variance_group_mask(batch.batch["scores"], batch.batch["group_index"]).any()
        ):
            self.filtered += 1
            self.buffer.discard()
            return
        self.buffer.put(FinishedGroup((group.key, group.example), version, batch, self.n))

    # --- the trainer's side --------------------------------------------------------------------------------
    def next_batch(self, train_version: int) -> DataProto:
        """A step's groups for the step that trains ``train_version``; generation goes on meanwhile."""
        start, per_step = self.filtered, self.buffer.groups_per_step
        limit = max(1, self.max_generation_rounds - 1) * per_step  # as many extra groups as sync rounds allow
        while (taken := self.buffer.take(train_version)) is None:
            if self.filtered - start >= limit and len(self.buffer):  # dynamic sampling: train on what is kept
                logger.warning(
                    "dynamic sampling discarded %d groups; training on %d", self.filtered - start, len(self.buffer)
                )
                taken = self.buffer.take(train_version, len(self.buffer))
                if taken:
                    break
            if self.filtered - start >= 4 * limit and not len(self.buffer):
                raise RollError(
                    f"dynamic sampling discarded {self.filtered - start} groups in a row (every group's rewards "
                    f"agreed); the task is too easy or too hard for the policy: turn dynamic_sampling off or change data"
                )
            self.pump()
        batch = DataProto.concat([g.payload for g in taken])
        batch.batch["staleness"] = train_version - batch.batch["policy_version"]
        self.check_accounting()
        return compact_generation_padding(batch)

    def drain(self) -> None:
        """Stop issuing segments and take in the running ones (before a weight sync)."""
        self.paused = True
        while self.pool.in_flight:
            self.pump()

    def restart_at(self, version: int) -> None:
        """After a checkpoint resume: the engines hold ``version``, as if ``version`` steps had been trained."""
        self.pool.version = version
        self.buffer.admitted = self.buffer.consumed = version * self.buffer.groups_per_step

    def resume(self) -> None:
        self.paused = False
        self._admit()
        self._dispatch()

    def check_accounting(self) -> None:
        b = self.buffer
        accounted = b.consumed + b.discarded + len(b) + len(self.groups)
        if accounted != b.admitted:
            raise AccountingError(
                f"{b.admitted} groups admitted but {accounted} accounted for (trained {b.consumed}, discarded "
                f"{b.discarded}, ready {len(b)}, generating {len(self.groups)})"
            )

    def metrics(self) -> dict[str, float]:
        return {
            **self.buffer.metrics(),
            **self.pool.metrics(),
            "async/generating_groups": float(len(self.groups)),
            "async/finished_samples": float(self.finished_samples),
            "async/reissued_requests": float(self.reissued),
            "async/segments": float(self.segments),
            "async/resumed_across_sync": float(self.resumed_across_sync),
            "async/filtered_groups": float(self.filtered),
        }

    # --- checkpoints ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Prompt cursor; the groups admitted but not trained on (generating, or ready in the buffer) as ``replay``,
        ``[key, example]`` in admission order, which a resumed run admits again first with the same keys (so the same
        request ids and sampling seeds), then goes on from ``next_group``; the prompts drawn but not admitted
        (``carry``); and the replay buffer's staleness counters, which a resumed run's ``async/staleness_*`` metrics
        continue. The resumed run admits the groups an uninterrupted run would, in the same order."""
        admitted = dict(self.replay)  # carried over by the checkpoint this run resumed from, not yet admitted again
        admitted.update({group.key: group.example for group in self.groups.values()})
        admitted.update({int(g.key[0]): int(g.key[1]) for g in self.buffer.ready})  # type: ignore[index]
        return {
            "prompts": self.source.state_dict(),
            "replay": [[key, admitted[key]] for key in sorted(admitted)],
            "next_group": self.next_group,
            "carry": list(self.supply),
            "buffer": self.buffer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (a checkpoint written before ``replay`` was kept lists those groups'
        prompts under ``carry``: they are admitted again first, under new keys)."""
        self.source.load_state_dict(state["prompts"])
        self.replay = deque((int(key), int(example)) for key, example in state.get("replay", []))
        self.next_group = int(state.get("next_group", 0))
        self.supply = deque(state.get("carry", []))
        self.buffer.load_state_dict(state.get("buffer", {}))  # the staleness metrics go on
