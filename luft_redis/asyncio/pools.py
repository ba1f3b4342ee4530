"""The reads of pools (docs/pools.md): the pools under a prefix and what one holds, and the
rate limiters, for ``luft-redis pools`` / ``pool NAME`` / ``limits`` and the web view.

This is the hand-written asyncio source; :mod:`luft_redis._sync.pools` is generated from it
(``.ci/unasync.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import CorruptDataError
from ..keys import (
    limiter_key,
    limiter_name_from_key,
    limiter_pattern,
    pool_keys,
    pool_name_from_key,
    pool_pattern,
    run_keys,
)
from ..limits import LIMITER_FIELDS, RateLimit, rate_limit_of
from ..pools import LEASE_SCORE, RUN_VIEW_FIELDS, PoolRun, PoolView, pool_run_of

__all__ = ["list_pools", "list_rate_limits", "read_pool"]


async def _names(client: Any, prefix: str, pattern: str,
                 name_of: Callable[[str, str], str | None]) -> list[str]:  # fmt: skip
    """The names in the keys matching ``pattern`` (SCAN of the keyspace), sorted."""
    found: set[str] = set()
    async for raw in client.scan_iter(match=pattern, count=1000):
        key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        name = name_of(prefix, key)
        if name is not None:
            found.add(name)
    return sorted(found)


async def list_pools(client: Any, prefix: str) -> list[str]:
    """The names of the pools under ``prefix`` (SCAN of the keyspace), sorted."""
    return await _names(client, prefix, pool_pattern(prefix), pool_name_from_key)


async def read_pool(client: Any, prefix: str, name: str, *, limit: int = 1000) -> PoolView:
    """Pool ``name``: up to ``limit`` of its runs, each with its state in the index, its tasks
    ready and leased now (the client's clock decides "now"), its weight, priority and limits.
    Three pipelined round trips: the pool's index, the runs, then the holders (workers) of
    their live leases."""
    keys = pool_keys(prefix, name)
    pipe = client.pipeline(transaction=False)
    pipe.smembers(keys.members)
    pipe.zrange(keys.ready, 0, -1)
    pipe.zrange(keys.sleep, 0, -1)
    pipe.hget(keys.pool, "max_leases")
    pipe.zcount(keys.leases, f"{int(time.time() * 1000)}", "+inf")
    members, ready, sleeping, cap, leases = await pipe.execute()
    ready_set = {bytes(m) for m in ready}
    sleeping_set = {bytes(m) for m in sleeping}
    ids: list[tuple[uuid.UUID, str]] = []
    for raw in sorted(bytes(m) for m in members)[:limit]:
        try:
            run_id = uuid.UUID(raw.decode())
        except ValueError:
            continue
        state = "ready" if raw in ready_set else "sleeping" if raw in sleeping_set else "idle"
        ids.append((run_id, state))
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    for run_id, _ in ids:
        rk = run_keys(prefix, run_id)
        pipe.hmget(rk.run, list(RUN_VIEW_FIELDS))
        pipe.zcount(rk.queue, "-inf", f"({LEASE_SCORE}")
        pipe.zcount(rk.queue, f"({now_ms}", "+inf")
        pipe.zrange(rk.queue, f"({now_ms}", "+inf", byscore=True)
    replies = await pipe.execute() if ids else []
    runs: list[PoolRun] = []
    leased_agents: list[tuple[uuid.UUID, list[bytes]]] = []
    for i, (run_id, state) in enumerate(ids):
        fields, n_ready, n_leased, agents = replies[4 * i : 4 * i + 4]
        run = pool_run_of(run_id, name, fields, state, int(n_ready), int(n_leased),
                          run_keys(prefix, run_id).run)  # fmt: skip
        if run is not None:
            runs.append(run)
            if agents:
                leased_agents.append((run_id, [bytes(a) for a in agents]))
    workers: set[bytes] = set()
    if leased_agents:
        pipe = client.pipeline(transaction=False)
        for run_id, agents in leased_agents:
            pipe.hmget(run_keys(prefix, run_id).tasks, [a + b":holder" for a in agents])
        for holders in await pipe.execute():
            workers.update(bytes(h) for h in holders if h is not None)
    runs.sort(key=lambda r: (-r.priority, str(r.run_id)))
    if cap is not None and not bytes(cap).isdigit():
        raise CorruptDataError(keys.pool, "max_leases", "is not a whole number")
    return PoolView(name, tuple(runs), len(ready_set), len(sleeping_set),
                    None if cap is None else int(cap), int(leases), len(workers))  # fmt: skip


async def list_rate_limits(client: Any, prefix: str) -> list[RateLimit]:
    """The rate limiters under ``prefix`` (SCAN of the keyspace), sorted by name, with what
    each would admit now (the server's clock). CorruptDataError names a field that is not a
    whole number."""
    ordered = await _names(client, prefix, limiter_pattern(prefix), limiter_name_from_key)
    if not ordered:
        return []
    seconds, micros = await client.time()
    now = int(seconds) + int(micros) / 1e6
    pipe = client.pipeline(transaction=False)
    for name in ordered:
        pipe.hmget(limiter_key(prefix, name), list(LIMITER_FIELDS))
    found: list[RateLimit] = []
    for name, values in zip(ordered, await pipe.execute(), strict=True):
        limit = rate_limit_of(name, values, limiter_key(prefix, name), now)
        if limit is not None:
            found.append(limit)
    return found
