"""A bucket fill's parts: read by this process's readers the moment they are stored (no
poll interval waited), and made into the blob by the storage (no second upload)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from bucket_support import open_store, use_bucket
from cmh.hub.mirror.stores.bucket import _pull
from cmh.hub.mirror.stores.bucket._objectstore import ObjectNotFound, PreconditionFailed
from seaweed import SeaweedBucket

PART = _pull.PART


@pytest.mark.parametrize("kind", ["seaweed", "moto"])
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


@pytest.mark.parametrize("kind", ["seaweed", "moto"])
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
