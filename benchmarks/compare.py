"""Before/after: the main write and read rows of two versions of the library in one pinned run.

Run from the repository root::

    .venv/bin/python -m benchmarks.compare            # 5 rounds, under a minute on a quiet machine
    .venv/bin/python -m benchmarks.compare --smoke    # tiny sizes, 1 round (CI)
    .venv/bin/python -m benchmarks.compare --before 9103c9c --rounds 9 --json out.json

"Before" is a git worktree of ``--before`` (default ``9103c9c``, the coherence layer before
its rebuild) made in a temporary directory and removed at the end; "after" is this working
tree. One private redis-server (``LocalRedisServer``, no persistence) serves both. The same
row functions (this file, run as a script with ``--worker``) measure each version in a worker
subprocess whose ``PYTHONPATH`` is that version's tree, so ``import luft_redis`` picks that
version (the worker checks which one it got). Both workers live for the whole run; the parent
drives them step by step (one JSON command per line) and alternates them at every step (a
slice of the latency calls, of the batches, of the get_checkpoint samples, one open_run),
flipping the order each time, so the slow phases of a shared machine hit both versions alike.
Each round starts with fresh runs.

Placement: on a machine with two or more cpus the redis-server (every thread of it) is pinned
to the first cpu this process may use and every client process (this one, and each worker)
to the second, so the server and the client never compete for a core; the header prints it.

Rows (the median over the rounds of each version's figure; "after/before" is the ratio of
those medians, and the per-round ratios are shown as a range to show the noise):

* PING p50: ``client.ping()``, the baseline (both versions run the same redis-py call);
* append_event p50/p99: an agent_done of a new agent with one finding and a short output;
* upsert_agent_result p50: a result with output and one finding;
* append_event + get_checkpoint p50: the write followed by a read of the checkpoint (the
  rebuilt cache applies a write's delta on the next read, not in the write);
* append_events, batches of 100: events/s;
* get_checkpoint(), 1,000 results: ns per call (mean of 1,000 calls, p50 of the samples);
* open_run, 10,000 results: from a fresh backend, 3 per version per round after a warm-up.

Verdict: "no row more than 15% worse?" (a time that grew by more than 15%, or a rate that fell
by more than 15%); the PING row is the baseline, not part of the verdict. A second table says
where the time goes per call: the worker's CPU time (all its threads), the server's script
time (INFO commandstats) and the bytes the server sends (reply and notice).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
BEFORE_REV = "9103c9c"
THRESHOLD = 0.15
PREFIX = "cmp"
RESULT_TAG = "COMPARE-RESULT "

# --------------------------------------------------------------------------------------------
# Sizes and rows
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    rounds: int  # rounds (each: fresh runs, then every step for both versions, alternating)
    iters: int  # timed calls per latency op per version per round
    chunk: int  # calls of one op before switching to the next (interleaving)
    warmup: int  # untimed calls per op
    batch: int  # events per append_events call
    batch_events: int  # events timed per version per round
    ckpt_results: int  # results of the get_checkpoint run
    ckpt_samples: int
    ckpt_inner: int  # get_checkpoint calls per sample
    open_results: int
    open_repeats: int  # open_run calls per version per round
    slices: int  # each round's latency, batch and get_checkpoint work, in alternating slices


FULL = Sizes(rounds=5, iters=1000, chunk=50, warmup=100, batch=100, batch_events=4000,
             ckpt_results=1000, ckpt_samples=200, ckpt_inner=1000, open_results=10_000,
             open_repeats=3, slices=4)  # fmt: skip
SMOKE = Sizes(rounds=1, iters=40, chunk=10, warmup=5, batch=100, batch_events=200,
              ckpt_results=100, ckpt_samples=10, ckpt_inner=100, open_results=200,
              open_repeats=1, slices=1)  # fmt: skip


@dataclass(frozen=True)
class RowSpec:
    key: str
    label: str
    unit: str  # "us", "ev/s", "ns", "s"
    higher_is_better: bool = False
    baseline: bool = False  # shown, not part of the verdict


def row_specs(sizes: Sizes) -> list[RowSpec]:
    return [
        RowSpec("ping_p50", "PING p50 (baseline)", "us", baseline=True),
        RowSpec("append_p50", "append_event p50 (agent_done, 1 finding)", "us"),
        RowSpec("append_p99", "append_event p99 (agent_done, 1 finding)", "us"),
        RowSpec("upsert_p50", "upsert_agent_result p50", "us"),
        RowSpec("append_read_p50", "append_event + get_checkpoint p50", "us"),
        RowSpec("batch", f"append_events, batches of {sizes.batch}", "ev/s", True),
        RowSpec("get_checkpoint", f"get_checkpoint(), {sizes.ckpt_results:,} results", "ns"),
        RowSpec("open_run", f"open_run, {sizes.open_results:,} results", "s"),
    ]


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "us":
        return f"{value:,.0f} us" if value >= 100 else f"{value:,.1f} us"
    if unit == "ns":
        return f"{value:,.0f} ns"
    if unit == "ev/s":
        return f"{value:,.0f} ev/s"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:g} {unit}"


# --------------------------------------------------------------------------------------------
# Worker: runs inside a subprocess whose PYTHONPATH selects the version measured. It may only
# use what both versions have: redis-py and luft_redis's public names.
# --------------------------------------------------------------------------------------------

TS = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=dt.UTC)


def _workload() -> Any:
    """The luft_redis names the worker uses (imported late: the version is chosen by then)."""
    import luft_redis

    return luft_redis


def make_finding(lr: Any, i: int) -> Any:
    return lr.Finding(
        kind="bug", severity=lr.Severity.HIGH, title=f"off by one in loop {i}",
        detail="the loop bound reads one element past the end of the buffer",
        location=lr.Location(file="src/parser/lexer.rs", line=40 + i % 500),
    )  # fmt: skip


def make_agent_done(lr: Any, run_id: uuid.UUID, i: int) -> Any:
    """A typical agent_done of a new agent: 36-char UUIDs, tokens, one finding, an output."""
    return lr.AgentDone(
        run_id=run_id, agent_id=uuid.uuid4(), status=lr.AgentStatus.OK,
        tokens=lr.TokenUsage(input=12_000 + i % 1000, output=1_340, cache_read=8_000),
        elapsed_ms=51_000 + i % 1000, name=f"reviewer-{i % 16}", agent_seq=i % 1000,
        ts=TS + dt.timedelta(milliseconds=i), output="reviewed 14 files; one problem found",
        findings=(make_finding(lr, i),),
    )  # fmt: skip


def make_result(lr: Any, i: int) -> Any:
    return lr.AgentResultCache(
        agent_id=uuid.uuid4(), phase_id=1, status="ok",
        output="reviewed 14 files; one problem found", findings=(make_finding(lr, i),),
        tokens=21_340, completed_at=1_777_000_000 + i, cache_key_hash="9f2c6e0d4b1a",
        description="review one module", role="reviewer",
    )  # fmt: skip


def make_checkpoint(lr: Any, run_id: uuid.UUID, results: int) -> Any:
    rs = [make_result(lr, i) for i in range(results)]
    return lr.RunCheckpoint(
        run_id=run_id, task="review the repository", status=lr.CheckpointStatus.RUNNING,
        current_phase=1,
        completed_phases=(lr.PhaseSummary(phase_id=1, label="review", planned=results,
                                          ok=results, failed=0),),
        agent_results={r.agent_id: r for r in rs},
        findings=tuple(f for r in rs for f in r.findings), total_tokens=21_340 * results,
        created_at=1_777_000_000, updated_at=1_777_000_000,
        started_agent_ids=tuple(r.agent_id for r in rs),
    )  # fmt: skip


def pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


Meter = Callable[[], tuple[float, int]]
"""The server's script time so far: (microseconds, calls) of FCALL(_RO), EVALSHA and EVAL."""


Costs = dict[str, list[float]]


def interleaved(ops: dict[str, Callable[[int], object]], start: int, count: int, chunk: int,
                meter: Meter | None = None) -> tuple[dict[str, list[int]], Costs]:  # fmt: skip
    """Run each op on indexes ``start .. start + count - 1``, switching op every ``chunk``
    calls: the ns of every call, and per op its costs: this process's CPU ns (every thread:
    the listener's work on the op's notices too), the server's script us and script calls."""
    samples: dict[str, list[int]] = {name: [] for name in ops}
    costs: Costs = {name: [0.0, 0.0, 0.0] for name in ops}
    clock, cpu = time.perf_counter_ns, time.process_time_ns
    done = 0
    while done < count:
        n = min(chunk, count - done)
        for name, op in ops.items():
            out = samples[name]
            s0 = meter() if meter else (0.0, 0)
            c0 = cpu()
            for i in range(start + done, start + done + n):
                t0 = clock()
                op(i)
                out.append(clock() - t0)
            c1 = cpu()
            s1 = meter() if meter else (0.0, 0)
            cost = costs[name]
            cost[0] += c1 - c0
            cost[1] += s1[0] - s0[0]
            cost[2] += s1[1] - s0[1]
        done += n
    return samples, costs


class Worker:
    """The row functions for the luft_redis this process imported, driven step by step by
    the parent (one JSON command per line on stdin, one JSON reply per line on stdout), so
    the parent can alternate the two versions every few hundred milliseconds."""

    def __init__(self, url: str, sizes: Sizes) -> None:
        self.lr = _workload()
        self.sizes = sizes
        self.client = redis.Redis.from_url(url)
        self.round_backends: list[Any] = []
        self.ops: dict[str, Callable[[int], object]] = {}
        self.next_index = 0
        self.batch_backend: Any = None
        self.read_backend: Any = None
        self.traffic_done = False
        self.traffic: dict[str, list[float]] = {}
        self.batch_events: list[Any] = []
        self.batch_next = 0
        # built once: the get_checkpoint run and the big run that open_run loads
        self.ckpt_backend, _ = self.new_run(sizes.ckpt_results, keep=True)
        cp = self.ckpt_backend.get_checkpoint()
        assert cp is not None and len(cp.agent_results) == sizes.ckpt_results
        big, self.big_id = self.new_run(sizes.open_results, keep=True)
        big.close()
        self.open_run()  # warm-up

    def new_run(self, results: int = 0, keep: bool = False) -> tuple[Any, uuid.UUID]:
        backend = self.lr.RedisCheckpointBackend(self.client, prefix=PREFIX)
        if not keep:
            self.round_backends.append(backend)
        run_id = uuid.uuid4()
        backend.init_run(run_id, "review the repository", f"/tmp/runs/{run_id}")
        if results:
            backend.save_checkpoint(make_checkpoint(self.lr, run_id, results))
        return backend, run_id

    def new_round(self) -> dict[str, Any]:
        """Fresh runs for the latency ops and the batches, with their warm-up calls."""
        lr, sizes = self.lr, self.sizes
        for b in self.round_backends:
            b.close()
        self.round_backends = []
        n = sizes.warmup + sizes.iters
        b_append, r_append = self.new_run()
        b_upsert, _ = self.new_run()
        b_read, r_read = self.new_run()
        appends = [make_agent_done(lr, r_append, i) for i in range(n)]
        upserts = [make_result(lr, i) for i in range(n)]
        reads = [make_agent_done(lr, r_read, i) for i in range(n)]
        client = self.client

        def read_after_write(i: int) -> None:
            b_read.append_event(reads[i])
            b_read.get_checkpoint()

        self.ops = {
            "ping": lambda i: client.ping(),
            "append": lambda i: b_append.append_event(appends[i]),
            "upsert": lambda i: b_upsert.upsert_agent_result(upserts[i]),
            "append_read": read_after_write,
        }
        self.read_backend = b_read
        interleaved(self.ops, 0, sizes.warmup, sizes.chunk)
        if not self.traffic_done:
            self.traffic = self.measure_traffic()
            self.traffic_done = True
        self.next_index = sizes.warmup
        k = sizes.batch
        self.batch_backend, run_id = self.new_run()
        self.batch_events = [make_agent_done(lr, run_id, i)
                             for i in range(sizes.batch_events + k)]  # fmt: skip
        self.batch_backend.append_events(self.batch_events[:k])  # warm-up
        self.batch_next = k
        gc.collect()
        return {}

    def script_time(self) -> tuple[float, int]:
        stats = self.client.info("commandstats")
        usec, calls = 0.0, 0
        for name in ("cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha", "cmdstat_eval"):
            entry = stats.get(name) or {}
            usec += float(entry.get("usec", 0))
            calls += int(entry.get("calls", 0))
        return usec, calls

    def net(self) -> tuple[int, int]:
        stats = self.client.info("stats")
        return int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])

    def measure_traffic(self) -> dict[str, list[float]]:
        """Bytes the server reads and sends per write (the reply, and the notice to this
        process's own listener), on runs of their own. Does not depend on the load."""
        lr = self.lr
        out: dict[str, list[float]] = {}
        a0, a1 = self.net(), self.net()
        overhead = (a1[0] - a0[0], a1[1] - a0[1])  # one INFO stats round trip
        ops: list[tuple[str, int, Callable[[Any, uuid.UUID, int], None]]] = [
            ("append", 50, lambda b, r, i: b.append_event(make_agent_done(lr, r, i))),
            ("upsert", 50, lambda b, r, i: b.upsert_agent_result(make_result(lr, i))),
            ("batch", 5, lambda b, r, i: b.append_events(
                [make_agent_done(lr, r, i * 100 + j) for j in range(100)])),
        ]  # fmt: skip
        for name, count, op in ops:
            backend, run_id = self.new_run()
            op(backend, run_id, 0)  # warm-up
            time.sleep(0.05)
            n0 = self.net()
            for i in range(1, count + 1):
                op(backend, run_id, i)
            time.sleep(0.05)  # the notices reach the listener
            n1 = self.net()
            out[name] = [(n1[0] - n0[0] - overhead[0]) / count,
                         (n1[1] - n0[1] - overhead[1]) / count]  # fmt: skip
        return out

    def latency(self, count: int) -> dict[str, Any]:
        samples, costs = interleaved(self.ops, self.next_index, count, self.sizes.chunk,
                                     self.script_time)  # fmt: skip
        self.next_index += count
        if self.next_index == self.sizes.warmup + self.sizes.iters:
            cp = self.read_backend.get_checkpoint()
            assert cp is not None and len(cp.agent_results) == self.next_index, "lost results"
        traffic, self.traffic = self.traffic, {}
        return {"samples": samples, "costs": costs, "traffic": traffic}

    def batch(self, batches: int) -> dict[str, Any]:
        k = self.sizes.batch
        events, start = self.batch_events, self.batch_next
        append_events = self.batch_backend.append_events
        s0, c0 = self.script_time(), time.process_time_ns()
        t0 = time.perf_counter_ns()
        for j in range(start, start + batches * k, k):
            append_events(events[j : j + k])
        elapsed = time.perf_counter_ns() - t0
        c1, s1 = time.process_time_ns(), self.script_time()
        self.batch_next += batches * k
        return {"events": batches * k, "ns": elapsed,
                "costs": [c1 - c0, s1[0] - s0[0], s1[1] - s0[1]]}  # fmt: skip

    def get_checkpoint(self, samples: int) -> dict[str, Any]:
        get = self.ckpt_backend.get_checkpoint
        inner = range(self.sizes.ckpt_inner)
        for _ in range(100):  # warm-up
            get()
        per_call: list[float] = []
        clock = time.perf_counter_ns
        for _ in range(samples):
            t0 = clock()
            for _ in inner:
                get()
            per_call.append((clock() - t0) / self.sizes.ckpt_inner)
        return {"per_call_ns": per_call}

    def open_run(self) -> dict[str, Any]:
        fresh = self.lr.RedisCheckpointBackend(self.client, prefix=PREFIX)
        gc.collect()
        s0, c0 = self.script_time(), time.process_time_ns()
        t0 = time.perf_counter_ns()
        cp = fresh.open_run(self.big_id)
        elapsed = (time.perf_counter_ns() - t0) / 1e9
        c1, s1 = time.process_time_ns(), self.script_time()
        assert cp is not None and len(cp.agent_results) == self.sizes.open_results
        fresh.close()
        return {"s": elapsed, "costs": [c1 - c0, s1[0] - s0[0], s1[1] - s0[1]]}

    def close(self) -> None:
        for b in self.round_backends:
            b.close()
        self.ckpt_backend.close()
        time.sleep(0.1)  # the listener unsubscribes before the client closes
        self.client.close()


def worker_main(args: argparse.Namespace) -> int:
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    lr = _workload()
    where = Path(lr.__file__).resolve().parent.parent
    if args.expect_root and where != Path(args.expect_root).resolve():
        print(f"worker imported luft_redis from {where}, not {args.expect_root}",
              file=sys.stderr)  # fmt: skip
        return 3
    worker = Worker(args.url, SMOKE if args.smoke else FULL)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    reply: dict[str, Any] = {"root": str(where), "cpus": cpus, "version": lr.__version__}
    print(RESULT_TAG + json.dumps(reply), flush=True)
    steps: dict[str, Callable[..., dict[str, Any]]] = {
        "round": worker.new_round, "latency": worker.latency, "batch": worker.batch,
        "get_checkpoint": worker.get_checkpoint, "open_run": worker.open_run,
    }  # fmt: skip
    try:
        for line in sys.stdin:
            command = json.loads(line)
            name = command.pop("step")
            if name == "quit":
                break
            print(RESULT_TAG + json.dumps(steps[name](**command)), flush=True)
    finally:
        worker.close()
    return 0


# --------------------------------------------------------------------------------------------
# Placement (also used by benchmarks.staleness). A copy of benchmarks/pinning.py: this file
# also runs as a standalone script beside an older checkout, so it imports nothing local.
# --------------------------------------------------------------------------------------------


@dataclass
class Placement:
    server_cpu: int | None
    client_cpu: int | None
    server_threads: int = 0

    def describe(self, server_pid: int | None) -> str:
        if self.server_cpu is None or self.client_cpu is None:
            return "no pinning (fewer than 2 cpus available)"
        return (f"redis-server pid {server_pid} ({self.server_threads} threads) pinned to cpu "
                f"{self.server_cpu}; client processes pinned to cpu {self.client_cpu}")  # fmt: skip


def plan_placement() -> Placement:
    """Server on the first usable cpu, clients on the second; pins this process now."""
    if not hasattr(os, "sched_getaffinity"):
        return Placement(None, None)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return Placement(None, None)
    placement = Placement(cpus[0], cpus[1])
    os.sched_setaffinity(0, {cpus[1]})
    return placement


def pin_server(placement: Placement, pid: int | None) -> None:
    """Pin every thread of process ``pid`` to the server cpu (threads made later inherit it)."""
    if placement.server_cpu is None or pid is None:
        return
    tids = [int(x) for x in os.listdir(f"/proc/{pid}/task")]
    for tid in tids:
        os.sched_setaffinity(tid, {placement.server_cpu})
        assert os.sched_getaffinity(tid) == {placement.server_cpu}
    placement.server_threads = len(tids)


def machine_lines(client: redis.Redis) -> list[str]:
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
    try:
        server = str(client.info("server").get("redis_version", "?"))
    except redis.RedisError:
        server = "?"
    return [
        f"date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S} UTC",
        f"machine: {platform.machine()}, {cpu}, {os.cpu_count()} cpus, "
        f"load {os.getloadavg()[0]:.2f}",
        f"python {platform.python_version()}; redis-py {redis.__version__}; "
        f"hiredis {hiredis_version}; redis-server {server} (appendonly no, save '')",
    ]


# --------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=False, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})  # fmt: skip


def describe_rev(rev: str) -> str:
    proc = _git("log", "-1", "--format=%h %s", rev)
    return proc.stdout.strip() if proc.returncode == 0 else rev


def describe_after() -> str:
    head = _git("rev-parse", "--short", "HEAD").stdout.strip() or "?"
    dirty = _git("status", "--porcelain", "--", "luft_redis", "lua").stdout.split()[1::2]
    return f"working tree {ROOT} at {head}" + (
        f" + uncommitted changes to {', '.join(dirty)}" if dirty else ""
    )


def add_worktree(rev: str, parent: Path) -> Path | None:
    """A detached worktree of ``rev`` under ``parent``; None when git or ``rev`` is missing."""
    if shutil.which("git") is None:
        print("git not found: measuring the working tree only", file=sys.stderr)
        return None
    if _git("cat-file", "-e", f"{rev}^{{commit}}").returncode != 0:
        print(f"commit {rev} not in this clone: measuring the working tree only",
              file=sys.stderr)  # fmt: skip
        return None
    path = parent / "luft-before"
    proc = _git("worktree", "add", "--detach", str(path), rev)
    if proc.returncode != 0:
        print(f"git worktree add failed: {proc.stderr.strip()}", file=sys.stderr)
        return None
    return path


def remove_worktree(path: Path) -> None:
    _git("worktree", "remove", "--force", str(path))
    shutil.rmtree(path, ignore_errors=True)
    _git("worktree", "prune")


class WorkerProcess:
    """A worker subprocess for one version (``PYTHONPATH`` = its tree), driven step by step."""

    def __init__(self, side: str, tree: Path, url: str, smoke: bool, cpu: int | None) -> None:
        self.side = side
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--url", url,
               "--expect-root", str(tree)]  # fmt: skip
        if smoke:
            cmd.append("--smoke")
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(tree)
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
        hello = self._reply()
        if cpu is not None and hello["cpus"] != [cpu]:
            raise RuntimeError(f"{side} worker runs on cpus {hello['cpus']}, not [{cpu}]")
        self.version = str(hello["version"])

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT_TAG):
                reply: dict[str, Any] = json.loads(line[len(RESULT_TAG) :])
                return reply
        code = self.proc.wait()
        raise RuntimeError(f"the {self.side} worker exited ({code}); its stderr says why")

    def step(self, name: str, **kwargs: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"step": name, **kwargs}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"step": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _parts(total: int, slices: int) -> list[int]:
    base, extra = divmod(total, slices)
    return [base + (1 if i < extra else 0) for i in range(slices) if base or i < extra]


def run_round(workers: list[WorkerProcess], sizes: Sizes, rnd: int) -> list[dict[str, float]]:
    """One round: every step alternates the versions (the order flips each time)."""
    flip = [rnd % 2 == 1]

    def each() -> list[int]:
        order = list(range(len(workers)))
        if flip[0]:
            order.reverse()
        flip[0] = not flip[0]
        return order

    got: list[dict[str, list[Any]]] = [{} for _ in workers]

    def add(idx: int, key: str, value: Any) -> None:
        got[idx].setdefault(key, []).append(value)

    for w in workers:
        w.step("round")
    for count in _parts(sizes.iters, sizes.slices):
        for idx in each():
            reply = workers[idx].step("latency", count=count)
            for op, samples in reply["samples"].items():
                got[idx].setdefault(op, []).extend(samples)
                add(idx, f"cost:{op}", reply["costs"][op] + [len(samples)])
            for op, nbytes in reply["traffic"].items():
                add(idx, f"traffic:{op}", nbytes)
    for batches in _parts(sizes.batch_events // sizes.batch, sizes.slices):
        for idx in each():
            reply = workers[idx].step("batch", batches=batches)
            add(idx, "batch", reply)
            add(idx, "cost:batch", reply["costs"] + [batches])
    for samples in _parts(sizes.ckpt_samples, sizes.slices):
        for idx in each():
            got[idx].setdefault("ckpt", []).extend(
                workers[idx].step("get_checkpoint", samples=samples)["per_call_ns"]
            )
    for _ in range(sizes.open_repeats):
        for idx in each():
            reply = workers[idx].step("open_run")
            add(idx, "open", reply["s"])
            add(idx, "cost:open", reply["costs"] + [1])
    out: list[dict[str, float]] = []
    for g in got:
        figures = {
            "ping_p50": pct(g["ping"], 0.50) / 1e3,
            "append_p50": pct(g["append"], 0.50) / 1e3,
            "append_p99": pct(g["append"], 0.99) / 1e3,
            "upsert_p50": pct(g["upsert"], 0.50) / 1e3,
            "append_read_p50": pct(g["append_read"], 0.50) / 1e3,
            "batch": sum(b["events"] for b in g["batch"]) * 1e9 / sum(b["ns"] for b in g["batch"]),
            "get_checkpoint": pct(g["ckpt"], 0.50),
            "open_run": statistics.median(g["open"]),
        }  # fmt: skip
        for key, parts in g.items():
            if key.startswith("cost:"):
                op = key[5:]
                cpu_ns, usec, calls, n = (sum(p[j] for p in parts) for j in range(4))
                figures[f"cpu_us:{op}"] = cpu_ns / 1e3 / n
                figures[f"server_us:{op}"] = usec / n
                figures[f"scripts:{op}"] = calls / n
            elif key.startswith("traffic:"):
                figures[f"bytes_in:{key[8:]}"] = parts[0][0]
                figures[f"bytes_out:{key[8:]}"] = parts[0][1]
        out.append(figures)
    return out


@dataclass
class Compared:
    key: str
    label: str
    unit: str
    before: float | None
    after: float | None
    ratio: float | None  # after / before (medians)
    worse: float | None  # fraction worse (time up, or rate down); negative: better
    spread: tuple[float, float] | None  # min and max of the per-round ratios
    verdict: str  # "ok", "WORSE", "baseline", "n/a"


def compare(specs: list[RowSpec], before: list[dict[str, float]],
            after: list[dict[str, float]]) -> list[Compared]:  # fmt: skip
    rows: list[Compared] = []
    for spec in specs:
        a = statistics.median(r[spec.key] for r in after)
        if not before:
            rows.append(Compared(spec.key, spec.label, spec.unit, None, a, None, None, None,
                                 "baseline" if spec.baseline else "n/a"))  # fmt: skip
            continue
        b = statistics.median(r[spec.key] for r in before)
        ratio = a / b
        worse = (1 / ratio - 1) if spec.higher_is_better else (ratio - 1)
        per_round = [y[spec.key] / x[spec.key] for x, y in zip(before, after, strict=True)]
        verdict = "baseline" if spec.baseline else "WORSE" if worse > THRESHOLD else "ok"
        rows.append(Compared(spec.key, spec.label, spec.unit, b, a, ratio, worse,
                             (min(per_round), max(per_round)), verdict))  # fmt: skip
    return rows


def print_table(rows: list[Compared], out: Any = None) -> None:
    out = out or sys.stdout
    head = ("row", "before", "after", "after/before", "worse by", "rounds a/b", "verdict")
    cells = [
        (r.label, fmt(r.before, r.unit), fmt(r.after, r.unit),
         "-" if r.ratio is None else f"{r.ratio:.2f}x",
         "-" if r.worse is None else f"{r.worse * 100:+.0f}%",
         "-" if r.spread is None else f"{r.spread[0]:.2f}-{r.spread[1]:.2f}",
         r.verdict)
        for r in rows
    ]  # fmt: skip
    widths = [max(len(head[i]), *(len(c[i]) for c in cells)) for i in range(len(head))]
    right = (False, True, True, True, True, True, False)

    def line(cols: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(cols, widths, right, strict=True)).rstrip()  # fmt: skip

    print(line(head), file=out)
    print("-" * len(line(head)), file=out)
    for c in cells:
        print(line(c), file=out)


COST_OPS = (
    ("append", "append_event"),
    ("upsert", "upsert_agent_result"),
    ("append_read", "append_event + get_checkpoint"),
    ("batch", "append_events(100 events)"),
    ("open", "open_run"),
)


def _median_of(results: list[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in results if key in r]
    return statistics.median(values) if values else None


def print_costs(before: list[dict[str, float]], after: list[dict[str, float]],
                out: Any = None) -> None:  # fmt: skip
    """Where the time goes, per call: the client process's CPU (all its threads), the
    server's script time (INFO commandstats), and the bytes the server sends (the reply
    and the notice to the writer's own listener)."""
    out = out or sys.stdout

    def pair(kind: str, op: str, unit: str) -> str:
        b, a = _median_of(before, f"{kind}:{op}"), _median_of(after, f"{kind}:{op}")
        if a is None:
            return "-"
        if unit == "B":
            text = f"{a:,.0f} B" if b is None else f"{b:,.0f} -> {a:,.0f} B"
        else:
            text = fmt(a, "us") if b is None else f"{b:,.0f} -> {a:,.0f} us"
        return text

    head = ("per call", "client CPU", "server script time", "server bytes out")
    cells = [(label, pair("cpu_us", op, "us"), pair("server_us", op, "us"),
              pair("bytes_out", op, "B")) for op, label in COST_OPS]  # fmt: skip
    widths = [max(len(head[i]), *(len(c[i]) for c in cells)) for i in range(len(head))]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    print(line, file=out)
    print("-" * len(line), file=out)
    for c in cells:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths, strict=True)).rstrip(), file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare",
                                     description=(__doc__ or "").split("\n")[0])  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 round (CI)")
    parser.add_argument("--rounds", type=int, default=None, help="before/after rounds (5)")
    parser.add_argument("--before", default=BEFORE_REV, help=f"git revision ({BEFORE_REV})")
    parser.add_argument("--redis-server", default=None, help="redis-server binary")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--expect-root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)

    from luft_redis.tools.server import LocalRedisServer, find_redis_server

    sizes = SMOKE if args.smoke else FULL
    rounds = args.rounds or sizes.rounds
    binary = args.redis_server or find_redis_server()
    if binary is None:
        print("redis-server not found: pass --redis-server PATH", file=sys.stderr)
        return 2
    placement = plan_placement()
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="luft-compare-"))
    before_tree: Path | None = None
    server = LocalRedisServer(binary=binary, appendonly=False)
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    workers: list[WorkerProcess] = []
    try:
        server.start()
        pin_server(placement, server.pid)
        client = redis.Redis.from_url(server.url)
        before_tree = add_worktree(args.before, scratch)
        mode = "smoke" if args.smoke else "full"
        print(f"luft-redis before/after ({mode}: {rounds} round{'s' if rounds != 1 else ''}, "
              f"each version in its own subprocess, alternating)")  # fmt: skip
        for line in machine_lines(client):
            print(f"  {line}")
        print(f"  placement: {placement.describe(server.pid)}")
        before_text = (f"{describe_rev(args.before)} (worktree {before_tree})"
                       if before_tree else "not measured (no git or no such commit)")  # fmt: skip
        print(f"  before: {before_text}")
        print(f"  after: {describe_after()}", flush=True)
        trees = {"after": ROOT} if before_tree is None else {"before": before_tree,
                                                               "after": ROOT}  # fmt: skip
        t0 = time.perf_counter()
        for side, tree in trees.items():
            workers.append(WorkerProcess(side, tree, server.url, args.smoke,
                                         placement.client_cpu))  # fmt: skip
        print(f"  [workers ready (runs built): {time.perf_counter() - t0:.1f} s]",
              file=sys.stderr, flush=True)  # fmt: skip
        for rnd in range(rounds):
            t0 = time.perf_counter()
            for w, figures in zip(workers, run_round(workers, sizes, rnd), strict=True):
                results[w.side].append(figures)
            print(f"  [round {rnd + 1}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr,
                  flush=True)  # fmt: skip
        client.close()
    finally:
        for w in workers:
            w.close()
        server.stop()
        if before_tree is not None:
            remove_worktree(before_tree)
        shutil.rmtree(scratch, ignore_errors=True)
    rows = compare(row_specs(sizes), results["before"], results["after"])
    print()
    print_table(rows)
    judged = [r for r in rows if r.verdict in ("ok", "WORSE")]
    worse = [r for r in judged if r.verdict == "WORSE"]
    if not judged:
        print("\nno row more than 15% worse? n/a (before not measured)")
    elif worse:
        print(
            f"\nno row more than {THRESHOLD:.0%} worse? NO: "
            + "; ".join(f"{r.label} {r.worse * 100:+.0f}%" for r in worse if r.worse)
        )
    else:
        print(f"\nno row more than {THRESHOLD:.0%} worse? yes")
    print("\nwhere the time goes (before -> after, medians over the rounds):")
    print_costs(results["before"], results["after"])
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "sizes": asdict(sizes), "rounds": rounds, "raw": results,
            "rows": [asdict(r) for r in rows],
        }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
