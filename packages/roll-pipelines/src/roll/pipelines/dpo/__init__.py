"""Direct preference optimization: ``actor_train`` learns from chosen/rejected pairs against ``reference``."""

from __future__ import annotations

from roll.pipelines.dpo.config import DPOConfig, DPOLossSection, DPOValidationSection
from roll.pipelines.dpo.pipeline import DPOPipeline
from roll.pipelines.dpo.workers import DPOWorker, dpo_metrics

__all__ = ["DPOConfig", "DPOLossSection", "DPOPipeline", "DPOValidationSection", "DPOWorker", "dpo_metrics"]
