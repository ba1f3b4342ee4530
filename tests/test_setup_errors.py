"""A client luft-redis cannot work with is refused with a ConfigurationError that says what to
change: one that decodes responses, and a fakeredis without Lua (``fakeredis[lua]`` missing)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio

from luft_redis import AsyncRedisCheckpointBackend, ConfigurationError, RedisCheckpointBackend
from luft_redis.connect import scripting_missing
from luft_redis.scripts import translate_error
from luft_redis.tools.server import LocalRedisCluster

# --------------------------------------------------------------- decode_responses


def test_a_decoding_redis_client_is_refused_naming_the_option() -> None:
    # No connection is made: the check reads the client's options.
    client = redis.Redis(host="127.0.0.1", port=1, decode_responses=True)
    with pytest.raises(ConfigurationError, match=r"decode_responses=False") as refused:
        RedisCheckpointBackend(client)
    assert "binary" in str(refused.value)
    client.close()


def test_a_decoding_asyncio_client_is_refused_naming_the_option() -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=1, decode_responses=True)
    with pytest.raises(ConfigurationError, match=r"decode_responses=False"):
        AsyncRedisCheckpointBackend(client)


@pytest.mark.parametrize("backend_class", [RedisCheckpointBackend, AsyncRedisCheckpointBackend])
def test_from_url_refuses_decode_responses_true(backend_class: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"decode_responses=False"):
        backend_class.from_url("redis://127.0.0.1:1/0", decode_responses=True)
    # Asking for False (the default) is fine, and makes no connection yet.
    backend = backend_class.from_url("redis://127.0.0.1:1/0", decode_responses=False, watch=False)
    assert backend.client.connection_pool.connection_kwargs["decode_responses"] is False


@pytest.mark.cluster
def test_a_decoding_cluster_client_is_refused(redis_cluster: LocalRedisCluster) -> None:
    client = redis_cluster.client(decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match=r"decode_responses=False"):
            RedisCheckpointBackend(client)
    finally:
        client.close()


# --------------------------------------------------------------- fakeredis without Lua


@pytest.mark.parametrize(
    "reply",
    [
        "unknown command 'evalsha', with args beginning with: ",  # fakeredis without lupa
        "unknown command 'EVALSHA', with args beginning with: 'abc' '0' ",  # Redis 7
        "unknown command `FCALL`, with args beginning with: ",  # older servers quote so
        "ERR unknown command 'function', with args beginning with: 'LOAD' ",
    ],
)
def test_a_server_without_scripting_reads_as_a_configuration_error(reply: str) -> None:
    error = scripting_missing(redis.exceptions.ResponseError(reply))
    assert isinstance(error, ConfigurationError)
    assert "fakeredis[lua]" in str(error) and "does not run Lua" in str(error)
    # The mapping every operation's errors go through finds it too.
    translated = translate_error(redis.exceptions.ResponseError(reply))
    assert isinstance(translated, ConfigurationError)
    assert str(translated) == str(error)


@pytest.mark.parametrize(
    "reply",
    [
        "unknown command 'HSETEX', with args beginning with: ",
        "NOSCRIPT No matching script. Please use EVAL.",
        "LUFT_NO_RUN run is gone",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    ],
)
def test_other_replies_are_not_taken_for_missing_lua(reply: str) -> None:
    assert scripting_missing(reply) is None
    assert not isinstance(translate_error(redis.exceptions.ResponseError(reply)),
                          ConfigurationError)  # fmt: skip


# The child blocks lupa before fakeredis is imported: fakeredis decides at import whether it
# runs Lua, and without lupa it answers EVALSHA as an unknown command, as it does where the
# user installed plain `fakeredis`.
NO_LUPA_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, threading, uuid
    sys.modules["lupa"] = None
    import fakeredis, redis, redis.asyncio
    from luft_redis import (
        AsyncRedisCheckpointBackend, ConfigurationError, RedisCheckpointBackend,
    )
    from luft_redis.tools.server import find_free_port

    out = {}

    def refused(make):
        try:
            make()
        except ConfigurationError as exc:
            return str(exc)
        return None

    out["sync_construct"] = refused(lambda: RedisCheckpointBackend(fakeredis.FakeRedis()))
    out["async_construct"] = refused(
        lambda: AsyncRedisCheckpointBackend(fakeredis.FakeAsyncRedis()))

    # A redis-py client to a fakeredis served over TCP (as the demo's fallback does): the
    # client class says nothing, so the first script finds it out.
    port = find_free_port()
    server = fakeredis.TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        backend = RedisCheckpointBackend(client, watch=False)
        run_id = uuid.uuid4()
        out["sync_first_call"] = refused(lambda: backend.init_run(run_id, "t", "/tmp/r"))
        out["keys_after"] = [k.decode() for k in client.keys("*")]
        client.close()

        async def main():
            aclient = redis.asyncio.Redis(host="127.0.0.1", port=port)
            abackend = AsyncRedisCheckpointBackend(aclient, watch=False)
            try:
                await abackend.init_run(uuid.uuid4(), "t", "/tmp/r")
            except ConfigurationError as exc:
                return str(exc)
            finally:
                await aclient.aclose()
            return None

        out["async_first_call"] = asyncio.run(main())
    finally:
        server.shutdown()
        server.server_close()
    print(json.dumps(out))
    """
)


def test_fakeredis_without_lua_is_refused_and_says_which_extra_to_install() -> None:
    done = subprocess.run([sys.executable, "-c", NO_LUPA_CHILD], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for construct in ("sync_construct", "async_construct"):
        assert out[construct] is not None, f"{construct}: fakeredis without Lua accepted"
        assert "lupa is not installed" in out[construct]
        assert "pip install 'fakeredis[lua]'" in out[construct]
    for first_call in ("sync_first_call", "async_first_call"):
        message = out[first_call]
        assert message is not None, f"{first_call}: not a ConfigurationError"
        assert "unknown command 'fcall'" in message
        assert "pip install 'fakeredis[lua]'" in message
    assert out["keys_after"] == []  # nothing was written


def test_fakeredis_with_lua_is_accepted() -> None:
    import fakeredis

    backend = RedisCheckpointBackend(fakeredis.FakeRedis(), watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "/tmp/r")
    checkpoint = backend.get_checkpoint()
    assert checkpoint is not None and checkpoint.run_id == run_id
    backend.close()
