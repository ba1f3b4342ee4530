"""Smoke runs of the benchmarks so they never rot: ``benchmarks.run --smoke``,
``benchmarks.staleness --smoke`` (both front ends), ``benchmarks.compare --smoke``,
``benchmarks.runs_index --smoke``, ``benchmarks.leases --smoke`` and
``benchmarks.lua_cost --ops 5`` (when valgrind is there).

They check only that each completes against a real redis-server and prints every row with
numbers where numbers belong: no timing is ever asserted (the figures come from a shared,
noisy machine).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPECTED_KEYS = {
    "ping_p50",
    "append_event_p50",
    "append_event_vs_fcall_p50",
    "append_event_p99",
    "raw_fcall_p50",
    "upsert_agent_result_p50",
    "upsert_agent_result_p99",
    "append_event_commands",
    "append_server_time",
    "upsert_agent_result_commands",
    "append_events_10",
    "append_events_100",
    "raw_fcall_pipeline_100",
    "get_checkpoint_small",
    "get_checkpoint_mid",
    "get_checkpoint_large",
    "append_event_large_run",
    "open_run",
    "writers_1",
    "writers_2",
    "writers_4",
    "writers_4_bench",
    "hiredis_append_p50",
    "hiredis_open_run",
    "stats_write_cost",
    "stats_call",
    "memory_per_event",
}
BENCH_ROWS = {"append_events_100", "writers_4_bench"}  # baseline: redis-benchmark
PARSER_ROWS = {"hiredis_append_p50", "hiredis_open_run"}  # need hiredis


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


@pytest.mark.server
@pytest.mark.full  # benchmarks.run end to end: pytest --full (CI); everyday: test_runs_index_smoke
def test_benchmark_smoke_run(redis_server_binary: str, tmp_path: Path) -> None:
    """Every row of issue 9 is produced with a number (and its baseline and ratio where it has
    one); the append function's server time comes with its per-command breakdown."""
    out = tmp_path / "bench.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--smoke", "--json", str(out),
         "--redis-server", redis_server_binary],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    report = json.loads(out.read_text())
    rows = {row["key"]: row for row in report["rows"]}
    assert set(rows) == EXPECTED_KEYS
    has_bench = "not found" not in report["header"]["redis-benchmark"]
    has_hiredis = importlib.util.find_spec("hiredis") is not None
    for key, row in rows.items():
        assert row["metric"] in proc.stdout
        assert row["status"] in ("PASS", "MISS", "info", "n/a")
        if key in PARSER_ROWS and not has_hiredis:
            assert row["status"] == "n/a" and "hiredis" in row["note"]
            continue
        assert _finite(row["value"]), row
        if key in BENCH_ROWS and not has_bench:
            continue
        if row["baseline_name"]:
            assert _finite(row["baseline"]), row
        if row["target"]:
            assert row["status"] in ("PASS", "MISS"), row
            if row["unit"] != "cmd":
                assert _finite(row["ratio"]), row
    server = report["raw"]["append_server_time"]
    assert _finite(server["fcall_usec_per_call"]) and _finite(server["inner_usec_per_op"])
    assert "xadd" in server["inner"] and "fcall" not in server["inner"]
    for command in server["inner"].values():
        assert all(_finite(v) for v in command.values())
    for field in ("date", "uname", "cpu", "python", "redis-py", "hiredis", "redis-server",
                  "placement"):  # fmt: skip
        assert field in report["header"]
    assert "appendonly no" in proc.stdout


NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+")


def _number(cell: str) -> float:
    """The number a table cell starts with ("1,234 us", "0.97x", "+3%", "-1.25")."""
    match = NUMBER.match(cell.strip())
    assert match is not None, f"not a number: {cell!r}"
    return float(match.group().replace(",", ""))


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


STALENESS_ROWS = ("after A's ack", "after A's call", "after ack, first quarter",
                  "after ack, last quarter")  # fmt: skip


@pytest.mark.server
def test_staleness_smoke_both_front_ends(redis_server_binary: str) -> None:
    """Both front ends run and print their tables (no timing is asserted)."""
    proc = _run(["benchmarks.staleness", "--smoke", "--samples", "60", "--frontend", "both",
                 "--redis-server", redis_server_binary], timeout=120)  # fmt: skip
    out = proc.stdout
    assert "placement:" in out
    assert "front ends: sync, async" in out
    for frontend in ("sync", "async"):
        section = out.split(f"[{frontend}] process B:", 1)[1].split("\n\n", 1)[0]
        for label in STALENESS_ROWS:
            line = next(x for x in section.splitlines() if x.startswith(label))
            cells = line[len(label) :].split()
            assert len(cells) == 4, line
            for cell in cells:
                _number(cell)
    summary = out.split("front end ", 1)[1].splitlines()
    for frontend in ("sync", "async"):
        line = next(x for x in summary if x.startswith(frontend))
        p50, p99, verdict = line.split()[1:4]
        _number(p50), _number(p99)
        assert verdict in ("met", "MISSED")


COMPARE_ROWS = (
    "PING p50 (baseline)",
    "append_event p50",
    "append_event p99",
    "upsert_agent_result p50",
    "append_event + get_checkpoint p50",
    "append_events, batches of 100",
    "get_checkpoint(),",
    "open_run,",
)
COST_ROWS = ("append_event ", "upsert_agent_result ", "append_event + get_checkpoint ",
             "append_events(100 events) ", "open_run ")  # fmt: skip


@pytest.mark.server
@pytest.mark.full  # two checkouts compared: pytest --full (CI)
def test_compare_smoke(redis_server_binary: str) -> None:
    """benchmarks.compare --smoke measures before (a worktree of 9103c9c) and after, prints
    every row and a verdict, and removes its worktree (no timing is asserted)."""
    has_before = (
        shutil.which("git") is not None
        and subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", "9103c9c^{commit}"],
                           capture_output=True, check=False).returncode == 0
    )  # fmt: skip
    proc = _run(["benchmarks.compare", "--smoke", "--redis-server", redis_server_binary],
                timeout=180)  # fmt: skip
    out = proc.stdout
    for field in ("placement:", "before:", "after:", "redis-server"):
        assert field in out
    if has_before:
        match = re.search(r"\(worktree (\S+)\)", out)
        assert match is not None, out
        assert not Path(match.group(1)).exists(), "the worktree was not removed"
        worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"],
                                   capture_output=True, text=True, check=False).stdout
        assert match.group(1) not in worktrees  # fmt: skip
    lines = out.splitlines()
    for label in COMPARE_ROWS:
        line = next(x for x in lines if x.startswith(label))
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == 7, line
        _number(cells[2])  # after
        if has_before:
            _number(cells[1]), _number(cells[3]), _number(cells[4])
            assert cells[6] in ("ok", "WORSE", "baseline")
    verdict = next(x for x in lines if x.startswith("no row more than 15% worse? "))
    expected = ("yes", "NO") if has_before else ("n/a",)
    assert verdict.split("? ", 1)[1].startswith(expected)
    costs = out.split("where the time goes", 1)[1].splitlines()
    for label in COST_ROWS:
        line = next(x for x in costs if x.startswith(label))
        for cell in re.split(r"\s{2,}", line.strip())[1:3]:
            _number(cell)


RUNS_INDEX_ROWS = (
    "read_page --limit 10",
    "read_page --limit 10 --status completed",
    "luft-redis runs --limit 10 (subprocess)",
    "before the index: SCAN + open_run each (scaled)",
)


@pytest.mark.server
def test_runs_index_smoke(redis_server_binary: str) -> None:
    """benchmarks.runs_index --smoke makes its two prefixes and prints every row with a time
    per prefix and a ratio (no timing is asserted)."""
    proc = _run(["benchmarks.runs_index", "--smoke"], timeout=180)
    lines = proc.stdout.splitlines()
    assert any(line.startswith("made 3 + 30 runs") for line in lines), proc.stdout
    header = next(line for line in lines if "runs" in line and "ratio" in line)
    assert header.split()[:4] == ["3", "runs", "30", "runs"], header
    for name in RUNS_INDEX_ROWS:
        row = next((line for line in lines if line.startswith(name + "  ")), None)
        assert row is not None, f"no row {name!r} in:\n{proc.stdout}"
        cells = row[len(name):].split()
        assert cells[1] == "ms" and cells[3] == "ms" and cells[4].endswith("x"), row
        few, many, ratio = float(cells[0]), float(cells[2]), float(cells[4][:-1])
        assert all(math.isfinite(v) and v >= 0 for v in (few, many, ratio)), row


@pytest.mark.server
@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                    reason="benchmarks.lua_cost needs valgrind")  # fmt: skip
def test_lua_cost_smoke(redis_server_binary: str) -> None:
    """benchmarks.lua_cost --ops 5 --before none runs redis-server under callgrind and prints
    an instruction count per call and a ratio to PING for every phase (nothing is asserted
    about the counts but that they are positive numbers)."""
    proc = _run(["benchmarks.lua_cost", "--ops", "5", "--before", "none"], timeout=300)
    lines = proc.stdout.splitlines()
    for phase in ("ping", "append", "upsert"):
        row = next((line for line in lines if line.startswith(phase + " ")), None)
        assert row is not None, f"no row {phase!r} in:\n{proc.stdout}"
        cells = row.split()
        assert len(cells) == 3, row
        assert _number(cells[1]) > 0 and cells[2].endswith("x") and _number(cells[2]) > 0, row


LEASE_ROWS = {
    "claim_agent_p50": True,  # has a baseline and a target
    "leased_cycle_vs_unleased": True,
    "leased_cycle_vs_blmove": True,
    "claim_wake_p50": False,
    "claim_wake_p99": False,
    "lease_workers_1": False,
    "lease_workers_2": False,
    "pool_claim_p50": True,
    "limiter_hold": True,
    "limiter_wake_max": True,
}


@pytest.mark.server
def test_lease_benchmark_smoke(redis_server_binary: str, tmp_path: Path) -> None:
    """``benchmarks.leases --smoke`` prints every row with a number, a baseline and a ratio
    where the row has a target (no timing is asserted)."""
    out = tmp_path / "leases.json"
    proc = _run(["benchmarks.leases", "--smoke", "--json", str(out),
                 "--redis-server", redis_server_binary], timeout=180)  # fmt: skip
    report = json.loads(out.read_text())
    rows = {row["key"]: row for row in report["rows"]}
    assert set(rows) == set(LEASE_ROWS)
    for key, targeted in LEASE_ROWS.items():
        row = rows[key]
        assert row["metric"] in proc.stdout and _finite(row["value"]), row
        if targeted:
            assert _finite(row["baseline"]) and _finite(row["ratio"]), row
            assert row["status"] in ("PASS", "MISS"), row
        else:
            assert row["status"] == "info", row
    assert "placement:" in proc.stdout


HISTORY_ROWS = {
    "checkpoint_at_last": True,
    "checkpoint_at_middle": True,
    "history_bytes_per_event": True,
    "history_against_run": False,
}


@pytest.mark.server
def test_history_benchmark_smoke(redis_server_binary: str, tmp_path: Path) -> None:
    """``benchmarks.history --smoke`` (checkpoint_at against open_run, the demo's memory)
    prints every row with a number, and a baseline and ratio where it has a target."""
    out = tmp_path / "history.json"
    proc = _run(["benchmarks.history", "--smoke", "--json", str(out),
                 "--redis-server", redis_server_binary], timeout=300)  # fmt: skip
    report = json.loads(out.read_text())
    rows = {row["key"]: row for row in report["rows"]}
    assert set(rows) == set(HISTORY_ROWS)
    for key, targeted in HISTORY_ROWS.items():
        row = rows[key]
        assert row["metric"] in proc.stdout and _finite(row["value"]), row
        assert _finite(row["baseline"]) and _finite(row["ratio"]), row
        assert row["status"] in (("PASS", "MISS") if targeted else ("info",)), row
    assert report["raw"]["memory"]["versions"] > report["raw"]["memory"]["events"] > 0


@pytest.mark.server
def test_fleet_smoke(redis_server_binary: str) -> None:
    """benchmarks.fleet, tiny: one round of 1 and 2 writer processes (and the watcher, the
    PING and watch=False baselines) prints a row per N with numbers (none asserted)."""
    proc = _run(["benchmarks.fleet", "--seconds", "0.2", "--rounds", "1", "--writers", "1,2",
                 "--mode", "pinned", "--redis-server", redis_server_binary],
                timeout=300)  # fmt: skip
    rows = [line for line in proc.stdout.splitlines() if line.startswith(f"| {ROOT.name} |")]
    assert len(rows) == 3, proc.stdout  # N = 1, N = 2, watch=False
    for row in rows[:2]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert _number(cells[2]) > 0 and _number(cells[3].split()[0]) > 0, row
        assert math.isfinite(_number(cells[5].split()[0])), row


@pytest.mark.server
def test_notice_cost_smoke(redis_server_binary: str) -> None:
    """benchmarks.notice_cost --no-valgrind --ops 16: records the notices, reads them through
    the listener's path in a worker, prints a time per notice for every phase."""
    proc = _run(["benchmarks.notice_cost", "--no-valgrind", "--ops", "16",
                 "--redis-server", redis_server_binary], timeout=300)  # fmt: skip
    row = next(line for line in proc.stdout.splitlines() if line.startswith(f"| {ROOT.name} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 7, row
    # times per notice; "own" is a difference of two timings, so it may come out negative
    assert all(math.isfinite(_number(c)) for c in cells[2::2]), row
