"""Rollouts: prompts -> sampled responses -> rewards, with per-domain prompt mixing and dynamic sampling.

Fields added to the generation output (see roll.strategies.base for the rest): ``response_text`` (decoded,
special tokens removed), ``group_index`` (int64, the prompt a sample belongs to, unique within a step),
``scores`` (float32 response-level reward) and ``reward_info`` (why).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from roll.pipelines.algorithms import zero_variance_group_mask
from roll.pipelines.algorithms.roll_knobs import query_filter_mask
from roll.pipelines.data import PromptCollator, StatefulBatchIterator
from roll.protocol import DataProto
from roll.runtime import Cluster, ConfigError
from roll.strategies import GenerationConfig
from roll.strategies.generation import compact_generation_padding

__all__ = [
    "PromptSource",
    "RolloutResult",
    "Rollouts",
    "route_domain_column",
    "split_by_domain",
    "step_generation_config",
]

logger = logging.getLogger(__name__)


def _quotas(total: int, probs: dict[str, float]) -> dict[str, int]:
    """Largest-remainder split of ``total`` by ``probs`` (sums exactly to ``total``)."""
    norm = sum(probs.values())
    raw = {k: total * v / norm for k, v in probs.items()}
    out = {k: math.floor(v) for k, v in raw.items()}
    for key in sorted(raw, key=lambda k: raw[k] - out[k], reverse=True)[: total - sum(out.values())]:
        out[key] += 1
    return out


def route_domain_column(example_sets: Sequence[Sequence[Mapping[str, Any]]], rewards: dict[str, Any]) -> dict[str, Any]:
    """``rewards`` with the tags of rows that name their reward domain (a ``domain`` field, from
    ``data_args.domain_key``) added to that domain's ``tag_included``, so that routing by tag scores each such row
    where its domain column says (ROLL's rule: the row's domain wins over its tag). Unchanged without such rows.

    Raises:
        ConfigError: a row names a domain that is not a reward domain, or rows of one tag name a domain other than
            the one whose tag_included has the tag (or several domains): routing by tag cannot honour both.
    """
    owner = {tag: domain for domain, cfg in rewards.items() for tag in cfg.tag_included}
    named: dict[str, str] = {}
    for examples in example_sets:
        for i, example in enumerate(examples):
            domain = example.get("domain")
            if domain is None:
                continue
            tag = example.get("tag")
            if domain not in rewards:
                raise ConfigError(
                    f"prompt {i} (tag {tag!r}) names reward domain {domain!r} in its domain column, which is not a "
                    f"reward domain ({sorted(rewards)}); fix the data, add the domain to rewards, or set "
                    f"data_args.domain_key=null to route rows by tag only"
                )
            first = named.setdefault(str(tag), domain)
            if owner.get(tag, domain) != domain or first != domain:
                other = owner.get(tag) if owner.get(tag, domain) != domain else first
                raise ConfigError(
                    f"prompt {i} has tag {tag!r} and domain {domain!r}, but rows of that tag go to domain {other!r}; "
                    f"give the tag's rows one domain, or set data_args.domain_key=null to route rows by tag only"
                )
    added = {domain: sorted(tag for tag, d in named.items() if d == domain and tag not in owner) for domain in rewards}
    if not any(added.values()):
        return rewards
    for domain, tags in added.items():
        if tags:
            logger.info("reward domain %r also scores tags %s (the rows' domain column)", domain, tags)
    return {
        domain: cfg.model_copy(update={"tag_included": [*cfg.tag_included, *added[domain]]}) if added[domain] else cfg
        for domain, cfg in rewards.items()
    }


def split_by_domain(examples: Sequence[Mapping[str, Any]], rewards: dict[str, Any]) -> dict[str, list[int]]:
    """Example indices per reward domain by tag; an example whose tag no domain accepts is an error."""
    owner = {tag: domain for domain, cfg in rewards.items() for tag in cfg.tag_included}
    out: dict[str, list[int]] = {domain: [] for domain in rewards}
    for i, example in enumerate(examples):
        tag = example.get("tag")
        if tag not in owner:
            raise ConfigError(
                f"prompt {i} has tag {tag!r}, which no reward domain accepts (tag_included of {sorted(rewards)}); "
                f"add it to a domain's tag_included or fix the data"
            )
        out[owner[tag]].append(i)
    return out


def check_reward_fields(
    examples: Sequence[Mapping[str, Any]],
    rewards: dict[str, Any],
    worker_classes: dict[str, Any],
    data_field: str = "actor_train.data_args",
) -> None:
    """Every prompt carries the fields its domain's scorer needs (e.g. ground_truth for math)."""
    for domain, indices in split_by_domain(examples, rewards).items():
        needed = getattr(worker_classes[domain], "required_fields", ())
        for i in indices:
            for group in needed:
                if not any(examples[i].get(name) is not None for name in group):
                    raise ConfigError(
                        f"reward domain {domain!r} ({rewards[domain].reward_type}) needs a {' or '.join(group)!r} "
                        f"field, but prompt {i} has only {sorted(k for k, v in examples[i].items() if v is not None)}; "
                        f"add the column to {data_field}.extra_keys (or optional_keys, when only some rows have it) "
                        "and to the data"
                    )


def step_generation_config(config: GenerationConfig, run_seed: int, step: int) -> GenerationConfig:
    """``config`` with a sampling seed of its own for ``step`` (from ``config.seed``, else the run's seed).

    Every step samples from a fresh seed that does not depend on the engine's history, so a run resumed from a
    checkpoint (with freshly started engines) samples exactly what the uninterrupted run sampled.
    """
    base = config.seed if config.seed is not None else run_seed
    return config.model_copy(update={"seed": (base * 1_000_003 + step * 7919) % 2**31})


class PromptSource:
    """Endless, resumable batches of prompts, mixed across domains by ``domain_interleave_probs``."""

    def __init__(
        self,
        examples: Sequence[Mapping[str, Any]],
        rewards: dict[str, Any],
        probs: dict[str, float] | None,
        collator: PromptCollator,
        *,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
    ) -> None:
        self.examples = examples
        self.collator = collator
        by_domain = split_by_domain(examples, rewards)
        if probs is None:
            self.pools = {"all": list(range(len(examples)))}
            self.quotas = {"all": batch_size}
        else:
            self.quotas = {k: v for k, v in _quotas(batch_size, probs).items() if v > 0}
            self.pools = {k: by_domain[k] for k in self.quotas}
            empty = [k for k, pool in self.pools.items() if not pool]
            if empty:
                raise ConfigError(
                    f"domain_interleave_probs gives domains {empty} a share, but no prompt has their tags"
                )
        self.iterators = {
            key: StatefulBatchIterator(len(pool), self.quotas[key], seed=seed + i, shuffle=shuffle, drop_last=False)
            for i, (key, pool) in enumerate(self.pools.items())
            if self.quotas[key] <= len(pool)
        }
        too_small = [k for k in self.pools if k not in self.iterators]
        if too_small:
            raise ConfigError(
                f"rollout_batch_size asks {[self.quotas[k] for k in too_small]} prompts per step from {too_small}, "
                f"which have only {[len(self.pools[k]) for k in too_small]}; lower rollout_batch_size or add prompts"
            )

    def next_indices(self) -> list[int]:
        """The next batch's example indices (into ``examples``), mixed by the domain quotas."""
        picked: list[int] = []
        for key, iterator in self.iterators.items():
            indices = next(iterator)
            while len(indices) < self.quotas[key]:  # the end of an epoch gave a short batch: top it up
                indices = indices + next(iterator)[: self.quotas[key] - len(indices)]
            picked += [self.pools[key][i] for i in indices]
        return picked

    def next_batch(self) -> DataProto:
        return self.collator([self.examples[i] for i in self.next_indices()])

    def state_dict(self) -> dict[str, Any]:
        return {key: it.state_dict() for key, it in self.iterators.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, it in self.iterators.items():
            it.load_state_dict(state[key])


@dataclass
class RolloutResult:
    batch: DataProto | None
    metrics: dict[str, float] = field(default_factory=dict)


class Rollouts:
    """Generates with ``actor_infer`` and scores with the reward clusters (one per domain)."""

    def __init__(
        self, actor_infer: Cluster, reward_clusters: dict[str, Cluster], rewards_cfg: dict[str, Any], tokenizer: Any
    ) -> None:
        self.actor_infer = actor_infer
        self.reward_clusters = reward_clusters
        self.owner = {tag: domain for domain, cfg in rewards_cfg.items() for tag in cfg.tag_included}
        self.query_filters = {
            domain: cfg.query_filter_config
            for domain, cfg in rewards_cfg.items()
            if getattr(cfg, "query_filter_config", None) is not None and cfg.query_filter_config.type != "no_filter"
        }
        self.tokenizer = tokenizer
        self._next_group = 0

    def generate(self, prompts: DataProto, generation_config: GenerationConfig) -> DataProto:
        n = generation_config.num_return_sequences
        out = self.actor_infer.generate(prompts, generation_config)
        groups = torch.arange(self._next_group, self._next_group + len(prompts)).repeat_interleave(n)
        self._next_group += len(prompts)
        out.batch["group_index"] = groups
        responses = [row[mask.bool()].tolist() for row, mask in zip(out.batch["responses"], out.batch["response_mask"])]
        out.non_tensor_batch["response_text"] = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return out

    def score(self, batch: DataProto) -> DataProto:
        """Route each row to its domain's reward cluster by ``tag``; write ``scores`` and ``reward_info`` in order."""
        tags = batch.non_tensor_batch["tag"]
        scores = torch.zeros(len(batch), dtype=torch.float32)
        info: list[str] = [""] * len(batch)
        domains = np.array([self.owner.get(tag) for tag in tags], dtype=object)
        if any(d is None for d in domains):
            bad = sorted({str(t) for t, d in zip(tags, domains) if d is None})
            raise ConfigError(f"samples with tags {bad} match no reward domain's tag_included")
        pending = {}
        for domain, cluster in self.reward_clusters.items():
            rows = np.flatnonzero(domains == domain)
            if len(rows):
                pending[domain] = (rows, cluster.compute_rewards(batch.select_idxs(rows), blocking=False))
        for rows, call in pending.values():
            result = call.materialize()
            scores[torch.from_numpy(rows)] = result.batch["scores"].float()
            for row, text in zip(rows, result.non_tensor_batch["reward_info"]):
                info[row] = text
        batch.batch["scores"] = scores
        batch.non_tensor_batch["reward_info"] = info
        return batch

    def query_filter_keep(self, batch: DataProto) -> torch.Tensor:
        """(batch,) bool: rows kept by their domain's ``query_filter_config`` (ROLL's per-domain query filter)."""
        keep = torch.ones(len(batch), dtype=torch.bool)
        domains = [self.owner.get(tag) for tag in batch.non_tensor_batch["tag"]]
        for domain, spec in self.query_filters.items():
            rows = torch.tensor([d == domain for d in domains])
            if not rows.any():
                continue
            args = spec.filter_args
            keep[rows] = query_filter_mask(
                batch.batch["scores"][rows],
                batch.batch["group_index"][rows],
                spec.type,
                threshold_up=args.threshold_up,
                threshold_down=args.threshold_down,
                std_threshold=args.std_threshold,
            )
        return keep

    def unscored(self, batch: DataProto) -> DataProto:
        """``batch`` with zero ``scores`` and empty ``reward_info``: samples no reward looks at (pure OPD)."""
        batch.batch["scores"] = torch.zeros(len(batch), dtype=torch.float32)
        batch.non_tensor_batch["reward_info"] = [""] * len(batch)
        return batch

    def collect(
        self,
        source: PromptSource,
        generation_config: GenerationConfig,
        *,
        dynamic_sampling: bool,
        max_rounds: int,
        score: bool = True,
        filter_groups: bool = True,
    ) -> RolloutResult:
        """One step's samples. With dynamic sampling, groups whose rewards all agree are dropped, and so are groups a
        domain's ``query_filter_config`` rejects; more prompts are generated (at most ``max_rounds`` rounds) until
        a full batch of kept groups is collected.
        ``score=False``: no reward cluster is called (the samples get zero scores); ``filter_groups=False``: no
        ``query_filter_config`` runs (pure OPD, whose scores only feed metrics)."""
        target = sum(source.quotas.values())
        n = generation_config.num_return_sequences
        kept: list[DataProto] = []
        kept_groups = rounds = generated_groups = 0
        refill = dynamic_sampling or (bool(self.query_filters) and filter_groups)
        filtered_groups = 0
        while kept_groups < target and rounds < max(1, max_rounds if refill else 1):
            rounds += 1
            config = generation_config
            if config.seed is not None and rounds > 1:  # each round of dynamic sampling draws fresh samples
                config = config.model_copy(update={"seed": (config.seed + 104_729 * (rounds - 1)) % 2**31})
            generated = self.generate(source.next_batch(), config)
            batch = self.score(generated) if score else self.unscored(generated)
            generated_groups += len(batch) // n
            if self.query_filters and score and filter_groups:
                keep = self.query_filter_keep(batch)
                filtered_groups += int((~keep).sum()) // n
                batch = batch.select_idxs(keep.numpy())
            if dynamic_sampling:
                keep = zero_variance_group_mask(batch.batch["scores"], batch.batch["group_index"])
                batch = batch.select_idxs(keep.numpy())
            if len(batch):
                kept.append(batch)
                kept_groups += len(batch) // n
        metrics = {"rollout/generation_rounds": float(rounds), "rollout/generated_groups": float(generated_groups)}
        if self.query_filters:
            metrics["rollout/query_filtered_groups"] = float(filtered_groups)
        if not kept:
            logger.warning("no informative groups after %d generation rounds: skipping this step's update", rounds)
            return RolloutResult(None, {**metrics, "rollout/kept_groups": 0.0})
        batch = DataProto.concat(kept)
        surplus = max(0, kept_groups - target)
        if surplus:
            batch = batch.slice(0, target * n)
        # Scoring and training need no column that is padding in every row (prompts are padded to prompt_length,
        # responses to response_length for generation).
        batch = compact_generation_padding(batch)
        metrics.update(
            {"rollout/kept_groups": float(min(kept_groups, target)), "rollout/surplus_groups_dropped": float(surplus)}
        )
        if dynamic_sampling and kept_groups < target:
            logger.warning("dynamic sampling kept %d/%d groups after %d rounds", kept_groups, target, rounds)
        return RolloutResult(batch, metrics)
