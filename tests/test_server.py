"""Tests of luft_redis.tools.server (local redis-server / cluster machinery) and the fixtures."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

import luft_redis
import luft_redis.tools.server as server_mod
from luft_redis.tools.server import (
    LocalRedisCluster,
    LocalRedisServer,
    find_free_port,
    find_redis_server,
)

Client = redis.Redis | RedisCluster


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - exists, owned by someone else
        return True
    # A zombie still answers kill(0); it is not a running server.
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        return stat.read_text().split(") ", 1)[-1].split(" ", 1)[0] != "Z"
    return True  # pragma: no cover - no /proc


def test_installed_package_location() -> None:
    """Under .ci/run (LUFT_REDIS_EXPECT_INSTALLED=1) tests must import the installed wheel."""
    pkg_dir = Path(luft_redis.__file__).resolve().parent
    print(f"luft_redis imported from {pkg_dir}", file=sys.stderr)
    if os.environ.get("LUFT_REDIS_EXPECT_INSTALLED"):
        assert "site-packages" in pkg_dir.parts, pkg_dir
        assert (pkg_dir / "py.typed").is_file()
        assert sorted((pkg_dir / "lua").rglob("*.lua")), f"no Lua scripts under {pkg_dir}/lua"
    else:
        # Source tree or installed: the Lua folder is reachable one way or the other.
        assert (pkg_dir / "lua").is_dir() or (pkg_dir.parent / "lua").is_dir()


def test_find_free_port_is_bindable() -> None:
    port = find_free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen(1)


def test_find_redis_server_is_executable() -> None:
    found = find_redis_server()
    if found is None:
        pytest.skip("redis-server not installed")
    assert os.access(found, os.X_OK)


@pytest.mark.server
def test_start_stop_leaves_no_process(redis_server_binary: str) -> None:
    server = LocalRedisServer(binary=redis_server_binary)
    with server:
        pid = server.pid
        assert pid is not None and _pid_alive(pid)
        workdir = server.dir
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(server.url) as conn:
            assert conn.ping() is True
            assert conn.config_get("bind") == {"bind": "127.0.0.1"}
        assert (workdir / "redis.log").is_file()
    assert server.pid is None
    assert not _pid_alive(pid)
    assert not workdir.exists(), "the temp dir it created must be removed"
    server.stop()  # idempotent


@pytest.mark.server
def test_kill_then_start_keeps_aof_data(redis_server_binary: str, tmp_path: Path) -> None:
    server = LocalRedisServer(
        binary=redis_server_binary, dir=tmp_path, appendonly=True, appendfsync="always"
    )
    try:
        server.start()
        port, first_pid = server.port, server.pid
        assert first_pid is not None
        with redis.Redis.from_url(server.url) as conn:
            conn.set(b"survivor", b"42")
        server.kill()
        assert not server.running and not _pid_alive(first_pid)
        server.start()
        assert server.port == port and server.dir == tmp_path
        assert server.pid not in (None, first_pid)
        with redis.Redis.from_url(server.url) as conn:
            assert conn.get(b"survivor") == b"42"
    finally:
        server.stop()
    assert tmp_path.exists(), "a given dir is never removed"


@pytest.mark.server
def test_start_failure_reports_log_tail(redis_server_binary: str, tmp_path: Path) -> None:
    server = LocalRedisServer(
        binary=redis_server_binary,
        dir=tmp_path,
        extra_args=["--maxmemory-policy", "no-such-policy"],
        startup_timeout=5,
    )
    with pytest.raises(RuntimeError, match="no-such-policy"):
        server.start()
    assert server.pid is None


@pytest.mark.server
def test_port_taken_between_pick_and_bind_is_retried(
    redis_server_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        real = server_mod.find_free_port
        monkeypatch.setattr(
            server_mod, "find_free_port", lambda host="127.0.0.1": next(ports, None) or real(host)
        )
        with LocalRedisServer(binary=redis_server_binary) as server:
            assert server.port != taken
            with redis.Redis.from_url(server.url) as conn:
                assert conn.ping() is True


@pytest.mark.server
def test_redis_url_fixture_is_flushed(redis_url: str, redis_server: LocalRedisServer) -> None:
    assert redis_url == redis_server.url
    with redis.Redis.from_url(redis_url) as conn:
        assert conn.dbsize() == 0


@pytest.mark.cluster
def test_cluster_covers_all_slots_and_runs_scripts(redis_cluster: LocalRedisCluster) -> None:
    assert len(redis_cluster.startup_nodes) == 3
    assert redis_cluster.url.startswith("redis://127.0.0.1:")
    client = redis_cluster.client()
    try:
        slots = client.cluster_slots()
        covered = sum(end - start + 1 for (start, end) in slots)
        assert covered == 16384
        script = client.register_script(
            "redis.call('SET', KEYS[1], ARGV[1]); "
            "redis.call('SET', KEYS[2], ARGV[2]); "
            "return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}"
        )
        keys = ["run:{r1}:meta", "run:{r1}:stream-pos"]
        assert script(keys=keys, args=[b"a", b"b"]) == [b"a", b"b"]
        redis_cluster.flushall()
        assert client.get(keys[0]) is None
    finally:
        client.close()


def _fail_over_to(cluster: LocalRedisCluster, replica: LocalRedisServer, slot: int) -> None:
    """CLUSTER FAILOVER on *replica*; wait until it serves *slot* and its old primary follows it."""
    with redis.Redis(host=replica.host, port=replica.port) as conn:
        conn.execute_command("CLUSTER", "FAILOVER")
    cluster.wait_for_primary(slot, replica)
    cluster.wait_ready(timeout=30)


def test_cluster_replicas_are_up_and_failover_promotes_one(
    redis_cluster_replicas: LocalRedisCluster,
) -> None:
    cluster = redis_cluster_replicas
    assert len(cluster.nodes) == 6
    assert all(node.host == "127.0.0.1" for node in cluster.nodes)
    primaries = cluster.primaries()
    assert len(primaries) == 3
    assert {cluster.primary_for_slot(slot) for slot in (0, 8191, 16383)} == set(primaries)
    for primary in primaries:
        replicas = cluster.replicas_of(primary)
        assert len(replicas) == 1 and replicas[0] not in primaries
        with redis.Redis(host=replicas[0].host, port=replicas[0].port) as conn:
            info = conn.info("replication")
        assert info["role"] == "slave"
        assert info["master_link_status"] == "up"
        assert info["master_port"] == primary.port

    key = b"{failover}:k"
    slot = key_slot(key)
    client = cluster.client()
    try:
        client.set(key, b"before")
        old = cluster.primary_for_slot(slot)
        (replica,) = cluster.replicas_of(old)
        with redis.Redis(host=old.host, port=old.port) as conn:
            assert conn.execute_command("WAIT", 1, 5000) == 1  # the write reached the replica

        _fail_over_to(cluster, replica, slot)
        assert cluster.replicas_of(replica) == [old]
        assert cluster.replicas_of(old) == []
        with redis.Redis(host=replica.host, port=replica.port) as conn:
            assert conn.get(key) == b"before"
            conn.set(key, b"after")
            assert conn.get(key) == b"after"

        _fail_over_to(cluster, old, slot)  # back, so the next test finds the usual layout
        assert cluster.replicas_of(old) == [replica]
    finally:
        client.close()


def test_redis_client_fixture(redis_client: Client, redis_target: str) -> None:
    """The three targets hand out an empty, bytes-returning client."""
    assert redis_client.dbsize() == 0
    redis_client.set("{t}:k", "v")
    assert redis_client.get("{t}:k") == b"v"
    assert redis_client.eval("return redis.call('GET', KEYS[1])", 1, "{t}:k") == b"v"
    assert isinstance(redis_client, RedisCluster) == (redis_target == "cluster")
