"""Print pip constraints that pin every declared dependency range of luft-redis to its lower bound.

    python .ci/lowest.py > lowest.txt
    pip install -c lowest.txt '.[dev]'

The ranges come from pyproject.toml: ``[project] dependencies`` and the optional extras a user
installs (``EXTRAS``), each ``name>=X`` pinned to ``name==X``. A requirement without a ``>=``
lower bound is refused (exit 1, naming it): every range we declare is one CI installs at both
ends, the newest in ``.venv`` and these lowest in ``.venv-lowest`` (see ``.ci/run``). The
``dev`` tools (pytest, mypy, ...) and the ``bench`` and ``servers`` extras are not pinned:
they are not what a user's install resolves against.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EXTRAS = ("hiredis", "otel", "web", "fakeredis")
"""The optional extras whose ranges a user's install depends on."""

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)\s*$")


def lowest(pyproject: dict[str, object]) -> dict[str, str]:
    """Package name (normalised) -> its declared lower bound."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    requirements: list[str] = list(project["dependencies"])
    optional = project["optional-dependencies"]
    for extra in EXTRAS:
        requirements += optional[extra]
    pins: dict[str, str] = {}
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement)
        if match is None:
            raise SystemExit(f"{requirement!r}: not 'name>=version'; declare a tested lower bound")
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        version = match.group(3)
        if pins.setdefault(name, version) != version:
            raise SystemExit(f"{name}: two lower bounds ({pins[name]} and {version})")
    return pins


def main() -> None:
    with open(ROOT / "pyproject.toml", "rb") as file:
        pins = lowest(tomllib.load(file))
    sys.stdout.write("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))


if __name__ == "__main__":
    main()
