"""The write lane (luft_redis._sync.fcall.WriteLane): when a backend uses it, and that a write
through it survives its connection being killed, exactly once (issue 21)."""

from __future__ import annotations

import uuid
from typing import Any

import fakeredis
import pytest
import redis

from luft_redis import Log, LogLevel, RedisCheckpointBackend


class _Instrumented(redis.Redis):
    def execute_command(self, *args: Any, **options: Any) -> Any:
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def _log(run_id: uuid.UUID, msg: str) -> Log:
    return Log(run_id=run_id, level=LogLevel.INFO, msg=msg)


@pytest.mark.server
def test_the_lane_is_used_only_where_it_bypasses_nothing(redis_url: str) -> None:
    plain = redis.Redis.from_url(redis_url)
    instrumented = _Instrumented.from_url(redis_url)
    single = redis.Redis.from_url(redis_url, single_connection_client=True)
    patched = redis.Redis.from_url(redis_url)
    patched.execute_command = patched.execute_command  # type: ignore[method-assign]
    try:
        assert RedisCheckpointBackend(plain, watch=False)._lane is not None
        for client in (instrumented, single, patched, fakeredis.FakeRedis()):
            assert RedisCheckpointBackend(client, watch=False)._lane is None
    finally:
        for c in (plain, instrumented, single, patched):
            c.close()


@pytest.mark.server
def test_a_write_whose_connection_was_killed_is_applied_once(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    admin = redis.Redis.from_url(redis_url)
    try:
        backend = RedisCheckpointBackend(client, watch=False)
        run_id = uuid.uuid4()
        backend.init_run(run_id, "lane", "/tmp/lane")
        backend.append_event(_log(run_id, "one"))
        lane_conn = backend._lane._conn  # type: ignore[union-attr]
        assert lane_conn is not None
        port = lane_conn._sock.getsockname()[1]
        killed = [info["addr"] for info in admin.client_list()
                  if info["addr"].endswith(f":{port}")]  # fmt: skip
        assert len(killed) == 1
        admin.client_kill(killed[0])
        backend.append_event(_log(run_id, "two"))  # reconnects, sends once more
        backend.append_event(_log(run_id, "three"))
        assert [e.msg for e in backend.get_event_log()] == ["one", "two", "three"]  # type: ignore[attr-defined]
        reader = RedisCheckpointBackend(admin, watch=False)
        assert reader.open_run(run_id) == backend.get_checkpoint()
        backend.close()
        assert backend._lane._conn is None  # type: ignore[union-attr]
    finally:
        client.close()
        admin.close()
