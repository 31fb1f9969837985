"""Pull-through into a local folder: the resolver fills ``blobs/{etag}.incomplete``.

The revision state is the stock cache's own (``refs/``, ``trees/{commit}.json``,
the resolver's validation records) plus ``.cmh/upstream/`` records (access, and
when a commit's freshness ends). A fill is :func:`cmh.hub.resolver.resolve`
pinned to the commit on one connection (SHA-256 or git blob id checked,
resumable, atomic install, the blob lock shared with import, prune and the
stock client); its partial file is read as it grows (:class:`FileTail`). A fill
run by another worker or process is joined through the blob lock and the same
partial file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache
from cmh.hub.cache import COMMIT_RE, Clock, RepoLayout, process_clock, repo_lock

from cmh import atomic_write

from .._body_hash import SharedHash, new_serial, shared_hash
from .._pull import FillWait, SentRanges

if TYPE_CHECKING:
    from cmh.hub.resolver import RemoteFile

    from ..._index import FileEntry

CHUNK = 1 << 20
POLL = 0.02  # seconds between looks at a partial file that has not grown
#: Reads of partial files (and blobs being sent from a fill) one worker keeps for its
#: readers (at most :data:`CHUNK` bytes each; least recent go first).
KEPT_READS = 32
#: The kept reads: (fill, st_dev, st_ino, offset) -> (bytes, serial). A fill's go once
#: it has ended and its last reader closed (:data:`_READERS`).
_READS: LRUCache[tuple[Any, int, int, int], tuple[bytes, int]] = LRUCache(KEPT_READS)
#: How many readers of each fill are open in this worker (a fill is a key while one is).
_READERS: dict[Any, int] = {}


def _reader_closed(fill: asyncio.Future[None]) -> None:
    """One reader of ``fill`` closed: drop the fill's kept reads if it was the last one of
    a fill that ended (nobody reads them again)."""
    left = _READERS.pop(fill, 1) - 1
    if left:
        _READERS[fill] = left
    elif fill.done():
        for key in [k for k in list(_READS) if k[0] is fill]:
            _READS.pop(key, None)


def fnmatch_literal(path: str) -> str:
    """An ``fnmatch`` pattern that matches exactly ``path``."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in path)


def access_record_path(repo: RepoLayout) -> Path:
    """``.cmh/upstream/access.json``: present while the upstream marks the repo private/gated."""
    return repo.cmh_dir / "upstream" / "access.json"


def upstream_record_path(repo: RepoLayout, commit: str) -> Path:
    """``.cmh/upstream/{commit}.json``: when a pull-through commit's freshness ends."""
    repo.snapshot_dir(commit)  # validates the commit
    return repo.cmh_dir / "upstream" / f"{commit}.json"


def write_upstream_record(repo: RepoLayout, commit: str, fresh_until: float, at: float) -> None:
    """Write ``commit``'s freshness record at ``at`` (replacing it; raises :class:`OSError`)."""
    path = upstream_record_path(repo, commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"fresh_until": fresh_until, "at": at}).encode())


class LocalPullThrough:
    """The pull-through state and fills of one store folder."""

    def __init__(self, root: Path, fresh_for: float, clock: Clock | None = None) -> None:
        from ..._cuts import CutLedger

        self.root = root
        self.fresh_for = fresh_for
        self.clock = clock if clock is not None else process_clock()  # the store's
        self.cuts = CutLedger(self.clock)  # {repo}/.cmh/cuts/{etag}, as bodies cut outside fills

    def _repo(self, repo_type: str, repo_id: str) -> RepoLayout:
        return RepoLayout(self.root, repo_id, repo_type)

    def check(self) -> None:
        """A folder's fills take the blob lock: nothing to probe."""

    # -- revisions -----------------------------------------------------------------------

    def held(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        from cmh.hub.resolver import read_tree

        repo = self._repo(repo_type, repo_id)
        commit = revision if COMMIT_RE.match(revision) else repo.read_ref(revision)
        if commit is None or read_tree(repo, commit) is None:
            return None
        return commit if (repo.snapshots / commit).is_dir() else None

    def listing(self, repo_type: str, repo_id: str, commit: str) -> dict[str, RemoteFile] | None:
        from cmh.hub.resolver import read_tree, remote_files_from_tree

        cached = read_tree(self._repo(repo_type, repo_id), commit)
        return None if cached is None else remote_files_from_tree(cached)

    def expiry(self, repo_type: str, repo_id: str, revision: str, commit: str) -> float:
        from cmh.hub.resolver import read_tree, read_validation, snapshot_expiry

        repo = self._repo(repo_type, repo_id)
        tree = read_tree(repo, commit) or {}
        validation = read_validation(repo, revision)
        at = validation.at if validation is not None and validation.commit == commit else None
        return snapshot_expiry(
            repo, commit, sorted(tree), validated_at=at, default_lifetime=self.fresh_for
        )

    def claim(self, repo_type: str, repo_id: str, revision: str) -> bool:
        return True  # one machine: the worker's own lock per revision is enough

    def install(
        self, upstream: Any, repo_type: str, repo_id: str, commit: str, files: dict[str, RemoteFile]
    ) -> None:
        """Keep the listing; link absent blobs (filled on demand), confirm present ones
        with the resolver (one ``HEAD`` each, as it does) before they are linked."""
        from cmh.hub.resolver import linked_etag, write_tree

        repo = self._repo(repo_type, repo_id)
        present: list[str] = []
        with repo_lock(repo, shared=True):
            write_tree(repo, commit, files)
            repo.snapshot_dir(commit).mkdir(parents=True, exist_ok=True)
            for path, remote in files.items():
                if linked_etag(repo, commit, path) == remote.etag:
                    continue
                if repo.blob_path(remote.etag).exists():
                    present.append(path)
                else:
                    repo.link_snapshot_file(commit, path, remote.etag)
        if present:
            self._resolve(upstream, repo, commit, present)

    def validated(
        self, repo_type: str, repo_id: str, revision: str, commit: str, *, pinned: bool
    ) -> None:
        from cmh.hub.resolver import write_validation

        repo = self._repo(repo_type, repo_id)
        if not pinned:
            if repo.read_ref(revision) != commit:
                repo.write_ref(revision, commit)
            write_validation(repo, revision, commit, at=self.clock.time())
            until = self.expiry(repo_type, repo_id, revision, commit)
        else:
            until = self.clock.time() + self.fresh_for
        if until == float("inf"):
            return
        with contextlib.suppress(OSError):
            write_upstream_record(repo, commit, until, self.clock.time())

    def record_access(self, repo_type: str, repo_id: str, private: bool, gated: bool) -> None:
        path = access_record_path(self._repo(repo_type, repo_id))
        if not (private or gated):
            with contextlib.suppress(OSError):
                path.unlink()
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"private": private, "gated": gated, "at": self.clock.time()}
        atomic_write(path, json.dumps(doc).encode())

    def restricted(self, repo_type: str, repo_id: str) -> bool:
        try:
            repo = self._repo(repo_type, repo_id)
        except ValueError:
            return False
        return access_record_path(repo).exists()

    def gated(self, repo_type: str, repo_id: str) -> bool:
        try:
            path = access_record_path(self._repo(repo_type, repo_id))
            record = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(record, dict) and bool(record.get("gated")) and not record.get("private")

    def record_cut(self, repo_type: str, repo_id: str, etag: str) -> None:
        self.cuts.record(self._repo(repo_type, repo_id).path, etag)

    def recently_cut(self, repo_type: str, repo_id: str, etag: str) -> bool:
        return self.cuts.recent(self._repo(repo_type, repo_id).path, etag)

    # -- fills ---------------------------------------------------------------------------

    def fill(
        self,
        upstream: Any,
        repo_type: str,
        repo_id: str,
        commit: str,
        path: str,
        done_by: float | None = None,
    ) -> None:
        from cmh.hub.resolver import read_tree

        from ..._manifests import keep_for

        repo = self._repo(repo_type, repo_id)
        self._resolve(upstream, repo, commit, [path], done_by)
        entry = (read_tree(repo, commit) or {}).get(path)
        if entry is not None:
            keep_for(repo, entry.etag, path)  # the tensor manifest, for resolvers downstream

    def _resolve(
        self,
        upstream: Any,
        repo: RepoLayout,
        commit: str,
        paths: list[str],
        done_by: float | None = None,
    ) -> None:
        from cmh.hub.resolver import AccessError, NotFoundError, Policy, ResolveError, resolve

        from ..._upstream import failed, typed

        try:
            res = resolve(
                repo.repo_id,
                commit,
                repo_type=repo.repo_type,
                cache_dir=self.root,
                endpoint=upstream.url,
                token=upstream.config.token or False,
                allow_patterns=[fnmatch_literal(p) for p in paths],
                # One connection: the fill then writes blobs/{etag}.incomplete in order, which
                # the clients of a filling blob read as it grows (FileTail).
                policy=Policy(
                    stale_if_error=False, connections=1, clock=upstream.clock, done_by=done_by
                ),
            )
        except (NotFoundError, AccessError) as exc:
            raise typed(exc) from None
        except ResolveError as exc:
            raise failed(exc, "fill failed") from None
        upstream.count(res.requests, res.bytes_transferred)

    def reader(
        self, repo_type: str, repo_id: str, entry: FileEntry, fill: asyncio.Future[None]
    ) -> FileTail:
        from cmh.hub.cache import partial_path

        repo = self._repo(repo_type, repo_id)
        return FileTail(entry.source, partial_path(repo, entry.etag), entry, fill)


class FileTail:
    """Reads a blob being filled: the installed blob if it is there, else its partial file.

    It reads what one download attempt wrote, and follows the next attempt when the
    resolver starts again (the partial replaced). A partial that holds every byte is not
    read before its check's verdict: the resolver discards one whose bytes fail their
    check and downloads once more, so a reader that waits sends the retry's bytes (the
    blob's, whole) instead of the discarded download's (a body cut before its end).

    Reads are ``os.pread`` calls on the event loop (the bytes were just written, so they
    come from the page cache, and a thread hop per read would cost more than the read),
    shared by every reader of the worker (:data:`_READS`): each reads at most up to the
    next :data:`CHUNK` boundary, so readers that read at different moments meet again at
    the next one. A whole body offers each read to the worker's shared hash of the fill
    (:mod:`~cmh.hub.mirror.stores._body_hash`), which vouches for the reads it took.
    """

    def __init__(
        self, blob: Path, partial: Path, entry: FileEntry, fill: asyncio.Future[None]
    ) -> None:
        self.blob = blob
        self.partial = partial
        self.etag, self.size = entry.etag, entry.size
        self.fill = fill
        self.fd: int | None = None
        self._installed = False  # ``fd`` is the checked blob: read it to the end
        self._read: tuple[int, bytes] | None = None  # the read being sent: (offset, bytes)
        self._hash: SharedHash | None = None  # joined by a read from byte 0 first
        self._vouched = False  # the bytes of ``_read`` are hashed by ``_hash``
        self._open_reader = True
        _READERS[fill] = _READERS.get(fill, 0) + 1

    def close(self) -> None:
        self._close_file()
        self._read = None
        self._hash = None
        if self._open_reader:
            self._open_reader = False
            _reader_closed(self.fill)

    def _close_file(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._installed = False

    def _open(self) -> None:
        for path in (self.blob, self.partial):
            with contextlib.suppress(OSError):
                self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                return

    def _state(self) -> tuple[str, os.stat_result]:
        """What ``fd`` reads: ``blob`` (installed), ``arriving`` (a partial still being
        written), ``complete`` (a partial whose check is under way) or ``replaced`` (no
        longer the partial nor the blob: a download discarded); and its ``fstat``."""
        assert self.fd is not None
        mine = os.fstat(self.fd)
        if self._installed:
            return "blob", mine
        for path, state in ((self.blob, "blob"), (self.partial, "arriving")):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                    if state == "blob":
                        self._installed = True
                    elif mine.st_size >= self.size:
                        state = "complete"
                    return state, mine
        return "replaced", mine

    def voucher(self) -> SharedHash | None:
        """The worker's hash of the whole blob, when it hashes the bytes last read (a body
        read from byte 0 on, whose read is the bytes it took), else ``None``."""
        return self._hash if self._vouched else None

    def _shared_read(self, pos: int, file: os.stat_result) -> tuple[bytes, int] | None:
        """The bytes at ``pos`` up to the next :data:`CHUNK` boundary (as many as have
        arrived) and their serial: one ``pread`` for every reader of this worker."""
        assert self.fd is not None
        key = (self.fill, file.st_dev, file.st_ino, pos)
        kept = _READS.get(key)
        if kept is not None:
            return kept
        want = min(CHUNK - pos % CHUNK, max(self.size - pos, 1))
        data = os.pread(self.fd, want, pos)
        if not data:
            return None
        kept = _READS[key] = (data, new_serial())
        return kept

    async def _use(self, pos: int, data: bytes, serial: int) -> None:
        """Send the read ``data`` at ``pos`` from now on (offered to the shared hash a read
        from byte 0 joined, once it has room)."""
        self._read = (pos, data)
        self._vouched = False
        if self._hash is not None:
            self._vouched = await self._hash.offer_in_turn(pos, serial, data)

    async def read(self, pos: int, count: int) -> bytes | memoryview:
        """A view of a shared read (no copy: every reader of this worker shares its bytes)."""
        if pos == 0 and self._read is None and self.size:
            self._hash = shared_hash(("folder", self.partial, self.fill), self.etag, self.size)
        waiting = FillWait(self.fill, "the filled blob is shorter than listed", POLL)
        while True:
            if self._read is not None and 0 <= pos - self._read[0] < len(self._read[1]):
                off = pos - self._read[0]
                return memoryview(self._read[1])[off : off + count]
            if self.fd is None:
                self._open()
            if self.fd is not None:
                state, file = self._state()
                if state == "replaced":
                    self._close_file()  # a download discarded: follow the next one
                    continue
                if state != "complete":  # a complete partial: wait for its verdict
                    got = self._shared_read(pos, file)
                    if got is not None:
                        await self._use(pos, *got)
                        continue
            if await waiting.wait():
                self._close_file()  # read the installed blob from now on

    def ranges_match(self, sent: SentRanges) -> bool:
        try:
            fd = os.open(self.blob, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            for offset, count, digest in sent:
                h = hashlib.sha256()
                pos = offset
                while pos < offset + count:
                    data = os.pread(fd, min(CHUNK * 8, offset + count - pos), pos)
                    if not data:
                        return False
                    h.update(data)
                    pos += len(data)
                if h.digest() != digest.digest():
                    return False
            return True
        finally:
            os.close(fd)
