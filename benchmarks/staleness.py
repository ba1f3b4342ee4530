"""Staleness between processes: how long until another process's cache shows a write.

Run from the repository root::

    .venv/bin/python -m benchmarks.staleness                    # both front ends, 2,000 samples
    .venv/bin/python -m benchmarks.staleness --frontend async   # sync, async or both (default)
    .venv/bin/python -m benchmarks.staleness --smoke            # 200 samples, a few seconds

A private redis-server (``LocalRedisServer``) holds one run per front end. Process A (this
process, the sync ``RedisCheckpointBackend``) writes one event per sample with
``append_event``, spaced by ``--gap-ms``: by default an ``agent_done`` of one same agent with
1 token, so sample ``i`` is the run's ``total_tokens == i + 1`` and the run keeps its size
(``--mode agents``: an ``agent_started`` of a new agent each time, so ``started_agent_ids``
grows by one per sample). Process B (a spawned process, ``watch=True``) writes its own ``log``
events at a steady rate (``--b-rate`` per second) and records, from a ``subscribe`` callback,
when its cache first shows each of A's samples: through a change notice, or through the reload
that a write of its own triggers when it sees a gap in versions. With ``--frontend sync`` B
uses ``RedisCheckpointBackend`` (the callback runs on the listener's refresher thread); with
``async`` it uses ``AsyncRedisCheckpointBackend`` inside ``asyncio.run`` (a plain-function
callback, run on the event loop). Both processes read ``time.monotonic_ns()``
(CLOCK_MONOTONIC, one clock for every process on a Linux machine).

Placement: with two or more cpus, the redis-server (every thread) is pinned to the first cpu
this process may use, and A and B to the second (the header says so).

Reported, in ms: the delay from A's ``append_event`` returning to B's cache showing it ("after
ack"; it can be negative: the notice may reach B before the reply reaches A), and from A's
call starting ("after call", which includes A's own round trip). Target: p99 after ack <= 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import multiprocessing as mp
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

import luft_redis
from luft_redis import (
    AgentDone,
    AgentEvent,
    AgentStarted,
    AgentStatus,
    Log,
    LogLevel,
    RedisCheckpointBackend,
    RunCheckpoint,
    TokenUsage,
)
from luft_redis.tools.server import LocalRedisServer, find_redis_server

from .compare import Placement, describe_after, pin_server, plan_placement

NS_PER_MS = 1_000_000
TARGET_P99_MS = 20.0
FRONTENDS = ("sync", "async")


def async_available() -> bool:
    """Whether this luft_redis has the asyncio front end."""
    return getattr(luft_redis, "AsyncRedisCheckpointBackend", None) is not None


def _shown(cp: RunCheckpoint, mode: str) -> int:
    """How many of A's samples ``cp`` shows."""
    return len(cp.started_agent_ids) if mode == "agents" else cp.total_tokens


def _pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def _reader(url: str, run_id_text: str, samples: int, rate: float, mode: str, out: Any,
            go: Any, cpu: int | None) -> None:  # fmt: skip
    """Process B, sync front end: write log events at ``rate``/s and time A's samples."""
    _pin(cpu)
    run_id = uuid.UUID(run_id_text)
    client = redis.Redis.from_url(url)
    backend = RedisCheckpointBackend(client)
    seen: list[int] = []
    lock = threading.Lock()
    all_seen = threading.Event()

    def on_change(cp: RunCheckpoint) -> None:
        now = time.monotonic_ns()
        shown = _shown(cp, mode)
        with lock:
            for _ in range(len(seen), shown):
                seen.append(now)
            if len(seen) >= samples:
                all_seen.set()

    backend.subscribe(on_change)
    try:
        if backend.open_run(run_id) is None:
            raise SystemExit(f"run {run_id} not found")
        deadline = time.monotonic() + 10
        while not backend.cache_is_fresh and time.monotonic() < deadline:
            time.sleep(0.005)
        out.put(("ready", backend.cache_is_fresh))
        go.wait(30)
        period = 1.0 / rate if rate > 0 else None
        own = 0
        next_write = time.monotonic()
        hard_stop = time.monotonic() + 120
        while not all_seen.is_set() and time.monotonic() < hard_stop:
            if period is None:
                all_seen.wait(0.05)
                continue
            backend.append_event(Log(run_id=run_id, level=LogLevel.DEBUG, msg=f"b{own}"))
            own += 1
            next_write += period
            all_seen.wait(max(0.0, next_write - time.monotonic()))
        with lock:
            out.put(("seen", list(seen), own))
    finally:
        backend.close()
        time.sleep(0.2)  # the listener unsubscribes before the client closes
        client.close()


def _async_reader(url: str, run_id_text: str, samples: int, rate: float, mode: str, out: Any,
                  go: Any, cpu: int | None) -> None:  # fmt: skip
    """Process B, asyncio front end: the same as :func:`_reader`, inside ``asyncio.run``."""
    _pin(cpu)
    asyncio.run(_async_read(url, uuid.UUID(run_id_text), samples, rate, mode, out, go))


async def _async_read(url: str, run_id: uuid.UUID, samples: int, rate: float, mode: str,
                      out: Any, go: Any) -> None:  # fmt: skip
    import redis.asyncio as aioredis

    from luft_redis import AsyncRedisCheckpointBackend

    client = aioredis.Redis.from_url(url)
    backend = AsyncRedisCheckpointBackend(client)
    seen: list[int] = []
    all_seen = asyncio.Event()

    def on_change(cp: RunCheckpoint) -> None:  # a plain function: runs on the loop
        now = time.monotonic_ns()
        for _ in range(len(seen), _shown(cp, mode)):
            seen.append(now)
        if len(seen) >= samples:
            all_seen.set()

    backend.subscribe(on_change)
    try:
        if await backend.open_run(run_id) is None:
            raise SystemExit(f"run {run_id} not found")
        deadline = time.monotonic() + 10
        while not backend.cache_is_fresh and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        out.put(("ready", backend.cache_is_fresh))
        await asyncio.to_thread(go.wait, 30)  # the loop keeps serving notices meanwhile
        period = 1.0 / rate if rate > 0 else None
        own = 0
        next_write = time.monotonic()
        hard_stop = time.monotonic() + 120
        while not all_seen.is_set() and time.monotonic() < hard_stop:
            if period is None:
                wait = 0.05
            else:
                await backend.append_event(Log(run_id=run_id, level=LogLevel.DEBUG,
                                               msg=f"b{own}"))  # fmt: skip
                own += 1
                next_write += period
                wait = max(0.0, next_write - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_seen.wait(), wait)
        out.put(("seen", list(seen), own))
    finally:
        await backend.aclose()
        await client.aclose()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


@dataclass
class Outcome:
    frontend: str
    after_ack: list[float]  # ms
    after_call: list[float]  # ms
    own: int  # B's own writes
    fresh: bool  # B's cache was fresh before the start


def measure(frontend: str, url: str, client: redis.Redis, samples: int, gap_ms: float,
            b_rate: float, mode: str, cpu: int | None) -> Outcome | None:  # fmt: skip
    """One run: A (this process) writes, B (a spawned process, ``frontend``) watches."""
    backend = RedisCheckpointBackend(client)
    proc: Any = None
    try:
        run_id = uuid.uuid4()
        backend.init_run(run_id, f"staleness {frontend}", "/tmp/staleness")
        ctx = mp.get_context("spawn")
        out, go = ctx.Queue(), ctx.Event()
        target = _async_reader if frontend == "async" else _reader
        proc = ctx.Process(target=target, args=(url, str(run_id), samples, b_rate, mode, out,
                                                go, cpu), daemon=True)  # fmt: skip
        proc.start()
        kind, fresh = out.get(timeout=60)
        assert kind == "ready"
        if not fresh:
            print(f"warning: process B's cache ({frontend}) was not fresh before the start",
                  file=sys.stderr)  # fmt: skip
        go.set()
        calls: list[int] = []
        acks: list[int] = []
        agent = uuid.uuid4()
        for i in range(samples):
            event: AgentEvent
            if mode == "agents":
                event = AgentStarted(run_id=run_id, phase_id=0, agent_id=uuid.uuid4(),
                                     prompt_preview=f"a{i}")  # fmt: skip
            else:
                event = AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                                  tokens=TokenUsage(input=1), elapsed_ms=i)  # fmt: skip
            calls.append(time.monotonic_ns())
            backend.append_event(event)
            acks.append(time.monotonic_ns())
            time.sleep(gap_ms / 1000)
        kind, seen, own = out.get(timeout=150)
        assert kind == "seen"
        proc.join(timeout=10)
        if len(seen) < samples:
            print(f"{frontend}: process B saw only {len(seen)} of {samples} writes",
                  file=sys.stderr)  # fmt: skip
            return None
        after_ack = [(s - a) / NS_PER_MS for s, a in zip(seen, acks, strict=False)]
        after_call = [(s - c) / NS_PER_MS for s, c in zip(seen, calls, strict=False)]
        return Outcome(frontend, after_ack, after_call, own, bool(fresh))
    finally:
        backend.close()
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def print_outcome(o: Outcome, samples: int, gap_ms: float, b_rate: float, mode: str) -> None:
    what = "a new agent_started" if mode == "agents" else "an agent_done (1 token)"
    reader = ("AsyncRedisCheckpointBackend in asyncio.run" if o.frontend == "async"
              else "RedisCheckpointBackend")  # fmt: skip
    print(f"\n[{o.frontend}] process B: {reader}; {samples} samples; A appends {what} every "
          f"{gap_ms:g} ms, B appends a log event {b_rate:g}/s ({o.own} events)")  # fmt: skip
    print(f"{'delay (ms)':<26}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}")
    quarter = max(1, len(o.after_ack) // 4)
    rows = [("after A's ack", o.after_ack), ("after A's call", o.after_call),
            ("after ack, first quarter", o.after_ack[:quarter]),
            ("after ack, last quarter", o.after_ack[-quarter:])]  # fmt: skip
    for label, values in rows:
        print(f"{label:<26}{statistics.median(values):8.2f}{_pct(values, 90):8.2f}"
              f"{_pct(values, 99):8.2f}{max(values):8.2f}")  # fmt: skip


def print_summary(outcomes: dict[str, Outcome | None], skipped: dict[str, str]) -> None:
    print(f"\n{'front end':<12}{'p50 after ack':>15}{'p99 after ack':>15}  "
          f"target p99 <= {TARGET_P99_MS:g} ms")  # fmt: skip
    for frontend in FRONTENDS:
        if frontend in skipped:
            print(f"{frontend:<12}{'-':>15}{'-':>15}  skipped: {skipped[frontend]}")
            continue
        if frontend not in outcomes:
            continue
        o = outcomes[frontend]
        if o is None:
            print(f"{frontend:<12}{'-':>15}{'-':>15}  FAILED (B did not see every write)")
            continue
        p50, p99 = statistics.median(o.after_ack), _pct(o.after_ack, 99)
        verdict = "met" if p99 <= TARGET_P99_MS else "MISSED"
        print(f"{frontend:<12}{p50:15.2f}{p99:15.2f}  {verdict} ({p99:.2f} ms)")


def run(frontends: list[str], samples: int, gap_ms: float, b_rate: float, mode: str,
        server_binary: str | None) -> int:  # fmt: skip
    binary = server_binary or find_redis_server()
    if binary is None:
        print("redis-server not found on PATH", file=sys.stderr)
        return 2
    skipped: dict[str, str] = {}
    if "async" in frontends and not async_available():
        skipped["async"] = "luft_redis.AsyncRedisCheckpointBackend is not available"
        frontends = [f for f in frontends if f != "async"]
    placement: Placement = plan_placement()
    server = LocalRedisServer(binary=binary)
    server.start()
    client = redis.Redis.from_url(server.url)
    outcomes: dict[str, Outcome | None] = {}
    try:
        pin_server(placement, server.pid)
        info = server_info(client)
        print(f"staleness between two processes, front ends: {', '.join(frontends) or 'none'}")
        print(f"date {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {platform.machine()}, "
              f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}; Python "
              f"{platform.python_version()}; redis-py {redis.__version__}; redis-server "
              f"{info}; luft-redis {luft_redis.__version__}")  # fmt: skip
        print(f"code: {describe_after()}")
        print(f"placement: {placement.describe(server.pid)} (A and B)", flush=True)
        for frontend in frontends:
            outcome = measure(frontend, server.url, client, samples, gap_ms, b_rate, mode,
                              placement.client_cpu)  # fmt: skip
            outcomes[frontend] = outcome
            if outcome is not None:
                print_outcome(outcome, samples, gap_ms, b_rate, mode)
            sys.stdout.flush()
        print_summary(outcomes, skipped)
        return 0 if all(o is not None for o in outcomes.values()) else 1
    finally:
        time.sleep(0.2)
        client.close()
        server.stop()


def server_info(client: redis.Redis) -> str:
    try:
        return str(client.info("server").get("redis_version", "?"))
    except redis.RedisError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.staleness",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--frontend", choices=("sync", "async", "both"), default="both",
                        help="process B's front end (both)")  # fmt: skip
    parser.add_argument("--samples", type=int, default=None,
                        help="writes by A (2000; --smoke: 200)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="200 samples (CI)")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="pause between A's writes")
    parser.add_argument("--b-rate", type=float, default=200.0,
                        help="B's own writes per second (200; 0: none)")  # fmt: skip
    parser.add_argument(
        "--mode",
        choices=("tokens", "agents"),
        default="tokens",
        help="what A writes: agent_done of one agent (run size constant; "
        "default) or agent_started of a new agent (the run grows)",
    )
    parser.add_argument("--redis-server", default=None, help="redis-server binary")
    args = parser.parse_args(argv)
    samples = args.samples if args.samples is not None else 200 if args.smoke else 2000
    frontends = list(FRONTENDS) if args.frontend == "both" else [args.frontend]
    return run(frontends, samples, args.gap_ms, args.b_rate, args.mode, args.redis_server)


if __name__ == "__main__":
    raise SystemExit(main())
