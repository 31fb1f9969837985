"""Small JSON records the caches and stores keep (upstream freshness, commit records), and
the one parse of JSON another party wrote."""

from __future__ import annotations

import json
import math
from typing import Any


def json_value(data: bytes | bytearray | str) -> Any:
    """The JSON value of a document another party wrote (a Hub's answer, a client's body,
    an object in a shared bucket, a file of a repo): :class:`ValueError` for anything
    that is not one, including nesting too deep for the parser (its ``RecursionError``:
    400 KB of ``[`` is valid JSON to no one here, and never an untyped failure)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested deeper than the parser goes") from None


def record_number(text: bytes, key: str) -> float | None:
    """The number under ``key`` in a small JSON record (a file's or an object's bytes),
    ``None`` when it is not one."""
    try:
        data = json_value(text)
    except ValueError:
        return None
    value = data.get(key) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
