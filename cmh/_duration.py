"""Durations and sizes as users write them: ``90s``, ``12h``, ``30d``, ``1d12h``, ``never``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from ._errors import DurationError, SizeError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+)([smhdw])")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

#: A TTL: seconds (int), a timedelta, a duration string, or ``"never"``/``None`` for no expiry.
TTL = int | float | timedelta | str | None


def parse_duration(text: str) -> int:
    """Seconds in ``text``: ``90s``, ``12h``, ``30d``, ``1d12h``; a bare number is seconds."""
    value = text.strip().lower()
    if value.isascii() and value.isdigit():  # "²".isdigit() holds; int("²") raises
        return int(value)
    if not value or _PART.sub("", value):
        raise DurationError(
            f"invalid duration {text!r}: use a number with a unit s, m, h, d or w, "
            "e.g. 90s, 12h, 30d, 1d12h"
        )
    return sum(int(n) * _UNITS[u] for n, u in _PART.findall(value))


def ttl_seconds(ttl: TTL) -> int | None:
    """Seconds of a TTL, or ``None`` for never."""
    if ttl is None:
        return None
    if isinstance(ttl, str):
        if ttl.strip().lower() == "never":
            return None
        return parse_duration(ttl)
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if seconds < 0:
        raise DurationError(f"a TTL cannot be negative ({seconds} s)")
    return int(seconds)


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``500M``, ``20GB``, ``1.5GiB``; decimal units unless ``iB``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise SizeError(f"invalid size {text!r}: use e.g. 500M, 20GB or 1.5GiB")
    size = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if not math.isfinite(size):  # 400 digits: no float holds it
        raise SizeError(f"invalid size {text!r}: too large")
    return int(size)


def format_duration(seconds: float) -> str:
    """A short human form: ``3d 4h``, ``12m 5s``."""
    seconds = int(abs(seconds))
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def format_size(n: int) -> str:
    """``1536`` -> ``1.5 kB``: decimal units, as huggingface.co, disk vendors and the
    CLI's bars (``MB/s``) count; exact below 1 kB (``190 B``). The one size formatter
    of the CLI and the mirror's pages."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000
        if value < 999.95 or unit == "PB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 file``, ``2 files``, ``0 files`` (``nouns`` when not ``noun + "s"``)."""
    return f"{count:,} {noun if count == 1 else (nouns or noun + 's')}"
