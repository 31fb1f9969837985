"""Serve a blob while the pull-through mirror fills it: one upstream transfer, bytes as they arrive.

The first request for a blob the store lacks starts its fill
(:meth:`~cmh.hub.mirror._upstream.Upstream.fill`, done by the store's
pull-through side: a folder's resolver download into
``blobs/{etag}.incomplete``, or a bucket's part objects under the fleet's fill
lease, ``spec/hub-mirror.md`` 8.6). Every request for that blob in this worker
joins the same fill; a fill run by another worker, process or replica is
joined by waiting for it (the blob lock, or the bucket's lease).

A filling answer sends its headers at once and then reads what has arrived
(the store's :class:`~cmh.hub.mirror.stores.FillReader`): each byte is sent
as soon as it is stored, so a client's read timeout never fires while the
upstream is sending. Range requests are answered from what arrived (waiting
for the bytes they ask for). The last byte of every body waits for a check of
what was sent: the SHA-256 (or git blob id) of a whole body, computed while
it is sent (or once for the worker's bodies that send the same reads held in
memory, :meth:`FillReader.voucher`), must be the ETag; each range
sent must equal the same range of the installed, checked blob (so a range waits
for the fill). Otherwise the
connection is cut before that byte, so no client ever holds a complete body
that fails the blob's check; and the fill installs nothing unchecked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast

from aiohttp import web
from cmh.hub.cache import new_digest

from ._errors import HubError, printable
from ._memo import Memo
from ._send import BodyCut
from ._state import STORE_KEY
from ._upstream import NEGATIVE_FOR, Outcome
from .stores import BodyHash, FillFailed, FillReader, SentRanges

if TYPE_CHECKING:
    from ._index import FileEntry
    from ._upstream import Upstream

CHUNK = 1 << 20
MAX_FILLS = 16  # fills running at once in one worker (each holds a thread while it transfers)
#: Fills started and not ended in one worker (each holds a thread, running or waiting for
#: a slot): past this, a request for another blob answers 503 until some end.
MAX_PENDING_FILLS = 256
#: Outcomes of failed fills kept per worker (for ``NEGATIVE_FOR`` s; least recent go first).
MAX_FAILED_FILLS = 4096

logger = logging.getLogger("cmh.hub.mirror")


class BodyRefused(BodyCut):
    """A whole body sent from a fill was cut because its digest is not the ETag: the
    fill's bytes, so far, are not the blob's."""


class Fills:
    """The fills running in one worker: one per blob, shared by every request for it."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._slots = threading.BoundedSemaphore(MAX_FILLS)
        self._running: dict[Path, asyncio.Future[None]] = {}  # one per fill under way
        #: Running fills whose bytes a client's whole-body check refused (a subset of
        #: ``_running``, dropped with it).
        self._refused: dict[Path, asyncio.Future[None]] = {}
        self.clock = upstream.clock.monotonic  # the negative cache's (tests move it)
        #: What each recently failed fill answers (an outcome, never the exception).
        self._failed: Memo[Path, Outcome] = Memo(
            MAX_FAILED_FILLS, ttl=NEGATIVE_FOR, timer=lambda: self.clock()
        )

    def refused(self, blob: Path, fill: asyncio.Future[None]) -> None:
        """A client's whole-body check refused what ``fill`` sent: no request joins it
        any more (it would be cut in turn), each waits it out (:meth:`wait_out_refused`)."""
        if self._running.get(blob) is fill and not fill.done():
            self._refused[blob] = fill

    async def wait_out_refused(self, blob: Path) -> bool:
        """Wait for the end of ``blob``'s fill if its bytes were refused (whatever its
        outcome: a folder's resolver may download again and succeed; the fill's own
        deadlines bound the wait); True when it waited. Cancelling the caller leaves the
        fill running."""
        fill = self._refused.get(blob)
        if fill is None or fill.done():
            return False
        await asyncio.wait([fill])
        return True

    def recent_failure(self, blob: Path) -> Outcome | None:
        """The outcome of a fill of ``blob`` that failed less than ``NEGATIVE_FOR`` s ago."""
        return self._failed.get(blob)

    def start(
        self, repo_type: str, repo_id: str, commit: str, path: str, blob: Path
    ) -> asyncio.Future[None]:
        """The fill of ``blob`` (started now unless one is running); await it shielded."""
        running = self._running.get(blob)
        if running is not None:
            return running
        if len(self._running) >= MAX_PENDING_FILLS:
            message = f"{MAX_PENDING_FILLS} fills are under way in this worker: try again soon"
            raise HubError(503, "UpstreamUnavailable", message, {"Retry-After": "5"})
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if fut.done():
                return
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

        def work() -> None:
            # A daemon thread, not an executor's: a server told to stop must not wait for
            # a transfer in flight; its partial file stays and the next fill resumes it.
            error: BaseException | None = None
            with self._slots:
                try:
                    self.upstream.fill(repo_type, repo_id, commit, path)
                except BaseException as exc:  # every waiter hears the outcome
                    error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, error)

        threading.Thread(target=work, name="cmh-fill", daemon=True).start()
        self._running[blob] = fut

        def done(f: asyncio.Future[None]) -> None:
            if self._running.get(blob) is f:
                del self._running[blob]
            if self._refused.get(blob) is f:
                del self._refused[blob]
            if not f.cancelled():
                error = f.exception()  # retrieved: reported to each waiter
                if error is not None:
                    outcome = _outcome(error, self.clock())
                    self._failed.put(blob, outcome)
                    if outcome.status >= 500:  # the operator's to know (a 4xx is the repo's)
                        said = printable(outcome.message)
                        logger.warning("fill of %s/%s failed (%d): %s",
                                       repo_id, path, outcome.status, said)  # fmt: skip
                else:
                    self._failed.drop(blob)

        fut.add_done_callback(done)
        return fut


def _outcome(error: BaseException, at: float) -> Outcome:
    """What the clients of a failed fill hear: the upstream's answer, else a 502 (the
    blob failed its check)."""
    if isinstance(error, HubError):
        return Outcome.of(error, at)
    message = f"the upstream's blob failed its check: {error}"
    return Outcome(502, "UpstreamProtocolError", message, {}, at)


async def send_filling(
    request: web.BaseRequest,
    response: web.StreamResponse,
    fill: asyncio.Future[None],
    source: FillReader,
    entry: FileEntry,
    pieces: list[tuple[bytes, int, int]],
    tail: bytes = b"",
) -> int:
    """Send ``(prefix, offset, count)`` pieces of ``entry``'s filling blob, then ``tail``;
    bytes sent.

    ``response`` is prepared. The last byte is sent only once the fill has
    installed the blob and what was sent is checked against it; otherwise the
    connection is aborted and :class:`~cmh.hub.mirror._send.BodyCut` raised.
    """
    etag, size = entry.etag, entry.size
    whole = len(pieces) == 1 and pieces[0][1] == 0 and pieces[0][2] == size and not tail
    checks = _Checks(new_digest(etag, size) if whole else None)
    last = max((i for i, (_, _, count) in enumerate(pieces) if count > 0), default=None)
    sent = 0
    try:
        for i, (prefix, offset, count) in enumerate(pieces):
            if prefix:
                await response.write(prefix)
                sent += len(prefix)
            held = 1 if (i == last and not tail) else 0
            pos, end = offset, offset + count
            while pos < end - held:
                with _awaiting_bytes(request):
                    data = await source.read(pos, min(CHUNK, end - held - pos))
                await response.write(data)
                await checks.add(pos, data, source.voucher())
                pos += len(data)
                sent += len(data)
            if held:
                with _awaiting_bytes(request):
                    data = await source.read(pos, 1)
                await checks.add(pos, data, source.voucher())
                checks.end_range()
                await _gate(request, fill, source, checks, etag, sent)
                await response.write(data)
                sent += 1
            else:
                checks.end_range()
        if tail:
            await _gate(request, fill, source, checks, etag, sent)
            await response.write(tail)
            sent += len(tail)
    except FillFailed:
        _cut(request)
        raise BodyCut(sent) from None
    finally:
        source.close()
    await response.write_eof()
    return sent


class _Checks:
    """What a filling body's byte gate checks of the bytes it sent: a whole body's own
    digest; else the ranges it hashed (each compared with the installed blob) and the
    worker's shared hashes of the whole blob that vouch for the rest.

    A whole body whose first bytes a shared hash vouches for (:meth:`FillReader.voucher`:
    the same reads, bytes objects held for every reader of the worker) hashes
    nothing it is vouched for; a read of it not vouched for is hashed as a range."""

    def __init__(self, digest: hashlib._Hash | None) -> None:
        self.digest = digest  # a whole body's own, while it is hashed whole
        self.ranges: SentRanges = []  # (offset, count, SHA-256) of each range hashed
        self.shared: list[BodyHash] = []  # the hashes vouching for the bytes not hashed
        self._whole = digest is not None
        self._start: int | None = None  # the offset of the range being hashed, if any
        self._count = 0  # its bytes so far
        self._range_hash = hashlib.sha256()

    async def add(self, pos: int, data: bytes | memoryview, voucher: BodyHash | None) -> None:
        """Account for ``data``, sent at ``pos``."""
        if self._whole and pos == 0 and voucher is not None:
            self.digest = None  # vouched from its first byte: hashed only where not vouched
        if self.digest is not None:
            await _hash(data, self.digest)
            return
        if self._whole and voucher is not None:
            self.end_range()
            if not any(v is voucher for v in self.shared):
                self.shared.append(voucher)
            return
        if self._start is None:
            self._start, self._count, self._range_hash = pos, 0, hashlib.sha256()
        await _hash(data, self._range_hash)
        self._count += len(data)

    def end_range(self) -> None:
        """The range being hashed ends here (a piece's end, or vouched bytes follow)."""
        if self._start is not None and self._count:
            self.ranges.append((self._start, self._count, self._range_hash))
        self._start = None


async def _hash(data: bytes | memoryview, digest: hashlib._Hash) -> None:
    """Feed ``digest`` in a worker thread (hashlib releases the GIL): the loop keeps sending."""
    if len(data) < 1 << 16:
        digest.update(data)
    else:
        await asyncio.get_running_loop().run_in_executor(None, digest.update, data)


def _cut(request: web.BaseRequest) -> None:
    if request.transport is not None:
        request.transport.abort()


def _awaiting_bytes(request: web.BaseRequest) -> contextlib.AbstractContextManager[None]:
    """While a filling body waits for bytes the fill has not stored yet, its deadline
    stands still (:meth:`~cmh.hub.mirror._connections.ConnectionGuard.waiting_for_bytes`):
    an upstream slower than the clients' minimum rate is the fill's to judge, not a
    client's stall."""
    guard = cast("web.Request", request).app[STORE_KEY].guard  # every request has its app
    if guard is None:
        return contextlib.nullcontext()
    return guard.waiting_for_bytes(request.transport)


async def _gate(
    request: web.BaseRequest,
    fill: asyncio.Future[None],
    source: FillReader,
    checks: _Checks,
    etag: str,
    sent: int,
) -> None:
    """Cut the connection unless what was sent is the blob's.

    A whole body is decided by its own digest (the ETag), or by the shared hashes that
    vouch for its bytes: no need to wait for the fill's install. Ranges (and the
    segments of a whole body no shared hash vouches for) are compared with the
    installed, checked blob, so they wait for the fill.
    """
    if checks.digest is not None:
        if checks.digest.hexdigest() != etag:
            _cut(request)
            raise BodyRefused(sent)
        return
    for shared in checks.shared:
        with _awaiting_bytes(request):  # the worker's hash of the rest of the blob
            matched = await shared.matched()
        if not matched:
            _cut(request)
            raise BodyRefused(sent)
    if checks.ranges:
        try:
            with _awaiting_bytes(request):  # the rest of the blob: the fill's pace
                await asyncio.shield(fill)
        except Exception:  # the fill failed: nothing was installed
            _cut(request)
            raise BodyCut(sent) from None
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, source.ranges_match, checks.ranges):
            _cut(request)
            raise BodyCut(sent)
