"""How a memory store's blobs reach a client: this process sends the bytes, checked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from ..._errors import CLIENT_LEFT
from ..._index import FileEntry
from ..._ranges import ByteRange
from ..._send import frame
from .._delivery import NoHashedParts, Sent

#: Bytes written at a time (the loop yields between writes).
CHUNK = 1 << 20


class MemoryDelivery(NoHashedParts):
    """Sends a memory store's blobs from this process (``proxy``): every body's bytes are
    those of a blob that hashed to its name just before (``read`` checks them, and raises
    :class:`~cmh.hub.mirror.stores.BlobMissing` or :class:`~cmh.hub.mirror.stores.BlobMismatch`)."""

    def redirects(self, request: web.Request) -> bool:
        return False

    def __init__(self, read: Callable[[FileEntry], bytes], mode: str) -> None:
        self.read = read
        self.mode = mode

    async def ready(self, entry: FileEntry) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.read, entry)

    async def send(
        self,
        request: web.Request,
        entry: FileEntry,
        headers: dict[str, str],
        ranges: list[ByteRange] | None,
    ) -> Sent:
        data = await asyncio.get_running_loop().run_in_executor(None, self.read, entry)
        response, pieces, tail = frame(headers, ranges, entry.size)
        sent = 0
        try:
            await response.prepare(request)  # a client gone before its headers left, too
            for prefix, offset, count in pieces:
                if prefix:
                    await response.write(prefix)
                    sent += len(prefix)
                for at in range(offset, offset + count, CHUNK):
                    chunk = data[at : min(at + CHUNK, offset + count)]
                    await response.write(chunk)
                    sent += len(chunk)
            if tail:
                await response.write(tail)
                sent += len(tail)
            await response.write_eof()
        except ConnectionError:
            return Sent(response, sent, CLIENT_LEFT)
        return Sent(response, sent)

    async def close(self) -> None:
        """Nothing held."""
