"""``luft-redis pools`` and ``luft-redis pool NAME``: the pools under a prefix and one pool's
runs, as a table and as JSON lines, run as a user runs it (``python -m luft_redis``), on a real
redis-server and on a private Redis Cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest

from luft_redis import AgentDone, AgentStatus, AgentTask, RedisCheckpointBackend, TokenUsage

pytestmark = pytest.mark.timeout(120)


def luft(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LUFT_REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "luft_redis", *args], capture_output=True, text=True,
        stdin=subprocess.DEVNULL, env=env, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture(params=["server", "cluster"])
def target(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    """(url, the connection options of the command)."""
    if request.param == "server":
        request.getfixturevalue("redis_url")  # flushed for this test
        url: str = request.getfixturevalue("redis_server").url
        return url, ["--redis", url]
    cluster: Any = request.getfixturevalue("redis_cluster")
    cluster.flushall()
    return cluster.url, ["--cluster", "--redis", cluster.url]


def test_pools_and_pool_show_runs_states_tasks_and_budgets(target: tuple[str, list[str]]) -> None:
    url, conn = target
    cluster = "--cluster" in conn
    boss = RedisCheckpointBackend.from_url(url, cluster=cluster, watch=False)
    worker = RedisCheckpointBackend.from_url(url, cluster=cluster, watch=False)
    runs = []
    try:
        for weight in (1, 2, 3):
            run_id = uuid.uuid4()
            boss.init_run(run_id, "pooled", "/d")
            boss.join_pool("gpu", weight=weight, max_tokens=5 if weight == 1 else None)
            boss.submit_agents([AgentTask(uuid.uuid4(), 0, None) for _ in range(3)])
            runs.append(run_id)
        boss.init_run(uuid.uuid4(), "elsewhere", "/d", pool="cpu")
        lease = worker.claim_agent("w1", pool="gpu", lease_for=60)
        assert lease is not None
        # the weight-1 run (first picked: all start at the same pass, ties by id) may or may
        # not be the one: spend the budget of the run the lease is of, when it has one
        worker.append_event(AgentDone(run_id=lease.run_id, agent_id=lease.agent_id,
                                      status=AgentStatus.OK, tokens=TokenUsage(input=7),
                                      elapsed_ms=1), lease=lease)  # fmt: skip
        held = worker.claim_agent("w2", pool="gpu", lease_for=60)
        assert held is not None
    finally:
        boss.close()
        worker.close()

    listed = luft(*conn, "pools", "--json")
    assert listed.returncode == 0, listed.stderr
    pools = {row["pool"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert set(pools) == {"gpu", "cpu"}
    assert pools["gpu"]["runs"] == 3 and pools["gpu"]["leased_tasks"] == 1
    assert pools["gpu"]["ready_tasks"] == 9 - 2
    assert pools["cpu"]["runs"] == 1 and pools["cpu"]["ready_tasks"] == 0

    shown = luft(*conn, "pool", "gpu", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {uuid.UUID(r["run_id"]): r for r in map(json.loads, shown.stdout.splitlines())}
    assert set(rows) == set(runs)
    assert [rows[r]["weight"] for r in runs] == [1, 2, 3]
    assert rows[lease.run_id]["total_tokens"] == 7
    assert rows[runs[0]]["over_budget"] is (lease.run_id == runs[0])
    assert sum(r["leased"] for r in rows.values()) == 1

    table = luft(*conn, "pool", "gpu")
    assert table.returncode == 0, table.stderr
    assert all(str(r) in table.stdout for r in runs)
    assert "pool 'gpu': 3 run(s)" in table.stderr and "1 leased" in table.stderr
    text = luft(*conn, "pools")
    assert text.returncode == 0 and "gpu" in text.stdout and "2 pool(s)" in text.stderr
