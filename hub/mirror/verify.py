"""Serve a blob only while its bytes hash to its name (its ETag).

A blob is checked once per *file version*: device, inode, size, mtime and
ctime of the open file. An in-place change, a file renamed over the blob, or
a hard link swapped in gives a new version and a new check; a symlink is never
opened (the mirror opens blobs with ``O_NOFOLLOW``). File times tick coarsely,
so a version changed less than :data:`RACY_SECONDS` before its check is not
remembered as good and is checked again at its next use (git's "racy clean"
rule). Checks run in worker threads; concurrent requests for one version share
one check. Good and bad outcomes are both remembered (bounded, least recently
used first out).

The mirror then sends verified blobs with ``sendfile`` and takes the file's
version again before the last byte of every body: a change in between cuts
the connection (see :mod:`cmh.hub.mirror.send`), so no client ever receives a
complete body that differs from its ETag.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from ..cache.blobs import new_digest

RACY_SECONDS = 2.0
MAX_REMEMBERED = 65536
_CHUNK = 8 << 20


@dataclass(frozen=True)
class FileVersion:
    """What identifies one version of an open file's bytes."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, fd: int) -> FileVersion:
        st = os.fstat(fd)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class BlobMismatch(OSError):
    """The blob's bytes do not hash to its name, or changed while they were checked."""


def hash_matches(fd: int, etag: str, version: FileVersion) -> bool:
    """Hash the open file ``fd`` and compare with ``etag``; False if it changed meanwhile."""
    digest = new_digest(etag, version.size)
    offset = 0
    while offset < version.size:
        chunk = os.pread(fd, min(_CHUNK, version.size - offset), offset)
        if not chunk:
            return False
        digest.update(chunk)
        offset += len(chunk)
    if os.pread(fd, 1, offset):
        return False  # grew while it was read
    return FileVersion.of(fd) == version and digest.hexdigest() == etag


class BlobVerifier:
    """Remembers which file versions hash to which names (one per worker process)."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self.max_remembered = max_remembered
        self._lock = threading.Lock()
        self._known: OrderedDict[tuple[FileVersion, str], bool] = OrderedDict()
        self._running: dict[tuple[FileVersion, str], concurrent.futures.Future[bool]] = {}

    def known(self, version: FileVersion, etag: str) -> bool | None:
        """True/False when this version was checked against ``etag``; None if not (yet)."""
        key = (version, etag)
        with self._lock:
            outcome = self._known.get(key)
            if outcome is not None:
                self._known.move_to_end(key)
            return outcome

    def check(self, fd: int, etag: str, version: FileVersion) -> asyncio.Future[bool]:
        """A future of the check of ``version`` against ``etag`` (shared by concurrent callers).

        The check reads its own duplicate of ``fd``, so the caller may close
        ``fd`` at any time. The future's exception is the ``OSError`` that
        stopped a check.
        """
        key = (version, etag)
        loop = asyncio.get_running_loop()
        with self._lock:
            running = self._running.get(key)
            start = running is None
            if running is None:
                running = concurrent.futures.Future()
                running.set_running_or_notify_cancel()  # no waiter can cancel it for the others
                self._running[key] = running
        if start:
            loop.run_in_executor(None, self._run, os.dup(fd), etag, version, running)
        return asyncio.wrap_future(running, loop=loop)

    def _run(
        self, fd: int, etag: str, version: FileVersion, done: concurrent.futures.Future[bool]
    ) -> None:
        key = (version, etag)
        started = time.time_ns()
        try:
            ok = hash_matches(fd, etag, version)
        except BaseException as exc:  # every waiter must hear the outcome
            with self._lock:
                self._running.pop(key, None)
            done.set_exception(exc)
            return
        finally:
            os.close(fd)
        racy = started - max(version.mtime_ns, version.ctime_ns) < RACY_SECONDS * 1e9
        with self._lock:
            self._running.pop(key, None)
            if ok and racy:
                pass  # checked again at its next use: a change within the same tick is invisible
            else:
                self._known[key] = ok
                while len(self._known) > self.max_remembered:
                    self._known.popitem(last=False)
        done.set_result(ok)
