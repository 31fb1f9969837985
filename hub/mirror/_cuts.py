"""Remember which blobs had a body cut, so a client's resume cannot splice two fills.

A body the mirror cuts before its last byte (8.3: the bytes sent fail the
blob's check, or the fill failed) leaves the client with a partial file that
may hold wrong bytes. A stock client (``huggingface_hub``) resumes it with
``Range: bytes=N-`` and no ``If-Range``; a 206 from a later, good fill would
complete the wrong head with the right tail under the right ETag. So for
:data:`CUT_MEMORY` seconds after any cut of a blob, every ranged ``GET`` of
that blob is answered ``200`` with the whole body (RFC 9110 lets a server
ignore ``Range``), which a stock client takes as "start again": it truncates
its partial file. Cuts are kept in ``{repo}/.cmh/cuts/{etag}`` (the time of the
last cut, unix seconds), so every worker of the store sees them; ``cmh prune`` removes
a record once it is :data:`CUT_MEMORY` seconds old (plus its in-flight grace).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cmh.hub.cache import CUT_MEMORY, CUT_RECORDS, Clock, process_clock


class CutLedger:
    """Cuts per blob in one store folder, timed on ``clock`` (this process's by default)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock if clock is not None else process_clock()

    @staticmethod
    def _marker(repo_path: Path, etag: str) -> Path:
        return repo_path / CUT_RECORDS / etag

    def record(self, repo_path: Path, etag: str) -> None:
        """Note that a body of ``etag`` was cut now (best effort: a refused write is skipped)."""
        marker = self._marker(repo_path, etag)
        with contextlib.suppress(OSError):
            marker.parent.mkdir(parents=True, exist_ok=True)
            tmp = marker.with_name(f"{etag}.{os.getpid()}.tmp")
            tmp.write_text(f"{self.clock.time():.3f}\n")
            os.replace(tmp, marker)

    def recent(self, repo_path: Path, etag: str) -> bool:
        """True when a body of ``etag`` was cut less than :data:`CUT_MEMORY` seconds ago, or
        at a time in this clock's future (another writer's clock ahead: recent)."""
        try:
            at = float(self._marker(repo_path, etag).read_text())
        except (OSError, ValueError):
            return False
        return self.clock.time() - at < CUT_MEMORY
