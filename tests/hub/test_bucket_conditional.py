"""Concurrent ``mirror add`` into a bucket, and storages without conditional writes.

On storages that honour ``If-None-Match``/``If-Match`` (SeaweedFS and moto, both real
servers started by the tests) 20 racing pairs of imports lose no commit. On a storage
that ignores them (moto behind a proxy that drops the two headers) every import is
refused before its first write, exit status 2, with a message naming the endpoint and
the missing feature.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from bucket_support import (
    S3_KINDS,
    Bucket,
    Fault,
    S3Proxy,
    S3Request,
    history,
    open_store,
    use_bucket,
)
from cli_support import CMH
from cmh.hub.mirror.stores.bucket._bucket import BucketStore, ConditionalWritesUnsupported
from cmh.hub.mirror.stores.bucket._objectstore import ObjectStore, ObjectStoreError

PAIRS = 20
PARALLEL_PAIRS = 4


@pytest.fixture(params=S3_KINDS)
def conformant(request: pytest.FixtureRequest) -> Bucket:
    bucket: Bucket = request.getfixturevalue(f"{request.param}_bucket")
    return bucket


def write_src(root: Path, tag: str) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text(f'{{"tag": "{tag}"}}')
    (root / "sub" / "notes.txt").write_text(f"notes {tag}\n")
    return root


def race_pair(url: str, repo: str, sources: tuple[Path, Path]) -> list[object]:
    """Two imports into ``repo`` released at once, each with its own client; their
    results (or the exception each raised)."""
    barrier = threading.Barrier(2)
    out: list[object] = [None, None]

    def run(i: int) -> None:
        store = BucketStore.open(url, write_window=5.0, lease_poll=0.1)
        barrier.wait()
        try:
            out[i] = store.add_folder(sources[i], repo)
        except Exception as exc:  # kept for the assertions
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_racing_imports_lose_no_commit(
    conformant: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_bucket(conformant, tmp_path, monkeypatch)
    store = open_store(conformant)
    seeded = write_src(tmp_path / "seed", "seed")
    jobs = []
    for i in range(PAIRS):
        repo = f"cmh-test/race-{i}"
        if i % 2:  # half the repos already have a commit
            store.add_folder(seeded, repo)
        a = write_src(tmp_path / f"a{i}", f"a{i}")
        b = write_src(tmp_path / f"b{i}", f"b{i}")
        jobs.append((repo, (a, b)))
    with ThreadPoolExecutor(PARALLEL_PAIRS) as pool:
        results = list(pool.map(lambda job: race_pair(conformant.url, *job), jobs))
    lost = []
    for (repo, _), pair in zip(jobs, results, strict=True):
        folder = store.folder(repo, "model")
        kept = history(store, folder)
        for result in pair:
            assert not isinstance(result, BaseException), result
            assert result.created and result.ref_moved  # type: ignore[attr-defined]
            if result.commit not in kept:  # type: ignore[attr-defined]
                lost.append((repo, result))
    assert lost == []


def test_racing_cli_imports_lose_no_commit(
    conformant: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = use_bucket(conformant, tmp_path, monkeypatch)
    sources = [write_src(tmp_path / f"s{i}", f"s{i}") for i in range(2)]
    procs = [
        subprocess.Popen(
            [
                str(CMH),
                "mirror",
                "add",
                str(src),
                "--store",
                conformant.url,
                "--repo",
                "cmh-test/cli-race",
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for src in sources
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    store = open_store(conformant)
    kept = history(store, store.folder("cmh-test/cli-race", "model"))
    commits = [json.loads(out)["commit"] for out, _ in outs]
    assert set(commits) <= set(kept) and len(set(commits)) == 2


def test_storage_without_conditional_writes_is_refused(
    no_cas_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = use_bucket(no_cas_bucket, tmp_path, monkeypatch)
    src = write_src(tmp_path / "src", "x")
    proc = subprocess.run(
        [str(CMH), "mirror", "add", str(src), "--store", no_cas_bucket.url, "--repo", "o/n"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    endpoint = env["AWS_ENDPOINT_URL"]
    assert endpoint in proc.stderr
    assert "does not honour conditional writes" in proc.stderr
    assert "If-None-Match" in proc.stderr and "If-Match" in proc.stderr
    assert "(new commit)" not in proc.stdout
    # Nothing was written: the probe's scratch key is gone too.
    objects = ObjectStore.open(no_cas_bucket.url)
    assert list(objects.list("")) == []


def test_no_silent_success_without_conditional_writes(
    no_cas_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_bucket(no_cas_bucket, tmp_path, monkeypatch)
    jobs = [
        (f"cmh-test/nocas-{i}",
         (write_src(tmp_path / f"a{i}", f"a{i}"), write_src(tmp_path / f"b{i}", f"b{i}")))
        for i in range(PAIRS)
    ]  # fmt: skip
    with ThreadPoolExecutor(PARALLEL_PAIRS) as pool:
        results = [r for pair in pool.map(lambda j: race_pair(no_cas_bucket.url, *j), jobs)
                   for r in pair]  # fmt: skip
    successes = [r for r in results if not isinstance(r, ConditionalWritesUnsupported)]
    assert successes == []
    assert list(ObjectStore.open(no_cas_bucket.url).list("")) == []


def test_prune_refuses_a_storage_without_conditional_writes(
    no_cas_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = use_bucket(no_cas_bucket, tmp_path, monkeypatch)
    store = open_store(no_cas_bucket)
    store._conditional_writes_checked = True  # to build a repo there at all (test only)
    for tag in ("a", "b"):
        store.add_folder(write_src(tmp_path / tag, tag), "o/n")
    before = sorted(i.name for i in store.objects.list(""))
    proc = subprocess.run(
        [str(CMH), "prune", "--store", no_cas_bucket.url, "--keep-latest", "1", "--settle", "0",
         "--yes"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "does not honour conditional writes" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(i.name for i in store.objects.list("")) == before  # nothing deleted


def test_a_lease_renewal_whose_answer_is_lost_keeps_the_lease(
    conformant: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a renewal that reached the storage but whose answer was lost made the next
    renewal's ``If-Match`` refused, so the holder gave up a lease it still held (a fill
    then cut its clients). The holder now reads the lease and finds its own rewrite."""
    answers_to_lose = [0]

    def lose_renewal_answers(request: S3Request) -> Fault | None:
        if request.method == "PUT" and request.header("If-Match") and answers_to_lose[0]:
            answers_to_lose[0] -= 1
            return Fault.LOSE
        return None

    proxy = S3Proxy(conformant.endpoint, lose_renewal_answers)
    try:
        use_bucket(conformant, tmp_path, monkeypatch)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)  # the same storage, through it
        store = BucketStore.open(conformant.url)
        lease = "org--x/.cmh/fills/" + "a" * 64 + "/lease"
        assert store.take_lease("org--x", "me", name=lease, ttl=30.0)
        for _ in range(3):  # each renewal's answer lost once, then the next one answered
            answers_to_lose[0] = 1
            try:
                kept = store.renew_lease("org--x", "me", name=lease, ttl=30.0)
            except ObjectStoreError:
                kept = store.renew_lease("org--x", "me", name=lease, ttl=30.0)
            assert kept
        assert answers_to_lose[0] == 0  # the answers were lost indeed
        assert json.loads(store.objects.get(lease))["owner"] == "me"
        other = BucketStore.open(conformant.url)
        assert not other.take_lease("org--x", "another", name=lease, ttl=30.0)  # held
        store.objects.put(lease, b'{"owner": "another", "ttl": 30.0, "nonce": "x"}')
        assert not store.renew_lease("org--x", "me", name=lease, ttl=30.0)  # taken: lost
    finally:
        proxy.stop()


def test_releasing_a_lease_another_took_over_leaves_it_to_them(
    conformant: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40: a holder unaware that its lease expired and was taken over released it
    by deleting the object unconditionally: the new holder's lease went, and a third
    replica could start the same fill beside it. A release deletes only this holder's
    own write of the lease."""
    use_bucket(conformant, tmp_path, monkeypatch)
    store = BucketStore.open(conformant.url)
    lease = "org--x/.cmh/fills/" + "b" * 64 + "/lease"
    assert store.take_lease("org--x", "me", name=lease, ttl=30.0)
    taken = b'{"owner": "another", "ttl": 30.0, "nonce": "y"}'
    store.objects.put(lease, taken)  # expired meanwhile and taken over
    store.release_lease("org--x", name=lease)
    assert store.objects.get(lease) == taken
    assert store.take_lease("org--x", "me", name="org--x/.cmh/lease-2", ttl=30.0)
    store.release_lease("org--x", name="org--x/.cmh/lease-2")  # still ours: deleted
    assert [i.name for i in store.objects.list("org--x/.cmh/lease-2")] == []


def test_a_lease_within_a_second_past_its_lifetime_is_not_taken_over(
    conformant: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a lease's age is the storage's clock (a scratch object's Last-Modified) less
    the lease's Last-Modified, both in whole seconds, so it could read up to a second too
    old and a lease renewed every quarter of a short lifetime was taken over while its
    holder was alive (two upstream transfers). A lease is live until its measured age is
    past its lifetime plus that second (spec/hub-mirror.md 7.2 step 4)."""
    from cmh.hub.cache import LEASE_TIME_RESOLUTION
    from mirror_support import ManualClock

    use_bucket(conformant, tmp_path, monkeypatch)
    clock = ManualClock()
    holder, other = BucketStore.open(conformant.url), BucketStore.open(conformant.url, clock=clock)
    probe = "org--x/.cmh/lease-probe"
    assert holder.take_lease("org--x", "probe", name=probe, ttl=30.0)
    # The other replica looks at the storage's clock now, before the lease below is
    # written: on the injected clock the lease is then no older than the time moved.
    assert other.lease_state("org--x", name=probe) is not None
    ttl, lease = 0.25, "org--x/.cmh/fills/" + "c" * 64 + "/lease"
    assert holder.take_lease("org--x", "holder", name=lease, ttl=ttl)
    clock.advance(ttl + 0.5)  # under LEASE_CLOCK_RESYNC: no new look at the storage's clock
    state = other.lease_state("org--x", name=lease)
    assert state is not None and state.age <= ttl + 0.5 <= ttl + LEASE_TIME_RESOLUTION
    assert not other.take_lease("org--x", "other", name=lease, ttl=ttl)
    assert json.loads(holder.objects.get(lease))["owner"] == "holder"
