"""Incremental parser of a ``multipart/byteranges`` body (RFC 9110, 14.6)."""

from __future__ import annotations

import re
from collections.abc import Callable

from .types import HubProtocolError, HubUnreachableError


class MultipartParser:
    """Incremental parser of a ``multipart/byteranges`` body (RFC 9110, 14.6)."""

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
        if (begin, last + 1) not in self.wanted:
            raise HubProtocolError(f"server sent bytes {begin}-{last}, which were not asked for")
        self.wanted.discard((begin, last + 1))
        self.pos, self.left, self.state = begin, last + 1 - begin, "data"
        return True

    def close(self) -> None:
        if not self.done or self.wanted:
            raise HubUnreachableError("multipart answer ended before every range arrived")
