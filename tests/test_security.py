"""Security setups: a least-privilege ACL user and a TLS-only server (docs/security.md).

Both start their own private redis-server. The TLS tests make a throw-away CA and server
certificate with the ``openssl`` binary; without it they are skipped, except under CI.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from luft_redis import (
    AgentDone,
    AgentResultCache,
    AgentSessionCheckpoint,
    AgentStarted,
    AgentStatus,
    CheckpointStatus,
    Finding,
    LuftRedisError,
    RedisCheckpointBackend,
    RunDone,
    RunStatus,
    Severity,
    TokenUsage,
)
from luft_redis.scripts import SCRIPT_NAMES, script_source
from luft_redis.tools import cli
from luft_redis.tools.doctor import check_server
from luft_redis.tools.server import LocalRedisServer, find_free_port

pytestmark = pytest.mark.server

#: The commands of the least-privilege user, exactly as in docs/security.md.
ACL_COMMANDS = (
    "+evalsha +script|load +xrange +xrevrange +xlen +scan +time +hgetall +hmget +hget +hset "
    "+hsetnx +hdel +hexists +hlen +del +exists +type +lrange +lrem +rpush +xadd "
    "+spublish +ssubscribe +sunsubscribe +ping +xread +zadd +zrem +zcard +zrange "
    "+zrevrangebyscore"
)
ACL_LINE = f"ACL SETUSER luft on >CHANGE-ME ~luft:* resetchannels &luft:* -@all {ACL_COMMANDS}"
PASSWORD = "s3cret-for-tests"

_DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"
_CALL = re.compile(r"""redis\.p?call\(\s*['"]([A-Za-z]+)['"]""")


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
    reader.append_event(
        RunDone(
            run_id=run_id, status=RunStatus.COMPLETED, total_tokens=TokenUsage(input=30, output=12)
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
    admin.script_flush()  # the user must be able to load the scripts itself
    admin.execute_command(*ACL_LINE.replace("CHANGE-ME", PASSWORD).split())  # type: ignore[no-untyped-call]
    user_url = acl_server.url.replace("redis://", f"redis://luft:{PASSWORD}@")
    try:
        yield AclSetup(admin, user_url)
    finally:
        admin.acl_deluser("luft")
        admin.close()


def test_acl_line_matches_the_doc() -> None:
    if not _DOC.is_file():
        pytest.skip("docs/security.md is not next to the tests (installed sdist?)")
    assert ACL_LINE in _DOC.read_text(encoding="utf-8")


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


def test_wrong_password_is_a_connection_error(
    acl: AclSetup, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = acl.user_url.replace(PASSWORD, "wrong")
    with RedisCheckpointBackend.from_url(bad) as backend, pytest.raises(LuftRedisError):
        backend.init_run(uuid.uuid4(), "t", "/d")
    assert cli.main(["runs", "--redis", bad]) == 1  # refused credentials, not unreachable
    captured = capsys.readouterr()
    assert "wrong" not in captured.err and "Traceback" not in captured.err
    assert "refused the credentials" in captured.err


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
def tls_server(redis_server_binary: str, certs: Certs) -> Iterator[LocalRedisServer]:
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
        if "tls" in str(exc).lower() and not _in_ci():
            pytest.skip(f"this redis-server has no TLS support: {exc}")
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


def test_tls_refuses_an_unverified_server(tls_server: LocalRedisServer) -> None:
    """Without the CA the server's certificate does not verify: no silent fallback."""
    with (
        RedisCheckpointBackend.from_url(_tls_url(tls_server)) as backend,
        pytest.raises(LuftRedisError),
    ):
        backend.init_run(uuid.uuid4(), "t", "/d")


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
    assert cli.main(["doctor", "--redis", url]) == 2  # certificate not trusted
    assert "cannot reach Redis" in capsys.readouterr().err
