"""Every Redis key luft-redis uses, in one place.

All keys of a run share the hash tag ``{<run-id>}`` (the canonical hyphenated run id), so they
map to one Redis Cluster slot and one Lua script may touch them all. The layout is documented
field by field in ``docs/redis-layout.md``.

=====================================  ======  ================================================
key                                    type    holds
=====================================  ======  ================================================
``<prefix>:{<run>}:run``               hash    status, task, totals, timestamps, version, ...
``<prefix>:{<run>}:events``            stream  the event log: fields ``type`` and ``data``
``<prefix>:{<run>}:phases``            hash    ``<phase_id>:<attr>`` -> PhaseSummary fields
``<prefix>:{<run>}:results``           hash    ``<agent_id>:<attr>`` -> AgentResultCache fields
``<prefix>:{<run>}:sessions``          hash    ``<agent_id>:<attr>`` -> AgentSessionCheckpoint
``<prefix>:{<run>}:started``           hash    ``<agent_id>`` -> ``<arrival seq> <phase_id>``
``<prefix>:{<run>}:findings``          hash    finding segment id -> msgpack list of findings
``<prefix>:{<run>}:findings_order``    list    finding segment ids in list order
``<prefix>:{<run>}:writers``           hash    ``<writer id>`` -> ``<op seq> <reply>``
``<prefix>:{<run>}:tasks``             hash    ``<agent_id>:<attr>`` -> agent tasks (leases)
``<prefix>:{<run>}:queue``             zset    agent id -> submit order (ready) or lease
                                               expiry in unix ms (leased)
``<prefix>:{<run>}:changes``           -       sharded pub/sub channel of change notices (not
                                               a key: passed to the scripts in ``ARGV``)
``<prefix>:{<run>}:deleted``           hash    ``<writer id>`` -> ``<op seq> <reply>`` of a
                                               delete_run, expiring (``TOMBSTONE_TTL``)
``<prefix>:{<prefix>}:runs``           zset    run index: run id -> updated_at (unix seconds)
``<prefix>:{pool:<name>}:pool``        hash    a pool's index: vt, ``<run>:w|p|t``
``<prefix>:{pool:<name>}:ready``       zset    run -> tier and pass (fair shares)
``<prefix>:{pool:<name>}:sleep``       zset    run -> unix ms when its first lease lapses
``<prefix>:{pool:<name>}:members``     set     the runs of the pool
``<prefix>:{pool:<name>}:pick:<w>``    string  backend w's last pick (a retry gets it again)
``<prefix>:{pool:<name>}:leases``      zset    lease or hold -> expiry (the pool's max_leases)
``<prefix>:{pool:<name>}:wake``        -       sharded pub/sub channel: a run has work
``<prefix>:{limit:<name>}:limit``      hash    a rate limiter: rates, burst, GCRA state,
                                               counters
``<prefix>:{limit:<name>}:take:<w>``   string  backend w's last take (a retry gets it again)
=====================================  ======  ================================================

The run index is the one key outside a run's slot: the backend keeps it up to date itself, after
the scripts that create, finish, resume or delete a run (see :mod:`luft_redis.index`).
"""

from __future__ import annotations

import re
import uuid
from typing import NamedTuple

from .errors import ConfigurationError

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_PREFIX",
    "TOMBSTONE_TTL",
    "PoolKeys",
    "RunKeys",
    "changes_channel",
    "check_limiter_name",
    "check_pool_name",
    "check_prefix",
    "limiter_key",
    "limiter_name_from_key",
    "limiter_pattern",
    "limiter_take_memo",
    "pool_keys",
    "pool_pattern",
    "run_index_key",
    "run_keys",
    "run_pattern",
    "staging_keys",
    "tombstone_key",
]

DEFAULT_PREFIX = "luft"
"""Key prefix used when none is given; one prefix is one namespace of runs."""

SCHEMA_VERSION = "1"
"""Value of the ``schema`` field of a run hash written by this version of luft-redis."""


class RunKeys(NamedTuple):
    """The keys of one run, in the order every Lua script receives them as ``KEYS``, and
    (:attr:`changes`) the run's change channel."""

    run: str
    events: str
    phases: str
    results: str
    sessions: str
    started: str
    findings: str
    findings_order: str
    writers: str
    tasks: str
    queue: str
    history: str

    @property
    def changes(self) -> str:
        """The run's change-notice channel (SSUBSCRIBE): not a key, so not in ``KEYS`` (a
        name declared as a key that never exists makes a migrating slot answer ``TRYAGAIN``
        to every call). It shares the run's hash tag, so it hashes to the run's slot; a
        writing script gets it as ``ARGV[1]`` (:func:`changes_channel`)."""
        return changes_channel(self.run)


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if usable as a key prefix, else raise :class:`ConfigurationError`."""
    if not isinstance(prefix, str) or not prefix:
        raise ConfigurationError("prefix must be a non-empty string")
    # a backslash is refused too: SCAN MATCH (list_runs) reads it as an escape
    if any(c in prefix for c in "{}*?[]\\") or any(c.isspace() for c in prefix):
        raise ConfigurationError(
            f"prefix {prefix!r} must not contain braces, glob characters, backslashes or "
            "whitespace"
        )
    try:
        prefix.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"prefix {prefix!r} is not valid text (lone surrogate)") from None
    return prefix


def run_keys(prefix: str, run_id: uuid.UUID) -> RunKeys:
    """The keys of run ``run_id`` under ``prefix``, all tagged ``{<run-id>}``."""
    base = f"{prefix}:{{{run_id}}}:"
    return RunKeys(*(base + name for name in RunKeys._fields))


_RUN_SUFFIX = "run"
_CHANNEL_SUFFIX = "changes"


def changes_channel(run_key: str) -> str:
    """The change channel of the run whose main hash is ``run_key`` (``<base>run`` ->
    ``<base>changes``, same hash tag, same slot). For staging keys it is the staging
    copy's channel, which nobody subscribes to."""
    if not run_key.endswith(_RUN_SUFFIX):
        raise ConfigurationError(f"{run_key!r} is not the main hash key of a run")
    return run_key[: -len(_RUN_SUFFIX)] + _CHANNEL_SUFFIX


TOMBSTONE_TTL = 300
"""Seconds a delete_run's tombstone is kept: a retry of the delete within that time (its
reply was lost) gets the first answer."""


def tombstone_key(prefix: str, run_id: uuid.UUID) -> str:
    """The hash that remembers, per writer, the last ``delete_run`` of the run and its reply
    (not one of :class:`RunKeys`: it outlives the run by :data:`TOMBSTONE_TTL` seconds)."""
    return f"{prefix}:{{{run_id}}}:deleted"


def staging_keys(prefix: str, run_id: uuid.UUID, token: str) -> RunKeys:
    """The staging keys of an import of ``run_id`` (``luft_redis.interop``):
    ``<prefix>:{<run-id>}:import:<token>:<name>``, in the run's slot, swapped in by
    ``lua/restore_run-24.lua``. ``token`` is a fresh hex id per import."""
    if not token or any(c not in "0123456789abcdef" for c in token):
        raise ConfigurationError(f"staging token {token!r} is not a hex id")
    base = f"{prefix}:{{{run_id}}}:import:{token}:"
    return RunKeys(*(base + name for name in RunKeys._fields))


def run_index_key(prefix: str) -> str:
    """The sorted set indexing the runs under ``prefix`` (in its own slot, tagged
    ``{<prefix>}``): member the run id, score its ``updated_at`` at its last lifecycle change."""
    return f"{prefix}:{{{prefix}}}:runs"


def run_pattern(prefix: str) -> str:
    """SCAN pattern matching the main hash of every run under ``prefix``."""
    return f"{prefix}:{{*}}:run"


def run_id_from_key(prefix: str, key: str) -> uuid.UUID | None:
    """The run id in a main-hash key found by :func:`run_pattern`, or None if it is not one."""
    head, tail = f"{prefix}:{{", "}:run"
    if not (key.startswith(head) and key.endswith(tail)):
        return None
    text = key[len(head) : -len(tail)]
    try:
        run_id = uuid.UUID(text)
    except ValueError:
        return None
    return run_id if str(run_id) == text else None


DEFAULT_POOL = "default"
"""The pool a run joins when none is named (:meth:`join_pool`)."""

_POOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


class PoolKeys(NamedTuple):
    """The keys of one pool's index, in the order ``pool_add-4.lua`` and ``pool_pick-6.lua``
    receive them, all tagged ``{pool:<name>}`` (one slot), and (:attr:`wake`) its channel."""

    pool: str
    ready: str
    sleep: str
    members: str

    @property
    def wake(self) -> str:
        """The pool's wake channel (SSUBSCRIBE): a run of the pool may have claimable work."""
        return self.pool[: -len("pool")] + "wake"

    @property
    def leases(self) -> str:
        """The pool's live leases and picks' holds (a sorted set; used under the pool's
        ``max_leases`` only)."""
        return self.pool[: -len("pool")] + "leases"

    def pick_memo(self, writer: str) -> str:
        """The key remembering the last pick of backend ``writer`` (``pool_pick-6.lua``)."""
        return self.pool[: -len("pool")] + "pick:" + writer


def check_pool_name(name: object) -> str:
    """``name`` if usable as a pool name (1-100 of ``A-Z a-z 0-9 _ . : -``), else
    :class:`~luft_redis.errors.ValidationError` naming it."""
    from .errors import ValidationError

    if not isinstance(name, str) or not _POOL_NAME.fullmatch(name):
        raise ValidationError("pool", "must be 1 to 100 of the characters A-Z a-z 0-9 _ . : -")
    return name


def pool_keys(prefix: str, name: str) -> PoolKeys:
    """The keys of pool ``name`` under ``prefix``: ``<prefix>:{pool:<name>}:<key>``."""
    base = f"{prefix}:{{pool:{check_pool_name(name)}}}:"
    return PoolKeys(*(base + key for key in PoolKeys._fields))


def pool_pattern(prefix: str) -> str:
    """SCAN pattern matching the index hash of every pool under ``prefix``."""
    return f"{prefix}:{{pool:*}}:pool"


def _tagged_name(prefix: str, key: str, kind: str) -> str | None:
    """The name in ``<prefix>:{<kind>:<name>}:<kind>``, or None."""
    head, tail = f"{prefix}:{{{kind}:", f"}}:{kind}"
    if key.startswith(head) and key.endswith(tail):
        name = key[len(head) : -len(tail)]
        return name if _POOL_NAME.fullmatch(name) else None
    return None


def pool_name_from_key(prefix: str, key: str) -> str | None:
    """The pool name of a key matched by :func:`pool_pattern`, or None."""
    return _tagged_name(prefix, key, "pool")


def check_limiter_name(name: object, field: str = "limiter") -> str:
    """``name`` if usable as a rate limiter's name (as a pool's: 1-100 of
    ``A-Z a-z 0-9 _ . : -``), else :class:`~luft_redis.errors.ValidationError` naming
    ``field``."""
    from .errors import ValidationError

    if not isinstance(name, str) or not _POOL_NAME.fullmatch(name):
        raise ValidationError(field, "must be 1 to 100 of the characters A-Z a-z 0-9 _ . : -")
    return name


def limiter_key(prefix: str, name: str) -> str:
    """The hash of rate limiter ``name``: ``<prefix>:{limit:<name>}:limit``."""
    return f"{prefix}:{{limit:{check_limiter_name(name)}}}:limit"


def limiter_take_memo(key: str, writer: str) -> str:
    """The key remembering backend ``writer``'s last take from the limiter ``key``."""
    return key[: -len("limit")] + "take:" + writer


def limiter_pattern(prefix: str) -> str:
    """SCAN pattern matching every rate limiter under ``prefix``."""
    return f"{prefix}:{{limit:*}}:limit"


def limiter_name_from_key(prefix: str, key: str) -> str | None:
    """The limiter name of a key matched by :func:`limiter_pattern`, or None."""
    return _tagged_name(prefix, key, "limit")
