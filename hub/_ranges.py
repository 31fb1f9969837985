"""HTTP byte ranges (RFC 9110 section 14): parse a ``Range`` header against a file size.

The one parser of the hub: the mirror answers ranges with it (:mod:`cmh.hub.mirror._ranges`
is its face there), and ``install()``'s HTTP hook (:mod:`cmh.hub.resolver._session`) reads
the single range of a request it answers from the cache with it.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

#: More ranges than this in one header are refused (416), a guard against range floods.
MAX_RANGES = 64
_SPEC_RE = re.compile(r"^([0-9]*)-([0-9]*)\Z")  # ASCII digits only (RFC 9110 1DIGIT)
#: Digits of a position beyond which it is past the end of any file (clipped or unsatisfiable
#: as its place says, never converted: a huge number costs nothing).
_MAX_DIGITS = 19
_BEYOND = 1 << 64


class RangeNotSatisfiable(ValueError):
    """The ``Range`` header is malformed, too large or selects no byte of the file."""


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``start`` to ``end`` inclusive."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.end}/{size}"


def parse_range(header: str | None, size: int) -> list[ByteRange] | None:
    """The ranges to send, or ``None`` for the whole file.

    ``None`` when there is no header or its unit is not ``bytes`` (ignored, as
    the RFC requires), and for an empty file asked for a suffix (``-n``, n > 0:
    the only range an empty file satisfies). Empty list elements are ignored; a
    position of more than 19 digits is past the end of any file. Overlapping or
    adjacent ranges are merged; otherwise the requested order is kept. Raises
    :class:`RangeNotSatisfiable` for a malformed bytes range, more than
    :data:`MAX_RANGES` ranges, or when no range selects a byte.
    """
    if header is None:
        return None
    unit, sep, specs = header.strip().partition("=")
    if not sep:
        raise RangeNotSatisfiable("malformed Range header")
    if unit.strip().lower() != "bytes":
        return None
    # empty list elements are ignored (RFC 9110 5.6.1.2), at least one range is needed
    parts = [p for p in (p.strip() for p in specs.split(",")) if p]
    if not parts:
        raise RangeNotSatisfiable("malformed Range header: no range")
    if len(parts) > MAX_RANGES:
        raise RangeNotSatisfiable(f"more than {MAX_RANGES} ranges")
    ranges: list[ByteRange] = []
    empty_whole = False  # an empty file asked for a suffix: satisfiable, answered whole
    for part in parts:
        match = _SPEC_RE.match(part)
        if not match or part == "-":
            raise RangeNotSatisfiable(f"malformed range {part[:40]!r}")
        first, last = match.groups()
        if first == "":
            suffix = _position(last)
            empty_whole = empty_whole or (size == 0 and suffix > 0)
            if suffix == 0 or size == 0:
                continue
            ranges.append(ByteRange(max(0, size - suffix), size - 1))
            continue
        start = _position(first)
        end = _position(last) if last else size - 1
        if last and end < start:
            raise RangeNotSatisfiable(f"range {part!r} ends before it starts")
        if start >= size:
            continue
        ranges.append(ByteRange(start, min(end, size - 1)))
    if empty_whole:
        return None  # RFC 9110 14.1.1: only a suffix range is satisfiable on an empty file
    if not ranges:
        raise RangeNotSatisfiable("no range overlaps the file")
    return _merge_touching(ranges)


def _position(digits: str) -> int:
    """A position's value; past :data:`_MAX_DIGITS` significant digits, one past any file."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_DIGITS else _BEYOND


def _merge_touching(ranges: list[ByteRange]) -> list[ByteRange]:
    """Overlapping or adjacent ranges merged (RFC 9110, 14.2); the ranges left in the order
    requested, a merged one at the place of its first-requested member."""
    order = sorted(range(len(ranges)), key=lambda i: ranges[i].start)
    if all(ranges[a].end + 1 < ranges[b].start for a, b in itertools.pairwise(order)):
        return ranges
    merged: list[tuple[int, ByteRange]] = []  # (first-requested member's place, range)
    for i in order:
        r = ranges[i]
        if merged and r.start <= merged[-1][1].end + 1:
            place, last = merged[-1]
            merged[-1] = (min(place, i), ByteRange(last.start, max(last.end, r.end)))
        else:
            merged.append((i, r))
    return [r for _, r in sorted(merged, key=lambda m: m[0])]
