"""A LocalRedisServer / LocalRedisCluster dropped without stop() is stopped at interpreter
exit: its redis-server is gone and its temporary directory removed (issue 10, section 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from luft_redis.tools.server import find_redis_server

pytestmark = pytest.mark.skipif(find_redis_server() is None, reason="redis-server not found")


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():  # a zombie is not a running server
        return stat.read_text().split(") ", 1)[-1].split(" ", 1)[0] != "Z"
    return True  # pragma: no cover - no /proc


def _run_child(code: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _gone(pids: list[int], dirs: list[str]) -> None:
    deadline = time.monotonic() + 10  # a generous bound: the child already waited for them
    while any(_pid_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not [p for p in pids if _pid_running(p)], "orphaned redis-server left running"
        assert not [d for d in dirs if Path(d).exists()], "temporary directory left behind"
    finally:
        for pid in pids:  # never leave an orphan behind, even when the test fails
            if _pid_running(pid):
                os.kill(pid, 9)


def test_dropped_server_is_stopped_at_exit() -> None:
    out = _run_child(
        """
        import gc, json
        from luft_redis.tools.server import LocalRedisServer
        server = LocalRedisServer().start()
        info = {"pid": server.pid, "dir": str(server.dir)}
        del server
        gc.collect()
        print(json.dumps(info))
        """
    )
    pid, workdir = int(str(out["pid"])), str(out["dir"])
    _gone([pid], [workdir])


def test_dropped_cluster_is_stopped_at_exit() -> None:
    out = _run_child(
        """
        import gc, json
        from luft_redis.tools.server import LocalRedisCluster
        cluster = LocalRedisCluster(masters=3).start()
        info = {"pids": [n.pid for n in cluster._nodes], "dir": str(cluster.dir)}
        del cluster
        gc.collect()
        print(json.dumps(info))
        """
    )
    pids = [int(p) for p in out["pids"]]  # type: ignore[attr-defined]
    _gone(pids, [str(out["dir"])])
