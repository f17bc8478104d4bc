"""The five distributions as PyPI would get them: build each sdist and wheel (hatchling, through `python -m build`,
the wheel built from the sdist), check what they carry, install the wheels into a clean venv and use them there.

Slow (a few minutes: two venvs, torch and the packages' dependencies installed from pip's cache or PyPI).
"""

from __future__ import annotations

import email
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["protocol", "runtime", "strategies", "pipelines", "agentic"]
TORCH = "torch==2.13.0"  # the CPU build, as in tools/dev (installed first, so nothing pulls a CUDA build)
BUILD_TOOLS = ["build>=1.2", "hatchling>=1.27"]
URL = "https://github.com/roll-project/roll"
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _run(*args: str | Path, cwd: Path | None = None, timeout: float = 900) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    return done.stdout


def _venv(path: Path) -> Path:
    """A fresh venv on this interpreter's base Python (no site-packages of the dev venv); returns its python."""
    _run(sys.executable, "-m", "venv", path)
    python = path / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--upgrade", "pip")
    return python


def _version(package: str) -> str:
    text = (REPO / "packages" / f"roll-{package}" / "src" / "roll" / package / "__init__.py").read_text()
    (version,) = re.findall(r'^__version__ = "([^"]+)"$', text, re.M)
    return version


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """A folder with the sdist and wheel of every package."""
    root = tmp_path_factory.mktemp("packaging")
    python = _venv(root / "build-venv")
    _run(python, "-m", "pip", "install", "-q", *BUILD_TOOLS)
    out = root / "dist"
    for package in PACKAGES:
        _run(python, "-m", "build", "--no-isolation", "--outdir", out, REPO / "packages" / f"roll-{package}")
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """The python of a clean venv with the five wheels (and pytest, for the sdists' tests) installed."""
    python = _venv(tmp_path_factory.mktemp("clean") / "venv")
    _run(python, "-m", "pip", "install", "-q", TORCH)
    wheels = sorted(dist.glob("*.whl"))
    _run(python, "-m", "pip", "install", "-q", TORCH, *wheels, "pytest>=8", "hypothesis>=6.100", timeout=1800)
    return python


@pytest.mark.parametrize("package", PACKAGES)
def test_wheel_carries_license_readme_and_metadata(dist, package):
    name, version = f"roll-{package}", _version(package)
    (wheel,) = dist.glob(f"roll_{package}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        info = f"roll_{package}-{version}.dist-info"
        names = set(archive.namelist())
        assert archive.read(f"{info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
    assert f"roll/{package}/__init__.py" in names and f"roll/{package}/py.typed" in names
    assert "roll/__init__.py" not in names  # `roll` is a namespace shared by the five distributions
    assert (metadata["Name"], metadata["Version"]) == (name, version)
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Requires-Python"] == ">=3.11"
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers and "Typing :: Typed" in classifiers
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert urls["Homepage"] == URL and urls["Source"] == f"{URL}/tree/main/packages/{name}"
    readme = metadata.get_payload()
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert readme.strip() == (REPO / "packages" / name / "README.md").read_text().strip()


@pytest.mark.parametrize("package", PACKAGES)
def test_readme_stands_alone_on_pypi(package):
    readme = (REPO / "packages" / f"roll-{package}" / "README.md").read_text()
    relative = [target for target in _LINK.findall(readme) if not target.startswith(("https://", "#"))]
    assert not relative, f"links that break on PyPI: {relative}"
    assert "## Install" in readme and f"pip install roll-{package}" in readme
    assert "```python" in readme or "```bash" in readme, "no example"


@pytest.mark.parametrize("package", PACKAGES)
def test_sdist_carries_license_readme_and_its_tests(dist, package):
    version = _version(package)
    (sdist,) = dist.glob(f"roll_{package}-{version}.tar.gz")
    top = f"roll_{package}-{version}"
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
        assert archive.extractfile(f"{top}/LICENSE").read() == (REPO / "LICENSE").read_bytes()
    for required in ("README.md", "pyproject.toml", f"src/roll/{package}/__init__.py", "tests/conftest.py"):
        assert f"{top}/{required}" in names, f"{sdist.name} lacks {required}"


def test_pyproject_versions_come_from_the_package(dist):
    for package in PACKAGES:
        pyproject = tomllib.loads((REPO / "packages" / f"roll-{package}" / "pyproject.toml").read_text())
        assert "version" not in pyproject["project"] and pyproject["project"]["dynamic"] == ["version"]
        assert pyproject["tool"]["hatch"]["version"]["path"] == f"src/roll/{package}/__init__.py"


def test_clean_venv_imports_every_package_at_its_version(installed):
    code = "import importlib, importlib.metadata as m\n" + "".join(
        f"print('roll-{p}', importlib.import_module('roll.{p}').__version__, m.version('roll-{p}'))\n" for p in PACKAGES
    )
    lines = _run(installed, "-c", code).splitlines()
    assert lines == [f"roll-{p} {_version(p)} {_version(p)}" for p in PACKAGES]
    _run(installed, "-m", "pip", "check")
    recipes = _run(installed.parent / "roll", "recipes")
    assert "sft-tiny" in recipes and "rlvr-tiny" in recipes


def _unpacked(dist: Path, package: str, where: Path) -> Path:
    with tarfile.open(next(dist.glob(f"roll_{package}-*.tar.gz"))) as archive:
        archive.extractall(where, filter="data")
    return next(where.glob(f"roll_{package}-*"))


def test_sdist_tests_run_without_the_repository(dist, installed, tmp_path):
    """An unpacked sdist's tests need only the installed wheels: its conftest registers roll's markers (so
    --strict-markers passes) and skips gpu tests without CUDA."""
    protocol = _unpacked(dist, "protocol", tmp_path)
    out = _run(installed, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers", "tests", cwd=protocol)
    assert re.search(r"\d+ passed", out) and "failed" not in out
    strategies = _unpacked(dist, "strategies", tmp_path)
    out = _run(
        installed,
        "-m",
        "pytest",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        "--strict-markers",
        "-m",
        "gpu",
        "tests",
        cwd=strategies,
    )
    assert re.search(r"\d+ skipped", out) and "needs a CUDA device" in out, out
