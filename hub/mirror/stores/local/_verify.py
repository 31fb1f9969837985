"""Serve a blob only while its bytes hash to its name (its ETag).

A blob is checked once per *file version*: device, inode, size, mtime and
ctime of the open file. An in-place change, a file renamed over the blob, or
a hard link swapped in gives a new version and a new check; a symlink is never
opened (the mirror opens blobs with ``O_NOFOLLOW``). File times tick coarsely,
so a version changed less than :func:`racy_seconds` before its check is not
remembered as good and is checked again at its next use (git's "racy clean"
rule): 2 s on a filesystem whose times are whole seconds, else
:data:`FINE_RACY_SECONDS` (Linux stamps files from a clock that ticks every 1
to 10 ms). Checks run in worker threads; concurrent requests for one version
share one check. Good and bad outcomes are both remembered (bounded, least
recently used first out).

A good outcome is also written to ``{repo}/.cmh/checked/{etag}`` (the version,
as JSON), so other workers and later runs of the server take it without
hashing the blob again; a record that names another version counts for nothing.

The mirror then sends verified blobs with ``sendfile`` and takes the file's
version again before the last byte of every body: a change in between cuts
the connection (see :mod:`cmh.hub.mirror._send`), so no client ever receives a
complete body that differs from its ETag.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path

from cmh.hub.cache import CHECK_RECORDS, new_digest

from cmh import FileVersion as FileVersion  # one definition; callers import it here
from cmh import atomic_write

from ..._memo import Memo

RACY_SECONDS = 2.0
#: The racy window where file times have sub-second resolution.
FINE_RACY_SECONDS = 0.1
MAX_REMEMBERED = 65536
_CHUNK = 8 << 20


def racy_seconds(version: FileVersion) -> float:
    """How long after its last change a version's good check is not remembered."""
    coarse = version.mtime_ns % 1_000_000_000 == 0 and version.ctime_ns % 1_000_000_000 == 0
    return RACY_SECONDS if coarse else FINE_RACY_SECONDS


def record_path(blob: Path, etag: str) -> Path | None:
    """Where the good check of ``{repo}/blobs/{etag}`` is recorded (None: not a blob)."""
    if blob.parent.name != "blobs" or blob.name != etag:
        return None
    return blob.parent.parent / CHECK_RECORDS / etag


def read_record(path: Path) -> FileVersion | None:
    """The version a record says hashed to its name; None if absent or unreadable."""
    try:
        data = json.loads(path.read_bytes())
        return FileVersion(**{k: int(data[k]) for k in FileVersion.__dataclass_fields__})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_record(path: Path, version: FileVersion) -> None:
    """Record a good check (best effort: a read-only store just keeps no record)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(asdict(version)).encode())


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
        self._known: Memo[tuple[FileVersion, str], bool] = Memo(max_remembered)
        self._running: dict[tuple[FileVersion, str], concurrent.futures.Future[bool]] = {}

    def known(self, version: FileVersion, etag: str, record: Path | None = None) -> bool | None:
        """True/False when this version was checked against ``etag``; None if not (yet).

        ``record`` is where a good check of it may have been written (by another
        worker or an earlier run); it is read when memory has no outcome.
        """
        key = (version, etag)
        outcome = self._known.get(key)
        if outcome is not None:
            return outcome
        if record is not None and read_record(record) == version:
            self._remember(key, True)
            return True
        return None

    def _remember(self, key: tuple[FileVersion, str], ok: bool) -> None:
        self._known.put(key, ok)

    def check(
        self, fd: int, etag: str, version: FileVersion, record: Path | None = None
    ) -> asyncio.Future[bool]:
        """A future of the check of ``version`` against ``etag`` (shared by concurrent callers).

        The check reads its own duplicate of ``fd``, so the caller may close
        ``fd`` at any time. The future's exception is the ``OSError`` that
        stopped a check. A good outcome that is not racy is written to
        ``record`` when given.
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
            loop.run_in_executor(None, self._run, os.dup(fd), etag, version, running, record)
        return asyncio.wrap_future(running, loop=loop)

    def _run(
        self,
        fd: int,
        etag: str,
        version: FileVersion,
        done: concurrent.futures.Future[bool],
        record: Path | None = None,
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
        racy = started - max(version.mtime_ns, version.ctime_ns) < racy_seconds(version) * 1e9
        if ok and racy:
            pass  # checked again at its next use: a change within the same tick is invisible
        else:
            self._remember(key, ok)
            if ok and record is not None:
                write_record(record, version)
        with self._lock:
            self._running.pop(key, None)
        done.set_result(ok)
