"""Deltas: what a writing script changed, as it replies and publishes it (no I/O here).

Every writing script (``lua/*.lua``) replies with one delta and publishes the same bytes on the
run's change channel. A delta starts with a header of six netstrings ``<len>:<bytes>``:

    ``L3``, incarnation before, version before, incarnation after, version after, operation

then its records (see ``lua/includes/delta.lua``). In format ``L3`` (this version) the record
parts follow as one netstring of their byte lengths (decimals separated by spaces) and then the
parts back to back, so splitting them is one ``bytes.split`` and one slice per part; an ``E res``
record's ``findings`` attribute is empty when the delta's ``F`` record for the same segment
carries the blob (sent once).

The header alone says whether a cache can apply the delta: only when the cache holds exactly
``(incarnation before, version before)``. The records are parsed only when the delta is
applied (:meth:`Delta.records`), so a process that never reads its checkpoint never decodes
other processes' work.

0.1.0 published notices without a format part (their first part is a version number). A
payload in any format this code does not know raises :class:`UnknownFormat`: the cache then
reloads through ``load``, which reads every format. So does ``L2``, a format of this version's
development that ``L3`` replaced before any release: its reader is gone, and an ``L2`` payload
is refused as unknown rather than read with the ``L3`` rules.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORMAT",
    "READABLE_FORMATS",
    "WHOLE_STATE_OPS",
    "Delta",
    "UnknownFormat",
    "parse_delta",
    "split",
]

FORMAT = b"L3"
"""The first part of every delta this version writes."""

READABLE_FORMATS = frozenset({FORMAT})
"""Every delta format this version reads: the one it writes (no released version wrote another
one; 0.1.0's notices have no format part and are refused, the cache then reloads)."""

WHOLE_STATE_OPS = frozenset({b"init", b"save"})
"""Operations whose delta carries the whole state (a ``Z`` record) instead of changes."""


class UnknownFormat(ValueError):
    """A delta or notice in a format this version does not read (reload instead)."""


def split(payload: bytes, start: int = 0, limit: int = -1) -> tuple[list[bytes], int]:
    """The netstrings of ``payload`` from offset ``start`` (at most ``limit`` of them, -1: all),
    and the offset after the last one read. ValueError when malformed."""
    parts: list[bytes] = []
    pos, end = start, len(payload)
    find = payload.find
    while pos < end and limit != 0:
        colon = find(b":", pos, pos + 21)
        size = payload[pos:colon]
        if colon < 0 or not size.isdigit():  # ASCII digits only: no sign, space or "_"
            raise ValueError("malformed netstring length")
        first = colon + 1
        last = first + int(size)
        if last > end:
            raise ValueError("truncated netstring")
        parts.append(payload[first:last])
        pos = last
        limit -= 1
    return parts, pos


@dataclass(slots=True, eq=False)
class Delta:
    """One script's change: ``(inc_before, v_before) -> (inc_after, v_after)`` and its records.

    Treat it as immutable (it is not frozen only because a frozen dataclass is slower to make,
    and one is made for every reply and notice)."""

    inc_before: str
    v_before: int
    inc_after: str
    v_after: int
    op: bytes
    payload: bytes
    body: int
    """Offset of the first record in ``payload``."""
    fmt: bytes = FORMAT
    """The delta's format (:data:`READABLE_FORMATS`)."""
    sent: Mapping[str | bytes, Any] | None = None
    """For the reply of this process' own write: what the write sent
    (:data:`luft_redis.wire.Sent`), which the cache takes instead of decoding it again."""

    @property
    def changed(self) -> bool:
        """False for a delta that changed nothing (a no-op or a replayed reply)."""
        return self.v_after != self.v_before

    @property
    def whole(self) -> bool:
        """True when the records are the whole state (init_run, save_checkpoint)."""
        return self.op in WHOLE_STATE_OPS

    @property
    def replay(self) -> bool:
        """True for the reply to a retried operation whose first attempt was applied: the
        versions of that attempt, without its records."""
        return self.op == b"replay"

    @property
    def deleted(self) -> bool:
        return self.op == b"delete"

    def records(self) -> list[bytes]:
        """The parts of every record, in order (parsed now; ValueError when malformed)."""
        return split_indexed(self.payload, self.body)


def split_indexed(payload: bytes, start: int) -> list[bytes]:
    """The record parts of an L3 delta body at ``start``: a netstring of the parts' lengths,
    then the parts back to back. ValueError when malformed.

    The lengths become a :mod:`struct` format (``b"1 36 0"`` -> ``b"<1s36s0s"``), so the
    parts are cut in C: a Python loop over them cost three times as much."""
    end = len(payload)
    if start >= end:
        return []
    index, body = split(payload, start, 1)
    text = index[0]
    # ASCII digits (no sign, no "_") separated by single spaces: a bare "s" in the format
    # would read one byte, so no leading, trailing or doubled space may reach it
    if (not text.replace(b" ", b"").isdigit()
            or text[0] == 32 or text[-1] == 32 or b"  " in text):  # fmt: skip
        raise ValueError("malformed record index")
    try:
        layout = struct.Struct(b"<" + text.replace(b" ", b"s") + b"s")
    except struct.error as exc:  # a length too large for a format
        raise ValueError(f"malformed record index: {exc}") from None
    if layout.size != end - body:
        raise ValueError("record index does not match the delta's length")
    return list(layout.unpack_from(payload, body))


def _split5(payload: bytes) -> tuple[list[bytes], int]:
    """:func:`split` of the five header netstrings after the format (at offset 4), unrolled:
    the header is read for every reply and notice. ValueError when malformed or short."""
    find, end = payload.find, len(payload)
    parts: list[bytes] = []
    pos = 4
    for _ in (1, 2, 3, 4, 5):
        colon = find(b":", pos, pos + 21)
        size = payload[pos:colon]
        if colon < 0 or not size.isdigit():
            raise ValueError("truncated delta header" if pos >= end
                             else "malformed netstring length")  # fmt: skip
        pos = colon + 1 + int(size)
        if pos > end:
            raise ValueError("truncated netstring")
        parts.append(payload[colon + 1:pos])
    return parts, pos


def parse_delta(payload: bytes) -> Delta:
    """Parse the header of a delta; :class:`UnknownFormat` for another format, ValueError when
    malformed."""
    if type(payload) is not bytes:
        if not isinstance(payload, bytes):
            raise ValueError(f"a delta is bytes, not {type(payload).__name__}")
        payload = bytes(payload)
    if not payload.startswith(b"2:L"):
        raise UnknownFormat(f"unknown change format {payload[:12]!r}")
    fmt = payload[2:4]
    if fmt not in READABLE_FORMATS:
        raise UnknownFormat(f"unknown change format {fmt!r}")
    head, pos = _split5(payload)
    inc_before, v_before, inc_after, v_after, op = head
    if not (v_before.isdigit() and v_after.isdigit()):
        raise ValueError("delta versions are not decimal numbers")
    return Delta(inc_before.decode(), int(v_before), inc_after.decode(), int(v_after), op,
                 payload, pos, fmt)  # fmt: skip
