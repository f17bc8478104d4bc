"""Repository invariants every package relies on."""

from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ["protocol", "runtime", "strategies", "pipelines", "agentic"]


def test_every_package_has_the_standard_layout_and_no_roll_init():
    for name in LAYERS:
        package = REPO / "packages" / f"roll-{name}"
        for required in (
            "pyproject.toml",
            "BUILD",
            "README.md",
            f"src/roll/{name}/__init__.py",
            f"src/roll/{name}/py.typed",
            "tests",
        ):
            assert (package / required).exists(), f"{package.name} is missing {required}"
        # PEP 420: `roll` is shared by all five distributions, so none may own roll/__init__.py.
        assert not (package / "src" / "roll" / "__init__.py").exists(), f"{package.name} ships src/roll/__init__.py"


def test_layers_only_import_leftwards():
    for i, name in enumerate(LAYERS):
        banned = LAYERS[i + 1 :]
        for path in (REPO / "packages" / f"roll-{name}" / "src").rglob("*.py"):
            text = path.read_text()
            for other in banned:
                assert not re.search(rf"^\s*(from|import)\s+roll\.{other}\b", text, re.M), (
                    f"{path} imports roll.{other}"
                )


def test_sibling_dependencies_use_compatible_ranges_and_extras_are_forwarded():
    meta = {
        name: tomllib.loads((REPO / "packages" / f"roll-{name}" / "pyproject.toml").read_text())["project"]
        for name in LAYERS
    }
    for lower, upper in itertools.pairwise(LAYERS):
        version = package_version(lower)
        major, minor = version.split(".")[:2]
        wanted = f"roll-{lower}>={major}.{minor},<{major}.{int(minor) + 1}"
        assert wanted in meta[upper]["dependencies"], f"roll-{upper} should depend on {wanted}"
    backend_extras = {"vllm", "vllm-cpu", "sglang", "megatron", "fsdp2"}
    assert backend_extras <= set(meta["strategies"]["optional-dependencies"])
    forwarded = meta["pipelines"]["optional-dependencies"]
    for extra in backend_extras:
        assert any(dep.startswith(f"roll-strategies[{extra}]") for dep in forwarded[extra]), extra


def test_license_is_apache_2_and_each_package_ships_the_same_copy():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text[:200]
    for name in LAYERS:
        package = REPO / "packages" / f"roll-{name}"
        project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
        assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
        assert (package / "LICENSE").read_text() == text, f"{package.name}/LICENSE differs from the repository's"


def package_version(name: str) -> str:
    """The version of roll-<name>: written once, as ``__version__`` in its __init__.py (hatch reads it from there)."""
    init = (REPO / "packages" / f"roll-{name}" / "src" / "roll" / name / "__init__.py").read_text()
    (version,) = re.findall(r'^__version__ = "([^"]+)"$', init, re.M)
    return version


def test_pants_distribution_labels_carry_the_package_version():
    for name in LAYERS:
        build = (REPO / "packages" / f"roll-{name}" / "BUILD").read_text()
        labels = re.findall(r'python_artifact\(name="([^"]+)", version="([^"]+)"\)', build)
        assert labels == [(f"roll-{name}", package_version(name))], f"packages/roll-{name}/BUILD: {labels}"


def test_python_version_is_declared_the_same_everywhere():
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert root["tool"]["ruff"]["target-version"] == "py311"
    assert root["tool"]["mypy"]["python_version"] == "3.11"
    for name in LAYERS:
        project = tomllib.loads((REPO / "packages" / f"roll-{name}" / "pyproject.toml").read_text())["project"]
        assert project["requires-python"] == ">=3.11", name
        assert "Programming Language :: Python :: 3.11" in project["classifiers"], name
    assert 'interpreter_constraints = ["CPython==3.11.*"]' in (REPO / "pants.toml").read_text()
