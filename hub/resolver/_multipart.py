"""Incremental parser of a ``multipart/byteranges`` body (RFC 9110, 14.6)."""

from __future__ import annotations

import re
from collections.abc import Callable

from ._types import HubProtocolError, HubUnreachableError


class MultipartParser:
    """Incremental parser of a ``multipart/byteranges`` body (RFC 9110, 14.6).

    Each part must answer asked ranges exactly: one of them, or a run of
    adjacent ones that the server coalesced. ``sink(offset, data)`` gets the
    bytes with their absolute offsets; a coalesced part's bytes may run across
    the boundary between two asked ranges.
    """

    def __init__(
        self, boundary: bytes, wanted: set[tuple[int, int]], sink: Callable[[int, bytes], None]
    ) -> None:
        self.delimiter = b"--" + boundary
        self.wanted = wanted
        self.sink = sink
        self.buf = bytearray()
        self.state = "boundary"
        self.pos = 0
        self.left = 0
        self.done = False

    def feed(self, data: bytes) -> None:
        if self.state == "data" and not self.buf:
            data = self._data(memoryview(data))
        self.buf += data
        while self._step():
            pass

    def _data(self, view: memoryview) -> bytes:
        n = min(self.left, len(view))
        if n:
            self.sink(self.pos, bytes(view[:n]))
            self.pos += n
            self.left -= n
        if self.left == 0:
            self.state = "after"
        return bytes(view[n:])

    def _step(self) -> bool:
        if self.done:
            if self.buf.strip():
                raise HubProtocolError("bytes after the closing multipart boundary")
            self.buf.clear()
            return False
        if self.state == "data":
            rest = self._data(memoryview(bytes(self.buf)))
            self.buf = bytearray(rest)
            return self.state != "data"
        if self.state in ("boundary", "after"):
            at = self.buf.find(self.delimiter)
            if at < 0:
                if len(self.buf) > 4096:
                    raise HubProtocolError("multipart boundary not found")
                return False
            if self.buf[:at].strip():
                raise HubProtocolError("unexpected bytes between multipart parts")
            tail = self.buf[at + len(self.delimiter) : at + len(self.delimiter) + 2]
            if len(tail) < 2:
                return False
            if tail == b"--":
                self.done = True
                self.buf = self.buf[at + len(self.delimiter) + 2 :]
                return True
            self.buf = self.buf[at + len(self.delimiter) :]
            self.state = "headers"
            return True
        # headers
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > 16384:
                raise HubProtocolError("multipart part headers too long")
            return False
        head = bytes(self.buf[:end]).decode("latin-1")
        self.buf = self.buf[end + 4 :]
        match = re.search(r"(?im)^content-range:\s*bytes (\d+)-(\d+)/(\d+|\*)\s*$", head)
        if not match:
            raise HubProtocolError("multipart part without Content-Range")
        begin, last = int(match.group(1)), int(match.group(2))
        covered = self._covered(begin, last + 1)
        if covered is None:
            raise HubProtocolError(f"server sent bytes {begin}-{last}, which were not asked for")
        self.wanted.difference_update(covered)
        self.pos, self.left, self.state = begin, last + 1 - begin, "data"
        return True

    def _covered(self, begin: int, end: int) -> list[tuple[int, int]] | None:
        """The asked ranges that part ``[begin, end)`` answers, or None if it answers none exactly.

        A server may coalesce adjacent asked ranges into one part (RFC 9110,
        14.2): the part must then be exactly a run of adjacent asked ranges.
        """
        covered: list[tuple[int, int]] = []
        at = begin
        ends = {b: e for b, e in self.wanted}
        while at < end:
            stop = ends.get(at)
            if stop is None or stop > end:
                return None
            covered.append((at, stop))
            at = stop
        return covered if covered and at == end else None

    def close(self) -> None:
        if not self.done or self.wanted:
            raise HubUnreachableError("multipart answer ended before every range arrived")
