"""The tools live in ``luft_redis.tools``; the old module paths re-export them unchanged."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

OLD_TO_NEW = [
    ("luft_redis.cli", "luft_redis.tools.cli"),
    ("luft_redis.doctor", "luft_redis.tools.doctor"),
    ("luft_redis.server", "luft_redis.tools.server"),
]


@pytest.mark.parametrize(("old", "new"), OLD_TO_NEW)
def test_old_import_path_re_exports_the_same_objects(old: str, new: str) -> None:
    old_module = importlib.import_module(old)
    new_module = importlib.import_module(new)
    assert old_module.__doc__ is not None and new in old_module.__doc__
    assert sorted(old_module.__all__) == sorted(new_module.__all__)
    for name in new_module.__all__:
        assert getattr(old_module, name) is getattr(new_module, name), f"{old}.{name}"


def test_documented_old_imports() -> None:
    from luft_redis.doctor import check_server
    from luft_redis.server import LocalRedisCluster, LocalRedisServer
    from luft_redis.tools.doctor import check_server as tools_check_server
    from luft_redis.tools.server import LocalRedisCluster as ToolsCluster
    from luft_redis.tools.server import LocalRedisServer as ToolsServer

    assert check_server is tools_check_server
    assert LocalRedisServer is ToolsServer
    assert LocalRedisCluster is ToolsCluster
    assert LocalRedisServer.__module__ == "luft_redis.tools.server"


def test_importing_the_library_imports_no_tool(tmp_path: Path) -> None:
    # cwd=tmp_path: the installed package, not the source tree through sys.path[0].
    code = (
        "import sys, luft_redis; "
        "print(sorted(m for m in sys.modules if m.startswith('luft_redis.tools')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
