"""Send a blob, whole or by byte ranges, with the kernel's sendfile where the loop allows.

The headers are prepared by the caller; this module only moves bytes. Bodies go
through ``loop.sendfile`` (``os.sendfile`` on a plain TCP transport), with a
chunked read fallback when the transport cannot do it. Several ranges are sent
as ``multipart/byteranges`` (RFC 9110 section 14.6), each part by sendfile.
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from .ranges import ByteRange

_FALLBACK_CHUNK = 1 << 20


class BlobUnavailable(OSError):
    """The blob is missing, not a regular file, or not the size the index says."""


def open_blob(path: Path, size: int) -> io.FileIO:
    """Open a blob for reading without following a final symlink; check type and size."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise BlobUnavailable(f"blob unavailable: {exc.strerror}") from None
    f = io.FileIO(fd, "rb", closefd=True)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        f.close()
        raise BlobUnavailable("blob is not a regular file of the expected size")
    return f


@dataclass(frozen=True)
class Multipart:
    """The framing of a ``multipart/byteranges`` body."""

    boundary: str
    heads: list[bytes]
    tail: bytes
    content_length: int

    @property
    def content_type(self) -> str:
        return f"multipart/byteranges; boundary={self.boundary}"


def multipart(ranges: list[ByteRange], size: int, part_type: str) -> Multipart:
    """Part headers and total length for sending ``ranges`` of a ``size``-byte file."""
    boundary = secrets.token_hex(16)
    heads = [
        (
            f"\r\n--{boundary}\r\nContent-Type: {part_type}\r\n"
            f"Content-Range: {r.content_range(size)}\r\n\r\n"
        ).encode()
        for r in ranges
    ]
    tail = f"\r\n--{boundary}--\r\n".encode()
    total = sum(len(h) for h in heads) + sum(r.length for r in ranges) + len(tail)
    return Multipart(boundary, heads, tail, total)


async def send_body(
    request: web.BaseRequest,
    response: web.StreamResponse,
    f: io.FileIO,
    ranges: list[tuple[bytes, int, int]],
    tail: bytes = b"",
) -> int:
    """Write ``(prefix, offset, count)`` pieces then ``tail``; return the bytes sent.

    ``response`` must already be prepared (headers sent).
    """
    loop = asyncio.get_running_loop()
    sent = 0
    use_sendfile = True
    for prefix, offset, count in ranges:
        if prefix:
            await response.write(prefix)
            sent += len(prefix)
        if count == 0:
            continue
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client went away")
        if use_sendfile:
            try:
                await loop.sendfile(transport, f, offset, count, fallback=False)
                sent += count
                continue
            except (NotImplementedError, asyncio.SendfileNotAvailableError):
                use_sendfile = False
        sent += await _copy(loop, response, f, offset, count)
    if tail:
        await response.write(tail)
        sent += len(tail)
    await response.write_eof()
    return sent


async def _copy(
    loop: asyncio.AbstractEventLoop,
    response: web.StreamResponse,
    f: io.FileIO,
    offset: int,
    count: int,
) -> int:
    done = 0
    while done < count:
        chunk = await loop.run_in_executor(
            None, os.pread, f.fileno(), min(_FALLBACK_CHUNK, count - done), offset + done
        )
        if not chunk:
            raise BlobUnavailable("blob shrank while it was sent")
        await response.write(chunk)
        done += len(chunk)
    return done
