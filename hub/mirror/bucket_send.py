"""Answer a download from a bucket store: bytes proxied from the storage, or a redirect.

``proxy``: cmh streams the object from the storage, whole or by ranges (several
ranges are fetched one by one: S3 answers a multi-range GET with the whole object).
The bytes are those of the one object version that was checked: each GET carries
``If-Match`` with the storage ETag that a HEAD gave, and an object version is served
only while it hashes to its name. A version not yet known to be good is checked
while it is sent: a whole body is hashed as it goes through, a range waits for a
check of the whole object that runs beside it; either way the body's last byte is
held back until the check passes, and the connection is cut when it fails, so no
client receives a complete body that differs from its ETag. Outcomes are
remembered per (object, storage ETag), bounded.

``redirect``: cmh answers ``302`` with a presigned GET URL of the blob (valid
:data:`REDIRECT_EXPIRY`) and the Hub's headers (``X-Repo-Commit``, ``ETag``,
``X-Linked-Etag``, ``X-Linked-Size``), as the Hub does with its CDN; the client
fetches the bytes (any single ``Range``) from the storage directly. cmh does not
see those bytes: redirect mode trusts the storage to return what was stored, and
relies on ``cmh mirror scrub`` to find objects that went bad.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from datetime import timedelta

from aiohttp import web

from ..cache.blobs import new_digest
from .bucket_read import BucketReader
from .index import FileEntry
from .objectstore import ObjectInfo, ObjectNotFound, ObjectStoreError, PreconditionFailed
from .ranges import ByteRange
from .send import BlobUnavailable, multipart

PROXY = "proxy"
REDIRECT = "redirect"
X_ACCEL = "x-accel"
DELIVERIES = (PROXY, REDIRECT, X_ACCEL)
REDIRECT_EXPIRY = timedelta(minutes=15)
PROXY_CHUNK = 1 << 20
MAX_REMEMBERED = 65536


class ObjectVerifier:
    """Which object versions hash to their blob names (one per worker process)."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self.max_remembered = max_remembered
        self._lock = threading.Lock()
        self._known: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._running: dict[tuple[str, str], asyncio.Task[bool]] = {}

    def known(self, key: tuple[str, str]) -> bool | None:
        with self._lock:
            return self._known.get(key)

    def record(self, key: tuple[str, str], ok: bool) -> None:
        with self._lock:
            self._known[key] = ok
            self._known.move_to_end(key)
            while len(self._known) > self.max_remembered:
                self._known.popitem(last=False)

    def check(self, reader: BucketReader, info: ObjectInfo, entry: FileEntry) -> asyncio.Task[bool]:
        """The (shared) check of one object version: read it whole and hash it."""
        key = (info.name, info.etag)
        running = self._running.get(key)
        if running is not None:
            return running

        async def run() -> bool:
            try:
                digest = new_digest(entry.etag, entry.size)
                read = 0
                async for chunk in reader.store.objects.iter_chunks_async(
                    info.name, chunk_size=PROXY_CHUNK, if_match=info.etag
                ):
                    digest.update(chunk)
                    read += len(chunk)
                ok = read == entry.size and digest.hexdigest() == entry.etag
                self.record(key, ok)
                return ok
            finally:
                self._running.pop(key, None)

        task = asyncio.get_running_loop().create_task(run())
        self._running[key] = task
        return task


def _shape(
    headers: dict[str, str], ranges: list[ByteRange] | None, size: int
) -> tuple[web.StreamResponse, list[tuple[bytes, int, int]], bytes]:
    """The response (status, length, range headers) and the pieces its body is made of."""
    if ranges is None:
        response = web.StreamResponse(status=200, headers=headers)
        response.content_length = size
        return response, [(b"", 0, size)], b""
    response = web.StreamResponse(status=206, headers=headers)
    if len(ranges) == 1:
        r = ranges[0]
        response.headers["Content-Range"] = r.content_range(size)
        response.content_length = r.length
        return response, [(b"", r.start, r.length)], b""
    mp = multipart(ranges, size, "application/octet-stream")
    response.headers["Content-Type"] = mp.content_type
    response.content_length = mp.content_length
    pieces = [(h, r.start, r.length) for h, r in zip(mp.heads, ranges, strict=True)]
    return response, pieces, mp.tail


async def _blob(reader: BucketReader, entry: FileEntry) -> ObjectInfo:
    name = entry.source.as_posix()
    loop = asyncio.get_running_loop()
    try:
        info = await loop.run_in_executor(None, reader.blob_info, name)
    except ObjectNotFound:
        raise BlobUnavailable("blob unavailable: not in the bucket") from None
    except ObjectStoreError as exc:
        raise BlobUnavailable(f"blob unavailable: {exc}") from None
    if info.size != entry.size:
        reader.forget_blob(name)
        raise BlobUnavailable("blob is not of the expected size")
    return info


async def redirect(
    request: web.Request, reader: BucketReader, entry: FileEntry, headers: dict[str, str]
) -> web.StreamResponse:
    """``302`` to a presigned URL of the entry's blob, with the Hub's headers."""
    info = await _blob(reader, entry)
    url = reader.store.objects.presigned_get_url(info.name, REDIRECT_EXPIRY)
    out = {k: v for k, v in headers.items() if k not in ("Content-Type", "Accept-Ranges")}
    out["Location"] = url
    return web.Response(status=302, headers=out)


async def proxy(
    request: web.Request,
    reader: BucketReader,
    verifier: ObjectVerifier,
    entry: FileEntry,
    headers: dict[str, str],
    ranges: list[ByteRange] | None,
) -> tuple[web.StreamResponse, int, str | None]:
    """Stream the entry's blob (or its ranges) from the storage: the response, the body
    bytes sent, and why the body was cut (``None`` when it was not). Raises
    :class:`BlobUnavailable` before anything is sent when the blob is missing, of the
    wrong size, or known bad. A cut body's connection is aborted before its last byte."""
    info = await _blob(reader, entry)
    key = (info.name, info.etag)
    ok = verifier.known(key)
    if ok is False:
        raise BlobUnavailable("blob does not match its name")
    response, pieces, tail = _shape(headers, ranges, entry.size)
    if request.method == "HEAD":
        await response.prepare(request)
        await response.write_eof()
        return response, 0, None
    hasher: hashlib._Hash | None = None
    pending: asyncio.Task[bool] | None = None
    if ok is None:
        if ranges is None:
            hasher = new_digest(entry.etag, entry.size)  # the body is the whole object
        else:
            pending = verifier.check(reader, info, entry)
    chunks = _pieces(reader, info, pieces)
    try:
        first = await chunks.__anext__()  # the storage answered before any header goes out
    except StopAsyncIteration:
        first = None
    except (PreconditionFailed, ObjectNotFound):
        reader.forget_blob(info.name)
        raise BlobUnavailable("blob changed in the bucket: try again") from None
    except ObjectStoreError as exc:
        raise BlobUnavailable(f"blob unavailable: {exc}") from None
    await response.prepare(request)
    sent = 0
    held = first
    try:
        async for chunk in chunks:
            assert held is not None
            sent += await _write(response, held, hasher)
            held = chunk
    except ObjectStoreError as exc:
        reader.forget_blob(info.name)
        return response, sent, _cut(request, f"storage read failed: {exc}")
    if held is not None:
        if hasher is not None:
            hasher.update(held[1])
            good = hasher.hexdigest() == entry.etag
            verifier.record(key, good)
        elif pending is not None:
            try:
                good = await asyncio.shield(pending)
            except ObjectStoreError:
                good = False
        else:
            good = True
        if not good:
            return response, sent, _cut(request, "blob does not match its name")
        sent += await _write(response, held, None)
    if tail:
        await response.write(tail)
        sent += len(tail)
    await response.write_eof()
    return response, sent, None


async def _pieces(
    reader: BucketReader, info: ObjectInfo, pieces: list[tuple[bytes, int, int]]
) -> AsyncIterator[tuple[bytes, bytes]]:
    """``(prefix, data)`` chunks of every piece (a part's header rides with its first
    chunk), each piece one ranged GET of the checked object version."""
    for prefix, start, length in pieces:
        if length == 0:
            continue
        whole = start == 0 and length == info.size
        first = True
        async for data in reader.store.objects.iter_chunks_async(
            info.name, start, None if whole else start + length, PROXY_CHUNK, info.etag
        ):
            yield (prefix if first else b"", data)
            first = False


async def _write(
    response: web.StreamResponse, item: tuple[bytes, bytes], hasher: hashlib._Hash | None
) -> int:
    prefix, data = item
    if hasher is not None:
        hasher.update(data)
    if prefix:
        await response.write(prefix)
    await response.write(data)
    return len(prefix) + len(data)


def _cut(request: web.Request, reason: str) -> str:
    """Abort the connection before the body's last byte; the reason, for the log."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    return reason
