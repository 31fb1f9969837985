"""Send a blob, whole or by byte ranges, with the kernel's sendfile where the loop allows.

The caller frames the response; this module sends its headers and moves the bytes.
On a plain TCP connection a span of at least :data:`THREADED_MIN` bytes leaves from
the worker's sender thread, which sends every such span of the process as nginx's loop
does: non-blocking ``sendfile`` calls of at most :data:`CALL_MAX` (:data:`SHARED_CALL_MAX`
while other spans share the thread), each ready span in turn, and one ``epoll`` wait for
room when none can take more. No event-loop work per
socket buffer (which cost a worker more CPU than the copy itself), and no thread
sleeping per connection: with 16 clients under load, a thread per span was often
scheduled late (best of 3: 0.61x and 0.81x nginx, once 1.13x) where this thread
made 0.94-1.01x in the same runs (docs/mirror.md). If it ever fails, its bodies are
cut and the next span gets a new thread. Shorter spans go through
``loop.sendfile``, with a chunked read fallback when the transport cannot do it; the
connection is corked (``TCP_CORK``) from the headers to the body's end, so headers and
first bytes share a segment.
Several ranges are sent as ``multipart/byteranges`` (RFC 9110 section 14.6), each
part by sendfile.

A *gate* (an async check) may guard the last byte of a body: it runs once
everything else is sent, and when it fails the connection is cut, so the
client holds an incomplete body (which it discards) rather than a complete
one that differs from its ETag (a folder store's delivery gates on its blob check).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import os
import secrets
import select
import socket
import stat
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from cmh.hub.cache import process_clock

from ._errors import CLIENT_LEFT as CLIENT_LEFT  # re-exported: the senders' vocabulary
from ._errors import BlobUnavailable as BlobUnavailable
from ._ranges import ByteRange

_FALLBACK_CHUNK = 1 << 20
#: A span of a body at least this long leaves from a sender thread (more than a
#: loopback socket buffer holds: a shorter one is one ``sendfile`` on the loop anyway).
THREADED_MIN = 4 << 20
#: Spans the sender thread of one worker process sends at once (each holds two
#: descriptors); a span finding none free goes through the loop.
SENDER_SPANS = 32
#: Bytes one ``sendfile`` call sends at most for a span alone in its sender thread
#: (nginx's default ``sendfile_max_chunk``).
CALL_MAX = 2 << 20
#: Bytes one call sends at most while other spans share the thread, each ready span a
#: call in turn: the bodies' readers get their bytes in shorter, more frequent turns.
#: With 16 parallel GETs on 2 cores the server spent 30% less CPU per GiB than with
#: 2 MiB calls, its clients 14% less (docs/mirror.md, "Performance").
SHARED_CALL_MAX = 512 << 10
#: Seconds the sender thread waits for room at most before it looks whether a span's
#: connection was closed (aborted, cut or gone) meanwhile.
_ROOM_WAIT = 0.2
_PLAIN_TRANSPORT: type | None = getattr(
    asyncio.selector_events, "_SelectorSocketTransport", None
)  # a TCP socket transport of the stdlib loop: no TLS layer between the bytes and the socket


#: Checked before the last byte of a body is sent; False cuts the connection.
Gate = Callable[[], Awaitable[bool]]


class ClientLeft(ConnectionResetError):
    """The client went away mid-body (``sent``: the body bytes written before)."""

    def __init__(self, sent: int) -> None:
        super().__init__(CLIENT_LEFT)
        self.sent = sent


class BodyCut(ConnectionResetError):
    """The gate failed: the connection was cut before the body's last byte."""

    def __init__(self, sent: int) -> None:
        super().__init__("the blob changed while it was sent: connection cut")
        self.sent = sent


def open_blob(path: Path, size: int) -> io.FileIO:
    """Open a blob for reading without following a final symlink, nor blocking on a FIFO
    or device put in its place (``O_NONBLOCK``, cleared once it is known regular); check
    type and size."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BlobUnavailable(f"blob unavailable: {exc.strerror}") from None
    f = io.FileIO(fd, "rb", closefd=True)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        f.close()
        raise BlobUnavailable("blob is not a regular file of the expected size")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
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


#: A body's pieces: ``(prefix, offset, count)``, a part header and a span of the file.
Pieces = list[tuple[bytes, int, int]]


def frame(
    headers: dict[str, str], ranges: list[ByteRange] | None, size: int
) -> tuple[web.StreamResponse, Pieces, bytes]:
    """The response (status, length, range headers) of a ``size``-byte file's body, the
    pieces it is made of and its closing tail (``b""`` but for a multipart body)."""
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


async def send_body(
    request: web.BaseRequest,
    response: web.StreamResponse,
    f: io.FileIO,
    ranges: list[tuple[bytes, int, int]],
    tail: bytes = b"",
    gate: Gate | None = None,
) -> int:
    """Send ``response``'s headers, then ``(prefix, offset, count)`` pieces then ``tail``;
    return the body bytes sent.

    With a ``gate``, the last byte (of the tail if any, else of the last piece) is
    sent only if the gate passes; otherwise the connection is aborted and
    :class:`BodyCut` raised. A client that leaves raises :class:`ClientLeft`.
    """
    sender = _Sender(request, response, f)
    with _corked(request.transport):
        try:  # a client gone before its headers is a client that left, too
            await response.prepare(request)
            return await _send_pieces(sender, ranges, tail, gate)
        except BodyCut:
            raise
        except ConnectionError as exc:
            raise ClientLeft(sender.sent) from exc


@contextlib.contextmanager
def _corked(transport: asyncio.BaseTransport | None) -> Iterator[None]:
    """``TCP_CORK`` on the connection while a body is sent, as nginx's ``tcp_nopush``:
    the kernel sends only full segments, not one per ``sendfile`` piece (aiohttp sets
    ``TCP_NODELAY``). With 8 concurrent 1 GiB bodies on a loaded 2-core machine it cut
    the wall time by a third (16-17 s against 10-11.5 s). Uncorked at the end, so the
    last segment leaves at once; a no-op where the option or the socket is missing."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    option = getattr(socket, "TCP_CORK", None)
    corked = False
    if sock is not None and option is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, 1)
            corked = True
        except OSError:
            pass
    try:
        yield
    finally:
        if corked and sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, 0)


async def _send_pieces(sender: _Sender, ranges: Pieces, tail: bytes, gate: Gate | None) -> int:
    response = sender.response
    last = max((i for i, (_, _, count) in enumerate(ranges) if count > 0), default=None)
    for i, (prefix, offset, count) in enumerate(ranges):
        if prefix:
            await response.write(prefix)
            sender.sent += len(prefix)
        if count == 0:
            continue
        if gate is not None and not tail and i == last:
            await sender.file(offset, count - 1)
            await sender.through(gate)
            await sender.file(offset + count - 1, 1)
        else:
            await sender.file(offset, count)
    if tail:
        if gate is not None:
            await sender.through(gate)
        await response.write(tail)
        sender.sent += len(tail)
    await response.write_eof()
    return sender.sent


class _Sender:
    """Moves file bytes to one response: sendfile, or reads when the transport cannot."""

    def __init__(self, request: web.BaseRequest, response: web.StreamResponse, f: io.FileIO):
        self.request = request
        self.response = response
        self.f = f
        self.sent = 0
        self.use_sendfile = True

    async def file(self, offset: int, count: int) -> None:
        if count == 0:
            return
        transport = self.request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError(CLIENT_LEFT)
        loop = asyncio.get_running_loop()
        if self.use_sendfile and count >= THREADED_MIN and await self._threaded(offset, count):
            return
        if self.use_sendfile:
            self.f.seek(offset)  # sendfile leaves the file at offset + bytes sent, also on error
            try:
                await loop.sendfile(transport, self.f, offset, count, fallback=False)
                self.sent += count
                return
            except (NotImplementedError, asyncio.SendfileNotAvailableError):
                self.use_sendfile = False
            except ConnectionError:  # the client left: count what reached its socket
                self.sent += max(0, self.f.tell() - offset)
                raise
        self.sent += await _copy(loop, self.response, self.f, offset, count)

    async def _threaded(self, offset: int, count: int) -> bool:
        """Send a span from the sender thread; False (nothing sent) when the connection is
        not a plain socket with nothing queued, or no slot is free."""
        transport = self.request.transport
        if transport is None or _PLAIN_TRANSPORT is None:
            return False
        if not isinstance(transport, _PLAIN_TRANSPORT):
            return False
        taken = None if transport.get_write_buffer_size() else _SENDERS.take()
        if taken is None:
            return False
        mux, slot = taken
        # The thread owns duplicates of both descriptors: a handler cancelled meanwhile
        # closes the file and the loop may close the socket, never under the thread.
        sock = transport.get_extra_info("socket")
        try:
            conn = sock.dup()
            try:
                file_fd = os.dup(self.f.fileno())
            except OSError:
                conn.close()
                raise
        except OSError:
            slot.release()
            return False
        span = _Span(conn, file_fd, offset, count, transport.is_closing, slot)
        reading = transport.is_reading()
        transport.pause_reading()  # as loop.sendfile: the request that follows waits
        try:
            sent, error = await asyncio.wrap_future(mux.submit(span))
        except asyncio.CancelledError:
            # a shut socket ends the span at the thread's next call (the body is half
            # sent: the connection is done with anyway), not once the loop closed it
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            raise
        finally:
            if reading and not transport.is_closing():
                transport.resume_reading()
        self.sent += sent
        if isinstance(error, _Shrank):
            transport.abort()
            raise BodyCut(self.sent)
        if isinstance(error, SenderFailed):
            transport.abort()  # the body cannot end: never leave the client waiting
        if error is not None:
            raise error
        return True

    async def through(self, gate: Gate) -> None:
        if await gate():
            return
        transport = self.request.transport
        if transport is not None:
            transport.abort()
        raise BodyCut(self.sent)


class _Shrank(Exception):
    """The file ended before the span: it changed while it was sent."""


@dataclass(frozen=True)
class _Span:
    """A span of a file the sender thread sends: descriptors it owns (and closes), how
    it learns that its connection was closed, and its slot."""

    sock: socket.socket
    file_fd: int
    offset: int
    count: int
    closing: Callable[[], bool]
    slot: threading.BoundedSemaphore


class _Mux:
    """A worker process's sender thread: the large spans of all its connections, each
    sent by non-blocking ``sendfile`` calls in turn (at most :data:`CALL_MAX` for a span
    alone, :data:`SHARED_CALL_MAX` while others share the thread), and an ``epoll`` wait
    for room when none can take more (nginx's loop)."""

    def __init__(self) -> None:
        self._clock = process_clock()  # the cadence of the look for clients that left
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._incoming: list[tuple[_Span, Future[tuple[int, BaseException | None]]]] = []
        #: The thread failed: its spans were ended with the error, a new one takes over.
        self.broken = False
        threading.Thread(target=self._run, name="cmh-sendfile", daemon=True).start()

    def submit(self, span: _Span) -> Future[tuple[int, BaseException | None]]:
        """Send ``span``; the future's result: bytes sent, what stopped it (None: all)."""
        done: Future[tuple[int, BaseException | None]] = Future()
        with self._lock:
            broken = self.broken
            if not broken:
                self._incoming.append((span, done))
        if broken:
            _end([_Active(span, done)], SenderFailed())
            return done
        with contextlib.suppress(BlockingIOError):  # a full pipe wakes the thread anyway
            os.write(self._wake_w, b"\0")
        return done

    def _run(self) -> None:
        active: dict[int, _Active] = {}
        try:
            self._serve(active)
        except BaseException:  # no span may wait on a thread that is gone
            with self._lock:
                self.broken = True
                incoming, self._incoming = self._incoming, []
            _end([*active.values(), *(_Active(s, d) for s, d in incoming)], SenderFailed())
            raise

    def _serve(self, active: dict[int, _Active]) -> None:
        ready: dict[int, None] = {}  # insertion-ordered: each ready span a call per round
        looked = self._clock.monotonic()
        while True:
            wait = None if not active else 0 if ready else _ROOM_WAIT
            for fd, _ in self._epoll.poll(wait):
                if fd == self._wake_r:
                    self._take_incoming(active, ready)
                elif fd in active:
                    ready[fd] = None
            for fd in list(ready):
                self._step(active, ready, fd)
            if active and self._clock.monotonic() - looked >= _ROOM_WAIT:
                looked = self._clock.monotonic()
                for fd in [fd for fd, got in active.items() if got.span.closing()]:
                    self._finish(active, ready, fd, ConnectionResetError(CLIENT_LEFT))

    def _step(self, active: dict[int, _Active], ready: dict[int, None], fd: int) -> None:
        """One ``sendfile`` call for a ready span."""
        got = active[fd]
        span = got.span
        most = CALL_MAX if len(active) == 1 else SHARED_CALL_MAX
        try:
            n = os.sendfile(
                fd, span.file_fd, span.offset + got.sent, min(span.count - got.sent, most)
            )
        except BlockingIOError:  # full: the next edge of room makes it ready again
            del ready[fd]
            return
        except OSError as exc:
            self._finish(active, ready, fd, exc)
            return
        got.sent += n
        if n == 0:
            self._finish(active, ready, fd, _Shrank())
        elif got.sent == span.count:
            self._finish(active, ready, fd, None)

    def _take_incoming(self, active: dict[int, _Active], ready: dict[int, None]) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for span, done in incoming:
            got = _Active(span, done)
            if not done.set_running_or_notify_cancel():
                got.close()
                continue
            fd = span.sock.fileno()
            active[fd] = got
            try:
                self._epoll.register(fd, select.EPOLLOUT | select.EPOLLET)
            except OSError as exc:
                self._finish(active, ready, fd, exc)
                continue
            ready[fd] = None

    def _finish(
        self,
        active: dict[int, _Active],
        ready: dict[int, None],
        fd: int,
        error: BaseException | None,
    ) -> None:
        got = active.pop(fd)
        ready.pop(fd, None)
        with contextlib.suppress(OSError):
            self._epoll.unregister(fd)
        got.close()
        got.done.set_result((got.sent, error))


class SenderFailed(RuntimeError):
    """The sender thread failed (a bug): its bodies are cut, the next gets a new thread."""

    def __init__(self) -> None:
        super().__init__("the sender thread failed: connection cut")


def _end(spans: list[_Active], error: BaseException) -> None:
    """End spans the sender thread will not send: descriptors closed, futures told."""
    for got in spans:
        got.close()
        with contextlib.suppress(RuntimeError, InvalidStateError):  # cancelled or told
            if got.done.running() or got.done.set_running_or_notify_cancel():
                got.done.set_result((got.sent, error))


@dataclass
class _Active:
    """A span the sender thread is sending, and the bytes sent so far."""

    span: _Span
    done: Future[tuple[int, BaseException | None]]
    sent: int = 0
    closed: bool = False

    def close(self) -> None:
        """Close the span's descriptors and give its slot back (once)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            self.span.sock.close()
        with contextlib.suppress(OSError):
            os.close(self.span.file_fd)
        self.span.slot.release()


class _Senders:
    """A worker process's sender thread and its free slots (made anew after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: tuple[int, _Mux, threading.BoundedSemaphore] | None = None

    def take(self) -> tuple[_Mux, threading.BoundedSemaphore] | None:
        """The sender thread and a slot taken in it (the span releases it), or None: none
        free."""
        with self._lock:
            if self._made is None or self._made[0] != os.getpid():
                self._made = (os.getpid(), _Mux(), threading.BoundedSemaphore(SENDER_SPANS))
            elif self._made[1].broken:
                self._made = (os.getpid(), _Mux(), self._made[2])
            _, mux, slots = self._made
        return (mux, slots) if slots.acquire(blocking=False) else None


_SENDERS = _Senders()


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
