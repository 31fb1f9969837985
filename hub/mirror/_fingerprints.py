"""The fingerprint endpoint's cache: one computation per commit, a bounded number kept.

Computing a semantic fingerprint reads every weight file of a snapshot; a
commit's fingerprint never changes, so the answer is kept, for the
:data:`MAX_ENTRIES` commits asked most recently (before, every commit ever
asked stayed in memory for the life of the worker).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import HubError
from ._memo import Memo

if TYPE_CHECKING:
    from ._index import CommitIndex
    from ._routes import Route
    from ._state import MirrorState

MAX_ENTRIES = 256

Key = tuple[str, str]  # ("{repo_type}:{repo_id}", commit)


class FingerprintCache:
    """Answers by commit, least recently used dropped first; computed once under a lock."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: Memo[Key, dict[str, Any]] = Memo(max_entries)

    def get(self, key: Key, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The cached answer for ``key``, else ``compute()`` (kept only if it returns)."""
        return self._entries.get_or_compute(key, compute, exclusive=True)

    def __len__(self) -> int:
        return len(self._entries)


def fingerprint_of(state: MirrorState, route: Route, index: CommitIndex) -> dict[str, Any]:
    """``cmh.semantic`` fingerprint of a commit, computed once per commit.

    It reads only the index's checked sources (blobs inside the store), through
    ``fingerprint_files``, so a hostile link in a snapshot is never followed.
    """
    from cmh import InvalidFileError
    from cmh.semantic import SemanticError, fingerprint_files

    def compute() -> dict[str, Any]:
        paths = sorted(index.files)  # fingerprint_files picks what it reads (spec/semantic.md)
        try:
            source = f"{route.repo_id}@{index.commit}"
            with state.backend.local_files(index, paths, stamped_headers=True) as files:
                result = fingerprint_files(files, source=source)
            if result.hashed_files:  # a stamp not taken: its bytes are read whole
                with state.backend.local_files(index, paths) as files:
                    result = fingerprint_files(files, source=source)
            result_doc = result.to_dict()
        except InvalidFileError as exc:
            raise HubError(422, "InvalidFile", f"invalid safetensors file: {exc}") from None
        except SemanticError as exc:
            if isinstance(exc.__cause__, InvalidFileError):
                raise HubError(422, "InvalidFile", f"invalid safetensors file: {exc}") from None
            raise HubError(422, "NotAModel", f"cannot fingerprint this snapshot: {exc}") from None
        except (ValueError, OverflowError, struct.error) as exc:  # a header no layer typed
            raise HubError(422, "InvalidFile", f"invalid safetensors file: {exc}") from None
        except OSError as exc:
            raise HubError(503, "BlobUnavailable", f"blob unavailable: {exc.strerror}") from None
        return {"repo": route.repo_id, "commit": index.commit, "fingerprint": result_doc}

    return state.fingerprints.get((f"{route.repo_type}:{route.repo_id}", index.commit), compute)
