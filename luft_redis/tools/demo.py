"""``luft-redis demo``: a fleet of worker processes runs a simulated luft workflow, sharing
the fleet with other users' runs in one pool.

What it shows, in about fifteen seconds:

- a coordinator process creates a run (``init_run_with_meta``) and, phase by phase, submits the
  phase's agents as agent tasks (``submit_agents``: each with its payload: label, role,
  module);
- the run is one of R runs in the pool ``luft-demo`` (``--runs``, default 3): the others are
  other users' one-phase runs, submitted at the start; the workflow's run joins with weight
  2, so it gets about twice the workers of each other run while they all have work
  (docs/pools.md);
- W worker processes (``multiprocessing``, spawn), each with its own client and backend,
  claim agents of any run of the pool with a lease (``claim_agent(pool=...)``), run them inside
  ``with lease:`` (a heartbeat renews the lease) and write agent_started / agent_progress /
  agent_done and the agent's result *fenced* (``lease=lease``): a write is applied only while
  its lease is the agent's current one;
- one agent of the first phase fails its first attempt (a simulated tool error): its non-ok
  agent_done hands it back, and another claim retries it;
- one worker is killed with SIGKILL mid-agent: nobody hands its agent back, its lease lapses
  and the next claim takes the agent over; the coordinator does nothing about it;
- one worker is stopped with SIGSTOP mid-agent, past its lease: another worker takes its agent
  over; the coordinator then wakes it with SIGCONT, and its late write is refused
  (``LeaseLostError``, nothing written), which the worker reports in the run's log;
- the coordinator follows everything through its coherent in-process cache (change notices,
  no polling of the run) and ``agent_tasks()``, draws a live progress line, and at the end
  checks the invariants (each agent exactly one accepted ok agent_done, ...), prints a summary
  and the commands to inspect the run.

Where Redis is: ``--redis URL``, else env ``LUFT_REDIS_URL`` (as every ``luft-redis``
command), else a private ``redis-server`` (from PATH, ``appendonly yes``) on a free loopback
port, stopped at exit; without a ``redis-server`` binary (or with ``--fakeredis`` / env
``LUFT_REDIS_DEMO_FAKEREDIS=1``) an embedded fakeredis served over TCP, in memory only (not
durable). A Redis that cannot be reached exits 2, one that refuses the client (password, ACL)
exits 3, each with a one-line message, as the other commands do.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import importlib.util
import logging
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rich.console import Console
from rich.live import Live
from rich.text import Text

from .._sync.backend import RedisCheckpointBackend
from .._sync.lease import AgentLease
from .._sync.listener import POLL_SECONDS as LISTENER_POLL_SECONDS
from ..errors import AccessError, LeaseLostError, LuftRedisError, RunNotRunningError
from ..keys import run_keys
from ..retry import exception_chain
from ..tasks import AgentTask, TaskInfo, TaskState
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
    Log,
    LogLevel,
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
from .cli_common import EXIT_REFUSED, EXIT_UNREACHABLE, URL_ENV, redact_url, server_failure
from .server import LocalRedisServer, find_free_port, find_redis_server

__all__ = ["FAKEREDIS_ENV", "PREFIX", "REFUSED_MARK", "DemoError", "main"]

PREFIX = "luft"
"""Key prefix of the demo's run (the default prefix: what ``redis-cli`` users expect)."""

FAKEREDIS_ENV = "LUFT_REDIS_DEMO_FAKEREDIS"
"""Set to 1 to use the embedded fakeredis server even when redis-server is on PATH (a Redis
given with ``--redis`` or ``LUFT_REDIS_URL`` wins)."""

REFUSED_MARK = "late write refused"
"""In the log message a worker writes when a fenced write of its lost lease was refused."""

POOL = "luft-demo"
"""The pool the demo's runs join and its workers claim from."""

MAIN_WEIGHT = 2
"""The workflow's run's weight in the pool (the other runs': 1)."""

PHASE_LABELS = ("discover", "review", "verify", "fix", "report")
ROLES = ("scout", "reviewer", "verifier", "fixer", "writer")
MODEL = "claude-sim"
WORKER_IDLE_EXIT = 120.0  # a worker with nothing to claim for this long gives up (a safety net)
JOIN_TIMEOUT = 10.0
CLAIM_WAIT = 0.5  # seconds a worker's claim blocks (woken by change notices and lapses)
LEASE_FAST = 1.0  # lease durations (seconds): short, so that a lapse is seen soon
LEASE_SLOW = 1.5
PREFLIGHT_TIMEOUT = 5.0


class DemoError(Exception):
    """The demo failed; the message says why, ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _ok(cp: RunCheckpoint, agent: uuid.UUID) -> bool:
    """The agent's result is stored, and ok."""
    return (result := cp.agent_results.get(agent)) is not None and result.status == "ok"


# ------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Job:
    """One agent of the plan; its payload is what a worker needs to run it."""

    agent_id: uuid.UUID
    phase_id: int
    seq: int
    label: str
    role: str
    fail_first: bool = False  # a simulated tool error on its first attempt

    @property
    def name(self) -> str:
        return f"{self.role}-{self.seq}"

    def task(self) -> AgentTask:
        return AgentTask(self.agent_id, self.phase_id, {
            "seq": self.seq, "label": self.label, "role": self.role,
            "prompt": f"{self.label}: look at module {self.seq} for defects",
            "model": MODEL, "fail_first": self.fail_first,
        })  # fmt: skip

    @classmethod
    def of(cls, task: AgentTask) -> Job:
        payload = task.payload
        return cls(agent_id=task.agent_id, phase_id=task.phase_id, seq=int(payload["seq"]),
                   label=str(payload["label"]), role=str(payload["role"]),
                   fail_first=bool(payload["fail_first"]))  # fmt: skip


def make_plan(seed: int, phases: int, agents: int) -> list[list[Job]]:
    """The workflow: ``phases`` phases of ``agents`` agents each, deterministic for ``seed``.
    One agent of the first phase fails on its first attempt (a simulated tool error)."""
    rng = random.Random(seed)
    plan: list[list[Job]] = []
    for p in range(phases):
        label, role = PHASE_LABELS[p % len(PHASE_LABELS)], ROLES[p % len(ROLES)]
        failing = rng.randrange(agents) if p == 0 else -1
        plan.append([Job(agent_id=uuid.UUID(int=rng.getrandbits(128), version=4), phase_id=p,
                         seq=p * agents + i, label=label, role=role, fail_first=i == failing)
                     for i in range(agents)])  # fmt: skip
    return plan


def worker_name(worker: int, pid: int) -> str:
    """The holder name a worker claims with (``agent_tasks`` shows it)."""
    return f"worker{worker}:pid{pid}"


def worker_of(holder: str | None) -> int | None:
    """The worker number in a holder name, if it is one of ours."""
    if not holder or not holder.startswith("worker"):
        return None
    number = holder[len("worker"):].partition(":")[0]
    return int(number) if number.isdigit() else None


# ------------------------------------------------------------------------------ the workers


@dataclass(eq=False)
class Refused(Exception):
    """A fenced write of a lost lease was refused: ``what`` names the write."""

    what: str
    error: LeaseLostError


def _fenced(what: str, write: Callable[[], None]) -> None:
    try:
        write()
    except LeaseLostError as exc:
        raise Refused(what, exc) from exc


def _simulate(backend: RedisCheckpointBackend, run_id: uuid.UUID, job: Job, lease: AgentLease,
              seed: int, fast: bool, worker: int) -> None:  # fmt: skip
    """Run one simulated agent under ``lease``: agent_started, progress, agent_done and its
    result, every write fenced. Like any process that was paused, it does not know whether
    its lease is still its own: the fence decides, not ``lease.lost``."""
    rng = random.Random(f"{seed}:{job.agent_id}:{lease.attempt}")
    duration = rng.uniform(0.15, 0.3) if fast else rng.uniform(0.8, 2.4)
    started = time.monotonic()
    _fenced("agent_started", lambda: backend.append_event(AgentStarted(
        run_id=run_id, phase_id=job.phase_id, agent_id=job.agent_id,
        prompt_preview=f"{job.label}: look at module {job.seq} for defects",
        model=MODEL, description=f"{job.label} agent {job.seq}", role=job.role, name=job.name,
        agent_seq=job.seq, ts=_now(),
    ), lease=lease))  # fmt: skip
    tokens = TokenUsage(input=rng.randint(800, 6000), output=rng.randint(120, 1500),
                        cache_read=rng.randint(0, 4000))  # fmt: skip
    steps = rng.randint(2, 4)
    deltas: list[Any] = [
        ProgressMessage(text=f"reading module {job.seq} (worker {worker})"),
        ProgressToolCall(name="grep", summary=f"grep -n TODO src/mod_{job.seq}.py"),
        ProgressMessage(text="thinking about edge cases"),
        ProgressToolCall(name="read_file", summary=f"src/mod_{job.seq}.py"),
    ]
    halves = TokenUsage(input=tokens.input // 2, output=tokens.output // 2)
    for delta in [*deltas[: steps - 1], ProgressTokens(usage=halves)]:  # the tokens last
        time.sleep(duration / (steps + 1))
        progress = AgentProgress(run_id=run_id, agent_id=job.agent_id, delta=delta)
        _fenced("agent_progress", functools.partial(backend.append_event, progress, lease=lease))
    time.sleep(duration / (steps + 1))
    fail = job.fail_first and lease.attempt == 1
    status = AgentStatus.ERROR if fail else AgentStatus.OK
    findings = tuple(
        Finding(kind=rng.choice(("bug", "smell", "security")),
                severity=rng.choice(list(Severity)),
                title=f"issue {k + 1} in module {job.seq}",
                detail="found by the simulated agent",
                location=Location(file=f"src/mod_{job.seq}.py", line=rng.randint(1, 400)))
        for k in range(0 if fail else rng.randint(0, 2))  # no findings from a failed attempt
    )  # fmt: skip
    output = {"attempt": lease.attempt, "worker": worker, "token": lease.token,
              "summary": "tool error: grep timed out" if fail
              else f"{len(findings)} finding(s) in module {job.seq}"}  # fmt: skip
    result = AgentResultCache(
        agent_id=job.agent_id, phase_id=job.phase_id, status=status.cache_str, output=output,
        findings=findings, tokens=tokens.total(), completed_at=int(time.time()),
        cache_key_hash=hashlib.sha256(f"{job.label}:{job.seq}".encode()).hexdigest()[:16],
        description=f"{job.label} agent {job.seq}", role=job.role,
    )  # fmt: skip
    done = AgentDone(
        run_id=run_id, agent_id=job.agent_id, status=status, tokens=tokens,
        elapsed_ms=int((time.monotonic() - started) * 1000), name=job.name,
        agent_seq=job.seq, ts=_now(), output=output, findings=findings,
        prompt=f"{job.label} module {job.seq}", retry_count=lease.attempt - 1,
    )  # fmt: skip
    if fail:
        # a failed agent_done hands the agent back at once (another worker may claim it):
        # its result goes first, while the lease is surely still ours
        _fenced("error result", lambda: backend.upsert_agent_result(result, lease=lease))
        _fenced("agent_done", lambda: backend.append_event(done, lease=lease))
        return
    # an ok agent_done is the commit point: the agent is done, never handed out again; the
    # lease's token stays current (no claim follows), so the result right after is accepted
    _fenced("agent_done", lambda: backend.append_event(done, lease=lease))
    _fenced("result", lambda: backend.upsert_agent_result(result, lease=lease))


def _worker_main(url: str, prefix: str, run_id_text: str, worker: int, seed: int,
                 fast: bool, lease_for: float) -> None:  # fmt: skip
    """A worker process: claim agents of the pool's runs and run them until the workflow's
    run (``run_id_text``) ends; a second backend follows that run (its cache: no I/O)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator handles Ctrl-C
    # the lost lease is told in the run's log (and by the coordinator), not on the terminal
    # under the live line
    logging.getLogger("luft_redis._sync.lease").disabled = True
    run_id = uuid.UUID(run_id_text)
    parent = os.getppid()
    name = worker_name(worker, os.getpid())
    client = redis.Redis.from_url(url)
    main = RedisCheckpointBackend(client, prefix=prefix)  # follows the workflow's run
    backend = RedisCheckpointBackend(client, prefix=prefix, watch=False)  # claims, writes
    try:
        if main.open_run(run_id) is None:
            raise SystemExit(3)
        idle_since = time.monotonic()
        while True:
            checkpoint = main.get_checkpoint()  # the cache: no I/O
            if checkpoint is None or checkpoint.status is not CheckpointStatus.RUNNING:
                return
            if os.getppid() != parent or time.monotonic() - idle_since > WORKER_IDLE_EXIT:
                return
            lease = backend.claim_agent(name, lease_for=lease_for, timeout=CLAIM_WAIT,
                                        pool=POOL)  # fmt: skip
            if lease is None:
                continue
            job = Job.of(lease.task)
            try:
                with lease:  # heartbeats; an exception hands the agent back as a failure
                    _simulate(backend, lease.run_id, job, lease, seed, fast, worker)
            except Refused as refused:
                # a zombie: our lease was taken over while we were away; nothing was written
                lost = ("; its heartbeat had found the lease lapsed too (lease.lost)"
                        if lease.lost else "")  # fmt: skip
                backend.append_event(Log(
                    run_id=lease.run_id, agent_id=job.agent_id, level=LogLevel.WARN,
                    msg=f"worker {worker} (pid {os.getpid()}): {REFUSED_MARK}: its "
                        f"{refused.what} for agent {job.name} with lease token {lease.token} "
                        f"(current token {refused.error.current}): LeaseLostError, nothing "
                        f"was written{lost}",
                ))  # fmt: skip
            idle_since = time.monotonic()
    finally:
        backend.close()
        main.close()
        time.sleep(3 * LISTENER_POLL_SECONDS)  # let the listener unsubscribe first
        client.close()


# ------------------------------------------------------------------------------ the server


@dataclass
class Target:
    """Where the demo's Redis is, and how it was obtained."""

    url: str
    kind: str  # "given", "redis-server" or "fakeredis"
    workdir: str | None = None  # the private redis-server's data directory


def _redis_error(exc: BaseException, url: str, hint: str = "") -> DemoError | None:
    """The DemoError for ``exc``: exit 3 when it (or its cause) is a refused password or ACL
    permission, exit 2 when Redis cannot be reached or is not Redis; None for any other error."""
    shown = redact_url(url)
    if any(
        isinstance(current, (AccessError, redis.exceptions.AuthenticationError)) or (
            isinstance(current, redis.exceptions.ResponseError)
            and str(current).startswith(("NOAUTH", "WRONGPASS", "NOPERM")))
        for current in exception_chain(exc)
    ):  # fmt: skip
        return DemoError(f"Redis at {shown} refused this client{hint}: {exc}", EXIT_REFUSED)
    failure = server_failure(url, exc)  # unreachable, or not Redis: as every command says
    return None if failure is None else DemoError(str(failure), failure.code)


def _preflight(url: str) -> None:
    """One PING to a given Redis, no retries: DemoError with exit 2 (unreachable, bad URL)
    or 3 (refused), in one line, before any process starts."""
    shown = redact_url(url)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=PREFLIGHT_TIMEOUT,
                                      socket_timeout=PREFLIGHT_TIMEOUT,
                                      retry=Retry(NoBackoff(), 0))  # fmt: skip
    except ValueError as exc:
        raise DemoError(f"bad Redis URL {shown}: {exc}", EXIT_UNREACHABLE) from None
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        error = _redis_error(exc, url, " (check the user and password in the URL, and the ACL)")
        raise error or DemoError(f"Redis at {shown} answered PING with an error: {exc}") from None
    finally:
        client.close()


@contextlib.contextmanager
def _redis_target(args: argparse.Namespace, out: TextIO) -> Iterator[Target]:
    given = args.redis or os.environ.get(URL_ENV)
    if given and (args.redis or not args.fakeredis):
        _preflight(given)
        via = "" if args.redis else f" (from {URL_ENV})"
        print(f"Using the Redis at {redact_url(given)}{via}.", file=out)
        yield Target(given, "given")
        return
    want_fake = args.fakeredis or os.environ.get(FAKEREDIS_ENV, "") not in ("", "0", "false")
    binary = None if want_fake else find_redis_server()
    if binary is not None:
        workdir = tempfile.mkdtemp(prefix="luft-redis-demo-") if args.keep else None
        server = LocalRedisServer(binary=binary, appendonly=True, dir=workdir)
        kept = False
        try:
            server.start()
            fate = ("--keep: it keeps running after the demo, with this directory" if args.keep
                    else "it is stopped at exit (--keep keeps it)")  # fmt: skip
            print(f"Started a private redis-server (pid {server.pid}) on {server.url} in "
                  f"{server.dir} (appendonly yes); {fate}.", file=out)  # fmt: skip
            yield Target(server.url, "redis-server", workdir=str(server.dir))
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
        yield Target(f"redis://127.0.0.1:{port}/0", "fakeredis")
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
        self._console = Console(file=out, highlight=False) if out.isatty() else None
        self.interval = 0.1 if self._console else interval
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._last_line = ""
        self._live: Live | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self, cp: RunCheckpoint, phase: int, alive: int, workers: int) -> str:
        parts = [f"P{p} {sum(_ok(cp, j.agent_id) for j in jobs)}/{len(jobs)}"
                 for p, jobs in enumerate(self.plan)]  # fmt: skip
        return (f"[{self.elapsed():5.1f}s] phase {phase} {self.plan[phase][0].label} | "
                f"agents {' '.join(parts)} | tokens {cp.total_tokens:,} | "
                f"findings {len(cp.findings)} | workers {alive}/{workers} alive")  # fmt: skip

    def _text(self, line: str) -> Text:
        return Text(line, style="bold", no_wrap=True, overflow="ellipsis")

    def update(self, cp: RunCheckpoint, phase: int, alive: int, workers: int,
               force: bool = False) -> None:  # fmt: skip
        now, text = time.monotonic(), self.line(cp, phase, alive, workers)
        if not force and (now - self._last_draw < self.interval or (
                self._console is None and text[9:] == self._last_line[9:])):  # fmt: skip
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
            print(text, file=self.out, flush=True)

    def say(self, message: str) -> None:
        """A message line (above the live line on a terminal)."""
        prefix = f"[{self.elapsed():5.1f}s] " if message and not message.startswith(" ") else ""
        if self._console is not None:
            # printed above the live line, wrapped to the terminal's width
            self._console.print(Text(prefix + message))
        else:
            print(prefix + message, file=self.out, flush=True)

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
class Victim:
    """A worker the demo kills or pauses, and the agent it held then."""

    worker: int
    pid: int
    agent: uuid.UUID
    token: int
    since: float = field(default_factory=time.monotonic)
    heir: str | None = None  # the holder that took the agent over
    woken: bool = False  # SIGCONT sent (the pause)
    refusal: str | None = None  # the worker's report of its refused write (the pause)


class Coordinator:
    def __init__(self, args: argparse.Namespace, target: Target, out: TextIO) -> None:
        self.args = args
        self.target = target
        self.out = out
        self.run_id = uuid.uuid4()
        self.keys = run_keys(PREFIX, self.run_id)
        self.lease_for = LEASE_FAST if args.fast else LEASE_SLOW
        self.kill_phase = min(1, args.phases - 1)
        self.pause_phase = min(2, args.phases - 1)
        self.plan = make_plan(args.seed, args.phases, args.agents)
        self.jobs = {j.agent_id: j for phase in self.plan for j in phase}
        self.others: dict[uuid.UUID, list[Job]] = {  # other users' runs in the pool
            uuid.uuid4(): [dataclasses.replace(j, fail_first=False)
                           for j in make_plan(args.seed + n, 1, args.agents)[0]]
            for n in range(1, args.runs)
        }  # fmt: skip
        self.side: RedisCheckpointBackend | None = None  # writes to the other runs
        self.shares: dict[uuid.UUID, int] = {}  # claims of each other run (verify_others)
        self.client: redis.Redis = redis.Redis.from_url(target.url)
        self.backend = RedisCheckpointBackend(self.client, prefix=PREFIX)
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.killed: Victim | None = None
        self.paused: Victim | None = None
        self.stopped_by: str | None = None
        """The run's status when another process stopped it (``luft-redis cancel``)."""
        self.display = Display(out, self.plan, 0.5 if args.fast else 2.0)
        self.phase_timeout = 60.0 if args.fast else 300.0
        self.events: list[AgentEvent] = []
        self.tasks: list[TaskInfo] = []
        self._tasks_version = -1
        self._log_mark = "0-0"

    # -- helpers -------------------------------------------------------------------------

    def alive(self) -> int:
        return sum(1 for p in self.procs if p.is_alive())

    def cli_url(self) -> str:
        """The URL as printed in a command line: its password masked."""
        return redact_url(self.target.url)

    def read_tasks(self) -> dict[uuid.UUID, TaskInfo]:
        """``agent_tasks()``, read again only when the run's version moved (claims, releases
        and finishes are change notices) or a lease may have lapsed since."""
        version = self.backend.version
        lapse = any(t.state is TaskState.LEASED and not t.lapsed and t.expires_at is not None
                    and t.expires_at <= time.time() for t in self.tasks)  # fmt: skip
        if version != self._tasks_version or lapse:
            self._tasks_version = version
            self.tasks = self.backend.agent_tasks()
        return {t.agent_id: t for t in self.tasks}

    def start_workers(self) -> None:
        ctx = mp.get_context("spawn")
        for i in range(self.args.workers):
            proc = ctx.Process(
                target=_worker_main, name=f"luft-demo-worker-{i + 1}", daemon=True,
                args=(self.target.url, PREFIX, str(self.run_id), i + 1, self.args.seed,
                      self.args.fast, self.lease_for),
            )  # fmt: skip
            proc.start()
            self.procs.append(proc)
        pids = ", ".join(str(p.pid) for p in self.procs)
        self.display.say(f"started {len(self.procs)} worker processes (spawn; pids {pids}); "
                         f"each claims agents with a {self.lease_for:g} s lease")  # fmt: skip

    def stop_workers(self) -> None:
        if self.paused is not None and not self.paused.woken:
            with contextlib.suppress(OSError):
                os.kill(self.paused.pid, signal.SIGCONT)
            self.paused.woken = True
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
        try:  # from here on the run is cleaned up however the demo ends (a closed stdout too)
            self.backend.join_pool(POOL, weight=MAIN_WEIGHT)
            self.display.say(f"run {self.run_id}: {args.phases} phases x {args.agents} agents, "
                             f"{args.workers} workers, seed {args.seed}")  # fmt: skip
            self.start_others()
            self.display.say(f"follow it from another terminal: luft-redis --redis "
                             f"{self.cli_url()} watch {self.run_id}"
                             + self.password_note())  # fmt: skip
            self.backend.append_event(RunStarted(run_id=self.run_id, task="simulated review",
                                                 ts=_now()))  # fmt: skip
            self.start_workers()
            for p, jobs in enumerate(self.plan):
                self.run_phase(p, jobs)
            self.finish_others()
            cp = self.check_running("after its last phase")
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
            return 0
        except BaseException:
            with contextlib.suppress(Exception):
                self.backend.cancel()  # the workers see it and stop
            if self.stopped_by is not None:
                self.print_inspect()  # it is kept where it can be: say how to look at it
            raise
        finally:
            self.display.finish()
            self.stop_workers()
            self.cleanup()

    def password_note(self) -> str:
        if self.cli_url() == self.target.url:
            return ""
        return f" (the password masked as ***: put it back, or set {URL_ENV} and drop --redis)"

    def checkpoint(self) -> RunCheckpoint:
        cp = self.backend.get_checkpoint()
        if cp is None:
            raise DemoError("the coordinator lost its run")
        return cp

    def check_running(self, when: str) -> RunCheckpoint:
        """The run's checkpoint; DemoError when another process stopped it (``luft-redis
        cancel``): the demo stops there, and keeps the run (:attr:`keeps_run`). The status is
        read from Redis: the cache may not have the cancel's notice yet."""
        raw = self.client.hget(self.keys.run, "status")
        status = raw.decode() if isinstance(raw, bytes) else raw
        if status is not None and status != CheckpointStatus.RUNNING.value:
            self.stopped_by = status
            raise DemoError(f"the run was {self.stopped_by} by another process (luft-redis "
                            f"cancel?) {when}; the demo stops here")  # fmt: skip
        return self.checkpoint()

    def start_others(self) -> None:
        """Other users' runs join the pool, each with one phase of agents (weight 1)."""
        if not self.others:
            return
        side = self.side = RedisCheckpointBackend(self.client, prefix=PREFIX, watch=False)
        for n, (run_id, jobs) in enumerate(self.others.items(), 1):
            side.init_run(run_id, f"another user's review ({n})",
                          tempfile.gettempdir() + f"/luft-demo-{run_id}", pool=POOL)  # fmt: skip
            side.append_event(RunStarted(run_id=run_id, task=f"review {n}", ts=_now()))
            side.append_event(PhaseStarted(
                run_id=run_id, phase_id=0, label=jobs[0].label, planned=len(jobs),
                description=f"phase 0: {jobs[0].label}", role=jobs[0].role, ts=_now(),
            ))  # fmt: skip
            side.submit_agents([job.task() for job in jobs])
        self.display.say(
            f"pool {POOL}: {len(self.others) + 1} runs share the workers, this one with weight "
            f"{MAIN_WEIGHT}, {len(self.others)} other users' runs of {self.args.agents} agents "
            "with weight 1 (claim_agent(pool=...); luft-redis pool " + POOL + ")"
        )  # fmt: skip

    def finish_others(self) -> None:
        """Wait for the other runs' agents (served alongside), then complete each run."""
        side = self.side
        if side is None:
            return
        deadline = time.monotonic() + self.phase_timeout
        for run_id, jobs in self.others.items():
            while True:
                cp = side.open_run(run_id)  # (watch=False: read again each time)
                if cp is None:
                    raise DemoError(f"run {run_id} is gone")
                tasks = side.agent_tasks()
                if all(t.state is TaskState.DONE for t in tasks) and all(
                        _ok(cp, j.agent_id) for j in jobs):  # fmt: skip
                    break
                if any(t.state is TaskState.DEAD for t in tasks):
                    raise DemoError(f"run {run_id}: an agent is dead (too many failed attempts)")
                if time.monotonic() > deadline or self.alive() == 0:
                    raise DemoError(f"run {run_id}: its agents did not finish")
                time.sleep(0.1)
            side.append_event(PhaseDone(run_id=run_id, phase_id=0, ok=len(jobs), failed=0,
                                        ts=_now()))  # fmt: skip
            side.append_event(RunDone(run_id=run_id, status=RunStatus.COMPLETED,
                                      total_tokens=TokenUsage(), ts=_now()))  # fmt: skip
        self.display.say(f"the {len(self.others)} other runs of pool {POOL} completed")

    def run_phase(self, p: int, jobs: list[Job]) -> None:
        self.backend.append_event(PhaseStarted(
            run_id=self.run_id, phase_id=p, label=jobs[0].label, planned=len(jobs),
            description=f"phase {p}: {jobs[0].label}", role=jobs[0].role, ts=_now(),
        ))  # fmt: skip
        try:
            self.backend.submit_agents([job.task() for job in jobs])
        except RunNotRunningError:  # stopped since the last phase ended
            self.check_running(f"before phase {p}")
            raise
        self.display.say(f"phase {p} '{jobs[0].label}' (phases 0-{len(self.plan) - 1}): "
                         f"{len(jobs)} agents submitted (submit_agents)")  # fmt: skip
        self.wait_phase(p, jobs)
        cp = self.checkpoint()
        ok = sum(_ok(cp, j.agent_id) for j in jobs)
        failed = len(jobs) - ok
        self.backend.append_event(PhaseDone(run_id=self.run_id, phase_id=p, ok=ok,
                                            failed=failed, ts=_now()))  # fmt: skip
        self.display.update(self.checkpoint(), p, self.alive(), len(self.procs), force=True)
        self.display.say(f"phase {p} done: {ok} ok, {failed} failed")

    def wait_phase(self, p: int, jobs: list[Job]) -> None:
        """Wait until every agent of the phase is finished, from the cache and the task list,
        woken by change notices; kill and pause a worker when due, and tell what follows."""
        deadline = time.monotonic() + self.phase_timeout
        threshold = max(1, len(jobs) // 3)
        while True:
            version = self.backend.version
            cp = self.check_running(f"in phase {p}")
            tasks = self.read_tasks()
            self.display.update(cp, p, self.alive(), len(self.procs))
            self.follow_victims(tasks)
            # finished: its ok agent_done was accepted (its task is done), its ok result stored
            done = sum(1 for j in jobs if (t := tasks.get(j.agent_id)) is not None
                       and t.state is TaskState.DONE and _ok(cp, j.agent_id))  # fmt: skip
            zombie = self.paused is not None and self.paused.refusal is None
            if done == len(jobs) and not zombie:
                return
            dead = [j.name for j in jobs if (t := tasks.get(j.agent_id)) is not None
                    and t.state is TaskState.DEAD]  # fmt: skip
            if dead:
                raise DemoError(f"phase {p}: agents {', '.join(dead)} are dead (too many failed "
                                "attempts)")  # fmt: skip
            due = done >= threshold and not self.args.no_crash
            if due and p >= self.kill_phase and self.killed is None:
                self.kill(tasks)
            if (due and p >= self.pause_phase and self.paused is None
                    and self.killed is not None and self.killed.heir is not None):  # fmt: skip
                self.pause(tasks)
            if self.alive() == 0:
                raise DemoError(f"phase {p}: every worker process has exited")
            if time.monotonic() > deadline:
                raise DemoError(f"phase {p}: {len(jobs) - done} agents still unfinished after "
                                f"{self.phase_timeout:.0f}s")  # fmt: skip
            # woken by the change notices of the workers' writes and claims
            self.backend.wait_for_change(after_version=version, timeout=0.25)

    # -- the crash and the pause ---------------------------------------------------------

    def _freeze(self, tasks: dict[uuid.UUID, TaskInfo], alive: int) -> Victim | None:
        """SIGSTOP the worker holding the newest lease (highest token) on a first attempt whose
        agent_started is written, held by a live worker that is not already a victim: its
        agent is mid-way, far from its commit point (its agent_done). Make sure it is
        mid-agent (its agent still leased with the same token once stopped): the victim, or
        None after a SIGCONT when it finished the agent just before the signal, and when
        fewer than ``alive`` workers are alive."""
        if self.alive() < alive:
            return None
        busy = {v.worker for v in (self.killed, self.paused) if v is not None}
        started = set(self.checkpoint().started_agent_ids)
        candidates = [
            (task, worker) for task in tasks.values()
            if task.state is TaskState.LEASED and not task.lapsed and task.attempt == 1
            and task.agent_id in started and not task.failures
            and (worker := worker_of(task.holder)) is not None and worker not in busy
            and self.procs[worker - 1].is_alive()
        ]  # fmt: skip
        if not candidates:
            return None
        task, worker = max(candidates, key=lambda candidate: candidate[0].token)
        pid = self.procs[worker - 1].pid or 0
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.05)  # a write in flight when the signal came lands first
        now = {t.agent_id: t for t in self.backend.agent_tasks()}.get(task.agent_id)
        if now is None or now.state is not TaskState.LEASED or now.token != task.token:
            os.kill(pid, signal.SIGCONT)  # it finished the agent just before: another time
            return None
        return Victim(worker, pid, task.agent_id, task.token)

    def kill(self, tasks: dict[uuid.UUID, TaskInfo]) -> None:
        """SIGKILL the worker holding the newest lease, mid-agent; nothing else is done
        about it."""
        victim = self.killed = self._freeze(tasks, alive=3)
        if victim is None:
            return
        proc = self.procs[victim.worker - 1]
        proc.kill()  # SIGKILL: no cleanup, no release, no agent_done
        proc.join(timeout=5)
        self.display.say(
            f"CRASH: killed worker {victim.worker} (pid {victim.pid}, SIGKILL) while it ran "
            f"agent {self.jobs[victim.agent].name} (lease token {victim.token}); nobody hands "
            f"the agent back: its lease lapses within {self.lease_for:g} s and the next claim "
            "takes it over. The coordinator does nothing."
        )  # fmt: skip

    def pause(self, tasks: dict[uuid.UUID, TaskInfo]) -> None:
        """SIGSTOP the worker holding the newest lease, mid-agent, until its agent is taken
        over (then :meth:`follow_victims` wakes it)."""
        victim = self.paused = self._freeze(tasks, alive=2)
        if victim is None:
            return
        self.display.say(
            f"PAUSE: stopped worker {victim.worker} (pid {victim.pid}, SIGSTOP) while it ran "
            f"agent {self.jobs[victim.agent].name} (lease token {victim.token}): its heartbeat "
            f"stops, and its {self.lease_for:g} s lease lapses"
        )  # fmt: skip

    def follow_victims(self, tasks: dict[uuid.UUID, TaskInfo]) -> None:
        """Tell the takeovers of the victims' agents, wake the paused worker once its agent
        was taken over, and find its report of the refused write in the run's log."""
        for victim, how in ((self.killed, "killed"), (self.paused, "stopped")):
            if victim is None or victim.heir is not None:
                continue
            task = tasks.get(victim.agent)
            if task is None or task.token == victim.token or task.attempt < 2:
                continue
            victim.heir = task.holder or "?"
            heir = worker_of(task.holder)
            self.display.say(
                f"TAKEOVER: worker {heir} claimed agent {self.jobs[victim.agent].name} "
                f"(attempt {task.attempt}, token {task.token}) after the {how} worker "
                f"{victim.worker}'s lease lapsed, {time.monotonic() - victim.since:.1f} s "
                "after the signal; no one told it to"
            )  # fmt: skip
        paused = self.paused
        if paused is None:
            return
        if paused.heir is not None and not paused.woken:
            os.kill(paused.pid, signal.SIGCONT)
            paused.woken = True
            self.display.say(
                f"RESUME: woke worker {paused.worker} (SIGCONT) after "
                f"{time.monotonic() - paused.since:.1f} s: it carries on with agent "
                f"{self.jobs[paused.agent].name} as if its lease (token {paused.token}) were "
                "still its own"
            )  # fmt: skip
        if paused.woken and paused.refusal is None:
            for entry in self.backend.iter_events(self._log_mark, follow=False):
                self._log_mark = entry.id
                event = entry.event
                if isinstance(event, Log) and REFUSED_MARK in event.msg and (
                        event.agent_id == paused.agent):  # fmt: skip
                    paused.refusal = event.msg
                    self.display.say(f"REFUSED: {event.msg}")
                    break

    # -- the end -------------------------------------------------------------------------

    def verify(self) -> None:
        """Check the invariants; DemoError naming the first that fails."""
        problems: list[str] = []
        with (
            redis.Redis.from_url(self.target.url) as fresh_client,
            RedisCheckpointBackend(fresh_client, prefix=PREFIX, watch=False) as fresh,
        ):
            loaded = fresh.open_run(self.run_id)
            if loaded is None:
                raise DemoError("verify: the run is gone")
            fresh_version = fresh.version
            events = fresh.get_event_log()
            tasks = fresh.agent_tasks()
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
        if {t.agent_id for t in tasks} != planned:
            problems.append(f"agent_tasks lists {len(tasks)} agents, planned {len(planned)}")
        not_done = [t for t in tasks if t.state is not TaskState.DONE]
        if not_done:
            problems.append(f"{len(not_done)} agent tasks not done")
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
            problems.append(f"{len(bad)} agents without exactly one accepted ok agent_done")
        log_tokens = sum(e.tokens.total() for e in done)
        if log_tokens != cp.total_tokens:
            problems.append(f"total_tokens {cp.total_tokens} != {log_tokens}, the sum of the "
                            "log's agent_done tokens")  # fmt: skip
        for summary in cp.completed_phases:
            if (summary.ok, summary.failed) != (len(self.plan[summary.phase_id]), 0):
                problems.append(f"phase {summary.phase_id}: ok={summary.ok} "
                                f"failed={summary.failed}")  # fmt: skip
        for victim in (self.killed, self.paused):
            if victim is None:
                continue
            if any(e.agent_id == victim.agent and isinstance(e.output, dict)
                   and e.output.get("token") == victim.token for e in done):  # fmt: skip
                problems.append(f"worker {victim.worker}'s agent_done with its lost lease "
                                f"(token {victim.token}) is in the log")  # fmt: skip
            if victim.heir is None:
                problems.append(f"worker {victim.worker}'s agent was never taken over")
        if self.paused is not None and self.paused.refusal is None:
            problems.append(f"worker {self.paused.worker}'s late write was not refused")
        problems += self.verify_others()
        if problems:
            raise DemoError("invariants violated: " + "; ".join(problems))
        self.events = events
        self.tasks = tasks
        victims = ("; the killed and the paused workers' agents were taken over and no "
                   "agent_done with their lost leases is in the log"
                   if self.killed is not None or self.paused is not None else "")  # fmt: skip
        self.display.say(f"invariants hold: {len(planned)} agents, each done with exactly one "
                         f"accepted ok agent_done and an ok result{victims}; total_tokens = "
                         "sum of agent_done tokens; the cache equals a fresh open_run")  # fmt: skip

    def verify_others(self) -> list[str]:
        """The other runs of the pool: completed, each agent done once with an ok result."""
        problems: list[str] = []
        with (
            redis.Redis.from_url(self.target.url) as fresh_client,
            RedisCheckpointBackend(fresh_client, prefix=PREFIX, watch=False) as fresh,
        ):
            for run_id, jobs in self.others.items():
                cp = fresh.open_run(run_id)
                if cp is None or cp.status is not CheckpointStatus.COMPLETED:
                    problems.append(f"run {run_id} is {cp and cp.status}, not completed")
                    continue
                done = Counter(e.agent_id for e in fresh.get_event_log()
                               if isinstance(e, AgentDone) and e.status is AgentStatus.OK)
                if any(done[j.agent_id] != 1 for j in jobs) or not all(
                        _ok(cp, j.agent_id) for j in jobs):  # fmt: skip
                    problems.append(f"run {run_id}: not every agent done exactly once, ok")
                self.shares[run_id] = sum(t.attempt for t in fresh.agent_tasks())
        return problems

    def emit(self, *lines: str) -> None:
        """Print lines of the summary (the live line is gone by then)."""
        print(*lines, sep="\n", file=self.out)

    def summary(self) -> None:
        cp = self.checkpoint()
        severities = Counter(f.severity for f in cp.findings)
        by_sev = ", ".join(f"{s} {severities[s]}" for s in sorted(Severity, reverse=True)
                           if severities[s]) or "none"  # fmt: skip
        failed_done = sum(
            1 for e in self.events if isinstance(e, AgentDone) and e.status is not AgentStatus.OK
        )
        refused = sum(1 for e in self.events if isinstance(e, Log) and REFUSED_MARK in e.msg)
        attempts = sum(t.attempt for t in self.tasks)
        takeovers = sum(t.failures for t in self.tasks) - failed_done  # the lapses
        phases = ", ".join(f"{s.phase_id} {s.label} {s.ok}/{s.ok + s.failed} ok"
                           for s in cp.completed_phases)
        ok = sum(1 for r in cp.agent_results.values() if r.status == "ok")
        self.emit(
            "", "Summary", f"  run        {self.run_id}: {cp.status}",
            f"  phases     {len(cp.completed_phases)}: {phases}",
            f"  agents     {ok} run, each with exactly one accepted ok agent_done",
            f"  attempts   {attempts} ({attempts - ok} more than one per agent: {failed_done} "
            f"simulated tool error(s) retried, {takeovers} lapsed lease(s) taken over)",
            f"  takeovers  {takeovers}",
            f"  refused    {refused} zombie write(s) (LeaseLostError: nothing written)",
        )  # fmt: skip
        if self.killed is not None:
            self.emit(f"  crash      worker {self.killed.worker} (pid {self.killed.pid}) killed "
                      f"with SIGKILL mid-agent; its agent {self.jobs[self.killed.agent].name} "
                      f"was taken over by {self.killed.heir}")  # fmt: skip
        if self.paused is not None:
            self.emit(f"  pause      worker {self.paused.worker} (pid {self.paused.pid}) stopped "
                      f"with SIGSTOP past its lease; its agent "
                      f"{self.jobs[self.paused.agent].name} was taken over by "
                      f"{self.paused.heir}; its late write was refused")  # fmt: skip
        if self.killed is None and self.paused is None:
            self.emit("  crash      none (--no-crash)")
        if self.others:
            others = ", ".join(f"{n}" for n in self.shares.values())
            self.emit(f"  pool       {POOL}: {len(self.others) + 1} runs; this one {attempts} "
                      f"claims (weight {MAIN_WEIGHT}), the others {others} (weight 1), all "
                      "completed")  # fmt: skip
        self.emit(f"  tokens     total_tokens {cp.total_tokens:,}",
                  f"  findings   {len(cp.findings)}: {by_sev}",
                  f"  events     {len(self.events)} in the log",
                  f"  time       {self.display.elapsed():.1f} s")  # fmt: skip
        self.print_inspect()

    def print_inspect(self) -> None:
        """How to look at the run after the demo: only commands that will work then."""
        tgt = self.target
        self.emit("")
        if tgt.kind == "fakeredis":
            self.emit("The embedded fakeredis server ends with the demo, and the run with it. "
                      "Put redis-server on PATH (or pass --redis URL) and --keep to inspect it "
                      "afterwards.")  # fmt: skip
            return
        if not self.keeps_run:
            what = ("its keys are deleted" if tgt.kind == "given"
                    else "the private redis-server is stopped")  # fmt: skip
            self.emit(f"The run is gone: {what} at exit. Run the demo with --keep to keep it "
                      "and inspect it afterwards.")  # fmt: skip
            return
        kwargs = redis.Redis.from_url(tgt.url).connection_pool.connection_kwargs
        host, port = str(kwargs.get("host", "127.0.0.1")), int(kwargs.get("port", 6379))
        if tgt.kind == "redis-server":
            self.emit(
                f"--keep: the private redis-server keeps running on {tgt.url}; stop it with: "
                f"redis-cli -p {port} shutdown nosave",
                f"  It leaves its data directory {tgt.workdir} (its appendonly files and log); "
                f"remove it once the server is stopped: rm -r {tgt.workdir}",
            )
        parts = urlsplit(tgt.url)
        cli = (
            "redis-cli"
            + (f" -h {host}" if host not in ("127.0.0.1", "localhost") else "")
            + f" -p {port}"
            + (f" -n {db}" if (db := int(kwargs.get("db", 0) or 0)) else "")
            + (f" --user {parts.username}" if parts.username else "")
            + (" --askpass" if parts.password else "")
        )
        url = self.cli_url()
        self.emit(f"Run id {self.run_id}, kept on {url}{self.password_note()}. Inspect it:")
        for command in (f"show {self.run_id}", f"agents {self.run_id}", f"events {self.run_id}",
                        "runs", f"pool {POOL}"):  # fmt: skip
            self.emit(f"  luft-redis --redis {url} {command}")
        for command in (f'HGETALL "{self.keys.run}"', f'XLEN "{self.keys.events}"',
                        f'XREVRANGE "{self.keys.events}" + - COUNT 5'):  # fmt: skip
            self.emit(f"  {cli} {command}")

    @property
    def keeps_run(self) -> bool:
        """The run stays after the demo: --keep, or another process stopped it on a Redis
        the demo was given (it is theirs to inspect)."""
        return self.args.keep or (self.stopped_by is not None and self.target.kind == "given")

    def cleanup(self) -> None:
        if not self.keeps_run:
            with contextlib.suppress(Exception):
                self.backend.delete_run(self.run_id)  # its keys and its run-index entry
            for run_id in self.others:
                with contextlib.suppress(Exception):
                    self.backend.delete_run(run_id)
        if self.side is not None:
            with contextlib.suppress(Exception):
                self.side.close()
        with contextlib.suppress(Exception):
            self.backend.close()
        # the listener thread unsubscribes within its poll interval; closing the client
        # under it would make it log a lost connection
        time.sleep(3 * LISTENER_POLL_SECONDS)
        with contextlib.suppress(Exception):
            self.client.close()


# ------------------------------------------------------------------------------ entry point


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="luft-redis demo",
        description="A coordinator submits a simulated luft workflow's agents to one Redis "
                    "run, in a pool with other users' runs; W worker processes claim from the "
                    "pool with leases. One worker is killed "
                    "mid-agent and its agent is taken over when its lease lapses; one is "
                    "paused past its lease, and its late write is refused.",
    )  # fmt: skip
    parser.add_argument("--redis", metavar="URL", default=None,
                        help=f"use this Redis (default: env {URL_ENV}, else a private "
                             "redis-server from PATH, else an embedded fakeredis)")  # fmt: skip
    parser.add_argument(
        "--fakeredis",
        action="store_true",
        help=f"use the embedded fakeredis server (also env {FAKEREDIS_ENV}=1)",
    )
    parser.add_argument("--workers", type=_positive, default=4, help="worker processes (4)")
    parser.add_argument("--phases", type=_positive, default=3, help="phases (3)")
    parser.add_argument("--agents", type=_positive, default=8, help="agents per phase (8)")
    parser.add_argument("--runs", type=_positive, default=3,
                        help=f"runs in the pool {POOL}: this workflow's and the others' (3)")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the plan (7)")
    parser.add_argument("--fast", action="store_true", help="short agent durations (tests)")
    parser.add_argument("--no-crash", action="store_true",
                        help="do not kill or pause a worker")  # fmt: skip
    parser.add_argument("--keep", action="store_true",
                        help="keep the run (and the private redis-server, which then keeps "
                             "running, with its data directory) to inspect it after the "
                             "demo")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 on success, 1 on failure, 2 on bad usage or an unreachable Redis, 3
    when Redis refused the client (each with a one-line message on stderr)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if not args.no_crash and args.workers < 3:
        print("luft-redis demo: the crash and the pause need at least 3 workers (or pass "
              "--no-crash)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        with _redis_target(args, sys.stdout) as target:
            try:
                return Coordinator(args, target, sys.stdout).run()
            except Exception as exc:
                error = _redis_error(exc, target.url)
                if error is None:
                    raise
                raise error from exc
    except DemoError as exc:
        print(f"luft-redis demo: FAILED: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `| head`: not a failure; the CLI's main ends quietly
        raise
    except (LuftRedisError, redis.exceptions.RedisError, OSError, RuntimeError) as exc:
        print(f"luft-redis demo: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("luft-redis demo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
