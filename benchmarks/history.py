"""Benchmarks of a run's history (issue 29): what ``checkpoint_at`` costs against
``open_run``, and what the history costs in memory.

    python -m benchmarks.history            # full sizes (10,000 events), about a minute
    python -m benchmarks.history --smoke    # tiny sizes (CI)

One private redis-server (no persistence) pinned to one cpu, this process to the other
(``benchmarks.pinning``). Each subject is measured with its baseline in the same run,
interleaved sample by sample, and reported as a ratio:

* ``checkpoint_at`` of a run of N events (one ``append_event`` each: N versions, the most
  entries a history of N events can have), at its last version and at its middle, against
  ``open_run`` of the same run by a new backend;
* MEMORY USAGE of the history against the event log, on the demo's run (``luft-redis demo
  --fast``: 3 phases of 8 agents, leases, a pool, a crash): the bytes each event costs more.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from luft_redis import (
    AgentDone,
    AgentStarted,
    AgentStatus,
    Finding,
    RedisCheckpointBackend,
    Severity,
    TokenUsage,
)
from luft_redis.keys import run_keys
from luft_redis.tools import demo
from luft_redis.tools.server import LocalRedisServer, find_redis_server

from .pinning import pin_server, plan_placement
from .run import Row, header, median, print_table


@dataclass(frozen=True)
class Sizes:
    events: int
    samples: int


FULL = Sizes(events=10_000, samples=15)
SMOKE = Sizes(events=200, samples=3)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _build(client: redis.Redis, events: int) -> tuple[uuid.UUID, int]:
    """A run of ``events`` events, one append_event each (agent_started, then agent_done with
    an output, and a finding every fourth agent); returns its id and last version."""
    backend = RedisCheckpointBackend(client, watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "benchmark", "/runs/bench")
    for i in range(events // 2):
        agent = uuid.uuid4()
        backend.append_event(AgentStarted(run_id=run_id, phase_id=i % 3, agent_id=agent,
                                          prompt_preview=f"agent {i}"))  # fmt: skip
        findings = (Finding(kind="bug", severity=Severity.MEDIUM, title=f"issue {i}",
                            detail="found by the benchmark"),) if i % 4 == 0 else ()  # fmt: skip
        backend.append_event(AgentDone(run_id=run_id, agent_id=agent, status=AgentStatus.OK,
                                       tokens=TokenUsage(input=1200, output=340),
                                       elapsed_ms=5100, output={"summary": f"done {i}"},
                                       findings=findings))  # fmt: skip
    version = backend.version
    backend.close()
    return run_id, version


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def section_checkpoint_at(url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    client = redis.Redis.from_url(url)
    run_id, last = _build(client, sizes.events)
    reader = RedisCheckpointBackend(client, watch=False)

    def open_run() -> None:
        fresh = RedisCheckpointBackend(client, watch=False)
        assert fresh.open_run(run_id) is not None
        fresh.close()

    def at(version: int) -> Callable[[], object]:
        return lambda: reader.checkpoint_at(run_id, at=version)

    assert reader.checkpoint_at(run_id, at=last) == (
        RedisCheckpointBackend(client, watch=False).open_run(run_id))  # fmt: skip
    samples: dict[str, list[float]] = {"open_run": [], "last": [], "middle": []}
    for _ in range(sizes.samples):  # interleaved: a noisy moment hits every subject
        samples["open_run"].append(_timed(open_run))
        samples["last"].append(_timed(at(last)))
        samples["middle"].append(_timed(at(last // 2)))
    raw["checkpoint_at"] = samples
    base = median(samples["open_run"])
    rows = []
    for name, label in (("last", "its last version"), ("middle", "its middle version")):
        value = median(samples[name])
        ratio = value / base
        rows.append(Row(f"checkpoint_at_{name}",
                        f"checkpoint_at, {sizes.events:,} events, {label}", value, "us", base,
                        "us", "open_run of the same run", ratio, "<= 2.0x",
                        _verdict(ratio <= 2.0),
                        f"{last:,} versions, one base (init); p50 of {sizes.samples}"))  # fmt: skip
    reader.close()
    client.flushall()
    client.close()
    return rows


def section_memory(url: str, sizes: Sizes, raw: dict[str, Any]) -> list[Row]:
    """The demo's run: MEMORY USAGE of its history against its event log and all its keys."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = demo.main(["--redis", url, "--fast", "--keep"])
    if code != 0:
        raise RuntimeError(f"the demo failed:\n{out.getvalue()}")
    found = [line for line in out.getvalue().splitlines() if line.startswith("Run id ")]
    run_id = uuid.UUID(found[-1].split()[2].rstrip(","))
    client = redis.Redis.from_url(url)
    keys = run_keys("luft", run_id)
    usage = {name: int(client.memory_usage(key, samples=0) or 0)
             for name, key in zip(keys._fields, keys, strict=True)}  # fmt: skip
    events = int(client.xlen(keys.events))
    versions = int(client.xlen(keys.history))
    raw["memory"] = {"usage": usage, "events": events, "versions": versions}
    history = usage["history"]
    log = usage["events"]
    whole = sum(v for k, v in usage.items() if k != "history")
    client.flushall()
    client.close()
    return [
        Row("history_bytes_per_event", f"history per event of the demo's run ({events} "
            f"events, {versions} versions)", history / events, "B", log / events, "B",
            "the event log per event", history / log, "<= 0.15x", _verdict(history / log <= 0.15),
            f"history {history:,} B, log {log:,} B (MEMORY USAGE SAMPLES 0)"),
        Row("history_against_run", "history against every other key of the demo's run",
            history, "B", whole, "B", "the run's other keys", history / whole, "info", "info",
            ", ".join(f"{k} {v:,}" for k, v in usage.items() if v)),
    ]  # fmt: skip


SECTIONS = ("checkpoint_at", "memory")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history",
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
        head = header(client, binary, None)
        head["placement"] = placement.describe(server.pid)
        client.close()
        print(f"luft-redis history benchmarks ({raw['mode']} mode)")
        for k, v in head.items():
            print(f"  {k}: {v}")
        print(flush=True)
        steps: dict[str, Callable[[], list[Row]]] = {
            "checkpoint_at": lambda: section_checkpoint_at(server.url, sizes, raw),
            "memory": lambda: section_memory(server.url, sizes, raw),
        }
        for name in args.only or SECTIONS:
            t0 = time.perf_counter()
            rows += steps[name]()
            print(f"  [{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
    print()
    print_table(rows)
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.1f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"header": head, "rows": [asdict(r) for r in rows], "raw": raw}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
