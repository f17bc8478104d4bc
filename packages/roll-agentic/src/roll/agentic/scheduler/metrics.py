"""Rollout metrics from episode results: success, format and scores overall and per tag, and why episodes ended.

``{prefix}/success`` is the environments' own success (``info["success"]``), counting faulted episodes as
failures; ``{prefix}/format`` (the share of turns whose action parsed) is reported beside it, never mixed in.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

from roll.agentic.env_manager import EpisodeResult

__all__ = ["summarize_episodes", "warn_context_limits"]

logger = logging.getLogger(__name__)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarize_episodes(episodes: list[EpisodeResult], prefix: str) -> dict[str, float]:
    if not episodes:
        return {}
    metrics: dict[str, float] = {}
    by_tag: dict[str, list[EpisodeResult]] = defaultdict(list)
    for episode in episodes:
        by_tag[episode.task.tag].append(episode)
    for scope, group in [("", episodes), *((f"{tag}/", eps) for tag, eps in sorted(by_tag.items()))]:
        metrics[f"{prefix}/{scope}success"] = _mean([float(e.success) for e in group])
        metrics[f"{prefix}/{scope}episode_score"] = _mean([e.episode_score for e in group])
        metrics[f"{prefix}/{scope}num_turns"] = _mean([float(e.num_turns) for e in group])
        formats = [e.format_ratio for e in group if e.format_ratio is not None]
        if formats:
            metrics[f"{prefix}/{scope}format"] = _mean(formats)
        if scope:  # the env's own step metrics (action_is_effective, tool counters, ...) per tag
            keys = {k for e in group for k in e.metrics} - {"success", "format", "episode_score", "num_turns"}
            for key in sorted(keys):
                values = [e.metrics[key] for e in group if key in e.metrics]
                metrics[f"{prefix}/{scope}{key}"] = _mean(values)
    for reason in sorted({e.end_reason for e in episodes}):
        metrics[f"{prefix}/end_reason/{reason}"] = float(sum(e.end_reason == reason for e in episodes))
    return metrics


def warn_context_limits(episodes: list[EpisodeResult], *, where: str, warned: set[str]) -> None:
    """Warn, once per tag (``warned`` holds the tags already named), when episodes ended ``context_limit``: the next
    turn no longer fit in ``sequence_length``. The start-up length check only proves the first turn fits, so a config
    whose history outgrows the context cuts every episode short with nothing but an ``end_reason`` metric to show."""
    cut = Counter(e.task.tag for e in episodes if e.end_reason == "context_limit")
    for tag in sorted(set(cut) - warned):
        warned.add(tag)
        of_tag = [e for e in episodes if e.task.tag == tag]
        turns = _mean([float(e.num_turns) for e in of_tag if e.end_reason == "context_limit"])
        logger.warning(
            "%s: env tag %r: %d of %d episodes ended context_limit after %.1f turns on average (the next turn did not "
            "fit in rollout.sequence_length, ROLL's sequence_length); raise it, or lower the tag's max_steps, "
            "max_tokens_per_step or history; shown once per tag",
            where,
            tag,
            cut[tag],
            len(of_tag),
            turns,
        )
