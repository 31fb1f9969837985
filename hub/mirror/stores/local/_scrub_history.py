"""The store's scrub history: the last ``cmh mirror scrub`` report and the quarantine notes.

``cmh mirror scrub`` keeps its report in ``{store}/.quarantine/last-scrub.json``
(next to the quarantined blobs, a folder the mirror never serves from); the web
operator page reads it back with the note of every quarantined blob.
"""

from __future__ import annotations

import contextlib
import json
from functools import partial
from pathlib import Path
from typing import Any

from .._base import LAST_SCRUB, MAX_LAST_SCRUB_BYTES, MAX_NOTE_BYTES, ScrubView, gather_notes
from ._scrub import QUARANTINE


def record_scrub(store: Path, report: dict[str, Any], at: float) -> None:
    """Keep a scrub's JSON report, ended at ``at``, as the store's last scrub
    (``.quarantine/last-scrub.json``)."""
    from cmh import atomic_write

    folder = store / QUARANTINE
    folder.mkdir(parents=True, exist_ok=True)
    body = {**report, "finished_at": at}
    atomic_write(folder / LAST_SCRUB, json.dumps(body, indent=1).encode())


def _read(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def scrub_view(store: Path) -> ScrubView:
    """The recorded last scrub and the notes of the quarantined blobs (within the bounds
    of :func:`~cmh.hub.mirror.stores._base.gather_notes`)."""
    folder = store / QUARANTINE
    last: dict[str, Any] | None = None
    with contextlib.suppress(ValueError):
        data = _read(folder / LAST_SCRUB, MAX_LAST_SCRUB_BYTES)
        parsed = json.loads(data) if data is not None else None
        last = parsed if isinstance(parsed, dict) else None
    paths: list[Path] = []
    with contextlib.suppress(OSError):
        paths = sorted(p for p in folder.glob("*/*.json") if not p.is_symlink())
    notes = gather_notes((_size(p), partial(_read, p, MAX_NOTE_BYTES)) for p in paths)
    return ScrubView(last, notes)
