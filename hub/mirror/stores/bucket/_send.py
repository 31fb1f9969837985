"""Answer a download from a bucket store: bytes proxied from the storage, or a redirect.

``proxy``: cmh streams the object from the storage, whole or by ranges (several
ranges are fetched one by one: S3 answers a multi-range GET with the whole object).
A body of a version known good (or a range whose last byte waits for a check beside
it) is spliced in the kernel from the storage's socket to the client's
(:mod:`~cmh.hub.mirror.stores.bucket._splice`); only a body hashed as it goes, a
multipart one, a small one, or one from ``https`` storage goes through Python.
The bytes are those of the one object version that was checked: each GET carries
``If-Match`` with the storage ETag that a HEAD gave, and an object version is served
only while it hashes to its name. A version not yet known to be good is checked
while it is sent: a whole body is hashed as it goes through, and a range that
holds the object's last byte waits for a check of the whole object that runs
beside it; either way that last byte is held back until the check passes, and
the connection is cut when it fails, so no client receives a complete body (nor
the end of a file it assembles from ranges) that differs from its ETag. Any other
range is sent at once, never waiting on a whole-object read: its bytes are those
of the stored version, not yet proven, while the check runs beside it for the
requests that follow (spec/hub-mirror.md 7.6). Outcomes are remembered per
(object, storage ETag), bounded.

``redirect``: cmh answers ``302`` with a presigned GET URL of the blob (valid
:data:`REDIRECT_EXPIRY`) and the Hub's headers (``X-Repo-Commit``, ``ETag``,
``X-Linked-Etag``, ``X-Linked-Size``), as the Hub does with its CDN; the client
fetches the bytes (any single ``Range``) from the storage directly. cmh does not
see those bytes: redirect mode trusts the storage to return what was stored, and
relies on ``cmh mirror scrub`` to find objects that went bad.

``x-accel``: nginx in front of cmh moves the bytes (``X-Accel-Redirect`` to an internal
location that proxies a presigned URL, :mod:`~cmh.hub.mirror.stores.bucket._xaccel`).
cmh answers only once the object version is known to hash to its name (a version not
checked yet is checked first, as nginx's bytes cannot be held back), and pins nginx's
GET to that version with ``If-Match``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from datetime import timedelta

import aiohttp
from aiohttp import web
from cmh.hub.cache import new_digest

from ..._errors import HubError, storage_failed
from ..._index import FileEntry
from ..._memo import Memo
from ..._ranges import ByteRange, is_whole, reaches_end
from ..._send import CLIENT_LEFT, BlobUnavailable, frame
from .._delivery import whole_prefix
from . import _splice
from ._objectstore import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailed,
)
from ._read import BucketReader
from ._shared_get import AloneBody, SharedBody, Version, open_body
from ._splice import SpliceUnavailable
from ._xaccel import DEFAULT_PREFIX, accel_headers

PROXY = "proxy"
REDIRECT = "redirect"
X_ACCEL = "x-accel"
DELIVERIES = (PROXY, REDIRECT, X_ACCEL)
REDIRECT_EXPIRY = timedelta(minutes=15)
SIGNED_FOR = timedelta(minutes=5)  # presigned URLs the proxy itself uses
MAX_REMEMBERED = 65536
#: Bytes from which a body no byte of which Python must read is spliced from the storage's
#: socket (a new connection) rather than streamed (pooled connections, one copy per chunk).
SPLICE_FROM = 1 << 20
#: Connections to the storage a worker's proxy opens at once; a GET waits for one at most
#: :data:`STORAGE_WAIT` seconds (with the connect), then fails (``503 StoreUnavailable``).
STORAGE_CONNECTIONS = 256
STORAGE_WAIT = 30.0
#: Multi-range bodies a worker sends at once (each streams through Python); one more
#: answers ``503 MultiRangeBusy`` with ``Retry-After``.
MAX_MULTI_RANGE = 64
MULTI_RANGE_RETRY = "5"
#: Bytes a multi-range body reads from the storage at once (what a slow reader holds).
MULTI_RANGE_CHUNK = 64 << 10
_multi_range = [0]  # multi-range bodies being sent by this worker (on its event loop)


class ObjectFetcher:
    """Ranged GETs of blob objects for the proxy, through presigned URLs and aiohttp's
    client (one session per worker).

    Why not obstore's own stream: with 16 concurrent readers here it spent 0.78-0.87
    CPU s/GiB against 0.47-0.57 for aiohttp's client on the same objects, and CPU is
    what a proxy runs out of first. The requests are still signed by obstore.
    """

    def __init__(self, reader: BucketReader) -> None:
        self.reader = reader
        self._session: aiohttp.ClientSession | None = None

    async def chunks(
        self, name: str, start: int, end: int | None, etag: str, most: int | None = None
    ) -> AsyncIterator[bytes]:
        """Bytes ``[start, end)`` (to the end with ``None``) of the object version
        ``etag``, at most ``most`` bytes a chunk when given; :class:`PreconditionFailed`
        when the object is another version, :class:`ObjectNotFound` when it is gone,
        :class:`ObjectStoreError` otherwise (also when no storage connection was free
        within :data:`STORAGE_WAIT`)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=STORAGE_WAIT, sock_connect=10, sock_read=60
                ),
                connector=aiohttp.TCPConnector(limit=STORAGE_CONNECTIONS),
                auto_decompress=False,
            )
        url = self.reader.store.objects.presigned_get_url(name, SIGNED_FOR)
        headers = {"If-Match": etag}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        where = f"GET {self.reader.store.url}{name}"
        try:
            async with self._session.get(url, headers=headers) as r:
                if r.status == 412:
                    raise PreconditionFailed(f"{where}: precondition failed (412)", name)
                if r.status == 404:
                    raise ObjectNotFound(f"{where}: no such object", name)
                if r.status != (200 if "Range" not in headers else 206):
                    raise ObjectStoreError(f"{where}: {r.status} {r.reason}")
                while True:
                    chunk = await (r.content.readany() if most is None else r.content.read(most))
                    if not chunk:
                        break
                    yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ObjectStoreError(f"{where}: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class ObjectVerifier:
    """Which object versions hash to their blob names (one per worker process)."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self.max_remembered = max_remembered
        self._known: Memo[tuple[str, str], bool] = Memo(max_remembered)
        self._running: dict[tuple[str, str], asyncio.Task[bool]] = {}

    def known(self, key: tuple[str, str]) -> bool | None:
        return self._known.get(key)

    def record(self, key: tuple[str, str], ok: bool) -> None:
        self._known.put(key, ok)

    def check(
        self, fetcher: ObjectFetcher, info: ObjectInfo, entry: FileEntry
    ) -> asyncio.Task[bool]:
        """The (shared) check of one object version: read it whole and hash it."""
        key = (info.name, info.etag)
        running = self._running.get(key)
        if running is not None:
            return running

        async def run() -> bool:
            try:
                digest = new_digest(entry.etag, entry.size)
                read = 0
                async for chunk in fetcher.chunks(info.name, 0, None, info.etag):
                    digest.update(chunk)
                    read += len(chunk)
                ok = read == entry.size and digest.hexdigest() == entry.etag
                self.record(key, ok)
                if ok:
                    _share(fetcher.reader, info)
                return ok
            finally:
                self._running.pop(key, None)

        task = asyncio.get_running_loop().create_task(run())
        self._running[key] = task
        return task


def _storage_failed(exc: ObjectStoreError) -> BlobUnavailable:
    """The 503 of a blob the storage failed to give: the storage's line to the log alone."""
    return BlobUnavailable(f"blob unavailable: {storage_failed(exc, 'blob unavailable')}")


async def _blob(reader: BucketReader, entry: FileEntry) -> ObjectInfo:
    name = entry.source.as_posix()
    loop = asyncio.get_running_loop()
    try:
        info = await loop.run_in_executor(None, reader.blob_info, name)
    except ObjectNotFound:
        raise BlobUnavailable("blob unavailable: not in the bucket") from None
    except ObjectStoreError as exc:
        raise _storage_failed(exc) from None
    if info.size != entry.size:
        reader.forget_blob(name)
        raise BlobUnavailable("blob is not of the expected size")
    return info


async def _recorded(reader: BucketReader, info: ObjectInfo) -> bool:
    """Whether the bucket records this object version as checked (False if unreadable)."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, reader.checked, info)
    except ObjectStoreError:
        return False


def _share(reader: BucketReader, info: ObjectInfo) -> None:
    """Write the check record of a version this worker found good, in the background."""
    asyncio.get_running_loop().run_in_executor(None, reader.record_checked, info)


async def redirect(
    request: web.Request,
    reader: BucketReader,
    entry: FileEntry,
    headers: dict[str, str],
    signer: ObjectStore | None = None,
) -> web.StreamResponse:
    """``302`` to a presigned URL of the entry's blob, with the Hub's headers; signed for
    ``signer``'s endpoint when given (``--public-storage-url``), else the store's."""
    info = await _blob(reader, entry)
    url = (signer or reader.store.objects).presigned_get_url(info.name, REDIRECT_EXPIRY)
    out = {k: v for k, v in headers.items() if k not in ("Content-Type", "Accept-Ranges")}
    out["Location"] = url
    return web.Response(status=302, headers=out)


async def x_accel(
    reader: BucketReader,
    fetcher: ObjectFetcher,
    verifier: ObjectVerifier,
    entry: FileEntry,
    headers: dict[str, str],
    whole: bool = False,
) -> web.Response:
    """The answer that hands the entry's checked blob to nginx (its bytes come from the
    storage through nginx, pinned to the checked version; with ``whole``, through the
    location that ignores the client's ``Range``: cmh answers it with the whole body);
    :class:`BlobUnavailable` when the blob is missing, of the wrong size, unreadable or
    does not match its name."""
    info, ok = await ready(reader, verifier, entry)
    if ok is None:
        try:
            ok = await asyncio.shield(verifier.check(fetcher, info, entry))
        except (PreconditionFailed, ObjectNotFound):
            reader.forget_blob(info.name)
            raise BlobUnavailable("blob changed in the bucket: try again") from None
        except ObjectStoreError as exc:
            raise _storage_failed(exc) from None
        if not ok:
            raise BlobUnavailable("blob does not match its name")
    out = {k: v for k, v in headers.items() if k != "Accept-Ranges"}
    if not info.size:  # nothing to move (and a cached location's slice Range would not fit)
        return web.Response(status=200, headers=out)
    url = reader.store.objects.presigned_get_url(info.name, SIGNED_FOR)
    out.update(
        accel_headers(url, info.etag, whole_prefix(DEFAULT_PREFIX) if whole else DEFAULT_PREFIX)
    )
    return web.Response(status=200, headers=out)


async def ready(
    reader: BucketReader, verifier: ObjectVerifier, entry: FileEntry
) -> tuple[ObjectInfo, bool | None]:
    """The entry's object version and whether it is known good (None: not yet);
    :class:`BlobUnavailable` when it is missing, of the wrong size or known bad.
    Reads no byte of the blob (what a ``HEAD`` needs)."""
    info = await _blob(reader, entry)
    key = (info.name, info.etag)
    ok = verifier.known(key)
    if ok is None and await _recorded(reader, info):
        ok = True
        verifier.record(key, True)
    if ok is False:
        raise BlobUnavailable("blob does not match its name")
    return info, ok


@contextlib.contextmanager
def _multi_range_slot(ranges: list[ByteRange] | None) -> Iterator[None]:
    """Hold one of this worker's :data:`MAX_MULTI_RANGE` places while a multi-range body is
    sent (no place for one range or none); ``503 MultiRangeBusy`` when none is free."""
    if ranges is None or len(ranges) < 2:
        yield
        return
    if _multi_range[0] >= MAX_MULTI_RANGE:
        raise HubError(
            503, "MultiRangeBusy", "too many multi-range answers at once: try again",
            {"Retry-After": MULTI_RANGE_RETRY},
        )  # fmt: skip
    _multi_range[0] += 1
    try:
        yield
    finally:
        _multi_range[0] -= 1


async def proxy(
    request: web.Request,
    reader: BucketReader,
    fetcher: ObjectFetcher,
    verifier: ObjectVerifier,
    entry: FileEntry,
    headers: dict[str, str],
    ranges: list[ByteRange] | None,
) -> tuple[web.StreamResponse, int, str | None]:
    """Stream the entry's blob (or its ranges) from the storage: the response, the body
    bytes sent, and why the body was cut (``None`` when it was not). Raises
    :class:`BlobUnavailable` before anything is sent when the blob is missing, of the
    wrong size, or known bad; a multi-range answer past :data:`MAX_MULTI_RANGE` of them
    at once in this worker answers ``503 MultiRangeBusy`` before any storage request. A
    cut body's connection is aborted before its last byte."""
    with _multi_range_slot(ranges):
        info, ok = await ready(reader, verifier, entry)
        key = (info.name, info.etag)
        response, pieces, tail = frame(headers, ranges, entry.size)
        hasher: hashlib._Hash | None = None
        pending: asyncio.Task[bool] | None = None
        if ok is None:
            if is_whole(ranges, entry.size):
                hasher = new_digest(entry.etag, entry.size)  # the body is the whole object
            elif reaches_end(ranges, entry.size):
                pending = verifier.check(fetcher, info, entry)  # its last byte waits for it
            else:  # the range goes at once; the check runs beside it, for later requests
                verifier.check(fetcher, info, entry).add_done_callback(_outcome_kept)
        if hasher is None and len(pieces) == 1 and pieces[0][2] >= SPLICE_FROM:
            spliced = await _spliced(request, fetcher, info, response, pieces[0], pending)
            if spliced is not None:
                return spliced
        chunks = _pieces(fetcher, info, pieces)
        try:
            first = await chunks.__anext__()  # the storage answered before any header goes out
        except StopAsyncIteration:
            first = None
        except (PreconditionFailed, ObjectNotFound):
            reader.forget_blob(info.name)
            raise BlobUnavailable("blob changed in the bucket: try again") from None
        except ObjectStoreError as exc:
            raise _storage_failed(exc) from None
        sent = 0
        held = first
        try:
            await response.prepare(request)  # a client gone before its headers left, too
            async for chunk in chunks:
                assert held is not None
                sent += await _write(response, held, hasher)
                held = chunk
        except ObjectStoreError as exc:
            reader.forget_blob(info.name)
            return response, sent, _cut(request, f"storage read failed: {exc}")
        except ConnectionError:  # the client went away mid-body: nothing to report
            await chunks.aclose()  # the storage read ends with it
            return response, sent, CLIENT_LEFT
        if held is not None:
            if hasher is not None:
                hasher.update(held[1])
                good = hasher.hexdigest() == entry.etag
                verifier.record(key, good)
                if good:
                    _share(reader, info)
            elif pending is not None:
                try:
                    good = await asyncio.shield(pending)
                except ObjectStoreError:
                    good = False
            else:
                good = True
            if not good:
                return response, sent, _cut(request, "blob does not match its name")
            try:
                sent += await _write(response, held, None)
                if tail:
                    await response.write(tail)
                    sent += len(tail)
                await response.write_eof()
            except ConnectionError:
                return response, sent, CLIENT_LEFT
        return response, sent, None


async def _spliced(
    request: web.Request,
    fetcher: ObjectFetcher,
    info: ObjectInfo,
    response: web.StreamResponse,
    piece: tuple[bytes, int, int],
    pending: asyncio.Task[bool] | None,
) -> tuple[web.StreamResponse, int, str | None] | None:
    """One span of a body no byte of which Python must read, spliced from the storage's
    socket to the client's (:mod:`~cmh.hub.mirror.stores.bucket._splice`); with ``pending``
    its last byte waits for that check. ``None`` when it cannot be spliced here, or while
    every splice thread is taken (a busy pool never holds an answer's headers back)."""
    if _splice.saturated():
        return None
    _, start, length = piece
    reader = fetcher.reader
    url = reader.store.objects.presigned_get_url(info.name, SIGNED_FOR)
    where = f"GET {reader.store.url}{info.name}"
    version = Version(reader.store.url, info.name, info.etag, info.size, url, where)
    try:
        body = await open_body(version, start, length)
    except SpliceUnavailable:
        return None
    except (PreconditionFailed, ObjectNotFound):
        reader.forget_blob(info.name)
        raise BlobUnavailable("blob changed in the bucket: try again") from None
    except ObjectStoreError as exc:
        raise _storage_failed(exc) from None
    try:
        if body.length != length:
            wrong = ObjectStoreError(f"{where}: {body.length} bytes, not {length}")
            raise _storage_failed(wrong)
        try:
            await response.prepare(request)  # a client gone before its headers left, too
            await body.send_to(request.transport, length - 1 if pending else length)
            if pending is not None:
                try:
                    good = await asyncio.shield(pending)
                except ObjectStoreError:
                    good = False
                if not good:
                    return response, body.sent, _cut(request, "blob does not match its name")
                await body.send_to(request.transport, 1)
            await response.write_eof()
        except ObjectStoreError as exc:
            reader.forget_blob(info.name)
            return response, body.sent, _cut(request, f"storage read failed: {exc}")
        except ConnectionError:
            return response, body.sent, CLIENT_LEFT
        return response, body.sent, None
    finally:
        body.close()


def _outcome_kept(task: asyncio.Task[bool]) -> None:
    """A background check's outcome lives in the verifier; a failed read is retried later."""
    if not task.cancelled():
        task.exception()


async def _pieces(
    fetcher: ObjectFetcher, info: ObjectInfo, pieces: list[tuple[bytes, int, int]]
) -> AsyncGenerator[tuple[bytes, bytes], None]:
    """``(prefix, data)`` chunks of every piece (a part's header rides with its first
    chunk), each piece one ranged GET of the checked object version; a multi-range body
    reads :data:`MULTI_RANGE_CHUNK` at most at once."""
    most = MULTI_RANGE_CHUNK if len(pieces) > 1 else None
    for prefix, start, length in pieces:
        if length == 0:
            continue
        whole = start == 0 and length == info.size
        first = True
        async for data in fetcher.chunks(
            info.name, start, None if whole else start + length, info.etag, most
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


async def proxy_parts(
    request: web.Request,
    reader: BucketReader,
    verifier: ObjectVerifier,
    entry: FileEntry,
    headers: dict[str, str],
    ranges: list[ByteRange] | None,
    parts: list[tuple[str, str]],
    part_size: int,
) -> tuple[web.StreamResponse, int, str | None] | None:
    """Send the entry's blob (or its one range) from the parts of a fill whose whole hash
    matched, before the storage made the blob of them (spec 8.6): each part's GET, pinned
    with ``If-Match`` to the ETag hashed, spliced to the client in turn (the data plane
    of a blob, :func:`_spliced`), so no byte goes through Python. ``None`` before
    anything is sent when it cannot be done so (several ranges, a small body, a busy
    splice pool, ``https`` storage, a part already gone): the caller answers as it would
    without. A part that goes while its body is sent (the blob was made and the parts
    deleted) is followed by the same bytes of the blob, once known good; else the body is
    cut before its last byte."""
    response, pieces, _ = frame(headers, ranges, entry.size)
    if len(pieces) != 1 or pieces[0][2] < SPLICE_FROM or _splice.saturated():
        return None
    _, start, length = pieces[0]
    end = start + length
    store = reader.store

    async def open_at(pos: int) -> tuple[AloneBody | SharedBody, int]:
        """The body of the part holding byte ``pos``, up to that part's end (or ``end``)."""
        n = pos // part_size
        name, etag = parts[n]
        size = min(part_size, entry.size - n * part_size)
        url = store.objects.presigned_get_url(name, SIGNED_FOR)
        version = Version(store.url, name, etag, size, url, f"GET {store.url}{name}")
        at, count = pos - n * part_size, min(size, end - n * part_size) - (pos - n * part_size)
        body = await open_body(version, at, count)
        if body.length != count:
            body.close()
            raise ObjectStoreError(f"{version.where}: {body.length} bytes, not {count}")
        return body, count

    try:
        body, count = await open_at(start)
    except SpliceUnavailable:
        return None
    except ObjectStoreError:  # a part gone: the blob was made meanwhile (or the fill failed)
        return None
    sent = 0
    pos = start
    try:
        await response.prepare(request)  # a client gone before its headers left, too
        while True:
            try:
                await body.send_to(request.transport, count)
            except ObjectStoreError:
                pos += body.sent
                sent += body.sent
                break  # the rest from the blob
            finally:
                body.close()
            pos += count
            sent += count
            if pos >= end:
                break
            try:
                body, count = await open_at(pos)
            except (SpliceUnavailable, ObjectStoreError):
                break
        if pos < end:
            try:
                sent += await _rest_from_blob(request, reader, verifier, entry, pos, end)
            except (BlobUnavailable, ObjectStoreError, SpliceUnavailable) as exc:
                return response, sent, _cut(request, f"parts gone and no blob: {exc}")
        await response.write_eof()
    except ConnectionError:
        return response, sent, CLIENT_LEFT
    return response, sent, None


async def _rest_from_blob(
    request: web.Request,
    reader: BucketReader,
    verifier: ObjectVerifier,
    entry: FileEntry,
    pos: int,
    end: int,
) -> int:
    """Bytes ``[pos, end)`` of the entry's blob, known good, spliced to the client (a body
    sent from a fill's parts whose parts went: the blob was made of them); the bytes sent.
    :class:`BlobUnavailable` when the blob is not there or not known good yet."""
    info, ok = await ready(reader, verifier, entry)
    if not ok:
        raise BlobUnavailable("blob not checked yet")
    store = reader.store
    url = store.objects.presigned_get_url(info.name, SIGNED_FOR)
    where = f"GET {store.url}{info.name}"
    version = Version(store.url, info.name, info.etag, info.size, url, where)
    body = await open_body(version, pos, end - pos)
    try:
        if body.length != end - pos:
            raise ObjectStoreError(f"{where}: {body.length} bytes, not {end - pos}")
        try:
            await body.send_to(request.transport, end - pos)
        except ObjectStoreError:
            raise BlobUnavailable(f"storage read failed after {body.sent} bytes") from None
        return end - pos
    finally:
        body.close()
