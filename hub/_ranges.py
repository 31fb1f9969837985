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
_SPEC_RE = re.compile(r"^(\d{0,19})-(\d{0,19})$")


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
    the RFC requires). Overlapping or adjacent ranges are merged; otherwise the
    requested order is kept. Raises :class:`RangeNotSatisfiable` for a
    malformed bytes range, more than :data:`MAX_RANGES` ranges, or when no
    range selects a byte.
    """
    if header is None:
        return None
    unit, sep, specs = header.strip().partition("=")
    if not sep:
        raise RangeNotSatisfiable("malformed Range header")
    if unit.strip().lower() != "bytes":
        return None
    parts = [p.strip() for p in specs.split(",")]
    if len(parts) > MAX_RANGES:
        raise RangeNotSatisfiable(f"more than {MAX_RANGES} ranges")
    ranges: list[ByteRange] = []
    for part in parts:
        match = _SPEC_RE.match(part)
        if not match or part == "-":
            raise RangeNotSatisfiable(f"malformed range {part[:40]!r}")
        first, last = match.groups()
        if first == "":
            suffix = int(last)
            if suffix == 0 or size == 0:
                continue
            ranges.append(ByteRange(max(0, size - suffix), size - 1))
            continue
        start = int(first)
        end = int(last) if last else size - 1
        if last and end < start:
            raise RangeNotSatisfiable(f"range {part!r} ends before it starts")
        if start >= size:
            continue
        ranges.append(ByteRange(start, min(end, size - 1)))
    if not ranges:
        raise RangeNotSatisfiable("no range overlaps the file")
    return _merge_touching(ranges)


def _merge_touching(ranges: list[ByteRange]) -> list[ByteRange]:
    """Overlapping or adjacent ranges merged (RFC 9110, 14.2); disjoint ones kept as sent."""
    ordered = sorted(ranges, key=lambda r: r.start)
    if all(a.end + 1 < b.start for a, b in itertools.pairwise(ordered)):
        return ranges
    merged = [ordered[0]]
    for r in ordered[1:]:
        last = merged[-1]
        if r.start <= last.end + 1:
            merged[-1] = ByteRange(last.start, max(last.end, r.end))
        else:
            merged.append(r)
    return merged
