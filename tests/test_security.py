"""Security setups: a least-privilege ACL user and a TLS-only server (docs/security.md).

Both start their own private redis-server. The TLS tests make a throw-away CA and server
certificate with the ``openssl`` binary; without it they are skipped, except under CI.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentSessionCheckpoint,
    AgentStarted,
    AgentStatus,
    AgentTask,
    AsyncRedisCheckpointBackend,
    CheckpointStatus,
    Durability,
    Finding,
    LuftRedisError,
    RedisCheckpointBackend,
    RunDone,
    RunStatus,
    Severity,
    TokenUsage,
    interop,
    retention,
)
from luft_redis.errors import AuthenticationError, PermissionDeniedError, TLSError
from luft_redis.keys import TOMBSTONE_TTL, pool_keys, run_index_key, run_keys, tombstone_key
from luft_redis.scripts import SCRIPT_NAMES, library, script_source
from luft_redis.tools import cli
from luft_redis.tools.doctor import check_server
from luft_redis.tools.server import LocalRedisCluster, LocalRedisServer, find_free_port

pytestmark = pytest.mark.server

#: The commands of the least-privilege user, exactly as in docs/security.md.
ACL_COMMANDS = (
    "+fcall +fcall_ro +function|load +xrange +xrevrange +xlen +scan +time +hgetall +hmget +hget "
    "+hset +hsetnx +hdel +hexists +hlen +del +exists +type +llen +lrange +lrem +rpush +xadd "
    "+xtrim +pttl +pexpire +persist +expire +rename +spublish +ssubscribe +sunsubscribe +ping "
    "+xread +zadd +zrem +zcard +zrange +zrevrangebyscore +hincrby +zcount +zscore +sadd +srem "
    "+sismember +srandmember +get +set +zremrangebyscore +xdel"
)
ACL_LINE = f"ACL SETUSER luft on >CHANGE-ME ~luft:* resetchannels &luft:* -@all {ACL_COMMANDS}"
#: What docs/security.md adds to the user for each option that needs more.
ACL_DURABILITY = "ACL SETUSER luft +wait"
ACL_CLUSTER = "ACL SETUSER luft +cluster|slots +cluster|shards +cluster|nodes +role +command"
PASSWORD = "s3cret-for-tests"

_DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"
_CALL = re.compile(
    r"""(?:redis\.p?call\(\s*|read_key\(\d+,\s*'[a-z]+',\s*)['"]([A-Za-z]+)['"]""")


def _in_ci() -> bool:
    import os

    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# -------------------------------------------------------------------------------- lifecycle


def _lifecycle(backend: RedisCheckpointBackend, reader: RedisCheckpointBackend) -> uuid.UUID:
    """Every operation of the backend once; returns the run id."""
    run_id, agent = uuid.uuid4(), uuid.uuid4()
    backend.init_run_with_meta(run_id, "secure run", "/tmp/secure", {"wf": 1})
    backend.append_event(
        AgentStarted(run_id=run_id, phase_id=0, agent_id=agent, prompt_preview="p", model="m")
    )
    backend.append_event(
        AgentDone(
            run_id=run_id,
            agent_id=agent,
            status=AgentStatus.OK,
            tokens=TokenUsage(input=30, output=12),
            elapsed_ms=1,
            findings=(Finding(kind="bug", severity=Severity.LOW, title="t", detail="d"),),
        )
    )
    backend.upsert_agent_result(
        AgentResultCache(
            agent_id=agent,
            phase_id=0,
            status="ok",
            output={"x": 1},
            findings=(),
            tokens=42,
            completed_at=1,
        )
    )
    backend.upsert_agent_session(
        AgentSessionCheckpoint(
            agent_id=agent, session_id="s-1", status="active", updated_at=1, resumable=True
        )
    )
    cp = reader.open_run(run_id)
    assert cp is not None and cp == backend.get_checkpoint()
    assert [e.TYPE for e in reader.get_event_log()] == ["agent_started", "agent_done"]
    reader.cancel()
    assert reader.get_checkpoint() is not None
    assert reader.get_checkpoint().status is CheckpointStatus.CANCELLED  # type: ignore[union-attr]
    reader.reset_status_to_running()
    saved = reader.get_checkpoint()
    assert saved is not None
    reader.save_checkpoint(saved)
    # pools: join, submit (a wake), a claim from the pool under limits (the run's, the
    # pool's max_leases, a rate limiter), its finish, a sweep
    pooled = uuid.uuid4()
    reader.join_pool("secure", max_leases=2, max_tokens=10**6)
    reader.configure_pool("secure", max_leases=5)
    reader.set_rate_limit("secure-model", requests_per_minute=600, tokens_per_minute=10**6)
    reader.submit_agents([AgentTask(pooled, 0, {"p": 1}, "secure-model", 50)])
    lease = backend.claim_agent("w", pool="secure")
    assert lease is not None and lease.agent_id == pooled and lease.pool_capped
    done = AgentDone(run_id=run_id, agent_id=pooled, status=AgentStatus.OK,
                     tokens=TokenUsage(input=1), elapsed_ms=1)  # fmt: skip
    backend.append_event(done, lease=lease)
    assert backend.claim_agent("w", pool="secure") is None
    assert backend._sweep_pool(pool_keys("luft", "secure")) is False  # (srandmember, reads)
    reader.append_event(
        RunDone(
            run_id=run_id, status=RunStatus.COMPLETED, total_tokens=TokenUsage(input=31, output=12)
        )
    )
    assert run_id in reader.list_runs()
    # The change listener (SSUBSCRIBE) brings the other backend's cache up to date.
    deadline = time.monotonic() + 5
    while backend.get_checkpoint() != reader.get_checkpoint() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend.get_checkpoint() == reader.get_checkpoint()
    again = backend.open_run(run_id)
    assert again is not None and again.status is CheckpointStatus.COMPLETED
    return run_id


# -------------------------------------------------------------------------------- ACL


@pytest.fixture(scope="module")
def acl_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    server = LocalRedisServer(binary=redis_server_binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class AclSetup:
    admin: redis.Redis
    user_url: str


@pytest.fixture
def acl(acl_server: LocalRedisServer) -> Iterator[AclSetup]:
    admin = redis.Redis.from_url(acl_server.url)
    admin.flushall()
    admin.function_flush()  # the user must be able to load the library itself
    _set_user(admin, ACL_LINE)
    user_url = acl_server.url.replace("redis://", f"redis://luft:{PASSWORD}@")
    try:
        yield AclSetup(admin, user_url)
    finally:
        admin.acl_deluser("luft")
        admin.close()


def test_acl_lines_match_the_doc() -> None:
    """Every ``ACL SETUSER`` line of the doc is one of those tested here, and each is there."""
    if not _DOC.is_file():
        pytest.skip("docs/security.md is not next to the tests (installed sdist?)")
    documented = {
        line.strip()
        for line in _DOC.read_text(encoding="utf-8").splitlines()
        if line.strip().startswith("ACL SETUSER")
    }
    assert documented == {ACL_LINE, ACL_DURABILITY, ACL_CLUSTER}


def _set_user(client: redis.Redis, *lines: str) -> None:
    for line in lines:
        client.execute_command(*line.replace("CHANGE-ME", PASSWORD).split())  # type: ignore[no-untyped-call]


def test_acl_allows_every_command_the_scripts_call() -> None:
    """Redis checks commands called from Lua against the user: keep the ACL line complete."""
    allowed = {c[1:].lower() for c in ACL_COMMANDS.split()}
    called: dict[str, set[str]] = {}
    for name in SCRIPT_NAMES:
        for command in _CALL.findall(script_source(name)):
            called.setdefault(command.lower(), set()).add(name)
    assert called, "no redis.call found in the scripts"
    missing = {c: sorted(s) for c, s in called.items() if c not in allowed}
    assert not missing, f"add to the ACL line in docs/security.md and this test: {missing}"


def test_acl_user_runs_the_whole_lifecycle(acl: AclSetup) -> None:
    with (
        RedisCheckpointBackend.from_url(acl.user_url) as backend,
        RedisCheckpointBackend.from_url(acl.user_url) as reader,
    ):
        run_id = _lifecycle(backend, reader)
        # the listener's health-check PINGs are allowed: the cache can vouch for itself
        deadline = time.monotonic() + 5
        while not reader.cache_is_fresh and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reader.cache_is_fresh
    assert acl.admin.exists(f"luft:{{{run_id}}}:run") == 1


def _library_names(client: Any) -> set[bytes]:
    listed = client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "luft_*")
    return {entry[b"library_name"] if isinstance(entry, dict) else entry[1] for entry in listed}


def test_acl_user_loads_the_library_itself(acl: AclSetup) -> None:
    """The library is not on the server: the user's first call loads it (+function|load)."""
    assert _library_names(acl.admin) == set()
    with RedisCheckpointBackend.from_url(acl.user_url, watch=False) as backend:
        backend.init_run(uuid.uuid4(), "t", "/d")
    assert _library_names(acl.admin) == {library().name.encode()}


def test_acl_user_runs_the_asyncio_front_end(acl: AclSetup) -> None:
    async def main() -> None:
        backend = AsyncRedisCheckpointBackend.from_url(acl.user_url)
        reader = AsyncRedisCheckpointBackend.from_url(acl.user_url)
        try:
            run_id, agent = uuid.uuid4(), uuid.uuid4()
            await backend.init_run(run_id, "async", "/d")
            await backend.append_event(AgentStarted(run_id=run_id, phase_id=0, agent_id=agent,
                                                    prompt_preview="p", model="m"))  # fmt: skip
            cp = await reader.open_run(run_id)
            assert cp is not None and cp.status is CheckpointStatus.RUNNING
            await reader.cancel()
            assert [e.TYPE for e in await reader.get_event_log()] == ["agent_started"]
            assert await backend.delete_run(run_id)
        finally:
            await backend.aclose()
            await reader.aclose()

    asyncio.run(main())


@pytest.fixture
def replicated_acl(redis_server_binary: str) -> Iterator[tuple[AclSetup, LocalRedisServer]]:
    """A primary with the documented user (plus the durability line) and one replica."""
    primary = LocalRedisServer(binary=redis_server_binary).start()
    replica = None
    try:
        replica = LocalRedisServer(
            binary=redis_server_binary, extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
        ).start()
        admin = redis.Redis.from_url(primary.url)
        deadline = time.monotonic() + 10
        while admin.info("replication").get("connected_slaves", 0) < 1:
            assert time.monotonic() < deadline, "the replica did not connect"
            time.sleep(0.05)
        _set_user(admin, ACL_LINE, ACL_DURABILITY)
        user_url = primary.url.replace("redis://", f"redis://luft:{PASSWORD}@")
        yield AclSetup(admin, user_url), replica
        admin.close()
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()


def test_acl_user_with_durability(
    replicated_acl: tuple[AclSetup, LocalRedisServer],
) -> None:
    """The documented line plus ``+wait`` carries durable writes: FCALL and WAIT in one
    pipeline, nothing else (no SCRIPT EXISTS/LOAD the line does not allow)."""
    acl, replica = replicated_acl
    durable = Durability(replicas=1, timeout_ms=5000)
    acl.admin.config_resetstat()
    with (
        RedisCheckpointBackend.from_url(acl.user_url, durability=durable) as backend,
        RedisCheckpointBackend.from_url(acl.user_url, durability=durable) as reader,
    ):
        run_id = _lifecycle(backend, reader)  # NotDurableError would fail it
    stats = acl.admin.info("commandstats")
    assert stats["cmdstat_wait"]["calls"] >= 8
    assert not [name for name in stats if name.startswith(("cmdstat_script", "cmdstat_eval"))]
    with redis.Redis.from_url(replica.url) as on_replica:
        assert on_replica.hget(f"luft:{{{run_id}}}:run", "status") == b"completed"
        assert _library_names(on_replica) == {library().name.encode()}


def test_acl_without_wait_refuses_durability_as_a_typed_error(acl: AclSetup) -> None:
    """The base line alone does not allow WAIT: a durable write says so (the doc's reason for
    the extra line), and its script was applied before the WAIT was refused."""
    run_id = uuid.uuid4()
    with (
        RedisCheckpointBackend.from_url(acl.user_url, durability=Durability()) as backend,
        pytest.raises(LuftRedisError, match=r"(?i)wait|permission"),
    ):
        backend.init_run(run_id, "t", "/d")
    assert acl.admin.exists(f"luft:{{{run_id}}}:run") == 1


@pytest.mark.cluster
def test_acl_user_on_cluster(redis_cluster: LocalRedisCluster) -> None:
    """The documented line plus the cluster line, set on every node, runs the lifecycle on a
    RedisCluster client; the user loads the library on every primary itself."""
    admins = [redis.Redis(host=h, port=p) for h, p in redis_cluster.startup_nodes]
    try:
        for admin in admins:
            admin.function_flush()
            _set_user(admin, ACL_LINE, ACL_CLUSTER)
        host, port = redis_cluster.startup_nodes[0]
        url = f"redis://luft:{PASSWORD}@{host}:{port}/0"
        with (
            RedisCheckpointBackend.from_url(url, cluster=True) as backend,
            RedisCheckpointBackend.from_url(url, cluster=True) as reader,
        ):
            _lifecycle(backend, reader)
        for admin in admins:
            if admin.info("replication")["role"] == "master":
                assert _library_names(admin) == {library().name.encode()}
    finally:
        for admin in admins:
            admin.acl_deluser("luft")
            admin.close()


def test_acl_user_cli_runs_and_show(acl: AclSetup, capsys: pytest.CaptureFixture[str]) -> None:
    with (
        RedisCheckpointBackend.from_url(acl.user_url) as backend,
        RedisCheckpointBackend.from_url(acl.user_url) as reader,
    ):
        run_id = _lifecycle(backend, reader)
    assert cli.main(["runs", "--redis", acl.user_url]) == 0
    assert str(run_id) in capsys.readouterr().out
    assert cli.main(["show", str(run_id), "--redis", acl.user_url]) == 0
    assert '"run_done"' in capsys.readouterr().out
    # The user may not read the server's configuration: the doctor says "unknown".
    report = check_server(redis.Redis.from_url(acl.user_url))
    assert {c.level for c in report.checks} == {"unknown"}


def test_acl_user_cannot_touch_other_keys(acl: AclSetup) -> None:
    acl.admin.set("other:secret", b"top")
    with redis.Redis.from_url(acl.user_url) as client:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.acl_whoami()  # not even that
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get("other:secret")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("other:new", b"x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.hgetall("other:{x}:run")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.flushall()
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.eval("return redis.call('GET', KEYS[1])", 1, "other:secret")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.keys("*")
        # A backend under another prefix is refused by Redis, as a luft error.
        other = RedisCheckpointBackend(client, prefix="other")
        with pytest.raises(LuftRedisError, match=r"(?i)permission"):
            other.init_run(uuid.uuid4(), "t", "/d")
    assert acl.admin.get("other:secret") == b"top"
    assert acl.admin.keys("other:*") == [b"other:secret"]


def test_wrong_password_is_an_authentication_error(
    acl: AclSetup, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = acl.user_url.replace(PASSWORD, "wrong")
    for watch in (True, False):
        with RedisCheckpointBackend.from_url(bad, watch=watch) as backend, pytest.raises(
            AuthenticationError, match="credentials"
        ):
            backend.init_run(uuid.uuid4(), "t", "/d")
    assert cli.main(["runs", "--redis", bad]) == cli.EXIT_REFUSED
    captured = capsys.readouterr()
    assert "wrong" not in captured.err and "Traceback" not in captured.err
    assert "refused" in captured.err and "unreachable" not in captured.err


def _stat(admin: redis.Redis, section: str, name: str) -> int:
    """A counter of INFO ``section`` (0 when Redis has not counted it yet)."""
    info = admin.info(section)
    value = info.get(name, 0)
    return int(value["count"] if isinstance(value, dict) else value)


@pytest.mark.parametrize("watch", [True, False])
def test_noperm_on_the_prefix_is_a_typed_error_at_once(acl: AclSetup, watch: bool) -> None:
    """An ACL whose key/channel pattern does not cover the prefix: PermissionDeniedError naming
    the prefix and the command, on the first attempt (no retry, no 2 s subscription wait)."""
    denied_before = _stat(acl.admin, "errorstats", "errorstat_NOPERM")
    with (
        RedisCheckpointBackend.from_url(acl.user_url, prefix="other", watch=watch) as backend,
        pytest.raises(PermissionDeniedError) as info,
    ):
        backend.open_run(uuid.uuid4())
    assert info.value.prefix == "other" and "'other'" in str(info.value)
    assert info.value.command == ("SSUBSCRIBE" if watch else "FCALL (a luft-redis function)")
    assert isinstance(info.value.__cause__, redis.exceptions.NoPermissionError)
    if not watch:  # exactly one refused command: never retried
        assert _stat(acl.admin, "errorstats", "errorstat_NOPERM") == denied_before + 1
    assert acl.admin.keys("other:*") == []


@pytest.mark.parametrize("watch", [True, False])
def test_noperm_on_the_prefix_is_a_typed_error_at_once_asyncio(acl: AclSetup, watch: bool) -> None:
    async def main() -> PermissionDeniedError:
        backend = AsyncRedisCheckpointBackend.from_url(acl.user_url, prefix="other", watch=watch)
        try:
            with pytest.raises(PermissionDeniedError) as info:
                await backend.open_run(uuid.uuid4())
            return info.value
        finally:
            await backend.aclose()

    denied = asyncio.run(main())
    assert denied.prefix == "other"
    assert denied.command == ("SSUBSCRIBE" if watch else "FCALL (a luft-redis function)")


@pytest.fixture(scope="module")
def password_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    server = LocalRedisServer(binary=redis_server_binary, extra_args=["--requirepass", PASSWORD])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_missing_password_is_said_plainly_and_not_retried(
    password_server: LocalRedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = redis.Redis.from_url(password_server.url, password=PASSWORD)
    try:
        before = _stat(admin, "stats", "total_connections_received")
        with (
            RedisCheckpointBackend.from_url(password_server.url, watch=False) as backend,
            pytest.raises(AuthenticationError) as info,
        ):
            backend.init_run(uuid.uuid4(), "t", "/d")
        text = str(info.value)
        assert "password" in text and "HELLO" not in text and "NOAUTH" not in text
        # one connection, one refused command: the policy did not retry it
        assert _stat(admin, "stats", "total_connections_received") == before + 1
        assert admin.dbsize() == 0
    finally:
        admin.close()
    assert cli.main(["runs", "--redis", password_server.url]) == cli.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "password" in err and "HELLO" not in err and "Traceback" not in err


# -------------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def _openssl(openssl: str, *args: str, cwd: Path) -> None:
    result = subprocess.run(
        [openssl, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"openssl {' '.join(args)} failed:\n{result.stderr}"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A throw-away CA and a server certificate for 127.0.0.1 (openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        if _in_ci():
            pytest.fail("openssl not found; CI is set, so this is an error", pytrace=False)
        pytest.skip("openssl not found")
    d = tmp_path_factory.mktemp("tls")
    _openssl(
        openssl,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=luft-redis test CA",
        cwd=d,
    )
    _openssl(
        openssl,
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
        cwd=d,
    )
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n", encoding="utf-8")
    _openssl(
        openssl,
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
        cwd=d,
    )
    return Certs(ca=d / "ca.crt", cert=d / "server.crt", key=d / "server.key")


@pytest.fixture(scope="module")
def tls_server(
    redis_server_binary: str, certs: Certs, server_lacks: Callable[[str, str], None]
) -> Iterator[LocalRedisServer]:
    """A redis-server that speaks TLS only (--port 0)."""
    port = find_free_port()
    server = LocalRedisServer(
        port=port,
        binary=redis_server_binary,
        extra_args=[
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--tls-cert-file",
            str(certs.cert),
            "--tls-key-file",
            str(certs.key),
            "--tls-ca-cert-file",
            str(certs.ca),
            "--tls-auth-clients",
            "no",
        ],
    )
    try:
        server.start()
    except RuntimeError as exc:
        lines = [line for line in str(exc).splitlines() if "tls support" in line.lower()]
        if lines:  # the server's log: "Failed finding TLS support."
            server_lacks("TLS", lines[-1].split("# ", 1)[-1].strip())
        raise
    try:
        yield server
    finally:
        server.stop()


def _tls_url(server: LocalRedisServer) -> str:
    return f"rediss://127.0.0.1:{server.port}/0"


def test_tls_lifecycle(tls_server: LocalRedisServer, certs: Certs) -> None:
    url = _tls_url(tls_server)
    with (
        RedisCheckpointBackend.from_url(url, ssl_ca_certs=str(certs.ca)) as backend,
        RedisCheckpointBackend.from_url(url, ssl_ca_certs=str(certs.ca)) as reader,
    ):
        run_id = _lifecycle(backend, reader)
        assert run_id in backend.list_runs()


@pytest.mark.parametrize("watch", [True, False])
def test_tls_refuses_an_unverified_server(
    tls_server: LocalRedisServer, watch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the CA the server's certificate does not verify: no silent fallback, a TLSError
    at once (never retried: the retry policy logs every retry, and logged none)."""
    caplog.set_level(logging.INFO, logger="luft_redis.retry")
    with (
        RedisCheckpointBackend.from_url(_tls_url(tls_server), watch=watch) as backend,
        pytest.raises(TLSError, match=r"(?i)certificate"),
    ):
        backend.init_run(uuid.uuid4(), "t", "/d")
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_tls_port_refuses_plain_tcp(tls_server: LocalRedisServer) -> None:
    with (
        RedisCheckpointBackend.from_url(
            f"redis://127.0.0.1:{tls_server.port}/0", socket_timeout=2, socket_connect_timeout=2
        ) as backend,
        pytest.raises(LuftRedisError),
    ):
        backend.init_run(uuid.uuid4(), "t", "/d")


def test_tls_cli_doctor(
    tls_server: LocalRedisServer, certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _tls_url(tls_server)
    # Reachable over TLS (no persistence on this test server: unsafe, exit 1, not 2).
    assert cli.main(["doctor", "--redis", url, "--tls-ca-cert", str(certs.ca)]) == 1
    assert "persistence" in capsys.readouterr().out
    assert cli.main(["doctor", "--redis", url]) == cli.EXIT_REFUSED  # certificate not trusted
    assert "TLS" in capsys.readouterr().err


# ------------------------------------------- every option the base ACL line claims to cover


def _finished_run(backend: RedisCheckpointBackend, task: str = "done") -> uuid.UUID:
    run_id = uuid.uuid4()
    backend.init_run(run_id, task, "/d")
    started = AgentStarted(
        run_id=run_id, phase_id=0, agent_id=uuid.uuid4(), prompt_preview="p", model="m"
    )
    backend.append_event(started)
    backend.append_event(RunDone(run_id=run_id, status=RunStatus.COMPLETED,
                                 total_tokens=TokenUsage()))  # fmt: skip
    return run_id


def test_acl_user_with_retention(acl: AclSetup) -> None:
    """``max_events=`` trims the log (XTRIM) and ``expire_finished_after=`` sets TTLs on every
    key of a finished run (PEXPIRE), as the base line's user."""
    with RedisCheckpointBackend.from_url(
        acl.user_url, max_events=3, expire_finished_after=dt.timedelta(hours=1)
    ) as backend:
        run_id = uuid.uuid4()
        backend.init_run(run_id, "retained", "/d")
        agent = uuid.uuid4()
        started = AgentStarted(run_id=run_id, phase_id=0, agent_id=agent, prompt_preview="p",
                               model="m")  # fmt: skip
        for _ in range(40):
            backend.append_events([started] * 10)
        keys = run_keys("luft", run_id)
        assert acl.admin.pttl(keys.run) == -1  # running: no TTL yet
        # XTRIM MAXLEN ~ drops whole stream nodes: at least max_events stay, not all 400
        assert 3 <= acl.admin.xlen(keys.events) < 400
        assert acl.admin.hget(keys.run, "log_trimmed") == b"1" and backend.log_trimmed
        backend.append_event(RunDone(run_id=run_id, status=RunStatus.COMPLETED,
                                     total_tokens=TokenUsage()))  # fmt: skip
    for key in (keys.run, keys.events):
        assert 0 < acl.admin.pttl(key) <= 3_600_000, key
    assert acl.admin.hget(keys.run, "status") == b"completed"


def test_acl_user_exports_and_imports_a_run_dir(acl: AclSetup, tmp_path: Path) -> None:
    """``export_run_dir`` and ``import_run_dir`` (RENAME of the staged keys) round trip as the
    user; so does ``luft-redis import --replace``."""
    with RedisCheckpointBackend.from_url(acl.user_url, watch=False) as backend:
        run_id = _finished_run(backend, "exported")
        before = backend.get_checkpoint()
        log = backend.get_event_log()
    with redis.Redis.from_url(acl.user_url) as client:
        exported = interop.export_run_dir(client, run_id, tmp_path / "run")
        assert exported.events == 2 and (tmp_path / "run" / "events.jsonl").is_file()
        with RedisCheckpointBackend(client, watch=False) as backend:
            assert backend.delete_run(run_id)
        result = interop.import_run_dir(client, tmp_path / "run", run_dir="/d")
    assert result.run_id == run_id and result.events == 2 and not result.replaced
    assert cli.main(["import", str(tmp_path / "run"), "--replace", "--quiet",
                     "--redis", acl.user_url]) == 0  # fmt: skip
    with RedisCheckpointBackend.from_url(acl.user_url, watch=False) as reader:
        again = reader.open_run(run_id)
        assert again is not None and before is not None
        assert again.status is CheckpointStatus.COMPLETED
        assert again.task == before.task and again.total_tokens == before.total_tokens
        assert reader.get_event_log() == log


def test_acl_user_collects_garbage(acl: AclSetup, capsys: pytest.CaptureFixture[str]) -> None:
    """``collect_garbage`` and ``luft-redis gc`` delete the old finished run (and only it)."""
    with RedisCheckpointBackend.from_url(acl.user_url, watch=False) as backend:
        old, other_old, new = (_finished_run(backend, n) for n in ("old", "old2", "new"))
        running = uuid.uuid4()
        backend.init_run(running, "running", "/d")
    long_ago = int(acl.admin.time()[0]) - 8 * 86400
    for rid in (old, other_old, running):  # aged: the run hash and its run index entry
        acl.admin.hset(run_keys("luft", rid).run, "updated_at", long_ago)
        acl.admin.zadd(run_index_key("luft"), {str(rid): long_ago})
    with redis.Redis.from_url(acl.user_url) as client:
        report = retention.collect_garbage(client, older_than=dt.timedelta(days=7))
    assert set(report.deleted) == {old, other_old} and not report.skipped
    tombstone = tombstone_key("luft", old)  # only the tombstone is left, and it expires
    assert acl.admin.keys(f"luft:{{{old}}}:*") == [tombstone.encode()]
    assert 0 < acl.admin.ttl(tombstone) <= TOMBSTONE_TTL
    assert acl.admin.exists(run_keys("luft", new).run, run_keys("luft", running).run) == 2
    acl.admin.hset(run_keys("luft", new).run, "updated_at", long_ago)
    acl.admin.zadd(run_index_key("luft"), {str(new): long_ago})
    assert cli.main(["gc", "--older-than", "7d", "--redis", acl.user_url]) == 0
    assert str(new) in capsys.readouterr().out
    assert acl.admin.exists(run_keys("luft", new).run) == 0
    assert acl.admin.exists(run_keys("luft", running).run) == 1


def test_acl_user_follows_events(acl: AclSetup, capsys: pytest.CaptureFixture[str]) -> None:
    """``iter_events(follow=True)`` and ``luft-redis events --follow`` (XREAD BLOCK) get an
    event appended while they wait."""
    with (
        RedisCheckpointBackend.from_url(acl.user_url, watch=False) as writer,
        RedisCheckpointBackend.from_url(acl.user_url, watch=False) as follower,
    ):
        run_id = uuid.uuid4()
        writer.init_run(run_id, "followed", "/d")
        follower.open_run(run_id)
        entries = follower.iter_events("$", follow=True, timeout=30, block_ms=200)
        agent = uuid.uuid4()
        later = threading.Timer(0.3, lambda: writer.append_event(AgentStarted(
            run_id=run_id, phase_id=0, agent_id=agent, prompt_preview="p", model="m")))  # fmt: skip
        later.start()
        try:
            first = next(iter(entries))
        finally:
            later.join()
        assert first[1].TYPE == "agent_started" and first[1].agent_id == agent  # type: ignore[attr-defined]

        done = threading.Timer(0.3, lambda: writer.append_event(RunDone(
            run_id=run_id, status=RunStatus.COMPLETED, total_tokens=TokenUsage())))  # fmt: skip
        done.start()
        try:  # ends at the run's run_done
            code = cli.main(["events", str(run_id), "--follow", "--json", "--redis", acl.user_url])
        finally:
            done.join()
    assert code == 0
    out = capsys.readouterr().out
    assert '"agent_started"' in out and '"run_done"' in out


def test_acl_user_lists_and_rebuilds_the_run_index(
    acl: AclSetup, capsys: pytest.CaptureFixture[str]
) -> None:
    """``luft-redis runs`` lists the run; ``runs --rebuild-index`` (SCAN, ZADD) rebuilds a lost
    index, as the user."""
    with RedisCheckpointBackend.from_url(acl.user_url, watch=False) as backend:
        run_id = _finished_run(backend, "indexed")
    assert cli.main(["runs", "--json", "--redis", acl.user_url]) == 0
    assert str(run_id) in capsys.readouterr().out
    acl.admin.delete(run_index_key("luft"))
    assert cli.main(["runs", "--rebuild-index", "--redis", acl.user_url]) == 0
    capsys.readouterr()
    assert acl.admin.zscore(run_index_key("luft"), str(run_id)) is not None
    assert cli.main(["runs", "--status", "completed", "--redis", acl.user_url]) == 0
    assert str(run_id) in capsys.readouterr().out


def test_acl_user_doctor_says_unknown(acl: AclSetup, capsys: pytest.CaptureFixture[str]) -> None:
    """``luft-redis doctor`` as the user: no crash, every check it cannot read is "unknown"
    (docs/security.md: run it as an administrator)."""
    code = cli.main(["doctor", "--redis", acl.user_url])
    out = capsys.readouterr().out
    assert "unknown" in out and "Traceback" not in out
    report = check_server(redis.Redis.from_url(acl.user_url))
    assert code == (cli.EXIT_OK if report.ok else cli.EXIT_FAILURE)
