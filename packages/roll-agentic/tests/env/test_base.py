"""The env contract's output checks (roll.agentic.env.base)."""

from __future__ import annotations

import numpy as np
import pytest

from roll.agentic.env.base import EnvOutputError, check_step_output


def test_numpy_flags_and_reward_are_accepted() -> None:
    # gymnasium-style envs compute their flags with numpy (np.True_ is no int, and numpy 2 names its type "bool")
    output = check_step_output(("obs", np.float32(0.5), np.True_, np.False_, {}))
    assert output == ("obs", 0.5, True, False, {})
    assert all(type(value) is bool for value in output[2:4])


@pytest.mark.parametrize("flag", [None, "yes", 1.0, np.float64(1.0)])
def test_flag_that_is_not_a_bool_is_malformed(flag) -> None:
    with pytest.raises(EnvOutputError, match="terminated must be a bool"):
        check_step_output(("obs", 0.0, flag, False, {}))


def test_numpy_integer_flags_are_accepted() -> None:
    # e.g. terminated = np.sum(done): an int of numpy's, as a Python int 1 already is
    assert check_step_output(("obs", 0.0, np.int64(1), np.uint8(0), {}))[2:4] == (True, False)
