"""How a cluster exposes its worker class's registered methods: descriptors on a per-worker-class subclass.

``Cluster(name, EchoWorker, ...)`` is an instance of ``Cluster[EchoWorker]``, a subclass of Cluster made once per
worker class, with one :class:`RemoteMethod` descriptor per ``@register``-ed method. Reading one on a cluster gives a
:class:`MethodProxy` made for that read, so a cluster holds no object that points back at it (a dropped cluster is
freed at once, without waiting for the garbage collector).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, cast, overload

from roll.protocol import Registration
from roll.runtime._worker import Worker, registered_methods
from roll.runtime.errors import ConfigError

if TYPE_CHECKING:
    from roll.runtime._calls import PendingCall
    from roll.runtime._cluster import Cluster

__all__ = ["MethodProxy", "RemoteMethod", "class_for", "proxy_signature"]

P = ParamSpec("P")


class MethodProxy(Generic[P]):
    """One registered worker method called on a whole cluster.

    ``proxy(*args, **kwargs)`` blocks for the collected result; the reserved keywords ``blocking=False`` (return a
    :class:`PendingCall`) and ``timeout=`` (seconds, default the role's ``rpc_timeout_s``) are taken by the proxy.
    :meth:`submit` is the non-blocking call with arguments a type checker can check.
    """

    def __init__(
        self,
        cluster: Cluster[Any],
        name: str,
        registration: Registration,
        timeout: float | None = None,
        *,
        doc: str | None = None,
        signature: inspect.Signature | None = None,
    ) -> None:
        self._cluster = cluster
        self._name = name
        self._timeout = timeout
        self.registration = registration
        # What help() and inspect.signature() show: the worker method's own.
        self.__name__ = name
        self.__doc__ = doc
        self.__signature__ = signature

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        blocking = cast(bool, kwargs.pop("blocking", True))
        timeout = cast("float | None", kwargs.pop("timeout", self._timeout))
        return self._cluster._call(self._name, self.registration, args, kwargs, blocking=blocking, timeout=timeout)

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> PendingCall:
        """Start the call on every rank and return at once; wait with ``.materialize()``."""
        pending: PendingCall = self._cluster._call(
            self._name, self.registration, args, kwargs, blocking=False, timeout=self._timeout
        )
        return pending

    def with_timeout(self, timeout: float) -> MethodProxy[P]:
        """The same method with its own timeout in seconds instead of the role's ``rpc_timeout_s``."""
        return MethodProxy(
            self._cluster, self._name, self.registration, timeout, doc=self.__doc__, signature=self.__signature__
        )

    def __repr__(self) -> str:
        return f"<{self._cluster.name}.{self._name} {self.registration.dispatch_mode!r}>"


class RemoteMethod:
    """A registered worker method as an attribute of a cluster class: reading it on a cluster gives a
    :class:`MethodProxy` made for that cluster (made anew on each access, so the cluster holds no proxy that
    points back at it)."""

    def __init__(self, name: str, registration: Registration, method: Callable[..., Any]) -> None:
        self.name = name
        self.registration = registration
        self.__doc__ = method.__doc__
        self.__signature__ = proxy_signature(method)

    @overload
    def __get__(self, cluster: None, owner: type) -> RemoteMethod: ...
    @overload
    def __get__(self, cluster: Cluster[Any], owner: type) -> MethodProxy[...]: ...
    def __get__(self, cluster: Cluster[Any] | None, owner: type) -> RemoteMethod | MethodProxy[...]:
        if cluster is None:
            return self
        return MethodProxy(cluster, self.name, self.registration, doc=self.__doc__, signature=self.__signature__)

    def __repr__(self) -> str:
        return f"<remote method {self.name} {self.registration.dispatch_mode!r}>"


def proxy_signature(method: Callable[..., Any]) -> inspect.Signature:
    """The worker method's signature without ``self``, plus the reserved keywords."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return inspect.Signature()
    # Ray's tracing adds a ``_ray_trace_ctx`` keyword to actor classes' methods; callers never pass it.
    params = [
        p for p in list(signature.parameters.values())[1:] if p.kind is not p.VAR_KEYWORD and p.name != "_ray_trace_ctx"
    ]
    var_kw = [p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
    reserved = [
        inspect.Parameter("blocking", inspect.Parameter.KEYWORD_ONLY, default=True, annotation="bool"),
        inspect.Parameter("timeout", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="float | None"),
    ]
    taken = {p.name for p in params}
    return signature.replace(parameters=params + [p for p in reserved if p.name not in taken] + var_kw)


_CLASSES: weakref.WeakKeyDictionary[type, dict[type, type]] = weakref.WeakKeyDictionary()
_CLASSES_LOCK = threading.Lock()


def class_for(base: type[Cluster[Any]], worker_cls: type[Worker]) -> type[Cluster[Any]]:
    """The subclass of ``base`` that carries ``worker_cls``'s registered methods as descriptors (made once)."""
    with _CLASSES_LOCK:
        made = _CLASSES.setdefault(worker_cls, {})
        cls = made.get(base)
        if cls is None:
            clashes = sorted(name for name in registered_methods(worker_cls) if hasattr(base, name))
            if clashes:
                raise ConfigError(
                    f"{worker_cls.__qualname__} registers {clashes}, which are attributes of {base.__qualname__} itself; rename them"
                )
            namespace: dict[str, Any] = {
                name: RemoteMethod(name, registration, getattr(worker_cls, name))
                for name, registration in registered_methods(worker_cls).items()
            }
            namespace["__module__"] = base.__module__
            namespace["_roll_base"] = base
            namespace["__doc__"] = f"A cluster of {worker_cls.__qualname__} workers.\n\n{inspect.getdoc(base)}"
            cls = type(f"{base.__name__}[{worker_cls.__name__}]", (base,), namespace)
            cls.__qualname__ = f"{base.__qualname__}[{worker_cls.__qualname__}]"
            made[base] = cls
        return cls
