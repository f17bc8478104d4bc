from __future__ import annotations

import pytest

from roll.runtime import ConfigError, WorkerConfig, parse_device_mapping


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("list(range(0, 8))", list(range(8))),
        ("list(range(4, 8, 2))", [4, 6]),
        ("[0, 1, 2]", [0, 1, 2]),
        ("0,1,2,3", [0, 1, 2, 3]),
        ("list(range(0, 2)) + [5]", [0, 1, 5]),
        ([3, 4], [3, 4]),
        (None, None),
    ],
)
def test_device_mapping_forms(text, expected):
    assert parse_device_mapping(text) == expected


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "list(range(0, n))", "[0, 1.5]", "range(", "{0}"])
def test_device_mapping_is_parsed_never_evaluated(text):
    with pytest.raises(ValueError, match="device_mapping"):
        parse_device_mapping(text)


def test_world_size_is_derived_from_devices():
    config = WorkerConfig(name="actor_infer", device_mapping="list(range(0, 8))", num_gpus_per_worker=2)
    assert config.world_size == 4
    assert config.devices_of(1) == [2, 3]
    assert WorkerConfig(name="reward", world_size=3).world_size == 3
    assert WorkerConfig(name="reward").world_size == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device_mapping": "list(range(0, 7))", "num_gpus_per_worker": 2}, "not a multiple of num_gpus_per_worker=2"),
        ({"device_mapping": [0, 1], "world_size": 3}, "world_size=3 contradicts device_mapping"),
        ({"device_mapping": [0, 0, 1]}, r"lists devices \[0\] more than once"),
        ({"device_mapping": []}, "device_mapping is empty"),
        ({"device_mapping": [-1]}, "negative ids"),
        ({"num_gpus_per_worker": 0}, "num_gpus_per_worker"),
        ({"worker_cls": "NotAPath"}, "dotted path"),
        ({"devices": [0]}, "devices: unknown field"),
    ],
)
def test_bad_configs_name_the_field_and_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        WorkerConfig(name="actor_train", **kwargs)


def test_all_errors_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        WorkerConfig(name="x", num_gpus_per_worker=0, rpc_timeout_s=-1, bogus=1)
    text = str(info.value)
    assert text.startswith("3 configuration errors")
    assert "num_gpus_per_worker" in text and "rpc_timeout_s" in text and "bogus" in text


def test_check_settings_reports_the_same_inside_another_models_validation() -> None:
    from pydantic import model_validator

    from roll.runtime import RollModel
    from roll.runtime.config import check_settings

    class Inner(RollModel):
        size: int = 1

    class Outer(RollModel):
        settings: dict = {}

        @model_validator(mode="after")
        def _check(self) -> Outer:
            check_settings(Inner, self.settings, "inner", root="settings")
            return self

    with pytest.raises(ConfigError, match=r"^inner: settings.sizee: unknown field"):
        check_settings(Inner, {"sizee": 2}, "inner", root="settings")
    with pytest.raises(ConfigError, match=r"inner: settings.sizee: unknown field"):
        Outer(settings={"sizee": 2})
    assert check_settings(Inner, {"size": 3}, "inner").size == 3
