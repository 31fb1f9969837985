"""A bucket fill's parts: read by this process's readers the moment they are stored (no
poll interval waited), and made into the blob by the storage (no second upload)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bucket_support import S3_KINDS, S3Proxy, open_store, use_bucket
from cmh.hub.cache import Clock
from cmh.hub.mirror._gitobjects import lfs_pointer_oid, tree_oids
from cmh.hub.mirror._upstream import Upstream, UpstreamConfig
from cmh.hub.mirror.stores import open_store as open_mirror_store
from cmh.hub.mirror.stores.bucket import _bucket, _pull
from cmh.hub.mirror.stores.bucket._bucket import TreeFile, TreeObject
from cmh.hub.mirror.stores.bucket._objectstore import ObjectNotFound, PreconditionFailed
from cmh.hub.mirror.stores.bucket._store import BucketBackedStore
from deadline_support import TEST_DEADLINE
from hostile_upstream import COMMIT, HostileHub
from processes import free_port, stop_process
from seaweed import SeaweedBucket

PART = _pull.PART


@pytest.mark.parametrize("kind", S3_KINDS)
def test_a_local_reader_is_woken_when_a_part_is_stored(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the poll interval an hour, a reader waiting for part 1 gets it as soon as the
    fill thread stores it (the wait below is only a bound on a broken run)."""
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    store = open_store(bucket)
    monkeypatch.setattr(_pull, "READ_POLL", 3600.0)
    fills = "models--t--parts/.cmh/fills/abc"
    size = PART + 1000
    data = os.urandom(size)
    store.objects.put(f"{fills}/part-000000", data[:PART])

    async def main() -> bytes:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tail = _pull.PartTail(store.objects, "models--t--parts/blobs/abc", fills, size, fill)
        try:
            assert await tail.read(0, 10) == data[:10]
            reading = asyncio.ensure_future(tail.read(PART, 1000))
            await asyncio.sleep(0)  # it looks, finds nothing, and waits

            def store_part() -> None:
                store.objects.put(f"{fills}/part-000001", data[PART:])
                _pull.part_stored(fills)

            threading.Thread(target=store_part).start()
            return await asyncio.wait_for(reading, timeout=60)
        finally:
            tail.close()

    assert asyncio.run(main()) == data[PART:]


@pytest.mark.parametrize("kind", S3_KINDS)
def test_compose_makes_the_parts_the_blob_and_refuses_a_changed_part(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    objects = open_store(bucket).objects
    a, b = os.urandom(5 << 20), os.urandom(1000)
    parts = [("p/a", objects.put("p/a", a)), ("p/b", objects.put("p/b", b))]
    etag, confirmed = objects.compose(parts, "blob")
    assert confirmed and objects.get("blob") == a + b
    assert objects.head("blob").etag.strip('"') == etag.strip('"')
    assert objects.compose(parts[1:], "one")[1]  # a single part: one server-side copy
    assert objects.get("one") == b
    objects.put("p/b", b"X" * 1000)  # changed after it was hashed
    for chosen in (parts, parts[1:]):
        try:
            _, confirmed = objects.compose(chosen, "bad")
        except PreconditionFailed:  # the storage honoured the pin: nothing made
            with pytest.raises(ObjectNotFound):
                objects.head("bad")
        else:  # a storage that ignores it (moto's server): the copy is not confirmed
            assert not confirmed
    assert objects.list_uploads() == ()  # no upload left open


def test_hashed_parts_are_named_only_by_a_record_of_the_blobs_size_and_parts(
    moto_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a filled blob is composed, its parts are sent as the blob by the ETags of the
    fill's ``hashed`` record (spec 8.6). A record is taken only when it is the blob's: its
    size, one ETag per part, each one a plain token (it goes into ``If-Match``)."""
    use_bucket(moto_bucket, tmp_path, monkeypatch)
    store = open_store(moto_bucket)
    folder, etag = "models--t--hashed", "a" * 64
    blob, fills = f"{folder}/blobs/{etag}", f"{folder}/.cmh/fills/{etag}"
    size = 2 * PART + 5
    assert _pull.hashed_parts(store, blob, size) is None  # no fill hashed it
    good = {"size": size, "etags": ['"e0"', '"e1"', '"e2"']}
    store.put_record(f"{fills}/hashed", json.dumps(good).encode())
    named = [(f"{fills}/part-{n:06d}", f'"e{n}"') for n in range(3)]
    assert _pull.hashed_parts(store, blob, size) == named
    bad: list[Any] = [
        {**good, "size": size + 1},
        {**good, "etags": good["etags"][:2]},
        {**good, "etags": ['"e0"', '"e1"\r\nX-Evil: 1', '"e2"']},
        {**good, "etags": ['"e0"', "", '"e2"']},
        {**good, "etags": ['"e0"', 7, '"e2"']},
        [size, good["etags"]],
    ]
    for doc in bad:
        store.put_record(f"{fills}/hashed", json.dumps(doc).encode())
        assert _pull.hashed_parts(store, blob, size) is None, doc
    store.put_record(f"{fills}/hashed", b"not json")
    assert _pull.hashed_parts(store, blob, size) is None


class _StillClock(Clock):
    """A clock whose monotonic time moves only when a test sets it."""

    now = 0.0

    def monotonic(self) -> float:
        return self.now


class _CountedGets:
    """The store's objects, counting the GETs of part objects (every call goes through)."""

    def __init__(self, objects: Any) -> None:
        self.objects = objects
        self.part_gets: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.objects, name)

    async def get_range_async(self, name: str, start: int, end: int) -> bytes:
        if "/part-" in name:
            self.part_gets.append(name)
        return await self.objects.get_range_async(name, start, end)


@pytest.mark.parametrize("kind", S3_KINDS)
def test_the_filling_process_sends_its_parts_from_memory_not_the_storage(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: the filling replica's readers GET no part back from the storage (they
    wait for it to be stored and take the bytes PUT), and once that fill ended (installed,
    failed or taken over) its parts are read from the storage again, never from memory."""
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    store = open_store(bucket)
    monkeypatch.setattr(_pull, "READ_POLL", 3600.0)  # no poll: only the signal wakes
    fills = f"models--t--mem/.cmh/fills/{kind}"
    size = PART + 1000
    data = os.urandom(size)
    counted = _CountedGets(store.objects)
    clock = _StillClock()  # the fill never stalls (LOCAL_STALL), whatever the load

    async def main() -> tuple[bytes, bytes]:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tail = _pull.PartTail(counted, "models--t--mem/blobs/x", fills, size, fill, clock)  # type: ignore[arg-type]
        _pull._STORED_PARTS.start(fills, 0, clock.now)  # as _Fill.run does after its resume
        try:
            reading = asyncio.ensure_future(tail.read(PART, 1000))
            await asyncio.sleep(0)  # it looks: not stored yet, so it waits (no GET)

            def fill_parts() -> None:
                writer = _pull._PartWriter(store.objects, fills, [], clock)
                writer.put(f"{fills}/part-000000", data[:PART])
                writer.put(f"{fills}/part-000001", data[PART:])
                writer.finish()

            await asyncio.wait_for(asyncio.to_thread(fill_parts), timeout=60)
            second = bytes(await asyncio.wait_for(reading, timeout=60))
            first = bytes(await tail.read(0, 10))
            return first, second
        finally:
            tail.close()
            _pull._STORED_PARTS.end(fills)

    first, second = asyncio.run(main())
    assert (first, second) == (data[:10], data[PART:])
    assert counted.part_gets == []
    # The fill ended (``main`` ended it as _Fill.run does): read from the storage again.
    store.objects.put(f"{fills}/part-000000", b"Y" * PART)

    async def again() -> bytes:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tail = _pull.PartTail(counted, "models--t--mem/blobs/x", fills, size, fill)  # type: ignore[arg-type]
        try:
            return bytes(await asyncio.wait_for(tail.read(0, 10), timeout=60))
        finally:
            tail.close()

    assert asyncio.run(again()) == b"Y" * 10
    # Part 0 from the storage (then part 1 read ahead, READ_AHEAD).
    assert counted.part_gets[:1] == [f"{fills}/part-000000"]
    assert counted.part_gets[1:] in ([], [f"{fills}/part-000001"])


@pytest.mark.parametrize("kind", S3_KINDS)
def test_readers_of_a_stalled_local_fill_look_at_the_storage(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fill of this process that stored nothing for LOCAL_STALL s (its lease may have been
    taken over: another replica ends the fill) no longer holds its readers: they read the
    part another replica stored."""
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    store = open_store(bucket)
    monkeypatch.setattr(_pull, "READ_POLL", 3600.0)
    fills = f"models--t--stall/.cmh/fills/{kind}"
    data = os.urandom(1000)
    store.objects.put(f"{fills}/part-000000", data)  # stored by another replica
    clock = _StillClock()
    counted = _CountedGets(store.objects)

    async def main() -> bytes:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tail = _pull.PartTail(counted, "models--t--stall/blobs/x", fills, 1000, fill, clock)  # type: ignore[arg-type]
        _pull._STORED_PARTS.start(fills, 0, clock.now)
        try:
            reading = asyncio.ensure_future(tail.read(0, 1000))
            await asyncio.sleep(0)
            assert not reading.done() and counted.part_gets == []  # waits for its fill
            clock.now += _pull.LOCAL_STALL  # nothing stored here since
            _pull.part_stored(fills)  # a wake-up (as READ_POLL's timeout would be)
            return bytes(await asyncio.wait_for(reading, timeout=60))
        finally:
            tail.close()
            _pull._STORED_PARTS.end(fills)

    assert asyncio.run(main()) == data
    assert counted.part_gets == [f"{fills}/part-000000"]


@pytest.mark.parametrize("kind", S3_KINDS)
def test_a_reader_of_another_replicas_fill_gets_the_next_parts_ahead(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: a waiting replica GOT each part only when its clients asked for it, so
    its clients waited a GET per part on top of the sending. Once a reader has a segment
    from the storage, the next READ_AHEAD parts are being read for the worker's readers:
    each part is still read once, and what is sent is the stored bytes."""
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    store = open_store(bucket)
    monkeypatch.setattr(_pull, "READ_POLL", 3600.0)
    fills = f"models--t--ahead/.cmh/fills/r{kind}"
    data = os.urandom(3 * PART + 10)
    for n in range(4):  # stored by another replica
        store.objects.put(f"{fills}/part-{n:06d}", data[n * PART : (n + 1) * PART])
    counted = _CountedGets(store.objects)
    names = [f"{fills}/part-{n:06d}" for n in range(4)]
    monkeypatch.setattr(_pull, "_SEGMENTS", _pull.LRUCache(_pull.KEPT_SEGMENTS))  # this worker's

    async def main() -> bytes:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tail = _pull.PartTail(counted, "models--t--ahead/blobs/y", fills, len(data), fill)  # type: ignore[arg-type]
        try:
            got = bytes(await asyncio.wait_for(tail.read(0, 10), timeout=TEST_DEADLINE))
            ahead = [
                t for (f, n, _), (_, t, _) in list(_pull._SEGMENTS.items()) if f == fills and n
            ]
            assert len(ahead) == _pull.READ_AHEAD == 2  # parts 1 and 2, under way
            await asyncio.wait_for(asyncio.gather(*ahead), timeout=TEST_DEADLINE)
            assert counted.part_gets == names[:3]
            for n in (1, 2, 3):
                got += bytes(await asyncio.wait_for(tail.read(n * PART, 10), timeout=TEST_DEADLINE))
            return got
        finally:
            tail.close()

    got = asyncio.run(main())
    assert got == b"".join(data[n * PART : n * PART + 10] for n in range(4))
    assert counted.part_gets == names  # each part read once


@pytest.mark.parametrize("others", [2, 6])
def test_parts_are_read_ahead_only_where_the_kept_segments_have_room(
    others: int, moto_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker keeps KEPT_SEGMENTS segments for all the fills it reads: with other fills
    read at once, a fill reads ahead only its share (none with KEPT_SEGMENTS fills), so no
    segment is read ahead only to be pushed out before it is sent (and read again)."""
    use_bucket(moto_bucket, tmp_path, monkeypatch)
    store = open_store(moto_bucket)
    fills = f"models--t--room/.cmh/fills/o{others}"
    data = os.urandom(2 * PART + 10)
    for n in range(3):
        store.objects.put(f"{fills}/part-{n:06d}", data[n * PART : (n + 1) * PART])
    counted = _CountedGets(store.objects)
    monkeypatch.setattr(_pull, "_SEGMENTS", _pull.LRUCache(_pull.KEPT_SEGMENTS))

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bytes | None] = loop.create_future()
        done.set_result(b"")
        for i in range(others):  # segments of other fills this worker reads
            _pull._SEGMENTS[(f"other-{i}", 0, None)] = (loop, done, 0)
        fill: asyncio.Future[None] = loop.create_future()
        tail = _pull.PartTail(counted, "models--t--room/blobs/z", fills, len(data), fill)  # type: ignore[arg-type]
        try:
            got = bytes(await asyncio.wait_for(tail.read(0, 10), timeout=TEST_DEADLINE))
            ahead = [
                t for (f, n, _), (_, t, _) in list(_pull._SEGMENTS.items()) if f == fills and n
            ]
            await asyncio.wait_for(asyncio.gather(*ahead), timeout=TEST_DEADLINE)
            return got
        finally:
            tail.close()

    assert asyncio.run(main()) == data[:10]
    share = max(0, _pull.KEPT_SEGMENTS // (others + 1) - 1)  # 1 beside 2 others, 0 beside 6
    assert counted.part_gets == [f"{fills}/part-{n:06d}" for n in range(1 + share)]


class _SlowFirstPart:
    """The store's objects, whose PUT of part 0 returns only once part 1's PUT has (a
    storage that is slow on one part); every call goes through."""

    def __init__(self, objects: Any) -> None:
        self.objects = objects
        self.second_stored = threading.Event()
        self.finished: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.objects, name)

    def put(self, name: str, data: bytes) -> str:
        if name.endswith("/part-000000"):
            # Bounded only to end a hang: one PUT at a time never gets here.
            assert self.second_stored.wait(TEST_DEADLINE), "part 1 was not PUT meanwhile"
        etag = self.objects.put(name, data)
        self.finished.append(name.rpartition("/")[2])
        if name.endswith("/part-000001"):
            self.second_stored.set()
        return str(etag)


@pytest.mark.parametrize("kind", S3_KINDS)
def test_a_fill_uploads_its_parts_at_once_and_tells_them_in_order(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: a fill PUT one part at a time, so each part waited for the storage's
    latency on the one before (the cold fleet's pace). Parts are now PUT at once: part 1
    is stored while part 0's PUT is still under way. A part is told stored only once every
    part before it is: the fill's list (which the blob is composed from) is in order, and
    this process's readers get both parts from memory, never a GET."""
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    store = open_store(bucket)
    monkeypatch.setattr(_pull, "READ_POLL", 3600.0)  # no poll: only the signal wakes
    fills = f"models--t--ahead/.cmh/fills/{kind}"
    data = os.urandom(PART + 1000)
    slow = _SlowFirstPart(store.objects)
    counted = _CountedGets(slow)
    clock = _StillClock()
    stored: list[tuple[str, str]] = []

    async def main() -> bytes:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tail = _pull.PartTail(counted, "models--t--ahead/blobs/x", fills, len(data), fill, clock)  # type: ignore[arg-type]
        _pull._STORED_PARTS.start(fills, 0, clock.now)
        try:
            reading = asyncio.ensure_future(tail.read(PART, 1000))
            await asyncio.sleep(0)

            def fill_parts() -> None:
                writer = _pull._PartWriter(slow, fills, stored, clock)
                writer.put(f"{fills}/part-000000", data[:PART])
                writer.put(f"{fills}/part-000001", data[PART:])
                writer.finish()

            await asyncio.wait_for(asyncio.to_thread(fill_parts), timeout=TEST_DEADLINE)
            second = bytes(await asyncio.wait_for(reading, timeout=TEST_DEADLINE))
            return bytes(await tail.read(0, 10)) + second
        finally:
            tail.close()
            _pull._STORED_PARTS.end(fills)

    assert asyncio.run(main()) == data[:10] + data[PART:]
    assert slow.finished == ["part-000001", "part-000000"]  # the second PUT ended first
    assert [name for name, _ in stored] == [f"{fills}/part-000000", f"{fills}/part-000001"]
    assert counted.part_gets == []
    for name, etag in stored:
        assert store.objects.head(name).etag.strip('"') == etag.strip('"')


def test_a_fill_holds_a_bounded_number_of_parts_while_one_put_is_slow(
    moto_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts stored after one still being PUT are held until it is (they are told in
    order): while part 0's PUT hangs, the fill hands over at most PUTS_AT_ONCE +
    PARTS_AHEAD parts, and the next waits (so the parts held in memory stay bounded,
    whatever the storage does), then every part is told in order."""
    use_bucket(moto_bucket, tmp_path, monkeypatch)
    store = open_store(moto_bucket)
    fills = "models--t--held/.cmh/fills/x"
    bound = _pull.PUTS_AT_ONCE + _pull.PARTS_AHEAD
    release, enough = threading.Event(), threading.Event()
    finished: list[str] = []
    handed: list[int] = []

    class Objects:
        def put(self, name: str, data: bytes) -> str:
            if name.endswith("/part-000000"):
                assert release.wait(TEST_DEADLINE)
            etag = store.objects.put(name, data)
            finished.append(name)
            if len(finished) == bound - 1:  # every part but part 0 that may be held
                enough.set()
            return str(etag)

    stored: list[tuple[str, str]] = []
    writer = _pull._PartWriter(Objects(), fills, stored, _StillClock())
    names = [f"{fills}/part-{n:06d}" for n in range(bound + 3)]

    def produce() -> None:
        for n, name in enumerate(names):
            writer.put(name, b"%d" % n)
            handed.append(n)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        assert enough.wait(TEST_DEADLINE)
        producer.join(0.2)  # a chance to hand over more: it must be waiting
        assert producer.is_alive() and len(handed) == bound, handed
    finally:
        release.set()
    producer.join(TEST_DEADLINE)
    writer.finish()
    assert [name for name, _ in stored] == names


class _LookClock(Clock):
    """Time that moves only when slept; ``on_sleep`` runs at each sleep (each look)."""

    def __init__(self, on_sleep: Any) -> None:
        self.now = 1000.0
        self.on_sleep = on_sleep

    def time(self) -> float:
        return self.now + 3600.0  # this replica's wall clock is an hour off: never read

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep()


@pytest.mark.parametrize("kind", S3_KINDS)
def test_a_replica_waiting_on_another_replicas_fill_asks_four_requests_per_look(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: a replica waiting while another fills the blob looks every FILL_POLL: the
    blob (HEAD), a ``failed`` record (GET), the lease (a refused PUT, then its GET). It
    asked seven requests a look: each look also probed the storage's clock with a scratch
    object (PUT, HEAD, DELETE). It is now probed once per LEASE_CLOCK_RESYNC s (2 s: 8
    looks) and counted on the replica's monotonic clock in between. The lease is still
    judged live on the storage's clock with this replica's wall clock an hour off."""
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    holder = open_store(bucket)
    folder, commit, data = "models--t--wait", "c" * 40, os.urandom(1000)
    etag = hashlib.sha256(data).hexdigest()
    entry = TreeFile("w.bin", len(data), etag, lfs_pointer_oid(etag, len(data)), etag)
    root = tree_oids({entry.path: entry.oid})[""]
    tree = TreeObject(commit, root, (), holder.storage_time(), (entry,))
    holder.objects.put(holder.tree_name(folder, commit), tree.to_bytes())
    lease = f"{holder.fill_name(folder, etag)}/lease"
    assert holder.take_lease(folder, "the filling replica", name=lease, ttl=600.0)
    proxy = S3Proxy(bucket.endpoint)
    looks: list[int] = []

    def look_ended() -> None:
        looks.append(len(proxy.exchanges))
        if len(looks) == 10:  # the other replica's fill ends: the blob is stored
            holder.objects.put(holder.blob_name(folder, etag), data)

    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)  # the same storage, counted
        waiter = BucketBackedStore(open_store(bucket, clock=_LookClock(look_ended)))
        pull = waiter.pull_through(60.0, fill_lease_ttl=600.0)
        pull.fill(None, "model", "t/wait", commit, "w.bin")  # waits, never fills
    finally:
        proxy.stop()
    per_look = [after - before for before, after in itertools.pairwise(looks)]
    assert _bucket.LEASE_CLOCK_RESYNC == 2.0
    assert per_look == [4] * 7 + [7, 4], per_look  # after the first look: 2 s, then a probe
    methods = [e.request.method for e in proxy.exchanges[looks[0] :]]
    look = ["HEAD", "GET", "PUT", "GET"]
    assert methods[:28] == look * 7 and methods[-5:] == [*look, "HEAD"], methods
    assert holder.objects.get(lease)  # never taken over: live on the storage's clock


def test_a_fill_has_its_compose_client_made_while_the_upstream_streams(
    moto_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: the botocore client that composes the parts into the blob was made at the
    end of each cold fill, its model files loaded on the critical path. A fill now has it
    made on a background thread when it starts: it exists before the upstream's bytes are
    taken (the transfer below waits for it, bounded), and it is the only one made."""
    import botocore.session

    use_bucket(moto_bucket, tmp_path, monkeypatch)
    backend = open_mirror_store(moto_bucket.url)
    made: list[str] = []
    ready = threading.Event()
    real_create = botocore.session.Session.create_client

    def create_client(session: Any, *args: Any, **kwargs: Any) -> Any:
        client = real_create(session, *args, **kwargs)
        made.append(threading.current_thread().name)
        ready.set()
        return client

    monkeypatch.setattr(botocore.session.Session, "create_client", create_client)
    real_transfer = _pull._Fill._transfer
    waited: list[bool] = []

    def transfer(fill: Any) -> None:
        waited.append(ready.wait(TEST_DEADLINE))  # nothing here asks for the client
        real_transfer(fill)

    monkeypatch.setattr(_pull._Fill, "_transfer", transfer)
    data = os.urandom(PART + 1000)
    with HostileHub(files={"model.bin": data}) as hub:
        upstream = Upstream(backend.pull_through(300.0), UpstreamConfig(hub.url))
        upstream.prepare("model", "evil/repo", "main")
        upstream.fill("model", "evil/repo", COMMIT, "model.bin")
    assert waited == [True] and made == ["cmh-s3-client"], (waited, made)
    index = backend.resolve("model", "evil/repo", COMMIT)
    assert index is not None
    with backend.opener(index.files["model.bin"]) as f:
        assert f.read() == data  # composed with that client


@pytest.mark.parametrize("spliced", [True, False])
def test_a_fills_copies_wait_for_its_last_byte_where_its_parts_can_be_spliced(
    moto_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spliced: bool
) -> None:
    """Issue 37: the copies of the parts into the blob wait for the fill's last byte where
    the hashed parts can be sent meanwhile by splice (plain-HTTP storage); where they
    cannot (``https`` storage, no ``splice``: here, ``available`` made false), each part
    is still copied as soon as it is stored, so the blob follows the last byte at once.
    Either way the blob is the upstream's bytes."""
    from cmh.hub.mirror.stores.bucket import _splice

    use_bucket(moto_bucket, tmp_path, monkeypatch)
    if not spliced:
        monkeypatch.setattr(_splice, "available", lambda: False)
    backend = open_mirror_store(moto_bucket.url)
    events: list[str] = []
    lock = threading.Condition()
    real_stored, real_add = _pull._PartWriter._stored, _pull._PartCopier.add

    def stored(writer: Any, n: int, *args: Any) -> None:
        # The PUTs run 3 at once and may end in any order; parts are told stored in
        # order, so each is let through after the one before it (else part 2's PUT
        # could end before part 0's, and no copy could come before it either way).
        with lock:
            lock.wait_for(lambda: n == 0 or f"stored {n - 1}" in events, TEST_DEADLINE)
            events.append(f"stored {n}")
            lock.notify_all()
        real_stored(writer, n, *args)

    def add(copier: Any, name: str, etag: str) -> None:
        with lock:
            events.append(f"copy {name.rsplit('-', 1)[-1]}")
        real_add(copier, name, etag)

    monkeypatch.setattr(_pull._PartWriter, "_stored", stored)
    monkeypatch.setattr(_pull._PartCopier, "add", add)
    data = os.urandom(2 * PART + 1000)
    with HostileHub(files={"model.bin": data}) as hub:
        upstream = Upstream(backend.pull_through(300.0), UpstreamConfig(hub.url))
        upstream.prepare("model", "evil/repo", "main")
        upstream.fill("model", "evil/repo", COMMIT, "model.bin")
    copies = [i for i, e in enumerate(events) if e.startswith("copy")]
    assert len(copies) == 3 and events.index("stored 2") >= 0, events
    if spliced:
        assert min(copies) > events.index("stored 2"), events
    else:
        assert events.index("copy 000000") < events.index("stored 2"), events
    index = backend.resolve("model", "evil/repo", COMMIT)
    assert index is not None
    with backend.opener(index.files["model.bin"]) as f:
        assert f.read() == data


@contextlib.contextmanager
def _static_origin(folder: Path) -> Iterator[str]:
    """``folder`` served by Python's ``http.server`` in a process of its own (its
    allocations are not this process's), on a free port of 127.0.0.1: its URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TEST_DEADLINE
        while True:  # listening once it answers a connection
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "no origin"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process, grace=5)


def test_a_fill_copies_the_upstreams_bytes_once_per_part(
    moto_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: the filling replica appended each chunk the upstream sent to a buffer,
    then sliced a part off it and froze the slice into ``bytes``: three copies of every
    byte (about 0.3 CPU-s per GiB). A part is now one join of the chunks as they came.
    Measured with tracemalloc around each chunk given to the fill: the memory it takes
    while taking a chunk is at most the one part it makes (the slice and its copy took
    twice that). The bytes come from an origin in another process (the Hub's redirect
    to its CDN), so that no server here allocates meanwhile."""
    from cmh.hub.resolver import HubClient

    use_bucket(moto_bucket, tmp_path, monkeypatch)
    backend = open_mirror_store(moto_bucket.url)
    real_stream = HubClient.stream
    taken: list[tuple[int, int]] = []  # (bytes given so far, memory grown while taking)

    def stream(client: Any, url: Any, start: int, sink: Any, **kwargs: Any) -> bool:
        def measured(chunk: bytes) -> None:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            sink(chunk)
            given = (taken[-1][0] if taken else start) + len(chunk)
            taken.append((given, tracemalloc.get_traced_memory()[1] - before))

        return bool(real_stream(client, url, start, measured, **kwargs))

    monkeypatch.setattr(HubClient, "stream", stream)
    data = os.urandom(2 * PART + 1000)
    cdn = tmp_path / "cdn"
    cdn.mkdir()
    (cdn / "model.bin").write_bytes(data)
    tracemalloc.start()
    try:
        with (
            _static_origin(cdn) as origin,
            HostileHub(
                files={"model.bin": data}, resolve_redirect=lambda _m, path: f"{origin}/{path}"
            ) as hub,
        ):
            pull = backend.pull_through(300.0)
            pull.objects._s3_client()  # made now: loading botocore's models takes megabytes
            upstream = Upstream(pull, UpstreamConfig(hub.url))
            upstream.prepare("model", "evil/repo", "main")
            upstream.fill("model", "evil/repo", COMMIT, "model.bin")
    finally:
        tracemalloc.stop()
    assert taken[-1][0] == len(data)
    grown = sorted(g for _, g in taken)
    assert grown[-2] >= PART  # two parts were made in these calls (from their chunks)
    assert grown[-1] < 1.5 * PART, grown[-3:]  # 2 parts or more before
    index = backend.resolve("model", "evil/repo", COMMIT)
    assert index is not None
    blob = open_store(moto_bucket).objects.get(index.files["model.bin"].source.as_posix())
    assert blob == data  # the parts PUT as joined are the blob


def test_a_whole_read_of_a_blob_is_one_ranged_get(
    moto_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob read to its end (a derived document, a test) is asked for in one ranged GET
    from where the reader stands, not 8 KiB per request (``RawIOBase.readall``); a
    bounded read still asks only for what it needs."""
    from types import SimpleNamespace

    from cmh.hub.mirror.stores.bucket._objectstore import ObjectStore
    from cmh.hub.mirror.stores.bucket._read import BucketReader

    use_bucket(moto_bucket, tmp_path, monkeypatch)
    store = open_store(moto_bucket)
    data = os.urandom(3 * 2**20 + 5)
    store.objects.put("models--org--m/blobs/x", data)
    asked: list[tuple[int, int]] = []
    real = ObjectStore.get_range

    def get_range(objects: ObjectStore, name: str, start: int, end: int) -> bytes:
        asked.append((start, end))
        return real(objects, name, start, end)

    monkeypatch.setattr(ObjectStore, "get_range", get_range)
    entry: Any = SimpleNamespace(source=Path("models--org--m/blobs/x"), size=len(data))
    with BucketReader(store).opener(entry) as f:
        assert f.read(10) == data[:10]
        assert f.read() == data[10:]
        assert f.read() == b""
    assert len(asked) == 2 and asked[-1][1] == len(data), asked
