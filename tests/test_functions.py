"""The scripts as one Redis Functions library (luft_redis/scripts.py, docs/redis-layout.md).

* the library's assembly: names carrying the content hash, each operation one function whose
  body is its file, the helpers of ``lua/includes/`` defined once, ``load`` read-only;
* the ``-<numkeys>`` of a file name checked against the keys passed and the keys read;
* loading: a server, a node or a cluster without the library (new, flushed, restarted) gets it
  on the first call, which then succeeds; every later call is one ``FCALL``, nothing else;
* on Redis Cluster each call goes to the slot's owner without redis-py's ``COMMAND GETKEYS``;
* several versions of the library side by side.

Both front ends, on fakeredis, a real server and a cluster where the point applies.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from luft_redis import AgentStarted, CheckpointStatus, ConfigurationError
from luft_redis.keys import run_index_key, run_keys
from luft_redis.scripts import (
    PREFIX_OPS,
    READ_ONLY,
    SCRIPT_NAMES,
    _check_keys,
    _script_file,
    cluster_route,
    is_function_missing,
    library,
    listed_libraries,
    script_source,
)
from luft_redis.tools.doctor import check_server


def _started(run_id: uuid.UUID) -> AgentStarted:
    return AgentStarted(run_id=run_id, phase_id=0, agent_id=uuid.uuid4(), prompt_preview="p",
                        model="m")  # fmt: skip


def _nodes(client: Any) -> list[Any]:
    """A plain client per node of the target (one for a single server or fakeredis)."""
    if isinstance(client, RedisCluster):
        nodes = client.get_nodes()  # type: ignore[no-untyped-call]
        return [redis.Redis(host=n.host, port=n.port) for n in nodes]
    return [client]


def _libraries(node: Any) -> set[str]:
    return set(listed_libraries(node.function_list("luft_*")))


def _is_primary(node: redis.Redis) -> bool:
    return bool(node.info("replication")["role"] == "master")


def _calls(client: Any) -> dict[str, int]:
    """commandstats summed over the target's nodes: command -> calls (failed ones included)."""
    total: dict[str, int] = {}
    for node in _nodes(client):
        for name, stat in node.info("commandstats").items():
            total[name] = total.get(name, 0) + int(stat["calls"])
    return total


def _reset_stats(client: Any) -> None:
    for node in _nodes(client):
        node.config_resetstat()


def _flush_functions(client: Any) -> None:
    for node in _nodes(client):
        node.function_flush()


# ------------------------------------------------------------------------------ assembly


def test_library_names_carry_the_content_hash() -> None:
    lib = library()
    assert re.fullmatch(r"luft_[0-9a-f]{12}", lib.name)
    assert lib.code.startswith(f"#!lua name={lib.name}\n")
    for op in SCRIPT_NAMES:
        fn = getattr(lib.ops, op)
        assert fn.name == f"{op}_{lib.digest}"
        assert f"function_name = '{fn.name}'" in lib.code
        assert fn.head == ("FCALL_RO" if op in READ_ONLY else "FCALL", fn.name, fn.numkeys)
    assert lib.code.count("flags = {'no-writes'}") == len(READ_ONLY)
    assert re.search(r"flags = \{'no-writes'\},\n  callback = function\(keys, argv\)\nKEYS, ARGV "
                     r"= keys, argv\n--\[\[\n  load:", lib.code)  # fmt: skip


PER_CALL = (
    "begin_call()",
    "begin_delta()",
    "do local bad = take_options(); if bad then return redis.error_reply(bad) end end",
)
"""The per-call statements of the library includes (call, delta, options), in the order a
script runs them: dependencies first."""


def _function_body(code: str, op: str) -> str:
    start = code.index(f"function_name = '{op}_")
    end = code.find("redis.register_function{", start)
    return code[start:end if end >= 0 else len(code)]


def test_helpers_are_defined_once_and_each_file_is_a_function_body() -> None:
    code = library().code
    for helper in ("fail", "dedup", "commit", "begin_call", "begin_delta", "u64_add", "read_run",
                   "take_options", "retain", "trim_log", "check_type", "check_run_types",
                   "notify", "optional_fields", "tombstone_reply", "tombstone_keep"):  # fmt: skip
        assert code.count(f"local function {helper}(") == 1, helper
    # the includes come before every function
    assert code.index("local function begin_call()") < code.index("redis.register_function")
    for op in SCRIPT_NAMES:
        path, _ = _script_file(op)
        text = path.read_text(encoding="utf-8")
        body = _function_body(code, op)
        # the file's own lines, in order, with each @include line replaced
        own = [ln for ln in text.replace('--- @include "includes/main"', "").splitlines()
               if not ln.startswith("--- @include")]  # fmt: skip
        at = 0
        for line in own:
            at = body.index(line, at) + len(line) if line else at
        # each per-call statement the script reaches runs once, in order, before main()
        ran = [s for s in PER_CALL if f"\n{s}\n" in body]
        for s in ran:
            assert body.count(f"\n{s}\n") == 1, (op, s)
        positions = [body.index(f"\n{s}\n") for s in ran]
        assert positions == sorted(positions), op
        if "@include" in text and op not in PREFIX_OPS:  # (a pool's scripts take no run)
            assert ran[0] == "begin_call()", op
            assert positions[-1] < body.index("local function main()"), op
        if "includes/retention" in text:
            assert PER_CALL[2] in ran, op


def test_the_files_still_run_as_eval_scripts() -> None:
    """script_source: includes in place, then the @each-call statement (the EVAL form)."""
    source = script_source("cancel")
    assert "--- @include" not in source
    assert source.index("local function begin_call()") < source.index("\nbegin_call()\n")
    assert source.index("\nbegin_call()\n") < source.index("\nbegin_delta()\n")
    assert source.index("\nbegin_delta()\n") < source.index("local function main()")


def test_eval_form_and_function_give_the_same_reply() -> None:
    import fakeredis

    client: Any = fakeredis.FakeRedis()
    lib = library()
    client.execute_command(*lib.load_command)
    run_id = uuid.uuid4()
    keys = list(run_keys("luft", run_id))
    init = ["w", "1", str(run_id), "t", "/d", "n", "1", "ab12"]
    client.execute_command(*lib.ops.init_run.command(keys, init))
    by_function = client.execute_command(*lib.ops.load.command(keys, ()))
    by_eval = client.eval(script_source("load"), len(keys), *keys)
    assert by_function == by_eval and by_function[0][:2] == [b"schema", b"1"]


# ------------------------------------------------------------------------------ numkeys


def test_keys_passed_must_match_the_file_name() -> None:
    fn = library().ops.append_events
    keys = list(run_keys("luft", uuid.uuid4()))
    with pytest.raises(ConfigurationError, match=r"append_events-12\.lua takes 12 keys, 8 were"):
        fn.command(keys[:8], ("w", "1"))
    with pytest.raises(ConfigurationError, match=r"takes 12 keys, 13 were"):
        fn.command([*keys, "extra"], ())
    assert fn.command(keys, ("w", "1"))[:3] == ("FCALL", fn.name, 12)


def test_a_script_reading_past_its_numkeys_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"bad-2\.lua reads KEYS\[3\].*2 keys"):
        _check_keys("bad", 2, "local a, b = KEYS[1], KEYS[3]")
    _check_keys("good", 2, "local a, b = KEYS[1], KEYS[2]")
    for op in SCRIPT_NAMES:  # every shipped script passes (library() checks them too)
        _check_keys(op, _script_file(op)[1], script_source(op))


def test_function_missing_is_recognised() -> None:
    err = redis.exceptions.ResponseError
    assert is_function_missing(err("Function not found"))
    assert is_function_missing(err("ERR Function not found"))
    assert is_function_missing(err("No such function"))
    assert not is_function_missing(err("LUFT_BAD_ARG Function not found"))
    assert not is_function_missing(redis.exceptions.ConnectionError("Function not found"))


# ------------------------------------------------------------------------------ loading


def test_a_flushed_library_is_loaded_again_by_the_next_call(
    make_frontend_backend: Callable[..., Any], redis_client: Any
) -> None:
    """A new, flushed or restarted server (or node) lacks the library: the first call loads it
    and succeeds; nothing reaches the caller."""
    _flush_functions(redis_client)
    backend = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "/d")
    _flush_functions(redis_client)  # as a restart or failover to a node without it would
    backend.append_event(_started(run_id))
    _flush_functions(redis_client)
    other = make_frontend_backend(watch=False)
    cp = other.open_run(run_id)  # FCALL_RO, loaded the same way
    assert cp is not None and cp.status is CheckpointStatus.RUNNING
    assert other.get_event_log() == backend.get_event_log() and len(backend.get_event_log()) == 1
    holders = [n for n in _nodes(redis_client) if library().name in _libraries(n)]
    assert holders, "the library was not loaded again"


@pytest.mark.parametrize("redis_target", ["redis", "cluster"], indirect=True)
def test_the_common_path_is_one_fcall(
    make_frontend_backend: Callable[..., Any], redis_client: Any
) -> None:
    """The first call on a server without the library costs FCALL (refused) + FUNCTION LOAD +
    FCALL (then, for a lifecycle change such as init_run, the run index's FCALL of
    index_status); every later call is one FCALL and nothing else (commandstats of every
    node)."""
    _flush_functions(redis_client)
    backend = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    _reset_stats(redis_client)
    backend.init_run(run_id, "t", "/d")
    first = _calls(redis_client)
    if isinstance(redis_client, RedisCluster):  # loaded on every primary first, then one FCALL
        primaries = sum(_is_primary(n) for n in _nodes(redis_client))
        assert first.get("cmdstat_function|load") == primaries
        assert first.get("cmdstat_fcall") == 1 + 1  # init_run, index_status
    else:
        assert first.get("cmdstat_fcall") == 2 + 1 and first.get("cmdstat_function|load") == 1
    _reset_stats(redis_client)
    for _ in range(5):
        backend.append_event(_started(run_id))
    later = _calls(redis_client)
    for own in ("config|resetstat", "hello", "info"):  # this test's own connections
        later.pop(f"cmdstat_{own}", None)
    inner = ("hget", "hmget", "hset", "hsetnx", "hlen", "xlen", "llen", "zcard", "time", "xadd",
             "spublish", "type", "hexists", "pttl")  # fmt: skip
    script_inner = {"cmdstat_" + c for c in inner}
    outer = {k: v for k, v in later.items() if k not in script_inner}
    assert outer == {"cmdstat_fcall": 5}, outer


@pytest.mark.parametrize("redis_target", ["cluster"], indirect=True)
def test_cluster_calls_go_to_the_slot_owner_in_one_round_trip(
    make_frontend_backend: Callable[..., Any], redis_client: Any
) -> None:
    """Each operation on a run is one command, sent straight to the primary owning the run's
    slot: no other node sees a command of it, and no extra round trip (a ``COMMAND GETKEYS``
    to find the keys, a ``MOVED`` detour) precedes it, whatever the redis-py version does on
    its own (per-node commandstats)."""
    backend = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "/d")  # primes the client first
    keys = list(run_keys("luft", run_id))
    owner = redis_client.get_node_from_key(keys[0]).name
    assert cluster_route(redis_client, keys)["target_nodes"].name == owner
    _reset_stats(redis_client)
    backend.append_event(_started(run_id))
    assert backend.open_run(run_id) is not None
    assert backend.delete_run(run_id)
    index_owner = redis_client.get_node_from_key(run_index_key("luft")).name
    for node in redis_client.get_nodes():
        with redis.Redis(host=node.host, port=node.port) as plain:
            info = plain.info("commandstats").items()
        # a MOVED or ASK reply counts as a rejected call, not a call
        stats = {k: int(v["calls"]) + int(v.get("rejected_calls", 0)) for k, v in info}
        # FCALL/FCALL_RO and any COMMAND subcommand (GETKEYS: an extra round trip); what the
        # scripts run inside and this test's own INFO/CONFIG calls are left out
        outer = {
            k: v
            for k, v in stats.items()
            if v and k.startswith(("cmdstat_fcall", "cmdstat_command"))
        }
        expected: dict[str, int] = {}
        if node.name == owner:  # append_event, open_run, delete_run
            expected = {"cmdstat_fcall": 2, "cmdstat_fcall_ro": 1}
        if node.name == index_owner:  # the run index's index_status (the removal)
            expected["cmdstat_fcall"] = expected.get("cmdstat_fcall", 0) + 1
        assert outer == expected, (node.name, outer)


@pytest.mark.parametrize("redis_target", ["cluster"], indirect=True)
def test_a_cluster_node_without_the_library_loads_it_on_its_first_miss(
    make_frontend_backend: Callable[..., Any], redis_client: Any
) -> None:
    backend = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "/d")
    owner = redis_client.get_node_from_key(run_keys("luft", run_id).run)
    with redis.Redis(host=owner.host, port=owner.port) as node:
        node.function_flush()  # a node that joined or was replaced after the client started
        backend.append_event(_started(run_id))
        assert _libraries(node) == {library().name}


@pytest.mark.parametrize("redis_target", ["redis"], indirect=True)
def test_versions_side_by_side(
    make_frontend_backend: Callable[..., Any], redis_client: Any
) -> None:
    """Another version's library (another hash) stays loaded and untouched; each process calls
    its own functions."""
    lib = library()
    old = lib.code.replace(lib.digest, "0123456789ab")
    redis_client.function_load(old, replace=True)
    backend = make_frontend_backend(watch=False)
    run_id = uuid.uuid4()
    backend.init_run(run_id, "t", "/d")
    backend.append_event(_started(run_id))
    assert _libraries(redis_client) == {lib.name, "luft_0123456789ab"}
    listed = listed_libraries(redis_client.function_list("luft_0123456789ab"))
    assert listed == {"luft_0123456789ab": sorted(f"{op}_0123456789ab" for op in SCRIPT_NAMES)}
    report = check_server(redis_client)
    (functions,) = [c for c in report.checks if c.name == "functions"]
    assert functions.level == "ok"
    assert f"{lib.name} (this version)" in functions.message
    assert "luft_0123456789ab," in functions.message or "luft_0123456789ab;" in functions.message
    assert "1 other version(s)" in functions.message


def test_doctor_without_a_library_and_on_fakeredis() -> None:
    import fakeredis

    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    (functions,) = [c for c in check_server(client).checks if c.name == "functions"]
    assert functions.level == "ok" and "no luft-redis library loaded yet" in functions.message
    client.function_load(library().code)
    (functions,) = [c for c in check_server(client).checks if c.name == "functions"]
    assert functions.message == f"luft-redis libraries: {library().name} (this version)"


def test_cluster_route_falls_back_to_redis_py_while_the_slot_is_unknown() -> None:
    """During a failover the slot table may not cover the run's slot: the call then goes
    without target_nodes, and redis-py routes it with its own retries."""

    class Nodes:
        def __init__(self, owner: object) -> None:
            self.owner = owner
            self.asked: list[int] = []

        def get_node_from_slot(self, slot: int) -> object:
            self.asked.append(slot)
            if self.owner is None:
                raise redis.exceptions.SlotNotCoveredError(f"slot {slot} not covered")
            return self.owner

    class Client:
        def __init__(self, owner: object) -> None:
            self.nodes_manager = Nodes(owner)

    keys = list(run_keys("luft", uuid.uuid4()))
    node = object()
    client = Client(node)
    assert cluster_route(client, keys) == {"target_nodes": node}
    assert client.nodes_manager.asked == [redis.crc.key_slot(keys[0].encode())]
    assert cluster_route(Client(None), keys) == {}


def test_a_server_without_functions_is_a_clear_configuration_error() -> None:
    """fakeredis older than 7 (or without lupa) answers "unknown command 'fcall'": say what
    to install instead of a raw BackendError."""
    import fakeredis

    from luft_redis import RedisCheckpointBackend

    backend = RedisCheckpointBackend(fakeredis.FakeRedis(version=6), watch=False)
    with pytest.raises(ConfigurationError, match=r"Redis 7\.0.*fakeredis\[lua\]"):
        backend.init_run(uuid.uuid4(), "t", "/d")


def test_the_change_channel_is_an_argument_not_a_key() -> None:
    """A run's change channel is not declared in KEYS (a declared name that never exists makes
    a migrating Cluster slot answer TRYAGAIN to every call): every writing function gets it as
    ARGV[1], and it hashes to the run's slot, so SPUBLISH inside the function stays local."""
    run_id = uuid.uuid4()
    keys = run_keys("luft", run_id)
    assert keys.changes == f"luft:{{{run_id}}}:changes" and keys.changes not in keys
    assert len(keys) == 12 and keys._fields[-1] == "history"
    slot = redis.crc.key_slot(keys.run.encode())
    assert redis.crc.key_slot(keys.changes.encode()) == slot
    lib = library()
    for op in SCRIPT_NAMES:
        fn = getattr(lib.ops, op)
        if op in PREFIX_OPS:  # the run index's and a pool's: arguments as given, no channel
            other = [f"luft:{{luft}}:k{i}" for i in range(fn.numkeys)]
            assert fn.command(other, ("a",))[3:] == (*other, "a")
            continue
        run_keys_of_call = [*keys, *(f"luft:{{{run_id}}}:extra{i}" for i in range(fn.numkeys - 12))]
        command = fn.command(run_keys_of_call, ("a", "b"))
        assert command[3 : 3 + fn.numkeys] == tuple(run_keys_of_call), op
        argv = command[3 + fn.numkeys :]
        assert argv == (("a", "b") if fn.read_only else (keys.changes, "a", "b")), op
    with pytest.raises(ConfigurationError, match="not the main hash key"):
        lib.ops.cancel.command([keys.events, *keys[1:]], ())
