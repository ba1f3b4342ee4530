"""``luft-redis demo``: a fleet of worker processes runs a simulated luft workflow on one run.

What it shows, in about ten seconds:

- a coordinator process creates a run (``init_run_with_meta``) and drives its phases;
- W worker processes (``multiprocessing``, spawn), each with its own client and backend bound
  with ``open_run``, take agent jobs and write agent_started / agent_progress / agent_done events
  and agent results to the same run, concurrently;
- the coordinator learns of the workers' writes through its coherent in-process cache
  (``wait_for_change``: change notices, no polling of the run) and draws a live progress line;
- mid-run, one worker is killed with SIGKILL while it runs an agent (agent_started, no
  agent_done); the run is resumed as luft would: a fresh backend ``open_run``,
  ``reset_status_to_running``, agents whose cached result is ``ok`` are skipped, the others are
  re-run by the surviving workers;
- at the end it checks the invariants, prints a summary and the ``redis-cli`` commands to
  inspect the run.

Without ``--redis URL`` it starts a private ``redis-server`` (from PATH, ``appendonly yes``) on a
free loopback port and stops it at exit; without a ``redis-server`` binary (or with
``--fakeredis`` / env ``LUFT_REDIS_DEMO_FAKEREDIS=1``) it serves an embedded fakeredis over TCP
instead, which is in memory only (not durable).

The job queue (``<prefix>:{<run>}:demo:jobs`` and one ``...:demo:working:<worker>`` list per
worker, moved with ``BLMOVE``) is demo-only data: luft-redis itself stores no queues.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import importlib.util
import json
import multiprocessing as mp
import multiprocessing.process
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import redis
from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..backend import RedisCheckpointBackend
from ..keys import run_keys
from ..listener import POLL_SECONDS as LISTENER_POLL_SECONDS
from ..types import (
    AgentDone,
    AgentEvent,
    AgentProgress,
    AgentResultCache,
    AgentStarted,
    AgentStatus,
    CheckpointStatus,
    Finding,
    Location,
    PhaseDone,
    PhaseStarted,
    ProgressMessage,
    ProgressTokens,
    ProgressToolCall,
    RunCheckpoint,
    RunDone,
    RunStarted,
    RunStatus,
    Severity,
    TokenUsage,
)
from .server import LocalRedisServer, find_free_port, find_redis_server

__all__ = ["FAKEREDIS_ENV", "PREFIX", "DemoError", "main"]

PREFIX = "luft"
"""Key prefix of the demo's run (the default prefix: what ``redis-cli`` users expect)."""

FAKEREDIS_ENV = "LUFT_REDIS_DEMO_FAKEREDIS"
"""Set to 1 to use the embedded fakeredis server even when redis-server is on PATH."""

PHASE_LABELS = ("discover", "review", "verify", "fix", "report")
ROLES = ("scout", "reviewer", "verifier", "fixer", "writer")
MODEL = "claude-sim"
WORKER_IDLE_EXIT = 120.0  # a worker with no job for this long gives up (an orphan safety net)
JOIN_TIMEOUT = 10.0
BLOCK_SECONDS: Any = 0.2  # BLMOVE timeout (redis-py's stubs say int; Redis takes a float)


class DemoError(Exception):
    """The demo failed; the message says why."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


# ------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Job:
    """One agent to run (what goes on the demo's job list)."""

    agent_id: uuid.UUID
    phase_id: int
    seq: int
    attempt: int
    label: str
    role: str
    fail: bool = False  # a simulated tool error on this attempt

    def encode(self) -> bytes:
        return json.dumps({
            "agent_id": str(self.agent_id), "phase_id": self.phase_id, "seq": self.seq,
            "attempt": self.attempt, "label": self.label, "role": self.role, "fail": self.fail,
        }).encode()  # fmt: skip

    @classmethod
    def decode(cls, raw: bytes) -> Job:
        obj = json.loads(raw)
        return cls(
            agent_id=uuid.UUID(obj["agent_id"]), phase_id=int(obj["phase_id"]),
            seq=int(obj["seq"]), attempt=int(obj["attempt"]), label=str(obj["label"]),
            role=str(obj["role"]), fail=bool(obj["fail"]),
        )  # fmt: skip

    def retry(self) -> Job:
        return Job(agent_id=self.agent_id, phase_id=self.phase_id, seq=self.seq,
                   attempt=self.attempt + 1, label=self.label, role=self.role)  # fmt: skip


def make_plan(seed: int, phases: int, agents: int, crash_phase: int | None) -> list[list[Job]]:
    """The workflow: ``phases`` phases of ``agents`` agents each, deterministic for ``seed``.

    In every phase before the crash one agent fails on its first attempt (a simulated tool
    error): the resume re-runs it, as it re-runs the agent the crash interrupted.
    """
    rng = random.Random(seed)
    plan: list[list[Job]] = []
    seq = 0
    for p in range(phases):
        label, role = PHASE_LABELS[p % len(PHASE_LABELS)], ROLES[p % len(ROLES)]
        failing = rng.randrange(agents) if crash_phase is not None and p < crash_phase else -1
        jobs = []
        for i in range(agents):
            jobs.append(Job(agent_id=uuid.UUID(int=rng.getrandbits(128), version=4),
                            phase_id=p, seq=seq, attempt=0, label=label, role=role,
                            fail=i == failing))  # fmt: skip
            seq += 1
        plan.append(jobs)
    return plan


@dataclass(frozen=True)
class DemoKeys:
    """The demo-only keys, under the run's prefix and hash tag."""

    jobs: str
    working_prefix: str

    @classmethod
    def of(cls, prefix: str, run_id: uuid.UUID) -> DemoKeys:
        base = f"{prefix}:{{{run_id}}}:demo:"
        return cls(jobs=base + "jobs", working_prefix=base + "working:")

    def working(self, worker: int) -> str:
        return f"{self.working_prefix}{worker}"


# ------------------------------------------------------------------------------ the workers


def _simulate(
    backend: RedisCheckpointBackend,
    run_id: uuid.UUID,
    job: Job,
    seed: int,
    fast: bool,
    worker: int,
) -> None:
    """Run one simulated agent: agent_started, progress, agent_done, then its result."""
    rng = random.Random(f"{seed}:{job.agent_id}:{job.attempt}")
    duration = rng.uniform(0.15, 0.3) if fast else rng.uniform(1.2, 3.5)
    started = time.monotonic()
    name = f"{job.role}-{job.seq}"
    backend.append_event(AgentStarted(
        run_id=run_id, phase_id=job.phase_id, agent_id=job.agent_id,
        prompt_preview=f"{job.label}: look at module {job.seq} for defects",
        model=MODEL, description=f"{job.label} agent {job.seq}", role=job.role, name=name,
        agent_seq=job.seq, ts=_now(),
    ))  # fmt: skip
    tokens = TokenUsage(input=rng.randint(800, 6000), output=rng.randint(120, 1500),
                        cache_read=rng.randint(0, 4000))  # fmt: skip
    steps = rng.randint(2, 4)
    deltas: list[Any] = [
        ProgressMessage(text=f"reading module {job.seq} (worker {worker})"),
        ProgressToolCall(name="grep", summary=f"grep -n TODO src/mod_{job.seq}.py"),
        ProgressMessage(text="thinking about edge cases"),
        ProgressToolCall(name="read_file", summary=f"src/mod_{job.seq}.py"),
    ]
    for step in range(steps):
        time.sleep(duration / (steps + 1))
        delta = deltas[step] if step < steps - 1 else ProgressTokens(usage=TokenUsage(
            input=tokens.input // 2, output=tokens.output // 2))  # fmt: skip
        backend.append_event(AgentProgress(run_id=run_id, agent_id=job.agent_id, delta=delta))
    time.sleep(duration / (steps + 1))
    status = AgentStatus.ERROR if job.fail else AgentStatus.OK
    findings: tuple[Finding, ...] = ()
    if status is AgentStatus.OK:
        findings = tuple(
            Finding(kind=rng.choice(("bug", "smell", "security")),
                    severity=rng.choice(list(Severity)),
                    title=f"issue {k + 1} in module {job.seq}",
                    detail="found by the simulated agent",
                    location=Location(file=f"src/mod_{job.seq}.py", line=rng.randint(1, 400)))
            for k in range(rng.randint(0, 2))
        )  # fmt: skip
    output = {"attempt": job.attempt, "worker": worker,
              "summary": "tool error: grep timed out" if job.fail
              else f"{len(findings)} finding(s) in module {job.seq}"}  # fmt: skip
    elapsed_ms = int((time.monotonic() - started) * 1000)
    # agent_done first: it is the commit point (an ok result always comes with its ok
    # agent_done); the full result (cache_key_hash, description, role) tells the coordinator
    # that the job is finished.
    backend.append_event(AgentDone(
        run_id=run_id, agent_id=job.agent_id, status=status, tokens=tokens,
        elapsed_ms=elapsed_ms, name=name, agent_seq=job.seq, ts=_now(), output=output,
        findings=findings, prompt=f"{job.label} module {job.seq}", retry_count=job.attempt,
    ))  # fmt: skip
    backend.upsert_agent_result(AgentResultCache(
        agent_id=job.agent_id, phase_id=job.phase_id, status=status.cache_str, output=output,
        findings=findings, tokens=tokens.total(), completed_at=int(time.time()),
        cache_key_hash=hashlib.sha256(f"{job.label}:{job.seq}".encode()).hexdigest()[:16],
        description=f"{job.label} agent {job.seq}", role=job.role,
    ))  # fmt: skip


def _worker_main(url: str, prefix: str, run_id_text: str, worker: int, seed: int,
                 fast: bool) -> None:  # fmt: skip
    """A worker process: bind the run, take jobs until the run is no longer running."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator handles Ctrl-C
    run_id = uuid.UUID(run_id_text)
    parent = os.getppid()
    client = redis.Redis.from_url(url)
    backend = RedisCheckpointBackend(client, prefix=prefix)
    try:
        if backend.open_run(run_id) is None:
            raise SystemExit(3)
        keys = DemoKeys.of(prefix, run_id)
        idle_since = time.monotonic()
        while True:
            checkpoint = backend.get_checkpoint()  # the cache: no I/O
            if checkpoint is None or checkpoint.status is not CheckpointStatus.RUNNING:
                return
            if os.getppid() != parent or time.monotonic() - idle_since > WORKER_IDLE_EXIT:
                return
            raw: Any = client.blmove(keys.jobs, keys.working(worker), BLOCK_SECONDS,
                                     "LEFT", "RIGHT")  # fmt: skip
            if raw is None:
                continue
            _simulate(backend, run_id, Job.decode(raw), seed, fast, worker)
            client.lrem(keys.working(worker), 1, raw)
            idle_since = time.monotonic()
    finally:
        backend.close()
        time.sleep(3 * LISTENER_POLL_SECONDS)  # let the listener unsubscribe first
        client.close()


# ------------------------------------------------------------------------------ the server


@dataclass
class Target:
    """Where the demo's Redis is, and how it was obtained."""

    url: str
    kind: str  # "given", "redis-server" or "fakeredis"
    host: str
    port: int
    db: int


@contextlib.contextmanager
def _redis_target(args: argparse.Namespace, out: TextIO) -> Iterator[Target]:
    if args.redis:
        kwargs = redis.Redis.from_url(args.redis).connection_pool.connection_kwargs
        yield Target(args.redis, "given", str(kwargs.get("host", "127.0.0.1")),
                     int(kwargs.get("port", 6379)), int(kwargs.get("db", 0) or 0))  # fmt: skip
        return
    want_fake = args.fakeredis or os.environ.get(FAKEREDIS_ENV, "") not in ("", "0", "false")
    binary = None if want_fake else find_redis_server()
    if binary is not None:
        workdir = tempfile.mkdtemp(prefix="luft-redis-demo-") if args.keep else None
        server = LocalRedisServer(binary=binary, appendonly=True, dir=workdir)
        kept = False
        try:
            server.start()
            fate = ("--keep: it keeps running after the demo" if args.keep
                    else "it is stopped at exit (--keep keeps it)")  # fmt: skip
            print(f"Started a private redis-server (pid {server.pid}) on {server.url} in "
                  f"{server.dir} (appendonly yes); {fate}.", file=out)  # fmt: skip
            yield Target(server.url, "redis-server", "127.0.0.1", server.port, 0)
            if args.keep:
                server.detach()
                kept = True
        finally:
            if not kept:
                server.stop()
        return
    fakeredis = _import_fakeredis()
    reason = "as asked" if want_fake else "no redis-server on PATH"
    port = find_free_port()
    fake = fakeredis.TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=fake.serve_forever, kwargs={"poll_interval": 0.05},
                              name="luft-redis-demo-fakeredis", daemon=True)  # fmt: skip
    thread.start()
    print(f"Using an embedded fakeredis server on 127.0.0.1:{port} ({reason}): it serves the "
          "worker processes over TCP, Lua included, but it is in memory only, NOT durable, "
          "and it ends with the demo.", file=out)  # fmt: skip
    try:
        yield Target(f"redis://127.0.0.1:{port}/0", "fakeredis", "127.0.0.1", port, 0)
    finally:
        fake.shutdown()
        fake.server_close()
        thread.join(timeout=5)


def _import_fakeredis() -> Any:
    """fakeredis with Lua, or DemoError saying what to install."""
    try:
        import fakeredis  # only for the fallback: a test dependency, not a runtime one
    except ImportError:
        raise DemoError("the embedded server needs fakeredis: pip install 'fakeredis[lua]' "
                        "(or put redis-server on PATH, or pass --redis URL)") from None
    if importlib.util.find_spec("lupa") is None:
        raise DemoError("fakeredis is installed without Lua (luft-redis runs every change as "
                        "a Lua script): pip install 'fakeredis[lua]'")  # fmt: skip
    return fakeredis


# ------------------------------------------------------------------------------ the display


class Display:
    """A live progress line on a terminal (rich: cut to the terminal's width, redrawn in
    place); periodic plain lines otherwise."""

    def __init__(self, out: TextIO, plan: list[list[Job]], interval: float) -> None:
        self.out = out
        self.plan = plan
        self.tty = out.isatty()
        self.interval = 0.1 if self.tty else interval
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._last_line = ""
        self._console = Console(file=out, highlight=False) if self.tty else None
        self._live: Live | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self, cp: RunCheckpoint, phase: int, alive: int, workers: int) -> str:
        parts = []
        for p, jobs in enumerate(self.plan):
            done = sum(1 for j in jobs if j.agent_id in cp.agent_results)
            parts.append(f"P{p} {done}/{len(jobs)}")
        return (f"[{self.elapsed():5.1f}s] phase {phase} {self.plan[phase][0].label} | "
                f"agents {' '.join(parts)} | tokens {cp.total_tokens:,} | "
                f"findings {len(cp.findings)} | workers {alive}/{workers} alive")  # fmt: skip

    def _text(self, line: str) -> Text:
        return Text(line, style="bold", no_wrap=True, overflow="ellipsis")

    def update(self, cp: RunCheckpoint, phase: int, alive: int, workers: int,
               force: bool = False) -> None:  # fmt: skip
        now = time.monotonic()
        if not force and now - self._last_draw < self.interval:
            return
        text = self.line(cp, phase, alive, workers)
        if not self.tty and text[9:] == self._last_line[9:] and not force:
            return
        self._last_draw, self._last_line = now, text
        if self._console is not None:
            if self._live is None:
                self._live = Live(self._text(text), console=self._console, auto_refresh=False,
                                  transient=True)  # fmt: skip
                self._live.start()
            else:
                self._live.update(self._text(text), refresh=True)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def say(self, message: str) -> None:
        """A message line (above the live line on a terminal)."""
        prefix = f"[{self.elapsed():5.1f}s] " if message and not message.startswith(" ") else ""
        if self._console is not None:
            # printed above the live line, wrapped to the terminal's width
            self._console.print(Text(prefix + message))
            return
        self.out.write(prefix + message + "\n")
        self.out.flush()

    def finish(self) -> None:
        """Stop the live line for good and leave its last state once, as a plain line."""
        live, self._live = self._live, None
        if live is not None:
            live.stop()  # transient: the live line goes
            assert self._console is not None
            # one line, cut to the terminal's width (never wrapped onto a second line)
            self._console.print(self._text(self._last_line), crop=True, no_wrap=True,
                                overflow="ellipsis")  # fmt: skip


# ------------------------------------------------------------------------------ the coordinator


@dataclass
class Stats:
    rerun_interrupted: list[uuid.UUID] = field(default_factory=list)
    rerun_failed: list[uuid.UUID] = field(default_factory=list)
    skipped_ok: int = 0
    killed: str = ""
    crashed: bool = False


class Coordinator:
    def __init__(self, args: argparse.Namespace, target: Target, out: TextIO) -> None:
        self.args = args
        self.target = target
        self.out = out
        self.run_id = uuid.uuid4()
        self.keys = run_keys(PREFIX, self.run_id)
        self.demo_keys = DemoKeys.of(PREFIX, self.run_id)
        self.crash_phase = None if args.no_crash else min(1, args.phases - 1)
        self.plan = make_plan(args.seed, args.phases, args.agents, self.crash_phase)
        self.jobs = {j.agent_id: j for phase in self.plan for j in phase}
        self.client: redis.Redis = redis.Redis.from_url(target.url)
        self.backend = RedisCheckpointBackend(self.client, prefix=PREFIX)
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.pending: dict[uuid.UUID, int] = {}  # agent -> the attempt whose result we await
        self.stats = Stats()
        self.display = Display(out, self.plan, 0.5 if args.fast else 2.0)
        self.phase_timeout = 60.0 if args.fast else 300.0
        self.events: list[AgentEvent] = []
        self.retired: list[redis.Redis] = []

    # -- helpers -------------------------------------------------------------------------

    def alive(self) -> int:
        return sum(1 for p in self.procs if p.is_alive())

    def finished(self, cp: RunCheckpoint, agent: uuid.UUID) -> bool:
        """The awaited attempt of ``agent`` has its full result (the worker's upsert)."""
        result = cp.agent_results.get(agent)
        if result is None or result.cache_key_hash is None:
            return False
        output = result.output
        return isinstance(output, dict) and output.get("attempt") == self.pending[agent]

    def enqueue(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self.pending[job.agent_id] = job.attempt
        if jobs:
            self.client.rpush(self.demo_keys.jobs, *(j.encode() for j in jobs))

    def start_workers(self) -> None:
        ctx = mp.get_context("spawn")
        for i in range(self.args.workers):
            proc = ctx.Process(
                target=_worker_main, name=f"luft-demo-worker-{i + 1}", daemon=True,
                args=(self.target.url, PREFIX, str(self.run_id), i + 1, self.args.seed,
                      self.args.fast),
            )  # fmt: skip
            proc.start()
            self.procs.append(proc)
        pids = ", ".join(str(p.pid) for p in self.procs)
        self.display.say(f"started {len(self.procs)} worker processes (spawn; pids {pids})")

    def stop_workers(self) -> None:
        deadline = time.monotonic() + JOIN_TIMEOUT
        for proc in self.procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)

    # -- the run -------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        meta = {
            "workflow": "fleet-demo",
            "seed": args.seed,
            "workers": args.workers,
            "phases": [{"label": jobs[0].label, "agents": len(jobs)} for jobs in self.plan],
        }
        self.backend.init_run_with_meta(self.run_id, "simulated review of a repository",
                                        tempfile.gettempdir() + f"/luft-demo-{self.run_id}",
                                        meta)  # fmt: skip
        self.display.say(f"run {self.run_id}: {args.phases} phases x {args.agents} agents, "
                         f"{args.workers} workers, seed {args.seed}")  # fmt: skip
        self.display.say(f"follow it from another terminal: luft-redis --redis "
                         f"{self.target.url} watch {self.run_id}")  # fmt: skip
        self.backend.append_event(RunStarted(run_id=self.run_id, task="simulated review",
                                             ts=_now()))  # fmt: skip
        ok = False
        try:
            self.start_workers()
            for p, jobs in enumerate(self.plan):
                self.run_phase(p, jobs)
            cp = self.checkpoint()
            self.backend.append_event(RunDone(
                run_id=self.run_id, status=RunStatus.COMPLETED, total_tokens=TokenUsage(),
                report={"agents": len(self.jobs), "findings": len(cp.findings)}, ts=_now(),
            ))  # fmt: skip
            self.display.update(self.checkpoint(), len(self.plan) - 1, self.alive(),
                                len(self.procs), force=True)  # fmt: skip
            self.display.finish()
            self.stop_workers()  # they see `completed` in their caches and stop
            self.verify()
            self.summary()
            ok = True
            return 0
        finally:
            self.display.finish()
            if not ok:
                with contextlib.suppress(Exception):
                    self.backend.cancel()  # the workers see it and stop
            self.stop_workers()
            self.cleanup()

    def checkpoint(self) -> RunCheckpoint:
        cp = self.backend.get_checkpoint()
        if cp is None:
            raise DemoError("the coordinator lost its run")
        return cp

    def run_phase(self, p: int, jobs: list[Job]) -> None:
        self.backend.append_event(PhaseStarted(
            run_id=self.run_id, phase_id=p, label=jobs[0].label, planned=len(jobs),
            description=f"phase {p}: {jobs[0].label}", role=jobs[0].role, ts=_now(),
        ))  # fmt: skip
        self.display.say(f"phase {p} '{jobs[0].label}' (phases 0-{len(self.plan) - 1}): "
                         f"{len(jobs)} agent jobs queued")  # fmt: skip
        self.enqueue(jobs)
        extra = self.wait_phase(p, jobs)
        for q in sorted(extra):
            self.phase_done(q, p)
        self.phase_done(p, p)

    def phase_done(self, p: int, current: int) -> None:
        cp = self.checkpoint()
        results = [cp.agent_results.get(j.agent_id) for j in self.plan[p]]
        ok = sum(1 for r in results if r is not None and r.status == "ok")
        failed = len(results) - ok
        self.backend.append_event(PhaseDone(run_id=self.run_id, phase_id=p, ok=ok,
                                            failed=failed, ts=_now()))  # fmt: skip
        self.display.update(self.checkpoint(), current, self.alive(), len(self.procs),
                            force=True)  # fmt: skip
        again = " again (the resume re-opened it)" if p < current else ""
        self.display.say(f"phase {p} done{again}: {ok} ok, {failed} failed")

    def wait_phase(self, p: int, jobs: list[Job]) -> set[int]:
        """Wait until every awaited agent is finished, from the cache alone; crash if due.

        Returns the earlier phases the resume re-opened (their phase_done is still due).
        """
        deadline = time.monotonic() + self.phase_timeout
        crash_due = self.crash_phase is not None and p >= self.crash_phase
        threshold = max(1, len(jobs) // 3)
        reopened: set[int] = set()
        while True:
            version = self.backend.version
            cp = self.checkpoint()
            self.display.update(cp, p, self.alive(), len(self.procs))
            waiting = [a for a in self.pending if not self.finished(cp, a)]
            if not waiting:
                for a in [a for a in self.pending if self.jobs[a].phase_id <= p]:
                    del self.pending[a]
                return reopened
            if crash_due and not self.stats.crashed:
                done = sum(1 for j in jobs if self.finished(cp, j.agent_id))
                if done >= threshold and self.crash(cp, p):
                    reopened = self.resume(p)
                    deadline = time.monotonic() + self.phase_timeout
                    continue
            if self.alive() == 0:
                raise DemoError(f"phase {p}: every worker process has exited")
            if time.monotonic() > deadline:
                raise DemoError(f"phase {p}: {len(waiting)} agents still unfinished after "
                                f"{self.phase_timeout:.0f}s")  # fmt: skip
            # woken by the change notices of the workers' writes (the coherent cache)
            self.backend.wait_for_change(after_version=version, timeout=0.25)

    # -- the crash and the resume --------------------------------------------------------

    def crash(self, cp: RunCheckpoint, p: int) -> bool:
        """SIGKILL the worker running the most recently started agent; False if none runs."""
        in_flight = [a for a in reversed(cp.started_agent_ids)
                     if a in self.pending and a not in cp.agent_results]  # fmt: skip
        if not in_flight or self.alive() < 2:
            return False
        pipe = self.client.pipeline(transaction=False)
        for i in range(1, len(self.procs) + 1):
            pipe.lrange(self.demo_keys.working(i), 0, -1)
        holders: dict[uuid.UUID, int] = {}
        for i, raws in enumerate(pipe.execute(), start=1):
            for raw in raws:
                holders[Job.decode(raw).agent_id] = i
        for agent in in_flight:
            worker = holders.get(agent)
            if worker is None or not self.procs[worker - 1].is_alive():
                continue
            proc = self.procs[worker - 1]
            proc.kill()  # SIGKILL: no cleanup, no agent_done
            proc.join(timeout=5)
            self.stats.crashed = True
            job = self.jobs[agent]
            self.stats.killed = f"worker {worker} (pid {proc.pid})"
            self.display.say(f"CRASH: killed worker {worker} (pid {proc.pid}, SIGKILL) while it "
                             f"ran agent {job.role}-{job.seq} ({agent})")  # fmt: skip
            return True
        return False

    def resume(self, p: int) -> set[int]:
        """Resume the run as luft would, with a fresh backend: skip ok agents, re-run the rest.

        Returns the earlier phases that got agents to re-run.
        """
        # What is still queued or held by a live worker: one consistent read (BLMOVE moves a
        # job atomically between these lists), made before the checkpoint is loaded.
        live = [i for i, proc in enumerate(self.procs, start=1) if proc.is_alive()]
        dead = [i for i, proc in enumerate(self.procs, start=1) if not proc.is_alive()]
        pipe = self.client.pipeline(transaction=True)
        pipe.lrange(self.demo_keys.jobs, 0, -1)
        for i in live:
            pipe.lrange(self.demo_keys.working(i), 0, -1)
        replies = pipe.execute()
        queued = {Job.decode(raw).agent_id for raw in replies[0]}
        held = {Job.decode(raw).agent_id for raws in replies[1:] for raw in raws}
        if dead:
            self.client.delete(*(self.demo_keys.working(i) for i in dead))

        self.display.say("RESUME: a fresh backend (new client) runs open_run, "
                         "reset_status_to_running")  # fmt: skip
        old_backend, old_client = self.backend, self.client
        self.client = redis.Redis.from_url(self.target.url)
        self.backend = RedisCheckpointBackend(self.client, prefix=PREFIX)
        cp = self.backend.open_run(self.run_id)
        old_backend.close()
        self.retired.append(old_client)  # closed at the end, once its listener has let go
        if cp is None:
            raise DemoError(f"resume: run {self.run_id} not found")
        if not self.backend.can_resume():
            raise DemoError(f"resume: run {self.run_id} is {cp.status}, not resumable")
        self.backend.reset_status_to_running()
        cp = self.checkpoint()

        reruns: list[Job] = []
        skipped = 0
        for q in range(p + 1):
            for job in self.plan[q]:
                a = job.agent_id
                result = cp.agent_results.get(a)
                if result is not None and result.status == "ok":
                    skipped += 1
                    self.pending.pop(a, None)  # its cached result is ok: skip it
                    continue
                if a in queued or (a in held and result is None):
                    continue  # still on the list, or running on a live worker
                if a not in cp.started_agent_ids:
                    continue  # never started: still awaited as queued
                if result is None:
                    self.stats.rerun_interrupted.append(a)
                else:
                    self.stats.rerun_failed.append(a)
                prev = self.pending.get(a, job.attempt)
                reruns.append(Job(agent_id=a, phase_id=job.phase_id, seq=job.seq,
                                  attempt=prev + 1, label=job.label, role=job.role))  # fmt: skip
        self.stats.skipped_ok = skipped
        reopened = sorted({j.phase_id for j in reruns if j.phase_id < p})
        for q in reopened:  # a resumed run starts its unfinished phases again
            first = self.plan[q][0]
            self.backend.append_event(PhaseStarted(
                run_id=self.run_id, phase_id=q, label=first.label, planned=len(self.plan[q]),
                description=f"phase {q}: {first.label} (resumed)", role=first.role,
                ts=_now(),
            ))  # fmt: skip
        self.enqueue(reruns)
        names = ", ".join(f"{j.role}-{j.seq}" for j in reruns) or "none"
        self.display.say(f"RESUME: {skipped} agents with an ok result skipped; re-queued "
                         f"{len(reruns)} to the {len(live)} surviving workers: {names} "
                         f"({len(self.stats.rerun_interrupted)} interrupted by the crash, "
                         f"{len(self.stats.rerun_failed)} with an error result)")  # fmt: skip
        return set(reopened)

    # -- the end -------------------------------------------------------------------------

    def verify(self) -> None:
        """Check the invariants; DemoError naming the first that fails."""
        cp = self.checkpoint()
        problems: list[str] = []
        fresh_client = redis.Redis.from_url(self.target.url)
        try:
            fresh = RedisCheckpointBackend(fresh_client, prefix=PREFIX, watch=False)
            loaded = fresh.open_run(self.run_id)
            if loaded is None:
                raise DemoError("verify: the run is gone")
            fresh_version = fresh.version
            events = fresh.get_event_log()
            fresh.close()
        finally:
            fresh_client.close()
        if not self.backend.wait_for_change(after_version=fresh_version - 1, timeout=5):
            problems.append(f"the cache is at version {self.backend.version}, Redis at "
                            f"{fresh_version}")  # fmt: skip
        cp = self.checkpoint()
        if cp.to_json() != loaded.to_json():
            diff = [k for k, v in cp.to_json().items() if loaded.to_json()[k] != v]
            problems.append(f"the coordinator's cache differs from a fresh open_run in {diff}")
        if cp.status is not CheckpointStatus.COMPLETED:
            problems.append(f"status is {cp.status}, not completed")
        planned = set(self.jobs)
        if set(cp.agent_results) != planned:
            problems.append(f"agent_results has {len(cp.agent_results)} agents, "
                            f"planned {len(planned)}")  # fmt: skip
        not_ok = [a for a, r in cp.agent_results.items() if r.status != "ok"]
        if not_ok:
            problems.append(f"{len(not_ok)} agents without an ok result")
        if len(set(cp.started_agent_ids)) != len(cp.started_agent_ids):
            problems.append("started_agent_ids has duplicates")
        if set(cp.started_agent_ids) != planned:
            problems.append("started_agent_ids differs from the plan")
        done = [e for e in events if isinstance(e, AgentDone)]
        ok_done = Counter(e.agent_id for e in done if e.status is AgentStatus.OK)
        bad = [a for a in planned if ok_done[a] != 1]
        if bad:
            problems.append(f"{len(bad)} agents without exactly one ok agent_done")
        log_tokens = sum(e.tokens.total() for e in done)
        if log_tokens != cp.total_tokens:
            problems.append(f"total_tokens {cp.total_tokens} != {log_tokens}, the sum of the "
                            "log's agent_done tokens")  # fmt: skip
        for summary in cp.completed_phases:
            if (summary.ok, summary.failed) != (len(self.plan[summary.phase_id]), 0):
                problems.append(f"phase {summary.phase_id}: ok={summary.ok} "
                                f"failed={summary.failed}")  # fmt: skip
        if problems:
            raise DemoError("invariants violated: " + "; ".join(problems))
        self.events = events
        self.display.say(f"invariants hold: {len(planned)} agents, each with one ok result "
                         "and one ok agent_done; total_tokens = sum of agent_done tokens; the "
                         "cache equals a fresh open_run")  # fmt: skip

    def summary(self) -> None:
        cp = self.checkpoint()
        out = self.out
        severities = Counter(f.severity for f in cp.findings)
        by_sev = ", ".join(f"{s} {severities[s]}" for s in sorted(Severity, reverse=True)
                           if severities[s]) or "none"  # fmt: skip
        failed_events = sum(
            1 for e in self.events if isinstance(e, AgentDone) and e.status is not AgentStatus.OK
        )
        phases = ", ".join(f"{s.phase_id} {s.label} {s.ok}/{s.ok + s.failed} ok"
                           for s in cp.completed_phases)
        reruns = len(self.stats.rerun_interrupted) + len(self.stats.rerun_failed)
        print("", file=out)
        print("Summary", file=out)
        print(f"  run       {self.run_id}: {cp.status}", file=out)
        print(f"  phases    {len(cp.completed_phases)}: {phases}", file=out)
        ok = sum(1 for r in cp.agent_results.values() if r.status == "ok")
        print(f"  agents    {ok} ok, {len(cp.agent_results) - ok} failed at the end; "
              f"{failed_events} attempt(s) failed on the way", file=out)  # fmt: skip
        if self.stats.crashed:
            print(f"  crash     {self.stats.killed} killed with SIGKILL mid-run; "
                  f"the resume skipped {self.stats.skipped_ok} agents with an ok result and "
                  f"re-ran {reruns} ({len(self.stats.rerun_interrupted)} interrupted, "
                  f"{len(self.stats.rerun_failed)} with an error result)", file=out)  # fmt: skip
        else:
            print("  crash     none (--no-crash)", file=out)
        print(f"  tokens    total_tokens {cp.total_tokens:,}", file=out)
        print(f"  findings  {len(cp.findings)}: {by_sev}", file=out)
        print(f"  events    {len(self.events)} in the log", file=out)
        print(f"  time      {self.display.elapsed():.1f} s", file=out)
        self.print_inspect()

    def print_inspect(self) -> None:
        """How to look at the run after the demo: only commands that will work then."""
        out, tgt, keep = self.out, self.target, self.args.keep
        print("", file=out)
        if tgt.kind == "fakeredis":
            print("The embedded fakeredis server ends with the demo, and the run with it. Put "
                  "redis-server on PATH (or pass --redis URL) and --keep to inspect it "
                  "afterwards.", file=out)  # fmt: skip
            return
        if not keep:
            what = ("its keys are deleted" if tgt.kind == "given"
                    else "the private redis-server is stopped")  # fmt: skip
            print(f"The run is gone: {what} at exit. Run the demo with --keep to keep it and "
                  "inspect it afterwards.", file=out)  # fmt: skip
            return
        if tgt.kind == "redis-server":
            print(f"--keep: the private redis-server keeps running on {tgt.url}; stop it with: "
                  f"redis-cli -p {tgt.port} shutdown nosave", file=out)  # fmt: skip
        cli = (
            "redis-cli"
            + (f" -h {tgt.host}" if tgt.host not in ("127.0.0.1", "localhost") else "")
            + f" -p {tgt.port}"
            + (f" -n {tgt.db}" if tgt.db else "")
        )
        print(f"Run id {self.run_id}, kept on {tgt.url}. Inspect it:", file=out)
        print(f"  luft-redis --redis {tgt.url} show {self.run_id}", file=out)
        print(f"  luft-redis --redis {tgt.url} events {self.run_id}", file=out)
        print(f"  luft-redis --redis {tgt.url} runs", file=out)
        print(f'  {cli} HGETALL "{self.keys.run}"', file=out)
        print(f'  {cli} XLEN "{self.keys.events}"', file=out)
        print(f'  {cli} XREVRANGE "{self.keys.events}" + - COUNT 5', file=out)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            names = [
                self.demo_keys.jobs,
                *(self.demo_keys.working(i) for i in range(1, len(self.procs) + 1)),
            ]
            self.client.delete(*names)
        if not self.args.keep:
            with contextlib.suppress(Exception):
                self.backend.delete_run(self.run_id)  # its keys and its run-index entry
        with contextlib.suppress(Exception):
            self.backend.close()
        # the listener thread unsubscribes within its poll interval; closing the client
        # under it would make it log a lost connection
        time.sleep(3 * LISTENER_POLL_SECONDS)
        for client in (*self.retired, self.client):
            with contextlib.suppress(Exception):
                client.close()


# ------------------------------------------------------------------------------ entry point


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="luft-redis demo",
        description="A coordinator and W worker processes run a simulated luft workflow on one "
                    "Redis run; one worker is killed mid-run and the run is resumed.",
    )  # fmt: skip
    parser.add_argument("--redis", metavar="URL", default=None,
                        help="use this Redis (default: a private redis-server from PATH, else "
                             "an embedded fakeredis)")  # fmt: skip
    parser.add_argument(
        "--fakeredis",
        action="store_true",
        help=f"use the embedded fakeredis server (also env {FAKEREDIS_ENV}=1)",
    )
    parser.add_argument("--workers", type=_positive, default=4, help="worker processes (4)")
    parser.add_argument("--phases", type=_positive, default=3, help="phases (3)")
    parser.add_argument("--agents", type=_positive, default=8, help="agents per phase (8)")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the plan (7)")
    parser.add_argument("--fast", action="store_true", help="short agent durations (tests)")
    parser.add_argument("--no-crash", action="store_true", help="do not kill a worker")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run (and the private redis-server, which then keeps "
                             "running) to inspect it after the demo")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 on success, 1 on failure (with a message on stderr), 2 on bad usage."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if not args.no_crash and args.workers < 2:
        print("luft-redis demo: the crash needs at least 2 workers (or pass --no-crash)",
              file=sys.stderr)  # fmt: skip
        return 2
    out = sys.stdout
    try:
        with _redis_target(args, out) as target:
            try:
                return Coordinator(args, target, out).run()
            except redis.exceptions.ConnectionError as exc:
                raise DemoError(f"cannot reach Redis at {target.url}: {exc}") from exc
    except DemoError as exc:
        print(f"\nluft-redis demo: FAILED: {exc}", file=sys.stderr)
        return 1
    except (redis.exceptions.RedisError, OSError, RuntimeError) as exc:
        print(f"\nluft-redis demo: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nluft-redis demo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
