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
instead of assuming them. Every test that uses it is marked ``cluster`` and ``full`` (it runs
in `pytest --full` only).

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

Front ends
----------
``frontend`` (params ``FRONTENDS = ("sync", "async")``) selects the front end a test drives:
the sync ``RedisCheckpointBackend`` itself, or an ``AsyncRedisCheckpointBackend`` behind
:class:`AsyncBackendProxy`, a generic proxy that uses every member on the backend's own event
loop (a private loop in a daemon thread, :class:`EventLoopThread`) and awaits what it returns.
Only tests that ask for ``frontend`` (or a fixture built on it) run twice; the others stay
sync-only. The fixtures::

    frontend               "sync" or "async"
    frontend_client        the client that front end uses on the current target: redis_client
                           itself (sync), or an asyncio client to the same server/cluster/
                           FakeServer made on the backend's loop (async)
    open_frontend_client   a factory of further such clients (closed after the test)
    make_frontend_backend  a factory of backends of that front end, make(client=None, **kwargs):
                           on ``client`` or on a new client; closed after the test
    frontend_backend_type  that front end's backend class, cls(client, **kwargs)
    async_loop             the EventLoopThread of the asyncio clients (asked for by the above)

``redis_client`` stays the sync client, for raw inspection on either front end.

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

import asyncio
import compileall
import concurrent.futures
import contextlib
import fnmatch
import functools
import inspect
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Final, TypeAlias, TypeVar

import fakeredis
import hypothesis
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
from redis.cluster import RedisCluster

import luft_redis
from luft_redis import AsyncRedisCheckpointBackend, RedisCheckpointBackend
from luft_redis.asyncio import AsyncChangeListener, AsyncCheckpointBackend
from luft_redis.tools.server import (
    SERVER_ENV,
    LocalRedisCluster,
    LocalRedisServer,
    find_redis_cli,
    find_redis_server,
    no_server_message,
    server_version,
)

#: Every client type ``redis_client`` can yield (``FakeRedis`` is a ``Redis``).
Client: TypeAlias = "redis.Redis | RedisCluster"

#: The target ids, in order.
TARGETS: Final = ("fakeredis", "redis", "cluster")

_TARGET_MARKS: Final = {"redis": "server", "cluster": "cluster"}

#: Fixtures that put markers on every test that uses them (a Cluster with replicas: full run).
_FIXTURE_MARKS: Final = {"redis_cluster_replicas": ("cluster", "full")}

#: The front-end ids, in order (the ``frontend`` fixture).
FRONTENDS: Final = ("sync", "async")

#: Seconds one call through :class:`AsyncBackendProxy` may take.
PROXY_TIMEOUT: Final = 60.0

T = TypeVar("T")

TARGET_PARAMS: Final = [
    pytest.param("fakeredis", id="fakeredis"),
    pytest.param("redis", id="redis", marks=pytest.mark.server),
    pytest.param("cluster", id="cluster", marks=pytest.mark.cluster),
]


def in_ci() -> bool:
    """True when env ``CI`` is set to anything but empty, ``0`` or ``false``."""
    value = os.environ.get("CI", "").strip().lower()
    return value not in ("", "0", "false", "no")


def chosen_server() -> str | None:
    """What ``LUFT_REDIS_SERVER`` names (``None`` when unset: ``redis-server`` on PATH)."""
    return os.environ.get(SERVER_ENV, "").strip() or None


def _missing(what: str) -> None:
    if what == "redis-server":
        message = no_server_message()
    else:
        message = (
            f"{what} not found (looked beside the server binary, on PATH and in /usr/bin); "
            "install it, e.g. `apt-get install redis-tools`"
        )
    if in_ci():
        pytest.fail(f"{message}. CI is set, so this is an error, not a skip.", pytrace=False)
    pytest.skip(message)


def skip_unsupported(feature: str, detail: str) -> None:
    """Skip a test because the server binary in use lacks *feature* (e.g. TLS), saying so.

    Under CI this fails instead when the server is the default one (``redis-server`` on PATH,
    ``LUFT_REDIS_SERVER`` unset), which must support everything; a server chosen with
    ``LUFT_REDIS_SERVER`` (e.g. a wheel built without TLS) is skipped with the reason.
    """
    binary = find_redis_server() or "redis-server"
    message = f"{binary} ({server_version(binary)}) has no {feature} support: {detail}"
    if in_ci() and chosen_server() is None:
        pytest.fail(f"{message}. CI is set and this is the default server.", pytrace=False)
    pytest.skip(message)


# ---------------------------------------------------------------- hooks

#: Markers of the tests that only the full run (``pytest --full``, what CI runs) includes.
FULL_ONLY: Final = "full"

#: The suites CI also runs on every extra server (``LUFT_REDIS_SERVER=... pytest --full -m
#: matrix``): their tests get the ``matrix`` marker here, by module.
MATRIX_MODULES: Final = frozenset(
    {"test_backend.py", "test_coherence.py", "test_hostile.py", "test_leases.py", "test_pools.py",
     "test_limits.py"}
)


#: Hypothesis profiles: the ``max_examples`` every property test scales its own count by
#: (``settings().max_examples`` at import). ``ci`` (``pytest --full``) is Hypothesis'
#: default of 100, at which each test runs the count it names; ``dev`` (the everyday loop) a
#: quarter of that. ``--hypothesis-profile NAME`` overrides the choice.
HYPOTHESIS_PROFILES: Final = {"ci": 100, "dev": 25}
for _name, _examples in HYPOTHESIS_PROFILES.items():
    hypothesis.settings.register_profile(_name, max_examples=_examples)


def pytest_configure(config: pytest.Config) -> None:
    """Load the Hypothesis profile of this run (``ci`` with ``--full``, else ``dev``); in the
    controlling process, compile the package under test once (see :func:`_compile_package`)."""
    if not config.getoption("hypothesis_profile", None):
        hypothesis.settings.load_profile("ci" if config.getoption("--full") else "dev")
    # pytest keeps the assertion-rewritten test modules as bytecode unless writing bytecode
    # is off (PYTHONDONTWRITEBYTECODE=1, as on the machine this suite is timed on): then every
    # run and every xdist worker parses and rewrites them all again (collecting took 18 s
    # instead of 8 s per process). The suite writes it; __pycache__ is ignored by git.
    sys.dont_write_bytecode = False
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        _compile_package()


def _compile_package() -> None:
    """Write the bytecode of the package under test where it is missing or stale. Hundreds of
    tests start Python processes that import it (the CLI, workers, the demo); without the
    bytecode each compiles its sources again (~0.35 s of CPU; an editable install under
    ``PYTHONDONTWRITEBYTECODE=1`` never gets any). A tree that cannot be written is left as
    it is."""
    with contextlib.suppress(OSError):
        compileall.compile_dir(Path(luft_redis.__file__).parent, quiet=2)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--full``: also run the tests marked ``full`` (what CI runs; see pyproject.toml)."""
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="run the full suite: also the tests marked 'full' (Cluster with replicas, "
        "failover, the long chaos/soak/fuzz cases) and the Hypothesis 'ci' profile; "
        "this is what CI runs",
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Show which luft_redis is under test and which server would be used."""
    binary = find_redis_server()
    version = server_version(binary) if binary else "not found"
    return [
        f"luft_redis: {Path(luft_redis.__file__).resolve().parent}",
        f"server: {binary or no_server_message()} ({version}); "
        f"{SERVER_ENV}={chosen_server() or '(unset)'}; CI={in_ci()}",
        f"full run: {config.getoption('--full')} (without --full, tests marked "
        f"{FULL_ONLY!r} are deselected)",
    ]


#: Tests that run in the full run only although their file does not mark them, as
#: ``<file name>::<pattern>`` (an ``fnmatch`` pattern of the test's name, with ``[``
#: written ``[[]``), with what covers them in the everyday loop.
FULL_ONLY_TESTS: Final = {
    # The asyncio cases of test_hostile.py's property tests (random interleavings, ~85 s
    # together): everyday, the sync cases play the same worlds, and the suite's other cases
    # drive the asyncio front end.
    "test_hostile.py::test_random_interleavings[[]async-*": "the sync cases",
    "test_hostile.py::test_random_interleavings_regain_freshness_unaided[[]async-*":
        "the sync cases",
    # test_backend.py's asyncio cases on Cluster (~25 s of CPU): the asyncio backend is the
    # source the sync one is generated from, Cluster routing is shared (cluster.py), and
    # test_asyncio.py runs the asyncio front end on a Cluster everyday.
    "test_backend.py::*[[]async-cluster*": "the sync-cluster cases and test_asyncio.py",
    # The tools' and the package's own suites: each starts Python processes (a demo, a
    # pytester run, a wheel build, a benchmark), a fifth of the everyday loop's CPU. The
    # library's operations they call are covered everyday by the backend and lease suites.
    "test_benchmarks_smoke.py::*": "CI only: the benchmarks' smoke runs",
    "test_newcomer.py::*": "CI only: the wheel, the sdist and the README's examples as written",
    "test_testing_plugin.py::*": "CI only: the pytest plugin in pytester subprocesses",
    "test_demo.py::*": "CI only: the demo's runs (test_cli_pty keeps one everyday)",
    # The slowest single cases left (5-19 s each under load), each with its everyday cover.
    "test_faults.py::test_a_replayed_durable_write_is_only_acknowledged_once_replicated"
    "[[]redis-8.2]": "the [default] case (CI runs the matrix servers)",
    "test_faults.py::test_a_replayed_durable_write_is_only_acknowledged_once_replicated"
    "[[]valkey-9]": "the [default] case (CI runs the matrix servers)",
    "test_server_lifetime.py::test_dropped_cluster_is_stopped_at_exit":
        "test_dropped_server_is_stopped_at_exit (the same exit registry)",
    "test_cli_commands.py::test_runs_columns_filters_and_limit":
        "test_cli_index.py (the index pages and filters the table shows)",
    "test_cli_commands.py::test_global_options_go_before_or_after_the_command":
        "the other CLI tests, which pass --redis and --prefix",
    # Pools (issue 28): the fairness runs on fakeredis and Cluster (the [redis-*] ones stay),
    # the fleet of killed processes (the lapse takeover case stays), the input checks on a
    # server (they fail before any I/O: the fakeredis cases stay), the asyncio-on-Cluster
    # rows of the pool scripts in the fault matrix (sync-cluster and async-redis stay).
    "test_pools.py::test_four_workers_share_a_pool_of_ten_runs_fairly[[]fakeredis-*":
        "the [redis-*] cases",
    "test_pools.py::test_four_workers_share_a_pool_of_ten_runs_fairly[[]cluster-*":
        "the [redis-*] cases",
    "test_pools.py::test_a_pool_fleet_with_killed_workers_finishes_every_agent_exactly_once":
        "test_a_lapsed_lease_of_a_pooled_run_is_taken_over",
    "test_pools.py::test_join_pool_checks_its_input_and_writes_nothing[[]redis-*":
        "the [fakeredis-*] cases",
    "test_pools.py::test_join_pool_checks_its_input_and_writes_nothing[[]cluster-*":
        "the [fakeredis-*] cases",
    "test_fault_matrix.py::test_a_fault_changes_nothing_the_caller_sees[[]async-cluster-*pool*":
        "the sync-cluster and async-redis rows",
    "test_pools.py::*[[]*cluster*": "the [*redis*] cases, and the fault matrix's sync-cluster "
                                   "rows of the pool scripts (a claim from a pool on Cluster)",
    "test_cli_agents.py::test_pools_and_pool_show_runs_states_tasks_and_budgets[[]cluster]":
        "the [server] case (the pool reads are the same pipelined calls)",
}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject.toml): two workers per core. The suite waits on servers and
    subprocesses about half of its time: on this 2-core machine 4 workers finish the everyday
    loop in 5:10 where 2 take 7:12, both cores then busy (CPU time / wall time 1.9)."""
    return 2 * (os.cpu_count() or 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the ``server``/``cluster`` marker to every item whose target or fixture needs it
    (``matrix`` to the tests of :data:`MATRIX_MODULES`), and deselect the tests marked
    ``full`` unless ``--full`` is given."""
    for item in items:
        markers: list[str] = []
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            target = callspec.params.get("redis_target")
            if isinstance(target, str) and target in _TARGET_MARKS:
                markers.append(_TARGET_MARKS[target])
        fixturenames: list[str] = getattr(item, "fixturenames", [])
        for name in fixturenames:
            markers.extend(_FIXTURE_MARKS.get(name, ()))
        if item.path.name in MATRIX_MODULES:
            markers.append("matrix")
        if any(fnmatch.fnmatchcase(f"{item.path.name}::{item.name}", pattern)
               for pattern in FULL_ONLY_TESTS):  # fmt: skip
            markers.append(FULL_ONLY)
        for marker in markers:
            if item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))
    if config.getoption("--full"):
        return
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        (deselected if item.get_closest_marker(FULL_ONLY) else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


# ---------------------------------------------------------------- servers


@pytest.fixture(scope="session")
def redis_server_binary() -> str:
    """Path of the server binary: what ``LUFT_REDIS_SERVER`` names (a path, a command, or
    ``redis-8.2``/``valkey-9`` from their wheels), else ``redis-server`` on PATH (skip, or
    fail under CI, when missing)."""
    binary = find_redis_server()
    if binary is None:
        _missing("redis-server")
    assert binary is not None
    return binary


@pytest.fixture(scope="session")
def full_run(pytestconfig: pytest.Config) -> bool:
    """True in the full run (``pytest --full``, what CI runs): a soak test may play its full
    length then, and a tenth of it in the everyday loop."""
    return bool(pytestconfig.getoption("--full"))


@pytest.fixture(scope="session")
def server_lacks() -> Callable[[str, str], None]:
    """``server_lacks(feature, detail)``: skip the test because the server binary in use lacks
    *feature* (``"TLS"``), with the reason (fails under CI on the default server)."""
    return skip_unsupported


@pytest.fixture(scope="session")
def redis_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    """A private redis-server for the whole session (started on first use). At the end no
    connection may still be subscribed to it: a backend a test left open keeps its listener
    (and its health-check PINGs, counted by later tests' commandstats) for the session."""
    server = LocalRedisServer(binary=redis_server_binary)
    server.start()
    try:
        yield server
        left = _subscribed_clients(server.url, wait=3.0)
        assert not left, f"connections still subscribed at the session's end: {left}"
    finally:
        server.stop()


def _subscribed_clients(url: str, wait: float) -> list[str]:
    """The subscribed connections of the server at ``url`` (``CLIENT LIST`` lines), after up
    to ``wait`` seconds for them to close (a listener may be closing)."""
    deadline = time.monotonic() + wait
    with redis.Redis.from_url(url, socket_timeout=5) as admin:
        while True:
            left = [f"id={c['id']} addr={c['addr']} cmd={c['cmd']}" for c in admin.client_list()
                    if any(int(c.get(k, 0)) for k in ("sub", "psub", "ssub"))]  # fmt: skip
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


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


# ---------------------------------------------------------------- front ends


class EventLoopThread:
    """A private asyncio event loop running in a daemon thread, driven from sync code.

    :meth:`run` runs an awaitable on it and waits for the result; :meth:`call` runs any callable
    on it (awaiting what it returns, see there). Clients made with :meth:`open_client` are
    created on the loop and remembered, so that an :class:`AsyncBackendProxy` given such a
    client finds the loop by itself.
    """

    _owners: ClassVar[dict[int, EventLoopThread]] = {}
    """id(client) -> the loop that made it (while the client is open)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._clients: dict[int, Any] = {}
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="luft-test-event-loop", daemon=True
        )
        self._thread.start()

    @classmethod
    def owner_of(cls, client: Any) -> EventLoopThread:
        """The loop that made ``client`` with :meth:`open_client`."""
        try:
            return cls._owners[id(client)]
        except KeyError:
            raise ValueError(f"{client!r} was not made by an EventLoopThread") from None

    def run(self, awaitable: Awaitable[T], timeout: float = PROXY_TIMEOUT) -> T:
        """Run ``awaitable`` on the loop and return its result (or raise its exception);
        TimeoutError (and the coroutine cancelled) after ``timeout`` seconds."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("EventLoopThread.run() from its own loop would deadlock")

        async def main() -> T:
            return await awaitable

        future = asyncio.run_coroutine_threadsafe(main(), self.loop)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` called on the loop, as an asyncio caller would: an
        awaitable result is awaited there; an async iterator comes back as a sync iterator
        (each item fetched on the loop); a callable (a bound method, the function
        ``subscribe`` returns) comes back as a function that is called the same way."""

        async def main() -> Any:
            got = function(*args, **kwargs)
            return await got if inspect.isawaitable(got) else got

        got = self.run(main())
        if isinstance(got, AsyncIterator):
            return self._iterate(got)
        if callable(got) and not isinstance(got, type):
            return functools.partial(self.call, got)
        return got

    def _iterate(self, items: AsyncIterator[Any]) -> Iterator[Any]:
        async def step() -> tuple[Any] | None:
            try:
                return (await anext(items),)
            except StopAsyncIteration:
                return None

        try:
            while (got := self.run(step())) is not None:
                yield got[0]
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None and not self.loop.is_closed():
                self.run(aclose())

    def open_client(self, make: Callable[[], Any]) -> Any:
        """``make()`` called on the loop: an asyncio client bound to this loop."""

        async def create() -> Any:
            return make()

        client = self.run(create())
        self._clients[id(client)] = client
        self._owners[id(client)] = self
        return client

    def close_client(self, client: Any) -> None:
        """Stop the client's change listener (if any) and close the client, on the loop (a
        client already closed here is left alone)."""
        if self._clients.pop(id(client), None) is not client:
            return
        self._owners.pop(id(client), None)

        async def close() -> None:
            listener = AsyncChangeListener.existing(client)
            if listener is not None:
                await listener.aclose()
            await client.aclose()

        self.run(close())

    def close(self) -> None:
        """Close the clients still open, cancel what still runs, stop the loop and the thread."""
        for client in list(self._clients.values()):
            self.close_client(client)

        async def cancel_the_rest() -> None:
            me = asyncio.current_task()
            rest = [task for task in asyncio.all_tasks() if task is not me]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        try:
            self.run(cancel_the_rest(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()


def async_client_like(client: Client) -> Any:
    """A new asyncio client (``decode_responses=False``) to what the sync ``client`` talks to:
    the same ``FakeServer``, redis-server or cluster. Call it on the loop that will use it."""
    if isinstance(client, fakeredis.FakeRedis):
        server = client.connection_pool.connection_kwargs["server"]
        return fakeredis.FakeAsyncRedis(server=server)
    if isinstance(client, RedisCluster):
        node = client.get_default_node()  # type: ignore[no-untyped-call]
        return redis.asyncio.cluster.RedisCluster(host=node.host, port=node.port)
    kwargs = client.connection_pool.connection_kwargs
    return redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"])


class AsyncBackendProxy:
    """An :class:`AsyncRedisCheckpointBackend` driven from sync code, so that sync-style tests
    run on the asyncio front end too: nothing of the backend is re-implemented here.

    ``client`` is an asyncio client made by :meth:`EventLoopThread.open_client`; the keyword
    arguments are the backend's. Every member the proxy does not have itself is looked up
    *and used on the backend's loop* (:meth:`EventLoopThread.call`): a coroutine method is
    awaited there, an async iterator is re-yielded one item at a time, and a property or plain
    method (``cache_is_fresh``, ``get_checkpoint()``, ...) is read there too. The asyncio
    backend's state is guarded by no lock (``runtime.AsyncStateLock`` does nothing: one loop
    needs none), so reading it from another thread while the loop changes it would not be
    safe; on the loop, every read sees what an asyncio caller would. :meth:`close` is
    ``aclose()``. Callbacks given to ``subscribe`` run on the loop's thread.
    """

    def __init__(self, client: Any, *, loop: EventLoopThread | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        self.event_loop_thread = loop if loop is not None else EventLoopThread.owner_of(client)
        """The loop the backend lives on."""
        self.wrapped: AsyncRedisCheckpointBackend = self.event_loop_thread.call(
            AsyncRedisCheckpointBackend, client, **kwargs
        )
        """The asyncio backend itself."""
        assert isinstance(self.wrapped, AsyncCheckpointBackend)  # luft's trait, asyncio flavour

    def __getattr__(self, name: str) -> Any:
        if name in ("wrapped", "event_loop_thread") or name.startswith("__"):
            raise AttributeError(name)  # not set up (yet): never look it up on the backend
        return self.event_loop_thread.call(getattr, self.wrapped, name)

    def close(self) -> None:
        self.event_loop_thread.call(self.wrapped.aclose)

    def __enter__(self) -> AsyncBackendProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<AsyncBackendProxy of {self.wrapped!r}>"


@pytest.fixture(params=FRONTENDS)
def frontend(request: pytest.FixtureRequest) -> str:
    """The front end under test: ``"sync"`` or ``"async"`` (see the module docstring)."""
    name: str = request.param
    return name


@pytest.fixture
def async_loop() -> Iterator[EventLoopThread]:
    """A private event loop in a daemon thread, for this test (stopped after it)."""
    loop = EventLoopThread()
    try:
        yield loop
    finally:
        loop.close()


@pytest.fixture
def open_frontend_client(
    frontend: str,
    redis_client: Client,
    open_client: Callable[[], Client],
    request: pytest.FixtureRequest,
) -> Iterator[Callable[[], Any]]:
    """A factory of new clients to the current target for the front end under test (sync: as
    ``open_client``; async: asyncio clients made on ``async_loop``), closed after the test."""
    if frontend == "sync":
        yield open_client
        return
    loop: EventLoopThread = request.getfixturevalue("async_loop")
    made: list[Any] = []

    def open_one() -> Any:
        client = loop.open_client(lambda: async_client_like(redis_client))
        made.append(client)
        return client

    yield open_one
    for client in made:
        loop.close_client(client)


@pytest.fixture
def frontend_client(
    frontend: str, redis_client: Client, open_frontend_client: Callable[[], Any]
) -> Any:
    """The client the front end under test uses on the current target: ``redis_client`` itself
    (sync), or an asyncio client to the same server (async)."""
    return redis_client if frontend == "sync" else open_frontend_client()


@pytest.fixture
def frontend_backend_type(frontend: str) -> type[RedisCheckpointBackend | AsyncBackendProxy]:
    """The backend class of the front end under test, ``cls(client, **kwargs)`` with a client of
    that front end: ``RedisCheckpointBackend`` or :class:`AsyncBackendProxy` (for a backend the
    test closes itself; :func:`make_frontend_backend`'s are closed after the test)."""
    return RedisCheckpointBackend if frontend == "sync" else AsyncBackendProxy


@pytest.fixture
def make_frontend_backend(
    frontend_backend_type: type[RedisCheckpointBackend | AsyncBackendProxy],
    open_frontend_client: Callable[[], Any],
) -> Iterator[Callable[..., Any]]:
    """A factory ``make(client=None, **kwargs)`` of backends of the front end under test:
    ``RedisCheckpointBackend`` or :class:`AsyncBackendProxy`, on ``client`` (one of this
    front end's) or on a new client; keyword arguments go to the backend. All are closed after
    the test."""
    made: list[RedisCheckpointBackend | AsyncBackendProxy] = []

    def make(client: Any = None, **kwargs: Any) -> RedisCheckpointBackend | AsyncBackendProxy:
        backend = frontend_backend_type(
            open_frontend_client() if client is None else client, **kwargs
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()
