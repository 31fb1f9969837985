"""Issue 37: the whole bodies one worker sends from a fill are hashed once, not once per
client (spec/hub-mirror.md 8.6), for a bucket's segments and a folder's reads of the partial
file alike, and that shared hash vouches only for the very bytes it hashed: a read a reader
got otherwise is checked by the reader itself."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bucket_support import S3_KINDS, open_store, use_bucket
from cmh.hub.mirror import _filling
from cmh.hub.mirror.stores import _body_hash
from cmh.hub.mirror.stores.bucket import _pull
from cmh.hub.mirror.stores.local import _pull as _local_pull
from deadline_support import TEST_DEADLINE
from seaweed import SeaweedBucket

PART = _pull.PART
CHUNK = 1 << 20


def _stored_parts(request: pytest.FixtureRequest, kind: str, tmp_path: Path, mp: Any) -> Any:
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, mp)
    mp.setattr(_pull, "READ_POLL", 3600.0)  # every part is stored before it is read
    mp.setattr(_pull, "_SEGMENTS", _pull.LRUCache(_pull.KEPT_SEGMENTS))  # this worker's
    mp.setattr(_body_hash, "_HASHES", _pull.LRUCache(_body_hash.BODY_HASHES))
    return open_store(bucket).objects


def _put_parts(objects: Any, fills: str, data: bytes) -> None:
    for n in range(0, len(data), PART):
        objects.put(f"{fills}/part-{n // PART:06d}", data[n : n + PART])


async def _read_whole(tail: Any, size: int) -> tuple[bytes, list[Any]]:
    """The body read as a whole body is (1 MiB reads from byte 0), and the voucher of
    each read."""
    got, vouchers, pos = bytearray(), [], 0
    while pos < size:
        view = await asyncio.wait_for(tail.read(pos, min(CHUNK, size - pos)), TEST_DEADLINE)
        got += view
        vouchers.append(tail.voucher())
        pos += len(view)
    return bytes(got), vouchers


async def _read_again(tail: Any, data: bytes, shared: Any) -> tuple[list[Any], bool]:
    """A second reader reads the whole blob (every byte right): its vouchers, and whether
    the first reader's shared hash matched once the blob was hashed."""
    got, vouchers = await _read_whole(tail, len(data))
    assert got == data
    assert shared is not None
    return vouchers, await asyncio.wait_for(shared.matched(), 60)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_shared_hash_takes_reads_in_order_and_vouches_only_for_those_it_took() -> None:
    """Reads taken at the frontier are vouched for; the same bytes in another read (another
    serial) are not; a read that reaches past the frontier gives its bytes past it (so the
    hash reaches the end while any reader does), and is not vouched for itself."""
    data = os.urandom(40)

    async def main(overlap: bytes, tail: bytes) -> tuple[list[bool], bool, int]:
        shared = _body_hash.SharedHash(_sha(data), len(data))
        said = [
            shared.offer(0, 1, data[:10]),  # the frontier: taken
            shared.offer(0, 1, data[:10]),  # the read taken: vouched for
            shared.offer(0, 2, data[:10]),  # the same bytes, another read: not
            shared.offer(20, 3, data[20:30]),  # past the frontier: nothing taken
            shared.offer(5, 4, overlap),  # bytes 5..15: 10..15 taken, not vouched
            shared.offer(15, 5, tail),  # the frontier: taken
            shared.offer(5, 4, overlap),  # still not vouched for
        ]
        return said, await asyncio.wait_for(shared.matched(), TEST_DEADLINE), shared.hashed

    said, matched, hashed = asyncio.run(main(data[5:15], data[15:]))
    assert said == [True, True, False, False, False, True, False]
    assert (matched, hashed) == (True, 3)
    # bytes of the overlapping read before the frontier are not hashed, those past it are
    wrong_head = bytes(b ^ 1 for b in data[5:10]) + data[10:15]
    assert asyncio.run(main(wrong_head, data[15:]))[1] is True
    wrong_tail = data[5:14] + bytes([data[14] ^ 1])
    assert asyncio.run(main(wrong_tail, data[15:]))[1] is False

    async def short() -> bool:
        shared = _body_hash.SharedHash(_sha(data), len(data))
        assert shared.offer(0, 1, data[:39])
        return await shared.matched()  # never took the last byte: vouches for nothing

    assert asyncio.run(short()) is False

    async def longer() -> tuple[bool, bool]:
        shared = _body_hash.SharedHash(_sha(data), len(data))
        assert shared.offer(0, 1, data[:10])  # a read of what had arrived then
        said = shared.offer(0, 2, data)  # a later read at 0 holds more: its tail taken
        return said, await asyncio.wait_for(shared.matched(), TEST_DEADLINE)

    assert asyncio.run(longer()) == (False, True)


@pytest.mark.parametrize("kind", S3_KINDS)
def test_the_whole_bodies_of_one_worker_share_one_hash_of_the_blob(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three readers of one fill, each reading the whole blob from byte 0 at its own pace:
    every read is vouched for by one hash, which hashed each segment once and matches the
    ETag; with a byte of a stored part flipped, it does not match."""
    objects = _stored_parts(request, kind, tmp_path, monkeypatch)
    data = os.urandom(2 * PART + 4321)
    etag = hashlib.sha256(data).hexdigest()
    hashed: list[int] = []

    def run(fills: str) -> tuple[list[bytes], list[list[Any]], bool]:
        async def main() -> tuple[list[bytes], list[list[Any]], bool]:
            fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            tails = [
                _pull.PartTail(objects, f"models--t--share/blobs/{etag}", fills, len(data), fill)
                for _ in range(3)
            ]
            try:
                results = await asyncio.gather(*(_read_whole(t, len(data)) for t in tails))
                vouchers = [v for _, v in results]
                shared = vouchers[0][0]
                assert shared is not None
                matched = await asyncio.wait_for(shared.matched(), TEST_DEADLINE)
                hashed.append(shared.hashed)
                return [b for b, _ in results], vouchers, matched
            finally:
                for t in tails:
                    t.close()

        return asyncio.run(main())

    _put_parts(objects, "models--t--share/.cmh/fills/good", data)
    bodies, vouchers, matched = run("models--t--share/.cmh/fills/good")
    assert bodies == [data] * 3
    first = vouchers[0][0]
    assert all(v is first for body in vouchers for v in body)
    assert matched is True
    assert hashed == [3]  # three segments, each hashed once for the three readers

    wrong = bytearray(data)
    wrong[PART + 17] ^= 1
    _put_parts(objects, "models--t--share/.cmh/fills/flipped", bytes(wrong))
    bodies, vouchers, matched = run("models--t--share/.cmh/fills/flipped")
    assert bodies == [bytes(wrong)] * 3
    assert matched is False  # each of these bodies is cut before its last byte


@pytest.mark.parametrize("kind", ["seaweed"])
def test_a_segment_read_again_is_not_vouched_for_by_the_hash_of_another_read(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reader A takes segments 0 and 1 into the hash; the worker then forgets its segments
    (pushed out of its memory), so reader B reads them again: those reads (other bytes
    objects, which may hold other bytes) are not vouched for, and B's segment 2, the next
    to hash, is taken from B."""
    objects = _stored_parts(request, kind, tmp_path, monkeypatch)
    data = os.urandom(2 * PART + 10)
    etag = hashlib.sha256(data).hexdigest()
    fills = "models--t--again/.cmh/fills/x"
    _put_parts(objects, fills, data)

    async def main() -> tuple[list[Any], list[Any], bool]:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        blob = f"models--t--again/blobs/{etag}"
        a = _pull.PartTail(objects, blob, fills, len(data), fill)
        b = _pull.PartTail(objects, blob, fills, len(data), fill)
        try:
            a_vouchers = []
            for n in (0, 1):
                await asyncio.wait_for(a.read(n * PART, 10), TEST_DEADLINE)
                a_vouchers.append(a.voucher())
            await asyncio.gather(*(t for _, t, _ in list(_pull._SEGMENTS.values())))
            _pull._SEGMENTS.clear()
            return a_vouchers, *await _read_again(b, data, a_vouchers[0])
        finally:
            a.close()
            b.close()

    a_vouchers, b_vouchers, matched = asyncio.run(main())
    shared = a_vouchers[0]
    assert a_vouchers == [shared, shared]
    per_segment = [b_vouchers[pos // CHUNK] for pos in (0, PART, 2 * PART)]
    assert per_segment == [None, None, shared]
    assert matched is True


def _folder_fill(tmp_path: Path, data: bytes, name: str) -> SimpleNamespace:
    """A folder fill's files (``blobs/{etag}`` and its partial) and its entry."""
    etag = _sha(data)
    blobs = tmp_path / name / "blobs"
    blobs.mkdir(parents=True)
    entry = SimpleNamespace(etag=etag, size=len(data))
    return SimpleNamespace(blob=blobs / etag, partial=blobs / f"{etag}.incomplete", entry=entry)


async def _write_fill(files: SimpleNamespace, data: bytes, fill: asyncio.Future[None]) -> None:
    """What the resolver does: the partial grows in pieces of uneven sizes, then is checked
    and renamed to the blob, and the fill ends."""
    pos, step = 0, 0
    with open(files.partial, "wb") as out:
        while pos < len(data):
            piece = data[pos : pos + (1 << 18) + 4099 * step]
            out.write(piece)
            out.flush()
            pos += len(piece)
            step += 1
            await asyncio.sleep(0.005)
    os.rename(files.partial, files.blob)
    fill.set_result(None)


def _folder_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_local_pull, "POLL", 0.005)
    monkeypatch.setattr(_local_pull, "_READS", _pull.LRUCache(_local_pull.KEPT_READS))
    monkeypatch.setattr(_body_hash, "_HASHES", _pull.LRUCache(_body_hash.BODY_HASHES))


def test_the_whole_bodies_of_a_folder_fill_share_one_hash_of_the_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three readers of a folder fill read the partial file as it grows, from byte 0 at
    their own pace: they share every read, each vouched for by one hash that hashed each
    read once and matches the ETag; with a byte flipped in the file, it does not match."""
    _folder_readers(monkeypatch)
    data = os.urandom(3 * CHUNK + 4321)

    def run(written: bytes, name: str) -> tuple[list[bytes], list[list[Any]], bool, int, int]:
        files = _folder_fill(tmp_path, data, name)

        async def main() -> tuple[list[bytes], list[list[Any]], bool, int, int]:
            fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            tails = [
                _local_pull.FileTail(files.blob, files.partial, files.entry, fill) for _ in range(3)
            ]
            try:
                writer = asyncio.create_task(_write_fill(files, written, fill))
                results = await asyncio.gather(*(_read_whole(t, len(data)) for t in tails))
                await writer
                vouchers = [v for _, v in results]
                shared = vouchers[0][0]
                assert shared is not None
                matched = await asyncio.wait_for(shared.matched(), TEST_DEADLINE)
                reads = len(_local_pull._READS)  # every read kept (fewer than KEPT_READS)
                return [b for b, _ in results], vouchers, matched, shared.hashed, reads
            finally:
                for t in tails:
                    t.close()

        return asyncio.run(main())

    bodies, vouchers, matched, hashed, reads = run(data, "good")
    assert bodies == [data] * 3
    first = vouchers[0][0]
    assert all(v is first for body in vouchers for v in body)
    assert matched is True
    assert hashed == reads  # each read hashed once for the three readers
    assert not _local_pull._READS  # the fill ended, its readers closed: its reads went

    wrong = bytearray(data)
    wrong[CHUNK + 17] ^= 1
    bodies, vouchers, matched, _, _ = run(bytes(wrong), "flipped")
    assert bodies == [bytes(wrong)] * 3
    assert matched is False  # each of these bodies is cut before its last byte


def test_a_folder_read_of_a_replaced_partial_is_not_vouched_for_by_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reader A takes the first MiB of a partial into the hash; the download is then
    discarded and written again (another file): reader B's reads of it at offsets the
    hash took are not vouched for (other bytes objects), and B's read at the frontier is
    taken from B, so the hash still completes."""
    _folder_readers(monkeypatch)
    data = os.urandom(2 * CHUNK + 10)
    files = _folder_fill(tmp_path, data, "again")

    async def main() -> tuple[Any, list[Any], bool]:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        a = _local_pull.FileTail(files.blob, files.partial, files.entry, fill)
        b = _local_pull.FileTail(files.blob, files.partial, files.entry, fill)
        try:
            files.partial.write_bytes(data[: CHUNK + 5])
            await asyncio.wait_for(a.read(0, 10), TEST_DEADLINE)
            a_voucher = a.voucher()
            files.partial.unlink()  # the resolver discards the download, starts again
            files.partial.write_bytes(data)
            os.rename(files.partial, files.blob)
            fill.set_result(None)
            return a_voucher, *await _read_again(b, data, a_voucher)
        finally:
            a.close()
            b.close()

    shared, b_vouchers, matched = asyncio.run(main())
    assert b_vouchers == [None, shared, shared]  # bytes 0.. taken from A's read
    assert matched is True


def test_a_folder_fills_kept_reads_go_once_it_ended_and_its_last_reader_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker keeps a fill's reads while a reader of it is open or the fill runs; once
    the fill has ended and its last reader closed (a reader closed twice counts once),
    they go."""
    _folder_readers(monkeypatch)
    monkeypatch.setattr(_local_pull, "_READERS", {})
    data = os.urandom(CHUNK + 10)
    files = _folder_fill(tmp_path, data, "kept")
    files.blob.write_bytes(data)  # installed

    async def main() -> list[tuple[int, int]]:
        fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        a = _local_pull.FileTail(files.blob, files.partial, files.entry, fill)
        b = _local_pull.FileTail(files.blob, files.partial, files.entry, fill)
        seen = []
        for tail in (a, b):
            await asyncio.wait_for(tail.read(0, 10), TEST_DEADLINE)
        a.close()
        seen.append((len(_local_pull._READS), len(_local_pull._READERS)))  # b reads on
        fill.set_result(None)
        a.close()
        seen.append((len(_local_pull._READS), len(_local_pull._READERS)))
        b.close()
        seen.append((len(_local_pull._READS), len(_local_pull._READERS)))
        return seen

    assert asyncio.run(main()) == [(1, 1), (1, 1), (0, 0)]


class _Voucher:
    def __init__(self, matched: bool) -> None:
        self._matched = matched

    async def matched(self) -> bool:
        return self._matched


def test_a_whole_body_hashes_only_what_no_shared_hash_vouches_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The byte gate's accounting: a whole body vouched for from its first byte hashes
    nothing vouched for, and hashes each run of bytes that is not as a range (checked
    against the installed blob); one whose first bytes are not vouched for hashes it all."""
    hashed: list[int] = []
    real = _filling._hash

    async def counted(data: Any, digest: Any) -> None:
        hashed.append(len(data))
        await real(data, digest)

    monkeypatch.setattr(_filling, "_hash", counted)
    shared = _Voucher(True)

    async def account(reads: list[tuple[int, bytes, Any]]) -> Any:
        checks = _filling._Checks(hashlib.sha256())
        for pos, data, voucher in reads:
            await checks.add(pos, data, voucher)
        checks.end_range()
        return checks

    vouched = asyncio.run(account([(0, b"ab", shared), (2, b"cd", shared)]))
    assert (vouched.digest, vouched.ranges, vouched.shared, hashed) == (None, [], [shared], [])

    mixed = asyncio.run(account([(0, b"ab", shared), (2, b"cd", None), (4, b"e", None),
                                 (5, b"f", shared), (6, b"g", None)]))  # fmt: skip
    assert mixed.digest is None and mixed.shared == [shared]
    ranges = [(offset, count, h.hexdigest()) for offset, count, h in mixed.ranges]
    sha = hashlib.sha256
    assert ranges == [(2, 3, sha(b"cde").hexdigest()), (6, 1, sha(b"g").hexdigest())]
    assert hashed == [2, 1, 1]

    hashed.clear()
    own = asyncio.run(account([(0, b"ab", None), (2, b"cd", shared)]))
    assert own.digest is not None and own.digest.hexdigest() == sha(b"abcd").hexdigest()
    assert (own.ranges, own.shared, hashed) == ([], [], [2, 2])


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_a_shared_hash_that_does_not_match_cuts_the_body_before_its_last_byte() -> None:
    """The byte gate of a whole body vouched for by a shared hash: it passes when the
    shared hash matches the ETag; otherwise the connection is cut and the body refused
    (before its last byte is written), with no check of its own to fall back on."""
    from cmh.hub.mirror._state import STORE_KEY

    def gate(matched: bool) -> tuple[bool, bool]:
        """(refused, connection cut)"""
        transport = _Transport()
        request: Any = SimpleNamespace(
            transport=transport, app={STORE_KEY: SimpleNamespace(guard=None)}
        )

        async def main() -> None:
            checks = _filling._Checks(hashlib.sha256())
            await checks.add(0, b"ab", _Voucher(matched))
            checks.end_range()
            fill: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fill.set_result(None)
            await _filling._gate(request, fill, None, checks, _sha(b"abc"), 2)  # type: ignore[arg-type]

        try:
            asyncio.run(main())
        except _filling.BodyRefused:
            return True, transport.aborted
        return False, transport.aborted

    assert gate(True) == (False, False)
    assert gate(False) == (True, True)
