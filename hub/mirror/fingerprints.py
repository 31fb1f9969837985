"""The fingerprint endpoint's cache: one computation per commit, a bounded number kept.

Computing a semantic fingerprint reads every weight file of a snapshot; a
commit's fingerprint never changes, so the answer is kept, for the
:data:`MAX_ENTRIES` commits asked most recently (before, every commit ever
asked stayed in memory for the life of the worker).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

MAX_ENTRIES = 256

Key = tuple[str, str]  # ("{repo_type}:{repo_id}", commit)


class FingerprintCache:
    """Answers by commit, least recently used dropped first; computed once under a lock."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[Key, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Key, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The cached answer for ``key``, else ``compute()`` (kept only if it returns)."""
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                return cached
            body = compute()
            self._entries[key] = body
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return body

    def __len__(self) -> int:
        return len(self._entries)
