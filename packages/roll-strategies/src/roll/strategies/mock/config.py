from __future__ import annotations

from pydantic import Field

from roll.runtime import RollModel


class MockInferConfig(RollModel):
    """Settings of the mock backend. It needs no model files; a tokenizer path is used only if given."""

    vocab_size: int = Field(default=128, ge=4)
    pad_token_id: int = 0
    eos_token_id: int = 1
    seed: int = 0

    @property
    def devices_per_worker(self) -> int:
        return 1
