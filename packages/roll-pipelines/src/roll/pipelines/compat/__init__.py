"""ROLL compatibility: ROLL's own YAML files (Hydra defaults, ``${}``, flat PPO keys) load as roll configs.

``load_roll_file(path)`` composes and interpolates a file (:mod:`.hydra`), infers its pipeline and translates it
(:mod:`.translate`) with a report row per key; ``roll convert`` prints that report and the roll YAML.
"""

from __future__ import annotations

from roll.pipelines.compat.hydra import compose_file, deep_merge, interpolate, referenced_keys
from roll.pipelines.compat.translate import KeyReport, Translation, infer_pipeline, translate

__all__ = [
    "KeyReport",
    "Translation",
    "compose_file",
    "deep_merge",
    "format_report",
    "infer_pipeline",
    "interpolate",
    "is_roll_format",
    "referenced_keys",
    "translate",
]


def is_roll_format(data: dict) -> bool:  # type: ignore[type-arg]
    """A file in ROLL's format names no pipeline (ROLL picks it by launcher script)."""
    return "pipeline_cls" not in data


def format_report(translation: Translation) -> str:
    """A plain-text table: key | status | roll target | note."""
    rows = [("key", "status", "roll", "note")]
    rows += [(r.key, r.status, r.target, r.note) for r in translation.rows]
    widths = [min(max(len(row[i]) for row in rows), limit) for i, limit in enumerate((60, 14, 50, 0))]
    lines = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(3)] + [row[3]]
        lines.append("  ".join(cells).rstrip())
    counts: dict[str, int] = {}
    for r in translation.rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return "\n".join([*lines, f"-- {len(translation.rows)} keys: {summary}"])
