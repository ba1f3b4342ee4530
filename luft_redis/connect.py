"""Connection helpers shared by both front ends: client checks, URLs, Sentinel, durability.

``from_url`` of either backend makes its client here: ``redis://``, ``rediss://`` (TLS) and
``unix://`` make a ``Redis`` (``cluster=True``: a ``RedisCluster``), and
``redis+sentinel://[:password@]host:port[,host:port...]/<service>[/<db>]`` (``rediss+sentinel``
for TLS) asks those Sentinels for the primary of ``<service>`` and follows failovers.
"""

from __future__ import annotations

import dataclasses
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
    "sentinel_client",
]


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


def _check_decoding(client: Any) -> None:
    kwargs = _connection_kwargs(client)
    if kwargs and kwargs.get("decode_responses"):
        raise ConfigurationError(
            "the Redis client must use decode_responses=False: luft-redis stores binary blobs"
        )


def check_sync_client(client: Any) -> None:
    """Refuse an asyncio client (and one that decodes responses) for the sync backend."""
    if _is_async(client):
        raise ClientTypeError(
            f"{type(client).__name__} is an asyncio client: use "
            "luft_redis.AsyncRedisCheckpointBackend with it, or pass a redis.Redis / "
            "redis.cluster.RedisCluster to RedisCheckpointBackend"
        )
    _check_decoding(client)


def check_async_client(client: Any) -> None:
    """Refuse a sync client (and one that decodes responses) for the asyncio backend."""
    if not _is_async(client):
        raise ClientTypeError(
            f"{type(client).__name__} is not an asyncio client: use "
            "luft_redis.RedisCheckpointBackend with it, or pass a redis.asyncio.Redis / "
            "redis.asyncio.cluster.RedisCluster to AsyncRedisCheckpointBackend"
        )
    _check_decoding(client)


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
    if asyncio:
        return redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0)
    return redis.retry.Retry(redis.backoff.NoBackoff(), 0)


def sentinel_client(url: str, *, asyncio: bool = False, **client_kwargs: Any) -> Any:
    """A client for the primary named in ``redis+sentinel://[:pw@]h:p[,h:p...]/<service>[/<db>]``.

    The client asks the Sentinels for the current primary on every (re)connection, so it follows
    a failover; ``rediss+sentinel://`` uses TLS to the Redis servers.
    """
    hosts, service, _ = _sentinel_parts(url, client_kwargs)
    timeout = client_kwargs.get("socket_timeout")
    sentinel_kwargs = {"retry": no_retry(asyncio=asyncio), "socket_timeout": timeout}
    if asyncio:
        async_sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            hosts, socket_timeout=timeout, sentinel_kwargs=sentinel_kwargs
        )
        return async_sentinel.master_for(service, **client_kwargs)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        hosts, socket_timeout=timeout, sentinel_kwargs=sentinel_kwargs
    )
    return sentinel.master_for(service, **client_kwargs)  # type: ignore[no-untyped-call]


def make_client(url: str, *, cluster: bool = False, asyncio: bool = False,
                **client_kwargs: Any) -> Any:  # fmt: skip
    """The client ``from_url`` makes for ``url`` (always ``decode_responses=False``).

    Unless ``retry=`` is given, the client does not retry by itself (:func:`no_retry`): the
    backend's ``RetryPolicy`` is the one retry layer, with one deadline.
    """
    client_kwargs["decode_responses"] = False
    client_kwargs.setdefault("retry", no_retry(asyncio=asyncio))
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        return sentinel_client(url, asyncio=asyncio, **client_kwargs)
    if asyncio:
        if cluster:
            return redis.asyncio.cluster.RedisCluster.from_url(url, **client_kwargs)
        return redis.asyncio.Redis.from_url(url, **client_kwargs)
    if cluster:
        return redis.cluster.RedisCluster.from_url(url, **client_kwargs)
    return redis.Redis.from_url(url, **client_kwargs)
