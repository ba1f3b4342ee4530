"""Shared fixtures: fakeredis, a private real Redis and a private Redis Cluster.

Targets
-------
``TARGETS = ("fakeredis", "redis", "cluster")`` are the three backends every
storage test can run against:

* ``fakeredis`` - ``fakeredis.FakeRedis`` on a new ``FakeServer`` per test (Lua via lupa);
* ``redis``     - a real ``redis-server`` started once per session on a free
  127.0.0.1 port (fixture ``redis_server``), FLUSHALL before each test;
  marked ``server``;
* ``cluster``   - a local 3-master Redis Cluster started once per session
  (fixture ``redis_cluster``), FLUSHALL on every master before each test;
  marked ``cluster``.

Failover tests use ``redis_cluster_replicas`` instead: 3 primaries with one replica each,
started once per session on first use. It is not a target, and it is not reset between
tests: a test may fail over, so look the roles up (``primary_for_slot``, ``replicas_of``)
instead of assuming them. Every test that uses it is marked ``cluster``.

Servers start lazily: a run that only uses ``fakeredis`` never starts one.

Using the targets in a test file (nothing to import from here; declare the
client type locally as ``Client = redis.Redis | RedisCluster``)::

    def test_roundtrip(redis_client: Client) -> None:   # runs 3 times:
        ...                                              # [fakeredis] [redis] [cluster]

    @pytest.fixture
    def store(redis_client: Client) -> Iterator[Store]:  # any fixture built on
        yield Store(redis_client)                        # redis_client is
                                                         # parametrized too

    @pytest.mark.parametrize("redis_target", ["redis", "cluster"])
    def test_real_only(redis_client: Client) -> None:    # a subset of targets
        ...

``redis_client`` always has ``decode_responses=False`` and is closed after the
test. ``redis_target`` is the id of the current target. ``redis_url`` is the URL
of the (flushed) real server, for code that wants to build its own client.

Deselect targets with markers: ``pytest -m "not cluster"``, ``-m "not server and
not cluster"``. The markers are added from the target id, so they also apply
when a test parametrizes ``redis_target`` itself.

When ``redis-server`` (or ``redis-cli`` for the cluster) is missing, tests that
need it are skipped, except under CI (env ``CI`` set and not ``0``/``false``),
where they fail.

Imports: pytest runs with ``--import-mode=importlib`` (see pyproject.toml), so
neither the repo root nor ``tests/`` is put on ``sys.path`` and ``luft_redis`` is
the installed package; the report header prints which one was imported.
Test modules therefore cannot import each other or this conftest: share
helpers through fixtures.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeAlias

import fakeredis
import pytest
import redis
from redis.cluster import RedisCluster

import luft_redis
from luft_redis import RedisCheckpointBackend
from luft_redis.tools.server import (
    LocalRedisCluster,
    LocalRedisServer,
    find_redis_cli,
    find_redis_server,
)

#: Every client type ``redis_client`` can yield (``FakeRedis`` is a ``Redis``).
Client: TypeAlias = "redis.Redis | RedisCluster"

#: The target ids, in order.
TARGETS: Final = ("fakeredis", "redis", "cluster")

_TARGET_MARKS: Final = {"redis": "server", "cluster": "cluster"}

#: Fixtures that need a marker on every test that uses them.
_FIXTURE_MARKS: Final = {"redis_cluster_replicas": "cluster"}

TARGET_PARAMS: Final = [
    pytest.param("fakeredis", id="fakeredis"),
    pytest.param("redis", id="redis", marks=pytest.mark.server),
    pytest.param("cluster", id="cluster", marks=pytest.mark.cluster),
]


def in_ci() -> bool:
    """True when env ``CI`` is set to anything but empty, ``0`` or ``false``."""
    value = os.environ.get("CI", "").strip().lower()
    return value not in ("", "0", "false", "no")


def _missing(what: str) -> None:
    message = (
        f"{what} not found (looked on PATH and in /usr/bin); "
        "install it, e.g. `apt-get install redis-server`"
    )
    if in_ci():
        pytest.fail(f"{message}. CI is set, so this is an error, not a skip.", pytrace=False)
    pytest.skip(message)


# ---------------------------------------------------------------- hooks


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Show which luft_redis is under test and which redis-server would be used."""
    return [
        f"luft_redis: {Path(luft_redis.__file__).resolve().parent}",
        f"redis-server: {find_redis_server() or 'not found'}; CI={in_ci()}",
    ]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Add the ``server``/``cluster`` marker to every item whose target or fixture needs it."""
    for item in items:
        markers: list[str] = []
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            target = callspec.params.get("redis_target")
            if isinstance(target, str) and target in _TARGET_MARKS:
                markers.append(_TARGET_MARKS[target])
        fixturenames: list[str] = getattr(item, "fixturenames", [])
        markers.extend(_FIXTURE_MARKS[name] for name in fixturenames if name in _FIXTURE_MARKS)
        for marker in markers:
            if item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))


# ---------------------------------------------------------------- servers


@pytest.fixture(scope="session")
def redis_server_binary() -> str:
    """Path of ``redis-server`` (skip, or fail under CI, when missing)."""
    binary = find_redis_server()
    if binary is None:
        _missing("redis-server")
    assert binary is not None
    return binary


@pytest.fixture(scope="session")
def redis_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    """A private redis-server for the whole session (started on first use)."""
    server = LocalRedisServer(binary=redis_server_binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(redis_server_binary: str) -> Iterator[LocalRedisCluster]:
    """A private 3-master Redis Cluster for the whole session (started on first use)."""
    if find_redis_cli(redis_server_binary) is None:
        _missing("redis-cli")
    cluster = LocalRedisCluster(3, binary=redis_server_binary)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster_replicas(redis_server_binary: str) -> Iterator[LocalRedisCluster]:
    """A private Redis Cluster of 3 primaries with 1 replica each, for the whole session
    (started on first use, every replica's link up). Tests may fail over and leave it so:
    look the roles up with ``primary_for_slot``/``replicas_of``, and call ``wait_ready()``
    after a failover. Its tests are marked ``cluster`` (``pytest_collection_modifyitems``)."""
    if find_redis_cli(redis_server_binary) is None:
        _missing("redis-cli")
    cluster = LocalRedisCluster(3, replicas=1, binary=redis_server_binary)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_url(redis_server: LocalRedisServer) -> str:
    """URL of the session's real redis-server, flushed (FLUSHALL) for this test."""
    with redis.Redis.from_url(redis_server.url) as conn:
        conn.flushall()
    return redis_server.url


# ---------------------------------------------------------------- clients


@pytest.fixture(params=TARGET_PARAMS)
def redis_target(request: pytest.FixtureRequest) -> str:
    """The current target id: one of ``TARGETS``."""
    target: str = request.param
    return target


@pytest.fixture
def redis_client(redis_target: str, request: pytest.FixtureRequest) -> Iterator[Client]:
    """A fresh, empty client (``decode_responses=False``) for the current target."""
    client: Client
    if redis_target == "fakeredis":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=False)
    elif redis_target == "redis":
        server: LocalRedisServer = request.getfixturevalue("redis_server")
        client = redis.Redis.from_url(server.url, decode_responses=False)
        client.flushall()
    elif redis_target == "cluster":
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        cluster.flushall()
        client = cluster.client(decode_responses=False)
    else:
        raise ValueError(f"unknown redis target {redis_target!r}; expected one of {TARGETS}")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def open_client(redis_client: Client) -> Iterator[Callable[[], Client]]:
    """A factory of further, independent clients to the current target (closed after the test):
    what another process would use."""
    made: list[Client] = []

    def open_one() -> Client:
        client: Client
        if isinstance(redis_client, fakeredis.FakeRedis):
            server = redis_client.connection_pool.connection_kwargs["server"]
            client = fakeredis.FakeRedis(server=server)
        elif isinstance(redis_client, RedisCluster):
            node = redis_client.get_default_node()  # type: ignore[no-untyped-call]
            client = RedisCluster(host=node.host, port=node.port)
        else:
            kwargs = redis_client.connection_pool.connection_kwargs
            client = redis.Redis(host=kwargs["host"], port=kwargs["port"])
        made.append(client)
        return client

    yield open_one
    for client in made:
        client.close()


@pytest.fixture
def make_backend(
    open_client: Callable[[], Client],
) -> Iterator[Callable[..., RedisCheckpointBackend]]:
    """A factory of backends, each on its own client to the current target (closed after the
    test); keyword arguments go to ``RedisCheckpointBackend``."""
    made: list[RedisCheckpointBackend] = []

    def make(**kwargs: Any) -> RedisCheckpointBackend:
        backend = RedisCheckpointBackend(open_client(), **kwargs)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()
