"""What change notices cost the processes bound to a run: 1, 2 and 4 writer processes.

Run from the repository root::

    .venv/bin/python -m benchmarks.fleet                       # pinned and unpinned
    .venv/bin/python -m benchmarks.fleet --tree /work/before   # the same rows for another
                                                                # checkout, in the same run

Every process is a fresh interpreter (``python -c``, with ``PYTHONPATH`` set to the tree
measured), so several checkouts are measured side by side, round by round, on one
redis-server. Per round, for N = 1, 2, 4:

* N writer processes (``watch=True``) append ``agent_done`` events to one run for
  ``--seconds``, and one *watcher* process is bound to the same run (``watch=True``) and only
  listens. Each process reports its CPU time (``time.process_time``: every thread of the
  process), its own writes and the changes it received from the others.
* Baselines measured in the same round: one process sending redis-py ``PING`` (CPU per call),
  and one writer with ``watch=False`` (no listener: the CPU of a write alone).

Reported (medians over the rounds):

* ``changes/s``: the run's changes per second, all writers together.
* ``writer CPU / write``: a writer's CPU time divided by its own writes, less the CPU the
  changes of the others cost it (the watcher's per-change figure): with N = 1, the cost of the
  writer's own write, notice included. ``own notice`` is that figure minus the ``watch=False``
  writer's CPU per write: what receiving (and dropping) its own notice costs a writer.
* ``remote change``: the watcher's CPU per change it received (socket read, parse, queue),
  and the same including the decode of every change into its cache (a ``get_checkpoint`` at
  the end of the round applies what was queued).

``pinned``: redis-server on the first cpu, every client process on the second (see
:mod:`benchmarks.pinning`); ``unpinned``: no affinity set at all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from luft_redis.tools.server import LocalRedisServer, find_redis_server

from .pinning import pin_server, plan_placement

HERE = str(Path(__file__).resolve().parent.parent)

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {}
"""Label -> (checkout, attributes of ``luft_redis._sync.listener`` set in every process)."""

WORKER = r'''
import json, resource, sys, threading, time, uuid
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["tree"])
import redis
import luft_redis
import luft_redis._sync.listener
for name, value in cfg.get("settings", {}).items():
    setattr(luft_redis._sync.listener, name, value)
from luft_redis import RedisCheckpointBackend
from benchmarks.run import make_agent_done
role = cfg["role"]
client = redis.Redis.from_url(cfg["url"])
out = {"role": role, "tree": luft_redis.__file__}
if role == "ping":
    client.ping()
    print("ready", flush=True); sys.stdin.readline()
    cpu0, t0 = time.process_time(), time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < cfg["seconds"]:
        client.ping(); n += 1
    out.update(count=n, cpu=time.process_time() - cpu0, wall=time.perf_counter() - t0)
else:
    backend = RedisCheckpointBackend(client, prefix="fleet", watch=cfg["watch"])
    rid = uuid.UUID(cfg["run"])
    backend.open_run(rid)
    events = [make_agent_done(rid, i) for i in range(4000)]
    if role == "writer":
        backend.append_event(events[0])
    backend.get_checkpoint()
    print("ready", flush=True); sys.stdin.readline()
    clocks = [time.pthread_getcpuclockid(t.ident) for t in threading.enumerate()
              if t.name.startswith("luft-redis-listener") and t.ident]
    def listener_cpu():
        return sum(time.clock_gettime(c) for c in clocks)
    def switches():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_nvcsw + ru.ru_nivcsw
    v0 = backend.version
    l0, s0 = listener_cpu(), switches()
    cpu0, t0 = time.process_time(), time.perf_counter()
    n = 0
    if role == "writer":
        while time.perf_counter() - t0 < cfg["seconds"]:
            n += 1
            if n >= len(events):
                events += [make_agent_done(rid, i) for i in range(len(events), len(events) + 2000)]
            backend.append_event(events[n])
    else:
        while time.perf_counter() - t0 < cfg["seconds"]:
            time.sleep(0.05)
        time.sleep(0.2)  # the writers have stopped: the last notices arrive
    cpu1, t1 = time.process_time(), time.perf_counter()
    out.update(listener_cpu=listener_cpu() - l0, switches=switches() - s0)
    cp = backend.get_checkpoint()  # applies whatever is queued
    cpu2 = time.process_time()
    out.update(count=n, cpu=cpu1 - cpu0, wall=t1 - t0, apply_cpu=cpu2 - cpu1,
               changes=backend.version - v0, results=len(cp.agent_results) if cp else 0,
               fresh=backend.cache_is_fresh)
    backend.close()
client.close()
print(json.dumps(out), flush=True)
'''


def run_procs(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start one interpreter per config, start them together, return their reports."""
    procs = []
    for cfg in configs:
        env = dict(os.environ, PYTHONPATH=cfg["tree"])
        procs.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(cfg)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env, text=True, cwd=cfg["tree"]))  # fmt: skip
    for p in procs:
        line = p.stdout.readline() if p.stdout else ""
        if line.strip() != "ready":
            raise RuntimeError(f"worker failed to start: {line!r}")
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


@dataclass
class Samples:
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(value)

    def med(self, key: str) -> float:
        v = self.values.get(key)
        return statistics.median(v) if v else float("nan")


def one_round(url: str, tree: str, seconds: float, writers: list[int], s: Samples,
              tag: str) -> None:
    tree, settings = VARIANTS[tree]
    base = {"url": url, "tree": tree, "seconds": seconds, "settings": settings}
    (ping,) = run_procs([dict(base, role="ping")])
    s.add(f"{tag} ping_cpu_us", ping["cpu"] / ping["count"] * 1e6)
    run = str(uuid.uuid4())
    _init(url, run, tree)
    (alone,) = run_procs([dict(base, role="writer", watch=False, run=run)])
    s.add(f"{tag} nowatch_cpu_us", alone["cpu"] / alone["count"] * 1e6)
    for n in writers:
        run = str(uuid.uuid4())
        _init(url, run, tree)
        got = run_procs([dict(base, role="writer", watch=True, run=run) for _ in range(n)]
                        + [dict(base, role="watcher", watch=True, run=run)])  # fmt: skip
        ws = [g for g in got if g["role"] == "writer"]
        (watcher,) = [g for g in got if g["role"] == "watcher"]
        total = sum(w["count"] for w in ws)
        wall = statistics.mean(w["wall"] for w in ws)
        remote = watcher["cpu"] / max(1, watcher["changes"]) * 1e6
        s.add(f"{tag} {n} changes_s", total / wall)
        s.add(f"{tag} {n} remote_us", remote)
        s.add(f"{tag} {n} remote_listener_us",
              watcher["listener_cpu"] / max(1, watcher["changes"]) * 1e6)
        s.add(f"{tag} {n} writer_listener_us",
              statistics.mean(w["listener_cpu"] / max(1, w["changes"]) * 1e6 for w in ws))
        s.add(f"{tag} {n} writer_switches",
              statistics.mean(w["switches"] / max(1, w["count"]) for w in ws))
        s.add(f"{tag} {n} remote_apply_us",
              (watcher["cpu"] + watcher["apply_cpu"]) / max(1, watcher["changes"]) * 1e6)
        per = []
        for w in ws:
            others = max(0, w["changes"] - w["count"])
            per.append((w["cpu"] * 1e6 - others * remote) / max(1, w["count"]))
        s.add(f"{tag} {n} writer_us", statistics.mean(per))
        s.add(f"{tag} {n} cpu_per_change_us",
              statistics.mean(w["cpu"] for w in ws) / max(1, total) * 1e6)
        s.add(f"{tag} {n} watcher_missed", float(watcher["changes"] != total + 0))


def _init(url: str, run: str, tree: str) -> None:
    code = (
        "import sys, uuid, redis; sys.path.insert(0, sys.argv[3]);"
        "from luft_redis import RedisCheckpointBackend;"
        "b = RedisCheckpointBackend(redis.Redis.from_url(sys.argv[1]), prefix='fleet',"
        " watch=False);"
        "b.init_run(uuid.UUID(sys.argv[2]), 'review the repository', '/tmp/runs/x'); b.close()"
    )
    subprocess.run([sys.executable, "-c", code, url, run, tree], check=True,
                   env=dict(os.environ, PYTHONPATH=tree), cwd=tree)


def report(s: Samples, trees: list[str], writers: list[int], mode: str) -> list[str]:
    lines = [f"## {mode}", "",
             "| tree | N | changes/s | writer CPU/write µs | own notice µs | remote change µs "
             "(+apply) | CPU/change/process µs | writer's listener thread µs/change | "
             "watcher's listener thread µs/change | writer ctx switches/write | PING CPU µs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for tree in trees:
        tag = f"{mode} {tree}"
        ping = s.med(f"{tag} ping_cpu_us")
        alone = s.med(f"{tag} nowatch_cpu_us")
        for n in writers:
            w = s.med(f"{tag} {n} writer_us")
            own = f"{w - alone:.1f}" if n == 1 else ""
            lines.append(
                f"| {tree} | {n} | {s.med(f'{tag} {n} changes_s'):.0f} | "
                f"{w:.1f} ({w / ping:.2f}x PING) | {own} | "
                f"{s.med(f'{tag} {n} remote_us'):.1f} ({s.med(f'{tag} {n} remote_apply_us'):.1f})"
                f" | {s.med(f'{tag} {n} cpu_per_change_us'):.1f}"
                f" | {s.med(f'{tag} {n} writer_listener_us'):.1f}"
                f" | {s.med(f'{tag} {n} remote_listener_us'):.1f}"
                f" | {s.med(f'{tag} {n} writer_switches'):.2f} | {ping:.1f} |")
        lines.append(f"| {tree} | 1, watch=False | | {alone:.1f} "
                     f"({alone / ping:.2f}x PING) | | | | | | | |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--tree", action="append", default=[],
                        help="another checkout to measure in the same run (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:NAME=JSON",
                        help="this tree again with luft_redis._sync.listener.NAME set to a JSON "
                             "value in every process, e.g. nice19:LISTENER_NICE=19")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", default="1,2,4")
    parser.add_argument("--mode", choices=("pinned", "unpinned", "both"), default="both")
    parser.add_argument("--redis-server", metavar="PATH")
    args = parser.parse_args(argv)
    VARIANTS[Path(HERE).name] = (HERE, {})
    for t in args.tree:
        VARIANTS[Path(t).name] = (str(Path(t).resolve()), {})
    for v in args.variant:
        label, _, rest = v.partition(":")
        settings = {}
        for item in rest.split(","):
            name, _, value = item.partition("=")
            settings[name] = json.loads(value)
        VARIANTS[label] = (HERE, settings)
    trees = list(VARIANTS)
    writers = [int(x) for x in args.writers.split(",")]
    binary = args.redis_server or find_redis_server()
    if binary is None:
        print("redis-server not found", file=sys.stderr)
        return 2
    modes = ["pinned", "unpinned"] if args.mode == "both" else [args.mode]
    s = Samples()
    lines: list[str] = []
    everything = sorted(os.sched_getaffinity(0))
    for mode in modes:
        os.sched_setaffinity(0, everything)
        with LocalRedisServer(binary=binary, appendonly=False) as server:
            if mode == "pinned":
                placement = plan_placement()
                pin_server(placement, server.pid)
                where = placement.describe(server.pid)
            else:
                where = "no affinity set"
            print(f"{mode}: {where}", file=sys.stderr, flush=True)
            client = redis.Redis.from_url(server.url)
            for r in range(args.rounds):
                for tree in trees:
                    t0 = time.perf_counter()
                    one_round(server.url, tree, args.seconds, writers, s, f"{mode} {tree}")
                    print(f"  [{mode} round {r + 1} {tree}: "
                          f"{time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)
                client.flushall()
            client.close()
        lines += [*report(s, trees, writers, mode), ""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
