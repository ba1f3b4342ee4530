"""luft-redis benchmark harness: one command, one private redis-server, a table of ratios.

Run from the repository root::

    .venv/bin/python -m benchmarks.run            # full run (a few minutes)
    .venv/bin/python -m benchmarks.run --smoke    # tiny sizes (< 30 s), what CI runs
    .venv/bin/python -m benchmarks.run --json out.json --redis-server /usr/bin/redis-server

Every figure is compared with a baseline measured in the same run on the same server (redis-py
PING; a raw redis-py FCALL and redis-benchmark running the real append function with the exact
keys and arguments the backend sends, recorded from one append_event; INFO commandstats of the
commands the function runs; ...), because the machines this runs on are shared and noisy:
absolute numbers are printed but only ratios are meaningful. Baseline and subject are
interleaved (A/B/A/B) and the median of the rounds is reported. See docs/performance.md for
what each row measures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import re
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
        if value < 10:
            return f"{value:.2f} us"
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


# --------------------------------------------------------------------------------------------
# Baselines from the library's own encoder
# --------------------------------------------------------------------------------------------
# The raw-FCALL and redis-benchmark baselines run the real append function with the exact
# keys and arguments the backend sends: one append_event is recorded (the backend's one
# attempt, ``_fcall``, is wrapped on that instance) and the recorded command is replayed with
# a new writer id per call (and a new agent id where it appears as text), so no call is an
# exactly-once replay. Nothing here knows the argument layout: it follows the library.

# A 32-character writer id (the length of a uuid4().hex) whose last 12 characters
# redis-benchmark replaces with random digits on every request; same for a 36-character agent id.
BENCH_WRITER = b"0" * 20 + b"__rand_int__"
BENCH_AGENT = b"00000000-0000-4000-8000-__rand_int__"


@dataclass
class Captured:
    """One recorded FCALL, encoded by redis-py exactly as it went on the wire."""

    command: list[bytes]
    numkeys: int
    writer: bytes  # the backend's writer id, to be replaced per call
    agent: bytes  # the event's agent id as text (replaced where it occurs as text)
    keys: list[bytes]

    def fresh(self, writer: bytes | None = None, agent: bytes | None = None) -> list[bytes]:
        """The command with another writer id (and agent id): a new write, not a replay."""
        writer = writer or uuid.uuid4().hex.encode()
        agent = agent or str(uuid.uuid4()).encode()
        start = 3 + self.numkeys
        args = [a.replace(self.writer, writer).replace(self.agent, agent)
                for a in self.command[start:]]  # fmt: skip
        return [*self.command[:start], *args]

    def agent_in_args(self) -> bool:
        return any(self.agent in a for a in self.command[3 + self.numkeys :])


def encode_command(client: redis.Redis, command: Sequence[Any]) -> list[bytes]:
    encoder = client.connection_pool.get_encoder()
    encode = cast(Callable[[Any], bytes], encoder.encode)
    return [bytes(encode(x)) for x in command]


def send(client: redis.Redis | Any, command: Sequence[Any]) -> Any:
    """``client.execute_command(*command)`` (a client or a pipeline)."""
    execute = cast(Callable[..., Any], client.execute_command)
    return execute(*command)


def recording(backend: RedisCheckpointBackend) -> list[tuple[Any, list[Any], list[Any]]]:
    """Wrap ``backend``'s one-attempt FCALL so every call's (function, keys, args) is kept."""
    original: Callable[..., Any] | None = getattr(backend, "_fcall", None)
    if original is None:
        raise RuntimeError(
            "RedisCheckpointBackend._fcall is gone: update benchmarks/run.py to record the "
            "FCALL elsewhere (luft_redis._sync.fcall.call_function)"
        )
    seen: list[tuple[Any, list[Any], list[Any]]] = []

    def record(fn: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        seen.append((fn, list(keys), list(args)))
        assert original is not None
        return original(fn, keys, args)

    backend._fcall = record  # type: ignore[method-assign]
    return seen


def capture_append(client: redis.Redis) -> tuple[Captured, RedisCheckpointBackend]:
    """Record the FCALL of one append_event(agent_done) on a new run of its own."""
    backend, run_id = new_run(client)
    backend.append_event(make_agent_done(run_id, 0))  # the library is loaded
    seen = recording(backend)
    lane = getattr(backend, "_lane", None)  # the lean write path: off while recording
    backend._lane = None  # type: ignore[attr-defined,unused-ignore]
    event = make_agent_done(run_id, 1)
    backend.append_event(event)
    del backend._fcall
    backend._lane = lane  # type: ignore[attr-defined,unused-ignore]
    if len(seen) != 1:
        raise RuntimeError(f"append_event made {len(seen)} FCALLs, expected 1")
    fn, keys, args = seen[0]
    command = encode_command(client, fn.command(keys, args))
    writer = str(backend._writer_id).encode()
    captured = Captured(command, int(fn.numkeys), writer, str(event.agent_id).encode(),
                        command[3 : 3 + int(fn.numkeys)])  # fmt: skip
    if not any(writer in a for a in command[3 + captured.numkeys :]):
        raise RuntimeError("the writer id is not among the recorded FCALL's arguments")
    return captured, backend


def bench_command(client: redis.Redis, captured: Captured) -> tuple[list[bytes], str]:
    """The captured FCALL for redis-benchmark (``__rand_int__`` in the writer id and the agent
    id) and a note. redis-benchmark takes its arguments from argv, which cannot hold a NUL
    byte: each NUL of an argument becomes 0x01 (the stored event blob is opaque to the Lua);
    one redis-py call of that command with concrete ids checks that the function accepts it."""
    command = captured.fresh(BENCH_WRITER, BENCH_AGENT)
    nuls = sum(a.count(b"\0") for a in command)
    command = [a.replace(b"\0", b"\x01") for a in command]
    probe = [a.replace(b"__rand_int__", b"%012d" % (i + 1)) for i, a in enumerate(command)]
    send(client, probe)  # raises when the function rejects the argv-safe command
    notes = [f"{nuls} NUL byte(s) of the args sent as 0x01 (argv)"] if nuls else []
    if not captured.agent_in_args():
        notes.append("the agent id is not in the args as text: the same agent every request")
    return command, "; ".join(notes)


def writers_count(client: redis.Redis, captured: Captured) -> int:
    """Entries of the run's exactly-once record (one per writer id): counts the distinct
    writers redis-benchmark made, i.e. that ``__rand_int__`` was replaced inside the id."""
    for key in captured.keys:
        if key.endswith(b":writers"):
            return int(client.hlen(key))
    return -1


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


_TRAILING_NUMBERS = re.compile(r'"([0-9.]+)"(?:,"[0-9.]+"){6}$')
"""The last 7 fields of redis-benchmark's ``--csv`` row; group 1 is the requests per second."""


class Bench:
    """redis-benchmark against the private server."""

    def __init__(self, binary: str | None, port: int) -> None:
        self.binary = binary
        self.port = port

    def rate(
        self, command: Sequence[bytes | str], *, requests: int, clients: int, pipeline: int
    ) -> float:
        """Requests per second reported by redis-benchmark (0 when it is unavailable)."""
        if self.binary is None:
            return 0.0
        cmd: list[bytes | str] = [
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
        proc = subprocess.run(cmd, capture_output=True, timeout=600, check=False)
        out = proc.stdout.decode("latin-1")  # the test name is the command: binary bytes
        if proc.returncode != 0:
            raise RuntimeError(f"redis-benchmark failed: {proc.stderr.decode('latin-1')} {out}")
        # the last row ends with 7 quoted numbers: rps, avg, min, p50, p95, p99, max. Its first
        # field, the test name, is the command itself: the event blob's random bytes may hold
        # a CR, LF or quote, so the row is not parsed as CSV: only its trailing numbers count.
        numbers = _TRAILING_NUMBERS.search(out.rstrip())
        if numbers is not None:
            return float(numbers.group(1))
        raise RuntimeError(f"cannot parse redis-benchmark output: {out!r:.2000}")


def find_redis_benchmark(server_binary: str) -> str | None:
    sibling = Path(server_binary).with_name("redis-benchmark")
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("redis-benchmark")


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def section_latency(client: redis.Redis, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """append_event / upsert_agent_result p50, p99 against redis-py PING and a raw redis-py
    FCALL of the recorded append command, interleaved."""
    per: dict[str, dict[str, list[float]]] = {}
    memory_note = ""
    w = sizes.warmup
    agent_fresh = True
    for rnd in range(sizes.rounds):
        captured, _ = capture_append(client)
        agent_fresh = captured.agent_in_args()
        backend, run_id = new_run(client)
        n = sizes.latency_iters + sizes.warmup
        events = [make_agent_done(run_id, i) for i in range(n)]
        results = [make_result(i) for i in range(n)]
        fcalls = [captured.fresh() for _ in range(n + w)]

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

        def fcall(i: int, fcalls: list[list[bytes]] = fcalls) -> None:
            send(client, fcalls[i + w])

        samples = interleaved(
            {"ping": ping, "append_event": append, "upsert_agent_result": upsert,
             "raw_fcall": fcall},
            sizes.latency_iters, sizes.chunk, sizes.warmup,
        )  # fmt: skip
        for name, s in samples.items():
            d = per.setdefault(name, {"p50": [], "p99": []})
            d["p50"].append(pct(s, 0.50) / 1000)
            d["p99"].append(pct(s, 0.99) / 1000)
        if rnd == 0:
            memory_note = _run_memory_note(client, backend, sizes.latency_iters + w)
        close_backends()
    raw["latency_rounds_us"] = per
    raw["append_event_p50_us"] = median(per["append_event"]["p50"])

    def ratio(name: str, q: str, base: str) -> float:
        return median([a / b for a, b in zip(per[name][q], per[base][q], strict=True)])

    def m(name: str, q: str = "p50") -> float:
        return median(per[name][q])

    rows = [
        Row("ping_p50", "redis-py PING p50 (baseline)", m("ping"), "us",
            note=f"p99 {m('ping', 'p99'):.1f} us; median of {sizes.rounds} rounds"),
    ]  # fmt: skip
    r_ping = ratio("append_event", "p50", "ping")
    rows.append(Row("append_event_p50", "append_event(agent_done) p50", m("append_event"), "us",
                    m("ping"), "us", "PING p50", r_ping, "<= 1.60x (goal 1.25x)",
                    _verdict(r_ping <= 1.60),
                    f"goal 1.25x {'met' if r_ping <= 1.25 else 'not met'}; "
                    f"{memory_note}"))  # fmt: skip
    r_raw = ratio("append_event", "p50", "raw_fcall")
    rows.append(Row("append_event_vs_fcall_p50", "append_event p50 vs raw FCALL",
                    m("append_event"), "us", m("raw_fcall"), "us",
                    "redis-py FCALL, same args", r_raw, "<= 1.30x", _verdict(r_raw <= 1.30),
                    "baseline: client.execute_command of the recorded append FCALL (args "
                    "pre-encoded, a new writer id per call where the backend reuses its id "
                    "with the next op seq), reply not decoded"
                    + ("" if agent_fresh else "; the agent id is not in the args as text, so "
                       "every raw call repeats the same agent's agent_done")))  # fmt: skip
    rows.append(Row("append_event_p99", "append_event(agent_done) p99", m("append_event", "p99"),
                    "us", m("ping", "p99"), "us", "PING p99",
                    ratio("append_event", "p99", "ping")))  # fmt: skip
    rows.append(Row("raw_fcall_p50", "raw FCALL of the append function p50", m("raw_fcall"),
                    "us", m("ping"), "us", "PING p50", ratio("raw_fcall", "p50", "ping"),
                    note="the server + redis-py floor of an append"))  # fmt: skip
    for q in ("p50", "p99"):
        rows.append(Row(f"upsert_agent_result_{q}", f"upsert_agent_result {q}",
                        m("upsert_agent_result", q), "us", m("ping", q), "us", f"PING {q}",
                        ratio("upsert_agent_result", q, "ping")))  # fmt: skip
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


SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "eval", "evalsha_ro", "eval_ro")


class _CountingLane:
    """A backend's write lane (``luft_redis._sync.fcall.WriteLane``) that counts the commands it
    sends in ``counter["n"]``, as the patched ``execute_command`` counts the others."""

    def __init__(self, lane: Any, counter: dict[str, int]) -> None:
        self._lane = lane
        self._counter = counter

    def call(self, *args: Any) -> Any:
        self._counter["n"] += 1
        return self._lane.call(*args)

    def close(self) -> None:
        self._lane.close()


def section_server(client: redis.Redis, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """Commands sent per write, and the append function's server time against the Redis
    commands it runs (INFO commandstats before/after each round, on this otherwise idle
    private server; the median round is reported, so one descheduled call does not decide)."""
    counter = {"n": 0}
    original: Callable[..., Any] = client.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        counter["n"] += 1
        return original(*args, **kwargs)

    backend, run_id = new_run(client)
    lane = backend._lane  # the backend's writes bypass execute_command: count them there too
    if lane is not None:
        backend._lane = _CountingLane(lane, counter)  # type: ignore[assignment]
    k = sizes.count_ops
    rounds = sizes.rounds
    events = [make_agent_done(run_id, i) for i in range(k * rounds)]
    results = [make_result(i) for i in range(k * rounds)]
    backend.append_event(make_agent_done(run_id, -1))  # library loaded before counting
    backend.upsert_agent_result(make_result(-1))
    rows: list[Row] = []
    ops: tuple[tuple[str, Callable[[int], None]], ...] = (
        ("append_event", lambda i: backend.append_event(events[i])),
        ("upsert_agent_result", lambda i: backend.upsert_agent_result(results[i])),
    )
    for name, op in ops:
        per_round: list[tuple[float, float, dict[str, tuple[int, int]]]] = []
        sent = script_calls = 0
        for r in range(rounds):
            before = _commandstats(client)
            counter["n"] = 0
            client.execute_command = counting  # type: ignore[method-assign]
            try:
                for i in range(r * k, (r + 1) * k):
                    op(i)
            finally:
                client.execute_command = original  # type: ignore[method-assign]
            sent += counter["n"]
            after = _commandstats(client)
            delta = {c: (calls - before.get(c, (0, 0))[0], usec - before.get(c, (0, 0))[1])
                     for c, (calls, usec) in after.items()}  # fmt: skip
            for c in ("info", "ping"):
                delta.pop(c, None)
            scripts = [delta.pop(c) for c in SCRIPT_COMMANDS if c in delta]
            calls = sum(d[0] for d in scripts)
            script_calls += calls
            inner = {c: d for c, d in sorted(delta.items()) if d[0]}
            per_round.append((sum(d[1] for d in scripts) / max(1, calls),
                              sum(d[1] for d in inner.values()) / k, inner))  # fmt: skip
        total = k * rounds
        ok = script_calls == total and sent == total
        last = per_round[-1][2]
        listing = ", ".join(f"{c} {d[0] / k:.2f}" for c, d in last.items())
        rows.append(Row(f"{name}_commands", f"{name}: commands sent per op", sent / total,
                        "cmd", script_calls / total, "cmd", "FCALL/op (commandstats)", None,
                        "1 FCALL, nothing else", _verdict(ok),
                        f"inside the function per op: {listing}"))  # fmt: skip
        if name != "append_event":
            continue
        fcall_us = median([f for f, _, _ in per_round])
        inner_us = median([i for _, i, _ in per_round])
        ratio = median([f / i for f, i, _ in per_round if i]) if inner_us else None
        names = sorted({c for _, _, inner in per_round for c in inner})
        breakdown: dict[str, dict[str, float]] = {}
        for c in names:
            got = [inner[c] for _, _, inner in per_round if c in inner]
            breakdown[c] = {"calls_per_op": median([d[0] / k for d in got]),
                            "usec_per_call": median([d[1] / d[0] for d in got])}  # fmt: skip
            breakdown[c]["usec_per_op"] = breakdown[c]["calls_per_op"] * breakdown[c][
                "usec_per_call"]
        raw["append_server_time"] = {"fcall_usec_per_call": fcall_us,
                                     "inner_usec_per_op": inner_us, "ratio": ratio,
                                     "ops_per_round": k, "rounds": rounds,
                                     "per_round": [[f, i] for f, i, _ in per_round],
                                     "inner": breakdown}  # fmt: skip
        top = sorted(breakdown.items(), key=lambda x: -x[1]["usec_per_op"])
        rows.append(Row("append_server_time", "append function server time (commandstats)",
                        fcall_us, "us", inner_us, "us", "its Redis commands, summed", ratio,
                        "<= 2.50x", _verdict(ratio is not None and ratio <= 2.50),
                        f"median of {rounds} rounds of {k}: fcall usec_per_call vs the sum over "
                        "the inner commands of calls/op x usec_per_call: "
                        + ", ".join(f"{c} {v['calls_per_op']:.2f}x{v['usec_per_call']:.2f}"
                                    for c, v in top)))  # fmt: skip
    return rows


def _commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """(calls, usec) of every command in INFO commandstats."""
    info = client.info("commandstats")
    out: dict[str, tuple[int, int]] = {}
    for name, stats in info.items():
        if isinstance(stats, dict):
            out[name.removeprefix("cmdstat_").lower()] = (int(stats.get("calls", 0)),
                                                          int(stats.get("usec", 0)))  # fmt: skip
    return out


def section_batch(
    client: redis.Redis, sizes: Sizes, bench: Bench, raw: dict[str, Any]
) -> list[Row]:
    """append_events in batches of 10 and 100 vs redis-benchmark -P 16 of the recorded
    one-event FCALL (a new writer per request)."""
    rates: dict[str, list[float]] = {"bench": [], "b10": [], "b100": [], "py_pipe": []}
    bench_note = ""
    new_writers: list[float] = []
    for _ in range(sizes.rounds):
        captured, _ = capture_append(client)
        if bench.binary:
            command, bench_note = bench_command(client, captured)
            before = writers_count(client, captured)
            rates["bench"].append(bench.rate(command, requests=sizes.bench_pipelined,
                                             clients=1, pipeline=16))  # fmt: skip
            new_writers.append((writers_count(client, captured) - before) / sizes.bench_pipelined)
        rates["py_pipe"].append(_python_pipeline_rate(client, captured, sizes.batch_events, 100))
        for batch in (10, 100):
            backend, run_id = new_run(client)
            events = [make_agent_done(run_id, i) for i in range(sizes.batch_events + batch)]
            backend.append_events(events[:batch])  # warm-up
            t0 = time.perf_counter_ns()
            for j in range(batch, len(events), batch):
                backend.append_events(events[j : j + batch])
            elapsed = time.perf_counter_ns() - t0
            rates[f"b{batch}"].append(sizes.batch_events * NS / elapsed)
        close_backends()
    raw["batch_rates"] = rates
    raw["bench_new_writer_fraction"] = new_writers
    base = median(rates["bench"]) if bench.binary else None
    base_name = ("redis-benchmark -P 16, one-event FCALL" if bench.binary
                 else "redis-benchmark missing")  # fmt: skip
    checked = (f"redis-benchmark made a new writer on {median(new_writers) * 100:.1f}% of "
               f"its requests" if new_writers else "")  # fmt: skip
    rows: list[Row] = []
    for batch in (10, 100):
        value = median(rates[f"b{batch}"])
        ratio = (median([a / b for a, b in zip(rates[f"b{batch}"], rates["bench"], strict=True)])
                 if base else None)  # fmt: skip
        if batch == 100:
            ok = ratio is not None and ratio >= 1.0
            aim = f"aim 40,000 ev/s: {'met' if value >= 40_000 else 'not met'}"
            note = "; ".join(x for x in (aim, checked, bench_note) if x)
            rows.append(Row("append_events_100", "append_events, batches of 100", value, "ev/s",
                            base, "ev/s", base_name, ratio, ">= 1.00x (aim 40,000 ev/s)",
                            _verdict(ok) if base else "n/a", note))  # fmt: skip
        else:
            rows.append(Row("append_events_10", "append_events, batches of 10", value, "ev/s",
                            base, "ev/s", base_name, ratio))  # fmt: skip
    py = median(rates["py_pipe"])
    rows.append(Row("raw_fcall_pipeline_100", "redis-py pipeline of 100 raw FCALLs", py, "ev/s",
                    base, "ev/s", base_name, py / base if base else None,
                    note="the recorded one-event FCALL, pre-encoded: what one Python process "
                    "pushes with no encoding and no cache"))  # fmt: skip
    return rows


def _python_pipeline_rate(client: redis.Redis, captured: Captured, events: int,
                          batch: int) -> float:  # fmt: skip
    commands = [captured.fresh() for _ in range(events)]
    t0 = time.perf_counter_ns()
    for j in range(0, events, batch):
        pipe = client.pipeline(transaction=False)
        for command in commands[j : j + batch]:
            send(pipe, command)
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


def build_big_run(client: redis.Redis, sizes: Sizes) -> tuple[uuid.UUID, float]:
    """A run of ``open_results`` results and ``open_events`` append_event entries."""
    t_build = time.perf_counter()
    backend, run_id = new_run(client, sizes.open_results)
    keys = backend.keys
    assert keys is not None
    entries, _ = backend_entries(client, min(1000, sizes.open_events))
    replay(client, keys.events, entries, sizes.open_events)
    return run_id, time.perf_counter() - t_build


def capture_load(client: redis.Redis, run_id: uuid.UUID) -> list[bytes]:
    """The FCALL_RO that open_run sends to load the run, as recorded."""
    backend = RedisCheckpointBackend(client, prefix=PREFIX)
    _OPEN.append(backend)
    seen = recording(backend)
    backend.open_run(run_id)
    if len(seen) != 1:
        raise RuntimeError(f"open_run made {len(seen)} FCALLs, expected 1")
    fn, keys, args = seen[0]
    return encode_command(client, fn.command(keys, args))


def time_open_run(client: redis.Redis, run_id: uuid.UUID, expect: int) -> float:
    fresh = RedisCheckpointBackend(client, prefix=PREFIX)
    _OPEN.append(fresh)
    t0 = time.perf_counter_ns()
    cp = fresh.open_run(run_id)
    elapsed = (time.perf_counter_ns() - t0) / NS
    assert cp is not None and len(cp.agent_results) == expect
    return elapsed


def section_open_run(client: redis.Redis, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """open_run of a big run from a fresh backend, against the raw load FCALL_RO (redis-py)."""
    run_id, build = build_big_run(client, sizes)
    load = capture_load(client, run_id)
    opens: list[float] = []
    loads: list[float] = []
    for _ in range(sizes.open_repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter_ns()
        send(client, load)
        loads.append((time.perf_counter_ns() - t0) / NS)
        opens.append(time_open_run(client, run_id, sizes.open_results))
        close_backends()
    xlen = int(client.xlen(run_keys(PREFIX, run_id).events))
    raw["open_run_s"] = opens[1:]
    raw["load_fcall_s"] = loads[1:]
    value, base = median(opens[1:]), median(loads[1:])
    ratio = median([a / b for a, b in zip(opens[1:], loads[1:], strict=True)])
    return [Row("open_run", f"open_run, {sizes.open_results:,} results + {xlen:,} events", value,
                "s", base, "s", "raw FCALL_RO load (redis-py)", ratio, "<= 1.50x",
                _verdict(ratio <= 1.50),
                f"built in {build:.1f} s (save_checkpoint + XADD replay of append_event "
                f"entries); baseline: the recorded load FCALL_RO through redis-py, reply parsed "
                f"to bytes and lists, not decoded")]  # fmt: skip


def section_parser(client: redis.Redis, url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """append_event p50 and open_run time with hiredis vs redis-py's pure-Python parser."""
    try:
        import hiredis  # noqa: F401
        from redis._parsers import _HiredisParser, _RESP2Parser
    except ImportError as exc:
        return [Row(key, label, None, unit, status="n/a", note=f"hiredis unavailable ({exc})")
                for key, label, unit in (("hiredis_append_p50", "append_event p50, hiredis vs "
                                          "pure-Python parser", "us"),
                                         ("hiredis_open_run", "open_run, hiredis vs pure-Python "
                                          "parser", "s"))]  # fmt: skip
    clients = {"hiredis": redis.Redis.from_url(url, parser_class=_HiredisParser),
               "python": redis.Redis.from_url(url, parser_class=_RESP2Parser)}  # fmt: skip
    per: dict[str, list[float]] = {"hiredis": [], "python": []}
    w = sizes.warmup
    for _ in range(sizes.rounds):
        ops: dict[str, Callable[[int], Any]] = {}
        for name, c in clients.items():
            backend, run_id = new_run(c)
            events = [make_agent_done(run_id, i) for i in range(sizes.latency_iters + w)]

            def append(i: int, b: RedisCheckpointBackend = backend,
                       events: list[AgentDone] = events) -> None:  # fmt: skip
                b.append_event(events[i + w])

            ops[name] = append
        samples = interleaved(ops, sizes.latency_iters, sizes.chunk, w)
        for name, s in samples.items():
            per[name].append(pct(s, 0.5) / 1000)
        close_backends()
    run_id, _ = build_big_run(client, sizes)
    opens: dict[str, list[float]] = {"hiredis": [], "python": []}
    for rep in range(sizes.open_repeats + 1):
        for name, c in clients.items():
            elapsed = time_open_run(c, run_id, sizes.open_results)
            if rep:
                opens[name].append(elapsed)
        close_backends()
    for c in clients.values():
        c.close()
    raw["parser_append_p50_us"] = per
    raw["parser_open_run_s"] = opens
    a_ratio = median([p / h for p, h in zip(per["python"], per["hiredis"], strict=True)])
    o_ratio = median([p / h for p, h in zip(opens["python"], opens["hiredis"], strict=True)])
    return [
        Row("hiredis_append_p50", "append_event p50, pure-Python parser", median(per["python"]),
            "us", median(per["hiredis"]), "us", "hiredis parser", a_ratio,
            note="what a missing hiredis wheel costs a write (ratio = python / hiredis)"),
        Row("hiredis_open_run", "open_run, pure-Python parser", median(opens["python"]), "s",
            median(opens["hiredis"]), "s", "hiredis parser", o_ratio,
            note=f"{sizes.open_results:,} results + {sizes.open_events:,} events"),
    ]  # fmt: skip


def section_stats(client: redis.Redis, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """What the always-on counters cost: the ``_retried`` wrapper path (retry policy, the
    counters, the wait clock) around a stub attempt vs calling that stub ``_fcall`` directly,
    with no I/O; and one ``stats()`` call."""
    backend, run_id = new_run(client)
    backend.append_event(make_agent_done(run_id, 0))
    captured, _ = capture_append(client)
    fn = backend._scripts.append_events
    keys = [k.decode() for k in captured.keys]
    args = captured.command[3 + captured.numkeys :]
    reply = b""

    def stub(fn: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return reply

    backend._fcall = stub  # type: ignore[method-assign]
    n = sizes.latency_iters * 20
    clock = time.perf_counter_ns
    direct: list[float] = []
    wrapped: list[float] = []
    stats: list[float] = []
    call = backend._call
    for _ in range(sizes.rounds * 3):
        t0 = clock()
        for _ in range(n):
            stub(fn, keys, args)
        direct.append((clock() - t0) / n)
        t0 = clock()
        for _ in range(n):
            call(fn, args, keys, run_id)
        wrapped.append((clock() - t0) / n)
        t0 = clock()
        for _ in range(n // 10):
            backend.stats()
        stats.append((clock() - t0) / (n // 10) / 1000)
    del backend._fcall
    raw["stats_wrapper_ns"] = {"direct": direct, "wrapped": wrapped}
    raw["stats_call_us"] = stats
    cost = median([b - a for a, b in zip(direct, wrapped, strict=True)])
    append_p50 = raw.get("append_event_p50_us")
    share = (f"{cost / 1000 / append_p50 * 100:.2f}% of append_event p50 ({append_p50:,.0f} us); "
             if append_p50 else "")  # fmt: skip
    return [
        Row("stats_write_cost", "counters: _retried wrapper per write", cost / 1000, "us",
            median(direct) / 1000, "us", "stub _fcall called directly",
            note=f"{share}the per-write cost of the wrapper that keeps the counters (retry "
            "policy, attempt count, wait clock, retries) around a stub attempt, no I/O"),
        Row("stats_call", "backend.stats() call", median(stats), "us",
            note="one snapshot of the counters"),
    ]  # fmt: skip


def _writer(url: str, run_id: str, seconds: float, barrier: Any, queue: Any) -> None:
    """One writer process: open the shared run and append agent_done events for `seconds`."""
    client = redis.Redis.from_url(url)
    backend = RedisCheckpointBackend(client, prefix=PREFIX)
    rid = uuid.UUID(run_id)
    backend.open_run(rid)
    events = [make_agent_done(rid, i) for i in range(3000)]
    backend.append_event(events[0])  # warm-up
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
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
    queue.put((count, clock() - t0, gaps, affinity))
    backend.close()
    client.close()


def section_writers(
    client: redis.Redis, url: str, sizes: Sizes, bench: Bench, raw: dict[str, Any]
) -> list[Row]:
    """N spawned processes (pinned to the client cpu, as they inherit this process's affinity)
    appending to one run, against 1 process and redis-benchmark -c N of the recorded FCALL."""
    ctx = mp.get_context("spawn")
    mine: dict[int, list[float]] = {n: [] for n in sizes.writers}
    theirs: dict[int, list[float]] = {n: [] for n in sizes.writers}
    reloads: dict[int, list[float]] = {n: [] for n in sizes.writers}
    affinities: set[tuple[int, ...]] = set()
    bench_note = ""
    for _ in range(max(1, sizes.rounds - 2)):
        for n in sizes.writers:
            if bench.binary and n == max(sizes.writers):
                captured, _ = capture_append(client)
                command, bench_note = bench_command(client, captured)
                theirs[n].append(bench.rate(command, clients=n, pipeline=1,
                                            requests=sizes.bench_per_client * n))  # fmt: skip
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
            mine[n].append(sum(c * NS / e for c, e, _, _ in got))
            reloads[n].append(sum(g for _, _, g, _ in got) / max(1, sum(c for c, _, _, _ in got)))
            affinities.update(tuple(a) for _, _, _, a in got)
            close_backends()
    raw["writers_ev_s"] = {str(n): v for n, v in mine.items()}
    raw["writers_bench_ev_s"] = {str(n): v for n, v in theirs.items()}
    raw["writers_reload_fraction"] = {str(n): v for n, v in reloads.items()}
    raw["writers_affinity"] = sorted(affinities)
    cpus = ", ".join("/".join(map(str, a)) or "?" for a in sorted(affinities))
    pinned = f"writer processes on cpu {cpus}"
    rows: list[Row] = []
    one, top = min(sizes.writers), max(sizes.writers)
    for n in sizes.writers:
        value = median(mine[n])
        note = (f"{median(reloads[n]) * 100:.0f}% of appends came after another writer's change "
                f"(applied from its notice, or by a reload)")  # fmt: skip
        if n == one:
            rows.append(Row(f"writers_{n}", f"{n} writer process, one run", value, "ev/s",
                            note=f"{note}; {pinned}"))  # fmt: skip
            continue
        ratio = median([a / b for a, b in zip(mine[n], mine[one], strict=True)])
        last = n == top
        rows.append(Row(f"writers_{n}", f"{n} writer processes, one run", value, "ev/s",
                        median(mine[one]), "ev/s", f"{one} writer process", ratio,
                        ">= 1.50x" if last else "",
                        _verdict(ratio >= 1.50) if last else "info", note))  # fmt: skip
    base = median(theirs[top]) if bench.binary else None
    b_ratio = (median([a / b for a, b in zip(mine[top], theirs[top], strict=True)])
               if base else None)  # fmt: skip
    rows.append(Row(f"writers_{top}_bench", f"{top} writer processes vs redis-benchmark",
                    median(mine[top]), "ev/s", base, "ev/s",
                    f"redis-benchmark -c {top}, one-event FCALL" if base else
                    "redis-benchmark missing", b_ratio, ">= 0.40x (aim)",
                    (_verdict(b_ratio >= 0.40) if b_ratio is not None else "n/a"),
                    "; ".join(x for x in ("the recorded FCALL, a new writer per request",
                                          bench_note) if x)))  # fmt: skip
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
    blob = median([sum(len(v) if isinstance(v, bytes) else len(v.encode())
                       for v in codec.encode_entry(e)) for e in events])  # fmt: skip
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
            f"entries written by append_event (replayed); entry fields and values "
            f"{blob:.0f} B; "
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


SECTIONS = (
    "latency", "server", "batch", "checkpoint", "open_run", "writers", "parser", "stats", "memory",
)  # fmt: skip


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
            "server": lambda: section_server(client, sizes, raw),
            "batch": lambda: section_batch(client, sizes, bench, raw),
            "checkpoint": lambda: section_checkpoint(client, sizes, raw),
            "open_run": lambda: section_open_run(client, sizes, raw),
            "writers": lambda: section_writers(client, server.url, sizes, bench, raw),
            "parser": lambda: section_parser(client, server.url, sizes, raw),
            "stats": lambda: section_stats(client, sizes, raw),
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
