"""Observability: ``stats()`` counters, OpenTelemetry spans, and the log levels an operator
relies on (nothing at WARNING in a healthy run; reconnects and reloads at INFO; data problems
at ERROR).

Counters and logs run on both front ends over fakeredis, a private redis-server and a cluster;
spans use the OpenTelemetry SDK's in-memory exporter (skipped without ``opentelemetry-sdk``).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from luft_redis import (
    AgentDone,
    AgentStatus,
    BackendStats,
    Log,
    LogLevel,
    RedisCheckpointBackend,
    RunNotBoundError,
    TokenUsage,
    __version__,
)
from luft_redis.keys import run_keys
from luft_redis.tracing import OperationTracer, client_attributes

STAT_FIELDS = {
    "writes_total",
    "write_retries_total",
    "replays_total",
    "reloads_total",
    "notices_applied_total",
    "redis_wait_seconds_total",
    "health_check_age_seconds",
}


def _done(run_id: uuid.UUID, n: int) -> AgentDone:
    return AgentDone(run_id=run_id, agent_id=uuid.UUID(int=n + 1), status=AgentStatus.OK,
                     tokens=TokenUsage(input=10, output=n, cache_read=0), elapsed_ms=5,
                     name=f"agent-{n}", agent_seq=n)  # fmt: skip


def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# ------------------------------------------------------------------------------ stats()


def test_stats_count_writes_reloads_and_notices(make_frontend_backend: Callable[..., Any]) -> None:
    writer = make_frontend_backend()
    watcher = make_frontend_backend()
    run_id = uuid.uuid4()
    fresh = writer.stats()
    assert isinstance(fresh, BackendStats) and set(fresh.as_dict()) == STAT_FIELDS
    assert fresh.writes_total == 0 and fresh.reloads_total == 0
    assert fresh.health_check_age_seconds is None  # not bound: no subscription to vouch for

    writer.init_run(run_id, "stats", "/tmp/stats")
    assert watcher.open_run(run_id) is not None
    assert watcher.stats().reloads_total == 1
    for n in range(3):
        writer.append_event(_done(run_id, n))
    writer.cancel()

    stats = writer.stats()
    assert stats.writes_total == 5  # init + 3 appends + cancel
    assert stats.write_retries_total == 0 and stats.replays_total == 0
    assert stats.redis_wait_seconds_total > 0
    assert _until(lambda: watcher.version == writer.version)
    assert _until(lambda: watcher.stats().notices_applied_total == 4)
    assert watcher.stats().writes_total == 0
    assert watcher.get_checkpoint() == writer.get_checkpoint()
    assert _until(lambda: watcher.stats().health_check_age_seconds is not None)
    age = watcher.stats().health_check_age_seconds
    assert age is not None and 0 <= age <= 30


def test_stats_without_watching(make_frontend_backend: Callable[..., Any]) -> None:
    backend = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "quiet", "/tmp/quiet")
    backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="one"))
    stats = backend.stats()
    assert stats.health_check_age_seconds is None  # nothing watched: nothing to vouch for
    assert stats.notices_applied_total == 0
    assert stats.writes_total == 2


# ------------------------------------------------------------------------------ spans


@pytest.fixture(scope="module")
def span_exporter() -> Iterator[Any]:
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    from opentelemetry import trace

    exporter = memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another OpenTelemetry tracer provider is installed in this process")
    yield exporter
    exporter.clear()


def test_each_operation_is_a_client_span(
    span_exporter: Any, make_frontend_backend: Callable[..., Any]
) -> None:
    from opentelemetry.trace import SpanKind, StatusCode

    backend = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    span_exporter.clear()
    backend.init_run(run_id, "traced", "/tmp/traced")
    backend.append_event(_done(run_id, 0))
    backend.append_events([_done(run_id, 1), _done(run_id, 2)])
    backend.cancel()
    backend.get_event_log()
    assert backend.delete_run() is True
    spans = span_exporter.get_finished_spans()
    assert [s.name for s in spans] == [
        "init_run", "append_event", "append_events", "cancel", "get_event_log", "delete_run"]
    for span in spans:
        assert span.kind is SpanKind.CLIENT
        assert span.attributes["db.system.name"] == "redis"
        assert span.attributes["db.operation.name"] == span.name
        assert span.attributes["luft.run_id"] == str(run_id)
        assert span.attributes["luft.prefix"] == "luft"
        assert span.status.status_code is not StatusCode.ERROR
        assert span.instrumentation_scope.name == "luft_redis"
        assert span.instrumentation_scope.version == __version__


def test_a_failed_operation_is_an_error_span(
    span_exporter: Any, make_frontend_backend: Callable[..., Any]
) -> None:
    from opentelemetry.trace import StatusCode

    backend = make_frontend_backend(watch=False)
    span_exporter.clear()
    with pytest.raises(RunNotBoundError):
        backend.cancel()
    (span,) = span_exporter.get_finished_spans()
    assert span.name == "cancel"
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "RunNotBoundError"
    assert "luft.run_id" not in span.attributes
    assert any(event.name == "exception" for event in span.events)


_LATE_PROVIDER = """
import uuid, fakeredis
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from luft_redis import RedisCheckpointBackend

backend = RedisCheckpointBackend(fakeredis.FakeRedis(), watch=False)
started = []
real = backend._tracer._tracer.start_as_current_span
def spy(*a, **k):
    started.append(a[0])
    return real(*a, **k)
backend._tracer._tracer.start_as_current_span = spy
run_id = uuid.uuid4()
backend.init_run(run_id, "late", "/tmp/late")
assert not backend._tracer.active() and started == [], started
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
backend.cancel()
assert backend._tracer.active() and started == ["cancel"], started
assert [s.name for s in exporter.get_finished_spans()] == ["cancel"]
print("ok")
"""


def test_spans_start_once_a_provider_is_set() -> None:
    """Without a tracer provider no span is entered (the API's would record nothing); a
    backend made before the application sets one traces from then on."""
    pytest.importorskip("opentelemetry.sdk.trace")
    pytest.importorskip("fakeredis")
    done = subprocess.run([sys.executable, "-c", _LATE_PROVIDER], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_server_attributes_of_a_plain_client() -> None:
    client = redis.Redis(host="127.0.0.1", port=6390, db=3)
    assert client_attributes(client) == {
        "server.address": "127.0.0.1", "server.port": 6390, "db.namespace": "3"}  # fmt: skip
    assert OperationTracer(client, "luft").span("x") is not None


# ------------------------------------------------------------------------------ logs


def test_a_healthy_run_logs_nothing_at_warning(
    make_frontend_backend: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="luft_redis")
    writer = make_frontend_backend()
    watcher = make_frontend_backend()
    run_id = uuid.uuid4()
    writer.init_run(run_id, "healthy", "/tmp/healthy")
    watcher.open_run(run_id)
    for n in range(20):
        writer.append_event(_done(run_id, n))
    assert _until(lambda: watcher.version == writer.version)
    assert watcher.sync() == writer.get_checkpoint()
    loud = [r for r in caplog.records if r.name.startswith("luft_redis") and
            r.levelno >= logging.WARNING]  # fmt: skip
    assert loud == []


def test_reconnect_is_info_and_corrupt_data_is_error(
    redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """On a private redis-server: a killed subscriber connection is logged at INFO (and
    nothing at WARNING); a change notice that cannot be applied is logged at ERROR."""
    caplog.set_level(logging.INFO, logger="luft_redis")
    client = redis.Redis.from_url(redis_server.url)
    admin = redis.Redis.from_url(redis_server.url)
    writer = RedisCheckpointBackend(client)
    watcher = RedisCheckpointBackend(redis.Redis.from_url(redis_server.url))
    try:
        run_id = uuid.uuid4()
        writer.init_run(run_id, "logs", "/tmp/logs")
        watcher.open_run(run_id)
        assert _until(lambda: watcher.cache_is_fresh)
        caplog.clear()
        assert admin.client_kill_filter(_type="pubsub") >= 1
        writer.append_event(_done(run_id, 0))
        assert _until(lambda: watcher.cache_is_fresh and watcher.version == writer.version)
        records = [r for r in caplog.records if r.name.startswith("luft_redis")]
        assert any(r.levelno == logging.INFO for r in records), [r.getMessage() for r in records]
        assert not [r for r in records if r.levelno >= logging.WARNING]

        # the run hash corrupted behind the library's back: the watcher's next reload
        # (after its subscriber connection is lost again) cannot decode it -> ERROR
        caplog.clear()
        admin.hset(run_keys("luft", run_id).run, "status", "bogus")
        assert admin.client_kill_filter(_type="pubsub") >= 1
        assert _until(lambda: any(r.levelno >= logging.ERROR and r.name.startswith("luft_redis")
                                  for r in caplog.records))  # fmt: skip
        assert not watcher.cache_is_fresh
    finally:
        writer.close()
        watcher.close()
        client.close()
        admin.close()
