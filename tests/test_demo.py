"""The fleet demo (``luft-redis demo``), run in-process with short agent durations.

``main`` spawns its worker processes; each test runs it against one kind of embedded server and
checks that it exits 0 after the crash and the resume (the demo verifies the run's invariants
itself and fails loudly when one does not hold).
"""

from __future__ import annotations

import time

import pytest

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
    assert "redis-cli -p" in text and "HGETALL" in text and "XREVRANGE" in text


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


def test_demo_fakeredis_fallback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(demo.FAKEREDIS_ENV, "1")
    code, text, took = _run(["--fast", "--workers", "3", "--agents", "6"], capsys)
    _check_crash_and_resume(code, text)
    assert "embedded fakeredis" in text and "NOT durable" in text
    assert took < 60, took


def test_demo_fakeredis_no_crash(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = _run(["--fast", "--fakeredis", "--no-crash", "--phases", "1",
                          "--agents", "4", "--workers", "2"], capsys)  # fmt: skip
    assert code == 0, text
    assert "CRASH" not in text and "crash     none" in text


def test_demo_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--workers", "1"]) == 2
    assert "at least 2 workers" in capsys.readouterr().err
    assert demo.main(["--agents", "0"]) == 2


def test_demo_unreachable_redis(capsys: pytest.CaptureFixture[str]) -> None:
    from luft_redis.tools.server import find_free_port

    code = demo.main(["--fast", "--redis", f"redis://127.0.0.1:{find_free_port()}/0"])
    assert code == 1
    assert "FAILED" in capsys.readouterr().err
