"""The fleet demo (``luft-redis demo``), run in-process with short agent durations.

``main`` spawns its worker processes; each test runs it against one kind of embedded server and
checks that it exits 0 after the crash and the resume (the demo verifies the run's invariants
itself and fails loudly when one does not hold).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time

import pytest
import redis

from luft_redis.tools import demo
from luft_redis.tools.server import find_redis_server

pytestmark = pytest.mark.timeout(120)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    code = demo.main(argv)
    out, err = capsys.readouterr()
    return code, out + err, time.monotonic() - started


def _check_crash_and_resume(code: int, text: str) -> None:
    assert code == 0, text
    assert "CRASH: killed worker" in text
    assert "SIGKILL" in text
    assert "RESUME: a fresh backend" in text
    assert "reset_status_to_running" in text
    assert "invariants hold" in text
    assert "Summary" in text and ": completed" in text
    # phases are numbered by their phase_id, as `show` and `events` print them
    assert "phase 0 'discover' (phases 0-2)" in text and "phase 3" not in text
    _check_phase_done_lines(text)
    assert "follow it from another terminal: luft-redis --redis redis://" in text


_STARTED = re.compile(r"phase (\d+) '[^']*' \(phases 0-(\d+)\)")
_DONE = re.compile(r"phase (\d+) done(?P<again> again \(the resume re-opened it\))?:")
_REQUEUED = re.compile(r"surviving workers: (.*) \(\d+ interrupted by the crash")


def _check_phase_done_lines(text: str) -> None:
    """Each phase says "phase N done:" exactly once (issue 10: it was printed twice); a phase
    the resume re-opened (an earlier phase with a re-queued agent) also says "phase N done
    again (...)" exactly once, after the resume; no other phase says "again"."""
    lines = text.splitlines()
    started = [(i, int(m[1]), int(m[2])) for i, line in enumerate(lines)
               if (m := _STARTED.search(line))]  # fmt: skip
    assert started, text
    phases = started[0][2] + 1
    resume = next((i for i, line in enumerate(lines) if "RESUME:" in line), None)
    reopened: set[int] = set()
    if resume is not None:
        current = max(p for i, p, _ in started if i < resume)  # the phase the crash hit
        requeued = next((m for line in lines[resume:] if (m := _REQUEUED.search(line))), None)
        assert requeued is not None, text
        names = [] if requeued[1] == "none" else requeued[1].split(", ")
        reopened = {demo.ROLES.index(n.rsplit("-", 1)[0]) for n in names} - {current}
        assert all(q < current for q in reopened), (reopened, current)
    done: dict[int, int] = {}
    again: dict[int, int] = {}
    for i, line in enumerate(lines):
        m = _DONE.search(line)
        if m is None:
            continue
        if m["again"]:
            assert resume is not None and i > resume, line
            again[int(m[1])] = again.get(int(m[1]), 0) + 1
        else:
            done[int(m[1])] = done.get(int(m[1]), 0) + 1
    assert done == dict.fromkeys(range(phases), 1), text
    assert again == dict.fromkeys(reopened, 1), text


@pytest.mark.server
def test_demo_embedded_redis_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if find_redis_server() is None:
        pytest.skip("redis-server not found")
    monkeypatch.delenv(demo.FAKEREDIS_ENV, raising=False)
    code, text, took = _run(["--fast", "--workers", "3", "--agents", "6"], capsys)
    _check_crash_and_resume(code, text)
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
    _check_crash_and_resume(code, text)
    assert "embedded fakeredis" in text and "NOT durable" in text
    assert "redis-cli" not in text and "ends with the demo" in text
    assert took < 60, took


def test_demo_fakeredis_no_crash(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = _run(["--fast", "--fakeredis", "--no-crash", "--phases", "2",
                          "--agents", "4", "--workers", "2"], capsys)  # fmt: skip
    assert code == 0, text
    assert "CRASH" not in text and "crash     none" in text
    assert "RESUME" not in text and " again " not in text
    _check_phase_done_lines(text)  # a run not resumed: one "phase N done:" per phase


def test_demo_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--workers", "1"]) == 2
    assert "at least 2 workers" in capsys.readouterr().err
    assert demo.main(["--agents", "0"]) == 2


def test_demo_unreachable_redis(capsys: pytest.CaptureFixture[str]) -> None:
    from luft_redis.tools.server import find_free_port

    code = demo.main(["--fast", "--redis", f"redis://127.0.0.1:{find_free_port()}/0"])
    assert code == 1
    assert "FAILED" in capsys.readouterr().err
