"""A trained warm-up, kept and reused (``warmup.cache: true``).

The behaviour-cloning warm-up of a recipe is the same in every run that shares its inputs, and on a CPU it is most
of a short run's time. With the cache on, the first run saves actor_train's training state right after the warm-up
(weights, optimizer moments, learning-rate schedule: the strategy's checkpoint) with the warm-up's metrics; later
runs whose key matches load it instead of warming up, so their RL starts from exactly that state.

The key hashes everything that shapes the warm-up: the ``warmup`` section (without ``cache`` and ``reference``), the
training env manager as the warm-up regroups it (without RL's group filter and redundant episodes) and its envs,
``rollout.sequence_length``, the turns' ``max_new_tokens`` (the train env manager's ``generating_args`` or
actor_infer's), actor_train's model, training (``max_steps`` only under a schedule
that follows it, ``learning_rate`` only without ``warmup.learning_rate``; its ``seed`` seeds the workers), strategy
and batching args and world size, a fingerprint of the model folder's files (name, size,
modification time), the versions of torch, transformers, GEM and roll's packages, and the code no version pins: the
contents of the modules that define the training envs and the warm-up policy (a user's env edited between runs), and
of every ``.py`` file of a roll package installed in development mode (``pip install -e``; an edit of the room
generator, say, trains the warm-up again). Not the run's ``seed``: the warm-up's episodes, sampling and mini-batches
follow ``warmup.seed``, so runs that differ only in their seed share one warm-up. What it cannot see is an edit of a
module that those modules import, outside roll's development installs: delete the folder (or set ``warmup.cache:
false``) after changing such code. Entries are written to a temporary folder and renamed into place, so a crash
leaves no half-written entry (the next save on that host removes the folder it left); on a multi-node cluster the
cache directory must be on a shared filesystem (as for ``recipe://`` models).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import socket
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from roll.agentic.env.registry import resolve_env_factory
from roll.agentic.pipeline.config import AgenticConfig
from roll.pipelines.cache import cache_dir, write_stamp
from roll.runtime.registry import import_target

__all__ = ["FORMAT", "WarmupCache", "warmup_key"]

FORMAT = 1  # bump when what an entry holds, or how the warm-up trains, changes
_ROLL_PACKAGES = ("roll-agentic", "roll-pipelines", "roll-strategies", "roll-protocol", "roll-runtime")
_PACKAGES = ("torch", "transformers", "gem-llm", *_ROLL_PACKAGES)  # gem-llm: the code behind "gem:" envs
_STAMP = "warmup.json"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def _files(model: str | None) -> list[tuple[str, int, int]] | str | None:
    """(relative name, size, mtime in ns) of a local model folder's files; the reference itself otherwise."""
    if model is None:
        return None
    root = Path(model).expanduser()
    if not root.is_dir():
        return model
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            info = path.stat()
            out.append((str(path.relative_to(root)), info.st_size, info.st_mtime_ns))
    return out


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _digest(paths: list[Path], root: Path) -> str:
    """A digest of the files' names (relative to ``root``) and contents."""
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _install_origin(package: str) -> dict[str, Any]:
    """The installer's record of where ``package`` came from (PEP 610 ``direct_url.json``); {} when it has none."""
    try:
        return dict(json.loads(metadata.distribution(package).read_text("direct_url.json") or "{}"))
    except metadata.PackageNotFoundError:
        return {}


def _development_source(package: str) -> str | None:
    """A digest of the ``.py`` files of ``package`` when it is installed in development mode (its folder's ``src``
    when it has one, else the folder without ``tests``); None for a regular install, whose version pins its code."""
    found = _install_origin(package)
    if not found.get("dir_info", {}).get("editable") or not str(found.get("url", "")).startswith("file:"):
        return None
    root = Path(unquote(urlparse(found["url"]).path))
    root = root / "src" if (root / "src").is_dir() else root
    return _digest(sorted(p for p in root.rglob("*.py") if "tests" not in p.relative_to(root).parts), root)


def _module_source(target: Any) -> str | None:
    """A digest of the file that defines ``target`` (a class, function or partial); None where it has none."""
    while isinstance(target, partial):
        target = target.func
    try:
        path = inspect.getsourcefile(target)
    except TypeError:
        return None
    return None if path is None else _digest([Path(path)], Path(path).parent)


def _code(config: AgenticConfig) -> dict[str, Any]:
    """What of the warm-up's code no package version pins (see the module docstring)."""
    envs = {config.custom_envs[tag].env_type for tag in config.train_env_manager.tags}
    return {
        "envs": {name: _module_source(resolve_env_factory(name)) for name in sorted(envs)},
        "policy": _module_source(import_target(config.warmup.policy, "warmup.policy")),
        "development": {package: _development_source(package) for package in _ROLL_PACKAGES},
    }


def _rl_only(config: AgenticConfig) -> set[str]:
    """actor_train's training args the warm-up does not depend on: the run's length unless the schedule follows
    it (``max_steps`` counts RL steps too), and RL's learning rate where the warm-up has its own (a run that loads
    the entry sets its RL rate after loading)."""
    left_out = set()
    if not config.actor_train.training_args.schedule_uses_max_steps:
        left_out.add("max_steps")
    if config.warmup.learning_rate is not None:
        left_out.add("learning_rate")
    return left_out


def warmup_key(config: AgenticConfig) -> str:
    """The cache key of ``config``'s warm-up (see the module docstring for what it covers)."""
    manager = config.train_env_manager
    role = config.actor_train
    payload: dict[str, Any] = {
        "format": FORMAT,
        "warmup": config.warmup.model_dump(mode="json", exclude={"cache", "reference"}),
        "env_manager": config.warmup_env_manager().model_dump(mode="json"),
        "envs": {tag: config.custom_envs[tag].model_dump(mode="json") for tag in sorted(set(manager.tags))},
        "sequence_length": config.rollout.sequence_length,
        # the warm-up's turns are cut to it (its other sampling settings do not reach the scripted policy)
        "max_new_tokens": manager.turn_generation(config.actor_infer.generating_args).max_new_tokens,
        "actor_train": {
            "world_size": role.world_size,
            "model_args": role.model_args.model_dump(mode="json"),
            "training_args": role.training_args.model_dump(mode="json", exclude=_rl_only(config)),
            "strategy_args": None if role.strategy_args is None else role.strategy_args.model_dump(mode="json"),
            "batching": role.batching.model_dump(mode="json"),
        },
        "model_files": _files(role.model_args.model_name_or_path),
        "versions": {package: _version(package) for package in _PACKAGES},
        "code": _code(config),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class WarmupCache:
    """One config's entry: ``<root>/<key>/`` holding ``actor_train/`` (the checkpoint) and ``warmup.json``."""

    def __init__(self, config: AgenticConfig, root: Path | None = None) -> None:
        self.key = warmup_key(config)
        self.root = (root or cache_dir() / "agentic-warmup").expanduser()
        self.folder = self.root / self.key

    @property
    def checkpoint(self) -> Path:
        return self.folder / "actor_train"

    def metrics(self) -> dict[str, Any] | None:
        """The saved warm-up's metrics, or None when there is no complete entry."""
        stamp = self.folder / _STAMP
        if not stamp.is_file():
            return None
        return dict(json.loads(stamp.read_text())["metrics"])

    def staging(self) -> Path:
        """An empty folder beside the entry to write a new one into (its checkpoint goes to ``<it>/actor_train``).
        Folders left by runs of this host that died while saving are removed first."""
        self.root.mkdir(parents=True, exist_ok=True)
        host = socket.gethostname()
        for left in self.root.glob(f".*.tmp-{host}-*"):
            pid = left.name.rsplit("-", 1)[1]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(left, ignore_errors=True)
        tmp = self.root / f".{self.key}.tmp-{host}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return tmp

    def commit(self, staged: Path, metrics: dict[str, Any]) -> Path:
        """Stamp ``staged`` with ``metrics`` and move it into place (a concurrent run's entry wins if it got
        there first: both hold the same warm-up)."""
        write_stamp(staged / _STAMP, {"key": self.key, "metrics": metrics})
        try:
            os.rename(staged, self.folder)
        except OSError:
            if self.metrics() is None:
                raise
            shutil.rmtree(staged, ignore_errors=True)
        return self.folder
