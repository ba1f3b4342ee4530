"""Check that a Redis server is configured safely for luft-redis checkpoints.

:func:`check_server` asks the server about the settings that decide whether checkpoints
survive: the eviction policy (``maxmemory-policy``), persistence (AOF and RDB), the Redis
version the Lua scripts need, and cluster mode; it also lists the luft-redis Functions
libraries loaded (``luft_<hash>``, one per version of the code), marking this version's.
Each answer becomes a :class:`Check` with a level:

``ok``
    nothing to do;
``warn``
    works, but weaker than recommended (RDB snapshots only, ``appendfsync no``, a
    ``volatile-*`` eviction policy, ...);
``unsafe``
    checkpoints can be lost or the scripts cannot run (eviction of any key, no persistence,
    Redis older than 7.0);
``unknown``
    the server refused to say: fakeredis, or a managed service that disables or renames
    ``CONFIG``/``INFO``. An unknown check is not an error.

Every question is asked on its own with its own error handling, so one refused command never
hides the answers of the others. Only an unreachable server is an error
(:class:`luft_redis.errors.ConnectionError`).

Example::

    report = check_server(redis.Redis.from_url("redis://127.0.0.1:6379/0"))
    for check in report.checks:
        print(check.level, check.name, check.message)
    assert report.ok
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

import redis
import redis.cluster
import redis.exceptions

from .. import errors
from ..keys import run_keys
from ..retention import FINAL_STATUSES, iter_run_ids
from ..scripts import LIBRARY_PREFIX, library, listed_libraries

__all__ = [
    "DEFAULT_RUN_SAMPLE",
    "LEVELS",
    "MIN_REDIS_VERSION",
    "Check",
    "Level",
    "ServerReport",
    "check_runs",
    "check_server",
]

logger = logging.getLogger(__name__)

Level: TypeAlias = Literal["ok", "warn", "unsafe", "unknown"]
"""How a check came out (see the module documentation)."""

LEVELS: Final[tuple[Level, ...]] = ("ok", "unknown", "warn", "unsafe")
"""Every level, from the best to the worst."""

MIN_REDIS_VERSION: Final = (7, 0)
"""The oldest Redis the Lua scripts run on (they use 7.0 features)."""

_SAFE_POLICY: Final = "noeviction"


@dataclass(frozen=True)
class Check:
    """The outcome of one check.

    ``name`` says what was checked (``"maxmemory-policy"``, ``"persistence"``, ...), ``level``
    how it came out, ``message`` what was found and what to do about it. ``node`` is the
    ``host:port`` of the cluster primary the check is about, or ``None`` for a single server.
    """

    name: str
    level: Level
    message: str
    node: str | None = None


@dataclass(frozen=True)
class ServerReport:
    """Every check of one server (or of every primary of a cluster).

    ``ok`` is true when no check is ``unsafe``; ``warn`` and ``unknown`` checks do not make a
    report fail.
    """

    ok: bool
    checks: list[Check] = field(default_factory=list)

    @property
    def level(self) -> Level:
        """The worst level of any check (``"ok"`` for an empty report)."""
        return max((check.level for check in self.checks), key=LEVELS.index, default="ok")

    def by_level(self, level: Level) -> list[Check]:
        """The checks that came out as ``level``."""
        return [check for check in self.checks if check.level == level]


# ---------------------------------------------------------------------------- helpers


class _Refused(Exception):
    """The server answered a question with an error (disabled, renamed, no permission)."""


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _ask(what: str, call: Any, *args: Any) -> Any:
    """Run one command; refusals become :class:`_Refused`, an unreachable server an error."""
    try:
        return call(*args)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        # AuthenticationError is a ConnectionError too: the server cannot be used either way.
        raise errors.ConnectionError(f"Redis is unreachable: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        logger.debug("%s refused: %s", what, exc)
        raise _Refused(f"{what} refused: {exc}") from exc


def _parse_version(text: str) -> tuple[int, ...] | None:
    parts: list[int] = []
    for piece in text.strip().split("."):
        digits = re.match(r"\d+", piece)  # the leading digits of each dotted piece
        if digits is None:
            break
        parts.append(int(digits[0]))
    return tuple(parts) if parts else None


class _Probe:
    """Asks one server each question once (lazily) and remembers the reply or the refusal."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._replies: dict[str, Any] = {}  # by question: the reply, or the _Refused

    def _once(self, question: str, call: Any, *args: Any) -> Any:
        """``_ask(question, call, *args)`` the first time; then its reply or refusal again."""
        if question not in self._replies:
            try:
                self._replies[question] = _ask(question, call, *args)
            except _Refused as exc:
                self._replies[question] = exc
        reply = self._replies[question]
        if isinstance(reply, _Refused):
            raise reply
        return reply

    def info(self, section: str) -> dict[str, str]:
        """``INFO <section>`` as a dict of text; raises :class:`_Refused`."""
        reply = self._once(f"INFO {section}", self.client.info, section)
        if not isinstance(reply, Mapping):
            raise _Refused(f"INFO {section} gave an unexpected reply {reply!r}")
        return {_text(k): _text(v) for k, v in reply.items()}

    def config(self, name: str) -> str:
        """The value of one ``CONFIG GET`` parameter; raises :class:`_Refused`."""
        reply = self._once(f"CONFIG GET {name}", self.client.config_get, name)
        if isinstance(reply, Mapping):
            for key, value in reply.items():
                if _text(key).lower() == name:
                    return _text(value)
        raise _Refused(f"CONFIG GET {name} did not return {name}")


# ---------------------------------------------------------------------------- the checks

_Outcome: TypeAlias = tuple[Level, str]
"""How one check came out: its level and its message."""


def _version(probe: _Probe) -> _Outcome:
    try:
        server = probe.info("server")
    except _Refused as exc:
        return "unknown", f"cannot tell the Redis version ({exc})"
    text = server.get("redis_version", "")
    version = _parse_version(text)
    if version is None:
        return "unknown", f"cannot parse redis_version {text!r}"
    flavour = f"valkey {server['valkey_version']}, " if "valkey_version" in server else ""
    wanted = ".".join(map(str, MIN_REDIS_VERSION))
    if version[: len(MIN_REDIS_VERSION)] < MIN_REDIS_VERSION:
        return "unsafe", (
            f"Redis {text} ({flavour}older than {wanted}): the luft-redis scripts use "
            f"{wanted} features; upgrade the server"
        )
    return "ok", f"Redis {text}" + (f" ({flavour.rstrip(', ')})" if flavour else "")


def _cluster_mode(probe: _Probe, cluster_client: bool) -> _Outcome:
    try:
        mode = probe.info("server").get("redis_mode", "")
    except _Refused as exc:
        if cluster_client:
            return "ok", "cluster (the client is a RedisCluster)"
        return "unknown", f"cannot tell whether this is a cluster ({exc})"
    if mode == "cluster":
        if cluster_client:
            return "ok", "cluster mode; every run lives in one slot ({run-id} tag)"
        return "warn", (
            "the server is in cluster mode but the client is not a RedisCluster: "
            "use RedisCheckpointBackend.from_url(..., cluster=True) (luft-redis --cluster)"
        )
    if mode == "sentinel":
        return "warn", "this is a Sentinel, not a data server: connect to the primary"
    if not mode:
        return "unknown", "INFO server does not report redis_mode"
    return "ok", f"{mode} (not a cluster)"


def _policy(probe: _Probe) -> _Outcome:
    try:
        policy = probe.config("maxmemory-policy")
        source = "CONFIG GET"
    except _Refused as exc:
        # Managed services often disable CONFIG but still show the policy in INFO memory.
        try:
            policy = probe.info("memory")["maxmemory_policy"]
            source = "INFO memory"
        except (_Refused, KeyError):
            return "unknown", (
                f"cannot read maxmemory-policy ({exc}); make sure it is {_SAFE_POLICY}"
            )
    policy = policy.strip().lower()
    logger.debug("maxmemory-policy %s (from %s)", policy, source)
    if policy == _SAFE_POLICY:
        return "ok", "noeviction: a full Redis refuses writes instead of evicting"
    if policy.startswith("volatile-"):
        return "warn", (
            f"{policy} evicts only keys with a TTL (luft-redis sets none), but other data may be "
            f"evicted and the intent is unclear; set maxmemory-policy {_SAFE_POLICY}"
        )
    return "unsafe", (
        f"{policy}: when maxmemory is reached Redis silently evicts keys, including "
        f"checkpoints and event logs; set maxmemory-policy {_SAFE_POLICY}"
    )


def _aof_enabled(probe: _Probe) -> bool | None:
    with contextlib.suppress(_Refused):
        return probe.config("appendonly").strip().lower() == "yes"
    try:
        return probe.info("persistence")["aof_enabled"].strip() == "1"
    except (_Refused, KeyError):
        return None


def _persistence(probe: _Probe) -> _Outcome:
    aof = _aof_enabled(probe)
    save: str | None = None
    with contextlib.suppress(_Refused):
        save = probe.config("save").strip()
    if aof:
        also = f"; RDB save rules {save!r} as well" if save else ""
        return "ok", f"AOF on (appendonly yes){also}"
    if aof is None and save is None:
        return "unknown", (
            "cannot read appendonly or save (CONFIG refused); make sure AOF (appendonly yes) "
            "or RDB snapshots are on, or checkpoints are lost when Redis restarts"
        )
    if save:
        return "warn", (
            f"RDB snapshots only (save {save!r}): a crash loses every change since the last "
            "snapshot; prefer appendonly yes"
        )
    if save is None:
        return "unknown", (
            "appendonly is off and the RDB save rules cannot be read (CONFIG GET save "
            "refused): checkpoints may not survive a restart"
        )
    return "unsafe", (
        'no persistence (appendonly no, save ""): every checkpoint is lost when Redis '
        "restarts; set appendonly yes"
    )


#: What each appendfsync mode means.
_FSYNC: Final = {
    "always": "always: every write is on disk before Redis answers",
    "everysec": "everysec: a crash of the machine loses up to ~1 s",
    "no": (
        "no: the OS decides when to flush, a crash of the machine may lose ~30 s; prefer everysec"
    ),
}


def _fsync(probe: _Probe) -> _Outcome:
    aof = _aof_enabled(probe)  # the persistence check asked already: the probe remembers
    try:
        mode = probe.config("appendfsync").strip().lower()
    except _Refused as exc:
        return "unknown", f"cannot read appendfsync ({exc})"
    if mode not in _FSYNC:
        return "unknown", f"unexpected appendfsync {mode!r}"
    unused = " (not in effect: the AOF is off)" if aof is False else ""
    return "warn" if mode == "no" and aof is not False else "ok", _FSYNC[mode] + unused


def _last_writes(probe: _Probe) -> dict[str, _Outcome]:
    """The last AOF write and RDB save, when they failed (disk full, permissions)."""
    try:
        info = probe.info("persistence")
    except _Refused:
        return {}
    failed: dict[str, _Outcome] = {}
    if info.get("aof_enabled") == "1" and info.get("aof_last_write_status", "ok") != "ok":
        failed["aof-write"] = "unsafe", ("the last AOF write failed (aof_last_write_status err): "
                                         "check disk space and the Redis log")  # fmt: skip
    if info.get("rdb_last_bgsave_status", "ok") != "ok":
        failed["rdb-save"] = "warn", ("the last RDB background save failed (rdb_last_bgsave_status "
                                      "err): check disk space and the Redis log")  # fmt: skip
    return failed


def _functions(client: redis.Redis) -> _Outcome:
    """The luft-redis Functions libraries loaded on the server, this version's marked."""
    ours = library().name
    try:
        reply = _ask("FUNCTION LIST", client.execute_command, "FUNCTION", "LIST",
                     "LIBRARYNAME", f"{LIBRARY_PREFIX}*")  # fmt: skip
    except _Refused as exc:
        return "unknown", f"cannot list the Functions libraries ({exc})"
    loaded = [lib for lib in listed_libraries(reply) if lib.startswith(LIBRARY_PREFIX)]
    if not loaded:
        return "ok", f"no luft-redis library loaded yet; the first call loads {ours}"
    listed = ", ".join(f"{lib} (this version)" if lib == ours else lib for lib in loaded)
    others = len(loaded) - (ours in loaded)
    note = ""
    if others:
        note = (f"; {others} other version(s): FUNCTION DELETE each once no process of that "
                "version runs")  # fmt: skip
    if ours not in loaded:
        note += f"; this version's {ours} is loaded by its first call"
    return "ok", f"luft-redis libraries: {listed}{note}"


def _check_node(client: redis.Redis, *, cluster_client: bool, node: str | None) -> list[Check]:
    """Every check of one server, by name in report order (the questions are asked in it)."""
    probe = _Probe(client)
    outcomes = {
        "redis-version": _version(probe),
        "cluster-mode": _cluster_mode(probe, cluster_client),
        "maxmemory-policy": _policy(probe),
        "persistence": _persistence(probe),
        "appendfsync": _fsync(probe),
        **_last_writes(probe),
        "functions": _functions(client),
    }
    return [Check(name, level, message, node) for name, (level, message) in outcomes.items()]


def _ping(client: Any) -> None:
    try:
        _ask("PING", client.ping)
    except redis.exceptions.RedisClusterException as exc:
        raise errors.ConnectionError(f"Redis Cluster is unreachable: {exc}") from exc
    except _Refused:
        pass  # e.g. NOPERM for PING: the server answered, so it is reachable


# ---------------------------------------------------------------------------- the runs

DEFAULT_RUN_SAMPLE: Final = 50
"""Runs whose memory ``check_runs`` measures (MEMORY USAGE of each of their keys)."""

DEFAULT_SCAN_LIMIT: Final = 100_000
"""Runs ``check_runs`` looks at, at most, to count the finished runs without a TTL."""

_BATCH: Final = 200


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _run_memory(client: Any, prefix: str, sample: list[Any]) -> _Outcome:
    """MEMORY USAGE summed over the keys of each sampled run."""
    if not sample:
        return "ok", f"no runs under prefix {prefix!r}"
    sizes: list[tuple[int, Any]] = []
    try:
        for run_id in sample:
            total = sum(int(_ask("MEMORY USAGE", client.memory_usage, key) or 0)
                        for key in run_keys(prefix, run_id))  # fmt: skip
            sizes.append((total, run_id))
    except _Refused as exc:
        return "unknown", f"cannot measure the runs ({exc})"
    mean = sum(size for size, _ in sizes) / len(sizes)
    largest, largest_id = max(sizes, key=lambda item: item[0])
    return "ok", (
        f"{_size(mean)} per run on average over {len(sizes)} sampled run(s); largest "
        f"{_size(largest)} (run {largest_id})"
    )


def check_runs(
    client: Any,
    prefix: str,
    *,
    sample: int = DEFAULT_RUN_SAMPLE,
    scan_limit: int = DEFAULT_SCAN_LIMIT,
) -> list[Check]:
    """Checks of the runs stored under ``prefix``: their memory (``run-memory``: MEMORY USAGE
    of every key of the first ``sample`` runs found) and the finished runs that will never
    expire (``runs-without-ttl``: warn when any finished run has no TTL; set
    ``expire_finished_after`` or run ``luft-redis gc``).

    Bounded: a SCAN of at most ``scan_limit`` runs, read in pipelined batches.
    """
    runs = finished = no_ttl = 0
    sampled: list[Any] = []
    capped = False
    batch: list[Any] = []

    def count(batch: list[Any]) -> None:
        nonlocal runs, finished, no_ttl
        pipe = client.pipeline(transaction=False)
        for run_id in batch:
            key = run_keys(prefix, run_id).run
            pipe.hget(key, "status")
            pipe.pttl(key)
        replies = _ask("HGET/PTTL of the runs", pipe.execute)
        for status, ttl in zip(replies[::2], replies[1::2], strict=True):
            if status is None:
                continue
            runs += 1
            if _text(status) in FINAL_STATUSES:
                finished += 1
                no_ttl += int(ttl) == -1

    try:
        for run_id in iter_run_ids(client, prefix):
            if runs + len(batch) >= scan_limit:
                capped = True
                break
            if len(sampled) < sample:
                sampled.append(run_id)
            batch.append(run_id)
            if len(batch) >= _BATCH:
                count(batch)
                batch = []
        if batch:
            count(batch)
    except (_Refused, errors.BackendError) as exc:
        return [Check("runs-without-ttl", "unknown", f"cannot read the runs ({exc})")]
    at_least = "at least " if capped else ""
    where = f"{at_least}{runs} run(s) under prefix {prefix!r}"
    ttl: _Outcome = "ok", f"every finished run expires ({finished} finished of {where})"
    if no_ttl:
        ttl = "warn", (
            f"{at_least}{no_ttl} of {finished} finished run(s) ({where}) have no TTL and stay "
            "until deleted: give the backends expire_finished_after=, or run luft-redis gc "
            "--older-than 7d")  # fmt: skip
    return [
        Check("run-memory", *_run_memory(client, prefix, sampled)),
        Check("runs-without-ttl", *ttl),
    ]


def check_server(client: Any, *, prefix: str | None = None) -> ServerReport:
    """Check the server(s) behind ``client`` and return a :class:`ServerReport`.

    ``client`` is a ``redis.Redis`` (or fakeredis) client or a ``RedisCluster``; on a cluster
    every primary is checked and each check names its node. Commands the server refuses give
    ``unknown`` checks; :class:`luft_redis.errors.ConnectionError` is raised only when the
    server cannot be reached at all. With ``prefix``, the runs under that prefix are checked
    too (:func:`check_runs`).
    """
    _ping(client)
    checks: list[Check] = []
    if isinstance(client, redis.cluster.RedisCluster):
        try:
            primaries = list(client.get_primaries())  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisClusterException as exc:
            raise errors.ConnectionError(f"Redis Cluster is unreachable: {exc}") from exc
        if not primaries:
            checks.append(Check("cluster-mode", "unsafe", "the cluster has no primary"))
        for primary in sorted(primaries, key=lambda n: (n.host, n.port)):
            node_client = client.get_redis_connection(primary)
            node = f"{primary.host}:{primary.port}"
            checks += _check_node(node_client, cluster_client=True, node=node)
    else:
        checks += _check_node(client, cluster_client=False, node=None)
    if prefix is not None:
        checks += check_runs(client, prefix)
    ok = not any(check.level == "unsafe" for check in checks)
    for check in checks:
        log = logger.info if check.level in ("warn", "unsafe") else logger.debug
        where = f"{check.node} " if check.node else ""
        log("doctor %s%s: %s: %s", where, check.name, check.level, check.message)
    return ServerReport(ok=ok, checks=checks)
