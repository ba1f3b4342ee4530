"""Agent leases (docs/leases.md): what a claim and a leased agent cycle cost, as ratios.

Run from the repository root::

    .venv/bin/python -m benchmarks.leases            # full run (a minute or two)
    .venv/bin/python -m benchmarks.leases --smoke    # tiny sizes: does it run? (CI)
    .venv/bin/python -m benchmarks.leases --json out.json --redis-server /usr/bin/redis-server
    .venv/bin/python -m benchmarks.leases --only pool    # one section

One private redis-server (no persistence) pinned to one cpu, the clients to another
(``benchmarks.pinning``), as ``benchmarks.run`` does. Every subject is compared with a
baseline measured in the same run, interleaved (A/B/A/B), because the machine is shared:

- ``claim_agent`` p50 against ``append_event`` p50 (one round trip each; target <= 1.1x);
- a leased agent cycle (claim, fenced ``agent_started``, fenced ``agent_done``, fenced result)
  against the same three writes without a lease (target <= 1.4x: one round trip more than
  three) and against the old demo's queue cycle (``BLMOVE`` a job into the worker's list, the
  three writes unfenced, ``LREM``: target: the leased cycle is faster);
- the delay from a ``submit_agents`` to a claim blocked in ``claim_agent(timeout=...)`` (in
  another thread with its own backend) returning the lease: p50 and p99, the submit's own
  round trip included (no target: a figure to watch);
- 1, 2 and 4 worker processes running 2,000 empty agents (claim, fenced ``agent_started``,
  fenced ``agent_done``) on one run: agents/s and client CPU per agent;
- a claim from a pool of 1,000 running runs, each with one ready agent, against a claim from
  one bound run (docs/pools.md; target <= 1.3x);
- a tokens/minute rate limiter under 4 worker processes for 60 s: the tokens used against its
  budget (target: within 5%), and how late a claim waiting on a spent limiter wakes after the
  budget returned (target: within 50 ms; docs/pools.md "Rate limits").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from luft_redis import (
    AgentDone,
    AgentLease,
    AgentResultCache,
    AgentStarted,
    AgentStatus,
    AgentTask,
    RedisCheckpointBackend,
    TokenUsage,
)
from luft_redis.tools.server import LocalRedisServer, find_redis_server

from .pinning import pin_server, plan_placement
from .run import Row, _verdict, find_redis_benchmark, header, median, pct, print_table

PREFIX = "bench"
NS = 1_000_000_000


@dataclass(frozen=True)
class Sizes:
    rounds: int  # interleaved A/B rounds
    claims: int  # timed claims (and appends) per round
    cycles: int  # timed cycles of each kind per round
    wakes: int  # submit-to-wake samples
    agents: int  # agents of the worker-process rows
    workers: tuple[int, ...]  # worker-process counts
    pool_runs: int  # runs of the pool (one agent each): claims from the pool timed
    limit_seconds: float  # how long 4 workers run under a tokens/minute limiter
    limit_wakes: int  # waits on a spent limiter timed


FULL = Sizes(rounds=5, claims=400, cycles=200, wakes=300, agents=2000, workers=(1, 2, 4),
             pool_runs=1000, limit_seconds=60.0, limit_wakes=50)  # fmt: skip
SMOKE = Sizes(rounds=1, claims=20, cycles=10, wakes=10, agents=40, workers=(1, 2), pool_runs=40,
              limit_seconds=2.0, limit_wakes=5)  # fmt: skip

LIMIT_TPM = 300_000
"""The tokens/minute of the limiter section (5,000 a second)."""
LIMIT_EXPECTED = 100
"""Tokens each agent of the limiter section expects (the claim reserves them); it reports
80-120% of them (seeded), so what the claims reserve and what the agents use differ."""
LIMIT_AGENT_S = 0.02
"""Seconds each agent of the limiter section "runs" (sleeps) between its claim and its done."""


def _started(run_id: uuid.UUID, agent: uuid.UUID) -> AgentStarted:
    return AgentStarted(run_id=run_id, phase_id=0, agent_id=agent, prompt_preview="bench")


def _done(run_id: uuid.UUID, agent: uuid.UUID) -> AgentDone:
    return AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                     tokens=TokenUsage(input=10, output=5), elapsed_ms=1)  # fmt: skip


def _result(agent: uuid.UUID) -> AgentResultCache:
    return AgentResultCache(agent_id=agent, phase_id=0, status="ok", tokens=15,
                            completed_at=1_700_000_000, output={"ok": True},
                            findings=())  # fmt: skip


def _tasks(n: int) -> list[AgentTask]:
    return [AgentTask(uuid.uuid4(), 0, {"prompt": f"agent {i}"}) for i in range(n)]


def _submit(backend: RedisCheckpointBackend, n: int) -> None:
    for start in range(0, n, 500):
        backend.submit_agents(_tasks(min(500, n - start)))


def _new_run(url: str, tasks: int = 0, watch: bool = False) -> tuple[RedisCheckpointBackend,
                                                                     uuid.UUID]:  # fmt: skip
    backend = RedisCheckpointBackend(redis.Redis.from_url(url), prefix=PREFIX, watch=watch)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "lease benchmark", "/tmp/bench")
    _submit(backend, tasks)
    return backend, run_id


def _claim(backend: RedisCheckpointBackend, worker: str = "bench") -> AgentLease:
    lease = backend.claim_agent(worker, lease_for=600.0)
    if lease is None:
        raise RuntimeError("nothing to claim: the benchmark submitted too few tasks")
    return lease


def _close(backend: RedisCheckpointBackend) -> None:
    client = backend.client
    backend.close()
    client.close()


# ------------------------------------------------------------------------------- sections


def section_claim(url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """claim_agent p50 against append_event p50, interleaved in chunks of 20."""
    backend, run_id = _new_run(url, sizes.rounds * sizes.claims + 50)
    for _ in range(20):
        _claim(backend)  # warm-up
        backend.append_event(_started(run_id, uuid.uuid4()))
    claims: list[float] = []
    appends: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(sizes.rounds):
        done = 0
        while done < sizes.claims:
            n = min(20, sizes.claims - done)
            for _ in range(n):
                t0 = clock()
                _claim(backend)
                claims.append((clock() - t0) / 1000)
            for _ in range(n):
                event = _started(run_id, uuid.uuid4())
                t0 = clock()
                backend.append_event(event)
                appends.append((clock() - t0) / 1000)
            done += n
    _close(backend)
    raw["claim"] = {"claim_us": claims, "append_us": appends}
    c50, a50 = median(claims), median(appends)
    ratio = c50 / a50
    return [
        Row("claim_agent_p50", "claim_agent p50", c50, "us", a50, "us", "append_event p50",
            ratio, "<= 1.10x", _verdict(ratio <= 1.10),
            f"p99 {pct(claims, 0.99):.0f} us vs {pct(appends, 0.99):.0f} us; "
            f"{len(claims)} claims"),
    ]  # fmt: skip


def section_pool(url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """A claim from a pool of ``pool_runs`` running runs, each with one ready agent, against
    a claim from one bound run (issue 28: <= 1.3x), interleaved in chunks of 20. The pool's
    worker is bound to no run first and follows each lease's run without loading it."""
    n = sizes.pool_runs
    boss = RedisCheckpointBackend(redis.Redis.from_url(url), prefix=PREFIX, watch=False)
    for _ in range(n + 20):
        boss.init_run(uuid.uuid4(), "pool benchmark", "/tmp/bench", pool="bench")
        _submit(boss, 1)
    bound, _ = _new_run(url, n + 20)
    worker = RedisCheckpointBackend(redis.Redis.from_url(url), prefix=PREFIX, watch=False)

    def pooled() -> None:
        if worker.claim_agent("bench", pool="bench", lease_for=600.0) is None:
            raise RuntimeError("nothing to claim from the pool")

    for _ in range(20):
        pooled()  # warm-up
        _claim(bound)
    pool_us: list[float] = []
    bound_us: list[float] = []
    clock = time.perf_counter_ns
    done = 0
    while done < n:
        k = min(20, n - done)
        for _ in range(k):
            t0 = clock()
            pooled()
            pool_us.append((clock() - t0) / 1000)
        for _ in range(k):
            t0 = clock()
            _claim(bound)
            bound_us.append((clock() - t0) / 1000)
        done += k
    for backend in (boss, bound, worker):
        _close(backend)
    raw["pool"] = {"pool_us": pool_us, "bound_us": bound_us}
    p50, b50 = median(pool_us), median(bound_us)
    ratio = p50 / b50
    return [
        Row("pool_claim_p50", f"claim from a pool of {n} runs p50", p50, "us", b50, "us",
            "claim_agent (bound) p50", ratio, "<= 1.30x", _verdict(ratio <= 1.30),
            f"p99 {pct(pool_us, 0.99):.0f} us vs {pct(bound_us, 0.99):.0f} us; "
            f"two round trips (pick in the pool's slot, claim in the run's) against one"),
    ]  # fmt: skip


def _leased_cycle(backend: RedisCheckpointBackend, run_id: uuid.UUID) -> None:
    lease = _claim(backend)
    backend.append_event(_started(run_id, lease.agent_id), lease=lease)
    backend.append_event(_done(run_id, lease.agent_id), lease=lease)
    backend.upsert_agent_result(_result(lease.agent_id), lease=lease)


def _unleased_cycle(backend: RedisCheckpointBackend, run_id: uuid.UUID) -> None:
    agent = uuid.uuid4()
    backend.append_event(_started(run_id, agent))
    backend.append_event(_done(run_id, agent))
    backend.upsert_agent_result(_result(agent))


def _queue_cycle(backend: RedisCheckpointBackend, run_id: uuid.UUID, jobs: str,
                 working: str) -> None:  # fmt: skip
    """The old demo's worker step: BLMOVE a job, run it unfenced, LREM it."""
    client: Any = backend.client
    job = client.blmove(jobs, working, 1, "LEFT", "RIGHT")
    agent = uuid.UUID(job.decode())
    backend.append_event(_started(run_id, agent))
    backend.append_event(_done(run_id, agent))
    backend.upsert_agent_result(_result(agent))
    client.lrem(working, 1, job)


def section_cycle(url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    total = sizes.rounds * sizes.cycles + 20
    leased, lrun = _new_run(url, total)
    plain, prun = _new_run(url)
    queued, qrun = _new_run(url)
    jobs = f"{PREFIX}:{{{qrun}}}:demo:jobs"
    working = f"{PREFIX}:{{{qrun}}}:demo:working:bench"
    queued.client.rpush(jobs, *[str(uuid.uuid4()) for _ in range(total)])
    subjects: dict[str, Callable[[], None]] = {
        "leased": lambda: _leased_cycle(leased, lrun),
        "unleased": lambda: _unleased_cycle(plain, prun),
        "blmove": lambda: _queue_cycle(queued, qrun, jobs, working),
    }
    samples: dict[str, list[float]] = {name: [] for name in subjects}
    for fn in subjects.values():
        for _ in range(10):
            fn()  # warm-up
    clock = time.perf_counter_ns
    for _ in range(sizes.rounds):
        done = 0
        while done < sizes.cycles:
            n = min(10, sizes.cycles - done)
            for name, fn in subjects.items():
                out = samples[name]
                for _ in range(n):
                    t0 = clock()
                    fn()
                    out.append((clock() - t0) / 1000)
            done += n
    for backend in (leased, plain, queued):
        _close(backend)
    raw["cycle"] = samples
    m = {name: median(values) for name, values in samples.items()}
    vs_plain = m["leased"] / m["unleased"]
    vs_queue = m["leased"] / m["blmove"]
    return [
        Row("leased_cycle_vs_unleased", "leased agent cycle p50", m["leased"], "us",
            m["unleased"], "us", "same cycle unleased p50", vs_plain, "<= 1.40x",
            _verdict(vs_plain <= 1.40),
            "claim + fenced started/done/result vs started/done/result"),
        Row("leased_cycle_vs_blmove", "leased agent cycle p50", m["leased"], "us",
            m["blmove"], "us", "BLMOVE queue cycle p50", vs_queue, "< 1.00x",
            _verdict(vs_queue < 1.0), "BLMOVE + started/done/result + LREM (the old demo)"),
    ]  # fmt: skip


def section_wake(url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """Submit one task while another backend (its own client and listener) is blocked in
    claim_agent: the time from just before the submit to the lease in the claimer's hands."""
    coordinator, run_id = _new_run(url)
    claimer = RedisCheckpointBackend(redis.Redis.from_url(url), prefix=PREFIX, watch=True)
    claimer.open_run(run_id)
    woke: list[float] = []
    ready = threading.Event()
    stop = threading.Event()

    def claim_loop() -> None:
        while not stop.is_set():
            ready.set()
            lease = claimer.claim_agent("waiter", lease_for=600.0, timeout=2.0)
            if lease is not None:
                woke.append(time.perf_counter())

    thread = threading.Thread(target=claim_loop, name="bench-claimer")
    thread.start()
    delays: list[float] = []
    for i in range(sizes.wakes + 5):
        ready.wait(5)
        time.sleep(0.01)  # let the claimer block
        ready.clear()
        before = len(woke)
        t0 = time.perf_counter()
        coordinator.submit_agents(_tasks(1))
        deadline = t0 + 5
        while len(woke) == before and time.perf_counter() < deadline:
            time.sleep(0.0001)
        if len(woke) > before and i >= 5:  # the first five warm up
            delays.append((woke[before] - t0) * 1e6)
    stop.set()
    thread.join(10)
    _close(claimer)
    _close(coordinator)
    raw["wake_us"] = delays
    return [
        Row("claim_wake_p50", "submit -> blocked claim wakes, p50", median(delays), "us",
            note=f"p99 {pct(delays, 0.99):,.0f} us; {len(delays)} samples; the submit's own "
            "round trip included"),
        Row("claim_wake_p99", "submit -> blocked claim wakes, p99", pct(delays, 0.99), "us"),
    ]  # fmt: skip


def _worker(url: str, run_id: str, barrier: Any, queue: Any) -> None:
    """One worker process: claim and run empty agents until none is left. With its change
    listener on (the default): the other workers' notices keep its cache continuous, where
    ``watch=False`` would reload the growing run after each gap."""
    backend = RedisCheckpointBackend(redis.Redis.from_url(url), prefix=PREFIX)
    rid = uuid.UUID(run_id)
    backend.open_run(rid)
    barrier.wait()
    cpu0 = time.process_time()
    count = 0
    while True:
        lease = backend.claim_agent(f"w{mp.current_process().pid}", lease_for=600.0)
        if lease is None:
            break
        backend.append_event(_started(rid, lease.agent_id), lease=lease)
        backend.append_event(_done(rid, lease.agent_id), lease=lease)
        count += 1
    queue.put((count, time.process_time() - cpu0, time.perf_counter()))
    _close(backend)


def section_workers(url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    ctx = mp.get_context("spawn")
    rows: list[Row] = []
    for n in sizes.workers:
        coordinator, run_id = _new_run(url, sizes.agents)
        barrier = ctx.Barrier(n + 1)
        queue = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(url, str(run_id), barrier, queue))
                 for _ in range(n)]  # fmt: skip
        for proc in procs:
            proc.start()
        barrier.wait(60)
        t0 = time.perf_counter()
        reports = [queue.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join(60)
        wall = max(end for _, _, end in reports) - t0
        ran = sum(count for count, _, _ in reports)
        cpu = sum(used for _, used, _ in reports)
        if ran != sizes.agents:
            raise RuntimeError(f"{n} workers ran {ran} agents of {sizes.agents}")
        _close(coordinator)
        raw[f"workers_{n}"] = {"wall_s": wall, "cpu_s": cpu, "agents": ran}
        rows.append(Row(f"lease_workers_{n}", f"{n} worker process(es), {ran} empty agents",
                        ran / wall, "agents/s",
                        note=f"client CPU {cpu / ran * 1e6:,.0f} us per agent; "
                             "claim + fenced started + fenced done"))  # fmt: skip
    return rows


def _limited_worker(url: str, run_id: str, seconds: float, seed: int, barrier: Any,
                    queue: Any) -> None:  # fmt: skip
    """One worker under the limiter: claim, run LIMIT_AGENT_S, report 80-120% of the
    expected tokens in its agent_done, until ``seconds`` after the barrier. Reports each
    agent's (admitted at, unix seconds; tokens)."""
    import random

    rng = random.Random(seed)
    # its change listener on (as _worker's): watch=False would reload the growing run
    backend = RedisCheckpointBackend(redis.Redis.from_url(url), prefix=PREFIX)
    rid = uuid.UUID(run_id)
    backend.open_run(rid)
    barrier.wait()
    stop = time.time() + seconds
    used: list[tuple[float, int]] = []
    while (left := stop - time.time()) > 0:
        lease = backend.claim_agent(f"w{seed}", lease_for=600.0, timeout=left)
        if lease is None:
            continue
        admitted = time.time()
        time.sleep(LIMIT_AGENT_S)
        tokens = rng.randint(LIMIT_EXPECTED * 8 // 10, LIMIT_EXPECTED * 12 // 10)
        backend.append_event(AgentDone(run_id=rid, agent_id=lease.agent_id,
                                       status=AgentStatus.OK, tokens=TokenUsage(input=tokens),
                                       elapsed_ms=20), lease=lease)  # fmt: skip
        used.append((admitted, tokens))
    queue.put(used)
    _close(backend)


def section_limiter(url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """A tokens/minute limiter under 4 worker processes: the tokens its agents used in the
    first ``limit_seconds`` after the first admission, against the limiter's budget for that
    long (target: within 5%); and how late a claim waiting on a spent limiter wakes after its
    budget returned (target: within 50 ms)."""
    ctx = mp.get_context("spawn")
    boss, run_id = _new_run(url)
    boss.set_rate_limit("bench-model", tokens_per_minute=LIMIT_TPM)
    per_second = LIMIT_TPM / 60 / LIMIT_EXPECTED
    count = int(per_second * sizes.limit_seconds * 1.5) + 100
    for start in range(0, count, 1000):
        batch = [AgentTask(uuid.uuid4(), 0, None) for _ in range(min(1000, count - start))]
        boss.submit_agents(batch, limiter="bench-model", expected_tokens=LIMIT_EXPECTED)
    barrier = ctx.Barrier(5)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_limited_worker,
                         args=(url, str(run_id), sizes.limit_seconds, i, barrier, queue))
             for i in range(4)]  # fmt: skip
    for proc in procs:
        proc.start()
    barrier.wait(60)
    used = sorted(x for _ in procs for x in queue.get(timeout=sizes.limit_seconds + 120))
    for proc in procs:
        proc.join(60)
    first = used[0][0]
    window = [tokens for at, tokens in used if at < first + sizes.limit_seconds]
    budget = LIMIT_TPM * sizes.limit_seconds / 60
    held = sum(window) / budget
    raw["limiter_hold"] = {"tokens": sum(window), "budget": budget, "agents": len(window),
                           "seconds": sizes.limit_seconds}  # fmt: skip
    _close(boss)

    # waking: one run, a limiter of one request per 100 ms (no burst); each sample claims
    # (admitted), then claims again at once and waits: its budget returns 100 ms after the
    # first admission
    boss, run_id = _new_run(url)
    boss.set_rate_limit("bench-wake", requests_per_minute=600, burst=0)
    boss.submit_agents([AgentTask(uuid.uuid4(), 0, None) for _ in range(2 * sizes.limit_wakes)],
                       limiter="bench-wake")  # fmt: skip
    late: list[float] = []
    for _ in range(sizes.limit_wakes):
        time.sleep(0.15)  # the budget is back in full
        _claim(boss)
        admitted = time.perf_counter()  # (after the claim's reply: at most late by a round trip)
        second = boss.claim_agent("bench", lease_for=600.0, timeout=2.0)
        if second is None:
            raise RuntimeError("a claim waiting on its limiter did not get the next agent")
        late.append(max(0.0, time.perf_counter() - admitted - 0.1) * 1e6)
    _close(boss)
    raw["limiter_wake_us"] = late
    return [
        Row("limiter_hold", f"tokens/minute limiter, 4 workers, {sizes.limit_seconds:g} s",
            held, "x", budget, "tok", "its budget", held, "0.95-1.05x",
            _verdict(0.95 <= held <= 1.05),
            note=f"{sum(window):,} tokens of {len(window)} agents; reserved {LIMIT_EXPECTED} "
                 "each, used 80-120%"),
        Row("limiter_wake_max", "a claim waiting on a spent limiter, wake after budget returns",
            max(late), "us", 50_000.0, "us", "50 ms", max(late) / 50_000, "<= 1.0x",
            _verdict(max(late) <= 50_000),
            note=f"p50 {median(late):,.0f} us; {len(late)} samples"),
    ]  # fmt: skip


SECTIONS = ("claim", "cycle", "wake", "workers", "pool", "limiter")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.leases",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI): a few seconds")
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers as JSON")
    parser.add_argument("--redis-server", metavar="PATH", help="redis-server binary to start")
    parser.add_argument("--only", choices=SECTIONS, action="append",
                        help="run only this section (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    binary = args.redis_server or find_redis_server()
    if binary is None:
        print("redis-server not found: pass --redis-server PATH", file=sys.stderr)
        return 2
    started = time.perf_counter()
    raw: dict[str, Any] = {"mode": "smoke" if args.smoke else "full", "sizes": asdict(sizes)}
    rows: list[Row] = []
    placement = plan_placement()
    with LocalRedisServer(binary=binary, appendonly=False) as server:
        pin_server(placement, server.pid)
        client = redis.Redis.from_url(server.url)
        head = header(client, binary, find_redis_benchmark(binary))
        head["placement"] = placement.describe(server.pid)
        print(f"luft-redis lease benchmarks ({raw['mode']} mode)")
        for k, v in head.items():
            print(f"  {k}: {v}")
        print(flush=True)
        steps: dict[str, Callable[[], list[Row]]] = {
            "claim": lambda: section_claim(server.url, sizes, raw),
            "cycle": lambda: section_cycle(server.url, sizes, raw),
            "wake": lambda: section_wake(server.url, sizes, raw),
            "workers": lambda: section_workers(server.url, sizes, raw),
            "pool": lambda: section_pool(server.url, sizes, raw),
            "limiter": lambda: section_limiter(server.url, sizes, raw),
        }
        for name in args.only or SECTIONS:
            t0 = time.perf_counter()
            rows += steps[name]()
            print(f"  [{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
            client.flushall()
        client.close()
    print()
    print_table(rows)
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.1f} s; targets met: "
          f"{sum(r.status == 'PASS' for r in rows)}, missed: "
          f"{sum(r.status == 'MISS' for r in rows)}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"header": head, "rows": [asdict(r) for r in rows], "raw": raw}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
