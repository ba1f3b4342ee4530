"""Server instructions per write, counted by callgrind: the cost of the Lua functions, exactly.

Run from the repository root (needs valgrind: Debian's ``valgrind`` package)::

    .venv/bin/python -m benchmarks.lua_cost                  # this tree and 9103c9c, 300 ops
    .venv/bin/python -m benchmarks.lua_cost --before none    # this tree only
    .venv/bin/python -m benchmarks.lua_cost --ops 50         # smaller

Timings of the server's scripts on this shared 2-cpu machine swing by 30% from run to run; an
instruction count does not. For each version (this working tree, and ``--before``, default
``9103c9c``, the library before the coherence rebuild, from a temporary git worktree) a
private ``redis-server`` runs under ``valgrind --tool=callgrind`` (no persistence), and a worker
process (``PYTHONPATH`` = that version's tree, ``watch=False`` so nothing but the measured
commands reaches the server) makes a run, warms up (the library is loaded, 20 appends), then
runs three phases of ``--ops`` calls each: ``PING`` (the baseline of the same run), an
``append_event`` of an ``agent_done`` with one finding and an output, and an
``upsert_agent_result`` with one finding (the events of ``benchmarks.compare``). Around each
phase it zeroes and dumps callgrind's counters (``callgrind_control``), so each dump holds the
instructions the server executed for that phase alone: network handling, command dispatch,
the Lua interpreter and the Redis commands the functions call. A version with agent leases
also runs the lease phases: a ``claim_agent``, the unleased agent cycle (``agent_started``,
``agent_done``, result) and the leased one (a claim, then those three writes fenced), whose
ratio is the server's share of ``benchmarks.leases``' "leased vs unleased cycle" row. A version
with pools also runs ``pool_claim``: a claim from a pool of ``--ops`` runs, one agent each.

Rows: instructions per call of each phase, and the ratio to a PING of the same run; with
``--before``, the ratio after/before of each write. Counts vary by well under 1% between runs
(hash seeds, random UUIDs); the binary counts too, so compare versions on one server binary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEFORE_REV = "9103c9c"
RESULT_TAG = "LUA-COST "
PHASES = ("ping", "append", "upsert")
#: Phases of the agent leases (docs/leases.md), measured when the version has them: a
#: ``claim_agent``; the unleased agent cycle (``agent_started``, ``agent_done``, result); the
#: leased cycle (claim, then the same three writes fenced by the lease).
LEASE_PHASES = ("claim", "cycle", "leased_cycle")
#: The pools' phase (docs/pools.md), measured when the version has pools: a claim from a pool
#: of ``--ops`` runs with one ready agent each (the pick in the pool's slot, amortized over
#: the picks a backend batches, plus the claim in the run's slot).
POOL_PHASES = ("pool_claim",)

# --------------------------------------------------------------------------------------------
# The worker (run as a script: ``import luft_redis`` takes the version on PYTHONPATH)
# --------------------------------------------------------------------------------------------


def worker_main(port: int, pid: int, ops: int, expect_root: str) -> int:
    import redis

    # benchmarks/compare.py, imported from this file's folder (the version's tree on
    # PYTHONPATH may have an older benchmarks package, or none)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    compare: Any = importlib.import_module("compare")
    make_agent_done, make_result = compare.make_agent_done, compare.make_result

    lr = compare._workload()
    where = Path(lr.__file__).resolve().parent.parent
    if where != Path(expect_root).resolve():
        print(f"worker imported luft_redis from {where}, not {expect_root}", file=sys.stderr)
        return 3
    client = redis.Redis(port=port, socket_timeout=600)
    backend = lr.RedisCheckpointBackend(client, prefix="cost", watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "review the repository", f"/tmp/runs/{run_id}")
    for i in range(20):
        backend.append_event(make_agent_done(lr, run_id, 10_000 + i))
    appends = [make_agent_done(lr, run_id, i) for i in range(ops)]
    upserts = [make_result(lr, i) for i in range(ops)]
    calls: dict[str, Any] = {
        "ping": lambda i: client.ping(),
        "append": lambda i: backend.append_event(appends[i]),
        "upsert": lambda i: backend.upsert_agent_result(upserts[i]),
    }
    phases = list(PHASES)
    if hasattr(backend, "claim_agent"):
        phases += LEASE_PHASES
        calls.update(_lease_calls(lr, backend, run_id, ops))
    if hasattr(backend, "join_pool"):
        phases += POOL_PHASES
        planner = lr.RedisCheckpointBackend(client, prefix="cost", watch=False)
        for _ in range(ops + 20):
            planner.init_run(uuid.uuid4(), "pool cost", "/tmp/runs/pool", pool="cost")
            planner.submit_agents([lr.AgentTask(uuid.uuid4(), 0, {"prompt": "agent"})])
        pooled = lr.RedisCheckpointBackend(client, prefix="cost", watch=False)
        for _ in range(20):
            pooled.claim_agent("cost", pool="cost", lease_for=600.0)  # warm-up
        calls["pool_claim"] = lambda i: pooled.claim_agent("cost", pool="cost", lease_for=600.0)
    for phase in phases:
        _control("-z", pid)
        for i in range(ops):
            calls[phase](i)
        _control("-d", pid, phase)
    backend.close()
    client.close()
    print(RESULT_TAG + json.dumps({"version": lr.__version__, "root": str(where)}), flush=True)
    return 0


def _lease_calls(lr: Any, backend: Any, run_id: uuid.UUID, ops: int) -> dict[str, Any]:
    """The lease phases' calls: 2 * ops tasks submitted up front (one per claim)."""
    tasks = [lr.AgentTask(uuid.uuid4(), 0, {"prompt": f"agent {i}"}) for i in range(2 * ops)]
    backend.submit_agents(tasks)

    # the events and result of benchmarks.leases (its _started, _done and _result), so that
    # the cycles here are its cycles
    def started(agent: uuid.UUID) -> Any:
        return lr.AgentStarted(run_id=run_id, phase_id=0, agent_id=agent, prompt_preview="bench")

    def done(agent: uuid.UUID) -> Any:
        return lr.AgentDone(run_id=run_id, agent_id=agent, status=lr.AgentStatus.OK,
                            tokens=lr.TokenUsage(input=10, output=5), elapsed_ms=1)  # fmt: skip

    def result(agent: uuid.UUID) -> Any:
        return lr.AgentResultCache(agent_id=agent, phase_id=0, status="ok", tokens=15,
                                   completed_at=1_700_000_000, output={"ok": True},
                                   findings=())  # fmt: skip

    def cycle(i: int) -> None:
        agent = uuid.uuid4()
        backend.append_event(started(agent))
        backend.append_event(done(agent))
        backend.upsert_agent_result(result(agent))

    def leased_cycle(i: int) -> None:
        lease = backend.claim_agent("cost", lease_for=600.0)
        backend.append_event(started(lease.agent_id), lease=lease)
        backend.append_event(done(lease.agent_id), lease=lease)
        backend.upsert_agent_result(result(lease.agent_id), lease=lease)

    return {"claim": lambda i: backend.claim_agent("cost", lease_for=600.0),
            "cycle": cycle, "leased_cycle": leased_cycle}


def _control(action: str, pid: int, label: str | None = None) -> None:
    """Zero (-z) or dump (-d, with a label) the server's counters; waits until done."""
    cmd = ["callgrind_control", action] + ([label] if label else []) + [str(pid)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)


# --------------------------------------------------------------------------------------------
# The parent: one server under callgrind per version
# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ping(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    import redis

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server under valgrind exited with {proc.returncode}")
        try:
            if redis.Redis(port=port, socket_timeout=5).ping():
                return
        except redis.exceptions.RedisError:
            time.sleep(0.2)
    raise RuntimeError(f"redis-server under valgrind did not answer within {timeout:.0f} s")


def dump_totals(folder: Path, phases: Collection[str] = PHASES) -> dict[str, int]:
    """The instruction count of each labelled dump of ``phases`` in ``folder`` (``desc:
    Trigger: dump <label>`` names the phase; ``summary:`` holds the count of the dump); also
    :mod:`benchmarks.client_cost`'s."""
    totals: dict[str, int] = {}
    for path in folder.glob("cg.out*"):
        label, total = None, None
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("desc: Trigger:"):
                label = line.split()[-1]
            elif line.startswith("summary:") and total is None:
                total = int(line.split()[1])
        if label is not None and label in phases and total is not None:
            totals[label] = total
    return totals


def measure(tree: Path, ops: int, binary: str) -> dict[str, float]:
    """Instructions per call of each phase for the library in ``tree``."""
    with tempfile.TemporaryDirectory(prefix="luft-lua-cost-") as tmp:
        folder = Path(tmp)
        port = _free_port()
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.out",
             binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_ping(port, server, 120)
            env = dict(os.environ, PYTHONPATH=str(tree))
            worker = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--worker", "--port", str(port),
                 "--pid", str(server.pid), "--ops", str(ops), "--expect-root", str(tree)],
                env=env, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            if worker.returncode != 0 or RESULT_TAG not in worker.stdout:
                raise RuntimeError(f"worker for {tree} failed:\n{worker.stderr[-2000:]}")
        finally:
            server.terminate()
            try:
                server.wait(120)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        totals = dump_totals(folder, PHASES + LEASE_PHASES + POOL_PHASES)
    missing = [p for p in PHASES if p not in totals]
    if missing:
        raise RuntimeError(f"no callgrind dump for {', '.join(missing)}")
    return {phase: count / ops for phase, count in totals.items()}


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lua_cost",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--ops", type=int, default=300, help="calls per phase (default 300)")
    parser.add_argument("--before", default=BEFORE_REV,
                        help=f"git revision to compare with (default {BEFORE_REV}; 'none': skip)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--expect-root", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.port, args.pid, args.ops, args.expect_root)

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from luft_redis.tools.server import find_redis_server

    binary = find_redis_server()
    if binary is None:
        print("redis-server not found", file=sys.stderr)
        return 2
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    head = _git("rev-parse", "--short", "HEAD").stdout.strip() or "?"
    print("server instructions per call (valgrind --tool=callgrind), "
          f"{args.ops} calls per phase")  # fmt: skip
    print(f"  server: {binary}: {version.strip()}")
    results: dict[str, dict[str, float]] = {}
    started = time.monotonic()
    results["after"] = measure(ROOT, args.ops, binary)
    print(f"  after: working tree at {head}")
    if args.before.lower() != "none":
        with tempfile.TemporaryDirectory(prefix="luft-lua-cost-before-") as scratch:
            tree = Path(scratch) / "luft-before"
            added = _git("worktree", "add", "--detach", str(tree), args.before)
            if added.returncode != 0:
                print(f"git worktree add {args.before} failed: {added.stderr.strip()}",
                      file=sys.stderr)  # fmt: skip
                return 2
            try:
                results["before"] = measure(tree, args.ops, binary)
            finally:
                _git("worktree", "remove", "--force", str(tree))
                _git("worktree", "prune")
        print(f"  before: {args.before}")
    print()
    sides = [s for s in ("before", "after") if s in results]
    header = f"{'per call':<26}" + "".join(f"{s + ' (instr)':>16}{s + '/PING':>14}" for s in sides)
    if len(sides) == 2:
        header += f"{'after/before':>14}"
    print(header)
    print("-" * len(header))
    shown = [p for p in PHASES + LEASE_PHASES + POOL_PHASES
             if any(p in results[side] for side in sides)]  # fmt: skip
    for phase in shown:
        line = f"{phase:<26}"
        for side in sides:
            value = results[side].get(phase)
            line += (f"{'-':>16}{'-':>14}" if value is None else
                     f"{value:>16,.0f}{value / results[side]['ping']:>13.2f}x")  # fmt: skip
        if len(sides) == 2:
            pair = [results[side].get(phase) for side in sides]
            line += f"{pair[1] / pair[0]:>13.2f}x" if pair[0] and pair[1] else f"{'-':>14}"
        print(line)
    for side in sides:
        if "leased_cycle" in results[side]:
            ratio = results[side]["leased_cycle"] / results[side]["cycle"]
            print(f"{side}: leased cycle / unleased cycle {ratio:.2f}x")
        if "pool_claim" in results[side]:
            ratio = results[side]["pool_claim"] / results[side]["claim"]
            print(f"{side}: claim from a pool / bound claim {ratio:.2f}x")
    print(f"\n{len(shown)} phases x {len(sides)} versions in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
