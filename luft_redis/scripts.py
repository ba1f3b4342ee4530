"""The Lua scripts: one Redis Functions library assembled from ``lua/``, and error mapping.

Each state change is one file ``lua/<operation>-<numkeys>.lua``; shared pieces live in
``lua/includes/`` and are pulled in with a line ``--- @include "includes/<name>"``.

At load time the files become ONE Redis Functions library (:func:`library`):

* an include that has a line ``--- @each-call <statement>`` or ``--- @defines-only`` is a
  *library* include: its code is placed once at the library's top, so its helpers are defined
  once per ``FUNCTION LOAD``; at each ``@include`` line only its per-call ``<statement>``
  remains (``begin_call()`` of ``includes/call.lua``: bind the call's KEYS/ARGV). A library
  include names the includes it uses with ``@include`` lines of its own: they are placed
  before it, and a script runs the per-call statement of every include it reaches once, in
  that order (dependencies first). Other includes (``includes/main.lua``) are copied in place;
* each operation file becomes one function whose body is the file's text, wrapped in
  ``function(keys, argv) KEYS, ARGV = keys, argv ... end`` (``KEYS``/``ARGV`` are library
  locals, so the files and the helpers read them as in an EVAL script);
* ``load`` is registered with ``flags={'no-writes'}`` and called with ``FCALL_RO``;
* the library is named ``luft_<hash12>`` and each function ``<operation>_<hash12>``, where
  ``hash12`` is the first 12 hex digits of the SHA-256 of the assembled code: every version
  of the code has its own names, so versions load side by side during a rolling upgrade and a
  process only ever calls the code it was built with.

The same files still run as plain EVAL scripts (:func:`script_source`: includes expanded in
place, then the ``@each-call`` statement), which the benchmarks use as a baseline.

Loading is the front ends' job (:mod:`luft_redis._sync.backend`, :mod:`luft_redis.asyncio.backend`):
they send ``FCALL`` and, when the server answers "Function not found" (a new node, a flushed or
restarted server), ``FUNCTION LOAD REPLACE`` and the ``FCALL`` once more. What they share, free
of I/O, is here: the library, the FCALL arguments (:meth:`Function.command`), the routing of a
call on Redis Cluster (:func:`cluster_route`) and the error classification
(:func:`is_function_missing`).

Domain errors come back as ``LUFT_<CODE> message`` error replies; :func:`translate_error`
turns them, and redis-py's own exceptions, into :mod:`luft_redis.errors`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.exceptions
from redis.crc import key_slot

from . import errors
from .connect import scripting_missing
from .keys import changes_channel
from .retry import is_access_error, is_function_missing, tls_failure

__all__ = [
    "LIBRARY_PREFIX",
    "SCRIPT_NAMES",
    "Function",
    "Library",
    "Ops",
    "cluster_route",
    "is_function_missing",
    "library",
    "listed_libraries",
    "lua_dir",
    "script_source",
    "translate_error",
]

logger = logging.getLogger(__name__)

_INCLUDE = re.compile(r'^--- @include "([^"]+)"[ \t]*$', re.MULTILINE)
_EACH_CALL = re.compile(r"^--- @each-call (.+?)[ \t]*$", re.MULTILINE)
_DEFINES_ONLY = re.compile(r"^--- @defines-only[ \t]*$", re.MULTILINE)
_SCRIPT_FILE = re.compile(r"^([a-z_]+)-(\d+)\.lua$")
_KEY_INDEX = re.compile(r"\bKEYS\[(\d+)\]")

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
    "restore_run",
    "gc_run",
    "submit_agents",
    "claim_agent",
    "renew_lease",
    "release_lease",
    "agent_tasks",
    "index_status",
    "join_pool",
    "pool_add",
    "pool_pick",
    "pool_lease",
    "limit_set",
    "limit_take",
)
"""Every script the backend uses, by operation name."""

PREFIX_OPS = frozenset({"index_status", "pool_add", "pool_pick", "pool_lease", "limit_set",
                        "limit_take"})  # fmt: skip
"""The operations on keys that are not a run's (the run index, a pool's index, a rate
limiter): called with their arguments as given, no change channel derived from the keys (a
pool's wake channel is their first argument)."""

READ_ONLY = frozenset({"load", "agent_tasks"})
"""The operations registered with ``flags={'no-writes'}`` and called with ``FCALL_RO``."""

LIBRARY_PREFIX = "luft_"
"""Every luft-redis library is named ``luft_<hash12>`` (``FUNCTION LIST LIBRARYNAME luft_*``)."""

_HASH = "@HASH@"  # stands for the content hash while it is computed


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


def _script_file(name: str) -> tuple[Path, int]:
    try:
        return _script_files()[name]
    except KeyError:
        raise errors.ConfigurationError(f"no Lua script named {name!r} in {lua_dir()}") from None


@functools.cache
def _include_text(ref: str) -> str:
    path = lua_dir() / f"{ref}.lua"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise errors.ConfigurationError(f"Lua include {ref!r} unreadable: {exc}") from None


def _each_call(ref: str) -> str | None:
    """The per-call statement of a library include (``""`` for one marked ``--- @defines-only``:
    helpers and nothing to run per call), None for an include copied in place."""
    text = _include_text(ref)
    found = _EACH_CALL.findall(text)
    if len(found) > 1:
        raise errors.ConfigurationError(f"Lua include {ref!r} has more than one @each-call line")
    if found:
        return str(found[0])
    return "" if _DEFINES_ONLY.search(text) else None


def _hoist(ref: str, hoisted: dict[str, str], seen: set[str], path: tuple[str, ...]) -> list[str]:
    """Library mode: place library include ``ref`` and the includes it names in ``hoisted``
    (each once, dependencies first) and return the per-call statements of those this script
    (``seen``) has not reached yet, in the order they must run."""
    if ref in path:
        raise errors.ConfigurationError(f"Lua includes form a cycle: {' -> '.join((*path, ref))}")
    if ref in seen:
        return []
    text = _include_text(ref)
    calls: list[str] = []
    for dep in _INCLUDE.findall(text):
        if _each_call(dep) is None:
            raise errors.ConfigurationError(
                f"Lua include {ref!r} includes {dep!r}, which is not a library include "
                "(no @each-call or @defines-only line)")  # fmt: skip
        calls += _hoist(dep, hoisted, seen, (*path, ref))
    seen.add(ref)
    if ref not in hoisted:
        hoisted[ref] = f"-- ---- {ref}.lua\n" + _INCLUDE.sub("", text)
    call = _each_call(ref)
    if call:
        calls.append(call)
    return calls


def _expand(text: str, seen: set[str], hoisted: dict[str, str] | None) -> str:
    """``text`` with its includes expanded (each once per ``seen``). With ``hoisted`` (library
    mode) a library include's code goes to ``hoisted`` once (:func:`_hoist`) and its site
    keeps the per-call statements; without, its code and then its statement are placed at the
    site (EVAL mode), the includes it names first."""

    def include(m: re.Match[str]) -> str:
        ref = m.group(1)
        call = _each_call(ref)
        if call is not None and hoisted is not None:
            return "\n".join(_hoist(ref, hoisted, seen, ()))
        if ref in seen:
            return ""
        seen.add(ref)
        body = _expand(_include_text(ref), seen, hoisted)
        return body if not call else f"{body}\n{call}"

    return _INCLUDE.sub(include, text)


@functools.cache
def script_source(name: str) -> str:
    """The full source of script ``name`` as a standalone EVAL script (includes expanded)."""
    path, _ = _script_file(name)
    return _expand(path.read_text(encoding="utf-8"), set(), None)


def script_numkeys(name: str) -> int:
    """The number of KEYS script ``name`` takes (from its file name)."""
    return _script_file(name)[1]


@dataclass(frozen=True, slots=True)
class Function:
    """One operation of the library: its function name and how to call it."""

    op: str
    """The operation (``append_events``)."""
    file: str
    """Its file in ``lua/`` (``append_events-12.lua``)."""
    name: str
    """The function's name in Redis (``append_events_<hash12>``)."""
    numkeys: int
    read_only: bool
    head: tuple[str, str, int]
    """``(FCALL or FCALL_RO, name, numkeys)``: the start of every call."""

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The whole FCALL command; ConfigurationError unless ``keys`` has ``numkeys`` keys.

        A writing function publishes its change notice on the run's channel, which is not a
        key: it goes first in ``ARGV`` (derived from ``keys[0]``, the run's main hash, by
        :func:`luft_redis.keys.changes_channel`), before ``args``."""
        if len(keys) != self.numkeys:
            raise errors.ConfigurationError(
                f"Lua script {self.file} takes {self.numkeys} keys, {len(keys)} were passed"
            )
        if self.read_only or self.op in PREFIX_OPS:
            return (*self.head, *keys, *args)
        run = keys[0]
        channel = changes_channel(run if isinstance(run, str) else run.decode())
        return (*self.head, *keys, channel, *args)


class Ops:
    """The library's functions by operation: ``ops.append_events`` and so on."""

    __slots__ = SCRIPT_NAMES
    init_run: Function
    append_events: Function
    upsert_agent_result: Function
    upsert_agent_session: Function
    cancel: Function
    reset_status_to_running: Function
    save_checkpoint: Function
    load: Function
    delete_run: Function
    restore_run: Function
    gc_run: Function
    submit_agents: Function
    claim_agent: Function
    renew_lease: Function
    release_lease: Function
    agent_tasks: Function
    index_status: Function
    join_pool: Function
    pool_add: Function
    pool_pick: Function
    pool_lease: Function
    limit_set: Function
    limit_take: Function

    def __init__(self, functions: dict[str, Function]) -> None:
        for op in SCRIPT_NAMES:
            object.__setattr__(self, op, functions[op])


@dataclass(frozen=True, slots=True)
class Library:
    """The assembled library: its code, names and functions."""

    digest: str
    """The first 12 hex digits of the SHA-256 of the code (with the names left out)."""
    name: str
    """``luft_<digest>``."""
    code: str
    """What ``FUNCTION LOAD`` takes (``#!lua name=luft_<digest>`` first)."""
    ops: Ops

    @property
    def load_command(self) -> tuple[str, str, str, str]:
        """``FUNCTION LOAD REPLACE <code>``."""
        return ("FUNCTION", "LOAD", "REPLACE", self.code)


def _check_keys(name: str, numkeys: int, text: str) -> None:
    """ConfigurationError when a script reads a KEYS index past its file name's count."""
    used = [int(i) for i in _KEY_INDEX.findall(text)]
    if used and max(used) > numkeys:
        raise errors.ConfigurationError(
            f"Lua script {name}-{numkeys}.lua reads KEYS[{max(used)}] but its name says "
            f"{numkeys} keys")  # fmt: skip


def _lua_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@functools.cache
def library() -> Library:
    """The library of this code (assembled once per process)."""
    hoisted: dict[str, str] = {}  # library includes, in order of first use
    parts: list[str] = []
    for op in SCRIPT_NAMES:
        path, numkeys = _script_file(op)
        body = _expand(path.read_text(encoding="utf-8"), set(), hoisted)
        _check_keys(op, numkeys, script_source(op))
        flags = "\n  flags = {'no-writes'}," if op in READ_ONLY else ""
        parts.append(
            f"-- ---- {path.name}\n"
            "redis.register_function{\n"
            f"  function_name = {_lua_string(f'{op}_{_HASH}')},{flags}\n"
            "  callback = function(keys, argv)\n"
            "KEYS, ARGV = keys, argv\n"
            f"{body.rstrip()}\n"
            "  end,\n"
            "}\n"
        )
    template = (
        f"#!lua name={LIBRARY_PREFIX}{_HASH}\n"
        "-- luft-redis: the scripts of lua/ as one library, assembled by luft_redis/scripts.py\n"
        "local KEYS, ARGV -- this call's keys and arguments (set first by every function)\n\n"
        + "\n".join(hoisted.values())
        + "\n"
        + "\n".join(parts)
    )
    digest = hashlib.sha256(template.encode("utf-8")).hexdigest()[:12]
    functions: dict[str, Function] = {}
    for op in SCRIPT_NAMES:
        path, numkeys = _script_file(op)
        name = f"{op}_{digest}"
        command = "FCALL_RO" if op in READ_ONLY else "FCALL"
        functions[op] = Function(op, path.name, name, numkeys, op in READ_ONLY,
                                 (command, name, numkeys))  # fmt: skip
    return Library(digest, f"{LIBRARY_PREFIX}{digest}", template.replace(_HASH, digest),
                   Ops(functions))  # fmt: skip


def _entry(item: Any) -> dict[bytes | str, Any]:
    """One map of a FUNCTION LIST reply: a dict (RESP3) or a flat key/value list (RESP2)."""
    if isinstance(item, dict):
        return item
    return dict(zip(item[::2], item[1::2], strict=False))


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def listed_libraries(reply: Any) -> dict[str, list[str]]:
    """A ``FUNCTION LIST`` reply as {library name: its function names} (sorted)."""
    found: dict[str, list[str]] = {}
    for item in reply or ():
        entry = {_str(k): v for k, v in _entry(item).items()}
        functions = [_str({_str(k): v for k, v in _entry(f).items()}.get("name", ""))
                     for f in entry.get("functions") or ()]  # fmt: skip
        found[_str(entry.get("library_name", ""))] = sorted(functions)
    return dict(sorted(found.items()))


def cluster_route(client: Any, keys: Sequence[Any]) -> dict[str, Any]:
    """The keyword arguments that send a call on ``keys`` to the primary owning their slot on a
    ``RedisCluster`` (sync or asyncio) client: ``{"target_nodes": node}``, from the client's
    slot table (no I/O). That spares redis-py the ``COMMAND GETKEYS`` round trip it makes to
    find an FCALL's keys. ``{}`` (redis-py routes it, with its own retries) while the table
    does not cover the slot, as during a failover."""
    key = keys[0]
    slot = key_slot(key.encode() if isinstance(key, str) else key)
    try:
        return {"target_nodes": client.nodes_manager.get_node_from_slot(slot)}
    except redis.exceptions.SlotNotCoveredError:
        return {}


def translate_error(
    exc: BaseException, *, run_id: object = None, prefix: str | None = None,
    command: str | None = None, key: str | None = None,
) -> errors.LuftRedisError:  # fmt: skip
    """The luft-redis error for an exception raised by redis-py while running a command.

    ``prefix`` and ``command`` (default: the one Redis names, else the script call) go into a
    :class:`~luft_redis.errors.PermissionDeniedError`; ``key`` (the one key a plain command
    read) into the :class:`~luft_redis.errors.CorruptDataError` of a ``WRONGTYPE`` reply.
    """
    if isinstance(exc, errors.LuftRedisError):
        return exc
    access = _access_error(exc, prefix, command)
    if access is not None:
        return access
    if isinstance(exc, redis.exceptions.ResponseError):
        text = str(exc)
        if text.startswith("LUFT_"):
            code, _, message = text[5:].partition(" ")
            return _domain_error(code, message, run_id, prefix)
        if (no_lua := scripting_missing(text)) is not None:  # fakeredis without Lua
            return no_lua
        if text.startswith("WRONGTYPE") and key is not None:
            return errors.CorruptDataError(key, "type", "is not the type luft-redis stores there")
        return errors.BackendError(f"Redis refused a luft-redis command: {text}")
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return errors.ConnectionError(f"Redis is unreachable: {exc}")
    if isinstance(exc, redis.exceptions.ClusterError) and str(exc).startswith("TTL exhausted"):
        return errors.BackendError(
            "Redis Cluster kept redirecting the call (TRYAGAIN, ASK or MOVED: its slot is being "
            f"migrated) until the retry policy gave up ({exc})")
    if isinstance(exc, (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)):
        return errors.BackendError(f"Redis error: {exc}")
    return errors.BackendError(f"unexpected error talking to Redis: {exc!r}")


_NAMED_COMMAND = re.compile(r"'([A-Za-z|_-]+)' command")


def _access_error(exc: BaseException, prefix: str | None,
                  command: str | None) -> errors.LuftRedisError | None:  # fmt: skip
    """The typed error of an authentication, ACL or TLS refusal (see retry.is_access_error)."""
    if not is_access_error(exc):
        return None
    text = str(exc)
    if tls_failure(exc):
        return errors.TLSError(f"TLS handshake with Redis failed: {text}")
    if isinstance(exc, redis.exceptions.NoPermissionError) or text.startswith("NOPERM"):
        named = _NAMED_COMMAND.search(text)
        what = named.group(1).upper() if named else command or "FCALL (a luft-redis function)"
        detail = text.removeprefix("NOPERM").strip() or "permission denied"
        return errors.PermissionDeniedError(prefix, what, detail)
    if "HELLO must be called" in text or "NOAUTH" in text or "Authentication required" in text:
        return errors.AuthenticationError(
            "Redis requires a password: put it in the URL (redis://:PASSWORD@host:port, "
            "redis://USER:PASSWORD@host:port) or pass password=/username="
        )
    return errors.AuthenticationError(f"Redis refused the credentials: {text}")


def _domain_error(code: str, message: str, run_id: object,
                  prefix: str | None = None) -> errors.LuftRedisError:  # fmt: skip
    if code == "EXISTS":
        return errors.RunExistsError(run_id)
    if code == "NO_RUN":
        return errors.RunNotFoundError(run_id, prefix)
    if code == "NOT_RESUMABLE":
        return errors.NotResumableError(run_id, message.strip())
    if code == "CORRUPT":
        key, _, rest = message.partition(" ")
        field, _, detail = rest.partition(" ")
        return errors.CorruptDataError(key, field, detail)
    if code == "OVERFLOW":
        return errors.ValidationError("total_tokens", message)
    if code == "LEASE_LOST":
        agent, _, rest = message.strip().partition(" ")
        stale, _, current = rest.partition(" ")
        return errors.LeaseLostError(agent, stale, None if current in ("", "-") else current)
    if code == "NOT_RUNNING":
        return errors.RunNotRunningError(run_id, message.strip())
    if code == "TASK_MISMATCH":
        return errors.ValidationError(
            f"tasks[{message.strip()}]",
            "this agent was submitted before with another phase, payload, limiter or "
            "expected tokens",
        )
    if code == "NO_LIMITER":
        return errors.LimiterNotFoundError(message.strip())
    if code == "STALE":
        return errors.BackendError(f"a newer operation of this backend was applied: {message}")
    return errors.BackendError(f"luft-redis script rejected its arguments: {code} {message}")
