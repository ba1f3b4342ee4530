"""What really differs between the asyncio and the sync front end, each by name and reason.

The I/O code of luft-redis is written once, for asyncio, in :mod:`luft_redis.asyncio` (the
backend, the change listener and the FCALL helper). ``.ci/unasync.py`` generates the sync
modules (:mod:`luft_redis._sync.backend`, :mod:`luft_redis._sync.listener`,
:mod:`luft_redis._sync.fcall`) from it with fixed renames: ``async``/``await`` dropped,
``AsyncX`` -> ``X``, ``async_x`` -> ``sync_x``, ``aclose`` -> ``close``. Whatever is more
than a rename lives here, in two families of the same names, so a reader sees every
difference in one page:

===========================  ================================  ===============================
name (asyncio / sync)        asyncio                           sync
===========================  ================================  ===============================
``AsyncLock`` / ``Lock``     ``asyncio.Lock``                  ``threading.Lock``
                             (held across I/O: one write at a time, operation numbers in order)
``AsyncStateLock`` /         nothing: code between two         ``threading.Lock``: threads
``StateLock``                ``await`` runs alone on the loop  interleave anywhere
``AsyncSignal`` / ``Signal`` an ``asyncio.Event`` per round    a ``threading.Condition``
``AsyncWorkQueue`` /         ``collections.deque`` + a signal  ``queue.SimpleQueue``
``WorkQueue``
``AsyncWorker`` / ``Worker`` a task on the running loop        a daemon thread (at
                                                               ``LISTENER_NICE`` for listeners)
``AsyncRegistry`` /          one listener per client **and     one per client and process
``Registry``                 event loop** (tasks belong to
                             their loop)
``async_sleep`` /            ``asyncio.sleep``                 ``time.sleep``
``sync_sleep``
``async_adopts_fork`` /      False: :class:`ForkedError`       True: the sync backend
``sync_adopts_fork``         (asyncio does not survive a fork) takes a new identity and
                                                               connections in the child
``async_cluster_ready`` /    ``await client.initialize()``     nothing: a sync RedisCluster
``sync_cluster_ready``       (the asyncio client maps slots    maps them when it is made
                             lazily)
``async_run_callback`` /     a coroutine a callback returns    the callback's result is
``sync_run_callback``        runs as a task                    ignored
``async_within`` /           ``asyncio.wait_for``: the call is a daemon thread runs the call;
``sync_within``              cancelled (its connection closed) the caller stops waiting (a
                                                               blocked socket cannot be
                                                               interrupted; the thread ends
                                                               when its connection does)
===========================  ================================  ===============================

The subscriber transports (a hiredis reader of our own on the socket for sync code, redis-py's
asyncio ``PubSub`` for asyncio) are in :mod:`luft_redis.subscriber`.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

__all__ = [
    "AsyncLock",
    "AsyncRegistry",
    "AsyncSignal",
    "AsyncStateLock",
    "AsyncWorkQueue",
    "AsyncWorker",
    "Lock",
    "Registry",
    "Signal",
    "StateLock",
    "WorkQueue",
    "Worker",
    "async_adopts_fork",
    "async_cluster_ready",
    "async_run_callback",
    "async_sleep",
    "async_within",
    "lower_priority",
    "sync_adopts_fork",
    "sync_cluster_ready",
    "sync_run_callback",
    "sync_sleep",
    "sync_within",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# ----------------------------------------------------------------------------- locks

AsyncLock = asyncio.Lock
Lock = threading.Lock


class AsyncStateLock:
    """A lock around a few lines without I/O: nothing to do on one event loop."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        return None


StateLock = threading.Lock

# ----------------------------------------------------------------------------- signals


class AsyncSignal:
    """Wakes the coroutines waiting for a condition when somebody says it may have changed
    (a condition variable without a lock: everything runs on one loop)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def notify(self) -> None:
        """Wake every waiter (never blocks)."""
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``predicate()`` holds (checked after every :meth:`notify`); False when
        ``timeout`` seconds passed first (``None``: no limit)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not predicate():
            if self._event is None:
                self._event = asyncio.Event()
            event = self._event
            if deadline is None:
                await event.wait()
                continue
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(event.wait(), left)
            except TimeoutError:
                return predicate()
        return True


class Signal:
    """:class:`AsyncSignal` for threads: state changes before :meth:`notify`, which takes the
    condition's lock, so a waiter that just found the predicate false cannot miss it."""

    __slots__ = ("_condition",)

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())

    def notify(self) -> None:
        with self._condition:
            self._condition.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        with self._condition:
            return self._condition.wait_for(predicate, timeout)


# ----------------------------------------------------------------------------- work queues


class AsyncWorkQueue(Generic[_T]):
    """A FIFO that never blocks its producers; :meth:`get` waits on the loop."""

    __slots__ = ("_items", "_signal")

    def __init__(self) -> None:
        self._items: collections.deque[_T] = collections.deque()
        self._signal = AsyncSignal()

    def put(self, item: _T) -> None:
        self._items.append(item)
        self._signal.notify()

    def get_nowait(self) -> _T | None:
        return self._items.popleft() if self._items else None

    def empty(self) -> bool:
        return not self._items

    async def get(self, timeout: float) -> _T | None:
        """The next item, or None when none came within ``timeout`` seconds."""
        await self._signal.wait_for(lambda: bool(self._items), timeout)
        return self.get_nowait()


class WorkQueue(Generic[_T]):
    """:class:`AsyncWorkQueue` between threads."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_T] = queue.SimpleQueue()

    def put(self, item: _T) -> None:
        self._queue.put(item)

    def get_nowait(self) -> _T | None:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def empty(self) -> bool:
        return self._queue.empty()

    def get(self, timeout: float) -> _T | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


# ----------------------------------------------------------------------------- workers


def lower_priority(nice: int | None) -> None:
    """Give the calling thread the nice value ``nice`` (Linux only; see
    ``luft_redis._sync.listener.LISTENER_NICE``)."""
    if nice is None or not sys.platform.startswith("linux"):
        return
    try:  # on Linux, PRIO_PROCESS with a thread id sets that one thread's priority
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        if nice > current:  # lowering is always allowed; raising it back is not
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:
        logger.debug("could not lower the thread's priority: %s", exc)


class AsyncWorker:
    """A coroutine function run as a task on the running loop."""

    __slots__ = ("_task",)

    def __init__(self, target: Callable[[], Awaitable[None]], name: str,
                 nice: Callable[[], int | None] | None = None) -> None:  # fmt: skip
        async def run() -> None:
            await target()

        self._task = asyncio.get_running_loop().create_task(run(), name=name)

    @property
    def alive(self) -> bool:
        return not self._task.done()

    def current(self) -> bool:
        """The caller runs in this worker."""
        return asyncio.current_task() is self._task

    async def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the task to end, then cancel it."""
        task = self._task
        if task.done() or self.current():
            return
        await asyncio.wait({task}, timeout=timeout)
        if task.done():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            running = asyncio.current_task()
            if running is not None and running.cancelling():
                raise  # we are being cancelled ourselves, not only the worker
        except Exception:
            logger.debug("stopping %s failed", task.get_name(), exc_info=True)


class Worker:
    """A daemon thread; ``nice()`` (read in the thread, at its start) is its nice value."""

    __slots__ = ("_thread",)

    def __init__(self, target: Callable[[], None], name: str,
                 nice: Callable[[], int | None] | None = None) -> None:  # fmt: skip
        def run() -> None:
            if nice is not None:
                lower_priority(nice())
            target()

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def current(self) -> bool:
        return self._thread is threading.current_thread()

    def join(self, timeout: float) -> None:
        if not self.current():
            self._thread.join(timeout)


# ----------------------------------------------------------------------------- registries


class AsyncRegistry(Generic[_T]):
    """One object per client and event loop (asyncio tasks and connections belong to the
    loop that made them). Use it from a coroutine."""

    __slots__ = ("_per_loop",)

    def __init__(self) -> None:
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _T]] = (
            weakref.WeakKeyDictionary()
        )

    def _here(self) -> dict[int, _T]:
        return self._per_loop.setdefault(asyncio.get_running_loop(), {})

    def get(self, client: Any, make: Callable[[Any], _T]) -> _T:
        here = self._here()
        found = here.get(id(client))
        if found is None or getattr(found, "_client", None) is not client:
            found = here[id(client)] = make(client)
        return found

    def existing(self, client: Any) -> _T | None:
        found = self._here().get(id(client))
        return found if getattr(found, "_client", None) is client else None

    def drop(self, client: Any, item: _T) -> None:
        here = self._here()
        if here.get(id(client)) is item:
            del here[id(client)]

    def forget_all(self) -> None:
        """In a forked child: the loops and their tasks are the parent's."""
        self._per_loop = weakref.WeakKeyDictionary()


class Registry(Generic[_T]):
    """One object per client in this process (threads serve every caller)."""

    __slots__ = ("_items", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[int, _T] = {}

    def get(self, client: Any, make: Callable[[Any], _T]) -> _T:
        with self._lock:
            found = self._items.get(id(client))
            if found is None or getattr(found, "_client", None) is not client:
                found = self._items[id(client)] = make(client)
            return found

    def existing(self, client: Any) -> _T | None:
        with self._lock:
            found = self._items.get(id(client))
            return found if getattr(found, "_client", None) is client else None

    def drop(self, client: Any, item: _T) -> None:
        with self._lock:
            if self._items.get(id(client)) is item:
                del self._items[id(client)]

    def forget_all(self) -> None:
        """In a forked child: the threads are gone (and the lock may be held by one)."""
        self._lock = threading.Lock()
        self._items = {}


# ----------------------------------------------------------------------------- the rest

async_sleep = asyncio.sleep
sync_sleep = time.sleep


def _too_late(what: str, timeout: float) -> Exception:
    from .errors import ConnectionError as LuftConnectionError

    return LuftConnectionError(f"{what}: no answer within {timeout:.3f} s")


async def async_within(call: Callable[[], Awaitable[_T]], timeout: float, what: str) -> _T:
    """``await call()``, given up after ``timeout`` seconds (luft's ``ConnectionError``)."""
    try:
        return await asyncio.wait_for(call(), timeout)
    except TimeoutError:
        raise _too_late(what, timeout) from None


def sync_within(call: Callable[[], _T], timeout: float, what: str) -> _T:
    """``call()`` in a daemon thread, waited for up to ``timeout`` seconds (luft's
    ``ConnectionError`` after that; the thread is left to end with its connection)."""
    done = threading.Event()
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller
            outcome.append((False, exc))
        done.set()

    threading.Thread(target=run, name=f"luft-redis {what}", daemon=True).start()
    if not done.wait(timeout):
        raise _too_late(what, timeout)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def async_adopts_fork() -> bool:
    """asyncio does not survive a fork: a backend made before it refuses to work in the child
    (:class:`~luft_redis.errors.ForkedError`)."""
    return False


def sync_adopts_fork() -> bool:
    """A sync backend adopts a fork: a new writer identity, connections and listener."""
    return True


async def async_cluster_ready(client: Any) -> None:
    """Map the slots (no I/O once done; again after a connection error)."""
    await client.initialize()


def sync_cluster_ready(client: Any) -> None:
    """A sync RedisCluster maps the slots when it is made."""


_CALLBACK_TASKS: set[asyncio.Future[Any]] = set()


def _callback_done(task: asyncio.Future[Any]) -> None:
    _CALLBACK_TASKS.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("change callback failed", exc_info=task.exception())


def async_run_callback(callback: Callable[[Any], object], value: Any) -> None:
    """``callback(value)``; a coroutine it returns runs as a task (errors are logged)."""
    result = callback(value)
    if inspect.isawaitable(result):
        task = asyncio.ensure_future(result)
        _CALLBACK_TASKS.add(task)
        task.add_done_callback(_callback_done)


def sync_run_callback(callback: Callable[[Any], object], value: Any) -> None:
    callback(value)
