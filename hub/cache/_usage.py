"""Last-use records per revision, kept by cmh instead of trusting atime.

Each use of a snapshot (a resolve, a mirror read) touches
``{repo}/.cmh/used/{commit}``; its mtime is the last use. Touches closer than
:data:`DEBOUNCE_SECONDS` to the previous one are skipped, so a busy mirror
does not write once per request.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ._clock import SYSTEM_CLOCK
from ._layout import RepoLayout

#: Uses closer than this to the recorded one are not written again.
DEBOUNCE_SECONDS = 60.0


def usage_path(repo: RepoLayout, commit: str) -> Path:
    """Where the last use of ``commit`` is recorded."""
    repo.snapshot_dir(commit)  # validates the commit
    return repo.cmh_dir / "used" / commit


def record_use(repo: RepoLayout, commit: str, now: float | None = None) -> None:
    """Note that ``commit`` of ``repo`` was used at ``now`` (the caller's clock's time;
    default: the system clock's)."""
    path = usage_path(repo, commit)
    at = SYSTEM_CLOCK.time() if now is None else now
    try:
        previous = path.stat().st_mtime
    except FileNotFoundError:
        previous = None
    if previous is not None and abs(at - previous) < DEBOUNCE_SECONDS:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path, (at, at))
