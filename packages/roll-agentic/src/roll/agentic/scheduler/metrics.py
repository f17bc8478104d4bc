"""Rollout metrics from episode results: success, format and scores overall and per tag, and why episodes ended.

``{prefix}/success`` is the environments' own success (``info["success"]``), counting faulted episodes as
failures; ``{prefix}/format`` (the share of turns whose action parsed) is reported beside it, never mixed in.
"""

from __future__ import annotations

from collections import defaultdict

from roll.agentic.env_manager import EpisodeResult

__all__ = ["summarize_episodes"]


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
