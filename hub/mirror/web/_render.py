"""The pages' Jinja2 environment: templates from this package, HTML autoescaping always on."""

from __future__ import annotations

import time
import unicodedata
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


def ago(ts: float | int | None, now: float) -> str:
    """How long ago (or from ``now``, the page's time) a time is, roughly: ``3 days ago``,
    ``in 2 hours``."""
    if not ts:
        return ""
    delta = now - float(ts)
    future = delta < 0
    seconds = abs(delta)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            text = f"{n} {unit}{'s' if n != 1 else ''}"
            return f"in {text}" if future else f"{text} ago"
    return "just now"


#: Unicode categories shown as their code point in a file name: format characters (bidi
#: overrides and isolates, zero-width spaces and joiners, ...), controls, line and
#: paragraph separators, unassigned and private-use code points.
INVISIBLE = frozenset({"Cf", "Cc", "Zl", "Zp", "Cn", "Co", "Cs"})


def visible(name: str) -> str:
    """``name`` (a file or folder name) with every character that is invisible or
    reorders the text around it written as ``[U+202E]``: ``"\u202egnp.exe"`` cannot pass
    for ``exe.png``. The pages only; the API and the files keep the names as they are."""
    if name.isascii() and name.isprintable():
        return name
    return "".join(f"[U+{ord(c):04X}]" if unicodedata.category(c) in INVISIBLE else c for c in name)


def layer_of(name: str) -> str:
    """The layer a tensor belongs to, as the Hub groups them: its name up to the first
    number (``encoder.layer.3.attention.self.query.weight`` -> ``encoder.layer.3``), else
    its first part (``embeddings.word_embeddings.weight`` -> ``embeddings``)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0] if len(parts) > 1 else name


def tensor_groups(tensors: list[Any]) -> list[tuple[str, list[Any]]]:
    """``tensors`` (each with a ``name``) grouped by :func:`layer_of`, in first-seen order."""
    groups: dict[str, list[Any]] = {}
    for t in tensors:
        groups.setdefault(layer_of(t.name), []).append(t)
    return list(groups.items())


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
    env.filters["thousands"] = lambda n: f"{n:,}"  # 90,868,224
    env.filters["tensor_groups"] = tensor_groups
    env.filters["visible"] = visible  # {{ row.name|visible }}: no bidi or zero-width tricks
    return env


def render(name: str, context: dict[str, Any], status: int = 200) -> bytes:
    """Render one template to UTF-8 bytes."""
    text: str = environment().get_template(name).render(status=status, **context)
    return text.encode("utf-8")
