"""``luft-redis agents RUN_ID`` (a run's agent tasks) and ``pools`` / ``pool NAME`` (the pools
and one pool's runs) as tables and as JSON, run as a user runs it (``python -m luft_redis`` in
a subprocess), on a real redis-server and on fakeredis served over TCP (the same server the
demo falls back to; the pools on a private Redis Cluster instead)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from luft_redis import AgentDone, AgentStatus, AgentTask, RedisCheckpointBackend, TokenUsage
from luft_redis.tools.server import LocalRedisServer, find_free_port

pytestmark = pytest.mark.timeout(120)


def luft(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LUFT_REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "luft_redis", *args], capture_output=True, text=True,
        stdin=subprocess.DEVNULL, env=env, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture(params=["server", "fakeredis"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "server":
        request.applymarker(pytest.mark.server)
        server: LocalRedisServer = request.getfixturevalue("redis_server")
        request.getfixturevalue("redis_url")  # flushed for this test
        yield server.url
        return
    fakeredis = pytest.importorskip("fakeredis")
    pytest.importorskip("lupa")
    port = find_free_port()
    fake = fakeredis.TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=fake.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)  # fmt: skip
    thread.start()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        fake.shutdown()
        fake.server_close()
        thread.join(timeout=5)


def test_agents_lists_every_state_with_holder_token_and_lease(url: str) -> None:
    run_id = uuid.uuid4()
    agents = [uuid.uuid4() for _ in range(5)]
    boss = RedisCheckpointBackend.from_url(url, watch=False, max_attempts=1)
    worker = RedisCheckpointBackend.from_url(url, watch=False)
    try:
        boss.init_run(run_id, "fleet", "/tmp/fleet")
        boss.submit_agents([AgentTask(a, i % 2, {"prompt": f"look at module {i} " + "x" * 80})
                            for i, a in enumerate(agents)])  # fmt: skip
        worker.open_run(run_id)
        dead = worker.claim_agent("host-1:pid-10", lease_for=30)
        assert dead is not None and dead.agent_id == agents[0]
        dead.release(failed=True)  # submitted with max_attempts=1: dead
        held = worker.claim_agent("host-1:pid-10", lease_for=30)
        lapsing = worker.claim_agent("host-2:pid-20", lease_for=0.05)
        finished = worker.claim_agent("host-3:pid-30", lease_for=30)
        assert held is not None and lapsing is not None and finished is not None
        worker.append_event(AgentDone(run_id=run_id, agent_id=finished.agent_id,
                                      status=AgentStatus.OK, tokens=TokenUsage(input=3),
                                      elapsed_ms=1), lease=finished)  # fmt: skip
        time.sleep(0.2)  # the 50 ms lease lapses (nobody took it over)

        result = luft("--redis", url, "agents", str(run_id), "--json")
        assert result.returncode == 0, result.stderr
        rows = [json.loads(line) for line in result.stdout.splitlines()]  # JSON lines
        assert [row["agent_id"] for row in rows] == [str(a) for a in agents]  # submit order
        by_id = {row["agent_id"]: row for row in rows}
        assert by_id[str(agents[0])]["state"] == "dead"
        assert by_id[str(agents[0])]["failures"] == 1
        assert by_id[str(agents[1])]["state"] == "leased"
        assert by_id[str(agents[1])]["holder"] == "host-1:pid-10"
        assert by_id[str(agents[1])]["token"] == held.token
        assert by_id[str(agents[1])]["expires_at"] == pytest.approx(held.expires_at)
        assert not by_id[str(agents[1])]["lapsed"]
        assert by_id[str(agents[2])]["state"] == "leased" and by_id[str(agents[2])]["lapsed"]
        assert by_id[str(agents[3])]["state"] == "done"
        assert by_id[str(agents[4])]["state"] == "ready"
        assert by_id[str(agents[4])]["attempt"] == 0
        assert by_id[str(agents[4])]["payload"]["prompt"].startswith("look at module 4 xxx")
        assert [row["phase_id"] for row in rows] == [0, 1, 0, 1, 0]

        before = time.time()
        result = luft("--redis", url, "agents", str(run_id))
        after = time.time()
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].split()[:3] == ["agent", "id", "phase"], result.stdout
        row = {a: next(line for line in lines if line.startswith(str(a))).split() for a in agents}
        # agent id, phase, state, holder, attempt, failures, token, lease, payload
        assert row[agents[0]][1:7] == ["0", "dead", "host-1:pid-10", "1", "1", str(dead.token)]
        assert row[agents[1]][1:7] == ["1", "leased", "host-1:pid-10", "1", "0", str(held.token)]
        left = float(row[agents[1]][7].removesuffix("s"))
        # the time left when the command looked, to the display's rounding (a loaded machine
        # may take seconds to start the command: bound it by the clock around the call)
        assert held.expires_at - after - 1 <= left <= min(30, held.expires_at - before + 1)
        assert row[agents[1]][8] == "left"
        assert row[agents[2]][2:4] == ["leased", "(lapsed)"]
        assert " ".join(row[agents[2]][8:11]).startswith("lapsed ")
        assert row[agents[3]][2] == "done" and row[agents[4]][2:5] == ["ready", "-", "0"]
        assert row[agents[4]][-1].endswith("\u2026")  # the payload is cut short
        assert "5 agent task(s)" in result.stderr and "1 ready, 2 leased, 1 done, 1 dead" in (
            result.stderr) and "1 leased lapsed" in result.stderr  # fmt: skip
    finally:
        worker.close()
        boss.close()


def test_agents_of_a_run_without_tasks_and_of_a_missing_run(url: str) -> None:
    run_id = uuid.uuid4()
    with RedisCheckpointBackend.from_url(url, watch=False) as boss:
        boss.init_run(run_id, "no fleet", "/tmp/none")
    result = luft("--redis", url, "agents", str(run_id), "--json")
    assert result.returncode == 0 and result.stdout == "", result.stderr
    result = luft("--redis", url, "agents", str(run_id))
    assert result.returncode == 0 and result.stdout == ""
    assert "0 agent task(s)" in result.stderr
    missing = uuid.uuid4()
    result = luft("--redis", url, "agents", str(missing))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"luft-redis agents: run {missing} not found under prefix 'luft'")  # fmt: skip


def test_agents_unreachable_exits_2() -> None:
    result = luft("--redis", "redis://127.0.0.1:1/0", "agents", str(uuid.uuid4()))
    assert result.returncode == 2 and "cannot reach Redis" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- pools and pool NAME


@pytest.fixture(params=["server", "cluster"])
def pool_target(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    """(url, the connection options of the command)."""
    if request.param == "server":
        request.getfixturevalue("redis_url")  # flushed for this test
        url: str = request.getfixturevalue("redis_server").url
        return url, ["--redis", url]
    cluster: Any = request.getfixturevalue("redis_cluster")
    cluster.flushall()
    return cluster.url, ["--cluster", "--redis", cluster.url]


def test_pools_and_pool_show_runs_states_tasks_and_budgets(
    pool_target: tuple[str, list[str]],
) -> None:
    url, conn = pool_target
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
    assert pools["gpu"]["workers"] == 1  # w2 holds the one live lease
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
    assert "pool 'gpu': 3 run(s)" in table.stderr and "1 leased by 1 worker(s)" in table.stderr
    text = luft(*conn, "pools")
    assert text.returncode == 0 and "gpu" in text.stdout and "2 pool(s)" in text.stderr


def test_limits_lists_rates_budget_left_and_waits(pool_target: tuple[str, list[str]]) -> None:
    url, conn = pool_target
    boss = RedisCheckpointBackend.from_url(url, cluster="--cluster" in conn, watch=False)
    try:
        boss.set_rate_limit("gpt", requests_per_minute=60, tokens_per_minute=6000, burst=0)
        boss.set_rate_limit("idle", tokens_per_minute=100)
        boss.init_run(uuid.uuid4(), "limited", "/d")
        boss.submit_agents([AgentTask(uuid.uuid4(), 0, None) for _ in range(2)],
                           limiter="gpt", expected_tokens=600)  # fmt: skip
        assert boss.claim_agent("w", lease_for=60) is not None
        assert boss.claim_agent("w", lease_for=60) is None  # out of budget: a wait
    finally:
        boss.close()
    listed = luft(*conn, "limits", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert set(rows) == {"gpt", "idle"}
    gpt = rows["gpt"]
    assert (gpt["admitted"], gpt["waits"], gpt["tokens"]) == (1, 1, 600)
    assert gpt["requests_per_minute"] == 60 and gpt["requests_available"] == 0
    assert rows["idle"]["requests_per_minute"] is None and rows["idle"]["tokens_available"] > 0
    table = luft(*conn, "limits")
    assert table.returncode == 0 and "gpt" in table.stdout
    assert "2 rate limiter(s)" in table.stderr and "1 claim(s) made to wait" in table.stderr
