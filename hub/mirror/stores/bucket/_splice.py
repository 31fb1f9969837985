"""The proxy's data plane for a body it need not read: the storage's socket spliced to the
client's (``splice(2)`` through a pipe, in the kernel), no byte through Python.

The control plane stays in :mod:`~cmh.hub.mirror.stores.bucket._send`: which object version,
the check, the held-back last byte. This module opens one plain-HTTP GET of a presigned URL
(:meth:`StorageBody.open`, a thread), reports its status before the client's headers go out,
and moves a count of body bytes to the client's socket (:meth:`StorageBody.send_to`). A
thread of the pool waits for the storage (bounded by :data:`STORAGE_STALL`) and for a
client only briefly (:data:`CLIENT_BRIEF`): a move returns once the client's socket stays
full, and the body waits for the socket to take bytes again on the event loop (at most
:data:`CLIENT_STALL` each time), holding no thread. So a client that reads nothing cannot
fill the pool, and one that reads keeps its body on the thread. While the pool is busy
(:func:`saturated`) the caller streams through Python instead of queueing for a thread, so
a busy pool never delays an answer's headers. The client's socket is used through a
duplicate of its descriptor, so a transport closed meanwhile never lets bytes go to a
reused descriptor. ``https`` storage, chunked answers and platforms without
``os.splice`` raise :class:`SpliceUnavailable`: the caller streams through Python instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar
from urllib.parse import urlsplit

from ._objectstore import ObjectNotFound, ObjectStoreError, PreconditionFailed

#: Seconds the storage may stay silent (connect, answer, each read) before the read fails.
STORAGE_STALL = 60.0
#: Seconds a client may take no byte before its body is given up (it went away).
CLIENT_STALL = 300.0
#: Seconds a move's thread waits for a full client socket to take bytes again before it
#: gives the thread back (the body then waits on the event loop): a client that reads
#: keeps its body on the thread, with no round trip through the loop per socket-full,
#: while one that reads nothing holds a thread this long at most, once per wait.
CLIENT_BRIEF = 0.05
#: Bytes of the pipe between the two sockets (and of each splice call).
PIPE_SIZE = 1 << 20
#: Bytes an answer's status line and headers may take.
MAX_HEAD = 64 << 10
#: Threads moving bodies at once (each waits only for the storage, holding no lock);
#: ``CMH_SPLICE_THREADS`` sets another number (read when the pool is made).
MAX_THREADS = 256
THREADS_ENV = "CMH_SPLICE_THREADS"
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_MORE", 0)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
T = TypeVar("T")
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_jobs = [0]  # jobs handed to the pool and not ended (under ``_jobs_lock``)
_jobs_lock = threading.Lock()


class SpliceUnavailable(Exception):
    """This body cannot be spliced here; stream it through Python."""


def available() -> bool:
    return hasattr(os, "splice")


def threads() -> ThreadPoolExecutor:
    """The pool whose threads open storage GETs and move bodies' ready bytes."""
    global _pool, _pool_size
    if _pool is None:
        try:
            size = int(os.environ.get(THREADS_ENV, "") or MAX_THREADS)
        except ValueError:
            size = MAX_THREADS
        _pool_size = max(1, size)
        _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="cmh-splice")
    return _pool


def saturated() -> bool:
    """Whether every thread of the pool is taken (a new job would wait in its queue)."""
    threads()
    with _jobs_lock:
        return _jobs[0] >= _pool_size


def _ended(_: object) -> None:
    with _jobs_lock:
        _jobs[0] -= 1


def _submit(fn: Callable[..., T], *args: object) -> Future[T]:
    """``fn(*args)`` handed to the pool, counted until it ends, for :func:`saturated`."""
    job = threads().submit(fn, *args)
    with _jobs_lock:
        _jobs[0] += 1
    job.add_done_callback(_ended)
    return job


async def in_thread(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a thread of the pool (it runs on when its caller is cancelled)."""
    return await asyncio.wrap_future(_submit(fn, *args))


async def writable(fd: int, timeout: float) -> None:
    """Wait on the event loop until the socket ``fd`` takes bytes (or failed: the next write
    says how); :class:`ConnectionResetError` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout)
    except asyncio.TimeoutError:
        raise ConnectionResetError(f"client: took nothing for {timeout:.0f} s") from None
    finally:
        loop.remove_writer(fd)


def wait_ready(fd: int, events: int, timeout: float, what: str) -> None:
    """Wait until ``fd`` has ``events``; :class:`TimeoutError` after ``timeout`` seconds."""
    poller = select.poll()
    poller.register(fd, events | select.POLLERR | select.POLLHUP)
    ready = poller.poll(timeout * 1000)
    if not ready:
        raise TimeoutError(f"{what}: nothing for {timeout:.0f} s")


def briefly_writable(fd: int) -> bool:
    """Whether the socket ``fd`` takes bytes (or failed: the next write says how) within
    :data:`CLIENT_BRIEF` seconds (in a move's thread)."""
    try:
        wait_ready(fd, select.POLLOUT, CLIENT_BRIEF, "client")
    except TimeoutError:
        return False
    return True


def from_storage(source: int, pipe: int, count: int, where: str) -> int:
    """Splice up to ``count`` bytes of the storage's socket ``source`` into ``pipe``
    (waiting at most :data:`STORAGE_STALL` for them); how many. :class:`ObjectStoreError`
    when the storage fails, stays silent, or ends the body early."""
    while True:
        try:
            got = os.splice(source, pipe, count, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            try:
                wait_ready(source, select.POLLIN, STORAGE_STALL, where)
            except TimeoutError as exc:
                raise ObjectStoreError(str(exc)) from None
            continue
        except OSError as exc:
            raise ObjectStoreError(f"{where}: {exc}") from None
        if not got:
            raise ObjectStoreError(f"{where}: the storage ended the body early")
        return got


async def to_client(
    transport: asyncio.BaseTransport | None, move: Callable[[int, int], int], count: int
) -> None:
    """Move ``count`` bytes to the client behind ``transport``, once the transport's own
    buffer (the response's headers) is out: ``move(client, left)`` runs in a thread of the
    pool on a duplicate of the client's descriptor and returns how many bytes it moved,
    fewer than ``left`` only when the client's socket is full; the body then waits on the
    event loop, holding no thread, until the socket takes bytes again (at most
    :data:`CLIENT_STALL`). :class:`ConnectionResetError` when the client went away."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if transport is None or sock is None or transport.is_closing():
        raise ConnectionResetError("client went away")
    for _ in range(int(CLIENT_STALL * 1000)):
        if not transport.get_write_buffer_size():  # type: ignore[attr-defined]
            break
        if transport.is_closing():
            raise ConnectionResetError("client went away")
        await asyncio.sleep(0.001)
    else:
        raise ConnectionResetError("client took nothing")
    client = os.dup(sock.fileno())
    job: Future[int] | None = None
    try:
        left = count
        while True:
            job = _submit(move, client, left)
            left -= await asyncio.wrap_future(job)
            if not left:
                return
            if transport.is_closing():
                raise ConnectionResetError("client went away")
            await writable(client, CLIENT_STALL)
    finally:
        if job is not None and not job.done():  # cancelled: its thread still uses ``client``
            job.add_done_callback(lambda _: os.close(client))
        else:
            os.close(client)


class StorageBody:
    """One GET of a presigned URL on a plain socket, its answer's head read, its body not."""

    def __init__(self, sock: socket.socket, length: int, where: str, early: bytes) -> None:
        self.sock = sock
        self.length = length  # body bytes the storage announced
        self.where = where
        self.early = early  # body bytes that came with the head (sent first)
        self.sent = 0  # body bytes moved to the client so far
        self.pipe: tuple[int, int] | None = None  # read end, write end (made at first move)
        self.piped = 0  # body bytes in the pipe, read from the storage, not yet sent
        # A move's thread may outlive its caller (cancelled): the socket and the pipe are
        # closed by whichever of close() and that move ends last, never under a move.
        self._guard = threading.Lock()
        self._moving = False
        self._closed = False

    @classmethod
    async def open(
        cls, url: str, start: int, end: int | None, etag: str, where: str, name: str
    ) -> StorageBody:
        """GET bytes ``[start, end)`` of the object version ``etag``: :class:`PreconditionFailed`
        (another version), :class:`ObjectNotFound`, :class:`ObjectStoreError` otherwise."""
        if not available() or urlsplit(url).scheme != "http":
            raise SpliceUnavailable(url)
        ranged = bool(start or end is not None)
        return await in_thread(
            cls.connect, url, (start, end) if ranged else None, etag, where, name
        )

    @classmethod
    def connect(
        cls, url: str, span: tuple[int, int | None] | None, etag: str, where: str, name: str
    ) -> StorageBody:
        """:meth:`open`, blocking, ``span`` the range (``None``: the whole object)."""
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}", f"If-Match: {etag}",
                 "Accept-Encoding: identity", "Connection: close", "User-Agent: cmh"]  # fmt: skip
        if span is not None:
            lines.append(f"Range: bytes={span[0]}-{'' if span[1] is None else span[1] - 1}")
        try:
            sock = socket.create_connection(
                (parts.hostname or "127.0.0.1", parts.port or 80), timeout=STORAGE_STALL
            )
        except OSError as exc:
            raise ObjectStoreError(f"{where}: {type(exc).__name__}: {exc}") from None
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            status, headers, early = cls._head(sock, where)
        except OSError as exc:
            sock.close()
            raise ObjectStoreError(f"{where}: {type(exc).__name__}: {exc}") from None
        except BaseException:
            sock.close()
            raise
        try:
            if status == 412:
                raise PreconditionFailed(f"{where}: precondition failed (412)", name)
            if status == 404:
                raise ObjectNotFound(f"{where}: no such object", name)
            if status != (200 if span is None else 206):
                raise ObjectStoreError(f"{where}: {status}")
            if "chunked" in headers.get("transfer-encoding", "").lower():
                raise SpliceUnavailable(where)
            declared = headers.get("content-length")
            if declared is None:
                raise SpliceUnavailable(where)
            if not (declared.isascii() and declared.isdigit()):  # "12a", "-1", "²"
                raise ObjectStoreError(f"{where}: Content-Length {declared[:40]!r}")
            length = int(declared)
            if len(early) > length:
                raise SpliceUnavailable(where)
        except BaseException:
            sock.close()
            raise
        return cls(sock, length, where, early)

    @staticmethod
    def _head(sock: socket.socket, where: str) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and the body bytes read with them (at most a few KiB)."""
        seen = b""
        while (end := seen.find(b"\r\n\r\n")) < 0:
            if len(seen) >= MAX_HEAD:
                raise ObjectStoreError(f"{where}: answer head over {MAX_HEAD} bytes")
            more = sock.recv(MAX_HEAD)
            if not more:
                raise ObjectStoreError(f"{where}: the storage closed the connection")
            seen += more
        status_line, *rest = seen[:end].decode("latin-1").split("\r\n")
        try:
            status = int(status_line.split(" ", 2)[1])
        except (IndexError, ValueError):
            raise ObjectStoreError(f"{where}: not an HTTP answer: {status_line[:80]!r}") from None
        headers = {}
        for line in rest:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        return status, headers, seen[end + 4 :]

    async def send_to(self, transport: asyncio.BaseTransport | None, count: int) -> None:
        """Move the next ``count`` body bytes to the client behind ``transport`` (whose own
        buffer is flushed first); :class:`ConnectionResetError` when the client went away,
        :class:`ObjectStoreError` when the storage failed (``sent`` tells how far it got)."""
        await to_client(transport, self.move, count)

    def move(self, client: int, count: int) -> int:
        """Splice up to ``count`` next body bytes to the socket ``client``; how many, fewer
        only when the client's socket is full (the bytes read from the storage meanwhile
        wait in the body's pipe for the next call). Waits for the storage only."""
        with self._guard:
            if self._closed:
                raise ConnectionResetError("the body was closed")
            self._moving = True
        try:
            return self._move(client, count)
        finally:
            with self._guard:
                self._moving = False
                closed = self._closed
            if closed:
                self._release()

    def _move(self, client: int, count: int) -> int:
        done = self._write_early(client, count)
        if self.early and done < count:
            return done
        if self.pipe is None:
            self.pipe = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            with contextlib.suppress(OSError):
                fcntl.fcntl(self.pipe[1], F_SETPIPE_SZ, PIPE_SIZE)
        r, w = self.pipe
        source = self.sock.fileno()
        while done < count:
            if not self.piped:  # never more than the caller asked (a last byte held back)
                self.piped = from_storage(source, w, min(count - done, PIPE_SIZE), self.where)
            while self.piped:
                try:
                    out = os.splice(r, client, self.piped, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    if briefly_writable(client):
                        continue
                    return done
                except OSError as exc:  # EPIPE, ECONNRESET: the client went away
                    raise ConnectionResetError(str(exc)) from None
                self.piped -= out
                self.sent += out
                done += out
        return done

    def _write_early(self, client: int, count: int) -> int:
        """Send up to ``count`` of the body bytes that came with the head; how many."""
        data = memoryview(self.early)[:count]
        done = 0
        while done < len(data):
            try:
                done += os.write(client, data[done:])
            except BlockingIOError:
                if briefly_writable(client):
                    continue
                break
            except OSError as exc:
                raise ConnectionResetError(str(exc)) from None
        self.early = self.early[done:]
        self.sent += done
        return done

    def close(self) -> None:
        """Close the storage's socket and the pipe (once a move under way ended)."""
        with self._guard:
            self._closed = True
            if self._moving:
                return
        self._release()

    def _release(self) -> None:
        self.sock.close()
        if self.pipe is not None:
            os.close(self.pipe[0])
            os.close(self.pipe[1])
            self.pipe = None
