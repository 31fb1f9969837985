"""One hash of a filling blob for every whole body a worker sends from the same reads
(``spec/hub-mirror.md`` 8.3, "One hash per worker").

Both kinds share their readers' reads within a worker: a bucket's segments (one GET
each) and a folder's reads of the partial file (one ``pread`` each). A read is a bytes
object held in memory with a serial (:func:`new_serial`): the identity of those bytes.
Readers of a whole body offer each read they send, in order, to the worker's
:class:`SharedHash` of that fill (:func:`shared_hash`), which hashes the blob once from
the reads it takes; a read it took vouches for every reader that sends that same object.
Issue 37: every whole body hashed on its own cost 0.6 CPU-s per GiB per client.
"""

from __future__ import annotations

import array
import asyncio
import bisect
import itertools
from collections import deque
from typing import Any

from cachetools import LRUCache
from cmh.hub.cache import new_digest

#: Reads a shared hash may hold taken and not hashed yet (its readers wait for room).
HASH_BEHIND = 2
#: Shared hashes one worker keeps (fills whose whole bodies it sends; least recent go
#: first: a reader holds its own).
BODY_HASHES = 256

_SERIALS = itertools.count(1)


def new_serial() -> int:
    """A serial no other read of this process has: the identity of a read's bytes."""
    return next(_SERIALS)


class SharedHash:
    """The hash of a filling blob over the reads this worker's whole bodies send, computed
    once for all of them.

    Readers offer each read they send, in order (:meth:`offer`). The hash has taken the
    blob's bytes up to a point, its frontier. A read that starts at the frontier is taken
    whole (hashed, one thread at a time, in order; its offset and serial kept) and vouched
    for. A read that starts before it is vouched for only when it is a read taken whole
    (the same offset and serial); if it reaches past the frontier, its bytes past the
    frontier are taken (so that the hash always reaches the end while any reader does),
    and the read is not vouched for. A reader checks a read not vouched for itself, as a
    range. :meth:`matched` tells, once every byte is hashed, whether the bytes taken hash
    to the blob's ETag. Runs on one event loop.
    """

    def __init__(self, etag: str, size: int) -> None:
        self.etag, self.size = etag, size
        self.hashed = 0  # views hashed so far
        self._digest = new_digest(etag, size)
        self._frontier = 0  # bytes taken
        self._at = array.array("Q")  # the offset of each read taken whole, ascending
        self._serials = array.array("Q")  # its serial
        self._waiting: deque[memoryview] = deque()  # taken, not hashed yet
        self._hashing = False
        self._done = 0  # bytes hashed
        loop = asyncio.get_running_loop()
        self._outcome: asyncio.Future[bool] = loop.create_future()
        self._progress = asyncio.Event()

    def belongs_to(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self._outcome.get_loop() is loop

    def offer(self, pos: int, serial: int, data: bytes) -> bool:
        """True when the read ``data`` at ``pos`` (serial ``serial``) is, or will be,
        hashed here as it is: taken now when it starts at the frontier, else a read taken
        whole before."""
        end = min(pos + len(data), self.size)
        if pos > self._frontier or end <= pos:
            return False
        if pos < self._frontier:
            i = bisect.bisect_left(self._at, pos)
            if i < len(self._at) and self._at[i] == pos and self._serials[i] == serial:
                return True
            if end > self._frontier:  # the reads taken end inside this one
                self._take(memoryview(data)[self._frontier - pos : end - pos])
            return False
        self._at.append(pos)
        self._serials.append(serial)
        self._take(memoryview(data)[: end - pos])
        return True

    def _take(self, view: memoryview) -> None:
        self._frontier += len(view)
        if self._outcome.done():  # a hash that failed: nothing more to hash
            return
        self._waiting.append(view)
        self._pump()

    def _pump(self) -> None:
        if self._hashing or not self._waiting:
            return
        self._hashing = True
        view = self._waiting[0]
        done = asyncio.get_running_loop().run_in_executor(None, self._digest.update, view)
        done.add_done_callback(self._hashed_one)

    def _hashed_one(self, done: asyncio.Future[None]) -> None:
        self._hashing = False
        view = self._waiting.popleft()
        self._progress.set()
        if done.cancelled() or done.exception() is not None:
            self._waiting.clear()
            if not self._outcome.done():
                self._outcome.set_result(False)
            return
        self.hashed += 1
        self._done += len(view)
        if self._done == self.size and not self._outcome.done():
            self._outcome.set_result(self._digest.hexdigest() == self.etag)
        self._pump()

    async def offer_in_turn(self, pos: int, serial: int, data: bytes) -> bool:
        """:meth:`offer`, once there is room for it (:meth:`room`): how readers offer."""
        await self.room(pos, len(data))
        return self.offer(pos, serial, data)

    async def room(self, pos: int, length: int) -> None:
        """Before a read of ``length`` bytes at ``pos`` is offered: wait, if the offer
        would take bytes, while more than :data:`HASH_BEHIND` reads wait to be hashed (the
        bytes a shared hash holds are bounded; an offer of bytes already taken adds
        nothing, and does not wait)."""
        while (
            pos + length > self._frontier
            and len(self._waiting) > HASH_BEHIND
            and not self._outcome.done()
        ):
            self._progress.clear()
            await self._progress.wait()

    async def matched(self) -> bool:
        """Whether the bytes taken hash to the ETag (waits until every byte is hashed: each
        reader vouched for offered every read before it asks, so a hash that did not take
        the whole blob is never complete, and vouches for nothing)."""
        if self._frontier < self.size:
            return False
        return await asyncio.shield(self._outcome)


#: The shared hash of each fill this worker's readers send whole (the key is the kind's).
_HASHES: LRUCache[Any, SharedHash] = LRUCache(BODY_HASHES)


def shared_hash(key: Any, etag: str, size: int) -> SharedHash:
    """The worker's shared hash of the fill ``key`` (made now unless kept on this loop)."""
    found = _HASHES.get(key)
    if found is None or not found.belongs_to(asyncio.get_running_loop()):
        found = _HASHES[key] = SharedHash(etag, size)
    return found
