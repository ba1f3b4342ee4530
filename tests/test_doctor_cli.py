"""``luft_redis.tools.doctor`` and the ``luft-redis`` command (``luft_redis.tools.cli``).

The doctor runs against private redis-servers configured safely and unsafely, against a
cluster, against fakeredis (which knows neither INFO nor CONFIG) and against a closed port.
The ``runs``/``show``/``cancel`` subcommands run in-process against the session's real server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from luft_redis import (
    AgentDone,
    AgentStarted,
    AgentStatus,
    CheckpointStatus,
    Finding,
    Log,
    LogLevel,
    RedisCheckpointBackend,
    RunDone,
    RunStatus,
    Severity,
    TokenUsage,
)
from luft_redis.errors import ConnectionError as LuftConnectionError
from luft_redis.tools import cli
from luft_redis.tools.doctor import LEVELS, Check, ServerReport, check_server
from luft_redis.tools.server import LocalRedisCluster, LocalRedisServer, find_free_port


def _levels(report: ServerReport) -> dict[str, str]:
    return {check.name: check.level for check in report.checks}


# -------------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def unsafe_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    """Evicts any key (allkeys-lru) and persists nothing (no AOF, no save rules)."""
    server = LocalRedisServer(
        binary=redis_server_binary,
        extra_args=["--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb"],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def safe_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    """appendonly yes, noeviction: what the README recommends."""
    server = LocalRedisServer(
        binary=redis_server_binary,
        appendonly=True,
        extra_args=["--maxmemory-policy", "noeviction"],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def closed_url() -> str:
    """A loopback URL on which nothing listens."""
    return f"redis://127.0.0.1:{find_free_port()}/0"


# -------------------------------------------------------------------------------- doctor


@pytest.mark.server
def test_doctor_reports_eviction_and_no_persistence_as_unsafe(
    unsafe_server: LocalRedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with redis.Redis.from_url(unsafe_server.url) as client:
        report = check_server(client)
    levels = _levels(report)
    assert not report.ok
    assert report.level == "unsafe"
    assert levels["maxmemory-policy"] == "unsafe"
    assert levels["persistence"] == "unsafe"
    assert levels["redis-version"] == "ok"
    assert levels["cluster-mode"] == "ok"
    assert "appendfsync" in levels
    assert all(check.node is None for check in report.checks)
    policy = next(c for c in report.checks if c.name == "maxmemory-policy")
    assert "allkeys-lru" in policy.message and "noeviction" in policy.message

    assert cli.main(["doctor", "--redis", unsafe_server.url]) == 1
    out = capsys.readouterr().out
    assert "UNSAFE" in out and "maxmemory-policy" in out and "allkeys-lru" in out


@pytest.mark.server
def test_doctor_accepts_aof_and_noeviction(
    safe_server: LocalRedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with redis.Redis.from_url(safe_server.url) as client:
        report = check_server(client)
    assert report.ok, report.checks
    assert report.level == "ok"
    assert _levels(report) == {
        "redis-version": "ok",
        "cluster-mode": "ok",
        "maxmemory-policy": "ok",
        "persistence": "ok",
        "appendfsync": "ok",
        "functions": "ok",
    }
    assert cli.main(["doctor", "--redis", safe_server.url]) == 0
    out = capsys.readouterr().out
    assert "UNSAFE" not in out
    assert out.rstrip().endswith("safe")


@pytest.mark.server
@pytest.mark.parametrize(
    ("policy", "level"),
    [("volatile-lru", "warn"), ("volatile-ttl", "warn"), ("allkeys-random", "unsafe")],
)
def test_doctor_policy_levels(safe_server: LocalRedisServer, policy: str, level: str) -> None:
    with redis.Redis.from_url(safe_server.url) as client:
        client.config_set("maxmemory-policy", policy)
        try:
            report = check_server(client)
        finally:
            client.config_set("maxmemory-policy", "noeviction")
    assert _levels(report)["maxmemory-policy"] == level
    assert report.ok == (level != "unsafe")


@pytest.mark.server
def test_doctor_rdb_only_and_fsync_no_are_warnings(safe_server: LocalRedisServer) -> None:
    with redis.Redis.from_url(safe_server.url) as client:
        client.config_set("appendfsync", "no")
        try:
            report = check_server(client)
        finally:
            client.config_set("appendfsync", "everysec")
        assert _levels(report)["appendfsync"] == "warn"
        assert report.ok
        client.config_set("save", "3600 1")
        client.config_set("appendonly", "no")
        try:
            report = check_server(client)
        finally:
            client.config_set("appendonly", "yes")
            client.config_set("save", "")
    levels = _levels(report)
    assert levels["persistence"] == "warn"
    assert report.ok


def test_doctor_on_fakeredis_says_unknown() -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    report = check_server(client)
    levels = _levels(report)
    assert levels["maxmemory-policy"] == "unknown"
    assert levels["persistence"] == "unknown"
    assert levels["redis-version"] == "unknown"
    assert levels["appendfsync"] == "unknown"
    assert report.ok  # unknown is not unsafe
    assert report.level == "unknown"
    assert all(check.level in LEVELS for check in report.checks)
    assert all(check.message for check in report.checks)


def test_doctor_falls_back_to_info_when_config_is_disabled() -> None:
    """Managed services disable CONFIG; INFO still tells the policy and the AOF."""

    class NoConfig(fakeredis.FakeRedis):
        def config_get(self, *args: Any, **kwargs: Any) -> Any:
            raise redis.exceptions.ResponseError("unknown command 'CONFIG'")

        def info(self, section: Any = None, *args: Any, **kwargs: Any) -> Any:
            if section == "memory":
                return {"maxmemory_policy": "noeviction"}
            if section == "persistence":
                return {"aof_enabled": 1, "rdb_last_bgsave_status": "ok"}
            if section == "server":
                return {"redis_version": "6.2.14", "redis_mode": "standalone"}
            raise redis.exceptions.ResponseError("bad section")

    report = check_server(NoConfig(server=fakeredis.FakeServer()))
    levels = _levels(report)
    assert levels["maxmemory-policy"] == "ok"
    assert levels["persistence"] == "ok"
    assert levels["appendfsync"] == "unknown"
    assert levels["redis-version"] == "unsafe"  # 6.2 < 7.0
    assert not report.ok


def test_doctor_unreachable_raises_connection_error(closed_url: str) -> None:
    with redis.Redis.from_url(closed_url) as client, pytest.raises(LuftConnectionError):
        check_server(client)


def test_cli_doctor_unreachable_exits_2(
    closed_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["doctor", "--redis", closed_url]) == 2
    captured = capsys.readouterr()
    assert "cannot reach Redis" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_cli_hides_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://user:s3cret-pw@127.0.0.1:{find_free_port()}/0"
    assert cli.main(["doctor", "--redis", url]) == 2
    captured = capsys.readouterr()
    assert "s3cret-pw" not in captured.out + captured.err
    assert "***" in captured.err


def test_cli_url_from_environment(
    closed_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LUFT_REDIS_URL", closed_url)
    assert cli.main(["doctor"]) == 2
    assert closed_url in capsys.readouterr().err


@pytest.mark.cluster
def test_doctor_checks_every_primary(redis_cluster: LocalRedisCluster) -> None:
    client = redis_cluster.client()
    try:
        report = check_server(client)
    finally:
        client.close()
    nodes = {check.node for check in report.checks}
    assert nodes == {f"{host}:{port}" for host, port in redis_cluster.startup_nodes}
    assert all(c.level == "ok" for c in report.checks if c.name == "cluster-mode")
    # The test cluster runs without persistence.
    assert all(c.level == "unsafe" for c in report.checks if c.name == "persistence")
    assert not report.ok


@pytest.mark.cluster
def test_doctor_warns_about_a_plain_client_on_a_cluster_node(
    redis_cluster: LocalRedisCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    with redis.Redis.from_url(redis_cluster.url) as client:
        report = check_server(client)
    assert _levels(report)["cluster-mode"] == "warn"
    assert cli.main(["doctor", "--cluster", "--redis", redis_cluster.url]) == 1
    out = capsys.readouterr().out
    for host, port in redis_cluster.startup_nodes:
        assert f"[{host}:{port}]" in out


def test_report_level_and_by_level() -> None:
    report = ServerReport(
        ok=True, checks=[Check("a", "ok", "fine"), Check("b", "warn", "hmm"), Check("c", "ok", "")]
    )
    assert report.level == "warn"
    assert [c.name for c in report.by_level("ok")] == ["a", "c"]
    assert ServerReport(ok=True).level == "ok"


# ---------------------------------------------------------------------------- runs, show, cancel


@pytest.fixture
def stored_run(redis_url: str) -> Iterator[uuid.UUID]:
    """A run with a few events on the session's (flushed) real server."""
    run_id, agent_id = uuid.uuid4(), uuid.uuid4()
    with RedisCheckpointBackend.from_url(redis_url) as backend:
        backend.init_run(run_id, "review the repository", "/tmp/runs/cli")
        backend.append_event(
            AgentStarted(
                run_id=run_id, phase_id=0, agent_id=agent_id, prompt_preview="look", model="m"
            )
        )
        backend.append_event(
            AgentDone(
                run_id=run_id,
                agent_id=agent_id,
                status=AgentStatus.OK,
                tokens=TokenUsage(input=1200, output=340),
                elapsed_ms=5100,
                findings=(
                    Finding(
                        kind="bug", severity=Severity.HIGH, title="off by one", detail="loop bound"
                    ),
                ),
            )
        )
        for i in range(5):
            backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg=f"line {i}"))
    yield run_id


@pytest.mark.server
def test_cli_runs_lists_the_runs(
    redis_url: str, stored_run: uuid.UUID, capsys: pytest.CaptureFixture[str]
) -> None:
    other = uuid.uuid4()
    with RedisCheckpointBackend.from_url(redis_url) as backend:
        backend.init_run(other, "second", "/tmp/runs/2")
        backend.append_event(
            RunDone(run_id=other, status=RunStatus.COMPLETED, total_tokens=TokenUsage())
        )
    assert cli.main(["runs", "--redis", redis_url]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert set(lines) == {str(stored_run), str(other)}
    assert "running" in lines[str(stored_run)] and "1540" in lines[str(stored_run)]
    assert "review the repository" in lines[str(stored_run)]
    assert "completed" in lines[str(other)]

    assert cli.main(["runs", "--redis", redis_url, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_id = {row["run_id"]: row for row in rows}
    assert by_id[str(stored_run)]["total_tokens"] == 1540
    assert by_id[str(stored_run)]["status"] == "running"
    assert by_id[str(stored_run)]["task"] == "review the repository"
    assert by_id[str(other)]["status"] == "completed"
    assert {"updated_at", "created_at"} <= set(by_id[str(other)])


@pytest.mark.server
def test_cli_runs_other_prefix_is_empty(
    redis_url: str, stored_run: uuid.UUID, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["runs", "--redis", redis_url, "--prefix", "elsewhere", "--json"]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.server
def test_cli_show_prints_summary_and_last_events(
    redis_url: str, stored_run: uuid.UUID, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["show", str(stored_run), "--redis", redis_url, "--events", "3"]) == 0
    out = capsys.readouterr().out
    assert str(stored_run) in out
    assert "total_tokens:" in out and "1540" in out
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [e["msg"] for e in events] == ["line 2", "line 3", "line 4"]
    assert all(e["type"] == "log" and e["run_id"] == str(stored_run) for e in events)

    assert (
        cli.main(["show", str(stored_run), "--redis", redis_url, "--json", "--events", "100"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads(lines[0])
    assert summary["events"] == 7 and summary["findings"] == 1
    assert summary["agent_results"] == {"ok": 1}
    assert [json.loads(line)["type"] for line in lines[1:]] == [
        "agent_started",
        "agent_done",
        "log",
        "log",
        "log",
        "log",
        "log",
    ]

    assert cli.main(["show", str(stored_run), "--redis", redis_url, "--events", "0"]) == 0
    assert not any(line.startswith("{") for line in capsys.readouterr().out.splitlines())


@pytest.mark.server
def test_cli_show_and_cancel_missing_run(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(uuid.uuid4())
    assert cli.main(["show", missing, "--redis", redis_url]) == 1
    assert "not found" in capsys.readouterr().err
    assert cli.main(["cancel", missing, "--redis", redis_url]) == 1
    assert "not found" in capsys.readouterr().err


def test_cli_rejects_a_bad_run_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["show", "not-a-uuid", "--redis", "redis://127.0.0.1:1/0"]) == 2
    assert "not a run id" in capsys.readouterr().err


@pytest.mark.server
def test_cli_cancel(
    redis_url: str, stored_run: uuid.UUID, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cancel", str(stored_run), "--redis", redis_url]) == 0
    assert capsys.readouterr().out.strip() == f"run {stored_run}: cancelled"
    with RedisCheckpointBackend.from_url(redis_url) as backend:
        cp = backend.open_run(stored_run)
        assert cp is not None and cp.status is CheckpointStatus.CANCELLED
    assert cli.main(["cancel", str(stored_run), "--redis", redis_url]) == 0
    assert "already" in capsys.readouterr().out


@pytest.mark.server
def test_cli_cancel_leaves_a_completed_run(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = uuid.uuid4()
    with RedisCheckpointBackend.from_url(redis_url) as backend:
        backend.init_run(run_id, "done", "/tmp/runs/done")
        backend.append_event(
            RunDone(run_id=run_id, status=RunStatus.COMPLETED, total_tokens=TokenUsage())
        )
    assert cli.main(["cancel", str(run_id), "--redis", redis_url]) == 1
    err = capsys.readouterr().err
    assert "is completed" in err and "only a running run" in err and "nothing changed" in err
    with RedisCheckpointBackend.from_url(redis_url) as backend:
        cp = backend.open_run(run_id)
        assert cp is not None and cp.status is CheckpointStatus.COMPLETED


def test_cli_runs_unreachable_exits_2(closed_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["runs", "--redis", closed_url]) == 2
    captured = capsys.readouterr()
    assert "cannot reach Redis" in captured.err and "Traceback" not in captured.err


# -------------------------------------------------------------------------------- demo, usage


def test_cli_demo_forwards_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str] | None] = []

    def fake_main(argv: list[str] | None) -> int:
        seen.append(argv)
        return 7

    module = types.ModuleType("luft_redis.tools.demo")
    module.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "luft_redis.tools.demo", module)
    assert cli.main(["demo", "--workers", "3", "--help", "x"]) == 7
    assert seen == [["--workers", "3", "--help", "x"]]
    # a global --redis before the command goes to the demo too
    assert cli.main(["--redis", "redis://127.0.0.1:7/0", "-v", "demo", "--fast"]) == 7
    assert seen[-1] == ["--redis", "redis://127.0.0.1:7/0", "--fast"]


def test_cli_demo_not_available(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "luft_redis.tools.demo", None)  # import fails
    assert cli.main(["demo", "--anything"]) == 2
    assert "demo not available" in capsys.readouterr().err


def test_cli_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("doctor", "runs", "show", "cancel", "demo"):
        assert command in out


def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "luft_redis", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "doctor" in result.stdout


@pytest.mark.server
def test_cli_delete(
    redis_url: str, stored_run: uuid.UUID, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["delete", str(stored_run), "--redis", redis_url]) == 0
    assert capsys.readouterr().out.strip() == f"run {stored_run}: deleted, with its event log"
    with RedisCheckpointBackend.from_url(redis_url) as backend:
        assert backend.open_run(stored_run) is None
        assert stored_run not in backend.list_runs()
    assert cli.main(["delete", str(stored_run), "--redis", redis_url]) == 1
    assert "not found" in capsys.readouterr().err
