"""Crashes of the Redis server under concurrent writers, and a flushed Functions library.

* ``test_sigkill_restart_loses_no_acknowledged_write``: a private redis-server with
  ``appendonly yes`` and ``appendfsync always``; three writer processes (``spawn``) append
  numbered events to one run; the server is SIGKILLed mid-run and restarted on the same port
  and directory half a second later. Every event whose ``append_event`` returned must be in the
  log exactly once, the token sum must match the log, no error may reach a caller, the
  Functions library must be there after the restart (Redis keeps it in the AOF), and every
  writer's cache must converge to a fresh ``open_run`` (their change listeners reconnect).
* ``test_function_flush_mid_run``: ``FUNCTION FLUSH`` while a backend writes; writes keep
  working (each backend loads the library again on "Function not found").

The writer processes run this very file with :func:`runpy.run_path` (under the module name
``_WORKER_RUN_NAME``), so they need nothing importable but ``luft_redis``: pytest imports test
files with ``--import-mode=importlib``, which a spawned child could not import by name.
"""

from __future__ import annotations

import logging
import multiprocessing
import runpy
import time
import traceback
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from luft_redis import (
    AgentDone,
    AgentStatus,
    Log,
    LogLevel,
    LuftRedisError,
    RedisCheckpointBackend,
    TokenUsage,
)
from luft_redis import types as t
from luft_redis.retry import RetryPolicy
from luft_redis.scripts import library, listed_libraries
from luft_redis.tools.server import LOOPBACK, LocalRedisServer

_WORKER_RUN_NAME = "__luft_redis_crash_writer__"

WRITERS = 3
EVENTS_PER_WRITER = 400
PACE = 0.002  # seconds between a writer's appends, so the crash lands mid-run
DOWNTIME = 0.5  # seconds between SIGKILL and restart

#: Retries in the writers: enough to ride out a restart (and the AOF replay).
CRASH_RETRY = RetryPolicy(max_attempts=10_000, deadline=20.0, initial_delay=0.01, max_delay=0.25)


def _agent(writer: int, k: int) -> uuid.UUID:
    return uuid.UUID(int=((writer + 1) << 64) | k)


def _event(run_id: uuid.UUID, writer: int, k: int) -> t.AgentEvent:
    """Writer ``writer``'s ``k``-th event, identified by :func:`_ident`."""
    name = f"w{writer}-{k}"
    if k % 2 == 0:
        return Log(run_id=run_id, level=LogLevel.INFO, msg=name)
    return AgentDone(
        run_id=run_id, agent_id=_agent(writer, k), status=AgentStatus.OK, name=name,
        tokens=TokenUsage(input=k + 1, output=writer + 1), elapsed_ms=k,
    )  # fmt: skip


def _ident(event: t.AgentEvent) -> str:
    if isinstance(event, Log):
        return event.msg
    if isinstance(event, AgentDone) and event.name is not None:
        return event.name
    raise AssertionError(f"unexpected event in the log: {event!r}")


class _RetryCounter(logging.Handler):
    """Counts the retries logged by luft_redis.retry."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _writer_main(
    *, port: int, run_id: str, index: int, count: int, go: Any, barrier: Any, out: Any
) -> None:
    """One writer process: open the run, append ``count`` events, then report."""
    report: dict[str, Any] = {"index": index, "acked": [], "failed": [], "errors": []}
    counter = _RetryCounter()
    retry_logger = logging.getLogger("luft_redis.retry")
    retry_logger.setLevel(logging.INFO)
    retry_logger.addHandler(counter)
    # writer 0 keeps redis-py's own retries (3, up to 0.5 s apart) under luft's; the others
    # turn them off, so luft's RetryPolicy alone rides out the crash
    extra: dict[str, Any] = {} if index == 0 else {"retry": Retry(NoBackoff(), 0)}
    client = redis.Redis(
        host=LOOPBACK, port=port, socket_timeout=5, socket_connect_timeout=2, **extra
    )
    try:
        rid = uuid.UUID(run_id)
        backend = RedisCheckpointBackend(client, retry=CRASH_RETRY)
        if backend.open_run(rid) is None:
            raise AssertionError("the run is missing")
        out.put(("ready", index))
        if not go.wait(60):
            raise AssertionError("no go signal")
        started = time.monotonic()
        for k in range(count):
            try:
                backend.append_event(_event(rid, index, k))
                report["acked"].append(k)
            except LuftRedisError as exc:
                report["failed"].append(k)
                report["errors"].append(f"append {k}: {exc!r}")
            time.sleep(PACE)
        report["write_seconds"] = time.monotonic() - started
        barrier.wait(timeout=60)  # every writer is done: the run is final
        keys = backend.keys
        assert keys is not None
        raw = client.hget(keys.run, "version")
        target = int(raw) if raw is not None else -1
        deadline = time.monotonic() + 15
        while backend.version < target and time.monotonic() < deadline:
            backend.wait_for_change(timeout=0.5)
        settle = time.monotonic() + 5
        while not backend.cache_is_fresh and time.monotonic() < settle:
            time.sleep(0.05)
        cp = backend.get_checkpoint()
        report.update(
            target=target, version=backend.version, fresh=backend.cache_is_fresh,
            checkpoint=None if cp is None else cp.to_json(), retries=counter.count,
        )  # fmt: skip
        backend.close()
    except BaseException:
        report["errors"].append("fatal: " + traceback.format_exc())
    finally:
        client.close()
        out.put(("done", report))


def _xlen(client: redis.Redis, key: str) -> int:
    try:
        return int(client.xlen(key))
    except redis.RedisError:
        return -1


@pytest.mark.server
@pytest.mark.slow
def test_sigkill_restart_loses_no_acknowledged_write(redis_server_binary: str) -> None:
    server = LocalRedisServer(binary=redis_server_binary, appendonly=True, appendfsync="always")
    server.start()
    procs: list[Any] = []
    try:
        port = server.port
        admin = redis.Redis(host=LOOPBACK, port=port, socket_timeout=5)
        run_id = uuid.uuid4()
        creator = RedisCheckpointBackend(admin, watch=False)
        creator.init_run(run_id, "crash test", "/tmp/crash")
        keys = creator.keys
        assert keys is not None

        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        go = ctx.Event()
        barrier = ctx.Barrier(WRITERS)
        for index in range(WRITERS):
            params = dict(port=port, run_id=str(run_id), index=index, count=EVENTS_PER_WRITER,
                          go=go, barrier=barrier, out=out)  # fmt: skip
            proc = ctx.Process(
                target=runpy.run_path, args=(__file__,),
                kwargs={"init_globals": {"_WORKER_ARGS": params}, "run_name": _WORKER_RUN_NAME},
                daemon=True,
            )  # fmt: skip
            proc.start()
            procs.append(proc)

        reports: dict[int, dict[str, Any]] = {}
        ready = 0
        deadline = time.monotonic() + 60
        while ready < WRITERS:
            kind, payload = out.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind == "ready":
                ready += 1
            else:  # a writer failed before it was ready
                reports[payload["index"]] = payload
                raise AssertionError(f"writer failed early: {payload['errors']}")

        total = WRITERS * EVENTS_PER_WRITER
        go.set()
        started = time.monotonic()
        at_kill = 0
        while time.monotonic() - started < 30:
            at_kill = _xlen(admin, keys.events)
            if at_kill >= total // 3:
                break
            time.sleep(0.005)
        server.kill()
        killed = time.monotonic()
        time.sleep(DOWNTIME)
        server.start()
        restarted = time.monotonic()
        after_restart = _xlen(admin, keys.events)

        deadline = time.monotonic() + 90
        while len(reports) < WRITERS:
            kind, payload = out.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind == "done":
                reports[payload["index"]] = payload
        for proc in procs:
            proc.join(timeout=10)

        # -- what the server kept
        reader = RedisCheckpointBackend(admin, watch=False)
        fresh = reader.open_run(run_id)
        assert fresh is not None
        log = reader.get_event_log()
        counts = Counter(_ident(e) for e in log)
        acked = {f"w{r['index']}-{k}" for r in reports.values() for k in r["acked"]}
        failed = {f"w{r['index']}-{k}" for r in reports.values() for k in r["failed"]}
        print(
            f"\nkilled at XLEN {at_kill}/{total} after {killed - started:.2f}s, "
            f"down {restarted - killed:.2f}s, XLEN {after_restart} after restart; "
            f"acked {len(acked)}, failed {len(failed)}, log {len(log)}, "
            f"luft retries by writer {[reports[i].get('retries') for i in sorted(reports)]}, "
            f"write time {[round(reports[i].get('write_seconds', 0), 1) for i in sorted(reports)]}s"
        )
        errors = [e for r in reports.values() for e in r["errors"]]
        assert errors == [], errors  # nothing about the restart reached a caller
        assert 0 < at_kill < total, "the crash must land while the writers write"
        assert after_restart >= at_kill  # appendfsync always: nothing acknowledged is lost
        duplicated = {ident: n for ident, n in counts.items() if n > 1}
        assert duplicated == {}
        missing = acked - set(counts)
        assert missing == set()
        assert set(counts) <= acked | failed
        assert len(acked) == total and len(log) == total
        for r in reports.values():  # each writer's events in its order
            mine = [_ident(e) for e in log if _ident(e).startswith(f"w{r['index']}-")]
            assert mine == [f"w{r['index']}-{k}" for k in r["acked"]]
        assert fresh.total_tokens == sum(
            e.tokens.total() for e in log if isinstance(e, AgentDone)
        )
        assert len(fresh.agent_results) == sum(isinstance(e, AgentDone) for e in log)
        assert reader.version == 1 + len(log)  # one version per append, none twice

        # -- every writer's cache converged (its listener reconnected after the restart)
        expected = fresh.to_json()
        for r in reports.values():
            assert r["version"] == r["target"] == reader.version, r["index"]
            assert r["checkpoint"] == expected, r["index"]
            assert r["fresh"], r["index"]

        # -- the library survived the restart with the data (functions are in the AOF)
        assert library().name in listed_libraries(admin.function_list())
        info = admin.info("persistence")
        assert info["aof_enabled"] == 1
        admin.close()
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        server.stop()


@pytest.mark.server
def test_function_flush_mid_run(redis_url: str) -> None:
    """FUNCTION FLUSH every 25 appends: writes go on, each applied once; the backend loads the
    library again on "Function not found"."""
    client = redis.Redis.from_url(redis_url)
    admin = redis.Redis.from_url(redis_url)
    backend = RedisCheckpointBackend(client)
    try:
        run_id = uuid.uuid4()
        backend.init_run(run_id, "script flush", "/tmp/flush")
        name = library().name
        expected: list[t.AgentEvent] = []
        flushes = 0
        for k in range(300):
            if k % 25 == 10:
                admin.function_flush()
                flushes += 1
                assert name not in listed_libraries(admin.function_list())
            event = _event(run_id, 0, k)
            backend.append_event(event)
            expected.append(event)
        assert name in listed_libraries(admin.function_list())
        print(f"\n{flushes} FUNCTION FLUSH during 300 appends")

        reader = RedisCheckpointBackend(admin, watch=False)
        fresh = reader.open_run(run_id)
        assert fresh is not None
        assert reader.get_event_log() == expected
        assert fresh.total_tokens == sum(
            e.tokens.total() for e in expected if isinstance(e, AgentDone)
        )
        assert reader.version == 301
        assert backend.get_checkpoint() == fresh
    finally:
        backend.close()  # its listener (the client's close alone leaves it reconnecting)
        client.close()
        admin.close()


class _FlushAfterLoad(redis.Redis):
    """A client that runs FUNCTION FLUSH right after its next FUNCTION LOAD (once, when armed).

    It makes deterministic the race of a flush (or a restart, or a failover to a replica that
    lacks the library) between the backend's load of the library and its second FCALL.
    """

    armed = False

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        if self.armed and args[:2] == ("FUNCTION", "LOAD"):
            self.armed = False
            self.function_flush()
        return reply


@pytest.mark.server
def test_library_flushed_again_during_reload_is_retried(redis_url: str) -> None:
    client = _FlushAfterLoad.from_url(redis_url)
    assert isinstance(client, _FlushAfterLoad)
    admin = redis.Redis.from_url(redis_url)
    try:
        backend = RedisCheckpointBackend(client, watch=False)
        run_id = uuid.uuid4()
        backend.init_run(run_id, "flush during reload", "/tmp/flush2")
        admin.function_flush()
        client.armed = True
        event = _event(run_id, 0, 1)
        backend.append_event(event)  # FCALL, LOAD (flushed again), FCALL: a retry loads again
        assert not client.armed
        reader = RedisCheckpointBackend(admin, watch=False)
        assert reader.open_run(run_id) is not None
        assert reader.get_event_log() == [event]
    finally:
        client.close()
        admin.close()


if __name__ == _WORKER_RUN_NAME:
    _writer_main(**globals()["_WORKER_ARGS"])
