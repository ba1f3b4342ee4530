"""The fault matrix (issue 26): every writing operation of the library, after its request or
its reply is lost, or its reply comes too late, gives the caller exactly what it gives without
the fault: the same return value or exception class, the same cache, the same stored run, and
the write applied once.

The matrix is generated from the library's own list of operations: every writing function of
the Functions library (``scripts.SCRIPT_NAMES`` minus ``scripts.READ_ONLY``) has at least one
case in ``CASES`` (``test_every_writing_operation_has_a_case`` fails for one added without),
and each case runs under every fault of ``FAULTS`` x both front ends x fakeredis, a private
redis-server and a private Redis Cluster.

The faults are injected in the client's connections (:class:`FaultInjector`), the one layer
that every front end and target shares (redis-py's sync and asyncio connections, a Cluster's
node connections, fakeredis' fake ones, the write lane's own connection): the first command
that calls the case's function is hit, once, and the library's own retry policy does the rest.

* ``request_lost``: the connection breaks as the command is sent; it never reaches Redis.
* ``reply_lost``: the command is applied, and the connection breaks before its reply is read
  (an error reply is lost the same way).
* ``reply_late``: the command is applied, and the client gives up waiting first (a timeout).
* ``request_late``: the client gives up waiting; the command, held on the way, reaches Redis
  only after the retry was applied and answered (the worst order for exactly-once).

Each case is run without a fault first (the baseline), on an emptied target, then with the
fault; the two outcomes must be equal. Times that come from the server clock (``created_at``,
``updated_at``, lease expiries, index scores) are masked before comparing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from fakeredis._clients._async import FakeBaseAsyncConnection
from fakeredis._clients._sync import FakeBaseConnection
from redis.cluster import RedisCluster

from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentSessionCheckpoint,
    AgentStarted,
    AgentStatus,
    AgentTask,
    Finding,
    Log,
    LogLevel,
    RunDone,
    RunStatus,
    Severity,
    TokenUsage,
)
from luft_redis._sync.index import read_counts
from luft_redis.asyncio.interop import import_run as async_import_run
from luft_redis.asyncio.retention import collect_garbage as async_collect_garbage
from luft_redis.index import run_status_key
from luft_redis.interop import checkpoint_json, import_run
from luft_redis.keys import limiter_key, pool_keys, run_index_key, run_keys
from luft_redis.retention import collect_garbage
from luft_redis.scripts import READ_ONLY, SCRIPT_NAMES, library

FAULTS = ("request_lost", "reply_lost", "reply_late", "request_late")
"""What happens to the first command of the case's operation (see the module docstring)."""

WRITING = sorted(op for op in SCRIPT_NAMES if op not in READ_ONLY)
"""Every writing function of the library, from its own list."""

PREFIX = "luft"
RUN = uuid.UUID("0193aaaa-0000-7000-8000-000000000001")
AGENTS = [uuid.UUID(int=(0xFA17 << 112) | i) for i in range(4)]
TS = dt.datetime(2026, 12, 5, 8, 0, 0, 123456, tzinfo=dt.UTC)


# ------------------------------------------------------------------------ the fault injector


def _resp_args(packed: bytes) -> list[bytes]:
    """The arguments of one RESP command (``*N`` then N bulk strings)."""
    assert packed[:1] == b"*", packed[:20]
    head, _, rest = packed.partition(b"\r\n")
    args: list[bytes] = []
    for _ in range(int(head[1:])):
        size, _, rest = rest.partition(b"\r\n")
        length = int(size[1:])
        args.append(rest[:length])
        rest = rest[length + 2 :]
    return args


def _packed(command: Any) -> bytes:
    if isinstance(command, (bytes, bytearray, memoryview)):
        return bytes(command)
    if isinstance(command, str):
        return command.encode()
    return b"".join(bytes(c) if not isinstance(c, str) else c.encode() for c in command)


class FaultInjector:
    """Breaks the first command that calls one function (``arm``), in the way ``mode`` says,
    on whatever connection carries it. Installed by patching the connection classes of
    redis-py (sync and asyncio) and of fakeredis for the duration of a test."""

    def __init__(self) -> None:
        self.target: bytes | None = None
        self.mode = ""
        self.fired = 0
        self.held: tuple[Callable[[], Any], list[bytes]] | None = None
        self.held_for: bytes | None = None
        self.late_reply: Any = None

    def arm(self, function: str, mode: str) -> None:
        self.target, self.mode, self.fired = b"\r\n" + function.encode() + b"\r\n", mode, 0

    def _take(self, command: Any) -> str | None:
        """The fault for this command (once), None for any other."""
        if self.target is None:
            return None
        packed = _packed(command)
        if self.target not in packed[:200]:
            return None
        self.target = None
        self.fired += 1
        return self.mode

    def _hold(self, conn: Any, command: Any) -> None:
        packed = _packed(command)
        server = getattr(conn, "_server", None)
        if server is not None:
            make: Callable[[], Any] = functools.partial(fakeredis.FakeRedis, server=server)
        else:
            make = functools.partial(redis.Redis, host=conn.host, port=conn.port)
        self.held, self.held_for = (make, _resp_args(packed)), self.target_of(packed)

    def target_of(self, packed: bytes) -> bytes:
        """The ``\r\n<function>\r\n`` part of an FCALL (its third RESP line)."""
        lines = packed.split(b"\r\n", 5)
        return b"\r\n" + lines[4] + b"\r\n"

    def _retry_of_held(self, command: Any) -> bool:
        return self.held_for is not None and self.held_for in _packed(command)[:200]

    def deliver(self) -> None:
        """Send the held command now (on a connection of its own), keeping its reply."""
        held, self.held, self.held_for = self.held, None, None
        if held is None:
            return
        make, args = held
        with make() as client:
            try:
                self.late_reply = client.execute_command(*args)
            except redis.ResponseError as exc:
                self.late_reply = exc

    @contextlib.contextmanager
    def installed(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultInjector]:
        injector = self
        sync_send: Any = redis.connection.AbstractConnection.send_packed_command
        async_send: Any = redis.asyncio.connection.AbstractConnection.send_packed_command

        def broken(mode: str) -> Exception:
            if mode.endswith("lost"):
                return redis.ConnectionError(f"injected fault: {mode}")
            return redis.TimeoutError(f"injected fault: {mode}")

        def send(self: Any, command: Any, check_health: bool = True) -> None:
            fault = injector._take(command)
            if fault in ("request_lost", "request_late"):
                if fault == "request_late":
                    injector._hold(self, command)
                self.disconnect()
                raise broken(fault)
            sync_send(self, command, check_health)
            self._luft_fault = fault
            self._luft_retry = injector._retry_of_held(command)

        async def asend(self: Any, command: Any, check_health: bool = True) -> None:
            fault = injector._take(command)
            if fault in ("request_lost", "request_late"):
                if fault == "request_late":
                    injector._hold(self, command)
                await self.disconnect()
                raise broken(fault)
            await async_send(self, command, check_health)
            self._luft_fault = fault
            self._luft_retry = injector._retry_of_held(command)

        def after(conn: Any, fault: str | None, retry: bool, error: Exception | None) -> None:
            """What follows a read: the fault, or the held request once its retry is read."""
            if fault is not None:
                raise broken(fault)
            if retry:
                injector.deliver()  # the held request arrives after its retry
            if error is not None:
                raise error

        def reader(original: Any) -> Any:
            def read(self: Any, *args: Any, **kwargs: Any) -> Any:
                fault = self.__dict__.pop("_luft_fault", None)
                retry = self.__dict__.pop("_luft_retry", False)
                reply, error = None, None
                try:
                    reply = original(self, *args, **kwargs)
                except redis.ResponseError as exc:  # an error reply is lost the same way
                    error = exc
                if fault is not None:
                    self.disconnect()
                after(self, fault, retry, error)
                return reply

            return read

        def areader(original: Any) -> Any:
            async def read(self: Any, *args: Any, **kwargs: Any) -> Any:
                fault = self.__dict__.pop("_luft_fault", None)
                retry = self.__dict__.pop("_luft_retry", False)
                reply, error = None, None
                try:
                    reply = await original(self, *args, **kwargs)
                except redis.ResponseError as exc:
                    error = exc
                if fault is not None:
                    await self.disconnect()
                after(self, fault, retry, error)
                return reply

            return read

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
        monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "send_packed_command",
                            asend)  # fmt: skip
        for cls in (redis.connection.AbstractConnection, FakeBaseConnection):
            monkeypatch.setattr(cls, "read_response", reader(cls.read_response))
        for acls in (redis.asyncio.connection.AbstractConnection, FakeBaseAsyncConnection):
            monkeypatch.setattr(acls, "read_response", areader(acls.read_response))
        yield self


# ------------------------------------------------------------------------------ the cases


@dataclasses.dataclass
class Ctx:
    """What a case works with: the target's plain sync client (``direct``), a factory of
    backends of the front end under test (``make``), and ``call`` to run a callable as that
    front end's caller would (awaited on the backend's loop for asyncio)."""

    direct: Any
    make: Callable[..., Any]
    frontend: str
    backend: Any = None
    lease: Any = None

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.frontend == "sync":
            return function(*args, **kwargs)
        return self.backend.event_loop_thread.call(function, *args, **kwargs)

    def bound(self, **kwargs: Any) -> Any:
        """A backend of the front end under test, bound to a new run ``RUN``."""
        self.backend = self.make(**kwargs)
        self.backend.init_run(RUN, "the fault matrix", "/runs/fm")
        return self.backend


def _started(i: int) -> AgentStarted:
    return AgentStarted(run_id=RUN, phase_id=0, agent_id=AGENTS[i], prompt_preview=f"p{i}",
                        model="m", ts=TS)  # fmt: skip


def _done(i: int, status: AgentStatus = AgentStatus.OK) -> AgentDone:
    finding = Finding(kind="bug", severity=Severity.HIGH, title=f"f{i}", detail="d")
    return AgentDone(run_id=RUN, agent_id=AGENTS[i], status=status,
                     tokens=TokenUsage(input=10 + i, output=5), elapsed_ms=7, ts=TS,
                     output={"i": i}, findings=(finding,))  # fmt: skip


def _result(i: int) -> AgentResultCache:
    return AgentResultCache(agent_id=AGENTS[i], phase_id=0, status="ok", output={"r": i},
                            findings=(), tokens=3, completed_at=1_700_000_000_000)  # fmt: skip


def _session(i: int) -> AgentSessionCheckpoint:
    return AgentSessionCheckpoint(agent_id=AGENTS[i], session_id=f"s{i}", status="active",
                                  updated_at=1_700_000_000_000, resumable=True)  # fmt: skip


def _submitted(ctx: Ctx, n: int = 2) -> Any:
    backend = ctx.bound()
    backend.submit_agents([AgentTask(AGENTS[i], 0, {"i": i}) for i in range(n)])
    return backend


def _claimed(ctx: Ctx) -> None:
    _submitted(ctx)
    ctx.lease = ctx.backend.claim_agent("worker-1", lease_for=60.0)
    assert ctx.lease is not None


def _finished(ctx: Ctx) -> None:
    backend = ctx.bound()
    backend.append_events([_started(0), _done(0)])
    backend.append_event(RunDone(run_id=RUN, status=RunStatus.COMPLETED,
                                 total_tokens=TokenUsage(input=10, output=5), ts=TS))  # fmt: skip


def _lease_view(lease: Any) -> Any:
    if lease is None:
        return None
    return (lease.agent_id, lease.token, lease.attempt, lease.task, lease.lost, lease.finished,
            lease.cancelled)  # fmt: skip


def _saved(ctx: Ctx) -> None:
    backend = ctx.backend
    cp = backend.get_checkpoint()
    assert cp is not None
    changed = dataclasses.replace(cp, task="saved", total_tokens=99,
                                  agent_results={AGENTS[1]: _result(1)})  # fmt: skip
    backend.save_checkpoint(changed)


def _gc(ctx: Ctx) -> Any:
    """``collect_garbage`` of the front end under test, on its backend's client."""
    gc = collect_garbage if ctx.frontend == "sync" else async_collect_garbage
    report = ctx.call(gc, ctx.backend.client, PREFIX, older_than=dt.timedelta(0))
    return (report.deleted, report.skipped)


def _imported(ctx: Ctx) -> Any:
    source = ctx.backend
    cp = source.get_checkpoint()
    events = source.get_event_log()
    source.delete_run()
    if ctx.frontend == "sync":
        got = import_run(ctx.direct, cp, events, prefix=PREFIX, run_dir="/runs/fm")
    else:  # the asyncio import, on the backend's own (asyncio) client
        got = ctx.call(async_import_run, source.client, cp, events, prefix=PREFIX,
                       run_dir="/runs/fm")  # fmt: skip
    return (got.run_id, got.events, got.replaced)


FORK = uuid.UUID("0193a1b2-0000-7000-8000-00000000f0c2")


def _forked(ctx: Ctx) -> Any:
    """fork_run of the pooled run at its last version (both tasks ready), then the fork as a
    fresh reader finds it: state, log, tasks, pool and parent."""
    from luft_redis import RedisCheckpointBackend

    ctx.backend.fork_run(at=3, new_run_id=FORK)
    reader = RedisCheckpointBackend(ctx.direct, watch=False, prefix=PREFIX)
    try:
        cp = reader.open_run(FORK)
        return (_masked_checkpoint(cp), [e.to_json() for e in reader.get_event_log()],
                [dataclasses.replace(task, expires_at=None) for task in reader.agent_tasks()],
                reader.pool_membership(), ctx.direct.hget(run_keys(PREFIX, FORK).run, "parent"),
                reader.version)  # fmt: skip
    finally:
        reader.close()


@dataclasses.dataclass(frozen=True)
class Case:
    """One use of a writing function: ``setup`` (no fault), then ``act``, whose first command
    calling ``op`` gets the fault; ``act``'s return value is the outcome compared."""

    op: str
    setup: Callable[[Ctx], Any]
    act: Callable[[Ctx], Any]
    frontends: tuple[str, ...] = ("sync", "async")
    """Front ends with this operation (the sync-only tools: issue 27 writes them once)."""


def _pooled(ctx: Ctx) -> None:
    backend = ctx.bound()
    backend.join_pool("fm")
    backend.submit_agents([AgentTask(AGENTS[i], 0, {"i": i}) for i in range(2)])


def _joined(ctx: Ctx) -> None:
    ctx.bound().join_pool("fm")


def _limited(ctx: Ctx, requests_per_minute: int = 600) -> None:
    """Tasks under the rate limiter "fm-model", 100 tokens expected each."""
    backend = ctx.bound()
    backend.set_rate_limit("fm-model", requests_per_minute=requests_per_minute,
                           tokens_per_minute=60_000, burst=0)  # fmt: skip
    backend.submit_agents([AgentTask(AGENTS[i], 0, {"i": i}) for i in range(2)],
                          limiter="fm-model", expected_tokens=100)  # fmt: skip


def _limited_claimed(ctx: Ctx) -> None:
    _limited(ctx, requests_per_minute=1)
    ctx.lease = ctx.backend.claim_agent("worker-1", lease_for=60.0)
    assert ctx.lease is not None


def _pooled_busy(ctx: Ctx) -> None:
    """Pool "fm"'s one run has its two tasks leased: a claim finds only leases to wait for."""
    _pooled(ctx)
    holder = ctx.make(watch=False)
    for _ in range(2):
        assert holder.claim_agent("holder", pool="fm", lease_for=60.0) is not None


def _capped(ctx: Ctx) -> None:
    """Two tasks in pool "fm", whose max_leases is 1."""
    _pooled(ctx)
    ctx.backend.configure_pool("fm", max_leases=1)


def _capped_claimed(ctx: Ctx) -> None:
    _capped(ctx)
    ctx.backend = ctx.make(watch=False)  # the worker: its cache is the one compared
    ctx.lease = ctx.backend.claim_agent("worker-1", pool="fm", lease_for=60.0)
    assert ctx.lease is not None and ctx.lease.pool_capped


def _make(ctx: Ctx) -> None:
    ctx.backend = ctx.make()


def _exists(ctx: Ctx) -> None:
    ctx.bound()
    _make(ctx)


CASES: dict[str, Case] = {
    "init_run": Case("init_run", _make,
                     lambda c: c.backend.init_run(RUN, "the fault matrix", "/runs/fm")),
    "init_run_with_meta": Case("init_run", _make, lambda c: c.backend.init_run_with_meta(
        RUN, "the fault matrix", "/runs/fm", {"plan": [1, 2], "by": "matrix"})),
    "init_run_exists": Case("init_run", _exists,
                            lambda c: c.backend.init_run(RUN, "again", "/runs/fm")),
    "append_event": Case("append_events", Ctx.bound, lambda c: c.backend.append_event(_started(0))),
    "append_events": Case("append_events", Ctx.bound, lambda c: c.backend.append_events([
        _started(0), _started(1), _done(0), _done(1, AgentStatus.ERROR),
        Log(run_id=RUN, agent_id=AGENTS[1], level=LogLevel.WARN, msg="retrying")])),
    "append_event_fenced": Case("append_events", _claimed, lambda c: (
        c.backend.append_event(_done(0), lease=c.lease), _lease_view(c.lease))),
    "append_after_completed": Case("append_events", _finished,
                                   lambda c: c.backend.append_event(_started(1))),
    "upsert_agent_result": Case("upsert_agent_result", Ctx.bound,
                                lambda c: c.backend.upsert_agent_result(_result(2))),
    "upsert_agent_result_fenced": Case("upsert_agent_result", _claimed, lambda c: (
        c.backend.upsert_agent_result(_result(0), lease=c.lease), _lease_view(c.lease))),
    "upsert_agent_session": Case("upsert_agent_session", Ctx.bound,
                                 lambda c: c.backend.upsert_agent_session(_session(1))),
    "submit_agents": Case("submit_agents", Ctx.bound, lambda c: c.backend.submit_agents(
        [AgentTask(AGENTS[i], 1, {"i": i}) for i in range(3)])),
    "claim_agent": Case("claim_agent", _submitted, lambda c: _lease_view(
        c.backend.claim_agent("worker-1", lease_for=60.0))),
    "claim_agent_empty": Case("claim_agent", Ctx.bound, lambda c: _lease_view(
        c.backend.claim_agent("worker-1", lease_for=60.0))),
    "renew_lease": Case("renew_lease", _claimed,
                        lambda c: (c.call(c.lease.renew), _lease_view(c.lease))),
    "release_lease": Case("release_lease", _claimed,
                          lambda c: (c.call(c.lease.release, failed=True), _lease_view(c.lease))),
    "cancel": Case("cancel", Ctx.bound, lambda c: c.backend.cancel()),
    "cancel_completed": Case("cancel", _finished, lambda c: c.backend.cancel()),
    "reset_status_to_running": Case("reset_status_to_running",
                                    lambda c: c.bound().cancel(),
                                    lambda c: c.backend.reset_status_to_running()),
    "reset_completed": Case("reset_status_to_running", _finished,
                            lambda c: c.backend.reset_status_to_running()),
    "save_checkpoint": Case("save_checkpoint",
                            lambda c: c.bound().append_events([_started(0), _done(0)]), _saved),
    "delete_run": Case("delete_run", Ctx.bound, lambda c: c.backend.delete_run()),
    "delete_run_missing": Case("delete_run", Ctx.bound,
                               lambda c: (c.backend.delete_run(), c.backend.delete_run(RUN))),
    "gc_run": Case("gc_run", _finished, _gc),
    "restore_run": Case("restore_run", _finished, _imported),
    "restore_run_staging": Case("save_checkpoint", _finished, _imported),
    "fork_run_restore": Case("restore_run", _pooled, _forked),
    "fork_run_staging": Case("save_checkpoint", _pooled, _forked),
    "fork_run_join": Case("join_pool", _pooled, _forked),
    "fork_run_submit": Case("submit_agents", _pooled, _forked),
    "index_status": Case("index_status", Ctx.bound, lambda c: c.backend.cancel()),
    "index_status_delete": Case("index_status", Ctx.bound, lambda c: c.backend.delete_run()),
    "join_pool": Case("join_pool", Ctx.bound,
                      lambda c: c.backend.join_pool("fm", weight=2, max_leases=3)),
    "join_pool_move": Case("join_pool", _pooled, lambda c: c.backend.join_pool("other")),
    "leave_pool": Case("join_pool", _pooled, lambda c: c.backend.leave_pool()),
    "pool_add_submit": Case("pool_add", _joined, lambda c: c.backend.submit_agents(
        [AgentTask(AGENTS[i], 1, {"i": i}) for i in range(3)])),
    "pool_add_leave": Case("pool_add", _pooled, lambda c: c.backend.join_pool("other")),
    "claim_agent_pool_wait": Case("claim_agent", _pooled_busy, lambda c: _lease_view(
        c.make(watch=False).claim_agent("worker-1", pool="fm", lease_for=60.0))),
    "pool_pick": Case("pool_pick", _pooled, lambda c: _lease_view(
        c.make(watch=False).claim_agent("worker-1", pool="fm", lease_for=60.0))),
    "pool_pick_empty": Case("pool_pick", _joined, lambda c: _lease_view(
        c.make(watch=False).claim_agent("worker-1", pool="fm", lease_for=60.0))),
    "pool_lease_limit": Case("pool_lease", _pooled,
                             lambda c: c.backend.configure_pool("fm", max_leases=3)),
    "pool_lease_claim": Case("pool_lease", _capped, lambda c: _lease_view(
        c.make(watch=False).claim_agent("worker-1", pool="fm", lease_for=60.0))),
    "pool_lease_end": Case("pool_lease", _capped_claimed, lambda c: (
        c.backend.append_event(_done(0) if c.lease.agent_id == AGENTS[0] else _done(1),
                               lease=c.lease), _lease_view(c.lease))),
    "limit_set": Case("limit_set", Ctx.bound, lambda c: c.backend.set_rate_limit(
        "fm-model", requests_per_minute=60, tokens_per_minute=1000, burst=2.5)),
    "limit_take_claim": Case("limit_take", _limited, lambda c: _lease_view(
        c.backend.claim_agent("worker-1", lease_for=60.0))),
    "limit_take_refused": Case("limit_take", _limited_claimed, lambda c: _lease_view(
        c.backend.claim_agent("worker-1", lease_for=60.0))),
    "limit_take_settle": Case("limit_take", _limited_claimed, lambda c: (
        c.backend.append_event(_done(0), lease=c.lease), _lease_view(c.lease))),
}  # fmt: skip


def test_every_writing_operation_has_a_case() -> None:
    """An operation added to the library without a case here fails the suite."""
    assert set(WRITING) == {case.op for case in CASES.values()}


# -------------------------------------------------------------------------- the outcome


def _masked_checkpoint(cp: Any) -> Any:
    if cp is None:
        return None
    data = checkpoint_json(cp)
    for name in ("created_at", "updated_at"):
        data[name] = "<server time>"
    for result in data["agent_results"].values():  # an agent_done's: the server clock
        result["completed_at"] = "<server time>"
    return data


def _index(direct: Any) -> Any:
    """The run's index entry (present? its stored status) and the status counts."""
    entry = direct.hget(run_status_key(PREFIX), str(RUN))
    listed = direct.zscore(run_index_key(PREFIX), str(RUN)) is not None
    counts = read_counts(direct, PREFIX, count=False)
    status = None if entry is None else entry.split()[-1]
    return listed, status, dataclasses.asdict(counts)


def _pools(direct: Any) -> dict[str, Any]:
    """The pools' indexes (the cases use "fm" and "other"): what the ready set holds, with
    its scores (the fair shares), who sleeps, the members, the versions of the wake tags and
    the last picks (incarnations and sleep times differ from run to run: masked)."""
    out: dict[str, Any] = {}
    for name in ("fm", "other"):
        keys = pool_keys(PREFIX, name)
        index = {k: (v.split()[-1] if k.endswith(b":t") else v)
                 for k, v in direct.hgetall(keys.pool).items()}  # fmt: skip
        picks = sorted(re.sub(rb"^(\d+ ~ )\d+", rb"\1<ms>", direct.get(k))  # (a wait: time)
                       for k in direct.scan_iter(match=keys.pick_memo("*")))  # fmt: skip
        leases = sorted(direct.zrange(keys.leases, 0, -1))  # (expiries: server times)
        out[name] = (index, direct.zrange(keys.ready, 0, -1, withscores=True),
                     direct.zrange(keys.sleep, 0, -1), sorted(direct.smembers(keys.members)),
                     picks, leases)  # fmt: skip
    return out


def _limiters(direct: Any) -> Any:
    """The rate limiter "fm-model": its rates and counters (its arrival times and the takes'
    memos hold server times: left out)."""
    return direct.hmget(limiter_key(PREFIX, "fm-model"), "requests_per_minute",
                        "tokens_per_minute", "burst_ms", "admitted", "waits", "tokens")  # fmt: skip


def _stored(direct: Any) -> dict[str, Any]:
    """What a fresh reader finds: the run, its log, its tasks, its version and lease counter,
    and its index entry."""
    from luft_redis import RedisCheckpointBackend

    reader = RedisCheckpointBackend(direct, watch=False)
    try:
        cp = reader.open_run(RUN)
        found: dict[str, Any] = {"checkpoint": _masked_checkpoint(cp)}
        if cp is not None:
            found["log"] = [e.to_json() for e in reader.get_event_log()]
            found["tasks"] = [dataclasses.replace(task, expires_at=None)
                              for task in reader.agent_tasks()]  # fmt: skip
        run = run_keys(PREFIX, RUN).run
        found["version"] = direct.hmget(run, "version", "lease_token", "status")
        found["index"] = _index(direct)
        found["pools"] = _pools(direct)
        found["limiters"] = _limiters(direct)
        return found
    finally:
        reader.close()


def _outcome(ctx: Ctx, case: Case) -> dict[str, Any]:
    try:
        value: Any = ("returned", case.act(ctx))
    except Exception as exc:  # the class is the outcome; the message may name the attempt
        value = ("raised", type(exc).__name__)
    backend = ctx.backend
    cache = None
    if backend is not None and backend.run_id is not None:  # as the write left it
        cache = _masked_checkpoint(backend.get_checkpoint())
    return {"value": value, "cache": cache, "stored": _stored(ctx.direct)}


def _empty(direct: Any) -> None:
    if isinstance(direct, RedisCluster):
        direct.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        direct.flushall()


@pytest.fixture
def injector(monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultInjector]:
    with FaultInjector().installed(monkeypatch) as installed:
        yield installed


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_fault_changes_nothing_the_caller_sees(
    name: str, fault: str, frontend: str, redis_client: Any,
    make_frontend_backend: Callable[..., Any], injector: FaultInjector,
) -> None:  # fmt: skip
    case = CASES[name]
    if frontend not in case.frontends:
        pytest.skip(f"{name}: no {frontend} API for {case.op} yet (sync-only tool)")
    function = getattr(library().ops, case.op).name
    outcomes = []
    for mode in (None, fault):
        _empty(redis_client)
        ctx = Ctx(redis_client, make_frontend_backend, frontend)
        case.setup(ctx)
        if mode is not None:
            injector.arm(function, mode)
        outcomes.append(_outcome(ctx, case))
        injector.deliver()  # a held request that no retry followed arrives in the end
        outcomes[-1]["stored after a late request"] = _stored(redis_client)
        if mode is not None:
            assert injector.fired == 1, f"{name}: {case.op} was never called"
    baseline, faulted = outcomes
    for part in baseline:
        assert faulted[part] == baseline[part], f"{part}: {faulted[part]} != {baseline[part]}"
    stored = faulted["stored"]["checkpoint"]
    if baseline["cache"] is not None and stored is not None:  # (a deleted run's cache keeps
        assert faulted["cache"] == stored  # its last state, marked stale)
