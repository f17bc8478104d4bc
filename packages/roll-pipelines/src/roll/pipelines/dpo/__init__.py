"""Direct preference optimization: ``actor_train`` learns from chosen/rejected pairs against ``reference``."""

from __future__ import annotations

from roll.pipelines.dpo.pipeline import DPOConfig, DPOPipeline, DPOWorker

__all__ = ["DPOConfig", "DPOPipeline", "DPOWorker"]
