"""The path of a new user: the README's first screen runs as written, the package builds with
its licence and the files the README links to, every relative link and anchor of the README and
docs/ resolves, and docker-compose.yml's profiles match the ``from_url`` lines
docs/operations.md gives for them."""

from __future__ import annotations

import email.parser
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
import redis

import luft_redis
from luft_redis.connect import _sentinel_parts, make_client
from luft_redis.tools.server import find_redis_cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"
COMPOSE = ROOT / "docker-compose.yml"
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def readme_section(title: str, path: Path = README) -> str:
    """The text of the section of ``path`` (the README) whose heading starts with ``title``."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}[^\n]*\n(.*?)(?=^## |\Z)", text,
                      re.MULTILINE | re.DOTALL)  # fmt: skip
    assert match, f"{path.name} has no section {title!r}"
    return match.group(1)


def code_blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


def run_python(code: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = cwd / "example.py"
    script.write_text(code, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


# --------------------------------------------------------------- the first screen


def test_install_section_says_how_to_install_without_pypi() -> None:
    install = readme_section("Install")
    commands = "\n".join(code_blocks(install, "sh"))
    assert "pip install .  " in commands and "pip install -e '.[dev]'" in commands
    assert "python -m build" in commands and "pip install dist/luft_redis-*.whl" in commands
    assert "not on PyPI" in install
    assert "fakeredis[lua]" in install  # the extra to name


@pytest.mark.server
def test_the_quickstart_runs_as_written_and_its_redis_cli_line_can_be_pasted(
    redis_url: str, tmp_path: Path
) -> None:
    quickstart = code_blocks(readme_section("Quickstart"), "python")[0]
    done = run_python(quickstart, tmp_path, {"LUFT_REDIS_URL": redis_url})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    match = re.fullmatch(rf"run id: ({UUID_RE})", lines[0])
    assert match, lines
    run_id = uuid.UUID(match.group(1))
    assert lines[1] == "1540 ok"
    assert lines[2] == "['agent_started', 'agent_done', 'run_done']"
    # The run it made is there, under the id it printed.
    with redis.Redis.from_url(redis_url) as client:
        assert client.hget(f"luft:{{{run_id}}}:run", "task") == b"review the repository"
    # Paste its redis-cli line.
    command = lines[3].removeprefix("look at it: ")
    assert command != lines[3], lines[3]
    argv = shlex.split(command)
    assert argv[0] == "redis-cli"
    cli = find_redis_cli()
    if cli is None:
        pytest.skip("redis-cli is not on PATH")
    shown = subprocess.run([cli, *argv[1:]], capture_output=True, text=True, timeout=30,
                           check=False)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "review the repository" in shown.stdout and str(run_id) in shown.stdout


@pytest.mark.server
def test_the_asyncio_example_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    [example] = code_blocks(readme_section("asyncio"), "python")
    done = run_python(example, tmp_path, {"LUFT_REDIS_URL": redis_url})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(rf"{UUID_RE} 100", lines[0]), lines
    assert lines[1:] == ["agent_done"] * 10


@pytest.mark.server
@pytest.mark.parametrize("which", [0, 1], ids=["sync", "asyncio"])
def test_the_fleet_workers_run_as_written(redis_url: str, tmp_path: Path, which: int) -> None:
    """The README's two worker loops: alone, each plans a run of five agents and runs them;
    three copies started on one run of 30 agents share them, and every agent ends with
    exactly one accepted ok agent_done."""
    blocks = code_blocks(readme_section("Running a fleet"), "python")
    assert len(blocks) == 2
    example = blocks[which]
    alone = run_python(example, tmp_path, {"LUFT_REDIS_URL": redis_url})
    assert alone.returncode == 0, alone.stderr
    assert re.fullmatch(rf"run {UUID_RE}: 5 agents done", alone.stdout.strip()), alone.stdout

    run_id, agents = uuid.uuid4(), [uuid.uuid4() for _ in range(30)]
    with luft_redis.RedisCheckpointBackend.from_url(redis_url, watch=False) as boss:
        boss.init_run(run_id, "three workers", "/tmp/runs/fleet")
        boss.submit_agents([luft_redis.AgentTask(a, 0, {"prompt": f"file {i}"})
                            for i, a in enumerate(agents)])  # fmt: skip
        env = {**os.environ, "LUFT_REDIS_URL": redis_url, "LUFT_RUN_ID": str(run_id)}
        script = tmp_path / "worker.py"
        script.write_text(example, encoding="utf-8")
        procs = [subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]  # fmt: skip
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            assert out.strip() == f"run {run_id}: 30 agents done"
        log = boss.get_event_log()
    ok = [e.agent_id for e in log if isinstance(e, luft_redis.AgentDone)
          and e.status is luft_redis.AgentStatus.OK]  # fmt: skip
    assert sorted(ok) == sorted(agents)


@pytest.mark.server
def test_the_pool_example_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    """The README's pool example: three runs in one pool, one worker runs every agent."""
    [example] = code_blocks(readme_section("Many runs, one fleet"), "python")
    done = run_python(example, tmp_path, {"LUFT_REDIS_URL": redis_url})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(re.fullmatch(rf"run {UUID_RE}: 4 agents done", line)
                                   for line in lines), lines  # fmt: skip


def test_the_quickstart_defaults_to_a_local_redis_and_names_the_variable() -> None:
    quickstart = code_blocks(readme_section("Quickstart"), "python")[0]
    assert 'os.environ.get("LUFT_REDIS_URL", "redis://127.0.0.1:6379/0")' in quickstart
    assert "decode_responses=False" in readme_section("Quickstart")


# --------------------------------------------------------------- the README's shape and links

FIRST_HOUR = ["Install", "Quickstart", "See it work", "Running a fleet", "asyncio", "Operate it",
              "Testing your code", "Development"]  # fmt: skip
FENCED = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def test_the_readme_follows_a_new_users_first_hour() -> None:
    """What luft-redis is, then install, quickstart, demo, fleet, asyncio, the CLI, testing your
    code and development, in that order (other sections may sit between them)."""
    headings = re.findall(r"^## (.+)$", FENCED.sub("", README.read_text(encoding="utf-8")),
                          re.MULTILINE)  # fmt: skip
    found = [next((i for i, h in enumerate(headings) if h.startswith(title)), -1)
             for title in FIRST_HOUR]  # fmt: skip
    assert -1 not in found, dict(zip(FIRST_HOUR, found, strict=True))
    assert found == sorted(found), headings
    intro = README.read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert "luft_core/state.rs" in intro and "Rust orchestrator" in intro  # luft, explained


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for the headings of a Markdown file: lower case, punctuation
    other than ``-`` and ``_`` dropped, spaces as ``-``, a repeated one suffixed ``-1``, ``-2``."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_anchors_follow_github() -> None:
    page = ROOT / "docs" / "performance.md"
    assert "agent-leases-python--m-benchmarksleases" in anchors(page)
    assert "luftrrun-hash" in anchors(ROOT / "docs" / "redis-layout.md")


def test_every_relative_link_and_anchor_resolves() -> None:
    """Each ``[text](target)`` outside code blocks of the README, DEVELOPERS.md, CHANGELOG.md
    and docs/*.md that is not a URL names a file that exists and, with ``#anchor``, a heading
    of that file (or of the page itself)."""
    pages = [README, ROOT / "DEVELOPERS.md", ROOT / "CHANGELOG.md",
             *sorted((ROOT / "docs").glob("*.md"))]  # fmt: skip
    broken: list[str] = []
    checked = 0
    for page in pages:
        text = FENCED.sub("", page.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:
            checked += 1
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert checked > 50
    assert not broken, "\n".join(broken)


# --------------------------------------------------------------- packaging


def test_the_version_is_kept_in_one_place() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert not re.search(r"^version\s*=", pyproject, re.MULTILINE)
    assert 'dynamic = ["version"]' in pyproject
    assert re.search(r'^\[tool\.hatch\.version\]\npath = "luft_redis/_version.py"$', pyproject,
                     re.MULTILINE)  # fmt: skip
    source = (ROOT / "luft_redis" / "_version.py").read_text(encoding="utf-8")
    assert re.findall(r'^__version__ = "([^"]+)"$', source, re.MULTILINE) == [
        luft_redis.__version__
    ]
    # nowhere else: every other module imports it from luft_redis._version
    for module in (ROOT / "luft_redis").rglob("*.py"):
        if module.name != "_version.py":
            text = module.read_text(encoding="utf-8")
            assert not re.search(r"^\s*__version__\s*=", text, re.MULTILINE), module


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and wheel ``python -m build`` makes from this checkout (wheel from sdist)."""
    if importlib.util.find_spec("build") is None:
        pytest.skip("the build package is not installed (it is in the dev extra)")
    if not (ROOT / "pyproject.toml").is_file():
        pytest.skip("not run from a checkout")
    source = tmp_path_factory.mktemp("source")
    # Build from a copy: nothing is written into the checkout.
    for name in ("luft_redis", "lua", "tests", "docs", "benchmarks"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md", "DEVELOPERS.md", "LICENSE",
                 "docker-compose.yml"):  # fmt: skip
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [sdist] = out.glob("luft_redis-*.tar.gz")
    [wheel] = out.glob("luft_redis-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.mark.slow
def test_the_sdist_holds_the_licence_and_the_files_the_readme_links_to(
    built: dict[str, Path],
) -> None:
    version = luft_redis.__version__
    with tarfile.open(built["sdist"]) as sdist:
        names = set(sdist.getnames())
        top = f"luft_redis-{version}"
        for name in ("LICENSE", "docker-compose.yml", "DEVELOPERS.md", "README.md",
                     "CHANGELOG.md", "pyproject.toml", "luft_redis/tools/testing.py"):  # fmt: skip
            assert f"{top}/{name}" in names, f"{name} missing from the sdist"
        lua = {name.removeprefix(f"{top}/") for name in names if name.endswith(".lua")}
        assert lua == {str(p.relative_to(ROOT)) for p in (ROOT / "lua").rglob("*.lua")}
        pkg_info = sdist.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        metadata = email.parser.Parser().parsestr(pkg_info.read().decode())
    assert metadata["Version"] == version
    assert metadata["License-Expression"] == "MIT"
    # Every file the README links to is shipped with it.
    for link in re.findall(r"\]\(([^)#:]+)\)", README.read_text(encoding="utf-8")):
        assert f"{top}/{link}" in names, f"the README links to {link}, which the sdist lacks"


@pytest.mark.slow
def test_the_wheel_has_the_version_licence_scripts_and_entry_points(
    built: dict[str, Path],
) -> None:
    version = luft_redis.__version__
    assert built["wheel"].name == f"luft_redis-{version}-py3-none-any.whl"
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = set(wheel.namelist())
        info = f"luft_redis-{version}.dist-info"
        metadata = email.parser.Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert metadata["Version"] == version and metadata["Name"] == "luft-redis"
    assert metadata["License-Expression"] == "MIT"
    assert f"{info}/licenses/LICENSE" in names
    assert "Provides-Extra: fakeredis" in str(metadata) and "build" in str(metadata)
    lua = {n for n in names if n.startswith("luft_redis/lua/") and n.endswith(".lua")}
    shipped = {f"luft_redis/lua/{p.relative_to(ROOT / 'lua')}"
               for p in (ROOT / "lua").rglob("*.lua")}  # fmt: skip
    assert lua == shipped
    assert "luft_redis/tools/testing.py" in names and "luft_redis/py.typed" in names
    assert re.search(r"^\[pytest11\]\nluft_redis = luft_redis\.tools\.testing$", entry_points,
                     re.MULTILINE)  # fmt: skip
    assert "luft-redis = luft_redis.tools.cli:main" in entry_points


@pytest.mark.slow
@pytest.mark.server
def test_the_wheel_installs_and_the_quickstart_runs_on_it(
    built: dict[str, Path], redis_url: str, tmp_path: Path
) -> None:
    """``pip install dist/luft_redis-*.whl`` into a new virtual environment, then the README's
    quickstart with that environment's Python. The dependencies are borrowed from the running
    environment (a path entry after the new one's own site-packages), so nothing is
    downloaded, and luft_redis itself can only come from the wheel."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)  # fmt: skip
    python = venv / "bin" / "python"
    installed = subprocess.run(  # this environment's pip, installing into the new one
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(built["wheel"])],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = subprocess.run([str(python), "-c", purelib], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()  # fmt: skip
    borrowed = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site) / "zz_borrowed_deps.pth").write_text("\n".join(borrowed) + "\n")
    which = "import luft_redis; print(luft_redis.__file__, luft_redis.__version__)"
    where = subprocess.run([str(python), "-c", which], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, check=False)  # fmt: skip
    assert where.returncode == 0, where.stderr
    path, version = where.stdout.split()
    assert Path(path).is_relative_to(venv) and version == luft_redis.__version__
    assert (venv / "bin" / "luft-redis").is_file()

    quickstart = code_blocks(readme_section("Quickstart"), "python")[0]
    (tmp_path / "quickstart.py").write_text(quickstart, encoding="utf-8")
    done = subprocess.run([str(python), "quickstart.py"], cwd=tmp_path,
                          env={**os.environ, "LUFT_REDIS_URL": redis_url}, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "1540 ok"


def test_the_licence_is_mit_for_the_contributors() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert re.search(r"^Copyright \(c\) \d{4} luft-redis contributors$", text, re.MULTILINE)
    assert "WITHOUT WARRANTY OF ANY KIND" in text


# --------------------------------------------------------------- docker compose


def compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def services_of(profile: str) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose()["services"].items()
            if profile in svc.get("profiles", [])}  # fmt: skip


def command_text(service: dict[str, Any]) -> str:
    command = service.get("command", [])
    return " ".join(command) if isinstance(command, list) else str(command)


def listening_ports(services: dict[str, dict[str, Any]]) -> dict[int, str]:
    """port -> service, from ``--port N`` (redis-server) or ``port N`` (a sentinel's config)."""
    ports: dict[int, str] = {}
    for name, svc in services.items():
        text = command_text(svc)
        found = re.findall(r"(?:--port |'port )(\d+)", text)
        if not found and "redis-server" in text:
            found = ["6379"]
        for port in found:
            ports[int(port)] = name
    return ports


def readme_urls() -> dict[str, tuple[str, str]]:
    """profile -> (URL, the rest of the from_url call), from the table of docs/operations.md
    (the README links to it for the profiles)."""
    rows = re.findall(r'^\| `(\w+)` \|[^|]*\| `RedisCheckpointBackend\.from_url\("([^"]+)"(.*?)\)`',
                      readme_section("Run Redis", OPERATIONS), re.MULTILINE)  # fmt: skip
    return {profile: (url, rest) for profile, url, rest in rows}


def test_the_compose_file_has_the_three_profiles_each_with_its_services() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        assert svc.get("profiles"), f"{name} has no profile: a plain `up` would start it"
    single = services_of("single")
    assert set(single) == {"redis"}
    assert single["redis"]["ports"] == ["127.0.0.1:6379:6379"]

    cluster = services_of("cluster")
    nodes = {n: s for n, s in cluster.items() if "--cluster-enabled" in command_text(s)}
    assert len(nodes) == 6
    init = cluster["cluster-init"]
    assert set(init["depends_on"]) == set(nodes)
    init_command = command_text(init)
    assert "--cluster-replicas 1" in init_command and "--cluster-yes" in init_command
    created = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", init_command)}
    assert created == set(listening_ports(nodes))

    sentinel = services_of("sentinel")
    servers = {n: s for n, s in sentinel.items() if "redis-server" in command_text(s)}
    sentinels = {n: s for n, s in sentinel.items() if "redis-sentinel" in command_text(s)}
    replicas = [n for n, s in servers.items() if "--replicaof" in command_text(s)]
    assert len(servers) == 3 and len(replicas) == 2 and len(sentinels) == 3
    [primary] = set(servers) - set(replicas)
    [primary_port] = listening_ports({primary: servers[primary]})
    for name in replicas:
        assert f"--replicaof 127.0.0.1 {primary_port}" in command_text(servers[name])
    for svc in sentinels.values():
        assert f"'sentinel monitor luft 127.0.0.1 {primary_port} 2'" in command_text(svc)

    # Every server is durable and never evicts; everything listens on loopback only.
    for name, svc in services.items():
        text = command_text(svc)
        if "redis-server" in text:
            assert re.search(r"--appendonly \"?yes", text), name
            assert "--maxmemory-policy noeviction" in text, name
        if svc.get("network_mode") == "host" and re.search(r"redis-(server|sentinel)", text):
            assert "bind 127.0.0.1" in text, f"{name} would listen on every interface"


def test_the_readme_urls_parse_and_reach_their_profiles() -> None:
    urls = readme_urls()
    assert set(urls) == {"single", "cluster", "sentinel"}

    url, rest = urls["single"]
    assert rest == ""
    client = make_client(url)  # the library's own parsing (no connection yet)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"]) == ("127.0.0.1", 6379)
    client.close()

    url, rest = urls["cluster"]
    assert rest == ", cluster=True"  # from_url has no cluster scheme: the option says it
    parsed = redis.connection.parse_url(url)  # type: ignore[no-untyped-call]  # as from_url
    assert parsed["host"] == "127.0.0.1"
    assert parsed["port"] in listening_ports(services_of("cluster"))

    url, rest = urls["sentinel"]
    assert rest == ""
    hosts, service, db = _sentinel_parts(url, {})
    assert service == "luft" and db == 0
    sentinels = {n: s for n, s in services_of("sentinel").items()
                 if "redis-sentinel" in command_text(s)}  # fmt: skip
    assert {port for _, port in hosts} == set(listening_ports(sentinels))
    assert {host for host, _ in hosts} == {"127.0.0.1"}
    client = make_client(url)
    assert client.connection_pool.service_name == "luft"
    client.close()

    # The compose file's own header gives the same lines.
    header = COMPOSE.read_text(encoding="utf-8")
    for url, _ in urls.values():
        assert f'"{url}"' in header, f"{url} is not in docker-compose.yml's header"


def test_docker_compose_config_accepts_each_profile() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True,
                           timeout=30, check=False)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"`docker compose` does not work here: {probe.stderr.strip()[:200]}")
    for profile in ("single", "cluster", "sentinel"):
        done = subprocess.run(
            [docker, "compose", "-f", str(COMPOSE), "--profile", profile, "config", "--services"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert set(done.stdout.split()) == set(services_of(profile))

