"""The mock backend: answers are a pure function of the prompt tokens, seed and sample index.

Response of sample j for prompt p: tokens ``(sum(p) + 7*t + j + seed) % (vocab - 2) + 2`` for
``t < length``, length ``1 + (sum(p) + j) % max_new_tokens``, then EOS if it fits. Log-probs are
``-0.5 - 0.01*t``. Forward passes return logits that put log-prob mass ``log(0.5)`` on ``(token+1) % vocab``.
"""

from __future__ import annotations

import math

import torch

from roll.protocol import DataProto
from roll.strategies.base import InferenceStrategy
from roll.strategies.config import GenerationConfig
from roll.strategies.contract import ForwardFunc, check_logits_to_keep
from roll.strategies.generation import build_generation_output, prompt_token_lists
from roll.strategies.mock.config import MockInferConfig


class MockInferStrategy(InferenceStrategy):
    strategy_name = "mock_infer"
    config: MockInferConfig

    def initialize(self) -> None:
        self.weights_version = 0

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        vocab = self.config.vocab_size
        logits = torch.full((*input_ids.shape, vocab), math.log(0.5 / (vocab - 1)))
        logits.scatter_(-1, ((input_ids + 1) % vocab).unsqueeze(-1), math.log(0.5))
        return logits

    def forward_step(
        self, batch: DataProto, forward_func: ForwardFunc, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        keep = check_logits_to_keep(logits_to_keep)
        outputs: dict[str, list[torch.Tensor]] = {}
        for micro in batch.split(self.worker_config.infer_batch_size):
            input_ids = micro.batch["input_ids"]
            # Honour logits_to_keep as real backends do, so tests catch functions that index from the start.
            logits = self._logits(input_ids[:, -keep:] if keep else input_ids)
            for key, value in forward_func(micro, logits).items():
                outputs.setdefault(key, []).append(value)
        return {key: torch.cat(values) for key, values in outputs.items()}

    def generate(self, batch: DataProto, generation_config: GenerationConfig) -> DataProto:
        cfg, n, budget = self.config, generation_config.num_return_sequences, generation_config.max_new_tokens
        responses, log_probs, reasons = [], [], []
        for prompt in prompt_token_lists(batch):
            base = sum(prompt) + cfg.seed + self.weights_version
            for j in range(n):
                length = 1 + (base + j) % budget
                tokens = [(base + 7 * t + j) % (cfg.vocab_size - 2) + 2 for t in range(length)]
                finished = length < budget
                if finished:
                    tokens.append(cfg.eos_token_id)
                responses.append(tokens)
                log_probs.append([-0.5 - 0.01 * t for t in range(len(tokens))])
                reasons.append("stop" if finished else "length")
        return build_generation_output(
            batch,
            responses,
            log_probs,
            reasons,
            num_return_sequences=n,
            max_new_tokens=budget,
            pad_token_id=cfg.pad_token_id,
        )

    def update_weights(self, named_tensors) -> None:
        for _ in named_tensors:
            pass

    def process_weights_after_loading(self) -> None:
        # Each sync changes the answers, so tests can see that a sync reached the engine.
        self.weights_version += 1
