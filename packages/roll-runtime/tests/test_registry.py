from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from roll.runtime import ConfigError, MissingExtraError, ModuleImportError, Registry, import_target
from roll.runtime import registry as registry_module


def test_lazy_targets_resolve_on_first_lookup():
    reg: Registry = Registry("codec")
    reg.register("json", "json:dumps")
    reg.register("direct", len)
    assert reg.names() == ["direct", "json"]
    assert reg.get("json")({"a": 1}) == '{"a": 1}'
    assert reg.get("direct") is len
    assert "json" in reg and "yaml" not in reg


def test_decorator_registration_and_duplicates():
    reg: Registry = Registry("env")

    @reg.register("echo")
    class Echo:
        pass

    assert reg.get("echo") is Echo
    with pytest.raises(ConfigError, match="env 'echo' is already registered"):
        reg.register("echo", "json:dumps")


def test_unknown_names_list_the_known_ones():
    reg: Registry = Registry("strategy")
    reg.register("hf_infer", "json:dumps")
    reg.register("fsdp2_train", "json:loads")
    with pytest.raises(ConfigError, match="unknown strategy 'vlm'; known names: fsdp2_train, hf_infer"):
        reg.get("vlm")


def test_missing_optional_dependency_prints_the_pip_command():
    reg: Registry = Registry("strategy")
    reg.register("vllm", "not_installed_backend_lib.engine:Engine", package="roll-strategies", extra="vllm")
    with pytest.raises(MissingExtraError) as info:
        reg.get("vllm")
    assert info.value.pip_command == "pip install 'roll-strategies[vllm]'"
    assert "pip install 'roll-strategies[vllm]'" in str(info.value)
    assert "not_installed_backend_lib" in str(info.value)


def test_entry_points_extend_the_registry(monkeypatch):
    fake = [EntryPoint(name="plugin", value="json:loads", group="roll.test_plugins")]
    monkeypatch.setattr(registry_module, "entry_points", lambda group: fake if group == "roll.test_plugins" else [])
    reg: Registry = Registry("plugin", entry_point_group="roll.test_plugins")
    reg.register("builtin", "json:dumps")
    assert reg.names() == ["builtin", "plugin"]
    assert reg.get("plugin")("[1]") == [1]


def test_import_target_forms():
    assert import_target("json:dumps") is import_target("json.dumps")
    assert import_target("os.path:join") is import_target("os.path.join")
    with pytest.raises(ConfigError, match="not an import path"):
        import_target("json")


def test_import_target_names_the_setting_it_came_from():
    with pytest.raises(ConfigError, match=r"group_filter_cls='json:nope' cannot be imported \(AttributeError"):
        import_target("json:nope", "group_filter_cls")
    with pytest.raises(ConfigError, match=r"policy='no_such_pkg_x:P' cannot be imported \(ModuleNotFoundError"):
        import_target("no_such_pkg_x:P", "policy")
    with pytest.raises(AttributeError):  # without a setting, the import's own error
        import_target("json:nope")


def test_a_module_that_fails_while_importing_names_the_setting_file_and_line(tmp_path, monkeypatch):
    """A SyntaxError (or anything the module's top level raises) is one ModuleImportError naming the setting, the file
    and line, with the module's error as its cause; a registered target's names the registration too."""
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = tmp_path / "roll_test_rt_broken.py"
    broken.write_text("x = 1\ndef f(:\n    pass\n")
    with pytest.raises(ModuleImportError) as caught:
        import_target("roll_test_rt_broken:f", "reward_type")
    assert str(caught.value) == (
        f"reward_type='roll_test_rt_broken:f': its module roll_test_rt_broken does not import ({broken}, line 2: "
        "SyntaxError: invalid syntax); fix the module"
    )
    assert isinstance(caught.value.__cause__, SyntaxError) and isinstance(caught.value, ConfigError)
    raising = tmp_path / "roll_test_rt_raising.py"
    raising.write_text("import os\nraise KeyError('API_KEY')\n")
    reg: Registry = Registry("reward")
    reg.register("judge", "roll_test_rt_raising:Judge")
    with pytest.raises(
        ModuleImportError, match=r"^reward 'judge' \(reward registered as 'roll_test_rt_raising:Judge'\)"
    ):
        reg.get("judge")
    with pytest.raises(ModuleImportError) as caught:
        reg.get("judge", "rewards.math.reward_type")
    assert str(caught.value) == (
        "rewards.math.reward_type='judge' (reward registered as 'roll_test_rt_raising:Judge'): its module "
        f"roll_test_rt_raising does not import ({raising}, line 2: KeyError: 'API_KEY'); fix the module"
    )
    with pytest.raises(SyntaxError):  # without a setting, import_target lets the import's own error through
        import_target("roll_test_rt_broken:f")


def test_a_roll_error_raised_while_importing_passes_through_unwrapped(tmp_path, monkeypatch):
    """A module whose import raises one of roll's own errors (a MissingExtraError with its pip command) keeps it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "roll_test_rt_needs_extra.py").write_text(
        "from roll.runtime import MissingExtraError\nraise MissingExtraError('judge', 'roll-pipelines', 'judge')\n"
    )
    with pytest.raises(MissingExtraError) as caught:
        import_target("roll_test_rt_needs_extra:Judge", "rewards.math.reward_type")
    assert not isinstance(caught.value, ModuleImportError)
    assert "pip install" in str(caught.value)
