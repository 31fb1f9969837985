"""What pull-through (``cmh serve --upstream``) needs of a store: one protocol, two kinds.

:class:`~cmh.hub.mirror._upstream.Upstream` holds the policy (when to ask the
upstream, its typed errors, stale answers, the negative cache) and the filling
answers of :mod:`~cmh.hub.mirror._filling` hold the byte gate; where a revision's
state is kept and how a blob is filled and read while it fills is the store's
(:meth:`~cmh.hub.mirror.stores.MirrorStore.pull_through`): a folder fills
``blobs/{etag}.incomplete`` with the resolver; a bucket fills numbered part
objects under one lease for the whole fleet (``spec/hub-mirror.md`` 8.6).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cmh.hub.resolver import RemoteFile

    from .._index import FileEntry

#: ``(offset, count, sha256 of the bytes sent)`` of each range a filling answer sent.
SentRanges = list[tuple[int, int, "hashlib._Hash"]]


class FillFailed(OSError):
    """The fill ended without installing the blob, or the bytes sent are not the blob's."""


class FillWait:
    """What a :class:`FillReader` does when it finds no new bytes: wait a poll for the fill,
    fail when the fill failed, and fail with ``short`` when the fill had already ended at
    the previous look (a reader looks once more after the fill ends)."""

    def __init__(self, fill: asyncio.Future[None], short: str, poll: float) -> None:
        self.fill = fill
        self.short = short
        self.poll = poll
        self._ended = False

    async def wait(self) -> bool:
        """Wait for more; True the first time the fill is seen ended (look once more)."""
        if not self.fill.done():
            await asyncio.wait([self.fill], timeout=self.poll)
            return False
        if self.fill.exception() is not None:
            raise FillFailed(f"fill failed: {self.fill.exception()}")
        if self._ended:
            raise FillFailed(self.short)
        self._ended = True
        return True


class BodyHash(Protocol):
    """A hash of the whole blob over bytes a reader sent, computed once for all the
    worker's readers that sent the same bytes (:meth:`FillReader.voucher`)."""

    async def matched(self) -> bool:
        """Whether those bytes hash to the blob's ETag (waits until all are hashed)."""


class FillReader(Protocol):
    """Reads a blob while it is filled: what has arrived, then the installed blob."""

    def voucher(self) -> BodyHash | None:
        """The hash that checks the bytes of the last :meth:`read` in the place of the
        body's own, for a body read whole from byte 0 (``None``: the body hashes them)."""

    async def read(self, pos: int, count: int) -> bytes | memoryview:
        """At most ``count`` bytes at ``pos`` (a view where the reader shares a buffer),
        waiting until they have arrived (:class:`FillFailed` when the fill failed or
        ended short)."""

    def close(self) -> None:
        """Release what the reader holds."""

    def ranges_match(self, sent: SentRanges) -> bool:
        """True when each range sent is the same range of the installed, checked blob
        (blocking: run in a thread)."""


class PullThrough(Protocol):
    """A store's side of pull-through: revision state, access records and fills.

    Repos are named ``(repo_type, repo_id)``; ``upstream`` is the
    :class:`~cmh.hub.mirror._upstream.Upstream` asking (its client, its counters).
    """

    def check(self) -> None:
        """Refuse a storage that cannot hold fills (:class:`~cmh.hub.mirror.StoreError`:
        a bucket without conditional writes), before the server listens."""

    def held(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        """The commit the store holds for ``revision`` with its listing, or None."""

    def listing(self, repo_type: str, repo_id: str, commit: str) -> dict[str, RemoteFile] | None:
        """The kept upstream listing of ``commit``, or None."""

    def expiry(self, repo_type: str, repo_id: str, revision: str, commit: str) -> float:
        """When the held copy of ``revision`` (at ``commit``) goes stale: the smallest CMH
        ``expires_at`` of its stamped safetensors files, else the last validation plus
        ``--fresh-for`` (``-inf``: never validated)."""

    def claim(self, repo_type: str, repo_id: str, revision: str) -> bool:
        """True when this replica is to revalidate ``revision`` now; False when another
        replica of the fleet revalidated it (waited for here): the caller answers from it."""

    def install(
        self, upstream: Any, repo_type: str, repo_id: str, commit: str, files: dict[str, RemoteFile]
    ) -> None:
        """Keep ``commit``'s listing so that every listed file is answerable (blobs
        still absent are filled on demand; present ones confirmed)."""

    def validated(
        self, repo_type: str, repo_id: str, revision: str, commit: str, *, pinned: bool
    ) -> None:
        """Move ``revision`` to ``commit`` (unless pinned), record the validation for
        the fleet and when the commit's freshness ends (for ``cmh prune --expired``)."""

    def record_access(self, repo_type: str, repo_id: str, private: bool, gated: bool) -> None:
        """Keep what the upstream said of the repo's access (private or gated)."""

    def restricted(self, repo_type: str, repo_id: str) -> bool:
        """True when the upstream last said the repo is private or gated."""

    def gated(self, repo_type: str, repo_id: str) -> bool:
        """True when the upstream last said the repo is gated and not private: its
        existence is public at the Hub, so a reader it is closed to is told ``GatedRepo``."""

    def record_cut(self, repo_type: str, repo_id: str, etag: str) -> None:
        """Note that a filling body of ``etag`` was cut now, for every worker and replica
        (``spec/hub-mirror.md`` 8.3: ranges of it are answered whole for an hour)."""

    def recently_cut(self, repo_type: str, repo_id: str, etag: str) -> bool:
        """True when a body of ``etag`` was cut less than an hour ago."""

    def fill(
        self,
        upstream: Any,
        repo_type: str,
        repo_id: str,
        commit: str,
        path: str,
        done_by: float | None = None,
    ) -> None:
        """Bring the blob of ``path`` at ``commit`` into the store, or wait for the fill
        another process runs (blocking); raises the upstream's typed error. ``done_by``
        (``upstream.clock.monotonic()``): no upstream request or transfer try of the fill
        starts past it (one under way ends by its own limits)."""

    def reader(
        self, repo_type: str, repo_id: str, entry: FileEntry, fill: asyncio.Future[None]
    ) -> FillReader:
        """A reader of ``entry``'s blob while ``fill`` runs."""
