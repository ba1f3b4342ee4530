"""The pytest plugin ``luft_redis.tools.testing``, tested as a user meets it: a test file of
their own, run by pytest in a subprocess (``pytester``), with the plugin loaded through its
entry point only (nothing in a conftest, no ``-p``)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from luft_redis.tools.server import find_redis_server

pytest_plugins = ["pytester"]

HINT = "pip install 'fakeredis[lua]'"

README = Path(__file__).resolve().parent.parent / "README.md"

USER_TESTS = '''
import asyncio
import uuid

from luft_redis import AgentDone, AgentStatus, CheckpointStatus, TokenUsage


def done(run_id, tokens):
    return AgentDone(run_id=run_id, agent_id=uuid.uuid4(), status=AgentStatus.OK,
                     tokens=TokenUsage(input=tokens), elapsed_ms=1)


def test_sync_backend_on_fakeredis(luft_backend, luft_fakeredis):
    run_id = uuid.uuid4()
    luft_backend.init_run(run_id, "task", "/tmp/run")
    luft_backend.append_event(done(run_id, 7))
    assert luft_backend.get_checkpoint().total_tokens == 7
    # the fixture's raw client sees the same server
    assert luft_fakeredis.exists(f"luft:{{{run_id}}}:run") == 1


def test_each_test_gets_an_empty_server(luft_backend):
    assert luft_backend.list_runs() == []


def test_a_second_worker_on_the_same_server(luft_backend, luft_make_backend):
    run_id = uuid.uuid4()
    luft_backend.init_run(run_id, "task", "/tmp/run")
    worker = luft_make_backend(watch=False)
    assert worker is not luft_backend and worker.client is not luft_backend.client
    assert worker.open_run(run_id).status == CheckpointStatus.RUNNING
    before = luft_backend.version
    worker.append_event(done(run_id, 5))
    assert worker.get_checkpoint().total_tokens == 5
    assert luft_backend.wait_for_change(before, timeout=10)   # the change notice arrived
    assert luft_backend.get_checkpoint().total_tokens == 5


def test_async_backend_on_fakeredis(luft_async_backend):
    async def main():
        async with luft_async_backend as backend:
            run_id = uuid.uuid4()
            await backend.init_run(run_id, "task", "/tmp/run")
            await asyncio.gather(*(backend.append_event(done(run_id, 2)) for _ in range(3)))
            assert backend.get_checkpoint().total_tokens == 6
    asyncio.run(main())


def test_real_server(luft_server_backend, luft_redis_url, luft_redis_server):
    assert luft_redis_url == luft_redis_server.url
    assert luft_server_backend.list_runs() == []
    run_id = uuid.uuid4()
    luft_server_backend.init_run(run_id, "task", "/tmp/run")
    assert luft_server_backend.list_runs() == [run_id]


def test_real_server_is_emptied_between_tests(luft_server_backend):
    assert luft_server_backend.list_runs() == []
'''

FAKEREDIS_TESTS = 6 - 2  # the tests above that need fakeredis only
SERVER_TESTS = 2


def test_the_plugin_is_registered_as_a_pytest_entry_point() -> None:
    points = importlib.metadata.entry_points(group="pytest11")
    assert [p.value for p in points if p.name == "luft_redis"] == ["luft_redis.tools.testing"]


def test_a_users_tests_use_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=120)
    have_server = find_redis_server() is not None
    result.assert_outcomes(
        passed=FAKEREDIS_TESTS + (SERVER_TESTS if have_server else 0),
        skipped=0 if have_server else SERVER_TESTS,
    )


def test_fixtures_are_listed_with_their_docs(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures", timeout=120)
    out = result.stdout.str()
    for name in ("luft_backend", "luft_async_backend", "luft_make_backend", "luft_fakeredis",
                 "luft_redis_server", "luft_redis_url", "luft_server_backend"):  # fmt: skip
        assert re.search(rf"^{name}\b.*\n\s+\S", out, re.MULTILINE), f"{name} not listed"


def test_without_fakeredis_the_fixtures_skip_and_say_what_to_install(
    pytester: pytest.Pytester,
) -> None:
    # The user's environment has no fakeredis: any import of it fails.
    pytester.makeconftest("import sys\nsys.modules['fakeredis'] = None\n")
    pytester.makepyfile(
        test_user="""
        def test_sync(luft_backend): raise AssertionError("must not run")
        def test_async(luft_async_backend): raise AssertionError("must not run")
        def test_worker(luft_make_backend): raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=120)
    result.assert_outcomes(skipped=3)
    assert result.stdout.str().count(f"needs fakeredis with Lua: {HINT}") == 3


def test_with_fakeredis_but_no_lua_the_fixtures_skip_and_say_what_to_install(
    pytester: pytest.Pytester,
) -> None:
    # fakeredis is there, lupa (its Lua) is not: fakeredis answers EVALSHA as unknown.
    pytester.makeconftest("import sys\nsys.modules['lupa'] = None\n")
    pytester.makepyfile(
        test_user="""
        import fakeredis
        def test_fakeredis_has_no_lua_here():
            try:
                fakeredis.FakeRedis().evalsha("0" * 40, 0)
            except Exception as exc:
                assert "unknown command" in str(exc)
            else:
                raise AssertionError("fakeredis ran a script without lupa")
        def test_sync(luft_backend): raise AssertionError("must not run")
        def test_async(luft_async_backend): raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=120)
    result.assert_outcomes(passed=1, skipped=2)
    assert result.stdout.str().count(f"needs fakeredis with Lua: {HINT}") == 2


def readme_section(title: str) -> str:
    """The text of the README section whose heading is ``title`` (up to the next ``## ``)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no section {title!r}"
    return match.group(1)


def test_the_readme_example_test_passes(pytester: pytest.Pytester) -> None:
    blocks = re.findall(r"```python\n(.*?)```", readme_section("Testing your code"), re.DOTALL)
    assert blocks, "the README's testing section has no python example"
    pytester.makepyfile(test_readme_example=blocks[0])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=120)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 2 and not outcomes.get("failed"), outcomes
    assert not outcomes.get("error") and not outcomes.get("errors"), outcomes
