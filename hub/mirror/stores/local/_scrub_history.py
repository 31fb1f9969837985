"""The store's scrub history: the last ``cmh mirror scrub`` report and the quarantine notes.

``cmh mirror scrub`` keeps its report in ``{store}/.quarantine/last-scrub.json``
(next to the quarantined blobs, a folder the mirror never serves from); the web
operator page reads it back with the note of every quarantined blob.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from .._base import LAST_SCRUB, ScrubView
from ._scrub import QUARANTINE


def record_scrub(store: Path, report: dict[str, Any], at: float) -> None:
    """Keep a scrub's JSON report, ended at ``at``, as the store's last scrub
    (``.quarantine/last-scrub.json``)."""
    from cmh import atomic_write

    folder = store / QUARANTINE
    folder.mkdir(parents=True, exist_ok=True)
    body = {**report, "finished_at": at}
    atomic_write(folder / LAST_SCRUB, json.dumps(body, indent=1).encode())


def scrub_view(store: Path) -> ScrubView:
    """The recorded last scrub and the notes of every quarantined blob."""
    folder = store / QUARANTINE
    last: dict[str, Any] | None = None
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((folder / LAST_SCRUB).read_text())
        last = data if isinstance(data, dict) else None
    notes: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for note in sorted(folder.glob("*/*.json")):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(note.read_text())
                if isinstance(data, dict):
                    notes.append(data)
    notes.sort(key=lambda n: -float(n.get("quarantined_at") or 0))
    return ScrubView(last, notes)
