"""The ``@register`` decorator that declares how a Worker method is called through its Cluster."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from roll.protocol._dispatch import Dispatch, DispatchMode, Execute, resolve_dispatch_mode
from roll.protocol.errors import ProtocolError

F = TypeVar("F", bound=Callable[..., Any])

_ATTR = "__roll_registration__"


@dataclass(frozen=True)
class Registration:
    """What ``@register`` recorded on a method; the runtime's Cluster reads it to build the method's proxy."""

    dispatch_mode: DispatchMode
    execute_mode: Execute
    clear_cache: bool
    prefetch: bool
    is_async: bool


@overload
def register(dispatch_mode: F, /) -> F: ...
@overload
def register(
    dispatch_mode: DispatchMode | str = ...,
    execute_mode: Execute = ...,
    clear_cache: bool = ...,
    prefetch: bool = ...,
) -> Callable[[F], F]: ...
def register(
    dispatch_mode: DispatchMode | str | Callable[..., Any] = Dispatch.ONE_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    clear_cache: bool = True,
    prefetch: bool = False,
) -> Any:
    """Mark a Worker method (sync or ``async def``) as callable through its Cluster.

    ``dispatch_mode`` says how arguments are spread over ranks and results collected (default ``ONE_TO_ALL``);
    ``execute_mode`` whether all ranks or rank 0 alone run it; ``clear_cache`` frees the accelerator's cached
    memory after the call (a no-op on CPU); ``prefetch`` resolves object-store references among the arguments
    before the method runs. Usable bare (``@register``) or with arguments.
    """
    if callable(dispatch_mode) and not isinstance(dispatch_mode, DispatchMode):
        return register()(dispatch_mode)
    mode = resolve_dispatch_mode(dispatch_mode)
    if not isinstance(execute_mode, Execute):
        raise ProtocolError(f"execute_mode must be an Execute member, got {execute_mode!r}")

    def decorate(fn: F) -> F:
        registration = Registration(
            dispatch_mode=mode,
            execute_mode=execute_mode,
            clear_cache=clear_cache,
            prefetch=prefetch,
            is_async=inspect.iscoroutinefunction(fn),
        )
        setattr(fn, _ATTR, registration)
        return fn

    return decorate


def get_registration(fn: Any) -> Registration | None:
    """The registration of a method marked with ``@register``, or None."""
    return getattr(fn, _ATTR, None)
