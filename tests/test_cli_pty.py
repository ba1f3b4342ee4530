"""``luft-redis watch``, ``events --follow``, ``delete``'s question and the demo's live line, run
as a user runs them: ``python -m luft_redis`` on a pseudo-terminal, against a private
redis-server. ``watch`` and ``events --follow`` are ended by a ``run_done`` that this (another)
process appends."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from luft_redis import (
    AgentDone,
    AgentStarted,
    AgentStatus,
    AgentTask,
    Finding,
    Log,
    LogLevel,
    PhaseStarted,
    RedisCheckpointBackend,
    RunDone,
    RunStatus,
    Severity,
    TokenUsage,
)

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def plain(raw: bytes) -> str:
    """What the terminal got, without escape sequences."""
    return _ANSI.sub("", raw.decode("utf-8", "replace"))


def _controlling_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty (its stdin),
    so that Ctrl-C typed on it sends SIGINT."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    # A SIGINT ignored by the test process (whatever set it) would be inherited through exec,
    # and Python keeps an inherited "ignore": the CLI would never see the Ctrl-C
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_CONTROL = re.compile(r"\r\n|\r|\n|\x1b\[[0-9;?]*[A-Za-z]")


def screen_lines(raw: bytes) -> list[str]:
    """The lines a terminal keeps after ``raw`` (a small emulation: CR, LF, cursor up, erase
    line; other escape sequences ignored): what stays on screen, redraws resolved."""
    lines: list[str] = []
    current: list[str] = []
    col = 0
    text = raw.decode("utf-8", "replace")
    pos = 0
    for match in [*_CONTROL.finditer(text), None]:
        chunk = text[pos : match.start() if match else len(text)]
        for char in chunk:
            if col < len(current):
                current[col] = char
            else:
                current.append(char)
            col += 1
        if match is None:
            break
        pos = match.end()
        token = match.group()
        if token in ("\r\n", "\n"):
            lines.append("".join(current))
            current, col = [], 0
        elif token == "\r":
            col = 0
        elif token.endswith("A"):  # cursor up: back onto the previous line
            for _ in range(int(token[2:-1] or 1)):
                if lines:
                    current, col = list(lines.pop()), 0
        elif token == "\x1b[2K":
            current = []  # col stays: rich follows with a CR or writes from col 0
    if current:
        lines.append("".join(current))
    return [line.rstrip() for line in lines]


class Pty:
    """A ``python -m luft_redis`` process on a pseudo-terminal of ``cols`` columns."""

    def __init__(self, args: list[str], cols: int = 100) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("LUFT_REDIS_URL", "COLUMNS")}
        env["TERM"] = "xterm-256color"
        self.proc = subprocess.Popen([sys.executable, "-m", "luft_redis", *args], stdin=slave,
                                     stdout=slave, stderr=slave, env=env, close_fds=True,
                                     preexec_fn=_controlling_terminal)  # fmt: skip
        os.close(slave)
        self.master = master
        self.raw = b""

    def read_until(self, done: Callable[[str], bool], timeout: float = 30.0) -> str:
        """Read until ``done(plain output so far)``; the output (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout
        while not done(plain(self.raw)):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; output so far:\n{plain(self.raw)}")
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.raw += os.read(self.master, 65536)
                except OSError:  # EIO: the process closed the terminal
                    if self.proc.poll() is not None:
                        break
        return plain(self.raw)

    def write(self, text: str) -> None:
        os.write(self.master, text.encode())

    def _signals(self) -> str:
        """The process's state and signal masks (/proc), for a failure message."""
        try:
            lines = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        except OSError as exc:
            return str(exc)
        return ", ".join(line for line in lines if line.startswith(("State", "Sig")))

    def wait(self, timeout: float = 30.0) -> int:
        """The exit code, after reading everything the process wrote."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:  # keep reading: a full terminal would block it
            if time.monotonic() > deadline:
                raise AssertionError(f"still running ({self._signals()}); output so "
                                     f"far:\n{plain(self.raw)}")  # fmt: skip
            self._drain()
        self._drain()
        return self.proc.returncode

    def _drain(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                return
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.raw += data

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.master)


@pytest.fixture
def terminals() -> Iterator[Callable[..., Pty]]:
    made: list[Pty] = []

    def spawn(args: list[str], cols: int = 100) -> Pty:
        term = Pty(args, cols)
        made.append(term)
        return term

    yield spawn
    for term in made:
        term.close()


def _new_run(redis_url: str) -> tuple[RedisCheckpointBackend, uuid.UUID]:
    backend = RedisCheckpointBackend.from_url(redis_url, watch=False)
    run = uuid.uuid4()
    backend.init_run(run, "watched task", "/tmp/w")
    return backend, run


def test_watch_follows_the_run_until_run_done(
    redis_url: str, terminals: Callable[..., Pty]
) -> None:
    backend, run = _new_run(redis_url)
    with backend:
        backend.append_event(PhaseStarted(run_id=run, phase_id=0, label="review", planned=2))
        term = terminals(["--redis", redis_url, "watch", str(run)])
        term.read_until(lambda out: "running" in out and "0/2 agents" in out)
        agents = [uuid.uuid4(), uuid.uuid4()]
        backend.append_events([
            AgentStarted(run_id=run, phase_id=0, agent_id=a, prompt_preview="p", model="m")
            for a in agents
        ])  # fmt: skip
        backend.append_event(AgentDone(
            run_id=run, agent_id=agents[0], status=AgentStatus.OK, tokens=TokenUsage(input=1234),
            elapsed_ms=5, findings=(Finding(kind="bug", severity=Severity.HIGH,
                                            title="an off-by-one in the pager", detail="d"),),
        ))  # fmt: skip
        out = term.read_until(lambda out: "an off-by-one in the pager" in out)
        assert "1/2 agents" in out and "1,234" in out and "1 done, 0 failed" in out
        backend.append_event(AgentDone(run_id=run, agent_id=agents[1],
                                       status=AgentStatus.ERROR, tokens=TokenUsage(input=1),
                                       elapsed_ms=5))  # fmt: skip
        term.read_until(lambda out: "1 done, 1 failed" in out)
        assert term.proc.poll() is None  # still watching
        backend.append_event(RunDone(run_id=run, status=RunStatus.COMPLETED,
                                     total_tokens=TokenUsage()))  # fmt: skip
        assert term.wait() == 0
        assert "the run is completed" in plain(term.raw)


def _fcalls(url: str) -> int:
    """FCALL and FCALL_RO calls the server has run so far (every script of luft-redis)."""
    import redis

    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return sum(int(stats.get(name, {}).get("calls", 0))
               for name in ("cmdstat_fcall", "cmdstat_fcall_ro"))  # fmt: skip


def test_watch_shows_who_holds_what_and_what_lapsed(
    redis_url: str, terminals: Callable[..., Pty]
) -> None:
    backend, run = _new_run(redis_url)
    worker = RedisCheckpointBackend.from_url(redis_url, watch=False)
    with backend, worker:
        agents = [uuid.uuid4(), uuid.uuid4()]
        backend.submit_agents([AgentTask(a, 0, {"prompt": f"p{i}"}) for i, a in enumerate(agents)])
        worker.open_run(run)
        term = terminals(["--redis", redis_url, "watch", str(run)], cols=80)
        term.read_until(lambda out: "2: 2 ready, 0 leased, 0 done, 0 dead" in out)
        held = worker.claim_agent("host-a:pid-1", lease_for=30)
        assert held is not None
        out = term.read_until(lambda out: "host-a:pid-1" in out)
        assert "1 ready, 1 leased" in out and str(agents[0])[:8] in out
        lapsing = worker.claim_agent("host-b:pid-2", lease_for=0.5)
        assert lapsing is not None
        term.read_until(lambda out: "host-b:pid-2" in out)
        # a lapse writes nothing and sends no notice: watch reads the tasks again when the
        # lease is due, once
        out = term.read_until(lambda out: "(lapsed)" in out, timeout=10)
        assert "2 leased (1 lapsed)" in out
        time.sleep(0.3)  # the redraw after the lapse is done
        before = _fcalls(redis_url)
        time.sleep(2.5)  # nothing changes: no agent_tasks call (nor any other script)
        assert _fcalls(redis_url) == before
        worker.append_event(AgentDone(run_id=run, agent_id=agents[0], status=AgentStatus.OK,
                                      tokens=TokenUsage(input=7), elapsed_ms=1),
                            lease=held)  # fmt: skip
        term.read_until(lambda out: "1 done" in out)
        backend.append_event(RunDone(run_id=run, status=RunStatus.COMPLETED,
                                     total_tokens=TokenUsage()))  # fmt: skip
        assert term.wait() == 0
        assert "the run is completed" in plain(term.raw)


def test_watch_ends_on_ctrl_c(redis_url: str, terminals: Callable[..., Pty]) -> None:
    backend, run = _new_run(redis_url)
    with backend:
        term = terminals(["--redis", redis_url, "watch", str(run)])
        term.read_until(lambda out: "running" in out)
        term.write("\x03")  # Ctrl-C: the terminal sends SIGINT
        assert term.wait() == 0
        assert "Traceback" not in plain(term.raw)


def test_events_follow_tails_until_run_done(
    redis_url: str, terminals: Callable[..., Pty]
) -> None:
    backend, run = _new_run(redis_url)
    with backend:
        backend.append_event(Log(run_id=run, level=LogLevel.INFO, msg="before the tail"))
        term = terminals(["--redis", redis_url, "events", str(run), "--follow"])
        term.read_until(lambda out: "before the tail" in out)
        backend.append_event(Log(run_id=run, level=LogLevel.INFO, msg="while tailing"))
        term.read_until(lambda out: "while tailing" in out)
        assert term.proc.poll() is None
        backend.append_event(RunDone(run_id=run, status=RunStatus.FAILED,
                                     total_tokens=TokenUsage()))  # fmt: skip
        assert term.wait() == 0
        out = plain(term.raw)
        assert "run_done" in out and "status=failed" in out


def test_events_follow_json_ends_on_ctrl_c(
    redis_url: str, terminals: Callable[..., Pty]
) -> None:
    backend, run = _new_run(redis_url)
    with backend:
        backend.append_event(Log(run_id=run, level=LogLevel.INFO, msg="one"))
        term = terminals(["--redis", redis_url, "events", str(run), "--follow", "--json"])
        term.read_until(lambda out: '"msg":"one"' in out)
        term.write("\x03")
        assert term.wait() == 0
        assert "Traceback" not in plain(term.raw)


def test_delete_asks_on_a_terminal(redis_url: str, terminals: Callable[..., Pty]) -> None:
    backend, run = _new_run(redis_url)
    with backend:
        term = terminals(["--redis", redis_url, "delete", str(run)])
        term.read_until(lambda out: "[y/N]" in out)
        assert "running, 0 event(s)" in plain(term.raw)
        term.write("n\n")
        assert term.wait() == 1
        assert "not deleted" in plain(term.raw)
        assert backend.open_run(run) is not None

        term = terminals(["--redis", redis_url, "delete", str(run)])
        term.read_until(lambda out: "[y/N]" in out)
        term.write("y\n")
        assert term.wait() == 0
        assert backend.open_run(run) is None

        backend.init_run(run, "again", "/tmp/w")
        term = terminals(["--redis", redis_url, "delete", "--yes", str(run)])
        assert term.wait() == 0
        assert "[y/N]" not in plain(term.raw) and "deleted" in plain(term.raw)


@pytest.mark.timeout(180)
def test_demo_live_line_fits_80_columns(terminals: Callable[..., Pty]) -> None:
    term = terminals(["demo", "--fast", "--fakeredis", "--workers", "3", "--agents", "6"],
                     cols=80)  # fmt: skip
    assert term.wait(timeout=150) == 0, plain(term.raw)
    text = term.raw.decode("utf-8", "replace")
    # every piece of the live line drawn between cursor moves fits the 80 columns
    pieces = [p for p in re.split(r"\r|\n|\x1b\[[0-9;?]*[A-Za-z]", text) if "| agents P0" in p]
    assert pieces
    for piece in pieces:
        assert len(piece) <= 80, piece
    assert any(piece.endswith("\u2026") for piece in pieces)  # cut to the width, visibly
    out = plain(term.raw)
    summary = out.index("Summary")
    assert "agents P0" in out[:summary]
    assert "agents P0" not in out[summary:]  # no progress line after the summary
    # the final line is left once, and only once, before the summary: one screen line, cut
    # to the 80 columns (not wrapped onto a second line)
    lines = screen_lines(term.raw)
    summary_line = next(i for i, line in enumerate(lines) if line.startswith("Summary"))
    finals = [line for line in lines[:summary_line]
              if "phase 2 verify | agents P0 6/6 P1 6/6 P2 6/6" in line]  # fmt: skip
    assert len(finals) == 1, lines[:summary_line]
    assert len(finals[0]) <= 80 and finals[0].endswith("\u2026"), finals[0]
    after = lines[lines.index(finals[0]) + 1]
    assert after == "" or after.startswith("["), after  # no wrapped rest of the line
