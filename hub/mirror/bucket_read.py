"""What one replica of ``cmh serve --store s3://...`` knows of the bucket.

A replica keeps no state that another replica needs: everything here is a cache
of the bucket, rebuilt from it at will.

- A ref (branch, tag, ``refs/pr/N``) is read from the bucket at most once every
  ``ref_ttl`` seconds (misses too), so a ref moved by ``cmh mirror add`` is seen by
  every replica at most ``ref_ttl`` seconds (plus one request) after the move.
- A tree object never changes once written (its name is its commit id), so it is
  kept (least recently used out past ``max_trees``) with the commit index built
  from it. A tree that is gone (pruned) is noticed through its blobs: a blob read
  that fails drops what is known of that blob.
- A blob's size and storage ETag are kept for ``blob_ttl`` seconds; the server reads
  the bytes with ``If-Match`` on that ETag, so a replaced object is never mixed with
  the one that was checked.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from .bucket import BucketStore
from .index import CommitIndex
from .objectstore import ObjectInfo, ObjectNotFound

DEFAULT_REF_TTL = 2.0
DEFAULT_BLOB_TTL = 60.0
MAX_TREES = 4096
MAX_REFS = 65536

T = TypeVar("T")


class _TimedCache(Generic[T]):
    """A bounded map whose entries expire ``ttl`` seconds (monotonic) after they were put."""

    def __init__(self, ttl: float | None, size: int) -> None:
        self.ttl, self.size = ttl, size
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[float, T]] = OrderedDict()

    def get(self, key: str, load: Callable[[], T]) -> T:
        now = time.monotonic()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and (self.ttl is None or now - hit[0] < self.ttl):
                self._items.move_to_end(key)
                return hit[1]
        value = load()
        with self._lock:
            self._items[key] = (now, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def drop(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)


class BucketReader:
    """Refs, tree objects and blob infos of one bucket store, cached as described above.

    Safe to call from several threads (the server runs reads in its thread pool).
    """

    def __init__(
        self,
        store: BucketStore,
        *,
        ref_ttl: float = DEFAULT_REF_TTL,
        blob_ttl: float = DEFAULT_BLOB_TTL,
        max_trees: int = MAX_TREES,
    ) -> None:
        self.store = store
        self.ref_ttl = ref_ttl
        self._refs: _TimedCache[str | None] = _TimedCache(ref_ttl, MAX_REFS)
        self._exists: _TimedCache[bool] = _TimedCache(ref_ttl, MAX_REFS)
        self._indexes: _TimedCache[CommitIndex | None] = _TimedCache(None, max_trees)
        self._blobs: _TimedCache[ObjectInfo] = _TimedCache(blob_ttl, MAX_REFS)

    def repo_exists(self, folder: str) -> bool:
        """True when the repo has a ref or a tree object (cached for ``ref_ttl``)."""
        return self._exists.get(folder, lambda: self.store.repo_exists(folder))

    def index(self, folder: str, commit: str) -> CommitIndex | None:
        """The index of a commit from its tree object, or ``None`` when it has none."""

        def load() -> CommitIndex | None:
            tree = self.store.read_tree(folder, commit)
            return None if tree is None else self.store.index(folder, tree)

        key = f"{folder}/{commit}"
        found = self._indexes.get(key, load)
        if found is None:
            self._indexes.drop(key)  # a tree written later must be found at once
        return found

    def resolve(self, folder: str, revision: str) -> CommitIndex | None:
        """The index of the commit a revision names (a commit id, or a ref read at most
        ``ref_ttl`` seconds ago)."""
        from ..cache.layout import COMMIT_RE

        if COMMIT_RE.match(revision):
            found = self.index(folder, revision)
            if found is not None:
                return found

        def load() -> str | None:
            ref = self.store.read_ref(folder, revision)
            return ref.commit if ref is not None and ref.commit else None

        commit = self._refs.get(f"{folder}/{revision}", load)
        return self.index(folder, commit) if commit else None

    def blob_info(self, name: str) -> ObjectInfo:
        """Size and storage ETag of a blob object (:class:`ObjectNotFound` when absent)."""
        return self._blobs.get(name, lambda: self.store.objects.head(name))

    def forget_blob(self, name: str) -> None:
        """Drop what is known of a blob (its read failed: replaced, quarantined, pruned)."""
        self._blobs.drop(name)


__all__ = ["BucketReader", "ObjectNotFound"]
