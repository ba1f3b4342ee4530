"""OpenTelemetry spans for backend operations (the ``otel`` extra: ``opentelemetry-api``).

With ``opentelemetry-api`` installed, each backend operation that talks to Redis is one span of
kind CLIENT named after the operation (``append_event``, ``open_run``, ...), with the attributes
of OpenTelemetry's semantic conventions for database clients:

- ``db.system.name`` = ``redis``;
- ``db.operation.name``: the operation;
- ``db.namespace``: the Redis database index, where the client has one;
- ``server.address`` / ``server.port``: where the client connects (the first startup node of
  a cluster client);
- ``error.type``: the luft-redis exception class, when the operation failed (the span's status
  is then ERROR and the exception is recorded);

and the luft-specific ``luft.run_id`` and ``luft.prefix``.

Until a tracer provider is set (an OpenTelemetry SDK, in code or through
``OTEL_PYTHON_TRACER_PROVIDER``), the API's spans record nothing, and entering one costs about a
sixth of a write's client-side work: operations then make no span at all. A backend made before
the provider is set starts its spans as soon as it is. Without the package, no span is made.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from ._version import __version__

__all__ = ["OperationTracer", "otel_available", "traced"]

_F = TypeVar("_F", bound=Callable[..., Any])

logger = logging.getLogger(__name__)

_NULL = contextlib.nullcontext()


def _load_trace_api() -> Any:
    try:
        return importlib.import_module("opentelemetry.trace")
    except ImportError:
        return None


_trace_api: Any = _load_trace_api()


def otel_available() -> bool:
    """True when ``opentelemetry-api`` is importable (spans are then made)."""
    return _trace_api is not None


def client_attributes(client: Any) -> dict[str, str | int]:
    """``db.namespace``, ``server.address`` and ``server.port`` of a redis-py client, as far as
    the client tells them without I/O."""
    attrs: dict[str, str | int] = {}
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):  # a unix socket's path is its address
        host, port = kwargs.get("path") or kwargs.get("host"), kwargs.get("port")
        if kwargs.get("db") is not None:
            attrs["db.namespace"] = str(kwargs["db"])
    else:  # a cluster client: its first startup node
        nodes = getattr(client, "startup_nodes", None)
        if isinstance(nodes, dict):
            nodes = list(nodes.values())
        first = nodes[0] if nodes else None
        host, port = getattr(first, "host", None), getattr(first, "port", None)
    if host is not None:
        attrs["server.address"] = str(host)
    if port is not None:
        attrs["server.port"] = int(port)
    return attrs


class OperationTracer:
    """Makes the span of one backend operation; a shared no-op without OpenTelemetry."""

    __slots__ = ("_base", "_live", "_tracer")

    def __init__(self, client: Any, prefix: str) -> None:
        self._tracer: Any = None
        self._live = False
        self._base: dict[str, str | int] = {}
        if _trace_api is None:
            return
        self._tracer = _trace_api.get_tracer("luft_redis", __version__)
        self._base = {"db.system.name": "redis", "luft.prefix": prefix,
                      **client_attributes(client)}  # fmt: skip

    @property
    def enabled(self) -> bool:
        """opentelemetry-api is installed (spans are made once a tracer provider is set)."""
        return self._tracer is not None

    def active(self) -> bool:
        """Whether an operation makes a span now: the API is installed and a tracer provider
        is set. Until one is, the API only ever hands out spans that record nothing."""
        if self._live:
            return True
        if self._tracer is None or isinstance(
                _trace_api.get_tracer_provider(), _trace_api.ProxyTracerProvider):  # fmt: skip
            return False
        self._live = True  # the global provider is set once (the API refuses to replace it)
        return True

    def span(self, operation: str, run_id: object = None) -> contextlib.AbstractContextManager[Any]:
        """The span of ``operation`` (a context manager; a shared no-op when disabled)."""
        if self._tracer is None:
            return _NULL
        return self._span(operation, run_id)

    @contextlib.contextmanager
    def _span(self, operation: str, run_id: object) -> Iterator[Any]:
        attributes = dict(self._base)
        attributes["db.operation.name"] = operation
        if run_id is not None:
            attributes["luft.run_id"] = str(run_id)
        with self._tracer.start_as_current_span(
            operation,
            kind=_trace_api.SpanKind.CLIENT,
            attributes=attributes,
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                if span.is_recording():
                    span.set_attribute("error.type", type(exc).__qualname__)
                raise


def _run_of(backend: Any, args: tuple[Any, ...], run_arg: bool) -> object:
    if run_arg and args and args[0] is not None:
        return args[0]
    return backend.run_id


def traced(operation: str, *, run_arg: bool = False) -> Callable[[_F], _F]:
    """Decorate a backend method (plain or ``async``) so that each call is the span
    ``operation`` of the backend's :class:`OperationTracer` (``self._tracer``). ``run_arg``:
    the method's first argument names the run (else the bound run does). Without a tracer
    provider the cost is one check (:meth:`OperationTracer.active`)."""

    def decorate(method: _F) -> _F:
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def traced_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                tracer: OperationTracer = self._tracer
                if not tracer.active():
                    return await method(self, *args, **kwargs)
                with tracer.span(operation, _run_of(self, args, run_arg)):
                    return await method(self, *args, **kwargs)

            return cast(_F, traced_async)

        @functools.wraps(method)
        def traced_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
            tracer: OperationTracer = self._tracer
            if not tracer.active():
                return method(self, *args, **kwargs)
            with tracer.span(operation, _run_of(self, args, run_arg)):
                return method(self, *args, **kwargs)

        return cast(_F, traced_sync)

    return decorate
