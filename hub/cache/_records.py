"""Small JSON records the caches and stores keep (upstream freshness, commit records)."""

from __future__ import annotations

import json
import math


def record_number(text: bytes, key: str) -> float | None:
    """The number under ``key`` in a small JSON record (a file's or an object's bytes),
    ``None`` when it is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    value = data.get(key) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
