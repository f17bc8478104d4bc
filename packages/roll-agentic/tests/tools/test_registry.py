"""Tools by id: a tool module that fails while importing is one ModuleImportError naming the setting, file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.pool import check_env_spec
from roll.agentic.tools import check_tool, register_tool
from roll.runtime import ConfigError, ModuleImportError

TOOL = "from roll.agentic.tools import Tool\n\nclass MyTool(Tool):\n    pass\n"


def _module(folder: Path, name: str, source: str) -> str:
    (folder / f"{name}.py").write_text(source)
    return str(folder / f"{name}.py")


def test_a_tool_wrapper_tool_whose_module_has_a_syntax_error_names_its_tool_id_file_and_line(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _module(tmp_path, "roll_test_broken_tool", "class MyTool:\n    def call(self)\n        pass\n")
    spec = CustomEnvConfig.model_validate(
        {
            "env_type": "arithmetic",
            "tool_wrapper": {"tool_configs": [{"tool_id": "python_code"}, {"tool_id": "roll_test_broken_tool:MyTool"}]},
        }
    )
    with pytest.raises(ModuleImportError) as caught:
        check_env_spec("Calc", spec)
    assert str(caught.value) == (
        "custom_envs.Calc.tool_wrapper.tool_configs[1].tool_id='roll_test_broken_tool:MyTool': its module "
        f"roll_test_broken_tool does not import ({path}, line 2: SyntaxError: expected ':'); fix the module"
    )
    assert isinstance(caught.value.__cause__, SyntaxError)


def test_an_import_error_inside_a_tool_module_of_an_env_s_own_tool_configs(tmp_path, monkeypatch) -> None:
    """tool_math takes ROLL's env_config.tool_configs: the setting named is that one; the import inside the module
    is not read as a wrong path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _module(tmp_path, "roll_test_tool_deps", "import os\nimport roll_test_tool_not_installed\n" + TOOL)
    spec = CustomEnvConfig.model_validate(
        {"env_type": "tool_math", "env_config": {"tool_configs": [{"tool_id": "roll_test_tool_deps:MyTool"}]}}
    )
    with pytest.raises(ModuleImportError) as caught:
        check_env_spec("Math", spec)
    assert str(caught.value) == (
        "custom_envs.Math.env_config.tool_configs[0].tool_id='roll_test_tool_deps:MyTool': its module "
        f"roll_test_tool_deps does not import ({path}, line 2: ModuleNotFoundError: No module named "
        "'roll_test_tool_not_installed'); install what it imports, or fix the module"
    )
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_a_registered_tool_whose_module_raises_names_the_setting_and_its_registration(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _module(tmp_path, "roll_test_raising_tool", "raise RuntimeError('needs TOOL_HOME')\n" + TOOL)
    register_tool("roll_test_raising", "roll_test_raising_tool:MyTool")
    with pytest.raises(ModuleImportError) as caught:
        check_tool("roll_test_raising", {}, setting="custom_envs.Calc.tool_wrapper.tool_configs[0].tool_id")
    assert str(caught.value) == (
        "custom_envs.Calc.tool_wrapper.tool_configs[0].tool_id='roll_test_raising' (tool registered as "
        f"'roll_test_raising_tool:MyTool'): its module roll_test_raising_tool does not import ({path}, line 1: "
        "RuntimeError: needs TOOL_HOME); fix the module"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_a_tool_path_that_names_no_module_or_no_tool_keeps_its_own_error(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    _module(tmp_path, "roll_test_good_tool", TOOL + "\nNOT_A_TOOL = 1\n")
    with pytest.raises(ConfigError, match=r"^tool_id='roll_test_no_such_tool_mod:T' cannot be imported .*check"):
        check_tool("roll_test_no_such_tool_mod:T", {})
    with pytest.raises(ConfigError, match=r"cannot be imported \(AttributeError"):
        check_tool("roll_test_good_tool:Missing", {})
    with pytest.raises(ConfigError, match="is not a roll.agentic.tools.Tool subclass"):
        check_tool("roll_test_good_tool:NOT_A_TOOL", {})
    assert check_tool("roll_test_good_tool:MyTool", {}).__name__ == "MyTool"
