"""What one replica of ``cmh serve --store s3://...`` knows of the bucket.

A replica keeps no state that another replica needs: everything here is a cache
of the bucket, rebuilt from it at will.

- A ref (branch, tag, ``refs/pr/N``) is read from the bucket at most once every
  ``ref_ttl`` seconds (misses too), so a ref moved by ``cmh mirror add`` is seen by
  every replica at most ``ref_ttl`` seconds (plus one request) after the move.
- A tree object never changes once written (its name is its commit id), so it is
  kept (least recently used out past ``max_trees`` entries in all, as the folder's
  commit indexes: :data:`~cmh.hub.mirror._index.MAX_INDEXED`) with the commit index
  built from it. A tree that is gone (pruned) is noticed through its blobs: a blob read
  that fails drops what is known of that blob.
- A blob's size and storage ETag are kept for ``blob_ttl`` seconds (at most
  ``ref_ttl``); the server reads the bytes with ``If-Match`` on that ETag, so a
  replaced object is never mixed with the one that was checked, and a quarantined or
  replaced blob is seen by every replica within ``ref_ttl``.
- Which object version hashes to its name is read from the bucket's check record
  (``{repo}/.cmh/checked/{etag}``, written by ``cmh mirror add`` and by a replica that
  checked the object itself), so a blob is checked once for the whole fleet.
"""

from __future__ import annotations

import io
from errno import EIO
from typing import Any, BinaryIO

from ..._errors import storage_failed
from ..._history import MAX_HISTORY, CommitRecord, place_changes
from ..._index import (
    INDEX_BASE,
    MAX_INDEXED,
    CommitIndex,
    FileEntry,
    index_weight,
    revision_refs,
)
from ..._memo import Memo
from ._bucket import BucketStore, TreeObject
from ._objectstore import ObjectInfo, ObjectNotFound, ObjectStoreError

DEFAULT_REF_TTL = 2.0
DEFAULT_BLOB_TTL = 60.0


def _tree_weight(tree: TreeObject | None) -> int:
    """A tree object's weight, counted as :func:`index_weight` counts an index."""
    return INDEX_BASE + (0 if tree is None else len(tree.files))


MAX_REFS = 65536


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
        max_trees: int = MAX_INDEXED,
    ) -> None:
        self.store = store
        self.ref_ttl = ref_ttl
        now = store.clock.monotonic  # the ref TTL's clock (tests move it)
        self._refs: Memo[str, str | None] = Memo(MAX_REFS, ref_ttl, now)
        self._exists: Memo[str, bool] = Memo(MAX_REFS, ref_ttl, now)
        # bounded by their entries (files), not their number: each may list 100,000 files
        self._indexes: Memo[str, CommitIndex | None] = Memo(max_trees, weight=index_weight)
        self._trees: Memo[str, TreeObject | None] = Memo(max_trees, weight=_tree_weight)
        # A blob's info is trusted no longer than a ref: after scrub quarantines it or a
        # re-import replaces it, every replica sees the change within ``ref_ttl``.
        blob_ttl = min(blob_ttl, ref_ttl)
        self._blobs: Memo[str, ObjectInfo] = Memo(MAX_REFS, blob_ttl, now)
        self._checks: Memo[str, str | None] = Memo(MAX_REFS, blob_ttl, now)

    def repo_exists(self, folder: str) -> bool:
        """True when the repo has a ref or a tree object (cached for ``ref_ttl``)."""
        return self._exists.get_or_compute(folder, lambda: self.store.repo_exists(folder))

    def tree(self, folder: str, commit: str) -> TreeObject | None:
        """The tree object of a commit, or ``None`` when it has none."""
        key = f"{folder}/{commit}"
        found = self._trees.get_or_compute(key, lambda: self.store.read_tree(folder, commit))
        if found is None:
            self._trees.drop(key)  # a tree written later must be found at once
        return found

    def index(self, folder: str, commit: str) -> CommitIndex | None:
        """The index of a commit from its tree object, or ``None`` when it has none."""

        def load() -> CommitIndex | None:
            tree = self.tree(folder, commit)
            return None if tree is None else self.store.index(folder, tree)

        key = f"{folder}/{commit}"
        found = self._indexes.get_or_compute(key, load)
        if found is None:
            self._indexes.drop(key)
        return found

    def refs(self, folder: str) -> dict[str, str]:
        """Every ref of a repo whose commit has a tree object (read now, not cached)."""
        return {
            name: ref.commit
            for name, ref in self.store.refs(folder).items()
            if ref.commit and self.tree(folder, ref.commit) is not None
        }

    def history(
        self, folder: str, head: CommitIndex, limit: int = MAX_HISTORY
    ) -> list[CommitRecord]:
        """``head`` then its first parents, newest first, while tree objects exist."""
        chain: list[CommitRecord] = []
        seen: set[str] = set()
        commit: str | None = head.commit
        while commit is not None and commit not in seen and len(chain) < limit:
            tree = self.tree(folder, commit)
            if tree is None:
                break
            parent = tree.parents[0] if tree.parents else None
            chain.append(CommitRecord(commit, parent, tree.created_at, True))
            seen.add(commit)
            commit = parent
        return chain or [CommitRecord(head.commit, None, head.last_modified, False)]

    def last_commits(
        self, folder: str, head: CommitIndex, paths: list[str]
    ) -> dict[str, CommitRecord]:
        """The commit that last changed each of ``paths`` (as :func:`history.last_commits`)."""
        return place_changes(
            self.history(folder, head), head, paths, lambda c: self.index(folder, c)
        )

    def opener(self, entry: FileEntry) -> BinaryIO:
        """A buffered, seekable reader of an entry's blob object (ranged GETs as it
        reads); for the documents derived from files (card, safetensors header)."""
        return io.BufferedReader(_ObjectReader(self.store, entry), buffer_size=1 << 20)

    def resolve(self, folder: str, revision: str) -> CommitIndex | None:
        """The index of the commit a revision names: a commit id, else the first of
        :func:`revision_refs` naming a commit with a tree (each ref read at most
        ``ref_ttl`` seconds ago)."""
        from cmh.hub.cache import COMMIT_RE

        names = revision_refs(revision)
        if names and COMMIT_RE.match(revision):
            found = self.index(folder, revision)
            if found is not None:
                return found
        for name in names:

            def load(name: str = name) -> str | None:
                ref = self.store.read_ref(folder, name)
                return ref.commit if ref is not None and ref.commit else None

            commit = self._refs.get_or_compute(f"{folder}/{name}", load)
            index = self.index(folder, commit) if commit else None
            if index is not None:
                return index
        return None

    def forget_ref(self, folder: str, revision: str) -> None:
        """Drop what is known of a ref and of the repo's existence (it was just moved)."""
        self._refs.drop(f"{folder}/{revision}")
        self._exists.drop(folder)

    def blob_info(self, name: str) -> ObjectInfo:
        """Size and storage ETag of a blob object (:class:`ObjectNotFound` when absent)."""
        return self._blobs.get_or_compute(name, lambda: self.store.objects.head(name))

    def forget_blob(self, name: str) -> None:
        """Drop what is known of a blob (its read failed: replaced, quarantined, pruned)."""
        self._blobs.drop(name)
        self._checks.drop(name)

    def checked(self, info: ObjectInfo) -> bool:
        """True when the bucket records that this object version hashes to its name
        (written by ``cmh mirror add`` or by a replica that checked it)."""
        folder, _, etag = info.name.rpartition("/blobs/")
        if not folder:
            return False
        recorded = self._checks.get_or_compute(
            info.name, lambda: self.store.read_check(folder, etag)
        )
        return recorded is not None and recorded == info.etag

    def record_checked(self, info: ObjectInfo) -> None:
        """Share a good check of this object version with every replica (best effort)."""
        folder, _, etag = info.name.rpartition("/blobs/")
        if folder:
            self.store.record_check(folder, etag, info.etag)
            self._checks.drop(info.name)


class _ObjectReader(io.RawIOBase):
    """A read-only, seekable raw stream over one blob object of a known size."""

    def __init__(self, store: BucketStore, entry: FileEntry) -> None:
        self._store, self._name, self._size = store, entry.source.as_posix(), entry.size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._get(min(self._size, self._pos + len(view)))
        view[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        """The rest of the object in one ranged GET (``RawIOBase.readall`` would ask for
        it 8 KiB at a time, one request each)."""
        return self._get(self._size)

    def _get(self, end: int) -> bytes:
        if end <= self._pos:
            return b""
        try:
            data = self._store.objects.get_range(self._name, self._pos, end)
        except ObjectStoreError as exc:
            raise OSError(EIO, storage_failed(exc, "blob unavailable")) from None
        self._pos += len(data)
        return data


__all__ = ["BucketReader", "ObjectNotFound"]
