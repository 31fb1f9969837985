"""Time in the mirror (issue 34): a cut recorded at a time in the reader's future counts as
recent (a writer's clock running ahead never hides a cut, so a resume is answered whole),
and a bucket's fleet records are aged on the storage's clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from bucket_support import S3_KINDS, use_bucket
from cmh.hub.cache import CUT_MEMORY
from cmh.hub.mirror._cuts import CutLedger
from cmh.hub.mirror.stores.bucket._bucket import STORAGE_CLOCK_RESYNC, BucketStore
from mirror_support import ManualClock


def test_cut_recorded_in_the_readers_future_counts_as_recent(tmp_path: Path) -> None:
    behind = ManualClock()
    ahead = ManualClock(behind.now + 60)  # the writer's clock runs a minute ahead
    repo = tmp_path / "models--org--toy"
    CutLedger(ahead).record(repo, "e" * 64)
    reader = CutLedger(behind)
    assert reader.recent(repo, "e" * 64)  # not "never cut": a resume is answered whole
    behind.advance(60 + CUT_MEMORY - 1)
    assert reader.recent(repo, "e" * 64)
    behind.advance(2)
    assert not reader.recent(repo, "e" * 64)


@pytest.mark.parametrize("kind", S3_KINDS)
def test_bucket_storage_time_is_the_storages_clock_counted_on_this_process(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One look at the storage's clock, then this process's clock (which a test moves);
    looked at again after an hour. A replica's wall clock never enters it."""
    bucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    clock = ManualClock(now=123.0)  # far from the storage's wall time, on purpose
    store = BucketStore.open(bucket.url, clock=clock)
    first = store.storage_time()
    assert abs(first - store.storage_now()) < 30  # the storage's time, not this clock's
    clock.advance(600)
    assert store.storage_time() == pytest.approx(first + 600)  # counted here in between
    assert store.storage_age(first + 700) < 0  # in the storage's future: recent
    clock.advance(STORAGE_CLOCK_RESYNC)
    assert abs(store.storage_time() - store.storage_now()) < 30  # looked at again
