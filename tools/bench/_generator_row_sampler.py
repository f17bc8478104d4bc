"""seeded_sampling's reference sampler, in a module of its own (imported when the benchmark runs) so that importing the
benchmark (``--help``) does not load torch and transformers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from transformers.generation.logits_process import LogitsProcessor


class GeneratorRowSampler(LogitsProcessor):
    """The seeded sampler as first committed (027e7c5), the reference the counter-based one replaced."""

    def __init__(self, seeds: Sequence[int]) -> None:
        self.generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(scores.double(), dim=-1)
        cdf = probs.cumsum(dim=-1)
        uniforms = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in self.generators])
        targets = uniforms.to(cdf.device).unsqueeze(-1) * cdf[:, -1:]
        drawn = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
        positive = probs > 0
        last = positive.shape[-1] - 1 - positive.flip(-1).int().argmax(dim=-1)
        drawn = torch.minimum(drawn, last)
        chosen = torch.full_like(scores, float("-inf"))
        chosen.scatter_(1, drawn.unsqueeze(-1), 0.0)
        return cast(torch.FloatTensor, chosen)
