"""CI runs exactly the README's full test commands, and the everyday ``pytest`` is what the
README says it is (``.ci/run``, README "Development", pyproject's pytest options)."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _read(name: str) -> str:
    path = ROOT / name
    if not path.is_file():
        pytest.skip(f"not run from a checkout ({path} is missing)")
    return path.read_text(encoding="utf-8")


def _readme_test_commands() -> list[str]:
    """The pytest lines of the README's "Development" section, in order."""
    text = _read("README.md")
    section = text.split("\n## Development\n", 1)[1].split("\n## ", 1)[0]
    return [
        line.strip()
        for line in section.splitlines()
        if re.match(r"(LUFT_REDIS_SERVER=\S+ )?\.venv(-lowest)?/bin/pytest\b", line.strip())
    ]


def _ci_test_commands() -> list[str]:
    """The commands ``.ci/run`` hands to ``run_pytest``, in order."""
    return [
        line.removeprefix("run_pytest ").strip()
        for line in _read(".ci/run").splitlines()
        if line.startswith("run_pytest ")
    ]


def test_ci_runs_exactly_the_readme_full_commands() -> None:
    readme = _readme_test_commands()
    assert readme[0] == ".venv/bin/pytest", f"the everyday command comes first: {readme}"
    assert readme[-1] == ".venv-lowest/bin/pytest", f"the lowest versions' run comes last: {readme}"
    full = readme[1:-1]
    assert full, "the README gives no full test command"
    assert all("--full" in line and "--durations=20" in line for line in full), full
    assert _ci_test_commands() == readme[1:]


def test_ci_pins_every_declared_range_to_its_lower_bound() -> None:
    """``.ci/lowest.py`` pins each runtime requirement and user-facing extra to its lower bound,
    and refuses a requirement that declares none; ``.ci/run`` installs those pins."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lowest", ROOT / ".ci" / "lowest.py")
    if spec is None or spec.loader is None or not (ROOT / ".ci" / "lowest.py").is_file():
        pytest.skip("not run from a checkout")
    lowest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lowest)
    pyproject = tomllib.loads(_read("pyproject.toml"))
    pins = lowest.lowest(pyproject)
    project = pyproject["project"]
    declared = list(project["dependencies"])
    for extra in lowest.EXTRAS:
        declared += project["optional-dependencies"][extra]
    for requirement in declared:
        name, bound = re.split(r"[\[>]", requirement)[0], requirement.split(">=")[1]
        assert pins[name.lower()] == bound, (requirement, pins)
    assert {"redis", "msgpack", "tenacity", "immutables", "hiredis", "fakeredis", "starlette",
            "uvicorn"} <= set(pins)  # fmt: skip
    broken = {"project": {**project, "dependencies": [*declared, "anything"]}}
    with pytest.raises(SystemExit, match="'anything': not 'name>=version'"):
        lowest.lowest(broken)
    run = _read(".ci/run")
    assert "-c .venv-lowest.txt" in run and ".ci/lowest.py > .venv-lowest.txt" in run


def test_the_server_matrix_names_packaged_servers() -> None:
    from luft_redis.tools.server import PACKAGED_SERVERS

    servers = [
        shlex.split(line)[0].partition("=")[2]
        for line in _ci_test_commands()
        if line.startswith("LUFT_REDIS_SERVER=")
    ]
    assert servers == sorted(PACKAGED_SERVERS)
    pyproject = tomllib.loads(_read("pyproject.toml"))
    extra = pyproject["project"]["optional-dependencies"]["servers"]
    for name in servers:
        distribution = PACKAGED_SERVERS[name][0]
        assert any(req.startswith(distribution) for req in extra), (name, extra)
    assert '.[dev,servers]"' in _read(".ci/run")


def test_the_everyday_loop_uses_both_cores_and_knows_full() -> None:
    pyproject = tomllib.loads(_read("pyproject.toml"))
    options = pyproject["tool"]["pytest"]["ini_options"]
    assert "-n auto" in options["addopts"]
    assert any(marker.startswith("full:") for marker in options["markers"])
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    assert any(req.startswith("pytest-xdist") for req in dev)
