"""Conformance suite: luft's checkpoint contract (spec §4 and §5) on every Redis target and
both front ends.

Every test that uses a backend runs on fakeredis, a private redis-server and a private 3-master
cluster (``redis_target``), each with the sync ``RedisCheckpointBackend`` and with the asyncio
``AsyncRedisCheckpointBackend`` (``frontend``; the asyncio one behind conftest.py's
``AsyncBackendProxy``, which runs each call on the backend's event loop and awaits it).
``redis_client`` is the sync client for raw inspection on either front end. The tests are
written against :class:`Backend`, what both present.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

import fakeredis
import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

import luft_redis
from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentSessionCheckpoint,
    AgentStarted,
    AgentStatus,
    AsyncRedisCheckpointBackend,
    CheckpointStatus,
    CorruptDataError,
    Finding,
    Location,
    Log,
    LogEntry,
    LogLevel,
    NotResumableError,
    PhaseDone,
    PhaseStarted,
    RedisCheckpointBackend,
    RunCheckpoint,
    RunDone,
    RunExistsError,
    RunMismatchError,
    RunNotBoundError,
    RunStatus,
    Severity,
    SignalReceived,
    TokenUsage,
    ValidationError,
)
from luft_redis import types as t
from luft_redis.index import run_status_key, status_counts_key
from luft_redis.keys import TOMBSTONE_TTL, RunKeys, run_index_key, run_keys, tombstone_key

Client: TypeAlias = "redis.Redis | RedisCluster"

pytestmark = pytest.mark.usefixtures("frontend")  # every test on both front ends (ids: sync-...)


@runtime_checkable
class Backend(Protocol):
    """What these tests use of a backend, with the sync signatures: a ``RedisCheckpointBackend``,
    or conftest.py's ``AsyncBackendProxy`` around an ``AsyncRedisCheckpointBackend``. Both
    are constructed as ``cls(client, **kwargs)`` (see :func:`fresh`)."""

    def __init__(self, client: Any, **kwargs: Any) -> None: ...

    @property
    def client(self) -> Any: ...

    @property
    def prefix(self) -> str: ...

    @property
    def run_id(self) -> uuid.UUID | None: ...

    @property
    def keys(self) -> RunKeys | None: ...

    @property
    def version(self) -> int: ...

    def init_run(self, run_id: uuid.UUID, task: str, run_dir: str) -> None: ...

    def init_run_with_meta(
        self, run_id: uuid.UUID, task: str, run_dir: str, workflow_meta: Any
    ) -> None: ...

    def open_run(self, run_id: uuid.UUID) -> RunCheckpoint | None: ...

    def list_runs(self) -> list[uuid.UUID]: ...

    def delete_run(self, run_id: uuid.UUID | None = None) -> bool: ...

    def append_event(self, event: t.AgentEvent) -> None: ...

    def append_events(self, events: Sequence[t.AgentEvent]) -> None: ...

    def upsert_agent_result(self, cache: AgentResultCache) -> None: ...

    def upsert_agent_session(self, session: AgentSessionCheckpoint) -> None: ...

    def cancel(self) -> None: ...

    def reset_status_to_running(self) -> None: ...

    def save_checkpoint(self, checkpoint: RunCheckpoint) -> None: ...

    def get_event_log(self) -> list[t.AgentEvent]: ...

    def iter_event_log(
        self, *, start: str = ..., page_size: int = ...
    ) -> Iterator[t.AgentEvent]: ...

    def iter_events(
        self, from_id: str | None = None, *, follow: bool = ..., timeout: float | None = ...
    ) -> Iterator[LogEntry]: ...

    def get_checkpoint(self) -> RunCheckpoint | None: ...

    def get_findings(self) -> tuple[Finding, ...]: ...

    def can_resume(self) -> bool: ...

    def close(self) -> None: ...


def _sync_is_a_backend(backend: RedisCheckpointBackend) -> Backend:
    return backend  # mypy checks the sync front end against Backend


Factory: TypeAlias = Callable[..., Backend]

# -------------------------------------------------------------------------------- fixtures


@pytest.fixture
def make_backend(make_frontend_backend: Factory) -> Factory:
    """Backends of the front end under test, ``make(client=None, **kwargs)``: each on its own
    client to the current target unless ``client`` is given (overrides conftest.py's sync-only
    ``make_backend`` for this module)."""
    return make_frontend_backend


@pytest.fixture
def backend(make_backend: Factory, frontend_client: Any) -> Backend:
    """A backend of the front end under test on ``frontend_client`` (for the sync front end,
    ``redis_client`` itself)."""
    made: Backend = make_backend(client=frontend_client)
    return made  # (behind the proxy, a member the asyncio backend lacks fails where it is used)


@pytest.fixture
def run_id() -> uuid.UUID:
    return uuid.uuid4()


@pytest.fixture
def bound(backend: Backend, run_id: uuid.UUID) -> Backend:
    backend.init_run(run_id, "find the bugs", "/runs/x")
    return backend


def fresh(backend: Backend) -> RunCheckpoint:
    """The run as another process would load it now: a new backend of the same front end on the
    same client, not watching, opens it."""
    other = type(backend)(backend.client, prefix=backend.prefix, watch=False)
    assert backend.run_id is not None
    cp = other.open_run(backend.run_id)
    assert cp is not None
    return cp


def finding(title: str, severity: Severity = Severity.MEDIUM) -> Finding:
    return Finding(
        kind="bug", severity=severity, title=title, detail=f"detail of {title}",
        location=Location(file="src/lib.rs", line=42), evidence=("a", "b"),
        data={"n": 1, "tags": ["x"]},
    )  # fmt: skip


def done(
    run_id: uuid.UUID,
    agent_id: uuid.UUID,
    *,
    status: AgentStatus = AgentStatus.OK,
    tokens: tuple[int, int] = (10, 5),
    output: Any = None,
    findings: tuple[Finding, ...] = (),
) -> AgentDone:
    return AgentDone(
        run_id=run_id, agent_id=agent_id, status=status,
        tokens=TokenUsage(input=tokens[0], output=tokens[1], cache_read=7, cache_write=9),
        elapsed_ms=12, output=output, findings=findings,
    )  # fmt: skip


def result(
    agent_id: uuid.UUID, *, findings: tuple[Finding, ...] = (), output: Any = None, phase: int = 3
) -> AgentResultCache:
    return AgentResultCache(
        agent_id=agent_id, phase_id=phase, status="ok", output=output, findings=findings,
        tokens=99, completed_at=1_700_000_000, cache_key_hash="h-" + str(agent_id)[:8],
        description="desc", role="reviewer",
    )  # fmt: skip


def server_now(client: Any) -> int:
    """The server's clock in unix seconds (every target runs on this machine)."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()  # type: ignore[no-untyped-call]
        seconds, _ = client.time(target_nodes=node)
    else:
        seconds, _ = client.time()
    return int(seconds)


# -------------------------------------------------------------------- sample events (§3)

TS = dt.datetime(2025, 1, 2, 3, 4, 5, 123000, tzinfo=dt.UTC)


def every_event(run_id: uuid.UUID) -> list[t.AgentEvent]:
    """One event of each of the 25 variants, with non-default values, plus edge cases."""
    a, b = uuid.uuid4(), uuid.uuid4()
    big = 2**64 - 1
    nested = {"k": [1, -2**63, big, 1.5, None, True, {"deep": ["ü", "日本", "\u0000"]}]}
    return [
        t.RunStarted(run_id=run_id, task="review 🚀", ts=TS),
        t.PhaseStarted(run_id=run_id, phase_id=2**32 - 1, label="scan", planned=3,
                       description="d", role="r", ts=TS),
        t.AgentStarted(run_id=run_id, phase_id=1, agent_id=a, prompt_preview="p", model="m",
                       description="d", role="r", name="n", agent_seq=2**32 - 1, ts=TS),
        t.AgentProgress(run_id=run_id, agent_id=a, delta=t.ProgressMessage(text="hi")),
        t.AgentProgress(run_id=run_id, agent_id=a,
                        delta=t.ProgressToolCall(name="grep", summary="s")),
        t.AgentProgress(run_id=run_id, agent_id=a, delta=t.ProgressFileEdit(path="a.rs")),
        t.AgentProgress(run_id=run_id, agent_id=a,
                        delta=t.ProgressTokens(usage=TokenUsage(input=1, output=2))),
        t.AcpRaw(run_id=run_id, agent_id=a, kind="k", raw=nested),
        t.AcpRequest(run_id=run_id, agent_id=a, method="m", raw=[1, "x"]),
        t.AgentDone(run_id=run_id, agent_id=a, status=AgentStatus.TIMED_OUT,
                    tokens=TokenUsage(input=3, output=4, cache_read=big, cache_write=1),
                    elapsed_ms=big, name="n", agent_seq=3, ts=TS, output=nested,
                    findings=(finding("f1", Severity.CRITICAL),), prompt="p", retry_count=2),
        t.AgentDone(run_id=run_id, agent_id=b, status=AgentStatus.ERROR,
                    tokens=TokenUsage(), elapsed_ms=0),
        t.PhaseDone(run_id=run_id, phase_id=1, ok=2, failed=1, ts=TS),
        t.Log(run_id=run_id, agent_id=None, level=LogLevel.WARN, msg="careful"),
        t.Log(run_id=run_id, agent_id=a, level=LogLevel.TRACE, msg=""),
        t.BudgetSet(run_id=run_id, time_limit_ms=big, max_rounds=None),
        t.ReportEmitted(run_id=run_id, phase_id=1, report={"summary": "ok"}),
        t.ParallelStarted(run_id=run_id, phase_id=1, span_id=big, count=4),
        t.ParallelDone(run_id=run_id, phase_id=1, span_id=9, ok=3, failed=1,
                       results=[{"a": 1}], elapsed_ms=5),
        t.WorkflowStarted(run_id=run_id, span_id=1, path="wf.yaml", args={"x": [1]}),
        t.WorkflowDone(run_id=run_id, span_id=1, path="wf.yaml", report=None,
                       elapsed_ms=3, error="boom"),
        t.ConvergeStarted(run_id=run_id, phase_id=1, span_id=2, items=5, max_rounds=3),
        t.ConvergeDone(run_id=run_id, phase_id=1, span_id=2, rounds=2, converged=True,
                       surviving=1, result={"r": 1.25}, elapsed_ms=8, error=None),
        t.PipelineStarted(run_id=run_id, total_stages=2, items=10),
        t.PipelineStageStarted(run_id=run_id, stage_index=0, label="s", agents_in_stage=3),
        t.PipelineItemDone(run_id=run_id, stage_index=0, item_index=1,
                           status=AgentStatus.CANCELLED, tokens=TokenUsage(input=1),
                           elapsed_ms=2),
        t.PipelineDone(run_id=run_id, stages_completed=2, total_ok=9, total_failed=1),
        t.SchemaRetry(run_id=run_id, agent_id=a, attempt=1, max=3),
        t.PlanPreview(run_id=run_id, reasoning="because",
                      phases=(t.PlanPhase(label="a", dynamic=True, description="x"),
                              t.PlanPhase(label="b"))),
        t.SignalReceived(run_id=None, signal="SIGINT", ts=TS),
        t.SignalReceived(run_id=run_id, signal="SIGTERM"),
        t.RunDone(run_id=run_id, status=RunStatus.PARTIAL,
                  total_tokens=TokenUsage(input=1, output=1), report={"partial": True}),
    ]  # fmt: skip


# ------------------------------------------------------------------------------ lifecycle


def test_every_event_variant_round_trips_through_redis(
    bound: Backend, run_id: uuid.UUID
) -> None:
    events = every_event(run_id)
    assert {e.TYPE for e in events} == set(t.EVENT_TYPES)
    for event in events:
        bound.append_event(event)
    log = bound.get_event_log()
    assert log == events
    assert [e.to_json() for e in log] == [e.to_json() for e in events]


CHRONO_TS = [  # every number of fraction digits chrono writes, and the ends of the range
    "2026-01-02T03:04:05Z", "2026-01-02T03:04:05.123Z", "2026-01-02T03:04:05.123456Z",
    "2026-01-02T03:04:05.123456789Z", "2026-01-02T03:04:05.000000001Z",
    "1969-12-31T23:59:59.999999999Z", "0001-01-01T00:00:00.000000001Z",
    "9999-12-31T23:59:59.999999999Z", "1970-01-01T00:00:00Z",
]  # fmt: skip


def test_timestamps_keep_full_precision_through_redis(
    bound: Backend, run_id: uuid.UUID, make_backend: Factory
) -> None:
    """luft's ts round-trips nine fraction digits: what goes in as JSON comes back as chrono
    writes it, from this process and from another one."""
    objs = [{"type": "phase_done", "run_id": str(run_id), "phase_id": 1, "ok": 0, "failed": 0,
             "ts": ts} for ts in CHRONO_TS]  # fmt: skip
    bound.append_events([t.AgentEvent.from_json(o) for o in objs])
    now = t.RunStarted(run_id=run_id, task="now")  # built in Python: now, to the nanosecond
    bound.append_event(now)
    for reader in (bound, make_backend()):
        if reader is not bound:
            reader.open_run(run_id)
        log = reader.get_event_log()
        assert [e.to_json() for e in log[:-1]] == objs
        assert log[-1] == now and log[-1].to_json()["ts"] == now.to_json()["ts"]


def test_event_log_pages_keep_order(bound: Backend, run_id: uuid.UUID) -> None:
    events = [Log(run_id=run_id, level=LogLevel.INFO, msg=f"m{i}") for i in range(23)]
    for event in events:
        bound.append_event(event)
    assert list(bound.iter_event_log(page_size=5)) == events
    assert list(bound.iter_event_log(page_size=23)) == events
    with pytest.raises(ValidationError):
        list(bound.iter_event_log(page_size=0))


def test_event_log_from_a_stream_id(bound: Backend, run_id: uuid.UUID) -> None:
    events = [Log(run_id=run_id, level=LogLevel.INFO, msg=f"m{i}") for i in range(5)]
    bound.append_events(events)
    bound.append_events([])  # nothing to do
    entries = list(bound.iter_events(follow=False))
    assert [entry.event for entry in entries] == events
    assert len({entry.id for entry in entries}) == 5
    assert list(bound.iter_events(entries[1].id, follow=False)) == entries[2:]  # after the id
    assert list(bound.iter_event_log(start=entries[3].id)) == events[3:]  # from the id
    assert list(bound.iter_events("$", timeout=0.05)) == []  # nothing new


def test_delete_run_removes_the_run_and_unbinds(
    redis_client: Client, bound: Backend, run_id: uuid.UUID, make_backend: Factory
) -> None:
    for event in every_event(run_id):
        bound.append_event(event)
    kept = uuid.uuid4()
    make_backend(client=bound.client, watch=False).init_run(kept, "kept", "/d")
    assert bound.list_runs() == sorted([run_id, kept])
    assert bound.delete_run() is True
    assert bound.run_id is None and bound.get_checkpoint() is None
    # only the tombstone is left (a retried delete gets its first answer), and it expires
    tombstone = tombstone_key("luft", run_id).encode()
    assert list(redis_client.scan_iter(match=f"*{run_id}*", count=1000)) == [tombstone]
    assert 0 < int(redis_client.ttl(tombstone)) <= TOMBSTONE_TTL
    assert bound.list_runs() == [kept]
    assert bound.delete_run(run_id) is False
    assert bound.open_run(run_id) is None and bound.run_id is None
    with pytest.raises(RunNotBoundError):
        bound.delete_run()
    assert bound.open_run(kept) is not None and bound.delete_run(kept) is True
    assert bound.list_runs() == []


def test_init_run_creates_an_empty_running_run(
    redis_client: Client, backend: Backend, run_id: uuid.UUID
) -> None:
    before = server_now(redis_client)
    backend.init_run(run_id, "task ü", "/runs/1")
    cp = backend.get_checkpoint()
    assert cp is not None
    assert cp.run_id == run_id and cp.task == "task ü"
    assert cp.status is CheckpointStatus.RUNNING and cp.current_phase == 0
    assert cp.completed_phases == () and dict(cp.agent_results) == {}
    assert dict(cp.agent_sessions) == {} and cp.findings == () and cp.started_agent_ids == ()
    assert cp.total_tokens == 0 and cp.workflow_meta is None
    assert cp.created_at == cp.updated_at and before <= cp.created_at <= server_now(redis_client)
    assert fresh(backend) == cp
    assert backend.get_event_log() == []


def test_init_run_with_meta_stores_meta_atomically(
    backend: Backend, run_id: uuid.UUID
) -> None:
    meta = {"workflow": "review", "steps": [{"n": 1}, {"n": 2}], "big": 2**64 - 1}
    backend.init_run_with_meta(run_id, "t", "/d", meta)
    cp = backend.get_checkpoint()
    assert cp is not None and cp.workflow_meta == meta
    assert fresh(backend).workflow_meta == meta


def test_init_of_an_existing_run_fails_and_changes_nothing(
    bound: Backend, run_id: uuid.UUID, make_backend: Factory
) -> None:
    bound.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="x"))
    before = fresh(bound)
    other = make_backend()
    with pytest.raises(RunExistsError):
        other.init_run(run_id, "another task", "/elsewhere")
    with pytest.raises(RunExistsError):
        other.init_run_with_meta(run_id, "another task", "/elsewhere", {"a": 1})
    assert other.get_checkpoint() is None
    assert fresh(bound) == before
    assert len(bound.get_event_log()) == 1
    # the error names the run, and a bound backend stays bound exactly as it was
    with pytest.raises(RunExistsError, match=str(run_id)):
        bound.init_run(run_id, "again", "/again")
    assert bound.run_id == run_id and bound.get_checkpoint() == before
    bound.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="still bound"))
    assert len(bound.get_event_log()) == 2


def test_every_failed_init_run_leaves_the_backend_as_it_was(
    bound: Backend, run_id: uuid.UUID, make_backend: Factory, redis_client: Any
) -> None:
    """Bound to run A: an init_run of another existing run B, of a too large payload, of a
    lone surrogate, or over a key of the wrong type fails, and the backend stays bound to A
    exactly as it was (and its writes still go to A)."""
    bound.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="a"))
    before = bound.get_checkpoint()
    other_run = uuid.uuid4()
    make_backend().init_run(other_run, "b", "/b")
    stray = uuid.uuid4()
    redis_client.set(run_keys("luft", stray).events, b"not a stream")
    failing: list[tuple[Callable[[], object], type[Exception]]] = [
        (lambda: bound.init_run(other_run, "again", "/again"), RunExistsError),
        (lambda: bound.init_run_with_meta(uuid.uuid4(), "t", "/d", {"x": "y" * (5 << 20)}),
         ValidationError),
        (lambda: bound.init_run(uuid.uuid4(), "\ud800", "/d"), ValidationError),
        (lambda: bound.init_run(stray, "t", "/d"), CorruptDataError),
    ]  # fmt: skip
    for call, error in failing:
        with pytest.raises(error):
            call()
        assert bound.run_id == run_id and bound.get_checkpoint() == before
    bound.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="still a"))
    assert [e.msg for e in bound.get_event_log() if isinstance(e, Log)] == ["a", "still a"]
    assert redis_client.type(run_keys("luft", stray).events) == b"string"  # left as it was


def test_open_run_of_a_missing_run_is_none(backend: Backend) -> None:
    assert backend.open_run(uuid.uuid4()) is None
    assert backend.get_checkpoint() is None and backend.run_id is None


def test_open_run_binds_and_loads_without_the_log(
    bound: Backend, run_id: uuid.UUID, make_backend: Factory
) -> None:
    for event in every_event(run_id):
        bound.append_event(event)
    other = make_backend()
    cp = other.open_run(run_id)
    assert cp == bound.get_checkpoint()
    assert other.run_id == run_id and other.get_checkpoint() == cp


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.append_event(Log(run_id=uuid.uuid4(), level=LogLevel.INFO, msg="x")),
        lambda b: b.upsert_agent_result(result(uuid.uuid4())),
        lambda b: b.upsert_agent_session(
            AgentSessionCheckpoint(agent_id=uuid.uuid4(), session_id="s", status="x",
                                   updated_at=1)),
        lambda b: b.get_event_log(),
        lambda b: b.reset_status_to_running(),
        lambda b: b.cancel(),
    ],
    ids=["append_event", "upsert_agent_result", "upsert_agent_session", "get_event_log",
         "reset_status_to_running", "cancel"],
)
def test_unbound_operations_fail_clearly(
    backend: Backend, call: Callable[[Backend], Any]
) -> None:
    with pytest.raises(RunNotBoundError, match="init_run"):
        call(backend)


def test_unbound_reads_and_save(backend: Backend, run_id: uuid.UUID) -> None:
    assert backend.get_checkpoint() is None
    assert tuple(backend.get_findings()) == ()
    assert backend.can_resume() is False
    cp = RunCheckpoint(
        run_id=run_id, task="t", status=CheckpointStatus.RUNNING, current_phase=0,
        completed_phases=(), agent_results={}, findings=(), total_tokens=0, created_at=0,
        updated_at=0,
    )  # fmt: skip
    with pytest.raises(RunNotBoundError):
        backend.save_checkpoint(cp)


def test_list_runs(backend: Backend, make_backend: Factory) -> None:
    ids = sorted(uuid.uuid4() for _ in range(5))
    for rid in ids:
        make_backend(client=backend.client).init_run(rid, "t", "/d")
    make_backend(client=backend.client, prefix="other").init_run(uuid.uuid4(), "t", "/d")
    assert backend.list_runs() == ids


def test_all_keys_of_a_run_share_one_slot(
    redis_client: Client, bound: Backend, run_id: uuid.UUID
) -> None:
    for event in every_event(run_id):
        bound.append_event(event)
    bound.upsert_agent_session(
        AgentSessionCheckpoint(agent_id=uuid.uuid4(), session_id="s", status="x", updated_at=1)
    )
    keys = run_keys("luft", run_id)
    assert all(f"{{{run_id}}}" in k for k in keys)
    assert len({key_slot(k.encode()) for k in keys}) == 1
    stored = [k.decode() for k in redis_client.scan_iter(match="*", count=1000)]
    # besides the run's keys, only the prefix's run index (its own slot, luft_redis.index)
    index_keys = {run_index_key("luft"), run_status_key("luft"), status_counts_key("luft")}
    assert stored and set(stored) - index_keys <= set(keys)


def test_redis_cli_sees_plain_text(
    redis_client: Client, bound: Backend, run_id: uuid.UUID
) -> None:
    bound.append_event(done(run_id, uuid.uuid4(), tokens=(100, 23)))
    assert bound.keys is not None
    fields: Any = redis_client.hgetall(bound.keys.run)
    assert fields[b"status"] == b"running"
    assert fields[b"task"] == b"find the bugs"
    assert fields[b"total_tokens"] == b"123"
    assert fields[b"run_id"] == str(run_id).encode()
    assert fields[b"schema"] == b"1"
    entries: Any = redis_client.xrange(bound.keys.events)
    [(_, entry)] = entries
    assert entry[b"type"] == b"agent_done"


def construct(frontend: str, *, decode_responses: bool = False, **kwargs: Any) -> object:
    """A backend of ``frontend`` on a new fakeredis client, made directly (no loop is needed
    to construct either)."""
    if frontend == "sync":
        return RedisCheckpointBackend(fakeredis.FakeRedis(decode_responses=decode_responses),
                                      **kwargs)  # fmt: skip
    return AsyncRedisCheckpointBackend(fakeredis.FakeAsyncRedis(decode_responses=decode_responses),
                                       **kwargs)  # fmt: skip


def test_client_with_decode_responses_is_refused(frontend: str) -> None:
    with pytest.raises(luft_redis.ConfigurationError, match="decode_responses"):
        construct(frontend, decode_responses=True)


@pytest.mark.parametrize("prefix", ["", "a{b", "x y", "p*", "a\\b", "\\", "p\ud800"])
def test_bad_prefix_is_refused(frontend: str, prefix: str) -> None:
    with pytest.raises(luft_redis.ConfigurationError):
        construct(frontend, prefix=prefix)


def test_list_runs_under_a_prefix_with_odd_characters(redis_client: Client) -> None:
    """Every prefix check_prefix lets through is found again by SCAN MATCH."""
    for prefix in ("luft", "a:b", "tenant-1.x_y", "ü/é", "a%b^c$d|e(f)"):
        backend = RedisCheckpointBackend(redis_client, prefix=prefix)
        run = uuid.uuid4()
        backend.init_run(run, "t", "d")
        assert backend.list_runs() == [run], prefix
        backend.delete_run()


def test_lone_surrogates_in_arguments_are_refused_before_anything_is_written(
    redis_client: Client, backend: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    with pytest.raises(luft_redis.ValidationError) as info:
        backend.init_run(run_id, "bad \ud800 task", "/tmp/run")
    assert info.value.field == "task"
    with pytest.raises(luft_redis.ValidationError) as info:
        backend.init_run(run_id, "task", "/tmp/\udfff")
    assert info.value.field == "run_dir"
    with pytest.raises(luft_redis.ValidationError) as info:
        backend.init_run_with_meta(run_id, "task", "/tmp", {"k": ["\ud800"]})
    assert info.value.field == "workflow_meta.k[0]"
    assert backend.open_run(run_id) is None
    assert list(redis_client.scan_iter(match="*")) == []


# ------------------------------------------------------------------------- rules of §5


def _dump_keys(client: Any, keys: RunKeys) -> dict[str, Any]:
    """Every key of the run as Redis holds it (DUMP), to prove nothing was written."""
    return {name: client.dump(key) for name, key in zip(RunKeys._fields, keys, strict=True)}


@pytest.mark.parametrize(
    "name", ["run", "events", "phases", "results", "sessions", "started", "writers", "tasks",
             "queue"]
)
def test_every_operation_reports_a_key_of_the_wrong_type_by_name(
    redis_client: Client, bound: Backend, run_id: uuid.UUID, make_backend: Factory, name: str
) -> None:
    """A stray key of the wrong type under the run's keys is CorruptDataError naming it, from
    every operation and from open_run, before anything is written (issue 10, section 3).
    append_event checks the keys it reads or writes (issue 21: no probe of the others); over
    a stray key it does not touch it succeeds and leaves that key as it was."""
    agent = uuid.uuid4()
    bound.append_event(AgentStarted(run_id=run_id, phase_id=0, agent_id=agent,
                                    prompt_preview="p", model="m"))  # fmt: skip
    saved = bound.get_checkpoint()
    assert saved is not None
    key = getattr(run_keys("luft", run_id), name)
    redis_client.delete(key)
    redis_client.set(key, b"stray string")
    before = _dump_keys(redis_client, run_keys("luft", run_id))
    session = AgentSessionCheckpoint(agent_id=agent, session_id="s", status="x", updated_at=1)
    append_touches = name in APPEND_DONE_KEYS
    operations: list[tuple[str, Callable[[], object]]] = [
        *([("append_event", lambda: bound.append_event(done(run_id, agent)))]
          if append_touches else []),
        ("upsert_agent_result", lambda: bound.upsert_agent_result(result(agent))),
        ("upsert_agent_session", lambda: bound.upsert_agent_session(session)),
        ("cancel", bound.cancel),
        ("reset_status_to_running", bound.reset_status_to_running),
        ("save_checkpoint", lambda: bound.save_checkpoint(saved)),
        ("open_run", lambda: make_backend(client=bound.client, watch=False).open_run(run_id)),
    ]
    if name == "events":
        operations.append(("get_event_log", bound.get_event_log))
    for operation, call in operations:
        with pytest.raises(CorruptDataError) as info:
            call()
        assert info.value.key == key, operation
        assert key in str(info.value), operation
        assert _dump_keys(redis_client, run_keys("luft", run_id)) == before, operation
    if not append_touches:  # written around the stray key, which stays as it was
        stray = redis_client.dump(key)
        bound.append_event(done(run_id, agent))
        assert redis_client.dump(key) == stray
        with pytest.raises(CorruptDataError) as info:
            make_backend(client=bound.client, watch=False).open_run(run_id)
        assert info.value.key == key
    redis_client.delete(key)
    if name != "run":  # a missing hash or stream is empty: the run works again
        bound.append_event(done(run_id, uuid.uuid4()))


APPEND_DONE_KEYS = {"run", "events", "results", "started", "writers"}
"""The keys an unfenced append_event of an agent_done without findings reads or writes."""


_ALL_RUN_KEYS = list(RunKeys._fields)


@pytest.mark.parametrize("name", _ALL_RUN_KEYS)
def test_init_run_over_a_stray_key_of_the_wrong_type_names_it_and_writes_nothing(
    redis_client: Client, make_backend: Factory, name: str
) -> None:
    """init_run of a new id whose key ``name`` already holds a string (a stray key of the
    wrong type): CorruptDataError naming the key, nothing written, the backend unbound."""
    run_id = uuid.uuid4()
    keys = run_keys("luft", run_id)
    key = getattr(keys, name)
    redis_client.set(key, b"stray string")
    before = _dump_keys(redis_client, keys)
    backend = make_backend(watch=False)
    with pytest.raises(CorruptDataError) as info:
        backend.init_run(run_id, "t", "/d")
    assert info.value.key == key and key in str(info.value)
    assert "string" in str(info.value)
    assert _dump_keys(redis_client, keys) == before
    assert redis_client.get(key) == b"stray string"
    assert backend.run_id is None and backend.get_checkpoint() is None
    redis_client.delete(key)  # once the stray key is gone, the same id can be created
    backend.init_run(run_id, "t", "/d")
    created = backend.get_checkpoint()
    assert created is not None and created.status is CheckpointStatus.RUNNING


@pytest.mark.parametrize("name", _ALL_RUN_KEYS)
def test_delete_run_clears_a_run_with_a_key_of_the_wrong_type(
    redis_client: Client, bound: Backend, run_id: uuid.UUID, make_backend: Factory, name: str
) -> None:
    """delete_run is the way to clear a damaged run (lua/delete_run-13.lua): a key of the
    wrong type is deleted like the others, not a CorruptDataError; every key of the run goes
    and the id can be created again."""
    bound.append_event(done(run_id, uuid.uuid4()))
    keys = run_keys("luft", run_id)
    key = getattr(keys, name)
    redis_client.delete(key)
    redis_client.set(key, b"stray string")
    deleter = make_backend(watch=False)
    assert deleter.delete_run(run_id) is True  # the run hash existed (even as a string)
    assert {n: redis_client.exists(k) for n, k in zip(RunKeys._fields, keys, strict=True)
            if n != "changes"} == dict.fromkeys(_ALL_RUN_KEYS, 0)  # fmt: skip
    assert make_backend(watch=False).open_run(run_id) is None
    again = make_backend(watch=False)
    again.init_run(run_id, "again", "/d")
    assert again.get_checkpoint() == fresh(again) and fresh(again).task == "again"


def test_agent_started_records_first_arrival_once(
    bound: Backend, run_id: uuid.UUID
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    for agent, phase in ((a, 1), (b, 1), (a, 2)):
        bound.append_event(AgentStarted(run_id=run_id, phase_id=phase, agent_id=agent,
                                        prompt_preview="p", model=None))  # fmt: skip
    cp = bound.get_checkpoint()
    assert cp is not None and cp.started_agent_ids == (a, b)
    assert fresh(bound) == cp


def test_agent_done_creates_a_result_from_the_event(
    redis_client: Client, bound: Backend, run_id: uuid.UUID
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    bound.append_event(AgentStarted(run_id=run_id, phase_id=4, agent_id=a, prompt_preview="p",
                                    model="m"))  # fmt: skip
    before = server_now(redis_client)
    bound.append_event(done(run_id, a, tokens=(10, 5), output={"x": 1},
                            findings=(finding("f"),)))  # fmt: skip
    bound.append_event(done(run_id, b, status=AgentStatus.TIMED_OUT, tokens=(1, 1)))
    cp = bound.get_checkpoint()
    assert cp is not None
    ra, rb = cp.agent_results[a], cp.agent_results[b]
    assert (ra.phase_id, ra.status, ra.tokens, ra.output) == (4, "ok", 15, {"x": 1})
    assert ra.findings == (finding("f"),)
    assert before <= ra.completed_at <= server_now(redis_client)
    assert ra.cache_key_hash is None and ra.description is None and ra.role is None
    assert (rb.phase_id, rb.status, rb.tokens, rb.output, rb.findings) == (0, "timed_out", 2,
                                                                         None, ())  # fmt: skip
    assert cp.total_tokens == 17  # cache counters excluded
    assert fresh(bound) == cp


def test_checkpoint_maps_from_the_cache_compare_like_dicts(
    bound: RedisCheckpointBackend, run_id: uuid.UUID
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    bound.upsert_agent_result(result(a))
    bound.append_event(done(run_id, b))
    session = AgentSessionCheckpoint(agent_id=a, session_id="s", status="x", updated_at=1)
    bound.upsert_agent_session(session)
    cp = bound.get_checkpoint()
    assert cp is not None
    expected = {a: result(a), b: cp.agent_results[b]}
    assert cp.agent_results == expected and expected == cp.agent_results
    assert cp.agent_sessions == {a: session}
    assert fresh(bound).agent_results == expected  # loaded, not applied from deltas
    assert bound.get_checkpoint() is cp  # the snapshot is built once, not per read


def test_agent_done_keeps_what_upsert_recorded(
    bound: Backend, run_id: uuid.UUID
) -> None:
    a = uuid.uuid4()
    kept = result(a, findings=(finding("from upsert"),), output={"from": "upsert"})
    bound.upsert_agent_result(kept)
    assert bound.get_checkpoint().total_tokens == 0  # type: ignore[union-attr]
    bound.append_event(done(run_id, a, status=AgentStatus.ERROR, tokens=(3, 4),
                            output={"from": "event"}, findings=(finding("from event"),)))
    cp = bound.get_checkpoint()
    assert cp is not None
    r = cp.agent_results[a]
    assert (r.status, r.tokens) == ("error", 7)
    assert (r.phase_id, r.completed_at, r.cache_key_hash, r.description, r.role) == (
        kept.phase_id, kept.completed_at, kept.cache_key_hash, kept.description, kept.role)
    assert r.output == {"from": "upsert"} and r.findings == (finding("from upsert"),)
    assert cp.findings == (finding("from upsert"),)
    assert cp.total_tokens == 7
    assert fresh(bound) == cp


def test_agent_done_fills_what_the_existing_entry_lacks(
    bound: Backend, run_id: uuid.UUID
) -> None:
    a = uuid.uuid4()
    bound.upsert_agent_result(result(a))  # no output, no findings
    bound.append_event(done(run_id, a, output=[1, 2], findings=(finding("late"),)))
    cp = bound.get_checkpoint()
    assert cp is not None
    assert cp.agent_results[a].output == [1, 2]
    assert cp.agent_results[a].findings == (finding("late"),)
    assert cp.agent_results[a].phase_id == 3  # kept
    assert cp.findings == (finding("late"),)
    assert fresh(bound) == cp


def test_agent_done_twice_counts_tokens_each_time(
    bound: Backend, run_id: uuid.UUID
) -> None:
    a = uuid.uuid4()
    bound.append_event(done(run_id, a, tokens=(10, 0)))
    bound.append_event(done(run_id, a, tokens=(1, 2)))
    cp = bound.get_checkpoint()
    assert cp is not None and cp.total_tokens == 13 and cp.agent_results[a].tokens == 3
    assert fresh(bound) == cp


def test_upsert_agent_result_touches_no_tokens_and_adds_no_event(
    bound: Backend,
) -> None:
    a = uuid.uuid4()
    bound.upsert_agent_result(result(a))
    replacement = AgentResultCache(agent_id=a, phase_id=1, status="cancelled", output=None,
                                   findings=(), tokens=1, completed_at=2)  # fmt: skip
    bound.upsert_agent_result(replacement)
    cp = bound.get_checkpoint()
    assert cp is not None and cp.agent_results[a] == replacement and cp.total_tokens == 0
    assert bound.get_event_log() == []
    assert fresh(bound) == cp


def test_upsert_agent_session_replaces(bound: Backend) -> None:
    a = uuid.uuid4()
    first = AgentSessionCheckpoint(agent_id=a, backend_id="claude", protocol_session_id="p1",
                                   session_id="s1", status="active", updated_at=5,
                                   resumable=True)  # fmt: skip
    second = AgentSessionCheckpoint(agent_id=a, session_id="s2", status="done", updated_at=6)
    bound.upsert_agent_session(first)
    assert bound.get_checkpoint().agent_sessions[a] == first  # type: ignore[union-attr]
    assert fresh(bound).agent_sessions[a] == first
    bound.upsert_agent_session(second)
    cp = bound.get_checkpoint()
    assert cp is not None and dict(cp.agent_sessions) == {a: second}
    assert fresh(bound) == cp


def test_phase_started_and_done(bound: Backend, run_id: uuid.UUID) -> None:
    bound.append_event(PhaseStarted(run_id=run_id, phase_id=2, label="two", planned=4,
                                    description="d", role="r"))  # fmt: skip
    bound.append_event(PhaseStarted(run_id=run_id, phase_id=1, label="one", planned=1))
    bound.append_event(PhaseDone(run_id=run_id, phase_id=2, ok=3, failed=1))
    # a resumed run starts phase 2 again: updated in place, counts kept, no duplicate
    bound.append_event(PhaseStarted(run_id=run_id, phase_id=2, label="two again", planned=5))
    bound.append_event(PhaseDone(run_id=run_id, phase_id=7, ok=0, failed=2))
    cp = bound.get_checkpoint()
    assert cp is not None
    assert [p.to_json() for p in cp.completed_phases] == [
        {"phase_id": 2, "label": "two again", "planned": 5, "ok": 3, "failed": 1,
         "description": "d", "role": "r"},
        {"phase_id": 1, "label": "one", "planned": 1, "ok": 0, "failed": 0,
         "description": None, "role": None},
        {"phase_id": 7, "label": "", "planned": 0, "ok": 0, "failed": 2,
         "description": None, "role": None},
    ]  # fmt: skip
    assert cp.current_phase == 7
    assert fresh(bound) == cp


def test_repeated_phase_started_keeps_what_it_does_not_restate(
    bound: Backend, run_id: uuid.UUID
) -> None:
    """luft's SQLite backend: ``COALESCE(excluded.description, phases.description)``."""
    bound.append_event(PhaseStarted(run_id=run_id, phase_id=1, label="one", planned=2,
                                    description="first", role="reviewer"))  # fmt: skip
    bound.append_event(PhaseStarted(run_id=run_id, phase_id=1, label="one", planned=3))
    cp = bound.get_checkpoint()
    assert cp is not None
    (phase,) = cp.completed_phases
    assert (phase.planned, phase.description, phase.role) == (3, "first", "reviewer")
    # a value it does restate replaces the stored one; the other is kept
    bound.append_events([
        PhaseStarted(run_id=run_id, phase_id=1, label="one", planned=3, role="fixer"),
        PhaseStarted(run_id=run_id, phase_id=1, label="one", planned=3),
    ])  # fmt: skip
    cp = bound.get_checkpoint()
    assert cp is not None
    (phase,) = cp.completed_phases
    assert (phase.description, phase.role) == ("first", "fixer")
    assert fresh(bound) == cp


def test_run_done_totals(bound: Backend, run_id: uuid.UUID) -> None:
    bound.append_event(done(run_id, uuid.uuid4(), tokens=(40, 2)))
    bound.append_event(RunDone(run_id=run_id, status=RunStatus.PARTIAL,
                               total_tokens=TokenUsage(cache_read=5)))  # fmt: skip
    cp = bound.get_checkpoint()
    assert cp is not None and cp.total_tokens == 42 and cp.status is CheckpointStatus.RUNNING
    bound.append_event(RunDone(run_id=run_id, status=RunStatus.COMPLETED,
                               total_tokens=TokenUsage(input=100, output=1)))  # fmt: skip
    cp = bound.get_checkpoint()
    assert cp is not None and cp.total_tokens == 101 and cp.status is CheckpointStatus.COMPLETED
    assert fresh(bound) == cp


def test_other_events_change_only_updated_at_and_the_log(
    bound: Backend, run_id: uuid.UUID
) -> None:
    before = bound.get_checkpoint()
    assert before is not None
    skip = {"agent_started", "agent_done", "phase_started", "phase_done", "run_done"}
    others = [e for e in every_event(run_id) if e.TYPE not in skip]
    for event in others:
        bound.append_event(event)
    after = bound.get_checkpoint()
    assert after is not None
    assert after._replace(updated_at=before.updated_at) == before
    assert bound.version == 1 + len(others)
    assert fresh(bound) == after


def test_total_tokens_is_exact_to_u64_max_and_refuses_overflow(
    bound: Backend, run_id: uuid.UUID
) -> None:
    a = uuid.uuid4()
    bound.append_event(done(run_id, a, tokens=(2**63, 2**63 - 10)))
    bound.append_event(done(run_id, a, tokens=(9, 0)))
    assert bound.get_checkpoint().total_tokens == 2**64 - 1  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="total_tokens"):
        bound.append_event(done(run_id, a, tokens=(1, 0)))
    assert len(bound.get_event_log()) == 2
    cp = fresh(bound)
    assert cp.total_tokens == 2**64 - 1 and cp.agent_results[a].tokens == 9
    with pytest.raises(ValidationError, match="tokens"):
        bound.append_event(done(run_id, a, tokens=(2**64 - 1, 1)))


# ----------------------------------------------------------------------- transitions §5

FROM = ["running", "completed", "failed", "cancelled"]


def _bring_to(backend: Backend, run_id: uuid.UUID, status: str) -> None:
    if status in ("completed", "failed"):
        backend.append_event(RunDone(run_id=run_id, status=RunStatus(status),
                                     total_tokens=TokenUsage(), report=None))  # fmt: skip
    elif status == "cancelled":
        backend.cancel()
    assert backend.get_checkpoint().status.value == status  # type: ignore[union-attr]


TABLE: dict[str, dict[str, str | type[Exception]]] = {
    #            run_done(c)   run_done(f)  run_done(x)   partial     cancel       reset
    "running": {"completed": "completed", "failed": "failed", "cancelled": "cancelled",
                "partial": "running", "cancel": "cancelled", "reset": "running"},
    "completed": {"completed": "completed", "failed": "completed", "cancelled": "completed",
                  "partial": "completed", "cancel": "completed", "reset": NotResumableError},
    "failed": {"completed": "completed", "failed": "failed", "cancelled": "cancelled",
               "partial": "failed", "cancel": "failed", "reset": "running"},
    "cancelled": {"completed": "cancelled", "failed": "cancelled", "cancelled": "cancelled",
                  "partial": "cancelled", "cancel": "cancelled", "reset": "running"},
}  # fmt: skip


@pytest.mark.parametrize("start", FROM)
@pytest.mark.parametrize("action", ["completed", "failed", "cancelled", "partial", "cancel",
                                    "reset"])  # fmt: skip
def test_transition_table(
    bound: Backend, run_id: uuid.UUID, start: str, action: str,
    make_backend: Factory,
) -> None:  # fmt: skip
    _bring_to(bound, run_id, start)
    expected = TABLE[start][action]
    before = fresh(bound)
    # the action comes from another process, so the check must happen inside Redis
    other = make_backend()
    other.open_run(run_id)
    if action == "cancel":
        other.cancel()
    elif action == "reset":
        if expected is NotResumableError:
            with pytest.raises(NotResumableError):
                other.reset_status_to_running()
            assert fresh(bound) == before
            return
        other.reset_status_to_running()
    else:
        other.append_event(RunDone(run_id=run_id, status=RunStatus(action),
                                   total_tokens=TokenUsage()))  # fmt: skip
    assert fresh(bound).status.value == expected
    assert other.get_checkpoint().status.value == expected  # type: ignore[union-attr]
    assert other.can_resume() is (expected != "completed")


@pytest.mark.parametrize("start", FROM)
@pytest.mark.parametrize("saved", FROM)
def test_save_checkpoint_sets_any_status(
    bound: Backend, run_id: uuid.UUID, start: str, saved: str
) -> None:
    _bring_to(bound, run_id, start)
    cp = bound.get_checkpoint()
    assert cp is not None
    bound.save_checkpoint(cp._replace(status=CheckpointStatus(saved)))
    assert fresh(bound).status.value == saved
    assert bound.get_checkpoint().status.value == saved  # type: ignore[union-attr]


def test_cancel_of_a_finished_run_changes_nothing(
    bound: Backend, run_id: uuid.UUID
) -> None:
    _bring_to(bound, run_id, "failed")
    before, version = fresh(bound), bound.version
    bound.cancel()
    assert fresh(bound) == before and bound.version == version


# ------------------------------------------------------------------------- findings (§5)


def test_findings_follow_agents_in_place(bound: Backend, run_id: uuid.UUID) -> None:
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    bound.append_event(done(run_id, a, findings=(finding("a1"), finding("a2"))))
    bound.append_event(done(run_id, b))  # reports none: no place in the list
    bound.upsert_agent_result(result(c, findings=(finding("c1"),)))
    bound.upsert_agent_result(result(b, findings=(finding("b1"),)))
    assert bound.get_findings() == (finding("a1"), finding("a2"), finding("c1"), finding("b1"))
    # a later version for a replaces a's findings where they were
    bound.upsert_agent_result(result(a, findings=(finding("a3"),)))
    assert bound.get_findings() == (finding("a3"), finding("c1"), finding("b1"))
    # emptied, then reported again (decided): the agent left the list, so it comes back at
    # the end, as it would after saving what get_checkpoint() returned in between
    bound.upsert_agent_result(result(c))
    assert bound.get_findings() == (finding("a3"), finding("b1"))
    bound.upsert_agent_result(result(c, findings=(finding("c2"),)))
    assert bound.get_findings() == (finding("a3"), finding("b1"), finding("c2"))
    assert fresh(bound).findings == bound.get_findings()
    assert bound.get_checkpoint().findings == bound.get_findings()  # type: ignore[union-attr]


def test_save_sets_findings_exactly_and_keeps_ownership(
    bound: Backend, run_id: uuid.UUID
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    bound.append_event(done(run_id, a, findings=(finding("a1"), finding("a2"))))
    bound.append_event(done(run_id, b, findings=(finding("b1"),)))
    cp = bound.get_checkpoint()
    assert cp is not None
    loose = finding("manual", Severity.LOW)
    # interleaved, with a finding no agent owns
    wanted = (finding("a1"), loose, finding("b1"), finding("a2"))
    bound.save_checkpoint(cp._replace(findings=wanted))
    assert bound.get_findings() == wanted and fresh(bound).findings == wanted
    # a later update for a replaces a's findings (both places) instead of adding to them
    bound.upsert_agent_result(result(a, findings=(finding("a9"),)))
    assert bound.get_findings() == (finding("a9"), loose, finding("b1"))
    assert fresh(bound).findings == bound.get_findings()


def test_saving_what_get_checkpoint_returned_changes_only_updated_at(
    bound: Backend, run_id: uuid.UUID
) -> None:
    for event in every_event(run_id):
        bound.append_event(event)
    bound.upsert_agent_result(result(uuid.uuid4(), findings=(finding("x"), finding("x"))))
    bound.upsert_agent_session(
        AgentSessionCheckpoint(agent_id=uuid.uuid4(), session_id="s", status="x", updated_at=1)
    )
    cp = bound.get_checkpoint()
    assert cp is not None
    bound.save_checkpoint(cp)
    after = fresh(bound)
    assert after._replace(updated_at=cp.updated_at) == cp
    assert bound.get_checkpoint() == after
    assert len(bound.get_event_log()) == len(every_event(run_id))


def test_save_checkpoint_replaces_everything(
    bound: Backend, run_id: uuid.UUID
) -> None:
    for event in every_event(run_id):
        bound.append_event(event)
    a = uuid.uuid4()
    new = RunCheckpoint.from_json({
        "run_id": str(run_id), "task": "new task", "status": "failed", "current_phase": 9,
        "completed_phases": [{"phase_id": 9, "label": "nine", "planned": 1, "ok": 0,
                              "failed": 1, "description": None, "role": "r"}],
        "agent_results": {str(a): result(a, findings=(finding("f"),)).to_json()},
        "agent_sessions": {}, "findings": [finding("f").to_json()], "total_tokens": 5,
        "created_at": 10, "updated_at": 11, "workflow_meta": {"m": 1},
        "started_agent_ids": [str(a)],
    })  # fmt: skip
    bound.save_checkpoint(new)
    cp = fresh(bound)
    assert cp._replace(updated_at=11) == new
    assert bound.get_checkpoint() == cp
    assert len(bound.get_event_log()) == len(every_event(run_id))  # the log is kept


def test_save_checkpoint_of_another_run_is_refused(bound: Backend) -> None:
    cp = bound.get_checkpoint()
    assert cp is not None
    before = fresh(bound)
    with pytest.raises(RunMismatchError):
        bound.save_checkpoint(cp._replace(run_id=uuid.uuid4()))
    dup = cp._replace(completed_phases=(t.PhaseSummary(phase_id=1, label="a", planned=0, ok=0,
                                                       failed=0),) * 2)  # fmt: skip
    with pytest.raises(ValidationError, match="completed_phases"):
        bound.save_checkpoint(dup)
    assert fresh(bound) == before


def test_save_checkpoint_of_many_agents(bound: Backend, run_id: uuid.UUID) -> None:
    cp = bound.get_checkpoint()
    assert cp is not None
    results = {}
    for i in range(1500):
        a = uuid.uuid4()
        results[a] = result(a, findings=(finding(f"f{i}"),) if i % 3 == 0 else (),
                            output={"i": i})  # fmt: skip
    big = dataclasses.replace(
        cp,
        agent_results=results,
        findings=tuple(f for r in results.values() for f in r.findings),
        started_agent_ids=tuple(results),
    )
    bound.save_checkpoint(big)
    loaded = fresh(bound)
    assert loaded == bound.get_checkpoint()
    assert loaded._replace(updated_at=big.updated_at) == big


# -------------------------------------------------------------------------- bad input


def test_event_of_another_run_is_refused(bound: Backend, run_id: uuid.UUID) -> None:
    with pytest.raises(RunMismatchError, match="run_id"):
        bound.append_event(Log(run_id=uuid.uuid4(), level=LogLevel.INFO, msg="x"))
    with pytest.raises(ValidationError):
        bound.append_event({"type": "log"})  # type: ignore[arg-type]
    bound.append_event(SignalReceived(run_id=None, signal="SIGHUP"))
    assert [e.TYPE for e in bound.get_event_log()] == ["signal_received"]


def test_corrupt_data_is_reported_and_other_runs_keep_working(
    redis_client: Client, make_backend: Factory
) -> None:
    good, bad = make_backend(), make_backend()
    good_id, bad_id = uuid.uuid4(), uuid.uuid4()
    good.init_run(good_id, "t", "/d")
    bad.init_run(bad_id, "t", "/d")
    bad.append_event(Log(run_id=bad_id, level=LogLevel.INFO, msg="x"))
    keys = run_keys("luft", bad_id)
    redis_client.xadd(keys.events, {"type": "agent_done", "data": b"\xc1garbage"})
    with pytest.raises(CorruptDataError) as info:
        bad.get_event_log()
    assert info.value.key == keys.events and "data" in info.value.field
    redis_client.hset(keys.run, "status", "exploded")
    with pytest.raises(CorruptDataError) as info:
        make_backend().open_run(bad_id)
    assert info.value.key == keys.run and info.value.field == "status"
    with pytest.raises(CorruptDataError):
        bad.append_event(Log(run_id=bad_id, level=LogLevel.INFO, msg="y"))
    redis_client.hset(keys.run, "status", "running")
    redis_client.hset(keys.results, f"{uuid.uuid4()}:status", "ok")  # missing fields
    with pytest.raises(CorruptDataError, match="missing"):
        make_backend().open_run(bad_id)
    good.append_event(Log(run_id=good_id, level=LogLevel.INFO, msg="still fine"))
    assert len(good.get_event_log()) == 1
    assert make_backend().open_run(good_id) == good.get_checkpoint()


# ----------------------------------------------------------------------- cache and races


def test_get_checkpoint_does_no_io_and_cannot_be_mutated(
    bound: Backend, run_id: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = uuid.uuid4()
    bound.append_event(done(run_id, a, output={"list": [1]}, findings=(finding("f"),)))
    before = bound.get_checkpoint()

    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("network I/O from a cache read")

    monkeypatch.setattr(bound.client, "execute_command", no_io)
    cp = bound.get_checkpoint()
    assert cp is not None and cp is before
    assert bound.get_findings() == (finding("f"),) and bound.can_resume()
    with pytest.raises(AttributeError):
        cp.task = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        cp.agent_results[a].output["list"].append(2)
    with pytest.raises(TypeError):
        cp.agent_results[a] = result(a)  # type: ignore[index]
    assert bound.get_checkpoint().agent_results[a].output == {"list": [1]}  # type: ignore[union-attr]
    monkeypatch.undo()
    assert fresh(bound) == cp


def test_two_backends_interleaving_lose_nothing(
    run_id: uuid.UUID, make_backend: Factory
) -> None:
    one, two = make_backend(), make_backend()
    one.init_run(run_id, "t", "/d")
    two.open_run(run_id)
    agents = [uuid.uuid4() for _ in range(20)]
    for i, agent in enumerate(agents):
        writer = (one, two)[i % 2]
        writer.append_event(AgentStarted(run_id=run_id, phase_id=1, agent_id=agent,
                                         prompt_preview="p", model=None))  # fmt: skip
        writer.append_event(done(run_id, agent, tokens=(i, 1), findings=(finding(f"{i}"),)))
        (two, one)[i % 2].upsert_agent_session(
            AgentSessionCheckpoint(agent_id=agent, session_id=f"s{i}", status="x", updated_at=i)
        )
    cp = fresh(one)
    assert cp.total_tokens == sum(i + 1 for i in range(20))
    assert cp.started_agent_ids == tuple(agents)
    assert set(cp.agent_results) == set(agents) == set(cp.agent_sessions)
    assert cp.findings == tuple(finding(f"{i}") for i in range(20))
    assert len(one.get_event_log()) == 40
    # a writer whose write follows another process's writes catches up with them
    two.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="last"))
    one.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="last"))
    assert one.get_checkpoint() == fresh(one)
    assert two.get_checkpoint()._replace(updated_at=0) == cp._replace(updated_at=0)  # type: ignore[union-attr]


def test_random_operations_keep_the_cache_equal_to_redis(
    bound: Backend, run_id: uuid.UUID
) -> None:
    """The in-process cache applies §5 itself: after every write it must equal Redis."""
    rng = random.Random(20261130)
    agents = [uuid.uuid4() for _ in range(6)]
    pool = [finding(f"f{i}", Severity.HIGH) for i in range(6)]

    def some_findings() -> tuple[Finding, ...]:
        return tuple(rng.sample(pool, rng.randint(0, 2)))

    ops: list[Callable[[], None]] = [
        lambda: bound.append_event(AgentStarted(
            run_id=run_id, phase_id=rng.randint(0, 3), agent_id=rng.choice(agents),
            prompt_preview="p", model=None)),
        lambda: bound.append_event(done(
            run_id, rng.choice(agents), status=rng.choice(list(AgentStatus)),
            tokens=(rng.randint(0, 50), rng.randint(0, 50)),
            output=rng.choice([None, {"o": rng.randint(0, 9)}]), findings=some_findings())),
        lambda: bound.upsert_agent_result(result(
            rng.choice(agents), findings=some_findings(), phase=rng.randint(0, 3),
            output=rng.choice([None, [rng.randint(0, 9)]]))),
        lambda: bound.append_event(PhaseStarted(
            run_id=run_id, phase_id=rng.randint(0, 4), label=rng.choice("abc"),
            planned=rng.randint(0, 5), description=rng.choice([None, "d"]))),
        lambda: bound.append_event(PhaseDone(
            run_id=run_id, phase_id=rng.randint(0, 4), ok=rng.randint(0, 3),
            failed=rng.randint(0, 3))),
        lambda: bound.append_event(RunDone(
            run_id=run_id, status=rng.choice(list(RunStatus)),
            total_tokens=TokenUsage(input=rng.choice([0, 0, 1000])))),
        lambda: bound.cancel(),
        lambda: bound.reset_status_to_running()
        if bound.get_checkpoint().status is not CheckpointStatus.COMPLETED  # type: ignore[union-attr]
        else None,
        lambda: bound.save_checkpoint(bound.get_checkpoint()),  # type: ignore[arg-type]
        lambda: bound.upsert_agent_session(AgentSessionCheckpoint(
            agent_id=rng.choice(agents), session_id="s", status=rng.choice("xy"),
            updated_at=rng.randint(0, 9), resumable=rng.random() < 0.5)),
    ]  # fmt: skip
    for step in range(150):
        rng.choice(ops)()
        assert bound.get_checkpoint() == fresh(bound), f"diverged at step {step}"


def test_server_time_is_used_for_timestamps(
    redis_client: Client, bound: Backend, run_id: uuid.UUID
) -> None:
    time.sleep(1.05)
    bound.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="x"))
    cp = bound.get_checkpoint()
    assert cp is not None and cp.updated_at > cp.created_at
    assert abs(cp.updated_at - server_now(redis_client)) <= 2


def test_payload_size_limit(make_backend: Factory, run_id: uuid.UUID) -> None:
    small = make_backend(max_payload_size=2048)
    small.init_run(run_id, "t", "/d")
    big_text = "x" * 4096
    with pytest.raises(luft_redis.PayloadTooLargeError) as info:
        small.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg=big_text))
    assert info.value.field == "event" and info.value.size > 2048 and info.value.limit == 2048
    batch = [Log(run_id=run_id, level=LogLevel.INFO, msg="ok"),
             Log(run_id=run_id, level=LogLevel.INFO, msg=big_text)]  # fmt: skip
    with pytest.raises(luft_redis.PayloadTooLargeError, match=r"events\[1\]"):
        small.append_events(batch)
    a = uuid.uuid4()
    with pytest.raises(luft_redis.PayloadTooLargeError, match=r"cache\.output"):
        small.upsert_agent_result(result(a, output={"big": big_text}))
    with pytest.raises(luft_redis.PayloadTooLargeError, match="workflow_meta"):
        make_backend(max_payload_size=2048).init_run_with_meta(
            uuid.uuid4(), "t", "/d", {"big": big_text})
    assert small.get_event_log() == [] and dict(fresh(small).agent_results) == {}
    assert small.version == 1
    small.append_events(batch[:1])  # within the limit
    assert len(small.get_event_log()) == 1
    with pytest.raises(luft_redis.ConfigurationError):
        make_backend(max_payload_size=0)


def test_saving_the_checkpoint_keeps_later_finding_positions(
    bound: Backend,
) -> None:
    """Whether or not get_checkpoint() is saved in between, later updates land alike."""
    a, b = uuid.uuid4(), uuid.uuid4()
    bound.upsert_agent_result(result(a, findings=(finding("a1"),)))
    bound.upsert_agent_result(result(b, findings=(finding("b1"),)))
    bound.upsert_agent_result(result(a))
    cp = bound.get_checkpoint()
    assert cp is not None
    bound.save_checkpoint(cp)
    bound.upsert_agent_result(result(a, findings=(finding("a2"),)))
    assert bound.get_findings() == (finding("b1"), finding("a2"))
    assert fresh(bound).findings == bound.get_findings()


def test_a_key_of_the_wrong_type_stops_a_write_before_it_writes(
    redis_client: Client, bound: Backend, run_id: uuid.UUID
) -> None:
    keys = run_keys("luft", run_id)
    bound.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="before"))
    before = fresh(bound)
    for key in (keys.findings, keys.findings_order):
        redis_client.delete(key)
        redis_client.set(key, "not a hash or list")
        with pytest.raises(CorruptDataError) as info:
            bound.append_event(done(run_id, uuid.uuid4(), findings=(finding("f"),)))
        assert info.value.key == key
        with pytest.raises(CorruptDataError):
            bound.upsert_agent_result(result(uuid.uuid4(), findings=(finding("g"),)))
        with pytest.raises(CorruptDataError) as info:
            fresh(bound)
        assert info.value.key == key and "type" in info.value.field
        redis_client.delete(key)
        assert len(bound.get_event_log()) == 1 and fresh(bound) == before
    bound.append_event(done(run_id, uuid.uuid4(), findings=(finding("f"),)))
    assert bound.get_findings() == (finding("f"),)
