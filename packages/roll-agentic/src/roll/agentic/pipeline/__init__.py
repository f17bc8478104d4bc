"""The agentic pipelines: ``agentic`` (multi-turn RL) and ``agentic_rollout`` (play and write trajectories).

Both are registered in roll's pipeline registry through the ``roll.pipelines`` entry-point group (see this
package's pyproject.toml), so ``pipeline_cls: agentic`` works once roll-agentic is installed;
:func:`register_pipelines` does the same for a source checkout that is not installed.
"""

from __future__ import annotations

from roll.agentic.pipeline.config import AgenticConfig
from roll.agentic.pipeline.pipeline import AgenticPipeline, adjust_batch
from roll.agentic.pipeline.rollout_only import AgenticRolloutConfig, AgenticRolloutPipeline

__all__ = [
    "PIPELINE_ENTRY_POINTS",
    "AgenticConfig",
    "AgenticPipeline",
    "AgenticRolloutConfig",
    "AgenticRolloutPipeline",
    "adjust_batch",
    "register_pipelines",
]

PIPELINE_ENTRY_POINTS = {
    "agentic": "roll.agentic.pipeline.pipeline:AgenticPipeline",
    "agentic_rollout": "roll.agentic.pipeline.rollout_only:AgenticRolloutPipeline",
}


def register_pipelines() -> None:
    """Register ``agentic`` and ``agentic_rollout`` in roll's pipeline registry (idempotent)."""
    from roll.pipelines.registry import PIPELINES

    for name, target in PIPELINE_ENTRY_POINTS.items():
        if name not in PIPELINES:
            PIPELINES.register(name, target)
