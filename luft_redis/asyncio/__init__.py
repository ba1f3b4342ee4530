"""The asyncio front end: :class:`AsyncRedisCheckpointBackend`, over the same I/O-free core as
the sync :class:`luft_redis.RedisCheckpointBackend` (see :mod:`luft_redis.asyncio.backend`).

    import redis.asyncio, uuid
    from luft_redis import AsyncRedisCheckpointBackend

    async with AsyncRedisCheckpointBackend(redis.asyncio.Redis()) as backend:
        await backend.init_run(uuid.uuid4(), "review the repo", "/tmp/run")
"""

from __future__ import annotations

from .backend import AsyncCheckpointBackend, AsyncRedisCheckpointBackend, ChangeCallback
from .lease import AsyncAgentLease
from .listener import AsyncChangeListener, AsyncRefresher

__all__ = [
    "AsyncAgentLease",
    "AsyncChangeListener",
    "AsyncCheckpointBackend",
    "AsyncRedisCheckpointBackend",
    "AsyncRefresher",
    "ChangeCallback",
]
