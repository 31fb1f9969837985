"""Concurrent proxied bodies of one object version, one storage read per worker
(spec/hub-mirror.md 7.6, "Shared reads").

When a worker already sends a spliced body of an object version and another request for
that version arrives, the second starts a *shared read*: one GET of the whole version
(pinned with ``If-Match``, as every GET of the proxy) whose bytes the kernel moves from the
storage's socket into an unnamed temporary file (``O_TMPFILE`` in the temporary folder,
``TMPDIR``: gone with the process, whatever way it ends) at their own offsets. Each body
that joins is sent from that file with ``sendfile(2)`` as its bytes arrive, at its own
pace; no byte goes through Python, and the storage serves the version once however many
clients fetch it together. A lone client keeps its own spliced GET (a shared read costs a
write into the page cache that one body does not need) until a shared read of its version
starts: it then moves onto the read once the read reaches its place (:class:`AloneBody`).

The bytes every joined body has sent are dropped from the file (``fallocate`` punches a
hole, at multiples of :data:`PUNCH`). A byte is never written twice: ``sendfile`` queues
the page itself, not a copy, so a file reused in place would send what was written there
later. A body joins while the bytes it starts at are still in the file and at most
:data:`JOIN_AHEAD` past what arrived. A storage error ends the read: each body that needs
a byte that never arrived fails with :class:`ObjectStoreError` (its caller cuts the
connection, as for a spliced body). A read that cannot write its file (a full disk) or
whose every body left stops; a body still joined then goes on with a GET of its own from
where it is (:class:`~cmh.hub.mirror.stores.bucket._splice.StorageBody`).

Bounded: at most :data:`MAX_SHARED` reads per worker, of :data:`SHARED_BYTES` of objects
in all; a read ends when its last body leaves. The registry lives on the worker's event
loop; a read's positions are guarded by one :class:`threading.Condition`, shared by the
read's thread and the threads of its bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import tempfile
import threading
from dataclasses import dataclass, field

from cmh import libc_function

from . import _splice
from ._objectstore import ObjectStoreError
from ._splice import StorageBody

#: Shared reads a worker runs at once.
MAX_SHARED = 16
#: Bytes of objects a worker's shared reads may hold in all (their files' size at most).
SHARED_BYTES = 16 << 30
#: Holes are punched at multiples of this (no page a queued ``sendfile`` may still hold is
#: ever zeroed in part, huge pages included).
PUNCH = 4 << 20
#: How far past the bytes that arrived a body may start and still join.
JOIN_AHEAD = 8 << 20
#: Bytes per splice into the file and per ``sendfile`` out of it.
CHUNK = 1 << 20
#: Bytes a body on its own GET sends between two looks for a shared read to move onto.
LOOK_EVERY = 4 << 20


@dataclass(frozen=True)
class Version:
    """One object version as the proxy fetches it: the presigned ``url``, its storage
    ``etag`` (every GET carries ``If-Match``), its ``size``, and names for errors."""

    store: str  # the store's URL: the registry's key is per store
    name: str
    etag: str
    size: int
    url: str
    where: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.store, self.name, self.etag)


@dataclass(eq=False)
class _Member:
    """A body's place in a read: ``pos`` is its next byte to send."""

    pos: int
    attached: bool = True  # False once it goes on with a GET of its own
    in_call: bool = False  # a sendfile of the file's bytes from ``pos`` is running
    closed: bool = False


@dataclass(eq=False)
class SharedRead:
    """One GET of a whole object version, its bytes kept in a file until every joined
    body sent them."""

    version: Version
    fd: int
    loop: asyncio.AbstractEventLoop
    opened: asyncio.Future[None]  # the GET's answer head was read (or it failed)
    cond: threading.Condition = field(default_factory=threading.Condition)
    members: list[_Member] = field(default_factory=list)
    arrived: int = 0  # bytes of the object in the file (or sent and dropped)
    punched: int = 0  # bytes dropped from the file (every body sent them)
    error: str | None = None  # why the storage's read failed
    stopped: bool = False  # no byte more will arrive: its file failed, or every body left
    ended: bool = False  # the read's thread is done
    task: asyncio.Task[None] | None = None  # opens the GET, then waits for the thread

    # -- under ``cond`` --------------------------------------------------------------
    def _floor(self) -> int:
        """The first byte the file must still hold."""
        held = [m.pos for m in self.members if (m.attached and not m.closed) or m.in_call]
        return min(held, default=self.arrived)

    # -- on the event loop, or a body's thread ---------------------------------------
    def try_join(self, start: int) -> _Member | None:
        """A place for a body starting at ``start``, or ``None`` when its bytes are gone
        from the file, too far ahead, or the read failed or stopped."""
        with self.cond:
            if self.error is not None or self.stopped or self.fd < 0:
                return None
            if not self.punched <= start <= self.arrived + JOIN_AHEAD:
                return None
            member = _Member(start)
            self.members.append(member)
            return member

    def leave(self, member: _Member) -> None:
        with self.cond:
            member.closed = True
            member.attached = False
            if not member.in_call and member in self.members:
                self.members.remove(member)
            self.cond.notify_all()

    # -- the read's thread ---------------------------------------------------------
    def fill(self, body: StorageBody) -> None:
        """Move the object's bytes from ``body``'s socket into the file (a thread)."""
        size = self.version.size
        r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        fd = os.dup(self.fd)
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(w, _splice.F_SETPIPE_SZ, CHUNK)
            if body.early:
                os.pwrite(fd, body.early, 0)
                self._arrived(fd, len(body.early))
            source = body.sock.fileno()
            while self.arrived < size:
                at = self.arrived
                got = _splice.from_storage(source, w, min(CHUNK, size - at), body.where)
                moved = 0
                while moved < got:  # an error here is the file's (its disk): a stop
                    moved += os.splice(r, fd, got - moved, offset_dst=at + moved)
                if not self._arrived(fd, got):
                    break
        except ObjectStoreError as exc:
            with self.cond:
                self.error = str(exc)
        except OSError:
            pass
        finally:
            os.close(r)
            os.close(w)
            os.close(fd)
            body.close()
            with self.cond:
                if self.arrived < size:
                    self.stopped = True
                self.ended = True
                self.cond.notify_all()

    def _arrived(self, fd: int, count: int) -> bool:
        """Count ``count`` more bytes in the file and drop the bytes every body sent;
        False when every body left (the read stops)."""
        with self.cond:
            self.arrived += count
            self.cond.notify_all()
            if not any(not m.closed for m in self.members):
                self.stopped = True
                return False
        self.drop_sent(fd)
        return True

    def drop_sent(self, fd: int) -> None:
        """Drop the bytes every body still joined has sent (in whole :data:`PUNCH`
        pieces), through ``fd``, a descriptor of the file (the read's or a body's
        thread)."""
        with self.cond:
            floor = min(self._floor(), self.arrived)
            start, self.punched = self.punched, max(self.punched, floor - floor % PUNCH)
            stop = self.punched
        if stop > start:  # outside the lock: no body reads below ``punched`` any more
            _punch(fd, start, stop)


def _punch(fd: int, start: int, stop: int) -> None:
    """Drop bytes ``[start, stop)`` of the file (pages a queued ``sendfile`` still holds
    stay whole: they leave the file, not the socket). A failure, or no ``fallocate``
    (Python's ``os`` has none with a mode), keeps the bytes."""
    fallocate = libc_function(
        "fallocate", (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    )
    if fallocate is not None:
        fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, start, stop - start)


_PUNCH_HOLE, _KEEP_SIZE = 0x02, 0x01


class SharedBody:
    """A body sent from a :class:`SharedRead` (the interface of
    :class:`~cmh.hub.mirror.stores.bucket._splice.StorageBody`: ``length``, ``sent``,
    :meth:`send_to`, :meth:`close`); once its read stopped, from a GET of its own."""

    def __init__(
        self, read: SharedRead, member: _Member, version: Version, start: int, length: int
    ) -> None:
        self.read = read
        self.version = version  # this body's own URL (signed for it), if its read stops
        self.member = member
        self.start = start
        self.length = length
        self.sent = 0
        self.own: StorageBody | None = None  # the GET of its own, once its read stopped

    async def send_to(self, transport: asyncio.BaseTransport | None, count: int) -> None:
        """Move the next ``count`` body bytes to the client behind ``transport``;
        :class:`ConnectionResetError` when it went away, :class:`ObjectStoreError` when
        the storage failed."""
        await _splice.to_client(transport, self._send, count)

    def _send(self, client: int, count: int) -> int:
        """Move up to ``count`` bytes; how many, fewer only when the client's socket is full."""
        done, stopped = self._from_file(client, count)
        if done == count or not stopped:
            return done
        if self.own is None:
            version = self.version
            at, end = self.start + self.sent, self.start + self.length
            self.own = StorageBody.connect(
                version.url, (at, end), version.etag, version.where, version.name
            )
            if self.own.length != end - at:
                raise ObjectStoreError(f"{version.where}: {self.own.length} bytes, not {end - at}")
        before = self.own.sent
        try:
            self.own.move(client, count - done)
        finally:
            self.sent += self.own.sent - before
        return done + self.own.sent - before

    def _from_file(self, client: int, count: int) -> tuple[int, bool]:
        """Send up to ``count`` bytes from the file while joined: how many, and whether the
        read stopped (the body goes on with its own GET). Returns early, not stopped, when
        the client's socket is full."""
        read, member = self.read, self.member
        done = 0
        fd = os.dup(read.fd)  # the file stays open while this thread reads it
        try:
            while done < count:
                with read.cond:
                    while member.attached and read.arrived <= member.pos:
                        if member.closed:
                            raise ConnectionResetError("client went away")
                        if read.error is not None:
                            raise ObjectStoreError(read.error)
                        if read.stopped:  # no byte more will come: a GET of its own
                            member.attached = False
                            break
                        if not read.cond.wait(_splice.STORAGE_STALL):
                            raise ObjectStoreError(
                                f"{read.version.where}: nothing for {_splice.STORAGE_STALL:.0f} s"
                            )
                    if member.closed:
                        raise ConnectionResetError("client went away")
                    if not member.attached:
                        return done, True
                    at = member.pos
                    n = min(count - done, read.arrived - at, CHUNK)
                    member.in_call = True
                out = 0
                try:
                    out = os.sendfile(client, fd, at, n)
                except BlockingIOError:
                    pass
                except OSError as exc:  # EPIPE, ECONNRESET: the client went away
                    raise ConnectionResetError(str(exc)) from None
                finally:
                    with read.cond:
                        member.in_call = False
                        member.pos += out
                        if member.closed and member in read.members:  # closed while it sent
                            read.members.remove(member)
                            read.loop.call_soon_threadsafe(_release, read)
                        read.cond.notify_all()
                done += out
                self.sent += out
                read.drop_sent(fd)
                if not out and not _splice.briefly_writable(client):
                    return done, False  # the client's socket stays full: its wait holds no thread
            return done, False
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.own is not None:
            self.own.close()
        self.read.leave(self.member)
        _release(self.read)


#: The worker's shared reads, by (store, object, storage ETag); on its event loop only.
_READS: dict[tuple[str, str, str], SharedRead] = {}
#: Shared reads alive (a replaced read lives on until its bodies left) and their bytes.
_live = [0, 0]
#: Spliced bodies of each version that run on their own GET (a second one starts a read).
_ALONE: dict[tuple[str, str, str], list[Alone]] = {}


@dataclass(eq=False)
class Alone:
    """A body of ``version`` on a GET of its own, registered while it runs: a shared read of
    the version that starts meanwhile is announced in ``read`` (set on the event loop, read
    by the body's thread), and the body moves onto it once it reaches the body's place."""

    version: Version
    read: SharedRead | None = None


def _alone(version: Version) -> Alone:
    """Register a body of ``version`` that runs on its own GET (:func:`_done_alone` once it
    ended)."""
    slot = Alone(version)
    _ALONE.setdefault(version.key, []).append(slot)
    return slot


def _done_alone(slot: Alone) -> None:
    slots = _ALONE.get(slot.version.key, [])
    if slot in slots:
        slots.remove(slot)
    if not slots:
        _ALONE.pop(slot.version.key, None)


class AloneBody:
    """A body on a GET of its own (:class:`StorageBody`'s interface) that moves onto a shared
    read of its version once one is announced and has reached the body's place: the rest
    of its bytes then come from the read's file, and its own GET is closed."""

    def __init__(self, body: StorageBody, slot: Alone, start: int) -> None:
        self.body = body
        self.slot = slot
        self.start = start
        self.length = body.length
        self.shared: SharedBody | None = None

    @property
    def sent(self) -> int:
        return self.body.sent + (self.shared.sent if self.shared is not None else 0)

    async def send_to(self, transport: asyncio.BaseTransport | None, count: int) -> None:
        """As :meth:`StorageBody.send_to`."""
        await _splice.to_client(transport, self._send, count)

    def _send(self, client: int, count: int) -> int:
        """Move up to ``count`` bytes; how many, fewer only when the client's socket is full."""
        done = 0
        while done < count and self.shared is None:
            # Steps end on whole multiples of LOOK_EVERY of the body, also after a call
            # that returned early (a full socket): a step that ran on past such a place
            # could wait, in the storage, on its own GET stalled right there, never
            # looking at a shared read that holds those bytes already.
            step = min(count - done, LOOK_EVERY - self.body.sent % LOOK_EVERY)
            moved = self.body.move(client, step)
            done += moved
            if moved < step:
                return done
            self._look()
        if done < count:
            assert self.shared is not None
            done += self.shared._send(client, count - done)
        return done

    def _look(self) -> None:
        """Move onto the announced shared read if it holds (or nearly holds) this body's
        next byte (in the body's thread; joining is guarded by the read's lock)."""
        read = self.slot.read
        at = self.start + self.body.sent
        if read is None or at >= self.start + self.length:
            return
        member = read.try_join(at)
        if member is not None:
            self.shared = SharedBody(read, member, self.slot.version, at,
                                     self.start + self.length - at)  # fmt: skip
            self.body.close()

    def close(self) -> None:
        """Close its GET (and its place in a shared read) and unregister it (on the event
        loop)."""
        self.body.close()
        if self.shared is not None:
            self.shared.close()
        _done_alone(self.slot)


async def open_body(version: Version, start: int, length: int) -> AloneBody | SharedBody:
    """The body of bytes ``[start, start + length)`` of ``version``: from a shared read of
    the version when another body of it runs on this worker (spec 7.6, "Shared reads"),
    else from a GET of its own, registered as such until it is closed (and moved onto a
    shared read that starts meanwhile, once the read reaches it). Raises what
    :meth:`StorageBody.open` raises."""
    shared = await open_shared(version, start, length)
    if shared is not None:
        return shared
    whole = start == 0 and length == version.size
    slot = _alone(version)  # from now: a body of the version arriving meanwhile starts a read
    try:
        body = await StorageBody.open(
            version.url, start, None if whole else start + length, version.etag,
            version.where, version.name,
        )  # fmt: skip
    except BaseException:
        _done_alone(slot)
        raise
    return AloneBody(body, slot, start)


async def open_shared(version: Version, start: int, length: int) -> SharedBody | None:
    """A body of bytes ``[start, start + length)`` sent from a shared read of ``version``,
    or ``None``: no read to join, and none worth starting (no other body of the version
    runs on this worker, the body starts past :data:`JOIN_AHEAD`, the worker's reads are at
    :data:`MAX_SHARED` or :data:`SHARED_BYTES`, or no temporary file can be made). Raises
    what :meth:`StorageBody.open` raises when the read's GET fails."""
    read = _READS.get(version.key)
    member = read.try_join(start) if read is not None else None
    if read is None or member is None:
        if not _ALONE.get(version.key) or start > JOIN_AHEAD:
            return None
        if _live[0] >= MAX_SHARED or _live[1] + version.size > SHARED_BYTES:
            return None
        read = _start(version)
        if read is None:
            return None
        member = read.try_join(start)
        assert member is not None
    try:
        await asyncio.shield(read.opened)
    except BaseException:
        read.leave(member)
        _release(read)
        raise
    return SharedBody(read, member, version, start, length)


def _start(version: Version) -> SharedRead | None:
    """Register a read of ``version`` and open its GET in a task of its own (a body that
    leaves meanwhile does not fail the others); ``None`` when its file cannot be made."""
    try:
        fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        os.ftruncate(fd, version.size)  # sparse: pages come as bytes arrive, go as holes
    except OSError:
        os.close(fd)
        return None
    loop = asyncio.get_running_loop()
    read = SharedRead(version, fd, loop, loop.create_future())
    read.opened.add_done_callback(_seen)
    _READS[version.key] = read
    for slot in _ALONE.get(version.key, []):
        slot.read = read  # each body on its own GET may move onto it
    _live[0] += 1
    _live[1] += version.size
    read.task = loop.create_task(_run(read))
    return read


async def _run(read: SharedRead) -> None:
    version = read.version
    try:
        body = await StorageBody.open(
            version.url, 0, None, version.etag, version.where, version.name
        )
        if body.length != version.size:
            body.close()
            raise ObjectStoreError(f"{version.where}: {body.length} bytes, not {version.size}")
    except BaseException as exc:
        with read.cond:
            read.error = f"{type(exc).__name__}: {exc}"
            read.ended = True
        stopped = ObjectStoreError(f"{version.where}: stopped")
        failed = exc if isinstance(exc, Exception) else stopped
        read.opened.set_exception(failed)
        _release(read)
        if failed is not exc:
            raise
        return
    read.opened.set_result(None)
    try:
        await _splice.in_thread(read.fill, body)
    finally:
        _release(read)


def _seen(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _release(read: SharedRead) -> None:
    """Drop a read once its thread ended and no body is joined (on the event loop)."""
    with read.cond:
        if not read.ended or read.members or read.fd < 0:
            return
        fd, read.fd = read.fd, -1
    if _READS.get(read.version.key) is read:
        del _READS[read.version.key]
    _live[0] -= 1
    _live[1] -= read.version.size
    os.close(fd)
