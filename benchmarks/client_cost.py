"""Client instructions per write, counted by callgrind: the Python side of ``append_event``.

The client-side twin of :mod:`benchmarks.lua_cost`. Run from the repository root (needs
valgrind: Debian's ``valgrind`` package)::

    .venv/bin/python -m benchmarks.client_cost                 # this tree and 36bc8d6
    .venv/bin/python -m benchmarks.client_cost --before none   # this tree only
    .venv/bin/python -m benchmarks.client_cost --cpu-only      # process CPU time only

For each version (this working tree, and ``--before``, default ``36bc8d6``, from a temporary
git worktree) a worker process (``PYTHONPATH`` = that version's tree) runs under ``valgrind
--tool=callgrind`` against a plain ``redis-server`` (not under valgrind) and runs phases of
``--ops`` calls each; around each phase it zeroes and dumps its own counters
(``callgrind_control``: every thread of the process, so the change listener's thread counts
in the ``watch=True`` rows). An empty phase measures what the zero/dump itself leaves in a
phase, and is subtracted from every row.

Rows (instructions per call):

- ``ping``: redis-py's ``Redis.ping()``, the baseline of the same run;
- ``append_event, watch=False``: the whole call (a new agent's ``agent_done`` with one
  finding and an output, the event of :mod:`benchmarks.compare`);
- ``append_event, watch=True``: the same with the change listener running: the difference
  is the listener's handling of the writer's own notice;
- the steps of the write path, each alone on prepared inputs: ``build + validate`` (the
  script's arguments from the event), ``FCALL send + reply`` (one attempt of the script
  through the connection, as the backend sends it, on another run), ``delta parse`` (the
  reply's header), ``cache apply`` (offering the delta to a cache at the version before);
  ``rest`` is the whole call less those steps (the write lock, retry policy, tracing hook,
  change emission).

Beside the counts, process CPU time per call (``time.process_time``: every thread), of
``--cpu-ops`` calls per phase in a process without valgrind, the server pinned to one cpu and
the worker to the other (:mod:`benchmarks.pinning`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.lua_cost import dump_totals

ROOT = Path(__file__).resolve().parent.parent
BEFORE_REV = "36bc8d6"
RESULT_TAG = "CLIENT-COST "
PHASES = ("empty", "ping", "append", "append_watch", "build", "fcall", "parse", "apply")
STEPS = ("build", "fcall", "parse", "apply")
LABELS = {
    "ping": "PING (redis-py)",
    "append": "append_event, watch=False",
    "append_watch": "append_event, watch=True",
    "build": "  build + validate",
    "fcall": "  FCALL send + reply",
    "parse": "  delta parse",
    "apply": "  cache apply",
    "rest": "  rest (lock, retry, hooks)",
    "listener": "  own notice (watch=True)",
}

# --------------------------------------------------------------------------------------------
# The worker (run as a script: ``import luft_redis`` takes the version on PYTHONPATH)
# --------------------------------------------------------------------------------------------


def _control(action: str, label: str | None = None) -> None:
    """Zero (-z) or dump (-d, with a label) this process's counters; waits until done."""
    cmd = ["callgrind_control", action] + ([label] if label else []) + [str(os.getpid())]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)


def _phases(port: int, ops: int, expect_root: str) -> tuple[Any, dict[str, Callable[[int], Any]],
                                                             Callable[[], None]]:  # fmt: skip
    """The luft_redis module and the calls of every phase (their inputs prepared)."""
    import redis

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    compare: Any = importlib.import_module("compare")
    make_agent_done = compare.make_agent_done
    lr = compare._workload()
    where = Path(lr.__file__).resolve().parent.parent
    if where != Path(expect_root).resolve():
        raise RuntimeError(f"worker imported luft_redis from {where}, not {expect_root}")
    from luft_redis.delta import parse_delta

    client = redis.Redis(port=port, socket_timeout=600)
    plain = lr.RedisCheckpointBackend(client, prefix="cost", watch=False)
    watched = lr.RedisCheckpointBackend(redis.Redis(port=port, socket_timeout=600),
                                        prefix="cost", watch=True)  # fmt: skip
    steps = lr.RedisCheckpointBackend(client, prefix="cost", watch=False)
    reader = lr.RedisCheckpointBackend(client, prefix="cost", watch=False)
    runs = [uuid.uuid4() for _ in range(3)]
    for backend, run_id in zip((plain, watched, steps), runs, strict=True):
        backend.init_run(run_id, "review the repository", f"/tmp/runs/{run_id}")
        for i in range(20):
            backend.append_event(make_agent_done(lr, run_id, 10_000 + i))
    reader.open_run(runs[2])
    plain_events = [make_agent_done(lr, runs[0], i) for i in range(ops)]
    watched_events = [make_agent_done(lr, runs[1], i) for i in range(ops)]
    step_events = [make_agent_done(lr, runs[2], i) for i in range(ops)]
    binding = steps._binding
    fn = steps._scripts.append_events
    built: list[Any] = [None] * ops
    replies: list[Any] = [None] * ops
    deltas: list[Any] = [None] * ops
    cache = reader._binding.cache

    def build(i: int) -> Any:
        built[i] = steps._encoder.events((step_events[i],), binding.run_id)

    lane = getattr(steps, "_lane", None)  # the lean write path, where the version has one
    # the option slots (fence, retention) where the version has them, else its retention arg
    with_options = getattr(steps, "_with_options", None)
    options = (lambda a: with_options(a, "")) if with_options else steps._with_retention

    def fcall(i: int) -> Any:
        steps._op_seq += 1
        full = (steps._writer_id, str(steps._op_seq), *options(built[i]))
        if lane is not None:
            replies[i] = lane.call(fn, binding.key_list, full)
        else:
            replies[i] = steps._fcall(fn, binding.key_list, full)

    def parse(i: int) -> Any:
        deltas[i] = parse_delta(bytes(replies[i]))

    def apply(i: int) -> Any:
        cache.offer(deltas[i])

    calls: dict[str, Callable[[int], Any]] = {
        "empty": lambda i: None,
        "ping": lambda i: client.ping(),
        "append": lambda i: plain.append_event(plain_events[i]),
        "append_watch": lambda i: watched.append_event(watched_events[i]),
        "build": build,
        "fcall": fcall,
        "parse": parse,
        "apply": apply,
    }

    def close() -> None:
        for backend in (plain, watched, steps, reader):
            backend.close()

    return lr, calls, close


def worker_main(port: int, ops: int, expect_root: str, cpu_ops: int) -> int:
    lr, calls, close = _phases(port, max(ops, cpu_ops), expect_root)
    result: dict[str, Any] = {"version": lr.__version__}
    if cpu_ops:  # process CPU time, no valgrind
        cpu: dict[str, float] = {}
        for phase in ("ping", "append", "append_watch"):
            call = calls[phase]
            time.sleep(0.2)
            started = time.process_time()
            for i in range(cpu_ops):
                call(i)
            cpu[phase] = (time.process_time() - started) / cpu_ops
        result["cpu"] = cpu
    else:
        for phase in PHASES:
            call = calls[phase]
            _control("-z")
            for i in range(ops):
                call(i)
            _control("-d", phase)
    close()
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# The parent
# --------------------------------------------------------------------------------------------


def _worker(tree: Path, port: int, ops: int, cpu_ops: int, client_cpu: int | None,
            valgrind_out: Path | None) -> dict[str, Any]:  # fmt: skip
    python = sys.executable  # the venv's python links to the binary (a shim script would not)
    cmd = [python, str(Path(__file__).resolve()), "--worker", "--port", str(port),
           "--ops", str(ops), "--cpu-ops", str(cpu_ops), "--expect-root", str(tree)]  # fmt: skip
    if valgrind_out is not None:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={valgrind_out}", *cmd]
    if client_cpu is not None:
        cmd = ["taskset", "-c", str(client_cpu), *cmd]
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")  # steadier counts
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"worker for {tree} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT_TAG):])
    return result


def measure(tree: Path, port: int, ops: int, cpu_ops: int, client_cpu: int | None,
            count: bool) -> dict[str, float]:  # fmt: skip
    """Instructions per call of each phase (and rest/listener), and CPU µs per call."""
    out: dict[str, float] = {}
    if count:
        with tempfile.TemporaryDirectory(prefix="luft-client-cost-") as tmp:
            _worker(tree, port, ops, 0, client_cpu, Path(tmp) / "cg.out")
            totals = dump_totals(Path(tmp), PHASES)
        missing = [p for p in PHASES if p not in totals]
        if missing:
            raise RuntimeError(f"no callgrind dump for {', '.join(missing)}")
        empty = totals["empty"]
        for phase in PHASES[1:]:
            out[phase] = (totals[phase] - empty) / ops
        out["rest"] = out["append"] - sum(out[s] for s in STEPS)
        out["listener"] = out["append_watch"] - out["append"]
    if cpu_ops:
        cpu = _worker(tree, port, 0, cpu_ops, client_cpu, None)["cpu"]
        for phase, seconds in cpu.items():
            out["cpu_" + phase] = seconds * 1e6
    return out


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def _report(results: dict[str, dict[str, float]]) -> None:
    sides = [s for s in ("before", "after") if s in results]
    counted = "ping" in results[sides[0]]
    if counted:
        header = f"{'instructions per call':<30}" + "".join(
            f"{s:>12}{s + '/PING':>13}" for s in sides)  # fmt: skip
        if len(sides) == 2:
            header += f"{'after/before':>14}"
        print(header)
        print("-" * len(header))
        for row in ("ping", "append", "append_watch", *STEPS, "rest", "listener"):
            line = f"{LABELS[row]:<30}"
            for side in sides:
                value = results[side][row]
                line += f"{value:>12,.0f}{value / results[side]['ping']:>12.2f}x"
            if len(sides) == 2 and results["before"][row] > 0:
                line += f"{results['after'][row] / results['before'][row]:>13.2f}x"
            print(line)
        print()
    if "cpu_ping" in results[sides[0]]:
        header = f"{'process CPU per call (pinned)':<30}" + "".join(
            f"{s + ' (us)':>12}{s + '/PING':>13}" for s in sides)  # fmt: skip
        print(header)
        print("-" * len(header))
        for row in ("ping", "append", "append_watch"):
            line = f"{LABELS[row]:<30}"
            for side in sides:
                value = results[side]["cpu_" + row]
                line += f"{value:>12.1f}{value / results[side]['cpu_ping']:>12.2f}x"
            print(line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.client_cost",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--ops", type=int, default=300, help="calls per phase (default 300)")
    parser.add_argument("--cpu-ops", type=int, default=3000,
                        help="calls per phase of the CPU-time rows (default 3000; 0: none)")
    parser.add_argument("--cpu-only", action="store_true", help="no callgrind rows")
    parser.add_argument("--before", default=BEFORE_REV,
                        help=f"git revision to compare with (default {BEFORE_REV}; 'none': skip)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--expect-root", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.port, args.ops, args.expect_root, args.cpu_ops)

    count = not args.cpu_only
    if count and (shutil.which("valgrind") is None or shutil.which("callgrind_control") is None):
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from luft_redis.tools.server import LocalRedisServer, find_redis_server

    from .pinning import pin_server, plan_placement

    binary = find_redis_server()
    if binary is None:
        print("redis-server not found", file=sys.stderr)
        return 2
    placement = plan_placement()
    head = _git("rev-parse", "--short", "HEAD").stdout.strip() or "?"
    print(f"client instructions per call (valgrind --tool=callgrind), {args.ops} calls per "
          f"phase; process CPU time of {args.cpu_ops} calls per phase")  # fmt: skip
    started = time.monotonic()
    results: dict[str, dict[str, float]] = {}
    with LocalRedisServer(binary=binary, appendonly=False) as server:
        pin_server(placement, server.pid)
        print(f"  placement: {placement.describe(server.pid)}")
        port, cpu = server.port, placement.client_cpu
        results["after"] = measure(ROOT, port, args.ops, args.cpu_ops, cpu, count)
        print(f"  after: working tree at {head}")
        if args.before.lower() != "none":
            with tempfile.TemporaryDirectory(prefix="luft-client-cost-before-") as scratch:
                tree = Path(scratch) / "luft-before"
                added = _git("worktree", "add", "--detach", str(tree), args.before)
                if added.returncode != 0:
                    print(f"git worktree add {args.before} failed: {added.stderr.strip()}",
                          file=sys.stderr)  # fmt: skip
                    return 2
                try:
                    results["before"] = measure(tree, port, args.ops, args.cpu_ops, cpu, count)
                finally:
                    _git("worktree", "remove", "--force", str(tree))
                    _git("worktree", "prune")
            print(f"  before: {args.before}")
    print()
    _report(results)
    print(f"\nin {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
