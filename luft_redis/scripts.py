"""The Lua scripts: loading from ``lua/``, include expansion, registration, error mapping.

Each state change is one script file ``lua/<operation>-<numkeys>.lua``; shared pieces live in
``lua/includes/`` and are pulled in with a line ``--- @include "includes/<name>"`` (each piece
once per script). Scripts run through redis-py ``Script`` objects (EVALSHA, reloaded by
themselves after ``NOSCRIPT``), which works on ``Redis``, ``RedisCluster`` and fakeredis.

Domain errors come back as ``LUFT_<CODE> message`` error replies; :func:`translate_error`
turns them, and redis-py's own exceptions, into :mod:`luft_redis.errors`.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

import redis
import redis.exceptions

from . import errors
from .connect import scripting_missing

__all__ = ["SCRIPT_NAMES", "Scripts", "lua_dir", "script_source", "translate_error"]

logger = logging.getLogger(__name__)

_INCLUDE = re.compile(r'^--- @include "([^"]+)"[ \t]*$', re.MULTILINE)
_SCRIPT_FILE = re.compile(r"^([a-z_]+)-(\d+)\.lua$")

SCRIPT_NAMES = (
    "init_run",
    "append_events",
    "upsert_agent_result",
    "upsert_agent_session",
    "cancel",
    "reset_status_to_running",
    "save_checkpoint",
    "load",
    "delete_run",
)
"""Every script the backend uses, by operation name."""


@functools.cache
def lua_dir() -> Path:
    """The folder of the Lua scripts: inside the installed package, else the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "includes").is_dir():
            return candidate
    raise errors.ConfigurationError(f"Lua scripts not found next to {here}")


@functools.cache
def _script_files() -> dict[str, tuple[Path, int]]:
    found: dict[str, tuple[Path, int]] = {}
    for path in sorted(lua_dir().glob("*.lua")):
        m = _SCRIPT_FILE.match(path.name)
        if m:
            found[m.group(1)] = (path, int(m.group(2)))
    return found


@functools.cache
def script_source(name: str) -> str:
    """The full source of script ``name`` with its includes expanded."""
    try:
        path, _ = _script_files()[name]
    except KeyError:
        raise errors.ConfigurationError(f"no Lua script named {name!r} in {lua_dir()}") from None
    seen: set[str] = set()

    def expand(text: str) -> str:
        def include(m: re.Match[str]) -> str:
            ref = m.group(1)
            if ref in seen:
                return ""
            seen.add(ref)
            return expand((lua_dir() / f"{ref}.lua").read_text(encoding="utf-8"))

        return _INCLUDE.sub(include, text)

    return expand(path.read_text(encoding="utf-8"))


def script_numkeys(name: str) -> int:
    """The number of KEYS script ``name`` takes (from its file name)."""
    return _script_files()[name][1]


class Scripts:
    """The scripts registered on one client (cheap: the sources are processed once)."""

    __slots__ = tuple(SCRIPT_NAMES)

    def __init__(self, client: Any) -> None:
        for name in SCRIPT_NAMES:
            object.__setattr__(self, name, client.register_script(script_source(name)))

    def __getattr__(self, name: str) -> Any:  # for type-checkers: attributes are Scripts
        raise AttributeError(name)


def translate_error(exc: BaseException, *, run_id: object = None) -> errors.LuftRedisError:
    """The luft-redis error for an exception raised by redis-py while running a command."""
    if isinstance(exc, errors.LuftRedisError):
        return exc
    if isinstance(exc, redis.exceptions.ResponseError):
        text = str(exc)
        if text.startswith("LUFT_"):
            code, _, message = text[5:].partition(" ")
            return _domain_error(code, message, run_id)
        if (no_lua := scripting_missing(text)) is not None:  # fakeredis without Lua
            return no_lua
        return errors.BackendError(f"Redis refused a luft-redis command: {text}")
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return errors.ConnectionError(f"Redis is unreachable: {exc}")
    if isinstance(exc, (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)):
        return errors.BackendError(f"Redis error: {exc}")
    return errors.BackendError(f"unexpected error talking to Redis: {exc!r}")


def _domain_error(code: str, message: str, run_id: object) -> errors.LuftRedisError:
    if code == "EXISTS":
        return errors.RunExistsError(run_id)
    if code == "NO_RUN":
        return errors.RunNotFoundError(run_id)
    if code == "NOT_RESUMABLE":
        return errors.NotResumableError(run_id, message.strip())
    if code == "CORRUPT":
        key, _, rest = message.partition(" ")
        field, _, detail = rest.partition(" ")
        return errors.CorruptDataError(key, field, detail)
    if code == "OVERFLOW":
        return errors.ValidationError("total_tokens", message)
    if code == "STALE":
        return errors.BackendError(f"a newer operation of this backend was applied: {message}")
    return errors.BackendError(f"luft-redis script rejected its arguments: {code} {message}")
