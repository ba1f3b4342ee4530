"""``luft-redis web``: how fast a write reaches a page, fan-out to 50 streams, the runs page.

Run from the repository root (needs the ``web`` extra; not a test; no pass/fail)::

    .venv/bin/python -m benchmarks.web            # the full rows
    .venv/bin/python -m benchmarks.web --smoke    # tiny sizes, once: does it run?

A private redis-server (``LocalRedisServer``) and ``luft-redis web`` as a subprocess (so its
CPU time can be read from ``/proc/<pid>/stat``). The event-stream clients are plain asyncio
HTTP readers in this process (not browsers); the writers are separate processes.

Rows:

- **write -> page update**: one client on a run's ``/api/runs/{id}/events``; a writer appends
  an event every 50 ms; the latency is from the return of ``append_event`` to the arrival of
  the first ``state`` message whose ``view.version`` includes it (p50, p99).
- **fan-out**: 1, then 50 clients on one run while 4 writer processes make 25 changes/s each
  for ``--seconds``; per setting: the web server's CPU time per change, and for every (change,
  client) pair the time until that client held a state including the change (coalesced
  states count: p50, p99, and the share of pairs never delivered). The issue's bar: CPU per
  change with 50 clients within 2x of one client's, each client every change within 250 ms
  p99.
- **a large run**: a fresh server opens a small run and one of ``--agents`` agents and
  ``--events`` events: the run page's HTML, the time from that request to the first state on
  the event stream (what the page's script waits for; it binds the run; the agents are paged,
  so the state stays small) and the time until the hub has read the whole log for its
  aggregates (the page is usable before).
- **runs page**: ``GET /`` (the server-rendered runs page, first page of 50) and ``GET
  /api/runs``, median of ``--repeat``, with 100 runs and with 10,000 runs under the prefix
  (the issue's bar: 10,000 within 2x of 100).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import redis

from luft_redis import RedisCheckpointBackend
from luft_redis import types as t
from luft_redis.tools.server import LocalRedisServer, find_redis_server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_web(url: str, prefix: str) -> tuple[subprocess.Popen[str], int]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "luft_redis", "web", "--redis", url,
                             "--prefix", prefix, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "open http" not in line:
        proc.kill()
        raise SystemExit(f"luft-redis web did not start: {line}{proc.stdout.read()}")
    return proc, port


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------------ an SSE reader


async def _stream(port: int, run_id: uuid.UUID, seen: list[tuple[float, int]],
                  ready: asyncio.Event, stop: asyncio.Event) -> None:  # fmt: skip
    """Read the run's event stream; append (arrival time, version) for each state."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /api/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 "Accept: text/event-stream\r\n\r\n".encode())  # fmt: skip
    await writer.drain()
    kind = ""
    closer = asyncio.create_task(stop.wait())
    closer.add_done_callback(lambda _: writer.close())  # ends the reads below
    try:
        while not stop.is_set():
            try:
                line = await reader.readline()
            except (ConnectionError, OSError):
                return
            if not line:
                return
            text = line.decode().rstrip("\r\n")
            if text.startswith("event: "):
                kind = text[7:]
            elif text.startswith("data: ") and kind == "state":
                now = time.time()
                version = int(json.loads(text[6:])["view"]["version"])
                seen.append((now, version))
                ready.set()
    finally:
        closer.cancel()
        writer.close()


# ------------------------------------------------------------------------ writers


def _writer(url: str, prefix: str, run_text: str, rate: float, seconds: float,
            out: Any) -> None:  # fmt: skip
    """A writer process: append a log event at ``rate``/s; send (time, version) pairs."""
    run_id = uuid.UUID(run_text)
    client = redis.Redis.from_url(url)
    backend = RedisCheckpointBackend(client, prefix=prefix, watch=False)
    backend.open_run(run_id)
    marks: list[tuple[float, int]] = []
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        backend.append_event(t.Log(run_id=run_id, level=t.LogLevel.INFO, msg=f"tick {n}"))
        marks.append((time.time(), backend.version))
        n += 1
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    backend.close()
    client.close()
    out.put(marks)


def _new_run(url: str, prefix: str, task: str) -> uuid.UUID:
    with RedisCheckpointBackend.from_url(url, prefix=prefix, watch=False) as backend:
        run_id = uuid.uuid4()
        backend.init_run(run_id, task, "/tmp/bench-web")
        return run_id


# ------------------------------------------------------------------------ rows


async def _latency(url: str, port: int, writes: int) -> list[float]:
    run_id = _new_run(url, "lat", "latency")
    seen: list[tuple[float, int]] = []
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(_stream(port, run_id, seen, ready, stop))
    await asyncio.wait_for(ready.wait(), 10)
    marks: list[tuple[float, int]] = []
    with RedisCheckpointBackend.from_url(url, prefix="lat", watch=False) as backend:
        backend.open_run(run_id)
        for i in range(writes):
            await asyncio.to_thread(backend.append_event,
                                    t.Log(run_id=run_id, level=t.LogLevel.INFO, msg=f"w{i}"))
            marks.append((time.time(), backend.version))
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    stop.set()
    await task
    return _deliveries(marks, [seen])[0]


def _deliveries(marks: list[tuple[float, int]], clients: list[list[tuple[float, int]]]
                ) -> tuple[list[float], int]:  # fmt: skip
    """Per (write, client): seconds until the client held a state including the write; and
    how many pairs were never delivered."""
    latencies: list[float] = []
    missed = 0
    for seen in clients:
        for written_at, version in marks:
            arrival = next((at for at, v in seen if v >= version), None)
            if arrival is None:
                missed += 1
            else:
                latencies.append(max(0.0, arrival - written_at))
    return latencies, missed


async def _fanout(url: str, port: int, pid: int, clients: int, writers: int, rate: float,
                  seconds: float) -> dict[str, float]:  # fmt: skip
    run_id = _new_run(url, "fan", f"fan-out to {clients}")
    seen: list[list[tuple[float, int]]] = [[] for _ in range(clients)]
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in range(clients)]
    tasks = [asyncio.create_task(_stream(port, run_id, seen[i], readies[i], stop))
             for i in range(clients)]  # fmt: skip
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 30)
    await asyncio.sleep(0.5)
    ctx = multiprocessing.get_context("spawn")
    queue: Any = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, "fan", str(run_id), rate, seconds, queue))
             for _ in range(writers)]  # fmt: skip
    for proc in procs:
        proc.start()
    cpu_before = _cpu_seconds(pid)
    marks: list[tuple[float, int]] = []
    for _ in procs:
        marks.extend(await asyncio.to_thread(queue.get, True, seconds + 60))
    cpu_after = _cpu_seconds(pid)
    for proc in procs:
        await asyncio.to_thread(proc.join)
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*tasks)
    latencies, missed = _deliveries(marks, seen)
    return {"changes": len(marks), "cpu_ms_per_change": (cpu_after - cpu_before) * 1000
            / max(1, len(marks)), "p50_ms": _pct(latencies, 0.5) * 1000,
            "p99_ms": _pct(latencies, 0.99) * 1000,
            "missed": missed / max(1, len(marks) * clients)}  # fmt: skip


def _make_runs(url: str, prefix: str, count: int) -> None:
    with RedisCheckpointBackend.from_url(url, prefix=prefix, watch=False) as backend:
        for i in range(count):
            run = uuid.uuid4()
            backend.init_run(run, f"benchmark task {i}", "/tmp/bench-web")
            if i % 3 == 0:
                backend.cancel()


def _make_big_run(url: str, prefix: str, agents: int, events: int) -> uuid.UUID:
    """A run with ``agents`` finished agents (started, done, result) and ``events`` events."""
    with RedisCheckpointBackend.from_url(url, prefix=prefix, watch=False) as backend:
        run_id = uuid.uuid4()
        backend.init_run(run_id, f"a run of {agents} agents", "/tmp/bench-web")
        backend.append_event(t.PhaseStarted(run_id=run_id, phase_id=1, label="all",
                                            planned=agents))  # fmt: skip
        batch: list[t.AgentEvent] = []
        written = 1
        usage = t.TokenUsage(input=1000, output=100)
        for i in range(agents):
            agent = uuid.uuid4()
            batch.append(t.AgentStarted(run_id=run_id, phase_id=1, agent_id=agent,
                                        prompt_preview="p", model="m", name=f"a{i}"))
            batch.append(t.AgentDone(run_id=run_id, agent_id=agent, status=t.AgentStatus.OK,
                                     tokens=usage, elapsed_ms=1000, name=f"a{i}"))
            backend.upsert_agent_result(t.AgentResultCache(
                agent_id=agent, phase_id=1, status="ok", output=None, findings=(),
                tokens=usage.total(), completed_at=int(time.time())))  # fmt: skip
            if len(batch) >= 500:
                backend.append_events(batch)
                written += len(batch)
                batch = []
        while written + len(batch) < events:
            batch.append(t.Log(run_id=run_id, level=t.LogLevel.INFO, msg=f"log {written}"))
            if len(batch) >= 500:
                backend.append_events(batch)
                written += len(batch)
                batch = []
        if batch:
            backend.append_events(batch)
        return run_id


def _open_run(url: str, prefix: str, run_id: uuid.UUID) -> tuple[float, float, int, float]:
    """On a fresh server: (seconds to the run page's HTML, from the page request to the first
    state on the event stream, the state's size in bytes, seconds until the hub has read the
    whole log)."""
    proc, port = _start_web(url, prefix)
    try:
        start = time.perf_counter()
        page = _get(port, f"/runs/{run_id}")
        # then what the page's script does: open the event stream, wait for the first state
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", f"/api/runs/{run_id}/events",
                     headers={"Host": f"127.0.0.1:{port}"})  # fmt: skip
        response = conn.getresponse()
        body = b""
        while True:
            line = response.fp.readline()
            if line.startswith(b"data: ") and b'"view"' in line:
                body = line[6:].strip()
                break
        state = time.perf_counter() - start
        conn.close()
        began = time.perf_counter()
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", f"/api/runs/{run_id}", headers={"Host": f"127.0.0.1:{port}"})
            view = json.loads(conn.getresponse().read())["view"]
            conn.close()
            if view["log_complete"] or time.perf_counter() - began > 120:
                break
            time.sleep(0.05)
        return page, state, len(body), time.perf_counter() - began
    finally:
        proc.terminate()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _get(port: int, path: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start = time.perf_counter()
    conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
    response = conn.getresponse()
    response.read()
    elapsed = time.perf_counter() - start
    conn.close()
    if response.status != 200:
        raise SystemExit(f"GET {path}: {response.status}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.web", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=200, help="latency row: writes (200)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=25.0, help="changes/s per writer (25)")
    parser.add_argument("--seconds", type=float, default=10.0, help="fan-out duration (10)")
    parser.add_argument("--few", type=int, default=100)
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--agents", type=int, default=10_000, help="large run (10,000)")
    parser.add_argument("--events", type=int, default=100_000, help="large run (100,000)")
    parser.add_argument("--runs-only", action="store_true",
                        help="only the runs page rows (100 and --many runs)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, once: that it runs and prints its rows")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        args.writes, args.clients, args.seconds = 5, 3, 1.0
        args.few, args.many, args.repeat = 3, 30, 1
        args.agents, args.events = 20, 100
    binary = find_redis_server()
    if binary is None:
        print("redis-server not found on PATH", file=sys.stderr)
        return 2
    rows: list[str] = []
    with LocalRedisServer(binary=binary) as server:
        url = server.url
        if not args.runs_only:
            _live_rows(url, args, rows)
        _runs_rows(url, args, rows)
    print()
    for row in rows:
        print(row)
    return 0


def _live_rows(url: str, args: argparse.Namespace, rows: list[str]) -> None:
    """The rows of a write reaching a page, the fan-out, and opening a large run."""
    web, port = _start_web(url, "lat")
    try:
        lat = asyncio.run(_latency(url, port, args.writes))
    finally:
        web.terminate()
        web.wait()
        if web.stdout is not None:
            web.stdout.close()
    rows.append(f"write -> page update (1 client, {args.writes} writes): "
                f"p50 {_pct(lat, 0.5) * 1000:.1f} ms, p99 {_pct(lat, 0.99) * 1000:.1f} ms")
    fan: dict[int, dict[str, float]] = {}
    for clients in (1, args.clients):
        web, port = _start_web(url, "fan")
        try:
            fan[clients] = asyncio.run(_fanout(url, port, web.pid, clients, args.writers,
                                               args.rate, args.seconds))  # fmt: skip
        finally:
            web.terminate()
            web.wait()
            if web.stdout is not None:
                web.stdout.close()
        one = fan[clients]
        rows.append(f"fan-out {clients:>3} client(s), {args.writers} writers x "
                    f"{args.rate:g}/s, {one['changes']:.0f} changes: server CPU "
                    f"{one['cpu_ms_per_change']:.3f} ms/change; every change at every "
                    f"client p50 {one['p50_ms']:.1f} ms, p99 {one['p99_ms']:.1f} ms, "
                    f"missed {one['missed']:.1%}")  # fmt: skip
    ratio = fan[args.clients]["cpu_ms_per_change"] / max(1e-9, fan[1]["cpu_ms_per_change"])
    rows.append(f"fan-out CPU per change, {args.clients} clients / 1 client: {ratio:.2f}x")
    small = _make_big_run(url, "big", 5, 20)
    large = _make_big_run(url, "big", args.agents, args.events)
    for name, run_id in (("small (5 agents, 20 events)", small),
                         (f"large ({args.agents:,} agents, {args.events:,} events)", large)):
        page, state, size, log = _open_run(url, "big", run_id)
        rows.append(f"open a {name}: page {page * 1000:.1f} ms, page + first state on "
                    f"the stream {state * 1000:.1f} ms ({size:,} bytes), whole log read "
                    f"in {log:.2f} s")  # fmt: skip


def _runs_rows(url: str, args: argparse.Namespace, rows: list[str]) -> None:
    """The runs page with 100 and with --many runs under a prefix (interleaved): the counts by
    status are kept next to the index (one read per page, whatever the number of runs)."""
    _make_runs(url, "few", args.few)
    _make_runs(url, "many", args.many)
    servers = {name: _start_web(url, name) for name in ("few", "many")}
    try:
        for path in ("/", "/api/runs"):
            times: dict[str, list[float]] = {"few": [], "many": []}
            for name in ("few", "many"):
                _get(servers[name][1], path)  # warm: connections, imports
            time.sleep(0.5)
            for _ in range(args.repeat):
                for name in ("few", "many"):
                    times[name].append(_get(servers[name][1], path))
            few, many = statistics.median(times["few"]), statistics.median(times["many"])
            rows.append(f"runs page GET {path:<9} {args.few:>6,} runs {few * 1000:7.2f} ms, "
                        f"{args.many:>6,} runs {many * 1000:7.2f} ms: {many / few:.2f}x")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


if __name__ == "__main__":
    raise SystemExit(main())
