"""Supervised fine-tuning: one role (``sft_train``), loss on response tokens only."""

from __future__ import annotations

from roll.pipelines.sft.config import SFTConfig, SFTValidationSection
from roll.pipelines.sft.pipeline import SFTPipeline
from roll.pipelines.sft.workers import SFTWorker, sft_loss

__all__ = ["SFTConfig", "SFTPipeline", "SFTValidationSection", "SFTWorker", "sft_loss"]
