"""luft-redis benchmark harness: one command, one private redis-server, a table of ratios.

Run from the repository root::

    .venv/bin/python -m benchmarks.run            # full run (a few minutes)
    .venv/bin/python -m benchmarks.run --smoke    # tiny sizes (< 30 s), what CI runs
    .venv/bin/python -m benchmarks.run --json out.json --redis-server /usr/bin/redis-server

Every figure is compared with a baseline measured in the same run on the same server (redis-py
PING, redis-benchmark on a Lua script of the same shape as the real one, ...), because the
machines this runs on are shared and noisy: absolute numbers are printed but only ratios are
meaningful. Baseline and subject are interleaved (A/B/A/B) and the median of the rounds is
reported. See docs/performance.md for what each row measures.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import redis

import luft_redis
from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentStatus,
    CheckpointStatus,
    Finding,
    Location,
    PhaseSummary,
    RedisCheckpointBackend,
    RunCheckpoint,
    Severity,
    TokenUsage,
    codec,
)
from luft_redis.keys import run_keys
from luft_redis.scripts import script_source
from luft_redis.tools.server import LocalRedisServer, find_redis_server

from .pinning import pin_server, plan_placement

PREFIX = "bench"
BATCH = "append_events"  # the batch API, looked up by name: older versions lack it
NS = 1_000_000_000

# --------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    rounds: int  # A/B rounds of the latency, batch and writer sections
    latency_iters: int  # timed calls per operation per round
    chunk: int  # calls of one operation before switching to the next (interleaving)
    warmup: int  # untimed calls per operation per round
    count_ops: int  # operations between the two INFO commandstats snapshots
    batch_events: int  # events per batch-size per round (append_events)
    bench_pipelined: int  # redis-benchmark -P 16 requests
    checkpoint_sizes: tuple[int, int, int]  # agent results for get_checkpoint
    checkpoint_batches: int  # timed batches of get_checkpoint calls per size
    checkpoint_inner: int  # get_checkpoint calls per timed batch
    scale_appends: int  # append_event calls timed on each get_checkpoint run
    open_results: int
    open_events: int
    open_repeats: int
    writers: tuple[int, ...]
    writer_seconds: float
    bench_per_client: int  # redis-benchmark -c N requests per client
    memory_events: int


FULL = Sizes(
    rounds=5,
    latency_iters=1000,
    chunk=50,
    warmup=100,
    count_ops=1000,
    batch_events=2000,
    bench_pipelined=50_000,
    checkpoint_sizes=(10, 1_000, 10_000),
    checkpoint_batches=200,
    checkpoint_inner=1000,
    scale_appends=300,
    open_results=10_000,
    open_events=100_000,
    open_repeats=5,
    writers=(1, 2, 4),
    writer_seconds=3.0,
    bench_per_client=15_000,
    memory_events=20_000,
)

SMOKE = Sizes(
    rounds=2,
    latency_iters=60,
    chunk=20,
    warmup=10,
    count_ops=20,
    batch_events=200,
    bench_pipelined=2_000,
    checkpoint_sizes=(10, 100, 300),
    checkpoint_batches=20,
    checkpoint_inner=100,
    scale_appends=20,
    open_results=200,
    open_events=1_000,
    open_repeats=2,
    writers=(1, 2, 4),
    writer_seconds=0.3,
    bench_per_client=500,
    memory_events=1_000,
)

# --------------------------------------------------------------------------------------------
# Rows of the table
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    key: str  # stable identifier (JSON, tests)
    metric: str  # label printed in the table
    value: float | None
    unit: str  # "us", "s", "ev/s", "B", "x", "cmd"
    baseline: float | None = None
    baseline_unit: str = ""
    baseline_name: str = ""
    ratio: float | None = None
    target: str = ""
    status: str = "info"  # PASS, MISS, info, n/a
    note: str = ""


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "us":
        return f"{value:,.1f} us" if value < 100 else f"{value:,.0f} us"
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "ev/s":
        return f"{value:,.0f} ev/s"
    if unit == "B":
        return f"{value:,.1f} B"
    if unit == "cmd":
        return f"{value:.2f}"
    return f"{value:.3g} {unit}".strip()


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_table(rows: Sequence[Row], out: Any = None) -> None:
    out = out or sys.stdout
    head = ("metric", "measured", "baseline", "ratio", "target", "result")
    cells = [
        (
            r.metric,
            _fmt(r.value, r.unit) if r.value is not None else (r.note or "-"),
            (
                f"{_fmt(r.baseline, r.baseline_unit)} {r.baseline_name}".strip()
                if r.baseline is not None
                else (r.baseline_name or "-")
            ),
            "-" if r.ratio is None else f"{r.ratio:.2f}x",
            r.target or "-",
            r.status,
        )
        for r in rows
    ]
    widths = [max(len(head[i]), *(len(c[i]) for c in cells)) for i in range(len(head))]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    print(line, file=out)
    print("-" * len(line), file=out)
    for c in cells:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths, strict=True)).rstrip(), file=out)
    notes = [r for r in rows if r.note and r.value is not None]
    if notes:
        print("\nnotes:", file=out)
        for r in notes:
            print(f"  {r.metric}: {r.note}", file=out)


# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------

TS = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=dt.UTC)


def make_finding(i: int) -> Finding:
    return Finding(
        kind="bug",
        severity=Severity.HIGH,
        title=f"off by one in loop {i}",
        detail="the loop bound reads one element past the end of the buffer",
        location=Location(file="src/parser/lexer.rs", line=40 + i % 500),
    )


def make_agent_done(run_id: uuid.UUID, i: int, agent_id: uuid.UUID | None = None) -> AgentDone:
    """A typical agent_done: 36-char UUIDs, tokens, one finding, a short output."""
    return AgentDone(
        run_id=run_id,
        agent_id=agent_id or uuid.uuid4(),
        status=AgentStatus.OK,
        tokens=TokenUsage(input=12_000 + i % 1000, output=1_340, cache_read=8_000),
        elapsed_ms=51_000 + i % 1000,
        name=f"reviewer-{i % 16}",
        agent_seq=i % 1000,
        ts=TS + dt.timedelta(milliseconds=i),
        output="reviewed 14 files; one problem found",
        findings=(make_finding(i),),
    )


def make_result(i: int, agent_id: uuid.UUID | None = None) -> AgentResultCache:
    return AgentResultCache(
        agent_id=agent_id or uuid.uuid4(),
        phase_id=1,
        status="ok",
        output="reviewed 14 files; one problem found",
        findings=(make_finding(i),),
        tokens=21_340,
        completed_at=1_777_000_000 + i,
        cache_key_hash="9f2c6e0d4b1a",
        description="review one module",
        role="reviewer",
    )


def make_checkpoint(run_id: uuid.UUID, results: int) -> RunCheckpoint:
    rs = [make_result(i) for i in range(results)]
    return RunCheckpoint(
        run_id=run_id,
        task="review the repository",
        status=CheckpointStatus.RUNNING,
        current_phase=1,
        completed_phases=(
            PhaseSummary(phase_id=1, label="review", planned=results, ok=results, failed=0),
        ),
        agent_results={r.agent_id: r for r in rs},
        findings=tuple(f for r in rs for f in r.findings),
        total_tokens=21_340 * results,
        created_at=1_777_000_000,
        updated_at=1_777_000_000,
        started_agent_ids=tuple(r.agent_id for r in rs),
    )


def backend_entries(
    client: redis.Redis, count: int
) -> tuple[list[dict[bytes, bytes]], list[AgentDone]]:
    """The stream entries (every field) that append_event writes for `count` agent_done events.

    Written by the real backend on a run of its own, read back with XRANGE, so the sections
    that need big streams can replay the exact entries with pipelined XADD.
    """
    backend, run_id = new_run(client)
    events = [make_agent_done(run_id, i) for i in range(count)]
    for e in events:
        backend.append_event(e)
    keys = backend.keys
    assert keys is not None
    stored: list[tuple[bytes, dict[bytes, bytes]]] = cast(Any, client.xrange(keys.events))
    entries = [fields for _, fields in stored]
    assert len(entries) == count
    return entries, events


def replay(client: redis.Redis, key: str, entries: list[dict[bytes, bytes]], total: int) -> None:
    """XADD `total` entries to `key`, cycling through `entries` (pipelined, 1,000 a trip)."""
    pipe = client.pipeline(transaction=False)
    for i in range(total):
        pipe.xadd(key, entries[i % len(entries)])  # type: ignore[arg-type]
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


_OPEN: list[RedisCheckpointBackend] = []  # closed after each section (stops their watching)


def close_backends() -> None:
    while _OPEN:
        _OPEN.pop().close()


def new_run(client: redis.Redis, results: int = 0) -> tuple[RedisCheckpointBackend, uuid.UUID]:
    backend = RedisCheckpointBackend(client, prefix=PREFIX)
    _OPEN.append(backend)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "review the repository", f"/tmp/runs/{run_id}")
    if results:
        backend.save_checkpoint(make_checkpoint(run_id, results))
    return backend, run_id


# The commands append_event runs in Redis for an agent_done of a new agent with one finding
# (lua/append_events-10.lua + includes/common.lua: dedup, read_run, rules, XADD, writes, touch,
# remember, notify), without the checks: the "same-shape script" that redis-benchmark and raw
# redis-py EVALSHA run as the server-side baseline.
# KEYS: run, events, results, started, findings, findings_order, writers, changes.
# ARGV: type, blob, agent id, status, tokens, "s"+output, "s"+findings, writer id, op seq.
SAME_SHAPE_LUA = """
local last = redis.call('HGET', KEYS[7], ARGV[8])
local run = redis.call('HMGET', KEYS[1], 'status', 'version', 'current_phase', 'total_tokens',
  'phases')
local now = redis.call('TIME')[1]
local aid = ARGV[3]
local p = aid .. ':'
local existing = redis.call('HMGET', KEYS[3], p .. 'status', p .. 'output', p .. 'findings')
local seen = redis.call('HGET', KEYS[4], aid)
local total = string.format('%d', (tonumber(run[4]) or 0) + tonumber(ARGV[5]))
local id = redis.call('XADD', KEYS[2], '*', 'type', ARGV[1], 'data', ARGV[2])
local findings = string.sub(ARGV[7], 2)
redis.call('HSET', KEYS[3], p .. 'status', ARGV[4], p .. 'tokens', ARGV[5],
  p .. 'phase_id', '0', p .. 'completed_at', now, p .. 'output', string.sub(ARGV[6], 2),
  p .. 'findings', findings)
if redis.call('HSETNX', KEYS[5], aid, findings) == 1 then redis.call('RPUSH', KEYS[6], aid) end
local version = string.format('%d', (tonumber(run[2]) or 0) + 1)
redis.call('HSET', KEYS[1], 'updated_at', now, 'version', version, 'total_tokens', total)
local reply = {version, now, run[1], run[3] or '0', total, id}
redis.call('HSET', KEYS[7], ARGV[8], ARGV[9] .. ' ' .. table.concat(reply, ' '))
local out = {}
for _, s in ipairs({version, now, 'e', '1', ARGV[1], id, ARGV[2]}) do
  out[#out + 1] = #s .. ':' .. s
end
redis.call('SPUBLISH', KEYS[8], table.concat(out))
return reply
"""


class SameShape:
    """The same-shape script loaded on the server, with keys of its own run."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.sha: str = client.script_load(SAME_SHAPE_LUA)
        self.new_keys()
        sample = make_agent_done(uuid.uuid4(), 0)
        self.blob_len = len(codec.encode_event(sample))
        self.output_len = len(codec.encode_json(sample.output))
        self.findings_len = len(codec.encode_findings(sample.findings))
        self.writer = str(uuid.uuid4())

    def new_keys(self) -> None:
        keys = run_keys(PREFIX, uuid.uuid4())
        self.keys = [
            keys.run,
            keys.events,
            keys.results,
            keys.started,
            keys.findings,
            keys.findings_order,
            keys.writers,
            keys.changes,
        ]
        self.client.hset(
            keys.run,
            mapping={
                "status": "running",
                "current_phase": "0",
                "total_tokens": "0",
                "version": "0",
            },
        )

    def args(self, agent_id: str) -> list[str]:
        """Printable arguments of the real sizes (redis-benchmark cannot pass binary)."""
        return [
            "agent_done",
            "x" * self.blob_len,
            agent_id,
            "ok",
            "21340",
            "s" + "o" * self.output_len,
            "s" + "f" * self.findings_len,
            self.writer,
            "1",
        ]

    def call(self, agent_id: str) -> Any:
        return self.client.evalsha(self.sha, len(self.keys), *self.keys, *self.args(agent_id))

    def bench_command(self) -> list[str]:
        # __rand_int__ becomes 12 digits: a 36-character, UUID-like agent id per call.
        return [
            "EVALSHA",
            self.sha,
            str(len(self.keys)),
            *self.keys,
            *self.args("00000000-0000-4000-8000-__rand_int__"),
        ]


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


def pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def interleaved(
    ops: dict[str, Callable[[int], Any]], iters: int, chunk: int, warmup: int
) -> dict[str, list[int]]:
    """Run each op ``iters`` times, switching op every ``chunk`` calls; ns per call."""
    for op in ops.values():
        for i in range(warmup):
            op(-1 - i)
    samples: dict[str, list[int]] = {name: [] for name in ops}
    clock = time.perf_counter_ns
    done = 0
    while done < iters:
        n = min(chunk, iters - done)
        for name, op in ops.items():
            out = samples[name]
            for i in range(done, done + n):
                t0 = clock()
                op(i)
                out.append(clock() - t0)
        done += n
    return samples


class Bench:
    """redis-benchmark against the private server."""

    def __init__(self, binary: str | None, port: int) -> None:
        self.binary = binary
        self.port = port

    def rate(self, command: Sequence[str], *, requests: int, clients: int, pipeline: int) -> float:
        """Requests per second reported by redis-benchmark (0 when it is unavailable)."""
        if self.binary is None:
            return 0.0
        cmd = [
            self.binary,
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-n",
            str(requests),
            "-c",
            str(clients),
            "-P",
            str(pipeline),
            "-r",
            "100000000",
            "--csv",
            *command,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"redis-benchmark failed: {proc.stderr.strip() or proc.stdout}")
        rows = [r for r in csv.reader(io.StringIO(proc.stdout)) if len(r) >= 2]
        for r in reversed(rows):
            try:
                return float(r[1])
            except ValueError:
                continue
        raise RuntimeError(f"cannot parse redis-benchmark output: {proc.stdout!r}")


def find_redis_benchmark(server_binary: str) -> str | None:
    sibling = Path(server_binary).with_name("redis-benchmark")
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("redis-benchmark")


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def section_latency(client: redis.Redis, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """append_event / upsert_agent_result p50, p99 against redis-py PING, interleaved."""
    same = SameShape(client)
    per: dict[str, dict[str, list[float]]] = {}
    memory_note = ""
    w = sizes.warmup
    for rnd in range(sizes.rounds):
        backend, run_id = new_run(client)
        n = sizes.latency_iters + sizes.warmup
        events = [make_agent_done(run_id, i) for i in range(n)]
        results = [make_result(i) for i in range(n)]
        ids = [str(uuid.uuid4()) for _ in range(n)]

        def ping(i: int) -> None:
            client.ping()

        def append(
            i: int, backend: RedisCheckpointBackend = backend, events: list[AgentDone] = events
        ) -> None:
            backend.append_event(events[i + w])

        def upsert(
            i: int,
            backend: RedisCheckpointBackend = backend,
            results: list[AgentResultCache] = results,
        ) -> None:
            backend.upsert_agent_result(results[i + w])

        def evalsha(i: int, ids: list[str] = ids) -> None:
            same.call(ids[i + w])

        samples = interleaved(
            {
                "ping": ping,
                "append_event": append,
                "upsert_agent_result": upsert,
                "same_shape_evalsha": evalsha,
            },
            sizes.latency_iters,
            sizes.chunk,
            sizes.warmup,
        )
        for name, s in samples.items():
            d = per.setdefault(name, {"p50": [], "p99": []})
            d["p50"].append(pct(s, 0.50) / 1000)
            d["p99"].append(pct(s, 0.99) / 1000)
        if rnd == 0:
            memory_note = _run_memory_note(client, backend, sizes.latency_iters + w)
        close_backends()
    raw["latency_rounds_us"] = per
    ping50, ping99 = per["ping"]["p50"], per["ping"]["p99"]

    def ratio(name: str, q: str) -> float:
        base = ping50 if q == "p50" else ping99
        return median([a / b for a, b in zip(per[name][q], base, strict=True)])

    rows = [
        Row(
            "ping_p50",
            "redis-py PING p50 (baseline)",
            median(ping50),
            "us",
            note=f"p99 {median(ping99):.1f} us; median of {sizes.rounds} rounds",
        ),
    ]
    for name, label, target in (
        ("append_event", "append_event(agent_done) p50", 1.25),
        ("upsert_agent_result", "upsert_agent_result p50", None),
        ("same_shape_evalsha", "raw EVALSHA same-shape script p50", None),
    ):
        r50 = ratio(name, "p50")
        rows.append(
            Row(
                f"{name}_p50",
                label,
                median(per[name]["p50"]),
                "us",
                median(ping50),
                "us",
                "PING p50",
                r50,
                f"<= {target:.2f}x PING" if target else "",
                _verdict(r50 <= target) if target else "info",
            )
        )
        rows.append(
            Row(
                f"{name}_p99",
                label.replace("p50", "p99"),
                median(per[name]["p99"]),
                "us",
                median(ping99),
                "us",
                "PING p99",
                ratio(name, "p99"),
            )
        )
    rows[-2].note = "redis-py client.evalsha of the same-shape script: server + client floor"
    rows[1].note = memory_note
    return rows


def _run_memory_note(client: redis.Redis, backend: RedisCheckpointBackend, events: int) -> str:
    keys = backend.keys
    if keys is None:
        return ""
    total = 0
    for key in keys:
        used = client.memory_usage(key, samples=0)
        total += int(used or 0)
    return (
        f"a run holding {events} agent_done + {events} upserted results uses "
        f"{total / events:,.0f} B per agent_done+upsert pair, all keys"
    )


def section_commands(client: redis.Redis, sizes: Sizes) -> list[Row]:
    """INFO commandstats deltas and client-side command counts per write."""
    counter = {"n": 0}
    original: Callable[..., Any] = client.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        counter["n"] += 1
        return original(*args, **kwargs)

    backend, run_id = new_run(client)
    k = sizes.count_ops
    events = [make_agent_done(run_id, i) for i in range(k)]
    results = [make_result(i) for i in range(k)]
    backend.append_event(make_agent_done(run_id, -1))  # scripts loaded before counting
    backend.upsert_agent_result(make_result(-1))
    rows: list[Row] = []
    ops: tuple[tuple[str, Callable[[int], None]], ...] = (
        ("append_event", lambda i: backend.append_event(events[i])),
        ("upsert_agent_result", lambda i: backend.upsert_agent_result(results[i])),
    )
    for name, op in ops:
        before = _commandstats(client)
        counter["n"] = 0
        client.execute_command = counting  # type: ignore[method-assign]
        try:
            for i in range(k):
                op(i)
        finally:
            client.execute_command = original  # type: ignore[method-assign]
        sent = counter["n"]
        after = _commandstats(client)
        delta = {c: after.get(c, 0) - before.get(c, 0) for c in after}
        delta.pop("info", None)
        scripts = sum(delta.pop(c, 0) for c in ("fcall", "fcall_ro", "evalsha", "eval"))
        inner = ", ".join(f"{c} {v / k:.2f}" for c, v in sorted(delta.items()) if v)
        ok = scripts == k and sent == k
        rows.append(
            Row(
                f"{name}_commands",
                f"{name}: commands sent per op",
                sent / k,
                "cmd",
                scripts / k,
                "cmd",
                "FCALL/op (commandstats)",
                None,
                "1 FCALL, nothing else",
                _verdict(ok),
                f"inside the script per op: {inner}",
            )
        )
    return rows


def _commandstats(client: redis.Redis) -> dict[str, int]:
    info = client.info("commandstats")
    out: dict[str, int] = {}
    for name, stats in info.items():
        if isinstance(stats, dict):
            out[name.removeprefix("cmdstat_").lower()] = int(stats.get("calls", 0))
    return out


def section_batch(
    client: redis.Redis, sizes: Sizes, bench: Bench, raw: dict[str, Any]
) -> list[Row]:
    """append_events in batches of 10 and 100 vs redis-benchmark -P 16 of the same shape."""
    same = SameShape(client)
    has_batch = callable(getattr(RedisCheckpointBackend, BATCH, None))
    rates: dict[str, list[float]] = {"bench": [], "b10": [], "b100": [], "py_pipe": []}
    for _ in range(sizes.rounds):
        same.new_keys()
        rates["bench"].append(
            bench.rate(same.bench_command(), requests=sizes.bench_pipelined, clients=1, pipeline=16)
        )
        rates["py_pipe"].append(_python_pipeline_rate(same, sizes.batch_events, 100))
        if has_batch:
            for batch in (10, 100):
                backend, run_id = new_run(client)
                events = [make_agent_done(run_id, i) for i in range(sizes.batch_events + batch)]
                append_events: Callable[[Sequence[AgentDone]], None] = getattr(backend, BATCH)
                append_events(events[:batch])  # warm-up
                t0 = time.perf_counter_ns()
                for j in range(batch, len(events), batch):
                    append_events(events[j : j + batch])
                elapsed = time.perf_counter_ns() - t0
                rates[f"b{batch}"].append(sizes.batch_events * NS / elapsed)
                close_backends()
    raw["batch_rates"] = rates
    base = median(rates["bench"]) if bench.binary else None
    base_name = "redis-benchmark -P 16 same shape" if bench.binary else "redis-benchmark missing"
    rows: list[Row] = []
    for batch in (10, 100):
        label = f"append_events, batches of {batch}"
        if not has_batch:
            rows.append(
                Row(
                    f"append_events_{batch}",
                    label,
                    None,
                    "ev/s",
                    base,
                    "ev/s",
                    base_name,
                    None,
                    ">= 40,000 ev/s" if batch == 100 else "",
                    "MISS",
                    "not implemented",
                )
            )
            continue
        value = median(rates[f"b{batch}"])
        ratio = (
            median([a / b for a, b in zip(rates[f"b{batch}"], rates["bench"], strict=True)])
            if base
            else None
        )
        target = ">= 40,000 ev/s" if batch == 100 else ""
        status = _verdict(value >= 40_000) if batch == 100 else "info"
        rows.append(
            Row(
                f"append_events_{batch}",
                label,
                value,
                "ev/s",
                base,
                "ev/s",
                base_name,
                ratio,
                target,
                status,
            )
        )
    py = median(rates["py_pipe"])
    rows.append(
        Row(
            "same_shape_pipeline_100",
            "redis-py pipeline of 100 same-shape EVALSHA",
            py,
            "ev/s",
            base,
            "ev/s",
            base_name,
            py / base if base else None,
            note="what one Python process can push with raw EVALSHA, no encoding, no cache",
        )
    )
    return rows


def _python_pipeline_rate(same: SameShape, events: int, batch: int) -> float:
    ids = [str(uuid.uuid4()) for _ in range(events)]
    client = same.client
    t0 = time.perf_counter_ns()
    for j in range(0, events, batch):
        pipe = client.pipeline(transaction=False)
        for aid in ids[j : j + batch]:
            pipe.evalsha(same.sha, len(same.keys), *same.keys, *same.args(aid))
        pipe.execute()
    return events * NS / (time.perf_counter_ns() - t0)


def section_checkpoint(client: redis.Redis, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """get_checkpoint p50 at three run sizes (interleaved), and append_event at those sizes."""
    runs = [new_run(client, n)[0] for n in sizes.checkpoint_sizes]
    per: list[list[float]] = [[] for _ in runs]
    clock = time.perf_counter_ns
    inner = range(sizes.checkpoint_inner)
    for backend in runs:  # warm-up
        for _ in inner:
            backend.get_checkpoint()
    for _ in range(sizes.checkpoint_batches):
        for idx, backend in enumerate(runs):
            get = backend.get_checkpoint
            t0 = clock()
            for _ in inner:
                get()
            per[idx].append((clock() - t0) / sizes.checkpoint_inner / 1000)
    p50 = [pct(s, 0.5) for s in per]
    raw["get_checkpoint_p50_us"] = dict(zip(map(str, sizes.checkpoint_sizes), p50, strict=True))
    rows: list[Row] = []
    small = p50[0]
    for n, value in zip(sizes.checkpoint_sizes, p50, strict=True):
        last = n == sizes.checkpoint_sizes[-1]
        ok = value <= 5.0 and (not last or value <= 2 * small)
        tag = "small" if n == sizes.checkpoint_sizes[0] else "large" if last else "mid"
        rows.append(
            Row(
                f"get_checkpoint_{tag}",
                f"get_checkpoint p50, {n:,} results",
                value,
                "us",
                small,
                "us",
                f"@{sizes.checkpoint_sizes[0]} results",
                value / small,
                "<= 5 us, <= 2x @10" if last else "<= 5 us",
                _verdict(ok),
            )
        )
    rows[0].note = f"mean of {sizes.checkpoint_inner} calls per sample, p50 of the samples"
    # append_event cost as the run grows (every result here has a finding segment)
    lat: list[list[float]] = [[] for _ in runs]
    for idx, backend in enumerate(runs):
        run_id = backend.run_id
        assert run_id is not None
        events = [make_agent_done(run_id, i) for i in range(sizes.scale_appends + 10)]
        for e in events[:10]:
            backend.append_event(e)
        for e in events[10:]:
            t0 = clock()
            backend.append_event(e)
            lat[idx].append((clock() - t0) / 1000)
    a50 = [pct(s, 0.5) for s in lat]
    raw["append_event_p50_by_size_us"] = dict(
        zip(map(str, sizes.checkpoint_sizes), a50, strict=True)
    )
    big = sizes.checkpoint_sizes[-1]
    rows.append(
        Row(
            "append_event_large_run",
            f"append_event p50, run with {big:,} results",
            a50[-1],
            "us",
            a50[0],
            "us",
            f"@{sizes.checkpoint_sizes[0]} results",
            a50[-1] / a50[0],
            note=f"not a stated target; at {sizes.checkpoint_sizes[1]:,} results: {a50[1]:,.0f} us",
        )
    )
    return rows


def section_open_run(client: redis.Redis, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """open_run of a big run from a fresh backend, against the raw load script from redis-py."""
    t_build = time.perf_counter()
    backend, run_id = new_run(client, sizes.open_results)
    keys = backend.keys
    assert keys is not None
    entries, _ = backend_entries(client, min(1000, sizes.open_events))
    replay(client, keys.events, entries, sizes.open_events)
    build = time.perf_counter() - t_build
    load = client.register_script(script_source("load"))
    key_list = list(keys)
    opens: list[float] = []
    loads: list[float] = []
    checked = False
    for _ in range(sizes.open_repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter_ns()
        load(keys=key_list)
        loads.append((time.perf_counter_ns() - t0) / NS)
        fresh = RedisCheckpointBackend(client, prefix=PREFIX)
        _OPEN.append(fresh)
        t0 = time.perf_counter_ns()
        cp = fresh.open_run(run_id)
        opens.append((time.perf_counter_ns() - t0) / NS)
        if not checked:
            assert cp is not None and len(cp.agent_results) == sizes.open_results
            checked = True
    xlen = int(client.xlen(keys.events))
    raw["open_run_s"] = opens[1:]
    raw["load_script_s"] = loads[1:]
    value, base = median(opens[1:]), median(loads[1:])
    return [
        Row(
            "open_run",
            f"open_run, {sizes.open_results:,} results + {xlen:,} events",
            value,
            "s",
            base,
            "s",
            "raw load script (redis-py)",
            value / base,
            "<= 0.5 s",
            _verdict(value <= 0.5),
            f"built in {build:.1f} s (save_checkpoint + XADD replay of append_event entries); "
            f"ratio = decoding + cache build on top of the server's reply",
        )
    ]


def _writer(url: str, run_id: str, seconds: float, barrier: Any, queue: Any) -> None:
    """One writer process: open the shared run and append agent_done events for `seconds`."""
    client = redis.Redis.from_url(url)
    backend = RedisCheckpointBackend(client, prefix=PREFIX)
    rid = uuid.UUID(run_id)
    backend.open_run(rid)
    events = [make_agent_done(rid, i) for i in range(3000)]
    backend.append_event(events[0])  # warm-up, loads the script
    barrier.wait()
    count = gaps = 0
    clock = time.perf_counter_ns
    t0 = clock()
    deadline = t0 + int(seconds * NS)
    while clock() < deadline:
        if count + 1 >= len(events):
            events += [make_agent_done(rid, i) for i in range(len(events), len(events) + 1000)]
        before = backend.version
        backend.append_event(events[count + 1])
        if backend.version != before + 1:
            gaps += 1
        count += 1
    queue.put((count, clock() - t0, gaps))
    backend.close()
    client.close()


def section_writers(
    client: redis.Redis, url: str, sizes: Sizes, bench: Bench, raw: dict[str, Any]
) -> list[Row]:
    """N processes appending to one run, against redis-benchmark -c N of the same shape."""
    ctx = mp.get_context("spawn")
    same = SameShape(client)
    mine: dict[int, list[float]] = {n: [] for n in sizes.writers}
    theirs: dict[int, list[float]] = {n: [] for n in sizes.writers}
    reloads: dict[int, list[float]] = {n: [] for n in sizes.writers}
    for _ in range(max(1, sizes.rounds - 2)):
        for n in sizes.writers:
            same.new_keys()
            theirs[n].append(
                bench.rate(
                    same.bench_command(), clients=n, pipeline=1, requests=sizes.bench_per_client * n
                )
            )
            _, run_id = new_run(client)
            barrier = ctx.Barrier(n + 1)
            queue = ctx.Queue()
            procs = [
                ctx.Process(
                    target=_writer, args=(url, str(run_id), sizes.writer_seconds, barrier, queue)
                )
                for _ in range(n)
            ]
            for p in procs:
                p.start()
            barrier.wait(timeout=120)
            got = [queue.get(timeout=sizes.writer_seconds + 120) for _ in procs]
            for p in procs:
                p.join(timeout=30)
            mine[n].append(sum(c * NS / e for c, e, _ in got))
            reloads[n].append(sum(g for _, _, g in got) / max(1, sum(c for c, _, _ in got)))
    raw["writers_ev_s"] = {str(n): v for n, v in mine.items()}
    raw["writers_bench_ev_s"] = {str(n): v for n, v in theirs.items()}
    raw["writers_reload_fraction"] = {str(n): v for n, v in reloads.items()}
    rows: list[Row] = []
    for n in sizes.writers:
        value = median(mine[n])
        base = median(theirs[n]) if bench.binary else None
        ratio = median([a / b for a, b in zip(mine[n], theirs[n], strict=True)]) if base else None
        last = n == max(sizes.writers)
        rows.append(
            Row(
                f"writers_{n}",
                f"{n} writer process{'es' if n > 1 else ''}, one run",
                value,
                "ev/s",
                base,
                "ev/s",
                f"redis-benchmark -c {n} same shape",
                ratio,
                ">= 0.40x" if last else "",
                (_verdict(ratio is not None and ratio >= 0.40) if last else "info"),
                f"{median(reloads[n]) * 100:.0f}% of appends came after another writer's "
                f"change (applied from its notice, or by a reload)",
            )
        )
    return rows


def section_memory(client: redis.Redis, sizes: Sizes) -> list[Row]:
    """MEMORY USAGE of a stream of agent_done entries per entry vs the luft JSON size."""
    keys = run_keys(PREFIX, uuid.uuid4())
    entries, events = backend_entries(client, min(2000, sizes.memory_events))
    replay(client, keys.events, entries, sizes.memory_events)
    used = int(client.memory_usage(keys.events, samples=0) or 0)
    count = int(client.xlen(keys.events))
    per_event = used / count
    compact = median([len(json.dumps(e.to_json(), separators=(",", ":"))) for e in events])
    spaced = median([len(json.dumps(e.to_json())) for e in events])
    blob = median([len(codec.encode_event(e)) for e in events])
    ratio = per_event / compact
    return [
        Row(
            "memory_per_event",
            f"stream memory per agent_done ({count:,} entries)",
            per_event,
            "B",
            compact,
            "B",
            "luft JSON (compact)",
            ratio,
            "<= 0.60x",
            _verdict(ratio <= 0.60),
            f"entries written by append_event (replayed); msgpack blob {blob:.0f} B; "
            f"json.dumps with default separators {spaced:.0f} B",
        )
    ]


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def header(client: redis.Redis, server_binary: str, bench_binary: str | None) -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import hiredis

        hiredis_version = str(getattr(hiredis, "__version__", "?"))
    except ImportError:
        hiredis_version = "not installed"
    info = client.info("server")
    source = Path(luft_redis.__file__).resolve().parent
    git_env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # read-only git calls
    repo = str(source.parent)
    git = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--short", "HEAD"],
        env=git_env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", repo, "diff", "--name-only", "HEAD", "--", "luft_redis", "lua"],
        env=git_env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True, check=False)
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "uname": uname.stdout.strip() or " ".join(platform.uname()),
        "cpu": f"{cpu} ({os.cpu_count()} cores visible)",
        "python": platform.python_version(),
        "luft-redis": f"{luft_redis.__version__} from {source}"
        + (f" at {git}{' + uncommitted changes' if dirty else ''}" if git else ""),
        "redis-py": redis.__version__,
        "hiredis": hiredis_version,
        "redis-server": f"{info.get('redis_version')} ({server_binary})",
        "redis-benchmark": bench_binary or "not found (its baselines are n/a)",
        "server config": "appendonly no, save '' (no persistence: measures CPU + loopback)",
    }


SECTIONS = ("latency", "commands", "batch", "checkpoint", "open_run", "writers", "memory")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI): < 30 s")
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers as JSON")
    parser.add_argument("--redis-server", metavar="PATH", help="redis-server binary to start")
    parser.add_argument(
        "--only",
        metavar="SECTION",
        action="append",
        choices=SECTIONS,
        help="run only these sections (repeatable)",
    )
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    binary = args.redis_server or find_redis_server()
    if binary is None:
        print("redis-server not found: pass --redis-server PATH", file=sys.stderr)
        return 2
    bench_binary = find_redis_benchmark(binary)
    sections = args.only or list(SECTIONS)
    started = time.perf_counter()
    rows: list[Row] = []
    raw: dict[str, Any] = {"mode": "smoke" if args.smoke else "full", "sizes": asdict(sizes)}
    placement = plan_placement()
    with LocalRedisServer(binary=binary, appendonly=False) as server:
        pin_server(placement, server.pid)
        client = redis.Redis.from_url(server.url)
        head = header(client, binary, bench_binary)
        head["placement"] = placement.describe(server.pid)
        print(f"luft-redis benchmarks ({raw['mode']} mode)")
        for k, v in head.items():
            print(f"  {k}: {v}")
        print(flush=True)
        bench = Bench(bench_binary, server.port)
        steps: dict[str, Callable[[], list[Row]]] = {
            "latency": lambda: section_latency(client, sizes, raw),
            "commands": lambda: section_commands(client, sizes),
            "batch": lambda: section_batch(client, sizes, bench, raw),
            "checkpoint": lambda: section_checkpoint(client, sizes, raw),
            "open_run": lambda: section_open_run(client, sizes, raw),
            "writers": lambda: section_writers(client, server.url, sizes, bench, raw),
            "memory": lambda: section_memory(client, sizes),
        }
        for name in SECTIONS:
            if name in sections:
                t0 = time.perf_counter()
                rows += steps[name]()
                close_backends()
                print(f"  [{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
                client.flushall(asynchronous=True)
        client.close()
    print()
    print_table(rows)
    elapsed = time.perf_counter() - started
    missed = [r.metric for r in rows if r.status == "MISS"]
    print(
        f"\n{len(rows)} rows in {elapsed:.1f} s; targets met: "
        f"{sum(r.status == 'PASS' for r in rows)}, missed: {len(missed)}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"header": head, "rows": [asdict(r) for r in rows], "raw": raw}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
