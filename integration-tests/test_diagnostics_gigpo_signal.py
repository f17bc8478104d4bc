"""tools/diagnostics/gigpo_signal: under the step-wise recipe's own advantage settings, a noisy planner's optimal moves
get a positive mean advantage and its other moves a negative one (no model: the rows come from roll's env managers)."""

from __future__ import annotations

import pytest

from tools.diagnostics.gigpo_signal import advantage_by_move


def test_the_step_wise_recipe_rewards_optimal_moves_over_others():
    found = advantage_by_move("agentic-frozenlake-gigpo-tiny", noise=0.5, steps=3)
    (optimal_rows, optimal), (other_rows, other) = found["optimal"], found["other"]
    assert optimal_rows >= 50 and other_rows >= 20, found
    assert optimal > 0 > other, found


def test_a_trajectory_wise_recipe_is_refused():
    with pytest.raises(SystemExit, match="step-wise"):
        advantage_by_move("agentic-frozenlake-tiny", noise=0.5, steps=1)
