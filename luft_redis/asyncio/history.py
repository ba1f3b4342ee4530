"""The reads of a run's history (:mod:`luft_redis.history` says what it holds): its versions,
a past state, the point a fork starts from.

This is the hand-written asyncio source; :mod:`luft_redis._sync.history` is generated from it
(``.ci/unasync.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from typing import Any

from .. import types as t
from ..errors import HistoryUnavailableError, RunNotFoundError, ValidationError
from ..history import (
    DEFAULT_HISTORY_PAGE,
    Entry,
    Point,
    Version,
    base_incarnation,
    fold,
    id_key,
    parse_at,
    parse_entry,
)
from ..keys import RunKeys
from ..retry import REDIS_ERRORS
from ..scripts import translate_error
from ..wire import entry_id

__all__ = ["Past", "read_history", "state_at"]

logger = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True, slots=True)
class Past:
    """A past state: the checkpoint, the entry of its version, and the last event it holds."""

    checkpoint: t.RunCheckpoint
    entry: Entry
    last_event: str | None
    """The id of the last event appended at or before this version (None: none since the
    history starts)."""


async def _xrange(client: Any, run_id: uuid.UUID, key: str, lo: str, hi: str, count: int,
                  reverse: bool = False) -> list[Any]:  # fmt: skip
    try:
        if reverse:
            return list(await client.xrevrange(key, max=hi, min=lo, count=count))
        return list(await client.xrange(key, min=lo, max=hi, count=count))
    except REDIS_ERRORS as exc:
        raise translate_error(exc, run_id=run_id, key=key) from exc


async def read_history(client: Any, keys: RunKeys, run_id: uuid.UUID, *, start: str = "-",
                       end: str = "+", count: int = 100,
                       reverse: bool = False) -> list[Version]:  # fmt: skip
    """Up to ``count`` versions of the run, oldest first between the history ids ``start``
    and ``end`` (``reverse``: newest first); RunNotFoundError when the run does not exist."""
    if count < 1:
        raise ValidationError("count", "must be at least 1")
    key = keys.history
    lo, hi = (start, end)
    page = await _xrange(client, run_id, key, lo, hi, count, reverse)
    if not page and start in ("-", "+") and end in ("-", "+"):
        await _need_run(client, keys, run_id)
    return [parse_entry(key, raw_id, fields).describe(key) for raw_id, fields in page]


async def _need_run(client: Any, keys: RunKeys, run_id: uuid.UUID) -> None:
    try:
        exists = await client.exists(keys.run)
    except REDIS_ERRORS as exc:
        raise translate_error(exc, run_id=run_id, key=keys.run) from exc
    if not exists:
        raise RunNotFoundError(run_id)


async def _unavailable(client: Any, keys: RunKeys, run_id: uuid.UUID, at: Point,
                       page: int) -> HistoryUnavailableError:  # fmt: skip
    """The error for a point before the history: it names the first base (where a fold can
    start)."""
    key, lower = keys.history, "-"
    while True:
        got = await _xrange(client, run_id, key, lower, "+", page)
        for raw_id, fields in got:
            entry = parse_entry(key, raw_id, fields)
            if entry.base:
                return HistoryUnavailableError(run_id, str(at), entry.version, entry.id)
        if len(got) < page:
            await _need_run(client, keys, run_id)
            return HistoryUnavailableError(run_id, str(at), None, None)
        lower = "(" + entry_id(got[-1][0])


async def _event_target(client: Any, keys: RunKeys, run_id: uuid.UUID, point: Point,
                        page: int) -> str:  # fmt: skip
    """The history id of the append that holds event ``point.event_id``: the first append
    whose last event is at or after it, unless a base came between (its ``l`` at or after
    the event: the event is older than the base, and its append, if any, is not in the
    history). The scan starts at the event's millisecond: an entry of the same millisecond
    may precede the event in the other stream."""
    event = point.event_id or ""
    if not await _xrange(client, run_id, keys.events, event, event, 1):
        await _need_run(client, keys, run_id)
        raise ValidationError("at", f"no event {event} in the run's log")
    key, want = keys.history, id_key(event)
    lower = f"{want[0]}-0"
    while True:
        got = await _xrange(client, run_id, key, lower, "+", page)
        for raw_id, fields in got:
            entry = parse_entry(key, raw_id, fields)
            before_base = (entry.base and entry.log_last is not None
                           and id_key(entry.log_last) >= want)  # fmt: skip
            if before_base:
                break
            if entry.op == "append" and id_key(entry.event_id or "") >= want:
                return entry.id
        else:
            if len(got) == page:
                lower = "(" + entry_id(got[-1][0])
                continue
        raise await _unavailable(client, keys, run_id, point, page)


async def state_at(client: Any, keys: RunKeys, run_id: uuid.UUID,
                   at: int | str | Any, *, page: int = DEFAULT_HISTORY_PAGE) -> Past:  # fmt: skip
    """The run's state at ``at`` (a version, an event id, a time: :func:`parse_at`), folded
    from the last base before it (:func:`luft_redis.history.fold`).

    ValidationError for a point after the run's last version or an event not in its log;
    HistoryUnavailableError for a point before its history starts; RunNotFoundError."""
    point = parse_at(at)
    key = keys.history
    hi = "+"
    found: Callable[[Entry], bool]
    if point.version is not None:
        target_version = point.version
        found = lambda entry: entry.version <= target_version  # noqa: E731
    elif point.event_id is not None:
        hi = await _event_target(client, keys, run_id, point, page)
        found = lambda entry: True  # noqa: E731
    else:
        hi = str(point.ms)  # XREVRANGE reads "<ms>" as "<ms>-<max>": every entry of that ms
        found = lambda entry: True  # noqa: E731
    chain: list[Entry] = []
    newest = True
    later: Entry | None = None  # the entry after the target's place (a version target)
    while True:
        got = await _xrange(client, run_id, key, "-", hi, page, reverse=True)
        for raw_id, fields in got:
            entry = parse_entry(key, raw_id, fields)
            if not chain:
                if newest and point.version is not None and entry.version < point.version:
                    raise ValidationError(
                        "at", f"version {point.version} is after the run's last version "
                        f"{entry.version}")  # fmt: skip
                newest = False
                if not found(entry):
                    later = entry
                    continue
                if point.version is not None and entry.version != point.version:
                    if later is not None and later.base:  # a gap (an older writer): the
                        raise HistoryUnavailableError(  # history starts again after it
                            run_id, str(point), later.version, later.id)
                    raise await _unavailable(client, keys, run_id, point, page)
            chain.append(entry)
            if entry.base:
                chain.reverse()
                state = fold(run_id, keys, chain)
                await _same_incarnation(client, keys, run_id, point, state.incarnation, page)
                return Past(state.snapshot, chain[-1],
                            await _last_event(client, keys, run_id, chain, page))  # fmt: skip
        if len(got) < page:
            if not chain and newest:
                await _need_run(client, keys, run_id)
            raise await _unavailable(client, keys, run_id, point, page)
        hi = "(" + entry_id(got[-1][0])


async def _same_incarnation(client: Any, keys: RunKeys, run_id: uuid.UUID, point: Point,
                            incarnation: str, page: int) -> None:  # fmt: skip
    """HistoryUnavailableError when the folded state is of another incarnation than the run's
    (a run deleted and made again by an older luft-redis, which left the history of the first
    one): it names the first base of the run's own incarnation."""
    try:
        raw = await client.hget(keys.run, "incarnation")
    except REDIS_ERRORS as exc:
        raise translate_error(exc, run_id=run_id, key=keys.run) from exc
    current = raw.decode() if isinstance(raw, bytes) else (raw or "")
    if not current or not incarnation or current == incarnation:
        return
    key, hi = keys.history, "+"
    first: Entry | None = None
    while True:  # back from the newest: the last base of another incarnation ends the run's
        got = await _xrange(client, run_id, key, "-", hi, page, reverse=True)
        for raw_id, fields in got:
            entry = parse_entry(key, raw_id, fields)
            if entry.base:
                if base_incarnation(keys, entry) != current:
                    got = []
                    break
                first = entry
        if len(got) < page:
            break
        hi = "(" + entry_id(got[-1][0])
    raise HistoryUnavailableError(run_id, str(point), first.version if first else None,
                                  first.id if first else None)  # fmt: skip


async def _last_event(client: Any, keys: RunKeys, run_id: uuid.UUID, chain: list[Entry],
                      page: int) -> str | None:  # fmt: skip
    """The id of the last event in the log at the version of ``chain[-1]``: that of the last
    append at or before it (none after an init, which starts an empty log). Before the
    history's first entry, the last event with an id at most that entry's."""
    for entry in reversed(chain):
        if entry.op == "append":
            return entry.event_id
        if entry.base:  # the log's last event at the base (none after an init)
            return entry.log_last
    key, hi = keys.history, "(" + chain[0].id
    first = chain[0].id
    while True:
        got = await _xrange(client, run_id, key, "-", hi, page, reverse=True)
        for raw_id, fields in got:
            entry = parse_entry(key, raw_id, fields)
            if entry.op == "append":
                return entry.event_id
            if entry.op == "init":
                return None
            first = entry.id
        if len(got) < page:
            break
        hi = "(" + entry_id(got[-1][0])
    older = await _xrange(client, run_id, keys.events, "-", first, 1, reverse=True)
    return entry_id(older[0][0]) if older else None
