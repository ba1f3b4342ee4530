"""Connection helpers shared by both front ends: client checks, URLs, Sentinel, durability.

``from_url`` of either backend makes its client here: ``redis://``, ``rediss://`` (TLS) and
``unix://`` make a ``Redis`` (``cluster=True``: a ``RedisCluster``), and
``redis+sentinel://[:password@]host:port[,host:port...]/<service>[/<db>]`` (``rediss+sentinel``
for TLS) asks those Sentinels for the primary of ``<service>`` and follows failovers.

A client that cannot work is refused here, with a :class:`~luft_redis.errors.ConfigurationError`
that names what to change: one that decodes responses, and a fakeredis without Lua (its
``fakeredis[lua]`` extra, lupa, is missing), at construction for a fakeredis client and at
the first script for any other server that does not know the scripting commands
(:func:`scripting_missing`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import urllib.parse
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.backoff
import redis.cluster
import redis.retry
import redis.sentinel

from .errors import ClientTypeError, ConfigurationError

__all__ = [
    "Durability",
    "check_async_client",
    "check_sync_client",
    "is_cluster",
    "make_client",
    "scripting_missing",
    "sentinel_client",
]

#: What to install when fakeredis has no Lua (the extra that brings in lupa).
LUA_EXTRA = "fakeredis[lua]"

# A server without scripting answers the commands luft-redis runs its scripts with (EVALSHA,
# EVAL, SCRIPT LOAD; FCALL, FUNCTION LOAD for Redis functions) as unknown commands.
_NO_SCRIPTING = re.compile(
    r"unknown command [`']?(evalsha|eval|evalsha_ro|eval_ro|script|fcall|fcall_ro|function)\b",
    re.IGNORECASE,
)


@dataclasses.dataclass(frozen=True, slots=True)
class Durability:
    """Wait for ``replicas`` replicas to acknowledge each write, at most ``timeout_ms`` ms."""

    replicas: int = 1
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.timeout_ms < 0:
            raise ConfigurationError("durability needs replicas >= 1 and timeout_ms >= 0")


def is_cluster(client: Any) -> bool:
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def _is_async(client: Any) -> bool:
    if isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)):
        return True
    return type(client).__module__.startswith("redis.asyncio") or "Async" in type(client).__name__


def _connection_kwargs(client: Any) -> dict[str, Any] | None:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None and hasattr(client, "get_connection_kwargs"):
        kwargs = client.get_connection_kwargs()
    return kwargs if isinstance(kwargs, dict) else None


def _check_usable(client: Any) -> None:
    """Refuse a client that decodes responses, or a fakeredis that cannot run Lua."""
    kwargs = _connection_kwargs(client)
    if kwargs:
        _check_decoding_kwargs(kwargs)
    _check_scripting(client)


def _check_decoding_kwargs(kwargs: dict[str, Any]) -> None:
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            "the Redis client must use decode_responses=False (the default): luft-redis "
            "stores binary blobs, which a decoding client would try to read as text"
        )


def _no_lua_error(what: str) -> ConfigurationError:
    return ConfigurationError(
        f"{what}, and luft-redis runs every change as one Lua function (Redis Functions, Redis "
        f"7.0 or later): with fakeredis, install its Lua support, pip install '{LUA_EXTRA}' "
        "(or luft-redis's own extra, 'luft-redis[fakeredis]')"
    )


def _fakeredis_has_lua() -> bool:
    """Whether the installed fakeredis runs Lua (it does when it could import lupa)."""
    try:
        from fakeredis.commands_mixins import ScriptingCommandsMixin
    except ImportError:  # another layout of fakeredis: judge by lupa, which its Lua needs
        return importlib.util.find_spec("lupa") is not None
    return hasattr(ScriptingCommandsMixin, "evalsha")


def _check_scripting(client: Any) -> None:
    """Refuse a fakeredis client whose fakeredis cannot run Lua (no I/O: a class check)."""
    if type(client).__module__.partition(".")[0] == "fakeredis" and not _fakeredis_has_lua():
        raise _no_lua_error("this fakeredis cannot run Lua scripts (lupa is not installed)")


def scripting_missing(error: BaseException | str) -> ConfigurationError | None:
    """The :class:`ConfigurationError` to raise when ``error`` (a reply or its text) says the
    server does not know the scripting commands (fakeredis without Lua); else ``None``."""
    found = _NO_SCRIPTING.search(str(error))
    if found is None:
        return None
    return _no_lua_error(
        f"the Redis server does not run Lua scripts (unknown command {found.group(1).lower()!r})"
    )


def check_sync_client(client: Any) -> None:
    """Refuse an asyncio client (and one that decodes responses, or a fakeredis without Lua)
    for the sync backend."""
    if _is_async(client):
        raise ClientTypeError(
            f"{type(client).__name__} is an asyncio client: use "
            "luft_redis.AsyncRedisCheckpointBackend with it, or pass a redis.Redis / "
            "redis.cluster.RedisCluster to RedisCheckpointBackend"
        )
    _check_usable(client)


def check_async_client(client: Any) -> None:
    """Refuse a sync client (and one that decodes responses, or a fakeredis without Lua)
    for the asyncio backend."""
    if not _is_async(client):
        raise ClientTypeError(
            f"{type(client).__name__} is not an asyncio client: use "
            "luft_redis.RedisCheckpointBackend with it, or pass a redis.asyncio.Redis / "
            "redis.asyncio.cluster.RedisCluster to AsyncRedisCheckpointBackend"
        )
    _check_usable(client)


def _sentinel_parts(url: str, client_kwargs: dict[str, Any]) -> tuple[list[tuple[str, int]],
                                                                      str, int]:  # fmt: skip
    parsed = urllib.parse.urlsplit(url)
    netloc = parsed.netloc.rpartition("@")[2]
    password = urllib.parse.unquote(parsed.netloc.rpartition("@")[0].partition(":")[2]) or None
    hosts: list[tuple[str, int]] = []
    for part in netloc.split(","):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(f"sentinel address {part!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    path = [p for p in parsed.path.split("/") if p]
    if not path:
        raise ConfigurationError("a sentinel URL needs the service name: .../<service>[/<db>]")
    service, db = path[0], int(path[1]) if len(path) > 1 else 0
    if password is not None:
        client_kwargs.setdefault("password", password)
    if parsed.scheme.startswith("rediss"):
        client_kwargs.setdefault("ssl", True)
    client_kwargs["db"] = db
    return hosts, service, db


def no_retry(*, asyncio: bool = False) -> Any:
    """A redis-py ``Retry`` that never retries: luft-redis' own :class:`RetryPolicy` is the one
    retry layer of the clients ``from_url`` makes (redis-py 6+ retries 3-10 times by itself,
    which multiplied the policy's deadline)."""
    retry = redis.asyncio.retry.Retry if asyncio else redis.retry.Retry
    return retry(redis.backoff.NoBackoff(), 0)


def sentinel_client(url: str, *, asyncio: bool = False, **client_kwargs: Any) -> Any:
    """A client for the primary named in ``redis+sentinel://[:pw@]h:p[,h:p...]/<service>[/<db>]``.

    The client asks the Sentinels for the current primary on every (re)connection, so it follows
    a failover; ``rediss+sentinel://`` uses TLS to the Redis servers.
    """
    hosts, service, _ = _sentinel_parts(url, client_kwargs)
    timeout = client_kwargs.get("socket_timeout")
    sentinel_kwargs = {"retry": no_retry(asyncio=asyncio), "socket_timeout": timeout}
    module: Any = redis.asyncio.sentinel if asyncio else redis.sentinel
    sentinel = module.Sentinel(hosts, socket_timeout=timeout, sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(service, **client_kwargs)


def make_client(url: str, *, cluster: bool = False, asyncio: bool = False,
                **client_kwargs: Any) -> Any:  # fmt: skip
    """The client ``from_url`` makes for ``url`` (always ``decode_responses=False``: asking for
    ``True`` is a :class:`ConfigurationError`).

    Unless ``retry=`` is given, the client does not retry by itself (:func:`no_retry`): the
    backend's ``RetryPolicy`` is the one retry layer, with one deadline.
    """
    _check_decoding_kwargs(client_kwargs)
    client_kwargs["decode_responses"] = False
    client_kwargs.setdefault("retry", no_retry(asyncio=asyncio))
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        return sentinel_client(url, asyncio=asyncio, **client_kwargs)
    client_type: Any = (
        (redis.asyncio.cluster.RedisCluster if cluster else redis.asyncio.Redis) if asyncio
        else (redis.cluster.RedisCluster if cluster else redis.Redis)
    )  # fmt: skip
    return client_type.from_url(url, **client_kwargs)


def make_async_client(url: str, *, cluster: bool = False, **client_kwargs: Any) -> Any:
    """:func:`make_client` for the asyncio front end (an asyncio client)."""
    return make_client(url, cluster=cluster, asyncio=True, **client_kwargs)


def make_sync_client(url: str, *, cluster: bool = False, **client_kwargs: Any) -> Any:
    """:func:`make_client` for the sync front end (a sync client)."""
    return make_client(url, cluster=cluster, **client_kwargs)
