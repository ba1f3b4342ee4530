"""docker-compose.yml's ``cluster`` and ``sentinel`` profiles, run without Docker.

Both profiles use the host's network, so each service's command is a command for this machine
as it stands. This test runs them as local processes, with every fixed port of the profile moved
to a free one (and each service in its own directory), then connects with the ``from_url``
line docs/operations.md gives for the profile (ports moved the same way) and writes a run. It
checks that the cluster-init command builds a working 3+3 cluster, that running it again is
harmless, and that the Sentinels find the primary of ``luft`` and its replicas.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from luft_redis import AgentDone, AgentStatus, RedisCheckpointBackend, TokenUsage
from luft_redis.tools.server import find_free_port, find_redis_cli, find_redis_server

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
OPERATIONS = ROOT / "docs" / "operations.md"  # "Run Redis: single, cluster, sentinel"
WAIT = 60.0


def profile_services(profile: str) -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return {name: svc for name, svc in data["services"].items()
            if profile in svc.get("profiles", [])}  # fmt: skip


def shell_command(service: dict[str, Any]) -> str:
    """The service's command as one shell line (``sh -c`` entrypoints are taken as they are)."""
    command = service["command"]
    if service.get("entrypoint") == ["sh", "-c"]:
        assert isinstance(command, list) and len(command) == 1
        return str(command[0])
    return shlex.join(str(part) for part in command)


def listen_port(service: dict[str, Any]) -> int:
    [port] = re.findall(r"--port (\d+)", shell_command(service))
    return int(port)


def documented_url(profile: str) -> str:
    match = re.search(rf'^\| `{profile}` \|[^|]*\| `RedisCheckpointBackend\.from_url\("([^"]+)"',
                      OPERATIONS.read_text(encoding="utf-8"), re.MULTILINE)  # fmt: skip
    assert match, f"no from_url line for {profile} in docs/operations.md"
    return match.group(1)


def free_port_pair() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        port = find_free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of ports")


class Profile:
    """The profile's services as local processes, every fixed port moved."""

    def __init__(self, profile: str, workdir: Path) -> None:
        self.services = profile_services(profile)
        self.workdir = workdir
        text = " ".join(shell_command(s) for s in self.services.values())
        # The ports the servers and Sentinels listen on; every mention of one is moved.
        fixed = sorted({int(p) for p in re.findall(r"(?:--port |'port )(\d+)", text)})
        self.ports = {old: free_port_pair() for old in fixed}
        self.procs: list[subprocess.Popen[bytes]] = []
        server = find_redis_server()
        cli = find_redis_cli(server)
        if server is None or cli is None:
            pytest.skip("redis-server and redis-cli are needed")
        bin_dir = workdir / "bin"
        bin_dir.mkdir()
        for name, target in (("redis-server", server), ("redis-sentinel", server),
                             ("redis-cli", cli)):  # fmt: skip
            (bin_dir / name).symlink_to(target)
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def moved(self, text: str) -> str:
        return re.sub(r"(?<![\d.])(\d{4,5})(?!\d)",
                      lambda m: str(self.ports.get(int(m.group(1)), m.group(1))), text)  # fmt: skip

    def _line(self, name: str) -> tuple[str, Path]:
        folder = self.workdir / name
        folder.mkdir(exist_ok=True)
        line = self.moved(shell_command(self.services[name]))
        return line.replace("/tmp/sentinel.conf", str(folder / "sentinel.conf")), folder

    def start(self, name: str) -> None:
        """Start service ``name`` in the background (its output in <name>/out.log)."""
        line, folder = self._line(name)
        with (folder / "out.log").open("wb") as log:
            self.procs.append(subprocess.Popen(["sh", "-c", line], cwd=folder, env=self.env,
                                               stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))  # fmt: skip

    def run(self, name: str) -> subprocess.CompletedProcess[str]:
        """Run service ``name`` to its end (a one-shot container such as cluster-init)."""
        line, folder = self._line(name)
        return subprocess.run(["sh", "-c", line], cwd=folder, env=self.env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip

    def ping(self, old_port: int) -> redis.Redis:
        client = redis.Redis(host="127.0.0.1", port=self.ports[old_port], socket_timeout=2)
        deadline = time.monotonic() + WAIT
        while True:
            try:
                client.ping()
                return client
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def start_profile(tmp_path: Path) -> Iterator[Callable[[str], Profile]]:
    started: list[Profile] = []

    def start(profile: str) -> Profile:
        started.append(Profile(profile, tmp_path / profile))
        return started[-1]

    (tmp_path / "cluster").mkdir()
    (tmp_path / "sentinel").mkdir()
    yield start
    for profile in started:
        profile.stop()


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def write_a_run(backend: RedisCheckpointBackend) -> uuid.UUID:
    run_id = uuid.uuid4()
    backend.init_run(run_id, "compose profile", "/tmp/runs/compose")
    backend.append_event(AgentDone(run_id=run_id, agent_id=uuid.uuid4(), status=AgentStatus.OK,
                                   tokens=TokenUsage(input=3), elapsed_ms=1))  # fmt: skip
    return run_id


@pytest.mark.cluster
@pytest.mark.slow
def test_the_cluster_profile_builds_a_cluster_the_documented_url_reaches(
    start_profile: Callable[[str], Profile],
) -> None:
    profile = start_profile("cluster")
    nodes = [n for n in profile.services if n != "cluster-init"]
    for name in nodes:
        profile.start(name)
    node_ports = [listen_port(profile.services[n]) for n in nodes]
    assert len(node_ports) == 6
    nodes_up = [profile.ping(port) for port in node_ports]

    created = profile.run("cluster-init")
    assert created.returncode == 0, created.stdout + created.stderr
    assert "[OK] All 16384 slots covered" in created.stdout

    def all_ok() -> bool:
        infos = [node.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
                 for node in nodes_up]  # fmt: skip
        return all(b"cluster_state:ok" in info for info in infos)

    wait_until(all_ok, "cluster_state:ok on every node")
    roles = [node.info("replication")["role"] for node in nodes_up]
    assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
    for node in nodes_up:
        node.close()

    again = profile.run("cluster-init")  # a second `up`
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already up" in again.stdout

    url = profile.moved(documented_url("cluster"))
    with RedisCheckpointBackend.from_url(url, cluster=True) as backend:
        run_id = write_a_run(backend)
    with RedisCheckpointBackend.from_url(url, cluster=True) as other:
        checkpoint = other.open_run(run_id)
        assert checkpoint is not None and checkpoint.total_tokens == 3


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.full  # Sentinel: pytest --full (CI), with tests/test_failover.py
def test_the_sentinel_profile_serves_the_documented_url(
    start_profile: Callable[[str], Profile],
) -> None:
    profile = start_profile("sentinel")
    for name in profile.services:
        profile.start(name)
    primary_port = listen_port(profile.services["sentinel-primary"])
    primary = profile.ping(primary_port)
    wait_until(lambda: primary.info("replication")["connected_slaves"] == 2,
               "two replicas connected to the primary")  # fmt: skip

    url = profile.moved(documented_url("sentinel"))
    sentinel_ports = [int(p) for p in re.findall(r":(\d+)", url)]
    assert len(sentinel_ports) == 3
    for port in sentinel_ports:
        sentinel = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

        def knows(sentinel: redis.Redis = sentinel) -> bool:
            try:
                replicas = sentinel.execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL", "REPLICAS", "luft")
            except redis.exceptions.RedisError:
                return False
            return len(replicas) == 2

        wait_until(knows, f"the sentinel on {port} to know both replicas")
        host, port_text = sentinel.execute_command(  # type: ignore[no-untyped-call]
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "luft")
        assert (host, int(port_text)) == (b"127.0.0.1", profile.ports[primary_port])
        sentinel.close()

    with RedisCheckpointBackend.from_url(url) as backend:
        run_id = write_a_run(backend)
    assert primary.exists(f"luft:{{{run_id}}}:run") == 1  # written on the primary
    primary.close()
