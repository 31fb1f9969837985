"""Blobs in a stock cache: hashing, checks, atomic install.

A blob is named by its ETag: the SHA-256 of the content for LFS files, the git
blob SHA-1 otherwise. Nothing enters ``blobs/`` before its bytes hash to its
name (and, for a stamped safetensors file, before every tensor matches the
CMH manifest). A whole download in progress lives in ``blobs/{etag}.incomplete``
(always a prefix of the blob, the name the stock client used to resume; see
:mod:`cmh.hub.resolver._fetch`). A blob
once checked gets a marker in ``.cmh/verified/{etag}`` holding its size,
mtime, ctime and inode: while those are unchanged it is not hashed again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import struct
import threading
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from cmh import (
    PREFIX_SIZE,
    CMHError,
    Header,
    InvalidFileError,
    claimed_digests,
    fsync_dir,
    parse_header,
    read_carrier,
    record_check,
)

from ._errors import DiskFullError, IntegrityError, InvalidRemoteFileError
from ._layout import VERIFIED_MARKERS, RepoLayout

READ_CHUNK = 8 << 20
#: Files from this size are hashed for their ETag in a worker thread.
THREADED_DIGEST_BYTES = 16 << 20
Progress = Callable[[int], None]

#: What reading a hostile safetensors header may raise: the format library's typed error,
#: and what a header it does not reject makes Python raise (a lone surrogate cannot be
#: encoded, a dimension of 2**64 or more cannot be packed).
INVALID_HEADER = (InvalidFileError, ValueError, struct.error, OverflowError, RecursionError)
#: The same, plus every other error of the format library (a header that cannot be used).
UNREADABLE_HEADER = (CMHError, ValueError, struct.error, OverflowError, RecursionError)

#: errno values that mean "no room for the bytes": disk full, quota, file size limit.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` that says the bytes do not fit (ENOSPC, EDQUOT, EFBIG)."""
    return isinstance(exc, OSError) and exc.errno in _NO_ROOM


def disk_full_error(exc: OSError, what: str) -> DiskFullError:
    """The typed error for ``exc`` while writing ``what`` (the partial is already removed)."""
    reason = exc.strerror or str(exc)
    return DiskFullError(
        f"{what}: {reason} (no space left for the download in the cache, or a file size "
        "limit); the partial download was removed and the previous snapshot is kept"
    )


def partial_path(repo: RepoLayout, etag: str) -> Path:
    """Where a whole download of ``etag`` accumulates (a prefix of the blob)."""
    return repo.blob_path(etag).with_name(f"{etag}.incomplete")


def _marker_path(repo: RepoLayout, etag: str) -> Path:
    return repo.path / VERIFIED_MARKERS / etag


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}"


def git_blob_hasher(size: int) -> hashlib._Hash:
    """A SHA-1 primed with the git blob header of a ``size``-byte blob; feed it the content."""
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(b"blob %d\0" % size)
    return digest


def new_digest(etag: str, size: int) -> hashlib._Hash:
    """The hash whose hex digest names a blob: SHA-256 (LFS), or git's blob SHA-1."""
    return hashlib.sha256() if len(etag) == 64 else git_blob_hasher(size)


class Sink(Protocol):
    """Anything fed bytes in order: a hash, a :class:`ContentCheck`."""

    def update(self, data: bytes, /) -> None: ...


def hash_file(
    path: Path,
    *sinks: Sink,
    limit: int | None = None,
    copy_to: BinaryIO | None = None,
    progress: Progress | None = None,
) -> int:
    """Feed the first ``limit`` bytes (default: all) of ``path`` to every sink, in one read.

    ``copy_to`` also receives the bytes (an import that hashes while it copies);
    ``progress`` is told the size of every piece read. Returns the number of bytes read.
    """
    fed = 0
    with open(path, "rb") as f:
        while limit is None or fed < limit:
            data = f.read(READ_CHUNK if limit is None else min(READ_CHUNK, limit - fed))
            if not data:
                break
            for sink in sinks:
                sink.update(data)
            if copy_to is not None:
                copy_to.write(data)
            fed += len(data)
            if progress is not None:
                progress(len(data))
    return fed


def hash_blob(
    path: Path, size: int, copy_to: BinaryIO | None = None, progress: Progress | None = None
) -> tuple[int, str, str]:
    """``(bytes read, sha256, git blob sha1)`` of a file of ``size`` bytes, in one read."""
    sha, git = hashlib.sha256(), git_blob_hasher(size)
    read = hash_file(path, sha, git, copy_to=copy_to, progress=progress)
    return read, sha.hexdigest(), git.hexdigest()


def blob_matches(path: Path, etag: str, size: int) -> bool:
    """True when the regular file at ``path`` has ``size`` bytes whose hash is ``etag``."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not os.path.isfile(path) or os.path.islink(path) or st.st_size != size:
        return False
    digest = new_digest(etag, size)
    hash_file(path, digest)
    return digest.hexdigest() == etag


@dataclass(eq=False)
class ContentCheck:
    """Checks a file's bytes fed in order, without a second read.

    Always: the size and the digest named by the ETag. For a stamped
    safetensors file: the header parses and every tensor not listed in
    ``trusted`` (indexes in data order) hashes to its manifest digest.
    """

    etag: str
    size: int
    _: KW_ONLY
    safetensors: bool
    strict: bool = False
    #: A file named ``*.safetensors`` (``name``) must have a valid header: otherwise
    #: :meth:`finish` raises :class:`InvalidRemoteFileError` once the bytes are known
    #: to be the blob (so bytes damaged in transit stay an :class:`IntegrityError`). A
    #: file only sniffed as safetensors is just not checked tensor by tensor then.
    name: str | None = None
    trusted: frozenset[int] = field(default=frozenset(), init=False)
    warnings: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        old = getattr(self, "_digest", None)
        if isinstance(old, _DigestThread):
            old.abandon()
        self._digest: _DigestThread | hashlib._Hash = (
            _DigestThread(new_digest(self.etag, self.size))
            if self.size >= THREADED_DIGEST_BYTES
            else new_digest(self.etag, self.size)
        )
        self._seen = 0
        self._head = bytearray()
        self.header: Header | None = None
        self._manifest: list[bytes] | None = None
        self._fingerprint = b""
        self._spans: list[tuple[int, int, int]] = []  # (abs begin, abs end, index)
        self._span = 0
        self._tensor_hash: hashlib._Hash | None = None
        self._header_failed = False
        self.invalid: str | None = None  # why the header cannot be read
        self.warnings = []

    def update(self, data: bytes | memoryview) -> None:
        """Feed the next bytes (a view of a buffer the caller may reuse is copied once
        for the digest thread; ``bytes`` are not)."""
        view = memoryview(data)
        self._feed(view, data if isinstance(data, bytes) else bytes(view))

    def update_stable(self, view: memoryview) -> None:
        """Feed the next bytes as a view of a buffer that does not change until
        :meth:`drain` returned (``bytes``, or a buffer the caller reuses only after it):
        the digest thread hashes the view itself, no copy."""
        self._feed(view, view)

    def drain(self) -> None:
        """Wait until no view fed with :meth:`update_stable` is still held (the digest
        thread hashed it): its buffer may be reused then."""
        if isinstance(self._digest, _DigestThread):
            self._digest.drain()

    def _feed(self, view: memoryview, stable: bytes | memoryview) -> None:
        start = self._seen
        digest = self._digest
        if isinstance(digest, _DigestThread):
            digest.update(stable)
        else:
            digest.update(view)
        self._seen += len(view)
        if not self.safetensors or self._header_failed:
            return
        if self.header is None:
            self._head += view[: max(0, min(len(view), (1 << 27) - len(self._head)))]
            self._try_header()
            return
        self._route(view, start)

    def _try_header(self) -> None:
        if len(self._head) < PREFIX_SIZE:
            return
        (n,) = struct.unpack("<Q", bytes(self._head[:PREFIX_SIZE]))
        if n > 100_000_000 or PREFIX_SIZE + n > self.size:
            self._invalid(f"header length {n} does not fit a {self.size}-byte file", quiet=True)
            return
        if len(self._head) < PREFIX_SIZE + n:
            return
        try:
            self.header = parse_header(bytes(self._head[PREFIX_SIZE : PREFIX_SIZE + n]), self.size)
        except UNREADABLE_HEADER as exc:
            self._invalid(str(exc))
            return
        self._set_manifest(self.header)
        rest = bytes(self._head[PREFIX_SIZE + n :])
        self._head = bytearray()
        if rest:
            self._route(memoryview(rest), PREFIX_SIZE + n)

    def _invalid(self, reason: str, *, quiet: bool = False) -> None:
        """The header cannot be read: no tensor checks; :meth:`finish` decides what it means."""
        self.header = None
        self._manifest = None
        self._header_failed = True
        self.invalid = reason
        if not quiet and self.name is None:
            self.warnings.append(f"not a valid safetensors file: {reason}")

    def _set_manifest(self, header: Header) -> None:
        try:
            carrier = read_carrier(header.metadata, len(header.tensors))
            digests = None if carrier is None else claimed_digests(header)
        except INVALID_HEADER as exc:
            self._invalid(str(exc) or type(exc).__name__)
            return
        except CMHError as exc:
            self.warnings.append(f"CMH record unusable: {exc}")
            return
        if carrier is None:
            return
        if digests is None:
            self.warnings.append("CMH manifest does not agree with its record")
            return
        self._manifest = digests
        self._fingerprint = carrier.record.fingerprint
        base = header.data_start
        self._spans = [
            (base + t.begin, base + t.end, i)
            for i, t in enumerate(header.tensors)
            if i not in self.trusted
        ]

    def _route(self, view: memoryview, start: int) -> None:
        """Feed the bytes at absolute offset ``start`` to the tensor hashes they belong to."""
        if self._manifest is None:
            return
        end = start + len(view)
        while self._span < len(self._spans):
            t_begin, t_end, index = self._spans[self._span]
            if t_end == t_begin:  # empty tensor
                self._close_tensor(index, hashlib.sha256())
                continue
            if t_begin >= end:
                return
            lo, hi = max(start, t_begin), min(end, t_end)
            if lo < hi:
                if self._tensor_hash is None:
                    self._tensor_hash = hashlib.sha256()
                self._tensor_hash.update(view[lo - start : hi - start])
            if t_end <= end:
                self._close_tensor(index, self._tensor_hash or hashlib.sha256())
                continue
            return

    def _close_tensor(self, index: int, digest: hashlib._Hash) -> None:
        assert self._manifest is not None and self.header is not None
        if digest.digest() != self._manifest[index]:
            name = self.header.tensors[index].name
            raise IntegrityError(f"tensor {name!r} does not match the CMH manifest")
        self._tensor_hash = None
        self._span += 1

    @property
    def stamped(self) -> bool:
        return self._manifest is not None

    @property
    def stamp_checked(self) -> bytes | None:
        """The record fingerprint of the stamp every tensor was checked against (after
        :meth:`finish`), or ``None`` (unstamped, or some tensors taken as trusted)."""
        if self._manifest is None or self.trusted or self._span != len(self._spans):
            return None
        return self._fingerprint

    def finish(self) -> None:
        """Raise :class:`IntegrityError` unless everything fed is the blob named by the ETag.

        Then, for a file named ``*.safetensors`` whose header cannot be read,
        :class:`InvalidRemoteFileError` (the bytes are the blob: fetching them
        again cannot help).
        """
        if self._seen != self.size:
            raise IntegrityError(f"got {self._seen} bytes, expected {self.size}")
        if self._digest.hexdigest() != self.etag:
            raise IntegrityError(f"content does not hash to its ETag {self.etag}")
        if self.name is not None and self.safetensors and self.header is None:
            reason = self.invalid or "the file ends before its header does"
            raise InvalidRemoteFileError(f"not a valid safetensors file: {reason}", self.name)
        while self._manifest is not None and self._span < len(self._spans):
            t_begin, t_end, index = self._spans[self._span]
            if t_begin != t_end:
                break
            self._close_tensor(index, hashlib.sha256())
        if self._manifest is not None and self._span != len(self._spans):
            raise IntegrityError("not every tensor was checked against the CMH manifest")
        if self.strict and self.safetensors and self.warnings:
            raise IntegrityError("; ".join(self.warnings))


class _DigestThread:
    """A hash updated in a worker thread, so it runs beside the tensor hashes (2 cores)."""

    def __init__(self, digest: hashlib._Hash) -> None:
        self._digest = digest
        self._queue: queue.Queue[bytes | memoryview | None] = queue.Queue(maxsize=64)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._result: str | None = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._digest.update(item)
            finally:
                self._queue.task_done()

    def update(self, data: bytes | memoryview) -> None:
        self._queue.put(data)

    def drain(self) -> None:
        """Wait until every view given so far is hashed."""
        self._queue.join()

    def hexdigest(self) -> str:
        if self._result is None:
            self._queue.put(None)
            self._thread.join()
            self._result = self._digest.hexdigest()
        return self._result

    def abandon(self) -> None:
        if self._result is None and self._thread.is_alive():
            self._queue.put(None)


def feed_file(check: ContentCheck, path: Path, limit: int | None = None) -> int:
    """Feed the first ``limit`` bytes (default: all) of ``path`` to ``check``."""
    return hash_file(path, check, limit=limit)


def check_file(path: Path, etag: str, size: int, *, strict: bool = False) -> list[str]:
    """Hash ``path`` fully; raise :class:`IntegrityError` if it is not blob ``etag``."""
    check = ContentCheck(etag, size, safetensors=_is_safetensors_path(path), strict=strict)
    feed_file(check, path)
    check.finish()
    return check.warnings


def _is_safetensors_path(path: Path) -> bool:
    with contextlib.suppress(OSError):
        with open(path, "rb") as f:
            prefix = f.read(9)
        return len(prefix) == 9 and prefix[8:9] == b"{"
    return False


def mark_verified(repo: RepoLayout, etag: str) -> None:
    """Remember that blob ``etag``, as it is on disk now, passed its check."""
    with contextlib.suppress(OSError):
        st = repo.blob_path(etag).stat()
        marker = _marker_path(repo, etag)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(_stat_key(st))


def discard_blob(repo: RepoLayout, etag: str) -> None:
    """Delete blob ``etag`` and its verified marker (a blob that failed its check; the
    caller holds the blob lock)."""
    for path in (repo.blob_path(etag), _marker_path(repo, etag)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def blob_state(repo: RepoLayout, etag: str, size: int, *, recheck: bool = False) -> str:
    """``"missing"``, ``"ok"`` or ``"corrupt"`` for the cached blob ``etag``.

    A blob whose stat still matches its verified marker is ``ok`` without a
    read; otherwise it is hashed (and marked when it passes).
    """
    path = repo.blob_path(etag)
    try:
        st = path.stat()
    except FileNotFoundError:
        return "missing"
    if st.st_size != size:
        return "corrupt"
    if not recheck:
        with contextlib.suppress(OSError):
            if _marker_path(repo, etag).read_text() == _stat_key(st):
                return "ok"
    try:
        check_file(path, etag, size)
    except IntegrityError:
        return "corrupt"
    mark_verified(repo, etag)
    return "ok"


def install_blob(
    repo: RepoLayout, etag: str, source: Path, check: ContentCheck | None = None
) -> None:
    """Move a checked file into ``blobs/{etag}`` (fsync, rename, fsync of the folder).

    ``check`` is the finished check of its bytes: when it checked every tensor against
    the file's CMH stamp, the stamp's check record is written too (:mod:`cmh._checks`),
    so a semantic fingerprint of the snapshot reads headers only.
    """
    target = repo.blob_path(etag)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb+") as f:
        os.fsync(f.fileno())
    os.chmod(source, 0o644)
    os.replace(source, target)
    fsync_dir(target.parent)
    mark_verified(repo, etag)
    if check is not None and check.stamp_checked is not None:
        record_check(target, check.stamp_checked)
