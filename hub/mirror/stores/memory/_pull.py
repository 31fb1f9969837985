"""A memory store's pull-through side: its access and cut records; it fills nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from ..._errors import StoreError

if TYPE_CHECKING:
    import asyncio

    from cmh.hub.resolver import RemoteFile

    from ..._index import FileEntry
    from .._pull import FillReader
    from ._store import MemoryStore

NO_FILLS = "a memory store does not pull through: serve it without --upstream"


class MemoryRecords:
    """The records every worker of a memory store shares (one process): access and cuts.
    Fills are refused (:meth:`check`), so ``cmh serve --upstream`` never starts over one."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def check(self) -> None:
        raise StoreError(NO_FILLS)

    def record_access(self, repo_type: str, repo_id: str, private: bool, gated: bool) -> None:
        if private or gated:
            self.store.access[(repo_type, repo_id)] = (private, gated)
        else:
            self.store.access.pop((repo_type, repo_id), None)

    def restricted(self, repo_type: str, repo_id: str) -> bool:
        return (repo_type, repo_id) in self.store.access

    def gated(self, repo_type: str, repo_id: str) -> bool:
        private, gated = self.store.access.get((repo_type, repo_id), (False, False))
        return gated and not private

    def record_cut(self, repo_type: str, repo_id: str, etag: str) -> None:
        self.store.cuts[(repo_type, repo_id, etag)] = self.store.clock.time()

    def recently_cut(self, repo_type: str, repo_id: str, etag: str) -> bool:
        return self.store.cut_recently((repo_type, repo_id, etag))

    # -- fills: refused ------------------------------------------------------------------

    def _refuse(self) -> NoReturn:
        raise StoreError(NO_FILLS)

    def held(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        self._refuse()

    def listing(self, repo_type: str, repo_id: str, commit: str) -> dict[str, RemoteFile] | None:
        self._refuse()

    def expiry(self, repo_type: str, repo_id: str, revision: str, commit: str) -> float:
        self._refuse()

    def claim(self, repo_type: str, repo_id: str, revision: str) -> bool:
        self._refuse()

    def install(
        self, upstream: Any, repo_type: str, repo_id: str, commit: str, files: dict[str, RemoteFile]
    ) -> None:
        self._refuse()

    def validated(
        self, repo_type: str, repo_id: str, revision: str, commit: str, *, pinned: bool
    ) -> None:
        self._refuse()

    def fill(
        self,
        upstream: Any,
        repo_type: str,
        repo_id: str,
        commit: str,
        path: str,
        done_by: float | None = None,
    ) -> None:
        self._refuse()

    def reader(
        self, repo_type: str, repo_id: str, entry: FileEntry, fill: asyncio.Future[None]
    ) -> FillReader:
        self._refuse()
