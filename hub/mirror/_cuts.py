"""Remember which blobs had a body cut, so a client's resume cannot splice two fills.

A body the mirror cuts before its last byte (8.3: the bytes sent fail the
blob's check, or the fill failed) leaves the client with a partial file that
may hold wrong bytes. A stock client (``huggingface_hub``) resumes it with
``Range: bytes=N-`` and no ``If-Range``; a 206 from a later, good fill would
complete the wrong head with the right tail under the right ETag. So for
:data:`CUT_MEMORY` seconds after such a cut of a blob, a ranged ``GET`` of that
blob is not answered 206:

- ``200`` with the whole body (RFC 9110 lets a server ignore ``Range``), which
  huggingface_hub 1.5 and later, curl and the resolver take as "start again"
  (they truncate their partial file, or refuse to resume);
- ``416`` with a message saying to start again, for huggingface_hub before 1.5
  (:func:`appends_whole_body`): those append the body of a 200 to their partial
  file without looking at the status, which would corrupt it.

A client that leaves during a fill holds bytes of the fill's stream, unchecked
when it left: they become a cut only if the fill then fails its check (a fill
that verified sent only the blob's bytes, so the resume is answered 206).

Cuts are kept in ``{repo}/.cmh/cuts/{etag}`` (the time of the
last cut, unix seconds), so every worker of the store sees them; ``cmh prune`` removes
a record once it is :data:`CUT_MEMORY` seconds old (plus its in-flight grace).
"""

from __future__ import annotations

import contextlib
import os
import re
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


#: ``huggingface_hub/X.Y`` in a ``User-Agent`` (the stock client's, also through
#: transformers and other libraries, which add their own products after it).
_HF_HUB_AGENT = re.compile(r"(?:^|[\s;])huggingface_hub/(\d+)\.(\d+)")

#: The first huggingface_hub release that truncates its partial file when a resume is
#: answered 200 (read from its ``file_download.http_get``; 1.4 and 0.x append the body).
RESTARTS_ON_200 = (1, 5)


def appends_whole_body(user_agent: str | None) -> bool:
    """True for a client known to append a 200's body to its partial file on a resume
    (huggingface_hub before 1.5): it must not be answered 200 to a ``Range``."""
    match = _HF_HUB_AGENT.search(user_agent or "")
    if match is None:
        return False
    return (int(match.group(1)), int(match.group(2))) < RESTARTS_ON_200


#: The message of the 416 answered to such a client after a cut.
RESTART_MESSAGE = (
    "a download of this file was cut because the bytes sent failed their check: the part "
    "already downloaded may be wrong and cannot be resumed. Remove the partial download "
    "(huggingface_hub: force_download=True, or delete the *.incomplete file) and download "
    "the file again"
)
