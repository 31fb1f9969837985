"""HTTP byte ranges for the mirror: the hub's one parser (:mod:`cmh.hub._ranges`), and
what a body of ranges holds."""

from __future__ import annotations

from .._ranges import MAX_RANGES, ByteRange, RangeNotSatisfiable, parse_range


def is_whole(ranges: list[ByteRange] | None, size: int) -> bool:
    """True when the body is the whole file (no ranges, or one range of every byte)."""
    return ranges is None or (
        len(ranges) == 1 and ranges[0].start == 0 and ranges[0].end == size - 1
    )


def reaches_end(ranges: list[ByteRange] | None, size: int) -> bool:
    """True when the body holds the file's last byte: it may complete a file a client
    assembles from ranges (a resumed download), so it is held to the whole body's rule."""
    return ranges is None or any(r.end == size - 1 for r in ranges)


__all__ = [
    "MAX_RANGES",
    "ByteRange",
    "RangeNotSatisfiable",
    "is_whole",
    "parse_range",
    "reaches_end",
]
