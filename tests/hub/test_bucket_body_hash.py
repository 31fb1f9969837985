"""Issue 37: the whole bodies one worker sends from a bucket fill are hashed once, not once
per client (spec/hub-mirror.md 8.6), and that shared hash vouches only for the very bytes
it hashed: a segment a reader got from another read is checked by the reader itself."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from bucket_support import S3_KINDS, open_store, use_bucket
from cmh.hub.mirror import _filling
from cmh.hub.mirror.stores.bucket import _pull
from deadline_support import TEST_DEADLINE
from seaweed import SeaweedBucket

PART = _pull.PART
CHUNK = 1 << 20


def _stored_parts(request: pytest.FixtureRequest, kind: str, tmp_path: Path, mp: Any) -> Any:
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, mp)
    mp.setattr(_pull, "READ_POLL", 3600.0)  # every part is stored before it is read
    mp.setattr(_pull, "_SEGMENTS", _pull.LRUCache(_pull.KEPT_SEGMENTS))  # this worker's
    mp.setattr(_pull, "_BODY_HASHES", _pull.LRUCache(_pull.BODY_HASHES))
    return open_store(bucket).objects


def _put_parts(objects: Any, fills: str, data: bytes) -> None:
    for n in range(0, len(data), PART):
        objects.put(f"{fills}/part-{n // PART:06d}", data[n : n + PART])


async def _read_whole(tail: _pull.PartTail, size: int) -> tuple[bytes, list[Any]]:
    """The body read as a whole body is (1 MiB reads from byte 0), and the voucher of
    each read."""
    got, vouchers, pos = bytearray(), [], 0
    while pos < size:
        view = await asyncio.wait_for(tail.read(pos, min(CHUNK, size - pos)), TEST_DEADLINE)
        got += view
        vouchers.append(tail.voucher())
        pos += len(view)
    return bytes(got), vouchers


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
                hashed.append(shared._hashed)
                return [b for b, _ in results], vouchers, matched
            finally:
                for t in tails:
                    t.close()

        return asyncio.run(main())

    _put_parts(objects, "models--t--share/.cmh/fills/good", data)
    bodies, vouchers, matched = run("models--t--share/.cmh/fills/good")
    assert bodies == [data] * 3
    first = vouchers[0][0]
    assert all(v is first for reads in vouchers for v in reads)
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
            got, b_vouchers = await _read_whole(b, len(data))
            assert got == data
            shared = a_vouchers[0]
            assert shared is not None
            return a_vouchers, b_vouchers, await asyncio.wait_for(shared.matched(), 60)
        finally:
            a.close()
            b.close()

    a_vouchers, b_vouchers, matched = asyncio.run(main())
    shared = a_vouchers[0]
    assert a_vouchers == [shared, shared]
    per_segment = [b_vouchers[pos // CHUNK] for pos in (0, PART, 2 * PART)]
    assert per_segment == [None, None, shared]
    assert matched is True


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
