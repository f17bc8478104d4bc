"""Every roll error, from every installed roll package, survives pickling with its message and fields.

Ray pickles a worker's error to raise it again on the driver; an error that does not round-trip reaches the user as
Ray's "Failed to deserialize exception" instead of its own message and hint.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from typing import Any

import pytest

import roll
from roll.protocol.errors import RollError

# Backend subpackages import their heavy library first on purpose (a missing one raises MissingExtraError);
# importing them here would only slow the walk down: none defines an error type.
_SKIP_PREFIXES = ("roll.strategies.vllm", "roll.strategies.sglang", "roll.strategies.megatron")


def _import_every_roll_module() -> list[str]:
    failed = []
    for info in pkgutil.walk_packages(roll.__path__, prefix="roll."):
        if info.name.startswith(_SKIP_PREFIXES) or info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as e:  # an optional dependency of that module is absent here
            failed.append(f"{info.name}: {e}")
    return failed


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("roll."):
            out.append(sub)
        out.extend(_all_subclasses(sub))
    return sorted(set(out), key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _sample(name: str, annotation: Any) -> Any:
    """A representative value for one ``__init__`` parameter, chosen from its annotation (a string under
    ``from __future__ import annotations``)."""
    text = str(annotation).replace("typing.", "")
    if "BaseException" in text or "Exception" in text:
        return ValueError(f"inner error for {name}")
    if text.startswith(("list[int]", "Sequence[int]")):
        return [1, 2]
    if text.startswith("list"):
        return [f"{name}-a", f"{name}-b"]
    if text.startswith("int"):
        return 3
    if text.startswith("float"):
        return 2.5
    if text.startswith("bool"):
        return True
    return f"<{name}>"


def _construct(cls: type[RollError]) -> RollError:
    signature = inspect.signature(cls.__init__)
    params = list(signature.parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params) and not any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
    ):
        return cls(f"{cls.__name__} message")
    args, kwargs = [], {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        value = _sample(p.name, p.annotation)
        if p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    return cls(*args, **kwargs)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, BaseException):
        return type(a) is type(b) and str(a) == str(b)
    return a == b


IMPORT_FAILURES = _import_every_roll_module()
ERROR_TYPES = [RollError, *_all_subclasses(RollError)]


def test_the_walk_finds_the_error_types_of_every_layer():
    names = {f"{c.__module__}.{c.__name__}" for c in ERROR_TYPES}
    expected = {
        "roll.protocol.errors.ProtocolError",
        "roll.protocol.errors.MissingExtraError",
        "roll.runtime.errors.ConfigError",
        "roll.runtime.errors.WorkerError",
        "roll.runtime.errors.WorkerLostError",
        "roll.runtime.errors.RpcTimeoutError",
        "roll.strategies.contract.StrategyError",
        "roll.pipelines.data.errors.DataError",
        "roll.agentic.env.base.EnvOutputError",
        "roll.agentic.scheduler.executors.AllWorkersLostError",
    }
    assert expected <= names, (sorted(expected - names), IMPORT_FAILURES)


@pytest.mark.parametrize("cls", ERROR_TYPES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
@pytest.mark.parametrize("protocol", [pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL])
def test_error_round_trips_pickle_with_message_and_fields(cls, protocol):
    error = _construct(cls)
    copy = pickle.loads(pickle.dumps(error, protocol=protocol))
    assert type(copy) is cls
    assert str(copy) == str(error) and str(error)
    assert copy.args == error.args
    fields = vars(error)
    assert vars(copy).keys() == fields.keys()
    for name, value in fields.items():
        assert _same(getattr(copy, name), value), name
    assert copy.exit_code == error.exit_code


def test_a_worker_error_keeps_the_roll_error_it_wraps():
    from roll.runtime import MissingExtraError, WorkerError

    inner = MissingExtraError("strategy 'sglang'", "roll-strategies", "sglang", cause="no module named 'sglang'")
    error = WorkerError("actor_infer", 0, "initialize", "Traceback ...", cause=inner)
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy.cause, MissingExtraError)
    assert copy.cause.pip_command == "pip install 'roll-strategies[sglang]'"
    assert copy.summary == (
        "actor_infer rank 0 failed in initialize(): strategy 'sglang' needs an optional dependency that is not "
        "installed (no module named 'sglang'). Install it with: pip install 'roll-strategies[sglang]'"
    )
