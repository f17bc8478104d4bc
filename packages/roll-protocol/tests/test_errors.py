"""import_extra: an optional module imported, or MissingExtraError naming the feature and the pip command."""

from __future__ import annotations

import json

import pytest

from roll.protocol import MissingExtraError, import_extra


def test_an_installed_module_is_returned() -> None:
    assert import_extra("json", "reading JSON", "roll-protocol", "json") is json


def test_a_missing_module_names_the_feature_and_the_pip_command() -> None:
    with pytest.raises(MissingExtraError) as caught:
        import_extra("roll_no_such_sdk.client", "the no-such env", "roll-agentic", "nosuch")
    error = caught.value
    assert (error.feature, error.package, error.extra) == ("the no-such env", "roll-agentic", "nosuch")
    assert error.pip_command == "pip install 'roll-agentic[nosuch]'"
    assert "No module named 'roll_no_such_sdk'" in str(error) and isinstance(error, ImportError)


def test_an_installed_module_that_fails_raises_as_it_is(tmp_path, monkeypatch) -> None:
    (tmp_path / "roll_broken_sdk.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match="broken at import"):
        import_extra("roll_broken_sdk", "the broken env", "roll-agentic", "broken")
