"""HTTP byte ranges for the mirror: the hub's one parser (:mod:`cmh.hub._ranges`)."""

from __future__ import annotations

from .._ranges import MAX_RANGES, ByteRange, RangeNotSatisfiable, parse_range

__all__ = ["MAX_RANGES", "ByteRange", "RangeNotSatisfiable", "parse_range"]
