"""ROLL keys whose value decides what roll does: track_with's tracker names."""

from __future__ import annotations

import pytest

from roll.pipelines.compat import translate

SFT = {
    "sft_train": {
        "data_args": {"file_name": ["data/sft.jsonl"]},
        "strategy_args": {"strategy_name": "fsdp2_train"},
        "device_mapping": "list(range(0,1))",
    }
}


@pytest.mark.parametrize(
    ("value", "status", "out"),
    [("tensorboard", "kept", "tensorboard"), ("wandb", "kept", "wandb"), ("stdout", "renamed", "console")],
)
def test_rolls_tracker_names_map(value: str, status: str, out: str) -> None:
    translation = translate({**SFT, "track_with": value})
    assert translation.data["track_with"] == out
    assert [(row.status, row.target) for row in translation.rows if row.key == "track_with"] == [(status, "track_with")]
    assert translation.problems == []


def test_a_tracker_outside_rolls_open_source_registry_fails_as_in_roll() -> None:
    translation = translate({**SFT, "track_with": "ml_tracker", "tracker_kwargs": {"exp": "x"}})
    assert "track_with" not in translation.data
    [problem] = translation.problems
    assert problem.key == "track_with" and problem.status == "unsupported"
    assert "'ml_tracker' is not in ROLL's open-source tracker registry either" in problem.note
    assert "create_tracker raises 'Unknown tracker name'" in problem.note
