"""Supervised fine-tuning: one role (``sft_train``), loss on response tokens only."""

from __future__ import annotations

from roll.pipelines.sft.pipeline import SFTConfig, SFTPipeline, SFTWorker

__all__ = ["SFTConfig", "SFTPipeline", "SFTWorker"]
