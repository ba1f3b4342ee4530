"""pytest fixtures for testing your own code against luft-redis.

This module is a pytest plugin, registered under the ``pytest11`` entry point, so pytest loads
it by itself wherever luft-redis is installed: nothing to import or list in ``conftest.py``.

On fakeredis (install ``fakeredis[lua]``, or luft-redis's extra ``luft-redis[fakeredis]``),
each test gets its own empty in-memory server:

``luft_backend``
    a :class:`~luft_redis.RedisCheckpointBackend` (closed after the test).
``luft_async_backend``
    an :class:`~luft_redis.AsyncRedisCheckpointBackend` on a ``fakeredis.FakeAsyncRedis``. The
    fixture is a plain one, so it works with any way of running coroutines (``asyncio.run``
    in the test, pytest-asyncio, anyio); use it inside that one event loop, and end with
    ``await luft_async_backend.aclose()`` or ``async with`` (the loop's end stops the rest).
``luft_make_backend``
    a factory, ``make(**options)``, of further sync backends on the same fakeredis server as
    ``luft_backend``, each on its own client: what another worker process would hold.
``luft_fakeredis``
    the ``fakeredis.FakeRedis`` client ``luft_backend`` uses, to look at the keys.
``luft_fake_server``
    the test's ``fakeredis.FakeServer``, for clients of your own.

On a real Redis (``redis-server`` on PATH; nothing touches a Redis you already run):

``luft_redis_server``
    a private ``redis-server`` on a free 127.0.0.1 port, for the whole session
    (:class:`luft_redis.tools.server.LocalRedisServer`; its ``url``, ``port``, ``dir``).
``luft_redis_url``
    that server's URL, emptied (``FLUSHALL``) before the test.
``luft_server_backend``
    a :class:`~luft_redis.RedisCheckpointBackend` on that emptied server (closed after).

A fixture whose requirement is missing skips its test and says what to install.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from .._sync.backend import RedisCheckpointBackend
from ..asyncio import AsyncRedisCheckpointBackend
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .server import LocalRedisServer

__all__ = [
    "luft_async_backend",
    "luft_backend",
    "luft_fake_server",
    "luft_fakeredis",
    "luft_make_backend",
    "luft_redis_server",
    "luft_redis_url",
    "luft_server_backend",
]

_B = TypeVar("_B", RedisCheckpointBackend, AsyncRedisCheckpointBackend)

FAKEREDIS_HINT = "pip install 'fakeredis[lua]' (or 'luft-redis[fakeredis]')"
"""What to install for the fakeredis fixtures."""


def _fakeredis() -> Any:
    """The fakeredis module, or a skip saying what to install."""
    try:
        import fakeredis
    except ImportError:
        pytest.skip(f"this test needs fakeredis with Lua: {FAKEREDIS_HINT}")
    return fakeredis


def _backend_or_skip(backend_type: type[_B], client: Any, **options: Any) -> _B:
    """``backend_type(client, **options)``, or a skip when the client's fakeredis has no Lua."""
    try:
        return backend_type(client, **options)
    except ConfigurationError as exc:
        if "fakeredis[lua]" not in str(exc):
            raise
        pytest.skip(f"this test needs fakeredis with Lua: {FAKEREDIS_HINT}")


@pytest.fixture
def luft_fake_server() -> Any:
    """A new, empty ``fakeredis.FakeServer`` (the fakeredis fixtures of one test share it)."""
    return _fakeredis().FakeServer()


@pytest.fixture
def luft_fakeredis(luft_fake_server: Any) -> Iterator[Any]:
    """A ``fakeredis.FakeRedis`` client (``decode_responses=False``) on this test's server."""
    client = _fakeredis().FakeRedis(server=luft_fake_server)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def luft_backend(luft_fakeredis: Any) -> Iterator[RedisCheckpointBackend]:
    """A :class:`~luft_redis.RedisCheckpointBackend` on fakeredis (closed after the test)."""
    backend = _backend_or_skip(RedisCheckpointBackend, luft_fakeredis)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def luft_make_backend(
    luft_fake_server: Any,
) -> Iterator[Callable[..., RedisCheckpointBackend]]:
    """A factory of sync backends on this test's fakeredis server, each on its own client
    (what another process would hold); keyword arguments go to the backend. Closed after."""
    made: list[tuple[RedisCheckpointBackend, Any]] = []

    def make(**options: Any) -> RedisCheckpointBackend:
        client = _fakeredis().FakeRedis(server=luft_fake_server)
        made.append((_backend_or_skip(RedisCheckpointBackend, client, **options), client))
        return made[-1][0]

    try:
        yield make
    finally:
        for backend, client in made:
            backend.close()
            client.close()


@pytest.fixture
def luft_async_backend(luft_fake_server: Any) -> AsyncRedisCheckpointBackend:
    """An :class:`~luft_redis.AsyncRedisCheckpointBackend` on a ``fakeredis.FakeAsyncRedis``.

    Use it inside one event loop (``asyncio.run(...)`` in the test, or an async test under
    pytest-asyncio or anyio) and release it there with ``await backend.aclose()`` or
    ``async with backend:``; tasks it left running end with that loop.
    """
    client = _fakeredis().FakeAsyncRedis(server=luft_fake_server)
    return _backend_or_skip(AsyncRedisCheckpointBackend, client)


@pytest.fixture(scope="session")
def luft_redis_server() -> Iterator[LocalRedisServer]:
    """A private ``redis-server`` on a free 127.0.0.1 port, for the whole session (started on
    first use, stopped at the end, its temporary directory removed)."""
    from .server import LocalRedisServer, find_redis_server

    binary = find_redis_server()
    if binary is None:
        pytest.skip(
            "this test needs redis-server on PATH (Debian/Ubuntu: apt-get install redis-server)"
        )
    server = LocalRedisServer(binary=binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def luft_redis_url(luft_redis_server: LocalRedisServer) -> str:
    """The URL of ``luft_redis_server``, emptied (``FLUSHALL``) before this test."""
    import redis

    with redis.Redis.from_url(luft_redis_server.url) as client:
        client.flushall()
    return luft_redis_server.url


@pytest.fixture
def luft_server_backend(luft_redis_url: str) -> Iterator[RedisCheckpointBackend]:
    """A :class:`~luft_redis.RedisCheckpointBackend` on the emptied private redis-server, with
    its own client (both closed after the test)."""
    backend = RedisCheckpointBackend.from_url(luft_redis_url)
    try:
        yield backend
    finally:
        backend.close()
