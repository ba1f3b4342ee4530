"""The package's import arrows run one way.

- The tools (``luft_redis.tools``) import the library; no module of the library imports a tool
  (``luft_redis/__main__.py``, the ``python -m luft_redis`` entry that nothing imports, is the
  one exception).
- No modules of the package import each other in a circle (an import inside a function,
  under ``TYPE_CHECKING`` or by ``importlib.import_module("a.literal.name")`` counts: it is
  still an arrow).
- The old module paths (``luft_redis.cli``, ``.doctor``, ``.server``, ``.testing``) are gone,
  not re-exported: the package was never released.

The arrows are read from the package's own import statements (``ast``), so a lazy import
cannot hide one.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import luft_redis

PACKAGE = Path(luft_redis.__file__).resolve().parent
ENTRY = "luft_redis.__main__"
"""Runs the command (``python -m luft_redis``); imported by nobody."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> Iterator[str]:
    """The package's modules that module ``name`` (file ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; ``from pkg import name``
            # imports pkg itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]  # fmt: skip
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ast.unparse(node.func) in ("importlib.import_module", "import_module")):
            targets = [node.args[0].value]  # a dynamic import with a literal name: an arrow too
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # ``import luft_redis.x.y`` of a name
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


ARROWS = {name: sorted(set(imported(name, path))) for name, path in MODULES.items()}


def test_the_arrows_are_read() -> None:
    # the reader sees relative, absolute, lazy and TYPE_CHECKING imports
    assert "luft_redis.tools.cli_common" in ARROWS["luft_redis.tools.cli"]
    assert "luft_redis.tools.server" in ARROWS["luft_redis.tools.testing"]
    assert "luft_redis._sync.backend" in ARROWS["luft_redis.tools.testing"]
    assert "luft_redis._version" in ARROWS["luft_redis.tracing"]
    assert "luft_redis.tools.cli" in ARROWS[ENTRY]
    assert "luft_redis.tools.web.server" in ARROWS["luft_redis.tools.cli"]  # importlib


def test_the_library_imports_no_tool() -> None:
    wrong = {
        name: [t for t in targets if t.startswith("luft_redis.tools")]
        for name, targets in ARROWS.items()
        if not name.startswith("luft_redis.tools") and name != ENTRY
    }
    assert {name: found for name, found in wrong.items() if found} == {}


def test_no_module_imports_the_package_face() -> None:
    # luft_redis/__init__.py imports both front ends: a module importing it stands both above
    # and below them (tracing did, for __version__; it lives in luft_redis/_version.py now)
    assert [name for name, targets in ARROWS.items() if "luft_redis" in targets] == []


def circles(arrows: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for target in arrows.get(node, []):
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in arrows:
        if node not in order:
            visit(node)
    return found


def test_circles_are_found() -> None:
    assert circles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert circles({"a": ["b"], "b": [], "c": ["a", "b"]}) == []


def test_no_import_circle_in_the_package() -> None:
    assert circles(ARROWS) == []


@pytest.mark.parametrize(
    "gone", ["luft_redis.cli", "luft_redis.doctor", "luft_redis.server", "luft_redis.testing"]
)
def test_the_old_module_paths_are_gone(gone: str) -> None:
    assert gone not in MODULES
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(gone)


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
