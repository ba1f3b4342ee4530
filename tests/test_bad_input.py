"""Bad input and odd data (issue 10, section 3): one retry deadline against an unreachable
server, and failures that are not transient (authentication, ACL, TLS) never retried."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
import uuid

import pytest
import redis
import redis.asyncio.retry
import redis.exceptions
import redis.retry
from redis.backoff import NoBackoff

from luft_redis import AsyncRedisCheckpointBackend, RedisCheckpointBackend, errors
from luft_redis.connect import make_client
from luft_redis.retry import RetryPolicy, is_access_error, is_transient
from luft_redis.scripts import translate_error

#: A policy whose deadline, not its attempt count, ends the retries.
DEADLINE = 1.0
POLICY = RetryPolicy(max_attempts=1000, deadline=DEADLINE, initial_delay=0.01, max_delay=0.1)
#: Room for a loaded machine on top of the deadline (a bound, not a benchmark: the waits are
#: sleeps, a refused connect takes microseconds). Before the fix redis-py's own retry (10
#: attempts, up to 1 s each) ran inside an attempt, and open_run first waited 2 s for the
#: change subscription: 4 s here.
MARGIN = 1.5


def _refused_url() -> str:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.mark.parametrize("watch", [True, False])
def test_refused_port_fails_within_the_one_deadline(watch: bool) -> None:
    with RedisCheckpointBackend.from_url(_refused_url(), retry=POLICY, watch=watch) as backend:
        started = time.monotonic()
        with pytest.raises(errors.ConnectionError):
            backend.open_run(uuid.uuid4())
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + MARGIN, f"gave up after {elapsed:.1f} s"


def test_refused_port_fails_within_the_one_deadline_asyncio() -> None:
    async def main() -> float:
        backend = AsyncRedisCheckpointBackend.from_url(_refused_url(), retry=POLICY)
        try:
            started = time.monotonic()
            with pytest.raises(errors.ConnectionError):
                await backend.open_run(uuid.uuid4())
            return time.monotonic() - started
        finally:
            await backend.aclose()

    elapsed = asyncio.run(main())
    assert elapsed < DEADLINE + MARGIN, f"gave up after {elapsed:.1f} s"


@pytest.mark.parametrize("asyncio_client", [False, True])
def test_clients_made_from_urls_do_not_retry_by_themselves(asyncio_client: bool) -> None:
    client = make_client("redis://127.0.0.1:1/0", asyncio=asyncio_client)
    retry = client.get_retry()
    assert retry is not None and retry.get_retries() == 0
    own_class = redis.asyncio.retry.Retry if asyncio_client else redis.retry.Retry
    own = make_client("redis://127.0.0.1:1/0", asyncio=asyncio_client,
                      retry=own_class(NoBackoff(), 5))  # fmt: skip
    assert own.get_retry().get_retries() == 5  # a retry asked for explicitly is kept


def test_access_failures_are_never_transient_and_are_typed() -> None:
    auth = redis.exceptions.AuthenticationError("invalid username-password pair")
    noauth = redis.exceptions.AuthenticationError(
        "HELLO must be called with the client already authenticated"
    )
    noperm = redis.exceptions.NoPermissionError(
        "this user has no permissions to access one of the keys used as arguments"
    )
    try:
        raise ssl.SSLCertVerificationError("certificate verify failed")
    except ssl.SSLError:
        try:
            raise redis.exceptions.ConnectionError("Error 1 connecting: handshake failed")
        except redis.exceptions.ConnectionError as wrapped:
            tls = wrapped
    for exc in (auth, noauth, noperm, tls):
        assert is_access_error(exc) and not is_transient(exc), exc
    assert isinstance(translate_error(auth), errors.AuthenticationError)
    missing = translate_error(noauth)
    assert isinstance(missing, errors.AuthenticationError)
    assert "HELLO" not in str(missing) and "password" in str(missing)
    denied = translate_error(noperm, prefix="team-a", command="EVALSHA")
    assert isinstance(denied, errors.PermissionDeniedError)
    assert denied.prefix == "team-a" and denied.command == "EVALSHA"
    assert "team-a" in str(denied) and "EVALSHA" in str(denied)
    named = translate_error(
        redis.exceptions.NoPermissionError("User x has no permissions to run the 'xadd' command")
    )
    assert isinstance(named, errors.PermissionDeniedError) and named.command == "XADD"
    assert isinstance(translate_error(tls), errors.TLSError)
    assert is_transient(redis.exceptions.ConnectionError("Connection refused"))
    assert is_transient(  # a connection lost in the handshake may pass
        redis.exceptions.ConnectionError("[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred")
    )
    assert isinstance(translate_error(redis.exceptions.ConnectionError("refused")),
                      errors.ConnectionError)  # fmt: skip
