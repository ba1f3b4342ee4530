"""Smoke run of the benchmark harness (``python -m benchmarks.run --smoke``) so it never rots.

It checks only that the harness completes against a real redis-server and prints every metric
row: no timing is asserted (the figures are ratios on a shared, noisy machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPECTED_KEYS = {
    "ping_p50",
    "append_event_p50",
    "append_event_p99",
    "upsert_agent_result_p50",
    "upsert_agent_result_p99",
    "same_shape_evalsha_p50",
    "same_shape_evalsha_p99",
    "append_event_commands",
    "upsert_agent_result_commands",
    "append_events_10",
    "append_events_100",
    "same_shape_pipeline_100",
    "get_checkpoint_small",
    "get_checkpoint_mid",
    "get_checkpoint_large",
    "append_event_large_run",
    "open_run",
    "writers_1",
    "writers_2",
    "writers_4",
    "memory_per_event",
}


@pytest.mark.server
def test_benchmark_smoke_run(redis_server_binary: str, tmp_path: Path) -> None:
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
    rows = report["rows"]
    assert {row["key"] for row in rows} == EXPECTED_KEYS
    for row in rows:
        assert row["metric"] in proc.stdout
        assert row["status"] in ("PASS", "MISS", "info", "n/a")
    for field in ("date", "uname", "cpu", "python", "redis-py", "hiredis", "redis-server"):
        assert field in report["header"]
    assert "appendonly no" in proc.stdout
