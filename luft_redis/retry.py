"""Retries of Redis calls on transient failures (tenacity), with exactly-once writes.

Only failures that may pass by themselves are retried: a refused, reset or timed-out
connection, a server still loading its data (``LOADING``), a replica promoted or demoted during
failover (``READONLY``, ``MASTERDOWN``), a cluster resharding (``TRYAGAIN``, ``CLUSTERDOWN``),
and a script missing from the server's cache (``NOSCRIPT``: flushed between load and call),
and the Functions library missing again right after the front end loaded it ("Function not
found": flushed, or a failover, between the ``FUNCTION LOAD`` and the ``FCALL``).
Validation and domain errors (``LUFT_*``) never are, nor are refusals that do not pass by
themselves: a missing or wrong password, an ACL ``NOPERM``, a TLS certificate that does not
verify (see :func:`is_access_error`).

This is the only retry layer: the clients ``from_url`` makes have redis-py's own retry turned
off (``Retry(NoBackoff(), 0)``), so ``deadline`` bounds the whole wait. A client passed in keeps
the retry it was made with, which runs inside every attempt of this policy.

A write whose reply was lost may have been applied: every write carries a writer id and an
operation number made before its first attempt, and the Lua scripts apply an operation at most
once (the ``writers`` hash of the run keeps each writer's last operation and its reply), so a
retried append counts its tokens once and logs its event once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.exceptions
import tenacity

from .cluster import TopologyChanged

__all__ = [
    "DEFAULT_RETRY",
    "REDIS_ERRORS",
    "RetryPolicy",
    "exception_chain",
    "is_access_error",
    "is_function_missing",
    "is_transient",
    "tls_failure",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# A private generator for the jitter: the global `random` state belongs to the application (and
# to test tools such as hypothesis, which watch it).
_rng = random.Random()

REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
"""What redis-py raises (``RedisClusterException`` is not a ``RedisError``)."""

_TRANSIENT_PREFIXES = ("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY ")

_MISSING = re.compile(r"^(?:ERR )?(?:Function not found|No such function)", re.IGNORECASE)


def is_function_missing(exc: BaseException) -> bool:
    """True for the server's answer to an FCALL of a function it does not have (not loaded on
    this node yet, or lost to a flush, a restart or a failover): nothing ran."""
    return isinstance(exc, redis.exceptions.ResponseError) and bool(_MISSING.match(str(exc)))


_AUTH_TEXTS = ("NOAUTH", "WRONGPASS", "HELLO must be called", "AUTH failed",
               "invalid username-password", "Authentication required")  # fmt: skip


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during (redis-py wraps OS errors)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


_TLS_REFUSALS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "WRONG_VERSION_NUMBER",
                 "TLSV1_ALERT", "tlsv1 alert", "SSLV3_ALERT", "sslv3 alert")  # fmt: skip


def tls_failure(exc: BaseException) -> bool:
    """A TLS handshake was refused: a certificate that did not verify (on either side), or TLS
    spoken to a plain port. A connection lost during a handshake stays transient."""
    for item in exception_chain(exc):
        if isinstance(item, ssl.SSLCertVerificationError):
            return True
        if isinstance(item, (ssl.SSLError, redis.exceptions.ConnectionError)) and any(
            text in str(item) for text in _TLS_REFUSALS
        ):
            return True
    return False


_ACCESS_ERRORS = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError,
                  redis.exceptions.AuthenticationWrongNumberOfArgsError,
                  redis.exceptions.NoPermissionError)  # fmt: skip

# the script cache was emptied again between SCRIPT LOAD and EVALSHA (NoScriptError): not applied
_TRANSIENT_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                     redis.exceptions.BusyLoadingError, redis.exceptions.ReadOnlyError,
                     redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
                     redis.exceptions.NoScriptError)  # fmt: skip


def is_access_error(exc: BaseException) -> bool:
    """The server refused this client: authentication, ACL permission or TLS. Never transient."""
    if isinstance(exc, _ACCESS_ERRORS):
        return True
    if isinstance(exc, redis.exceptions.RedisError) and str(exc).startswith(
        ("NOPERM", *_AUTH_TEXTS)
    ):
        return True
    return tls_failure(exc)


def is_transient(exc: BaseException) -> bool:
    """True for a Redis failure that a later attempt may not meet."""
    if is_access_error(exc):
        return False
    if isinstance(exc, _TRANSIENT_ERRORS):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        # "Function not found": nothing ran; the next attempt loads the library again
        return str(exc).startswith(_TRANSIENT_PREFIXES) or is_function_missing(exc)
    if isinstance(exc, TopologyChanged):  # a redirect to a node not known yet: nothing ran
        return True
    if isinstance(exc, redis.exceptions.ClusterError):
        # RedisCluster gave up following TRYAGAIN/ASK/MOVED (a slot migrating): nothing ran
        return str(exc).startswith("TTL exhausted")
    return False


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long to keep trying a Redis call that failed transiently.

    Waits grow exponentially from ``initial_delay`` up to ``max_delay`` seconds with full
    jitter; it gives up after ``max_attempts`` attempts or ``deadline`` seconds in all, and then
    raises :class:`luft_redis.errors.ConnectionError` (or the typed error of the last failure).
    """

    max_attempts: int = 10
    deadline: float = 5.0
    initial_delay: float = 0.02
    max_delay: float = 1.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.deadline < 0 or self.initial_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must not be negative")

    def call(self, fn: Callable[[], _T]) -> _T:
        """``fn()``, retried on transient failures; the last failure is re-raised.

        The first attempt runs without tenacity (whose bookkeeping costs about as much as a
        round trip on loopback); only a transient failure starts the retry loop.
        """
        try:
            return fn()
        except Exception as exc:
            self._first_failed(exc)
        time.sleep(self._first_wait())
        result: _T = self._retrying(tenacity.Retrying)(fn)
        return result

    async def acall(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """``await fn()``, retried on transient failures with the same policy as :meth:`call`
        (waits are ``asyncio.sleep``: the event loop runs on meanwhile)."""
        try:
            return await fn()
        except Exception as exc:
            self._first_failed(exc)
        await asyncio.sleep(self._first_wait())

        async def attempt() -> _T:  # tenacity awaits only what a coroutine function returns
            return await fn()

        result: _T = await self._retrying(tenacity.AsyncRetrying, sleep=asyncio.sleep)(attempt)
        return result

    def _first_failed(self, exc: Exception) -> None:
        """Re-raise ``exc`` unless the policy retries it (then log the first failure)."""
        if self.max_attempts == 1 or not is_transient(exc):
            raise exc
        logger.info("Redis call failed (%s), attempt 1; retrying", exc)

    def _first_wait(self) -> float:
        return _rng.uniform(0, self.initial_delay)

    def _retrying(self, kind: Any, **options: Any) -> Any:
        """A tenacity ``Retrying``/``AsyncRetrying`` for the attempts after the first."""
        return kind(
            stop=tenacity.stop_after_attempt(self.max_attempts - 1)
            | tenacity.stop_after_delay(self.deadline),
            wait=self._wait,
            retry=tenacity.retry_if_exception(is_transient),
            before_sleep=_log_retry,
            reraise=True,
            **options,
        )

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """Full jitter: uniform in [0, min(max_delay, initial_delay * 2^attempt)]."""
        cap = min(self.max_delay, self.initial_delay * 2 ** min(state.attempt_number, 30))
        return _rng.uniform(0, cap)


def _log_retry(state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    logger.info("Redis call failed (%s), attempt %d; retrying", exc, state.attempt_number + 1)


DEFAULT_RETRY = RetryPolicy()
"""A few seconds in all: up to 10 attempts within 5 s, waits from 20 ms up to 1 s."""

NO_RETRY = RetryPolicy(max_attempts=1)
"""One attempt only."""
