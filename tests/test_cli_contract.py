"""The CLI keeps its word (issue 26 §3): exit 2 for an unreachable server (or one that is not
Redis, or a port taken), 3 for a refused client, one line on stderr and never a traceback;
a reader that stops reading ends a command quietly; every ``--json`` is JSON lines.

Every test runs the installed command (``python -m luft_redis``) as a subprocess against
private servers started here.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from luft_redis import (
    AgentStarted,
    AgentTask,
    Log,
    LogLevel,
    RedisCheckpointBackend,
)
from luft_redis.keys import run_keys
from luft_redis.tools.cli_common import server_failure
from luft_redis.tools.server import LOOPBACK, LocalRedisServer, find_free_port
from luft_redis.tools.web.hub import redis_problem

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]

PASSWORD = "s3cret-Pass"


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "luft_redis", *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LUFT_REDIS_URL"}


def luft(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(*args), capture_output=True, text=True, env=_env(),
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)  # fmt: skip


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def big_run(redis_url: str) -> uuid.UUID:
    """A run whose log, event list and task list each print well over a pipe's 64 KiB."""
    run_id = uuid.uuid4()
    with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
        backend.init_run(run_id, "a run with a long log", "/d")
        for start in range(0, 3000, 500):
            backend.append_events([Log(run_id=run_id, agent_id=None, level=LogLevel.INFO,
                                       msg=f"line {i} " + "x" * 100)
                                   for i in range(start, start + 500)])  # fmt: skip
        backend.submit_agents([AgentTask(uuid.uuid4(), 0, {"prompt": "p" * 300})
                               for _ in range(400)])  # fmt: skip
    return run_id


@pytest.mark.parametrize(
    "args",
    [("events", "{run}"), ("events", "{run}", "--json"), ("show", "{run}", "--events", "3000"),
     ("agents", "{run}", "--json"), ("agents", "{run}"), ("runs", "--json", "--limit", "1000")],
    ids=lambda a: " ".join(a).replace("{run}", "RUN"),
)  # fmt: skip
def test_a_reader_that_stops_reading_ends_the_command_quietly(
    redis_url: str, big_run: uuid.UUID, args: tuple[str, ...]
) -> None:
    """``luft-redis ... | head -1``: the command's next write meets a closed pipe; it stops
    with exit 0 and prints nothing on stderr (no BrokenPipeError traceback)."""
    if args[0] == "runs":  # enough runs for 64 KiB of rows
        with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
            for i in range(400):
                backend.init_run(uuid.uuid4(), f"run {i} " + "t" * 150, "/d")
    argv = [a.replace("{run}", str(big_run)) for a in args]
    proc = subprocess.Popen(_command("--redis", redis_url, *argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    assert first, proc.stderr.read()
    proc.stdout.close()  # as `head -1` exits
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == "" or "note:" in err or "agent task(s)" in err, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_a_reader_that_stops_reading_ends_the_demo_quietly(redis_url: str) -> None:
    """``luft-redis demo | head``: the demo, too, goes through the one closed-stdout rule (it
    reported "FAILED: BrokenPipeError", exit 1); its run is cleaned up as after any stop."""
    proc = subprocess.Popen(_command("demo", "--redis", redis_url, "--fast", "--no-crash",
                                     "--workers", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=_env())  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    run_id = None
    while run_id is None and (line := proc.stdout.readline().decode()):
        found = re.search(r"\brun ([0-9a-f-]{36}):", line)
        run_id = found[1] if found else None
    assert run_id is not None, proc.stderr.read()
    proc.stdout.close()  # as `head` exits
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=90) == 0, err
    assert err == "", err
    with redis.Redis.from_url(redis_url) as client:
        assert not client.exists(run_keys("luft", uuid.UUID(run_id)).run)


@pytest.fixture
def http_port() -> Iterator[int]:
    """An HTTP server (not Redis) on a free loopback port."""
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "command",
    [["doctor"], ["runs"], ["show", "{run}"], ["export", "{run}", "-o", "{dir}"],
     ["--cluster", "runs"], ["--cluster", "doctor"], ["demo", "--fast"]],
    ids=lambda c: " ".join(c).replace("{run}", "RUN").replace("{dir}", "DIR"),
)  # fmt: skip
def test_a_server_that_is_not_redis_exits_2_in_one_line(
    http_port: int, command: list[str], tmp_path: Path
) -> None:
    """Whichever client meets it (the commands' own, interop's, a cluster client, the demo's),
    the one rule names it (export said "Redis error: Protocol error", exit 1; a cluster client
    "cannot reach"; the demo "answered PING with an error", exit 1)."""
    argv = [a.replace("{run}", str(uuid.uuid4())).replace("{dir}", str(tmp_path / "out"))
            for a in command]  # fmt: skip
    result = luft("--redis", f"redis://{LOOPBACK}:{http_port}/0", *argv)
    assert result.returncode == 2, result
    line = _one_line(result.stderr)
    assert f"redis://{LOOPBACK}:{http_port}/0 is not a Redis server" in line
    assert "UNKNOWN" not in result.stdout


def test_a_closed_connection_is_told_apart_by_one_raw_ping(http_port: int, redis_url: str) -> None:
    """redis-py 8.0 (the lowest the pyproject allows) says "Connection closed by server" where
    8.2 says "Protocol error": server_failure then asks the port itself, whoever's client
    (connect, interop, the demo) met it."""
    closed = redis.ConnectionError("Connection closed by server.")
    failure = server_failure(f"redis://{LOOPBACK}:{http_port}/0", closed)
    assert failure is not None and failure.code == 2
    assert str(failure).startswith(f"redis://{LOOPBACK}:{http_port}/0 is not a Redis server")
    failure = server_failure(redis_url, closed)  # a Redis that answers RESP: unreachable
    assert failure is not None and failure.code == 2
    assert str(failure).startswith(f"cannot reach Redis at {redis_url}")
    assert server_failure(redis_url, redis.AuthenticationError("WRONGPASS")) is None  # exit 3


def test_web_on_a_port_in_use_exits_2_in_one_line(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = luft("web", "--redis", redis_url, "--port", str(port), timeout=30)
    assert result.returncode == 2, result
    line = _one_line(result.stderr)
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in line


@pytest.fixture
def password_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    server = LocalRedisServer(binary=redis_server_binary, extra_args=["--requirepass", PASSWORD])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_web_with_a_wrong_password_is_refused_at_start(password_server: LocalRedisServer) -> None:
    url = f"redis://:wrong@{LOOPBACK}:{password_server.port}/0"
    result = luft("web", "--redis", url, "--port", str(find_free_port()), timeout=30)
    assert result.returncode == 3, result
    line = _one_line(result.stderr)
    assert "refused" in line and "wrong" not in line  # the password is never printed
    assert "serving" not in result.stdout


def test_the_web_view_says_refused_not_unreachable_and_one_period() -> None:
    refused = redis_problem(redis.AuthenticationError(
        "invalid username-password pair or user is disabled."))  # fmt: skip
    assert refused == ("Redis refused the web view's client: invalid username-password pair "
                       "or user is disabled")  # fmt: skip
    away = redis_problem(redis.ConnectionError("Connection refused."))
    assert away == "Redis is unreachable: Connection refused"


def _get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=10) as response:
        return json.loads(response.read())


def test_the_run_page_says_refused_when_the_password_changes_later(
    password_server: LocalRedisServer,
) -> None:
    """The web view started with the right password; then the server's password changes and
    its connections are cut. The run page's live state (its banner) says Redis refused the
    web view's client, one period; it said "Redis is unreachable (...disabled.)"."""
    url = f"redis://:{PASSWORD}@{LOOPBACK}:{password_server.port}/0"
    run_id = uuid.uuid4()
    with RedisCheckpointBackend.from_url(url, watch=False) as backend:
        backend.init_run(run_id, "the password changes", "/d")
    port = find_free_port()
    proc = subprocess.Popen(_command("web", "--redis", url, "--port", str(port)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env=_env())  # fmt: skip
    try:
        assert proc.stdout is not None and "open http" in proc.stdout.readline()
        assert _get_json(port, f"/api/runs/{run_id}")["view"]["redis_ok"]  # its hub lingers
        with redis.Redis.from_url(url) as admin:
            admin.config_set("requirepass", "another-Pass")
            for kind in ("normal", "pubsub"):  # the web view's connections, not this one
                admin.client_kill_filter(_type=kind, skipme=True)
        deadline = time.monotonic() + 20
        view = _get_json(port, f"/api/runs/{run_id}")["view"]
        while "disabled" not in view["redis_error"] and time.monotonic() < deadline:
            time.sleep(0.2)  # first the cut ("Connection closed"), then the refused reconnect
            view = _get_json(port, f"/api/runs/{run_id}")["view"]
        assert not view["redis_ok"]
        assert view["redis_error"] == ("Redis refused the web view's client: invalid "
                                       "username-password pair or user is disabled")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_web_help_names_what_installs_the_extra() -> None:
    """luft-redis is not on PyPI yet: ``pip install 'luft-redis[web]'`` does not work."""
    result = luft("web", "--help")
    assert result.returncode == 0, result.stderr
    assert "pip install '.[web]'" in result.stdout
    assert "luft-redis[web]" not in result.stdout


@pytest.mark.parametrize("command", ["runs", "show", "events", "agents"])
def test_every_json_help_says_json_lines(command: str) -> None:
    text = " ".join(luft(command, "--help").stdout.split())
    assert "JSON lines" in text and "array" not in text, text


def test_events_of_an_imported_run_show_each_events_own_time(
    redis_url: str, tmp_path: Path
) -> None:
    """After ``export`` and ``import --replace`` the log's entries are new (their ids are the
    import's time); each readable line still shows when its event happened."""
    run_id, agent = uuid.uuid4(), uuid.uuid4()
    when = dt.datetime(2021, 3, 4, 5, 6, 7, 890000, tzinfo=dt.UTC)
    with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
        backend.init_run(run_id, "imported", "/d")
        backend.append_event(AgentStarted(run_id=run_id, phase_id=0, agent_id=agent,
                                          prompt_preview="p", ts=when))  # fmt: skip
    out = tmp_path / "run"
    assert luft("--redis", redis_url, "export", str(run_id), "-o", str(out)).returncode == 0
    assert luft("--redis", redis_url, "import", str(out), "--replace").returncode == 0
    result = luft("--redis", redis_url, "events", str(run_id))
    assert result.returncode == 0, result.stderr
    (line,) = [ln for ln in result.stdout.splitlines() if "agent_started" in ln]
    assert line.startswith("2021-03-04 05:06:07.890"), line


@pytest.mark.parametrize(
    "args", [("runs", "--json"), ("show", "{run}", "--json"), ("agents", "{run}", "--json"),
             ("events", "{run}", "--json")],
)  # fmt: skip
def test_every_json_output_is_json_lines(redis_url: str, args: tuple[str, ...]) -> None:
    run_id = uuid.uuid4()
    with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
        backend.init_run(run_id, "json lines", "/d")
        backend.submit_agents([AgentTask(uuid.uuid4(), 0, {"i": i}) for i in range(3)])
        backend.append_event(Log(run_id=run_id, agent_id=None, level=LogLevel.INFO, msg="m"))
    result = luft("--redis", redis_url, *[a.replace("{run}", str(run_id)) for a in args])
    assert result.returncode == 0, result.stderr
    values = [json.loads(line) for line in result.stdout.splitlines()]
    assert values and all(isinstance(v, dict) for v in values)
    if args[0] == "agents":
        assert len(values) == 3


def test_the_demo_stops_and_keeps_a_run_cancelled_by_another_process(redis_url: str) -> None:
    """``luft-redis cancel RUN`` while ``luft-redis demo`` runs: the demo says the run was
    cancelled by another process, keeps it on the Redis it was given and says how to inspect
    it, stages no crash after, and exits 1."""
    proc = subprocess.Popen(_command("demo", "--redis", redis_url, "--phases", "3", "--agents",
                                     "8", "--workers", "3"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=_env())  # fmt: skip
    assert proc.stdout is not None
    run_id = None
    deadline = time.monotonic() + 60
    while run_id is None and time.monotonic() < deadline:
        found = re.search(r"\brun ([0-9a-f-]{36}):", proc.stdout.readline())
        run_id = found[1] if found else None
    assert run_id is not None
    assert luft("--redis", redis_url, "cancel", run_id).returncode == 0
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, (out, err)
    line = _one_line(err)
    assert "the run was cancelled by another process" in line
    assert f"luft-redis --redis {redis_url} show {run_id}" in out
    assert "CRASH:" not in out and "PAUSE:" not in out
    with redis.Redis.from_url(redis_url) as client:
        assert client.hget(run_keys("luft", uuid.UUID(run_id)).run, "status") == b"cancelled"


def _hooked_demo(redis_url: str, before: str = "pass", after: str = "pass") -> Any:
    """``luft-redis demo`` (2 phases) in a subprocess whose ``Coordinator.run_phase`` runs
    ``before`` and ``after`` phase 1: what another process does at that point, made exact."""
    code = f"""if True:
        import sys
        from luft_redis import RedisCheckpointBackend, errors
        from luft_redis.tools import cli, demo

        run_phase = demo.Coordinator.run_phase

        def cancel(run_id):
            with RedisCheckpointBackend.from_url({redis_url!r}, watch=False) as other:
                other.open_run(run_id)
                other.cancel()

        def hooked(self, p, jobs):
            if p == 1:
                {before}
            run_phase(self, p, jobs)
            if p == 1:
                {after}

        demo.Coordinator.run_phase = hooked
        sys.exit(cli.main(["demo", "--redis", {redis_url!r}, "--phases", "2", "--agents", "4",
                           "--workers", "2", "--fast", "--no-crash"]))
    """
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), stdin=subprocess.DEVNULL, timeout=90)  # fmt: skip


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_demo_notices_a_cancel_between_phases(redis_url: str, when: str) -> None:
    """The windows where the demo does not wait on its workers: the cancel lands just before
    it submits phase 1 (submit_agents refused the cancelled run: a RunNotRunningError
    traceback, and the run was deleted) or after its last phase (it reported "invariants
    violated: status is cancelled", and the run was deleted)."""
    done = _hooked_demo(redis_url, **{when: "cancel(self.run_id)"})
    assert done.returncode == 1, (done.stdout, done.stderr)
    line = _one_line(done.stderr)
    assert "the run was cancelled by another process" in line, line
    run_id = re.search(r"\brun ([0-9a-f-]{36}):", done.stdout)
    assert run_id is not None, done.stdout
    assert f"luft-redis --redis {redis_url} show {run_id[1]}" in done.stdout
    with redis.Redis.from_url(redis_url) as client:
        assert client.hget(run_keys("luft", uuid.UUID(run_id[1])).run, "status") == b"cancelled"


def test_a_library_error_the_demo_does_not_expect_is_one_line(redis_url: str) -> None:
    """Any luft-redis error ends the demo in one line, exit 1, as every command (one it did
    not expect was a traceback)."""
    done = _hooked_demo(redis_url, before="raise errors.CorruptDataError('k', 'f', 'bad')")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert _one_line(done.stderr) == ("luft-redis demo: FAILED: CorruptDataError: corrupt data "
                                      "in k field 'f': bad")  # fmt: skip
