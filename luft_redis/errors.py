"""Exceptions raised by luft-redis.

Every error the library raises on purpose derives from :class:`LuftRedisError`, so callers can
catch one base class. Errors that name a piece of input carry it in ``field``; errors about
stored data carry the Redis ``key`` and ``field``.

Domain errors raised inside the Lua scripts arrive as ``LUFT_<CODE> message`` replies and are
mapped to these classes by :func:`luft_redis.scripts.translate_response_error`.
"""

from __future__ import annotations

import builtins

__all__ = [
    "AccessError",
    "AuthenticationError",
    "BackendError",
    "ClientTypeError",
    "ConfigurationError",
    "ConnectionError",
    "CorruptDataError",
    "ForkedError",
    "HistoryUnavailableError",
    "LeaseLostError",
    "LimiterNotFoundError",
    "LuftRedisError",
    "NotDurableError",
    "NotResumableError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RunExistsError",
    "RunMismatchError",
    "RunNotBoundError",
    "RunNotFoundError",
    "RunNotRunningError",
    "TLSError",
    "ValidationError",
]


class LuftRedisError(Exception):
    """Base class of every error raised by luft-redis."""


class ValidationError(LuftRedisError, ValueError):
    """Input does not match the luft contract; nothing was stored.

    ``field`` is the dotted path of the offending value (``"tokens.input"``,
    ``"agent_results.<id>.status"``), or ``""`` for the whole value.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class RunMismatchError(ValidationError):
    """A value names another run than the one the backend is bound to; nothing was stored."""


class PayloadTooLargeError(ValidationError):
    """A value's stored form is larger than the backend's ``max_payload_size``; nothing stored."""

    def __init__(self, field: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(field, f"stored form is {size} bytes, over the limit of {limit} bytes")


class ConfigurationError(LuftRedisError, ValueError):
    """The backend was set up with options or a client it cannot work with."""


class ClientTypeError(ConfigurationError, TypeError):
    """A sync client handed to the asyncio backend, or the other way round (the message names
    the class to use)."""


class ForkedError(LuftRedisError, RuntimeError):
    """An asyncio backend used in a process forked after it was made: create it after the
    fork (asyncio itself does not support forking a process with a running loop)."""


class RunExistsError(LuftRedisError):
    """``init_run`` (or an import) on a run id that is already stored; nothing was changed.
    ``hint`` says how to replace it where an operation can (an import's ``--replace``)."""

    def __init__(self, run_id: object, where: str | None = None, hint: str | None = None) -> None:
        self.run_id = run_id
        place = f" {where}" if where else ""
        super().__init__(f"run {run_id} already exists{place}" + (f" ({hint})" if hint else ""))


class RunNotFoundError(LuftRedisError):
    """The run is not stored in Redis (never was, expired, or deleted behind the backend's
    back). The message is the one wording every command uses: "run <id> not found under prefix
    '<prefix>'" (without the prefix where it is not known)."""

    def __init__(self, run_id: object, prefix: str | None = None) -> None:
        self.run_id = run_id
        self.prefix = prefix
        where = f" under prefix {prefix!r}" if prefix is not None else ""
        super().__init__(f"run {run_id} not found{where}")


class RunNotBoundError(LuftRedisError):
    """An operation that needs a run was called before ``init_run`` or ``open_run``."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        super().__init__(f"{operation}() needs a bound run: call init_run() or open_run() first")


class NotResumableError(LuftRedisError):
    """``reset_status_to_running`` on a completed run; nothing was changed."""

    def __init__(self, run_id: object, status: str) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(f"run {run_id} is {status} and cannot be resumed")


class RunNotRunningError(LuftRedisError):
    """An operation that needs a running run (``submit_agents``) on a completed, failed or
    cancelled one; nothing was changed."""

    def __init__(self, run_id: object, status: str) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(f"run {run_id} is {status}, not running: resume it first")


class LeaseLostError(LuftRedisError):
    """A fenced write, renew or release of a lease that another worker has taken over (or
    whose run was deleted and created again), or that its own ``agent_done`` ended: nothing
    was written.

    ``agent_id`` names the agent, ``token`` the stale fencing token and ``current`` the
    task's current one (None when the run was re-created or the task is gone; ``"ended"``
    when the lease's own ``agent_done`` ended it: a failed one handed the task back, an ok
    one allows only the agent's ok result after it)."""

    def __init__(self, agent_id: str, token: str, current: str | None) -> None:
        self.agent_id = agent_id
        self.token = int(token) if token.isdigit() else token
        self.current = int(current) if current is not None and current.isdigit() else current
        if current == "ended":
            what = "ended with its agent_done"
        else:
            now = "the run was re-created" if current is None else f"its current token is {current}"
            what = f"was taken over: {now}"
        super().__init__(f"the lease of agent {agent_id} (token {token}) {what}; "
                         "nothing was written")  # fmt: skip


class LimiterNotFoundError(LuftRedisError, LookupError):
    """A task names a rate limiter that was never set (``set_rate_limit``), or a limiter was
    read that does not exist; ``key`` is its hash. Nothing was claimed or submitted."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"no rate limiter at {key}: set it with set_rate_limit() first")


class HistoryUnavailableError(LuftRedisError, LookupError):
    """A point of a run that its history does not reach: before the history's first entry
    (a run written before luft-redis kept a history, a rolling upgrade, or entries trimmed
    with the log). ``first_version`` and ``first_id`` say where the history starts (``None``:
    the run has none)."""

    def __init__(self, run_id: object, at: object, first_version: int | None,
                 first_id: str | None) -> None:  # fmt: skip
        self.run_id = run_id
        self.at = at
        self.first_version = first_version
        self.first_id = first_id
        where = ("the run has no history" if first_version is None
                 else f"its history starts at version {first_version} ({first_id})")  # fmt: skip
        super().__init__(f"run {run_id}: no state at {at!r}: {where}")


class CorruptDataError(LuftRedisError):
    """Data stored in Redis cannot be decoded; ``key`` and ``field`` say where it is."""

    def __init__(self, key: str, field: str, message: str) -> None:
        self.key = key
        self.field = field
        self.message = message
        where = f"{key} field {field!r}" if field else key
        super().__init__(f"corrupt data in {where}: {message}")


class ConnectionError(LuftRedisError, builtins.ConnectionError):
    """Redis could not be reached or did not answer in time; ``__cause__`` holds the redis error."""


class NotDurableError(LuftRedisError):
    """Fewer replicas than asked acknowledged a write in time (``durability=``).

    The write is applied on the primary and in this backend's cache; it may be lost if the
    primary fails before a replica has it.
    """

    def __init__(self, wanted: int, acked: int) -> None:
        self.wanted = wanted
        self.acked = acked
        super().__init__(f"only {acked} of {wanted} replicas acknowledged the write in time")


class BackendError(LuftRedisError):
    """Redis answered with an error luft-redis does not expect (``__cause__`` holds it)."""


class AccessError(LuftRedisError):
    """Redis was reached but refused this client: a wrong or missing password, an ACL that
    does not cover the command or the keys, or a TLS handshake that failed. Never retried (it
    does not pass by itself); ``__cause__`` holds the redis-py error."""


class AuthenticationError(AccessError):
    """The server wants a (different) password or user: ``AUTH``/``HELLO`` failed or was
    missing (``NOAUTH``, ``WRONGPASS``)."""


class PermissionDeniedError(AccessError):
    """The ACL user may not run ``command`` on the keys or channels under ``prefix``
    (``NOPERM``): give it ``~<prefix>:*`` and ``&<prefix>:*`` and the commands in
    ``docs/security.md``."""

    def __init__(self, prefix: str | None, command: str, detail: str) -> None:
        self.prefix = prefix
        self.command = command
        self.detail = detail
        where = f"under prefix {prefix!r}" if prefix is not None else "for this client"
        super().__init__(f"the Redis ACL user may not run {command} {where}: {detail}")


class TLSError(AccessError):
    """The TLS handshake failed: the server's certificate did not verify (wrong CA, name or
    date), or the client's was refused."""
