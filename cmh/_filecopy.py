"""Kernel-side copy of a byte range on a background thread, written back as it goes.

Hashing can follow the copy (``wait_until``) and writeback to disk runs
beside both, so a first stamp costs about one pass over the data instead of
copy + hash + sync one after the other.
"""

from __future__ import annotations

import os
import threading

from ._atomic import start_writeback
from ._errors import StampError

COPY_CHUNK = 64 << 20
SYNC_EVERY = 256 << 20


class BackgroundCopy:
    """Copy ``size`` bytes from ``src`` at ``src_offset`` to ``dst`` at ``dst_offset``."""

    def __init__(self, src: int, dst: int, src_offset: int, dst_offset: int, size: int) -> None:
        self._src, self._dst = src, dst
        self._src_offset, self._dst_offset, self._size = src_offset, dst_offset, size
        self._copied = 0
        self._synced_request = 0
        self._done = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._copier = threading.Thread(target=self._copy, name="cmh-copy", daemon=True)
        self._syncer = threading.Thread(target=self._sync, name="cmh-sync", daemon=True)

    def start(self) -> BackgroundCopy:
        self._copier.start()
        self._syncer.start()
        return self

    def wait_until(self, dst_offset: int) -> None:
        """Return once every byte of ``dst`` before ``dst_offset`` is copied."""
        with self._cond:
            while self._dst_offset + self._copied < dst_offset:
                if self._error is not None:
                    raise StampError(f"copy failed: {self._error}") from self._error
                if self._done:
                    raise StampError("copy ended before the requested offset")
                self._cond.wait()

    def join(self) -> None:
        """Wait for the copy and its final sync; raise what went wrong."""
        self._copier.join()
        self._syncer.join()
        if self._error is not None:
            raise StampError(f"copy failed: {self._error}") from self._error

    def _copy(self) -> None:
        copy_file_range = getattr(os, "copy_file_range", None)
        try:
            while self._copied < self._size:
                want = min(COPY_CHUNK, self._size - self._copied)
                src_at = self._src_offset + self._copied
                dst_at = self._dst_offset + self._copied
                n = 0
                if copy_file_range is not None:
                    try:
                        n = copy_file_range(self._src, self._dst, want, src_at, dst_at)
                    except OSError:
                        copy_file_range = None  # e.g. across file systems: plain copy
                        continue
                else:
                    data = os.pread(self._src, want, src_at)
                    n = os.pwrite(self._dst, data, dst_at) if data else 0
                if n == 0:
                    raise StampError("source file shrank while it was copied")
                with self._cond:
                    self._copied += n
                    self._cond.notify_all()
        except BaseException as exc:  # reported through wait_until/join
            with self._cond:
                self._error = exc
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _sync(self) -> None:
        synced = 0
        try:
            while True:
                with self._cond:
                    while not self._done and self._copied - synced < SYNC_EVERY:
                        self._cond.wait()
                    target, finished = self._copied, self._done
                if finished:
                    os.fdatasync(self._dst)  # one flush, once every byte is queued
                    return
                # Queue the new bytes for writeback without a flush per step.
                start_writeback(self._dst, self._dst_offset + synced, target - synced)
                synced = target
        except OSError as exc:
            with self._cond:
                self._error = self._error or exc
                self._cond.notify_all()
