"""The fingerprint endpoint's cache: one computation per commit, a bounded number kept.

Computing a semantic fingerprint reads every weight file of a snapshot; a
commit's fingerprint never changes, so the answer is kept, for the
:data:`MAX_ENTRIES` commits asked most recently (before, every commit ever
asked stayed in memory for the life of the worker).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._memo import Memo

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
