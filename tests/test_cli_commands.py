"""``luft-redis`` as a user runs it: ``python -m luft_redis ...`` in a subprocess against a
private redis-server, checking what it prints and its exit codes (stdin is not a terminal)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

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
from luft_redis.keys import run_index_key, run_keys
from luft_redis.retention import LOG_TRIMMED_NOTE
from luft_redis.tools import cli
from luft_redis.tools.server import LocalRedisCluster, LocalRedisServer

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]


def luft(*args: str, url_env: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LUFT_REDIS_URL"}
    if url_env is not None:
        env["LUFT_REDIS_URL"] = url_env
    return subprocess.run(
        [sys.executable, "-m", "luft_redis", *args], capture_output=True, text=True,
        stdin=subprocess.DEVNULL, env=env, timeout=60, check=False,
    )  # fmt: skip


def _rows(out: str) -> list[list[str]]:
    """The data rows of the `runs` table (after its header)."""
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines and lines[0][:2] == ["run", "id"], out
    return lines[1:]


@pytest.fixture
def three_runs(redis_url: str) -> Iterator[list[uuid.UUID]]:
    """Three runs, oldest first: running, completed, cancelled (known update times)."""
    runs = [uuid.uuid4() for _ in range(3)]
    with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
        for i, run in enumerate(runs):
            backend.init_run(run, f"task number {i}", f"/tmp/{i}")
            agent = uuid.uuid4()
            backend.append_event(AgentStarted(run_id=run, phase_id=0, agent_id=agent,
                                              prompt_preview="p", model="m"))  # fmt: skip
            backend.append_event(AgentDone(run_id=run, agent_id=agent, status=AgentStatus.OK,
                                           tokens=TokenUsage(input=100 * (i + 1)),
                                           elapsed_ms=5))  # fmt: skip
        backend.open_run(runs[1])
        backend.append_event(RunDone(run_id=runs[1], status=RunStatus.COMPLETED,
                                     total_tokens=TokenUsage()))  # fmt: skip
        backend.open_run(runs[2])
        backend.cancel()
    now = int(dt.datetime.now(dt.UTC).timestamp())
    with redis.Redis.from_url(redis_url) as client:
        for i, run in enumerate(runs):  # 3 days, 2 days and 1 hour ago
            when = now - (3 * 86400, 2 * 86400, 3600)[i]
            client.hset(run_keys("luft", run).run, "updated_at", str(when))
            client.zadd(run_index_key("luft"), {str(run): when})
    yield runs


def test_global_options_go_before_or_after_the_command(
    redis_url: str, three_runs: list[uuid.UUID]
) -> None:
    newest_first = [str(r) for r in reversed(three_runs)]
    for args in (("--redis", redis_url, "runs"), ("runs", "--redis", redis_url),
                 ("--redis", "redis://127.0.0.1:1/0", "runs", "--redis", redis_url),
                 ("--prefix", "luft", "--redis", redis_url, "runs")):  # fmt: skip
        result = luft(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert [row[0] for row in _rows(result.stdout)] == newest_first, args
    result = luft("runs", url_env=redis_url)  # LUFT_REDIS_URL
    assert result.returncode == 0, result.stderr
    assert [row[0] for row in _rows(result.stdout)] == newest_first
    result = luft("--prefix", "elsewhere", "--redis", redis_url, "runs", "--json")
    assert result.returncode == 0 and result.stdout == ""


def test_runs_columns_filters_and_limit(redis_url: str, three_runs: list[uuid.UUID]) -> None:
    running, completed, cancelled = three_runs
    result = luft("--redis", redis_url, "runs")
    rows = {row[0]: row for row in _rows(result.stdout)}
    # run id, status, tokens, agents, updated, task
    assert rows[str(completed)][1:4] == ["completed", "200", "1"]
    assert rows[str(running)][1:4] == ["running", "100", "1"]
    assert " ".join(rows[str(cancelled)][5:]) == "task number 2"
    assert "3 run(s) shown of 3 indexed" in result.stderr

    def ids(*args: str) -> list[str]:
        res = luft("--redis", redis_url, "runs", "--json", *args)
        assert res.returncode == 0, res.stderr
        return [json.loads(line)["run_id"] for line in res.stdout.splitlines()]

    assert ids("--status", "completed") == [str(completed)]
    assert ids("--status", "running", "--status", "cancelled") == [str(cancelled), str(running)]
    assert ids("--since", "12h") == [str(cancelled)]
    assert ids("--since", "60h") == [str(cancelled), str(completed)]
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(days=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ids("--since", since) == [str(cancelled), str(completed), str(running)]
    assert ids("--limit", "2") == [str(cancelled), str(completed)]
    row = json.loads(luft("--redis", redis_url, "runs", "--json", "--limit", "1").stdout)
    assert row["status"] == "cancelled" and row["total_tokens"] == 300 and row["agents"] == 1

    for bad in (("--since", "yesterday"), ("--since", "2026-01-01T00:00:00"),
                ("--limit", "0"), ("--status", "done")):  # fmt: skip
        res = luft("--redis", redis_url, "runs", *bad)
        assert res.returncode == 2, bad
        assert "Traceback" not in res.stderr and "usage" in res.stderr, bad
    assert "no time zone" in luft("--redis", redis_url, "runs", "--since",
                                  "2026-01-01T00:00:00").stderr  # fmt: skip


def test_runs_skips_gone_runs_and_rebuilds_the_index(
    redis_url: str, three_runs: list[uuid.UUID]
) -> None:
    running, completed, cancelled = three_runs
    with redis.Redis.from_url(redis_url) as client:
        client.delete(run_keys("luft", completed).run)  # gone behind the index's back
        client.delete(run_index_key("luft"))
        client.zadd(run_index_key("luft"), {str(completed): 1, str(running): 2})
    result = luft("--redis", redis_url, "runs")
    assert [row[0] for row in _rows(result.stdout)] == [str(running)]
    assert "1 index entry without a run (expired or deleted) skipped and removed" in result.stderr
    with redis.Redis.from_url(redis_url) as client:  # `runs` removed the entry it found gone
        assert set(client.zrange(run_index_key("luft"), 0, -1)) == {str(running).encode()}
    assert "without a run" not in luft("--redis", redis_url, "runs").stderr
    result = luft("--redis", redis_url, "runs", "--rebuild-index")
    assert result.returncode == 0, result.stderr
    assert "2 run(s) indexed, 0 stale entries removed" in result.stdout
    result = luft("--redis", redis_url, "runs")
    assert [row[0] for row in _rows(result.stdout)] == [str(cancelled), str(running)]
    assert "without a run" not in result.stderr


def _events_run(redis_url: str) -> tuple[uuid.UUID, list[str], list[dict[str, object]]]:
    run, agent = uuid.uuid4(), uuid.uuid4()
    with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
        backend.init_run(run, "events", "/tmp/e")
        backend.append_event(AgentStarted(run_id=run, phase_id=0, agent_id=agent,
                                          prompt_preview="look", model="m"))  # fmt: skip
        backend.append_event(AgentDone(
            run_id=run, agent_id=agent, status=AgentStatus.OK, tokens=TokenUsage(input=7),
            elapsed_ms=9, findings=(Finding(kind="bug", severity=Severity.HIGH, title="t",
                                            detail="d"),),
        ))  # fmt: skip
        backend.append_event(Log(run_id=run, level=LogLevel.WARN, msg="careful\nnow"))
        entries = list(backend.iter_events(None, follow=False))
    return run, [e.id for e in entries], [e.event.to_json() for e in entries]


def test_events_readable_json_type_and_since(redis_url: str) -> None:
    run, ids, objs = _events_run(redis_url)
    result = luft("--redis", redis_url, "events", str(run))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert [line.split()[2] for line in lines] == ids
    assert [line.split()[3] for line in lines] == ["agent_started", "agent_done", "log"]
    assert "status=Ok" in lines[1] and "tokens=7" in lines[1] and "findings=1" in lines[1]
    assert "level=warn" in lines[2] and "msg=careful now" in lines[2]

    result = luft("--redis", redis_url, "events", str(run), "--json")
    assert [json.loads(line) for line in result.stdout.splitlines()] == objs
    result = luft("events", str(run), "--redis", redis_url, "--json", "--type", "log",
                  "--type", "agent_done")  # fmt: skip
    assert [json.loads(line)["type"] for line in result.stdout.splitlines()] == [
        "agent_done", "log"]  # fmt: skip
    result = luft("--redis", redis_url, "events", str(run), "--json", "--since", ids[0])
    assert [json.loads(line) for line in result.stdout.splitlines()] == objs[1:]

    missing = luft("--redis", redis_url, "events", str(uuid.uuid4()))
    assert missing.returncode == 1 and "not found" in missing.stderr
    for bad in (("--type", "nope"), ("--since", "abc")):
        res = luft("--redis", redis_url, "events", str(run), *bad)
        assert res.returncode == 2 and "Traceback" not in res.stderr, bad
    assert "unknown event type 'nope'" in luft("--redis", redis_url, "events", str(run),
                                               "--type", "nope").stderr  # fmt: skip


def test_events_and_export_of_a_trimmed_log_say_so(redis_url: str, tmp_path: Path) -> None:
    run = uuid.uuid4()
    with RedisCheckpointBackend.from_url(redis_url, watch=False, max_events=3) as backend:
        backend.init_run(run, "trimmed", "/tmp/t")
        for i in range(300):
            backend.append_event(Log(run_id=run, level=LogLevel.INFO, msg=f"m{i}"))
        assert backend.log_trimmed
    for json_flag in ((), ("--json",)):
        result = luft("--redis", redis_url, "events", str(run), *json_flag)
        assert result.returncode == 0, result.stderr
        assert LOG_TRIMMED_NOTE in result.stderr and str(run) in result.stderr, json_flag
        assert "m299" in result.stdout.splitlines()[-1] and "m0\n" not in result.stdout
        if json_flag:  # stdout stays pure JSON lines
            assert all(json.loads(line)["type"] == "log" for line in result.stdout.splitlines())

    refused = luft("--redis", redis_url, "export", str(run), "-o", str(tmp_path / "d"), "--quiet")
    assert refused.returncode == 1, refused.stderr
    assert str(run) in refused.stderr and "trimmed" in refused.stderr
    assert "--allow-trimmed" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "d").exists()
    allowed = luft("--redis", redis_url, "export", str(run), "-o", str(tmp_path / "d"),
                   "--quiet", "--allow-trimmed")  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    assert "warning" in allowed.stderr and LOG_TRIMMED_NOTE in allowed.stderr
    assert (tmp_path / "d" / "events.jsonl").read_text().splitlines()[-1].endswith('"m299"}')

    whole, _, _ = _events_run(redis_url)
    result = luft("--redis", redis_url, "events", str(whole))
    assert result.returncode == 0 and "trimmed" not in result.stderr


def test_watch_to_a_pipe_ends_its_last_line(redis_url: str) -> None:
    """stdout not a terminal: the final view is printed once, and its last line ends with a
    newline (so that a shell prompt or the next command's output starts on a line of its own)."""
    run = uuid.uuid4()
    with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
        backend.init_run(run, "watched from a pipe", "/tmp/w")
        backend.append_event(RunDone(run_id=run, status=RunStatus.COMPLETED,
                                     total_tokens=TokenUsage(input=5)))  # fmt: skip
    result = luft("--redis", redis_url, "watch", str(run))
    assert result.returncode == 0, result.stderr
    assert "the run is completed" in result.stdout
    assert result.stdout.endswith("\n") and not result.stdout.endswith("\n\n\n"), result.stdout


def test_runs_limit_says_more_only_when_more_are_indexed(redis_url: str) -> None:
    with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
        backend.init_run(uuid.uuid4(), "one", "/tmp/1")
        result = luft("--redis", redis_url, "runs", "--limit", "1")
        assert result.returncode == 0, result.stderr
        assert "1 run(s) shown of 1 indexed" in result.stderr
        assert "--limit shows more" not in result.stderr
        backend.init_run(uuid.uuid4(), "two", "/tmp/2")
    result = luft("--redis", redis_url, "runs", "--limit", "1")
    assert "1 run(s) shown of 2 indexed" in result.stderr and "--limit shows more" in result.stderr


def test_cancel_exit_codes(redis_url: str, three_runs: list[uuid.UUID]) -> None:
    running, completed, cancelled = three_runs
    result = luft("--redis", redis_url, "cancel", str(completed))
    assert result.returncode == 1
    assert "is completed: only a running run can be cancelled" in result.stderr
    result = luft("--redis", redis_url, "cancel", str(running))
    assert result.returncode == 0 and result.stdout.strip() == f"run {running}: cancelled"
    result = luft("--redis", redis_url, "cancel", str(cancelled))
    assert result.returncode == 0 and "already" in result.stdout


def test_history_show_at_and_fork(redis_url: str) -> None:
    """`history` lists versions newest first (pages with --before/--after, --oldest, --json);
    `show --at` prints a past state; `fork` makes a new run that `show` names the parent of;
    a point the history lacks is exit 1 with the reason, a malformed one a usage error."""
    client = redis.Redis.from_url(redis_url)
    with RedisCheckpointBackend(client, watch=False) as backend:
        run_id = uuid.uuid4()
        backend.init_run(run_id, "history task", "/tmp/h")
        backend.append_event(Log(run_id=run_id, level=LogLevel.INFO, msg="one"))
        backend.cancel()
    client.close()
    result = luft("--redis", redis_url, "history", str(run_id))
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and [line.split()[:1] for line in lines] == [["v3"], ["v2"],
                                                                             ["v1"]]  # fmt: skip
    assert "cancel" in lines[0] and "status cancelled" in lines[0] and "whole state" in lines[2]
    rows = [json.loads(line) for line in luft("--redis", redis_url, "history", str(run_id),
                                              "--json", "--oldest").stdout.splitlines()]
    assert [r["op"] for r in rows] == ["init", "append", "cancel"]
    after = luft("--redis", redis_url, "history", str(run_id), "--oldest", "--after",
                 rows[0]["id"], "--limit", "1", "--json").stdout  # fmt: skip
    assert [json.loads(line)["version"] for line in after.splitlines()] == [2]
    shown = luft("--redis", redis_url, "show", str(run_id), "--at", "2", "--json")
    summary = json.loads(shown.stdout.splitlines()[0])
    assert shown.returncode == 0 and summary["status"] == "running" and summary["at"] == "version 2"
    made = luft("--redis", redis_url, "fork", str(run_id), "--at", "2", "--task", "again")
    assert made.returncode == 0, made.stderr
    child = made.stdout.split()[1].rstrip(":")
    summary = json.loads(luft("--redis", redis_url, "show", child, "--json").stdout.splitlines()[0])
    assert summary["parent"] == f"{run_id} 2" and summary["task"] == "again"
    rows = [json.loads(line) for line in luft("--redis", redis_url, "runs", "--json").stdout
            .splitlines()]  # fmt: skip
    assert {r["run_id"]: r.get("parent") for r in rows} == {str(run_id): None,
                                                             child: f"{run_id} 2"}  # fmt: skip
    table = luft("--redis", redis_url, "runs").stdout
    assert f"(fork of {str(run_id)[:8]} v2) again" in table
    missing = luft("--redis", redis_url, "show", str(run_id), "--at", "9")
    assert missing.returncode == 1 and "after the run's last version 3" in missing.stderr
    bad = luft("--redis", redis_url, "fork", str(run_id), "--at", "soon")
    assert bad.returncode == 2 and "not a version, an event id" in bad.stderr


def test_delete_from_a_script_does_not_ask(redis_url: str, three_runs: list[uuid.UUID]) -> None:
    result = luft("--redis", redis_url, "delete", str(three_runs[0]))
    assert result.returncode == 0, result.stderr
    assert "[y/N]" not in result.stdout + result.stderr
    result = luft("--redis", redis_url, "delete", "--yes", str(three_runs[1]))
    assert result.returncode == 0, result.stderr
    with RedisCheckpointBackend.from_url(redis_url, watch=False) as backend:
        assert backend.open_run(three_runs[0]) is None
        assert backend.open_run(three_runs[1]) is None
        cp = backend.open_run(three_runs[2])
        assert cp is not None and cp.status is CheckpointStatus.CANCELLED
    result = luft("--redis", redis_url, "runs", "--json")
    assert [json.loads(line)["run_id"] for line in result.stdout.splitlines()] == [
        str(three_runs[2])]  # fmt: skip


@pytest.fixture(scope="module")
def password_server(redis_server_binary: str) -> Iterator[LocalRedisServer]:
    server = LocalRedisServer(binary=redis_server_binary,
                              extra_args=["--requirepass", "s3cret"])  # fmt: skip
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_refused_credentials_are_not_unreachable(password_server: LocalRedisServer) -> None:
    port = password_server.port
    for url in (f"redis://:wrong@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
        for command in (("runs",), ("show", str(uuid.uuid4()))):
            result = luft("--redis", url, *command)
            assert result.returncode == cli.EXIT_REFUSED, (url, command, result.stderr)
            assert "refused" in result.stderr, result.stderr
            assert "cannot reach" not in result.stderr and "Traceback" not in result.stderr
            assert "wrong" not in result.stderr  # the password is redacted
    good = luft("--redis", f"redis://:s3cret@127.0.0.1:{port}/0", "runs", "--json")
    assert good.returncode == 0, good.stderr


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand of ``luft-redis`` and its parser, from ``build_parser()``."""
    actions = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return dict(actions[0].choices)


def _subcommands() -> list[str]:
    return list(_subparsers())


def test_every_command_has_a_description(capsys: pytest.CaptureFixture[str]) -> None:
    commands = _subcommands()
    assert len(commands) >= 13 and {"gc", "export", "import-sqlite", "demo"} <= set(commands)
    assert cli.main(["--help"]) == 0
    top = capsys.readouterr().out
    assert "LUFT_REDIS_URL" in top
    for command in commands:
        assert command in top
        assert cli.main([command, "--help"]) == 0
        text = capsys.readouterr().out
        usage, _, rest = text.partition("\n\n")
        assert usage.startswith(f"usage: luft-redis {command}"), text
        description = rest.split("\n\n")[0]
        assert description and not description.lstrip().startswith(("options:", "-")), (
            command, text)  # fmt: skip


def _readme_operations_table() -> dict[str, str]:
    """The rows of the README's operations table ("Operate it"): subcommand -> example."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Operate it"):]
    section = section[: section.index("\n## ", 1)]
    rows: dict[str, str] = {}
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert lines[0].replace(" ", "") == "|command|whatitdoes|example|", lines[0]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 3, line
        name = cells[0].strip("`").split()[0]
        assert cells[2].startswith(f"`luft-redis {name}"), (name, cells[2])
        rows.setdefault(name, cells[2])
    return rows


def test_readme_operations_table_lists_every_subcommand_with_an_example() -> None:
    rows = _readme_operations_table()
    assert sorted(rows) == sorted(_subcommands())
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    rule = "`--since` and the\norder use the last create, finish or resume"
    assert rule in readme  # the rule of `runs --since`, in the README and in `runs --help`
    help_text = " ".join(_subparsers()["runs"].format_help().split())
    assert "--since and the order use the run's last create, finish or resume" in help_text
    for name, example in rows.items():  # each example parses as the command it illustrates
        argv = example.strip("`").split()[1:]
        if name == "demo":
            continue  # its arguments are the demo's own parser's
        argv = [a.replace("0193\u2026", str(uuid.UUID(int=1))) for a in argv]
        parsed = cli.build_parser().parse_args(argv)
        assert parsed.command == name, example


@pytest.mark.cluster
def test_runs_on_a_cluster(redis_cluster: LocalRedisCluster,
                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    redis_cluster.flushall()
    runs = [uuid.uuid4() for _ in range(5)]
    with redis_cluster.client() as client:
        with RedisCheckpointBackend(client, watch=False) as backend:
            for run in runs:
                backend.init_run(run, "on a cluster", "/tmp/c")
        for i, run in enumerate(runs):
            client.hset(run_keys("luft", run).run, "updated_at", str(1000 + i))
            client.zadd(run_index_key("luft"), {str(run): 1000 + i})
    assert cli.main(["--cluster", "--redis", redis_cluster.url, "runs", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["run_id"] for row in rows] == [str(r) for r in reversed(runs)]
    assert cli.main(["runs", "--cluster", "--redis", redis_cluster.url, "--rebuild-index"]) == 0
    assert "5 run(s) indexed" in capsys.readouterr().out


def test_an_empty_server_names_no_version_for_the_index(redis_url: str) -> None:
    """On an empty server `runs` says how to list runs stored before the run index, without
    naming a version (0.1 is not what is installed)."""
    empty = luft("runs", "--redis", redis_url)
    assert empty.returncode == 0, empty.stderr
    assert "--rebuild-index" in empty.stderr and "0.1" not in empty.stderr


def test_a_password_the_server_does_not_need_is_warned_about_once(
    redis_url: str, password_server: LocalRedisServer
) -> None:
    """`redis-cli -a` warns when it is given a password the server does not need; so does
    every command, once, on stderr (with the password masked), and then does its work."""
    with_password = redis_url.replace("redis://", "redis://:s3cret@", 1)
    result = luft("runs", "--redis", with_password)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "without a password" in warnings[0]
    assert "s3cret" not in result.stderr and ":***@" in warnings[0]
    plain = luft("runs", "--redis", redis_url)
    needed = luft("runs", "--redis", f"redis://:s3cret@127.0.0.1:{password_server.port}/0")
    for quiet in (plain, needed):  # no password, or one the server needs: no warning
        assert quiet.returncode == 0, quiet.stderr
        assert not [line for line in quiet.stderr.splitlines() if line.startswith("warning:")]
