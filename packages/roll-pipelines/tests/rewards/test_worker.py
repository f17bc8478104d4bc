"""Reward workers as a Ray cluster: rows are split across ranks, scored, and collected back in order."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from roll.pipelines.rewards import REWARDS, CodeSandboxRewardWorker, MathRewardWorker, code_score, resolve_reward_worker
from roll.runtime import Cluster, ConfigError, DataProto, WorkerConfig
from roll.runtime.testing import ship_module_by_value

ship_module_by_value(__name__)


class RewardRoleConfig(WorkerConfig):
    reward_type: str = "math"
    reward_kwargs: dict[str, Any] = {}


class RankTaggingMathWorker(MathRewardWorker):
    """Math worker that also scores "code" rows in the sandbox, and tags every reason with its rank."""

    def score_row(self, row: dict[str, Any]) -> tuple[float, str]:
        if row["tag"] == "code":
            score, info = code_score(row["response_text"], row["test_cases"], {"timeout_s": 5})
        else:
            score, info = super().score_row(row)
        return score, f"{info} @rank{self.rank}"


def test_registry_names_and_resolution():
    assert {"math", "code", "python"} <= set(REWARDS.names())
    assert REWARDS.get("code") is CodeSandboxRewardWorker
    assert resolve_reward_worker("math") is MathRewardWorker
    assert resolve_reward_worker("roll.pipelines.rewards.math:MathRewardWorker") is MathRewardWorker
    with pytest.raises(ConfigError, match="unknown reward_type"):
        resolve_reward_worker("astrology")
    with pytest.raises(ConfigError, match="not a RewardWorker"):
        resolve_reward_worker("roll.pipelines.rewards.math:math_score")


def test_cluster_of_two_scores_six_rows_in_order(resources):
    config = RewardRoleConfig(name="reward", world_size=2, reward_kwargs={"require_boxed": True, "num_workers": 2})
    cluster = Cluster("reward", RankTaggingMathWorker, resources, config)
    try:
        cluster.initialize(None)
        code_ok = "```python\nprint(int(input()) * 2)\n```"
        rows = [
            (r"\boxed{4}", "4", "math", None),
            (r"\boxed{\frac{1}{2}}", "0.5", "math", None),
            ("four", "4", "math", None),
            (r"\boxed{12}", "19", "math", None),
            (code_ok, None, "code", json.dumps([{"input": "21", "output": "42"}])),
            ("```python\nimport os\nos.system('id')\n```", None, "code", json.dumps([{"input": "1", "output": "2"}])),
        ]
        batch = DataProto.from_dict(
            {"response_mask": torch.ones(6, 3, dtype=torch.long)},
            {
                "prompt": [f"q{i}" for i in range(6)],
                "response_text": [r[0] for r in rows],
                "ground_truth": [r[1] for r in rows],
                "tag": [r[2] for r in rows],
                "test_cases": [r[3] for r in rows],
            },
        )
        out = cluster.compute_rewards(batch)
        assert len(out) == 6
        assert out["scores"].dtype == torch.float32
        assert out["scores"].tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
        assert out["reward_info"].tolist() == [
            "correct @rank0",
            "correct @rank0",
            "no \\boxed answer @rank0",
            "wrong answer: got 12, expected 19 @rank1",
            "correct @rank1",
            "test 1 failed: blocked: process (os.system) (0/1 passed) @rank1",
        ]
    finally:
        cluster.shutdown()
