"""``luft-redis runs`` over 10,000 runs against 10 runs: the run index keeps it flat.

Run from the repository root (not a test; no pass/fail)::

    .venv/bin/python -m benchmarks.runs_index              # 10 and 10,000 runs
    .venv/bin/python -m benchmarks.runs_index --many 2000  # a smaller second prefix
    .venv/bin/python -m benchmarks.runs_index --smoke      # 3 and 30 runs, once: does it run?

A private redis-server (``LocalRedisServer``) gets two prefixes: one with ``--few`` runs and one
with ``--many``, made by ``init_run`` (so through the backend's own index updates); one in three
is finished with a ``run_done``. Then, per prefix, it times:

- ``read_page``: what ``luft-redis runs`` does against Redis (ZCARD, one ZREVRANGEBYSCORE, one
  pipelined page of HMGET + HLEN), ``--limit 10`` so that both prefixes show as many rows,
  median of ``--repeat`` calls
  (the two prefixes in turn);
- ``read_page --status completed``: the same with a status filter (pages until 10 matched);
- the command itself, ``python -m luft_redis runs`` in a subprocess (interpreter start
  included), median of 5;
- for reference, what ``runs`` did before the index: SCAN for the runs, then ``open_run`` on
  each (only for the small prefix and a 500-run sample of the large one, scaled).

It prints each time and the ratio many/few; the index is doing its job when the ratio of
``read_page`` stays near 1 while the run count grows 1,000-fold.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import redis

from luft_redis import RedisCheckpointBackend, RunDone, RunStatus, TokenUsage

try:  # (a tree before the index's reads were written once for both front ends)
    from luft_redis._sync.index import read_page
except ImportError:  # pragma: no cover
    from luft_redis.index import read_page  # type: ignore
from luft_redis.tools.server import LocalRedisServer, find_redis_server


def _make(url: str, prefix: str, count: int) -> None:
    with RedisCheckpointBackend.from_url(url, prefix=prefix, watch=False) as backend:
        for i in range(count):
            run = uuid.uuid4()
            backend.init_run(run, f"benchmark task {i}", f"/tmp/bench/{i}")
            if i % 3 == 0:
                backend.append_event(RunDone(run_id=run, status=RunStatus.COMPLETED,
                                             total_tokens=TokenUsage()))  # fmt: skip


def _alternating(fn: Callable[[str], object], repeat: int) -> tuple[float, float]:
    """Median seconds of ``fn("few")`` and ``fn("many")``, called in turn (the machine's drift
    hits both alike)."""
    times: dict[str, list[float]] = {"few": [], "many": []}
    for _ in range(repeat):
        for prefix in ("few", "many"):
            start = time.perf_counter()
            fn(prefix)
            times[prefix].append(time.perf_counter() - start)
    return statistics.median(times["few"]), statistics.median(times["many"])


def _scan_and_open(url: str, prefix: str, sample: int | None) -> tuple[float, int]:
    """The pre-index way: SCAN, then open_run per run; (seconds, runs opened)."""
    with RedisCheckpointBackend.from_url(url, prefix=prefix, watch=False) as backend:
        start = time.perf_counter()
        runs = backend.list_runs()
        chosen = runs if sample is None else runs[:sample]
        for run in chosen:
            backend.open_run(run)
        return time.perf_counter() - start, len(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks.runs_index", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--few", type=int, default=10)
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--smoke", action="store_true",
                        help="3 and 30 runs, each measure once: that it runs and prints "
                             "its rows (the times mean nothing)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        args.few, args.many, args.repeat = 3, 30, 1
    binary = find_redis_server()
    if binary is None:
        print("redis-server not found on PATH", file=sys.stderr)
        return 2
    with LocalRedisServer(binary=binary) as server:
        url = server.url
        started = time.perf_counter()
        _make(url, "few", args.few)
        _make(url, "many", args.many)
        print(f"made {args.few} + {args.many} runs in {time.perf_counter() - started:.1f} s "
              f"on {url}")  # fmt: skip
        client = redis.Redis.from_url(url)
        results: dict[str, dict[str, float]] = {"few": {}, "many": {}}

        def page(p: str, statuses: tuple[str, ...] = ()) -> None:
            read_page(client, p, limit=10, statuses=statuses)

        def command(p: str) -> None:
            cmd = [sys.executable, "-m", "luft_redis", "--redis", url, "--prefix", p, "runs"]
            subprocess.run([*cmd, "--limit", "10"], capture_output=True, check=True)

        measured: list[tuple[str, Callable[[str], object], int]] = [
            ("read_page --limit 10", page, args.repeat),
            ("read_page --limit 10 --status completed",
             lambda p: page(p, ("completed",)), args.repeat),
            ("luft-redis runs --limit 10 (subprocess)", command, 1 if args.smoke else 5),
        ]  # fmt: skip
        for name, fn, repeat in measured:
            few, many = _alternating(fn, repeat)
            results["few"][name], results["many"][name] = few, many
        for prefix in ("few", "many"):
            sample = None if prefix == "few" else min(500, args.many)
            seconds, total = _scan_and_open(url, prefix, sample)
            opened = total if sample is None else sample
            results[prefix]["before the index: SCAN + open_run each (scaled)"] = (
                seconds * total / opened)  # fmt: skip
        client.close()
    width = max(len(name) for name in results["few"])
    print(f"\n{'':<{width}}  {args.few:>10,} runs  {args.many:>10,} runs   ratio")
    for name in results["few"]:
        few, many = results["few"][name], results["many"][name]
        print(f"{name:<{width}}  {few * 1000:>10.2f} ms  {many * 1000:>10.2f} ms  "
              f"{many / few:>6.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
