"""A run staged under its hash tag and swapped in by one script (``restore_run-24.lua``): the
Redis side of an import (:mod:`luft_redis.asyncio.interop`) and of a fork (``fork_run``).

This is the hand-written asyncio source; :mod:`luft_redis._sync.restore` is generated from it
(``.ci/unasync.py``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from .. import types as t
from ..delta import UnknownFormat, parse_delta
from ..errors import BackendError, LuftRedisError, RunExistsError
from ..interop_core import BATCH, STAGING_TTL, ImportResult, Progress, _translated
from ..keys import SCHEMA_VERSION, check_prefix, run_keys, staging_keys
from ..retry import DEFAULT_RETRY
from ..scripts import library
from ..wire import Encoder
from .fcall import call_function, index_add

__all__ = ["import_checkpoint"]

logger = logging.getLogger(__name__)


async def import_checkpoint(
    client: Any,
    cp: t.RunCheckpoint,
    events: Iterable[tuple[str, t.AgentEvent]],
    *,
    prefix: str,
    run_dir: str,
    replace: bool,
    max_payload_size: int,
    progress: Progress | None,
    total: int | None,
    where: Callable[[str, LuftRedisError], LuftRedisError] | None = None,
    parent: str | None = None,
) -> ImportResult:
    """Stage ``cp`` and ``events`` (``(position, event)``; ``where`` turns an error about one
    event into one that names its position; without it the error is raised as it is) under
    the run's hash tag, then swap them in. ``parent``: the run field ``parent`` of a fork
    (``"<run id> <version>"``)."""
    check_prefix(prefix)
    rid = cp.run_id
    target = run_keys(prefix, rid)
    with _translated(rid):
        existed = bool(await client.exists(target.run))
    if existed and not replace:
        raise RunExistsError(rid, f"under prefix {prefix!r}",
                             "pass replace=True / --replace to replace it")  # fmt: skip
    encoder = Encoder(max_payload_size)
    s = staging_keys(prefix, rid, uuid.uuid4().hex)
    incarnation, writer = uuid.uuid4().hex, uuid.uuid4().hex
    save_args = encoder.save(cp, rid)  # checked before anything is written
    try:
        with _translated(rid):
            await client.hset(s.run, mapping={
                "schema": SCHEMA_VERSION, "run_id": str(rid), "task": cp.task,
                "run_dir": run_dir, "status": cp.status.value, "current_phase": "0",
                "total_tokens": "0", "phases": "0", "created_at": str(cp.created_at),
                "updated_at": str(cp.updated_at), "version": "0",
                "incarnation": incarnation, **({"parent": parent} if parent else {}),
            })  # fmt: skip
            await client.expire(s.run, STAGING_TTL)
        count, started_phase = await _stage_events(client, rid, s.events, encoder, events, progress,
                                                   total, where)  # fmt: skip
        started = [(a, p) for a in dict.fromkeys(cp.started_agent_ids)
                   if (p := started_phase.get(a)) is not None]  # fmt: skip
        with _translated(rid):
            for i in range(0, len(started), BATCH):
                await client.hset(s.started, mapping={str(a): f"0 {p}" for a, p in
                                                      started[i : i + BATCH]})  # fmt: skip
            save = library().ops.save_checkpoint
            save_call = [writer, "1", *save_args, "", ""]  # (no fence, no retention)
            await DEFAULT_RETRY.acall(lambda: call_function(client, save, list(s), save_call))
            pipe = client.pipeline(transaction=False)
            for key in s:
                pipe.expire(key, STAGING_TTL)
            await pipe.execute()
            restore = library().ops.restore_run
            args = [writer, "2", "1" if replace else "0", str(cp.updated_at), incarnation]
            reply = await DEFAULT_RETRY.acall(
                lambda: call_function(client, restore, [*target, *s], args))
    except BaseException:
        try:
            await client.delete(*s)
        except Exception:
            logger.error("run %s: could not delete the staging keys %s*; they expire in %d s",
                         rid, s.run[: -len("run")], STAGING_TTL, exc_info=True)  # fmt: skip
        raise
    try:
        delta = parse_delta(bytes(reply))
    except (UnknownFormat, ValueError, TypeError) as exc:
        raise BackendError(f"unexpected reply from restore_run: {exc}") from exc
    await index_add(client, DEFAULT_RETRY, prefix, rid, float(cp.updated_at))  # `luft-redis runs`
    logger.info("run %s: imported (%d events, incarnation %s)", rid, count, delta.inc_after)
    if progress is not None:
        progress(count, count)
    return ImportResult(rid, count, replaced=existed)


async def _stage_events(
    client: Any,
    rid: uuid.UUID,
    key: str,
    encoder: Encoder,
    events: Iterable[tuple[str, t.AgentEvent]],
    progress: Progress | None,
    total: int | None,
    where: Callable[[str, LuftRedisError], LuftRedisError] | None,
) -> tuple[int, dict[uuid.UUID, int]]:
    """XADD the events to the staging stream in pipelined batches; returns their number and
    the phase of each agent's latest agent_started (kept as the normal write path keeps it)."""
    started_phase: dict[uuid.UUID, int] = {}
    count = 0
    pipe = client.pipeline(transaction=False)  # execute() empties it for the next batch

    async def flush() -> None:
        pipe.expire(key, STAGING_TTL)
        with _translated(rid):
            await pipe.execute()

    for count, (position, event) in enumerate(events, 1):
        try:
            args = encoder.event(event, "event", rid)
        except LuftRedisError as exc:
            raise (exc if where is None else where(position, exc)) from None
        entry = args[1 : 1 + int(args[0])]  # the stream entry's field-value pairs
        pipe.xadd(key, dict(zip(entry[::2], entry[1::2], strict=True)))
        if isinstance(event, t.AgentStarted):
            started_phase[event.agent_id] = event.phase_id
        if count % BATCH == 0:
            await flush()
            if progress is not None:
                progress(count, total)
    if count % BATCH:
        await flush()
    return count, started_phase
