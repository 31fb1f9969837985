"""The pages' Jinja2 environment: templates from this package, HTML autoescaping always on."""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from cmh import format_size, plural

TEMPLATES = Path(__file__).parent / "templates"


def when(ts: float | int | None) -> str:
    """A Unix time as ``2026-12-01 09:30 UTC`` (``never`` for 0, ``-`` for ``None``)."""
    if ts is None:
        return "-"
    if ts == 0:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


def ago(ts: float | int | None, now: float | None = None) -> str:
    """How long ago (or from now) a time is, roughly: ``3 days ago``, ``in 2 hours``."""
    if not ts:
        return ""
    delta = (time.time() if now is None else now) - float(ts)
    future = delta < 0
    seconds = abs(delta)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            text = f"{n} {unit}{'s' if n != 1 else ''}"
            return f"in {text}" if future else f"{text} ago"
    return "just now"


@lru_cache(maxsize=1)
def environment() -> Any:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["ago"] = ago
    env.filters["size"] = format_size  # decimal, as huggingface.co and the CLI count
    env.filters["plural"] = plural  # {{ n|plural("file") }}: 1 file, 2 files
    return env


def render(name: str, context: dict[str, Any], status: int = 200) -> bytes:
    """Render one template to UTF-8 bytes."""
    text: str = environment().get_template(name).render(status=status, **context)
    return text.encode("utf-8")
