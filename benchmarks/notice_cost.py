"""Client instructions per change notice, counted by callgrind: the sync listener's path.

Run from the repository root (needs valgrind)::

    .venv/bin/python -m benchmarks.notice_cost                       # this tree
    .venv/bin/python -m benchmarks.notice_cost --tree /work/before   # and another checkout

The parent starts a private redis-server, subscribes a raw socket to a new run's change channel
and records, byte for byte, what the server sends it while one backend makes the run
(``init_run``) and appends ``--ops`` ``agent_done`` events (one finding and an output each).
Then, for each tree, a worker (``PYTHONPATH`` = that tree) runs under
``valgrind --tool=callgrind`` with no server at all: a ``RunCache`` installed from the run's
``init`` notice and a :class:`~luft_redis.watch.Watch` on it, and the recorded bytes read
through the sync listener's reader (``luft_redis.subscriber.Subscriber`` on a stand-in socket
whose ``recv`` hands out the recording ``--batch`` notices at a time; the system call itself is
not counted) and ``handle_message``. Phases, each zeroed and dumped with ``callgrind_control``:

* ``remote``: the notices are another process's changes: read, header parsed, queued;
* ``apply``: ``get_checkpoint``'s work on them (every queued delta decoded into the cache);
* ``own``: the same notices as this process's own writes: before each batch is read, its
  deltas are offered to the cache as a writer applies its replies (counted apart, and taken
  off): what a writer's listener does with its own notices.

Rows: instructions per notice of each phase. Thread wake-ups and GIL hand-offs are not
instructions of the process: ``benchmarks.fleet`` measures them (CPU time, context switches).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("remote", "apply", "own")

WORKER = r'''
import json, os, subprocess, sys, uuid
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["tree"])
import hiredis
from luft_redis.cache import RunCache, RunState
try:  # (the tree measured may be a version before coherence.py was split)
    from luft_redis.links import LinkHealth, handle_message
    from luft_redis.watch import Watch
except ImportError:  # pragma: no cover
    from luft_redis.coherence import LinkHealth, Watch, handle_message  # type: ignore
from luft_redis.delta import parse_delta
from luft_redis.keys import run_keys
from luft_redis import subscriber as subscriber_module

raw = open(cfg["recording"], "rb").read()
run_id = uuid.UUID(cfg["run"])
keys = run_keys(cfg["prefix"], run_id)
# split the recording into messages (their raw bytes), to hand out in batches
reader = hiredis.Reader()
reader.feed(raw)
messages, pos = [], 0
payloads = []
spans = []
while True:
    m = reader.gets()
    if m is False:
        break
    payloads.append(m[2])
# re-encode each message as RESP (the recording holds them back to back)
def resp(parts):
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)
init, notices = payloads[0], payloads[1:]
chunks = []
batch = cfg["batch"]
for i in range(0, len(notices), batch):
    chunks.append(b"".join(resp([b"smessage", keys.changes.encode(), p])
                           for p in notices[i:i + batch]))

class FakeSock:
    def __init__(self, chunks):
        self.chunks = list(chunks)
    def settimeout(self, t):
        pass
    def recv(self, n):
        return self.chunks.pop(0) if self.chunks else b""

def fresh_watch():
    cache = RunCache(run_id, keys)
    cache.install(RunState.from_whole(run_id, keys, parse_delta(init)), cache.generation)
    cache.snapshot()
    return cache, Watch(cache, keys.changes.encode(), lambda w: None)

def serve(watch, chunks):
    sub = subscriber_module.Subscriber(None, None, FakeSock(chunks))
    health = LinkHealth()
    targets = {watch.channel: [watch]}.get
    def tgt(channel):
        return list(targets(channel, ()))
    for _ in chunks:
        m = sub.get_message(timeout=1.0)
        while m is not None:
            handle_message(m, health, {}, tgt)
            m = sub.get_message(timeout=0)

def control(action, label=None):
    if cfg["valgrind"]:
        subprocess.run(["callgrind_control", action] + ([label] if label else [])
                       + [str(os.getpid())], check=True, capture_output=True)

import time
out = {}
# warm-up: one pass of everything (imports, caches)
c, w = fresh_watch(); serve(w, chunks); c.snapshot()
c, w = fresh_watch()
control("-z"); t0 = time.perf_counter()
serve(w, chunks)
out["remote"] = time.perf_counter() - t0; control("-d", "remote"); control("-z")
t0 = time.perf_counter()
snap = c.snapshot()
out["apply"] = time.perf_counter() - t0; control("-d", "apply")
assert snap is not None and c.tip[1] == parse_delta(notices[-1]).v_after, c.tip
# own notices: before each batch is read, the writer applied its deltas from the replies
# (as a writer does); measured as (offers + reads) - (offers alone)
deltas = [[parse_delta(p) for p in notices[i:i + batch]] for i in range(0, len(notices), batch)]
def own(read):
    c, w = fresh_watch()
    sub = subscriber_module.Subscriber(None, None, FakeSock(chunks))
    health = LinkHealth()
    def tgt(channel):
        return [w]
    for group in deltas:
        for d in group:
            c.offer(d)
        if read:
            m = sub.get_message(timeout=1.0)
            while m is not None:
                handle_message(m, health, {}, tgt)
                m = sub.get_message(timeout=0)
control("-z"); t0 = time.perf_counter()
own(False)
out["offers"] = time.perf_counter() - t0; control("-d", "offers"); control("-z")
t0 = time.perf_counter()
own(True)
out["own"] = time.perf_counter() - t0 - out["offers"]; control("-d", "own")
out["notices"] = len(notices)
print("NOTICE-COST " + json.dumps(out), flush=True)
'''


def record(ops: int, prefix: str, binary: str | None = None) -> tuple[bytes, str]:
    """The bytes a subscriber of a new run's channel receives while the run is made and
    ``ops`` events are appended to it."""
    import hiredis
    import redis

    sys.path.insert(0, str(ROOT))
    from luft_redis import RedisCheckpointBackend
    from luft_redis.keys import run_keys
    from luft_redis.tools.server import LocalRedisServer, find_redis_server

    from .run import make_agent_done

    binary = binary or find_redis_server()
    assert binary is not None, "redis-server not found"
    run_id = uuid.uuid4()
    channel = run_keys(prefix, run_id).changes.encode()
    with LocalRedisServer(binary=binary, appendonly=False) as server:
        sock = socket.create_connection((server.host, server.port))
        sock.sendall(b"*2\r\n$10\r\nSSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(channel), channel))
        reader = hiredis.Reader()
        reader.feed(sock.recv(4096))
        assert reader.gets()[0] == b"ssubscribe"
        client = redis.Redis.from_url(server.url)
        backend = RedisCheckpointBackend(client, prefix=prefix, watch=False)
        backend.init_run(run_id, "review the repository", "/tmp/runs/x")
        for i in range(ops):
            backend.append_event(make_agent_done(run_id, i))
        backend.close()
        client.close()
        data = b""
        got = 0
        sock.settimeout(5)
        while got < ops + 1:
            chunk = sock.recv(1 << 20)
            data += chunk
            reader.feed(chunk)
            while reader.gets() is not False:
                got += 1
        sock.close()
    return data, str(run_id)


def measure(tree: str, recording: str, run: str, prefix: str, batch: int,
            valgrind: bool) -> dict[str, Any]:  # fmt: skip
    cfg = {"tree": tree, "recording": recording, "run": run, "prefix": prefix, "batch": batch,
           "valgrind": valgrind}  # fmt: skip
    env = dict(os.environ, PYTHONPATH=tree, PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory() as folder:
        cmd = [sys.executable, "-c", WORKER, json.dumps(cfg)]
        if valgrind:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.out",
                   "--collect-atstart=yes", *cmd]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree,
                              timeout=1800)  # fmt: skip
        line = [x for x in proc.stdout.splitlines() if x.startswith("NOTICE-COST ")]
        if not line:
            raise RuntimeError(f"worker failed: {proc.stderr[-2000:]}")
        out: dict[str, Any] = json.loads(line[0].split(" ", 1)[1])
        if valgrind:
            for phase in PHASES:
                dumps = [p for p in Path(folder).iterdir() if _label(p) == phase]
                out[f"{phase}_ir"] = sum(_total(p) for p in dumps)
            offers = [p for p in Path(folder).iterdir() if _label(p) == "offers"]
            out["own_ir"] -= sum(_total(p) for p in offers)
    return out


def _label(path: Path) -> str | None:
    """The label of a dump made by ``callgrind_control -d <label>`` (its ``desc: Trigger:``
    line ends with it)."""
    with path.open("rb") as f:
        for raw in f:
            if raw.startswith(b"desc: Trigger:"):
                return raw.split()[-1].decode()
            if raw.startswith(b"events:"):
                return None
    return None


def _total(path: Path) -> int:
    with path.open("rb") as f:
        for raw in f:
            if raw.startswith(b"totals:") or raw.startswith(b"summary:"):
                return int(raw.split()[1])
    raise RuntimeError(f"no totals in {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.notice_cost",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--tree", action="append", default=[], help="another checkout")
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8, help="notices per read")
    parser.add_argument("--redis-server", metavar="PATH")
    parser.add_argument("--no-valgrind", action="store_true", help="time only")
    args = parser.parse_args(argv)
    valgrind = not args.no_valgrind
    if valgrind and shutil.which("callgrind_control") is None:
        print("valgrind not found (or pass --no-valgrind)", file=sys.stderr)
        return 2
    prefix = "cost"
    data, run = record(args.ops, prefix, args.redis_server)
    trees = [str(ROOT)] + [str(Path(t).resolve()) for t in args.tree]
    with tempfile.NamedTemporaryFile(suffix=".resp") as f:
        f.write(data)
        f.flush()
        print(f"{args.ops} notices of agent_done, {len(data) // (args.ops + 1)} bytes each "
              f"on the wire, read {args.batch} per recv")  # fmt: skip
        print("| tree | " + " | ".join(f"{p} instr/notice | {p} µs/notice" for p in PHASES)
              + " |")
        print("|---|" + "---|---|" * len(PHASES))
        for tree in trees:
            t0 = time.perf_counter()
            out = measure(tree, f.name, run, prefix, args.batch, valgrind)
            n = out["notices"]
            cells = []
            for p in PHASES:
                ir = out.get(f"{p}_ir")
                cells.append(f"{ir / n:,.0f}" if ir else "-")
                cells.append(f"{out[p] / n * 1e6:.1f}")
            print(f"| {Path(tree).name} | " + " | ".join(cells) + " |", flush=True)
            print(f"  [{Path(tree).name}: {time.perf_counter() - t0:.0f} s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
