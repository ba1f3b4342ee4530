"""The fleet demo (``luft-redis demo``), run in-process with short agent durations.

``main`` spawns its worker processes; each test runs it against one kind of server and checks
that it exits 0 after the SIGKILLed worker's agent and the SIGSTOPped worker's agent were taken
over and the paused worker's late write was refused, with the summary's counts (the demo also
verifies the run's invariants itself and fails loudly when one does not hold). The error
contract of the CLI holds for the demo too (issue 20): exit 2 unreachable, 3 refused, one line;
``LUFT_REDIS_URL`` honoured; the password masked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from luft_redis.keys import run_keys
from luft_redis.tools import demo
from luft_redis.tools.server import LocalRedisServer, find_free_port, find_redis_server

pytestmark = pytest.mark.timeout(150)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    code = demo.main(argv)
    out, err = capsys.readouterr()
    return code, out + err, time.monotonic() - started


_STARTED = re.compile(r"phase (\d+) '[^']*' \(phases 0-(\d+)\)")
_DONE = re.compile(r"phase (\d+) done\b")
_COUNT = re.compile(r"^  (agents|attempts|takeovers|refused) +(\d+)", re.MULTILINE)


def _counts(text: str) -> dict[str, int]:
    """The summary's counts: agents run, attempts, takeovers, refused zombie writes."""
    return {m[1]: int(m[2]) for m in _COUNT.finditer(text)}


def _check_fleet(code: int, text: str, phases: int, agents: int) -> None:
    """The leases story: a worker SIGKILLed mid-agent, its agent taken over when its lease
    lapsed (the coordinator doing nothing); a worker SIGSTOPped past its lease, its agent
    taken over, then SIGCONTed: its late write refused; every count in the summary."""
    assert code == 0, text
    lines = text.splitlines()

    def first(needle: str, after: int = 0) -> int:
        found = next((i for i in range(after, len(lines)) if needle in lines[i]), None)
        assert found is not None, (needle, text)
        return found

    assert "agents submitted (submit_agents)" in text
    crash = first("CRASH: killed worker")
    assert "SIGKILL" in lines[crash] and "The coordinator does nothing" in lines[crash]
    killed_agent = re.search(r"ran agent (\S+) ", lines[crash])
    assert killed_agent is not None
    takeover = first("TAKEOVER:", crash)
    assert f"claimed agent {killed_agent[1]} (attempt 2" in lines[takeover], lines[takeover]
    assert "after the killed worker" in lines[takeover]
    pause = first("PAUSE: stopped worker", takeover)
    assert "SIGSTOP" in lines[pause]
    paused_agent = re.search(r"ran agent (\S+) \(lease token (\d+)\)", lines[pause])
    assert paused_agent is not None
    takeover2 = first("TAKEOVER:", pause + 1)
    assert f"claimed agent {paused_agent[1]} (attempt 2" in lines[takeover2]
    assert "after the stopped worker" in lines[takeover2]
    woken = first("RESUME: woke worker", takeover2)
    assert "SIGCONT" in lines[woken]
    refused = first("REFUSED:", woken)
    assert "late write refused" in lines[refused] and "LeaseLostError" in lines[refused]
    assert f"agent {paused_agent[1]} with lease token {paused_agent[2]}" in lines[refused]
    assert "nothing was written" in lines[refused]
    assert "reset_status_to_running" not in text  # no resume: the leases did it all
    assert "invariants hold" in text
    assert "Summary" in text and ": completed" in text
    counts = _counts(text)
    assert counts["agents"] == phases * agents, counts
    assert counts["takeovers"] == 2 and counts["refused"] == 1, counts
    # one attempt per agent, one more for the simulated tool error, one per takeover
    assert counts["attempts"] == phases * agents + 1 + 2, counts
    assert "1 simulated tool error(s) retried, 2 lapsed lease(s) taken over" in text
    # phases are numbered by their phase_id, as `show` and `events` print them
    assert f"phase 0 'discover' (phases 0-{phases - 1})" in text
    assert f"phase {phases}" not in text
    _check_phase_done_lines(text)
    assert "follow it from another terminal: luft-redis --redis redis://" in text
    # the run shares the pool with two other users' runs (the default --runs 3), served
    # alongside and completed, each agent once
    assert "pool luft-demo: 3 runs share the workers, this one with weight 2" in text
    assert "the 2 other runs of pool luft-demo completed" in text
    assert re.search(rf"pool +luft-demo: 3 runs; this one \d+ claims \(weight 2\), the others "
                     rf"{agents}, {agents} \(weight 1\), all completed", text), text


def _check_phase_done_lines(text: str) -> None:
    """Each phase says "phase N done:" exactly once, after its own start and before the next
    phase starts (issue 20: "phase 0 done again" was printed in the middle of phase 1)."""
    lines = text.splitlines()
    started = {int(m[1]): i for i, line in enumerate(lines) if (m := _STARTED.search(line))}
    assert started, text
    phases = int(_STARTED.search(text)[2]) + 1  # type: ignore[index]
    assert sorted(started) == list(range(phases)), text
    done: dict[int, list[int]] = {}
    for i, line in enumerate(lines):
        if (m := _DONE.search(line)) is not None:
            done.setdefault(int(m[1]), []).append(i)
    assert sorted(done) == list(range(phases)), text
    for p, where in done.items():
        assert len(where) == 1, (p, text)
        assert started[p] < where[0], (p, text)
        if p + 1 in started:
            assert where[0] < started[p + 1], (p, text)
    assert " again" not in text


@pytest.mark.server
def test_demo_embedded_redis_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if find_redis_server() is None:
        pytest.skip("redis-server not found")
    monkeypatch.delenv(demo.FAKEREDIS_ENV, raising=False)
    code, text, took = _run(["--fast", "--workers", "3", "--agents", "6"], capsys)
    _check_fleet(code, text, 3, 6)
    assert "Started a private redis-server" in text
    assert took < 60, took
    # the server is gone at exit: no redis-cli command that would fail is printed
    assert "redis-cli" not in text and "Run the demo with --keep" in text


@pytest.mark.server
def test_demo_keep_leaves_the_server_and_the_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if find_redis_server() is None:
        pytest.skip("redis-server not found")
    monkeypatch.delenv(demo.FAKEREDIS_ENV, raising=False)
    code, text, _ = _run(["--fast", "--no-crash", "--phases", "1", "--agents", "3",
                          "--workers", "2", "--keep"], capsys)  # fmt: skip
    assert code == 0, text
    url = re.search(r"keeps running on (redis://127\.0\.0\.1:\d+/0)", text)
    run = re.search(r"Run id ([0-9a-f-]{36}), kept on", text)
    assert url is not None and run is not None, text
    client = redis.Redis.from_url(url.group(1))
    try:
        # the printed commands work after the demo: the server and the run are there
        assert f"luft-redis --redis {url.group(1)} show {run.group(1)}" in text
        shown = subprocess.run([sys.executable, "-m", "luft_redis", "--redis", url.group(1),
                                "show", run.group(1), "--json", "--events", "0"],
                               capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["status"] == "completed"
        assert f"luft-redis --redis {url.group(1)} agents {run.group(1)}" in text
        listed = subprocess.run(
            [sys.executable, "-m", "luft_redis", "--redis", url.group(1), "agents",
             run.group(1), "--json"], capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert [row["state"] for row in map(json.loads, listed.stdout.splitlines())] == ["done"] * 3
        # the stop instructions name the data directory the server leaves behind
        workdir = re.search(r" in (/\S+) \(appendonly yes\)", text)
        assert workdir is not None and os.path.isdir(workdir.group(1))
        assert f"It leaves its data directory {workdir.group(1)}" in text
        assert f"rm -r {workdir.group(1)}" in text
        line = next(line for line in text.splitlines() if "HGETALL" in line)
        key = line.split('"')[1]
        assert client.hget(key, "status") == b"completed"
    finally:
        with contextlib.suppress(redis.exceptions.ConnectionError):
            client.shutdown(nosave=True)
        client.close()
        workdir = re.search(r" in (/\S+) \(appendonly yes\)", text)
        if workdir is not None:
            shutil.rmtree(workdir.group(1), ignore_errors=True)


def test_demo_without_fakeredis_is_one_line() -> None:
    code = ("import sys; sys.modules['fakeredis'] = None\n"
            "from luft_redis.tools import demo\n"
            "raise SystemExit(demo.main(['--fakeredis', '--fast']))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'fakeredis[lua]'" in lines[0], result.stderr


def test_demo_fakeredis_fallback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(demo.FAKEREDIS_ENV, "1")
    code, text, took = _run(["--fast", "--workers", "3", "--agents", "6"], capsys)
    _check_fleet(code, text, 3, 6)
    assert "embedded fakeredis" in text and "NOT durable" in text
    assert "redis-cli" not in text and "ends with the demo" in text
    assert took < 60, took


def test_demo_fakeredis_no_crash(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = _run(["--fast", "--fakeredis", "--no-crash", "--phases", "2",
                          "--agents", "4", "--workers", "2"], capsys)  # fmt: skip
    assert code == 0, text
    assert "CRASH" not in text and "crash      none" in text
    assert "PAUSE" not in text and "TAKEOVER" not in text and "REFUSED" not in text
    counts = _counts(text)
    assert counts == {"agents": 8, "attempts": 9, "takeovers": 0, "refused": 0}, counts
    _check_phase_done_lines(text)


def test_demo_alone_in_its_pool(capsys: pytest.CaptureFixture[str]) -> None:
    """``--runs 1``: the workflow's run is the pool's only run."""
    code, text, _ = _run(["--fast", "--fakeredis", "--no-crash", "--phases", "1",
                          "--agents", "3", "--workers", "2", "--runs", "1"], capsys)  # fmt: skip
    assert code == 0, text
    assert "other runs" not in text and "pool       luft-demo" not in text
    assert _counts(text)["agents"] == 3


def test_demo_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--workers", "2"]) == 2
    assert "at least 3 workers" in capsys.readouterr().err
    assert demo.main(["--agents", "0"]) == 2


# ------------------------------------------------------------------------------ issue 20


PASSWORD = "demo-secret-pw"


def _demo(*args: str, env_url: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m luft_redis demo ...`` as a user runs it (LUFT_REDIS_URL only if given)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LUFT_REDIS_URL", demo.FAKEREDIS_ENV)}
    if env_url is not None:
        env["LUFT_REDIS_URL"] = env_url
    return subprocess.run([sys.executable, "-m", "luft_redis", *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env=env, timeout=120,
                          check=False)  # fmt: skip


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def password_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    server = LocalRedisServer(binary=redis_server_binary, extra_args=["--requirepass", PASSWORD])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.server
def test_demo_wrong_password_is_one_line_and_exit_3(password_server: LocalRedisServer) -> None:
    url = f"redis://:wrong@127.0.0.1:{password_server.port}/0"
    for args, env_url in ((("demo", "--fast", "--redis", url), None),
                          (("--redis", url, "demo", "--fast"), None),
                          (("demo", "--fast"), url)):  # fmt: skip
        result = _demo(*args, env_url=env_url)
        assert result.returncode == 3, (args, result.stderr)
        line = _one_line(result.stderr)
        assert line.startswith("luft-redis demo: FAILED: Redis at redis://:***@127.0.0.1:")
        assert "refused this client" in line and "password" in line
        assert "wrong" not in result.stderr + result.stdout  # the password is never printed
        assert "Started a private redis-server" not in result.stdout
    # no password at all for a server that needs one: refused too
    result = _demo("demo", "--fast", "--redis", password_server.url)
    assert result.returncode == 3 and "refused this client" in _one_line(result.stderr)


def test_demo_unreachable_redis_exits_2_like_runs() -> None:
    url = f"redis://127.0.0.1:{find_free_port()}/0"
    for args, env_url in ((("demo", "--fast", "--redis", url), None), (("demo", "--fast"), url)):
        result = _demo(*args, env_url=env_url)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert f"cannot reach Redis at {url}" in _one_line(result.stderr)
        # LUFT_REDIS_URL is honoured: no private server started instead, without a word
        assert "Started a private redis-server" not in result.stdout
        assert "fakeredis" not in result.stdout
    runs = _demo("runs", env_url=url)
    assert runs.returncode == 2  # the same exit code as `runs`, for the same cause
    result = _demo("demo", "--fast", "--redis", "redis://127.0.0.1:notaport/0")
    assert result.returncode == 2 and "bad Redis URL" in _one_line(result.stderr)


@pytest.mark.server
def test_demo_runs_on_luft_redis_url_and_masks_the_password(
    password_server: LocalRedisServer, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    url = f"redis://:{PASSWORD}@127.0.0.1:{password_server.port}/0"
    monkeypatch.setenv("LUFT_REDIS_URL", url)
    monkeypatch.delenv(demo.FAKEREDIS_ENV, raising=False)
    code, text, _ = _run(["--fast", "--no-crash", "--phases", "1", "--agents", "3",
                          "--workers", "2", "--keep"], capsys)  # fmt: skip
    assert code == 0, text
    masked = f"redis://:***@127.0.0.1:{password_server.port}/0"
    assert PASSWORD not in text  # masked everywhere, the watch line included
    assert f"Using the Redis at {masked} (from LUFT_REDIS_URL)" in text
    assert "Started a private redis-server" not in text and "fakeredis" not in text
    watch = next(line for line in text.splitlines() if "follow it from another terminal" in line)
    assert f"luft-redis --redis {masked} watch " in watch and "masked as ***" in watch
    run = re.search(r"Run id ([0-9a-f-]{36}), kept on redis://:\*\*\*@", text)
    assert run is not None, text
    with redis.Redis.from_url(url) as client:  # the run is on the server the variable names
        assert client.hget(run_keys("luft", uuid.UUID(run[1])).run, "status") == b"completed"
    assert f"-p {password_server.port} --askpass HGETALL" in text  # redis-cli asks for it
    # and the printed command works once the password is put back
    shown = _demo("--redis", url, "show", run[1], "--json", "--events", "0")
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "completed"
