"""The delta parser (no I/O): differential tests against a plain reference implementation.

``split_indexed`` cuts a delta's record parts with a :mod:`struct` format built from the
lengths, and ``parse_delta`` reads the header inline: both must accept exactly what the plain
netstring readers below accept, return the same parts, and raise ValueError (never anything
else, never a silently different split) for everything else.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luft_redis import types as t
from luft_redis.delta import Delta, UnknownFormat, parse_delta, split_indexed


def _examples(count: int) -> int:
    """*count* examples under the Hypothesis profile ``ci`` (``pytest --full``, 100 examples by
    default), a quarter of them under ``dev`` (the everyday loop); see tests/conftest.py."""
    return max(min(count, 2), count * settings().max_examples // 100)


# -------------------------------------------------------------------------- reference


def reference_split_indexed(payload: bytes, start: int) -> list[bytes]:
    """The record parts as a plain reading of the format: a netstring of decimal lengths
    separated by single spaces, then exactly that many bytes."""
    if start >= len(payload):
        return []
    colon = payload.index(b":", start)
    size = payload[start:colon]
    if not size.isdigit():
        raise ValueError("size")
    body = colon + 1 + int(size)
    if body > len(payload):
        raise ValueError("short")
    lengths = []
    for word in payload[colon + 1 : body].split(b" "):
        if not word.isdigit():  # empty (a doubled, leading or trailing space), a sign...
            raise ValueError("word")
        lengths.append(int(word))
    parts, pos = [], body
    for length in lengths:
        parts.append(payload[pos : pos + length])
        pos += length
    if pos != len(payload):
        raise ValueError("length")
    return parts


def body_of(parts: list[bytes]) -> bytes:
    """The records as the scripts write them (no records: no body at all)."""
    if not parts:
        return b""
    index = b" ".join(str(len(p)).encode() for p in parts)
    return str(len(index)).encode() + b":" + index + b"".join(parts)


def outcome(fn: object, *args: object) -> object:
    try:
        return fn(*args)  # type: ignore[operator]
    except ValueError:
        return ValueError


# -------------------------------------------------------------------------- split_indexed

PARTS = st.lists(st.binary(max_size=40), max_size=30)


@given(PARTS, st.binary(max_size=8))
def test_split_indexed_returns_the_parts_written(parts: list[bytes], prefix: bytes) -> None:
    payload = prefix + body_of(parts)
    assert split_indexed(payload, len(prefix)) == parts
    assert reference_split_indexed(payload, len(prefix)) == parts


INDEX_NOISE = st.sampled_from([
    b"", b" ", b"  ", b"-1", b"+1", b"1_0", b"x", b"\xd9\xa1", b"0", b"01", b"99999999999999999999",
    b"9223372036854775807", b"1 ", b" 1", b"1  1", b"1\t1", b"s", b"3s",
])  # fmt: skip


@settings(max_examples=_examples(400))
@given(PARTS, st.lists(INDEX_NOISE, min_size=1, max_size=4), st.integers(0, 60),
       st.binary(max_size=6))
def test_split_indexed_agrees_with_the_reference_on_bad_input(
    parts: list[bytes], noise: list[bytes], where: int, tail: bytes,
) -> None:
    """A corrupted index (spaces, signs, struct format letters, huge numbers) or a body of
    the wrong length: the same parts as the reference, or ValueError from both."""
    index = b" ".join(str(len(p)).encode() for p in parts)
    cut = min(where, len(index))
    index = index[:cut] + b"".join(noise) + index[cut:]
    payload = str(len(index)).encode() + b":" + index + b"".join(parts) + tail
    assert outcome(split_indexed, payload, 0) == outcome(reference_split_indexed, payload, 0)


@pytest.mark.parametrize("payload", [
    b"3:1  2abc", b"3: 12abc", b"3:12 abc", b"2:-1a", b"1:3ab", b"1:1ab", b"0:", b"x:1a",
    b"25:99999999999999999999999a", b"20:99999999999999999999", b"3:1s1ab", b"1:s",
    # sizes that add up once a stray space reads as one byte ("<1ss2s" is 1 + 1 + 2 bytes)
    b"4:1  2abcd", b"4: 1 1abc", b"4:1 1 abc", b"3:1 1ab\x00",
])  # fmt: skip
def test_split_indexed_refuses_malformed_indexes(payload: bytes) -> None:
    with pytest.raises(ValueError):
        split_indexed(payload, 0)


# -------------------------------------------------------------------------- parse_delta


def reference_parse(payload: bytes) -> tuple[object, ...]:
    """The header as the format states it: ``2:L3``, then five netstrings whose lengths are
    ASCII digits; versions are decimals. Any other format (``L2`` included) is unknown."""
    if not payload.startswith(b"2:L"):
        raise UnknownFormat(payload[:4])
    fmt = payload[2:4]
    if fmt != b"L3":
        raise UnknownFormat(fmt)
    head, pos = [], 4
    for _ in range(5):
        colon = payload.find(b":", pos)
        size = payload[pos:colon]
        if colon < 0 or not size.isdigit() or len(size) > 20:
            raise ValueError("size")
        end = colon + 1 + int(size)
        if end > len(payload):
            raise ValueError("short")
        head.append(payload[colon + 1 : end])
        pos = end
    inc_before, v_before, inc_after, v_after, op = head
    if not (v_before.isdigit() and v_after.isdigit()):
        raise ValueError("versions")
    return (inc_before.decode(), int(v_before), inc_after.decode(), int(v_after), op, pos, fmt)


def netstring(part: bytes) -> bytes:
    return str(len(part)).encode() + b":" + part


def fields(delta: Delta) -> tuple[object, ...]:
    d = dataclasses.astuple(delta)
    assert delta.sent is None  # (set by the writer for its own reply only)
    return d[:5] + d[6:-1]  # without the payload and what a write sent


def header(formats: list[bytes]) -> st.SearchStrategy[tuple[bytes, ...]]:
    return st.tuples(
        st.sampled_from(formats), st.sampled_from([b"", uuid.uuid4().hex.encode()]),
        st.integers(0, 2**64).map(lambda n: str(n).encode()),
        st.sampled_from([b"", uuid.uuid4().hex.encode()]),
        st.integers(0, 2**64).map(lambda n: str(n).encode()),
        st.sampled_from([b"append", b"save", b"init", b"replay", b"delete", b""]),
    )  # fmt: skip


HEADER = header([b"L3"])
ANY_HEADER = header([b"L2", b"L3", b"L4", b"L9"])


@given(HEADER, PARTS)
def test_parse_delta_reads_every_header_field(head: tuple[bytes, ...], parts: list[bytes]) -> None:
    payload = b"".join(netstring(p) for p in head) + body_of(parts)
    delta = parse_delta(payload)
    assert fields(delta) == reference_parse(payload)
    assert delta.payload is payload
    assert delta.fmt == b"L3"
    assert delta.records() == parts


@given(header([b"L2"]), PARTS)
def test_an_l2_delta_is_refused_as_an_unknown_format(
    head: tuple[bytes, ...], parts: list[bytes]
) -> None:
    """``L2`` (every record part a netstring of its own) was replaced by ``L3`` before any
    release, and its reader removed: an L2 payload, laid out as L2 or as L3, is an unknown
    format (the cache reloads), never read with the L3 rules."""
    for body in (b"".join(netstring(p) for p in parts), body_of(parts)):
        payload = b"".join(netstring(p) for p in head) + body
        with pytest.raises(UnknownFormat, match="unknown change format b'L2'"):
            parse_delta(payload)


@settings(max_examples=_examples(400))
@given(ANY_HEADER, st.integers(0, 120), st.binary(min_size=1, max_size=4), st.booleans())
def test_parse_delta_agrees_with_the_reference_on_bad_input(
    head: tuple[bytes, ...], where: int, junk: bytes, replace: bool,
) -> None:
    good = b"".join(netstring(p) for p in head)
    cut = min(where, len(good))
    payload = good[:cut] + junk + good[cut + (len(junk) if replace else 0) :]

    def ours() -> object:
        try:
            return fields(parse_delta(payload))
        except UnknownFormat:
            return UnknownFormat
        except ValueError:
            return ValueError

    def theirs() -> object:
        try:
            return reference_parse(payload)
        except UnknownFormat:
            return UnknownFormat
        except (ValueError, UnicodeDecodeError):
            return ValueError

    assert ours() == theirs()


def test_parse_delta_refuses_what_is_not_bytes() -> None:
    with pytest.raises(ValueError, match="bytes, not str"):
        parse_delta("2:L3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bytes, not bytearray"):
        parse_delta(bytearray(b"2:L30:1:00:1:10:"))  # type: ignore[arg-type]


# -------------------------------------------------------------------------- trusted records


@pytest.mark.parametrize("cls", [
    t.AgentResultCache, t.AgentSessionCheckpoint, t.PhaseSummary, t.RunCheckpoint, t.Finding,
    t.TokenUsage, t.Location,
])  # fmt: skip
def test_trusted_constructors_need_every_field(cls: type[t.Record]) -> None:
    """The generated ``_trusted`` sets every slot, and a missing field is a TypeError at once
    (never an instance with an unset slot)."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    values = {name: f"v-{name}" for name in names}
    made = cls._trusted(**values)
    assert type(made) is cls
    assert {name: getattr(made, name) for name in names} == values
    with pytest.raises(TypeError, match=names[-1]):
        cls._trusted(**{n: v for n, v in values.items() if n != names[-1]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.__setattr__(names[0], 1)
