"""``luft-redis agents RUN_ID``: a run's agent tasks as a table and as JSON, run as a user runs
it (``python -m luft_redis`` in a subprocess), on a real redis-server and on fakeredis served
over TCP (the same server the demo falls back to)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

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
