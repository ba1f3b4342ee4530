"""The Lua includes: one job each, and every file includes what it uses (DEVELOPERS.md).

A name (a helper, a constant, a per-call variable) defined at the top level of an include may
be used only by a file that includes it, directly or through the includes it names; a file
includes nothing it does not use (only the per-call statement of ``call``, ``delta`` and
``options`` counts as a use of its own). Checked on the files' text, so a missing include
fails here and not only as a nil global in the EVAL form of one script.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from luft_redis.scripts import SCRIPT_NAMES, _each_call, _script_file, lua_dir, script_source

_INCLUDE = re.compile(r'^--- @include "includes/([a-z_]+)"$', re.MULTILINE)
_DEFINED = re.compile(r"^local function (\w+)|^local ([\w, ]+?)(?: =|$)", re.MULTILINE)


def _code(text: str) -> str:
    """``text`` without comments and string literals (a name inside either is not a use)."""
    text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.DOTALL)
    text = re.sub(r"--[^\n]*", "", text)
    return re.sub(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"", "''", text)


def _includes() -> dict[str, str]:
    """The library includes by name (``main.lua``, copied in place, defines nothing shared)."""
    files = sorted((lua_dir() / "includes").glob("*.lua"))
    return {p.stem: p.read_text(encoding="utf-8") for p in files if p.stem != "main"}


def _defined(text: str) -> set[str]:
    names: set[str] = set()
    for fn, decl in _DEFINED.findall(text):
        names.update([fn] if fn else [n.strip() for n in decl.split(",")])
    return names


def _reached(name: str, includes: dict[str, str]) -> Iterator[str]:
    for dep in _INCLUDE.findall(includes[name]):
        yield dep
        yield from _reached(dep, includes)


def _files() -> list[tuple[str, str]]:
    scripts = [(_script_file(op)[0].name, _script_file(op)[0].read_text(encoding="utf-8"))
               for op in SCRIPT_NAMES]  # fmt: skip
    return scripts + [(f"includes/{k}.lua", v) for k, v in _includes().items()]


@pytest.mark.parametrize(("name", "text"), _files(), ids=[n for n, _ in _files()])
def test_a_file_uses_only_what_it_includes_and_includes_only_what_it_uses(
    name: str, text: str
) -> None:
    includes = _includes()
    owner = {defined: inc for inc, body in includes.items() for defined in _defined(body)}
    direct = [d for d in _INCLUDE.findall(text) if d != "main"]
    reach = set(direct)
    for dep in direct:
        reach.update(_reached(dep, includes))
    code = _code(text)
    own = _defined(text)
    used = {n for n in owner if n not in own and re.search(rf"\b{re.escape(n)}\b", code)}
    missing = sorted(f"{n} ({owner[n]})" for n in used if owner[n] not in reach)
    assert not missing, f"{name} uses names of includes it does not include: {missing}"
    for dep in direct:
        uses_it = any(owner[n] == dep for n in used)
        assert uses_it or _each_call(f"includes/{dep}"), f"{name} includes {dep}, uses none of it"


def test_every_include_is_used_and_names_are_defined_once() -> None:
    includes = _includes()
    seen: dict[str, str] = {}
    for inc, body in includes.items():
        for n in _defined(body):
            assert n not in seen, f"{n} defined by includes/{seen[n]} and includes/{inc}"
            seen[n] = inc
    used = {dep for _, text in _files() for dep in _INCLUDE.findall(text)} - {"main"}
    assert used == set(includes), f"unused includes: {set(includes) - used}"


def test_each_include_is_small() -> None:
    """One job each: no include grows back into a prelude of everything."""
    for inc, body in _includes().items():
        assert len(body.splitlines()) <= 160, inc


@pytest.mark.parametrize("op", SCRIPT_NAMES)
def test_the_eval_form_defines_every_name_it_uses(op: str) -> None:
    """The EVAL form of each script (includes in place) defines each include name it uses
    before it runs main(): a missing include would be a nil global only there."""
    source = _code(script_source(op))
    owner = {n for body in _includes().values() for n in _defined(body)}
    defined = _defined(source)
    used = {n for n in owner if re.search(rf"\b{re.escape(n)}\b", source)}
    assert used <= defined, sorted(used - defined)


def test_the_includes_folder_is_the_one_the_loader_reads() -> None:
    assert (lua_dir() / "includes" / "call.lua").is_file()
    assert Path(lua_dir()).name == "lua"


def _lua_list(name: str) -> list[str]:
    text = (lua_dir() / "includes" / "entities.lua").read_text(encoding="utf-8")
    m = re.search(rf"^local {name} = \{{([^}}]*)\}}", text, re.MULTILINE)
    assert m, name
    return re.findall(r"'([a-z_]+)'", m.group(1))


def test_the_entity_attributes_are_those_of_the_records_they_store() -> None:
    """includes/entities.lua (what the scripts store and read back), the records of
    luft_redis/types.py, the cache's reader and docs/redis-layout.md name the same attributes:
    a field added to a record and not stored (or stored and not read) fails here."""
    from luft_redis import cache
    from luft_redis import types as t

    def fields(cls: type[t.Record], key: str) -> tuple[set[str], set[str]]:
        specs = [s for s in cls._field_specs() if s.name != key]
        optional = {s.name for s in specs if s.kind.nullable}
        return {s.name for s in specs}, optional

    doc = (Path(__file__).resolve().parents[1] / "docs" / "redis-layout.md").read_text()
    for tag, cls, key, extra, also_optional, letter in (
        ("PHASE", t.PhaseSummary, "phase_id", {"seq"}, set(), "P"),
        ("RESULT", t.AgentResultCache, "agent_id", set(), {"findings"}, "A"),
        ("SESSION", t.AgentSessionCheckpoint, "agent_id", set(), set(), "A"),
    ):
        attrs, optional = _lua_list(f"{tag}_ATTRS"), _lua_list(f"{tag}_OPTIONAL")
        declared, nullable = fields(cls, key)
        assert len(set(attrs)) == len(attrs) and set(attrs) == declared | extra, tag
        assert set(optional) == nullable | also_optional, tag
        assert [a for a in attrs if a in optional] == optional, f"{tag}: argument order"
        section = doc[doc.index(f"## `luft:{{R}}:{tag.lower()}s` (hash)"):]
        section = section[: section.index("\n## ", 1)]
        for attr in attrs:
            assert f"`{letter}:{attr}`" in section, (tag, attr)
    assert list(cache._RESULT_COLUMNS) == _lua_list("RESULT_ATTRS")
    # the arguments wire.Encoder sends for a result's optional attributes, in this order
    assert _lua_list("RESULT_OPTIONAL") == ["output", "findings", *t.RESULT_TEXT_FIELDS]
