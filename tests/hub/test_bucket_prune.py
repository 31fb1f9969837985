"""Pruning bucket stores safely, on a real SeaweedFS (and moto where the storage matters).

- ranking by ref history: a leftover tree of a killed import and a writer whose clock
  runs 10 minutes ahead never make prune delete the commit a ref serves;
- what is executed is a subset of the plan shown, even when the bucket changed since;
- one settle per run, no lease and no wait for repos with nothing to delete
  (``cmh prune`` of 100 such repos);
- leases: a writer waiting on one says so and goes on once it expired; a pruner takes
  an expired lease over. Waits run on an injected clock, except where the storage's
  own clock must move (its Last-Modified times), which no test can inject.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from bucket_support import Bucket, history, use_bucket
from cmh.hub.cache import lease_left
from cmh.hub.mirror.stores.bucket import _bucket as bucket_module
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from cmh.hub.mirror.stores.bucket._objectstore import ObjectNotFound
from cmh.hub.prune import PrunePolicy, execute_bucket_plan, plan_prune, prune_bucket, scan_bucket
from deadline_support import TEST_DEADLINE
from seaweed import SeaweedBucket

REPO = "cmh-test/prune"


class FakeClock(bucket_module.Clock):
    """A monotonic clock that sleeps by moving itself forward."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def env(seaweed_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    return use_bucket(seaweed_bucket, tmp_path, monkeypatch)


def open_store(bucket: Bucket, **options: object) -> BucketStore:
    return BucketStore.open(bucket.url, write_window=5.0, lease_poll=0.1, **options)  # type: ignore[arg-type]


def src(root: Path, tag: str) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"tag": tag}))
    (root / "weights.bin").write_bytes(tag.encode() * 3000)
    return root


class Killed(Exception):
    """Stands for the process being killed while it waited for a lease."""


def test_leftover_tree_and_a_clock_ahead_never_cost_the_served_commit(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(seaweed_bucket)
    folder = store.folder(REPO, "model")
    old = store.add_folder(src(tmp_path / "v1", "v1"), REPO)
    served = store.add_folder(src(tmp_path / "v2", "v2"), REPO)
    # A writer whose created_at is 10 minutes ahead (an older cmh stamped its own wall
    # clock) is killed after writing its tree object, while it waited for a lease: its
    # tree is newest by created_at and named by no ref.
    ahead = store.storage_time() + 600
    with monkeypatch.context() as m:
        m.setattr(store, "storage_time", lambda: ahead)
        m.setattr(store, "_wait_for_no_lease", lambda folder: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            store.add_folder(src(tmp_path / "v3", "v3"), REPO)
    trees = store.tree_infos(folder)
    (leftover,) = set(trees) - {old.commit, served.commit}
    leftover_tree = store.read_tree(folder, leftover)
    served_tree = store.read_tree(folder, served.commit)
    assert leftover_tree is not None and served_tree is not None
    assert leftover_tree.created_at > served_tree.created_at

    _, report = prune_bucket(store, PrunePolicy(keep_latest=1), settle=0, clock=FakeClock())
    assert report is not None and not report.all_errors
    gone = {r.commit for r in report.repos[0].revisions}
    assert gone == {old.commit, leftover}
    assert store.resolve_revision(folder, "main") == served.commit
    tree = store.read_tree(folder, served.commit)
    assert tree is not None
    blobs = store.blob_infos(folder)
    assert all(f.etag in blobs for f in tree.files)
    assert history(store, folder, pruned=True) == [served.commit]


def test_prune_removes_the_check_records_of_the_blobs_it_deletes(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    store = open_store(seaweed_bucket)
    folder = store.folder(REPO, "model")
    old = store.add_folder(src(tmp_path / "a", "a"), REPO)
    served = store.add_folder(src(tmp_path / "b", "b"), REPO)
    old_tree, served_tree = (
        store.read_tree(folder, old.commit),
        store.read_tree(folder, served.commit),
    )
    assert old_tree is not None and served_tree is not None
    kept = {f.etag for f in served_tree.files}
    going = {f.etag for f in old_tree.files} - kept
    assert going and set(store.check_infos(folder)) >= going | kept  # mirror add recorded them
    orphan = store.check_name(folder, "e" * 64)  # a record of a blob long gone
    store.objects.put(orphan, b'{"storage_etag": "x"}')
    plan, report = prune_bucket(store, PrunePolicy(keep_latest=1), settle=0, clock=FakeClock(),
                                now=time.time() + 3600)  # fmt: skip
    assert report is not None and not report.all_errors
    shown = {i.path for i in plan.repos[0].items if i.kind == "checked"}
    assert shown == {store.check_name(folder, e) for e in going | {"e" * 64}}
    left = set(store.check_infos(folder))
    assert left == kept  # the served blobs keep theirs; the removed and the orphan lose theirs
    assert set(store.blob_infos(folder)) == kept


def test_keep_latest_zero_and_older_than_never_remove_what_a_ref_serves(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    store = open_store(seaweed_bucket)
    folder = store.folder(REPO, "model")
    store.add_folder(src(tmp_path / "a", "a"), REPO)
    served = store.add_folder(src(tmp_path / "b", "b"), REPO)
    policy = PrunePolicy(keep_latest=0, older_than=0.0)
    _, report = prune_bucket(store, policy, settle=0, clock=FakeClock(),
                             now=time.time() + 10 * 86400)  # fmt: skip
    assert report is not None and store.resolve_revision(folder, "main") == served.commit


class AheadClock(FakeClock):
    """A pruner's clock three hours ahead of the storage's."""

    def time(self) -> float:
        return time.time() + 3 * 3600


def test_older_than_ages_on_the_storage_clock_not_the_pruners(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    """A revision written a moment ago is not older than an hour to a pruner whose own
    clock is three hours ahead: its ``created_at`` (storage clock) is moved onto the
    pruner's by the storage's offset, as every other age is."""
    store = open_store(seaweed_bucket)
    first = store.add_folder(src(tmp_path / "a", "a"), REPO)
    store.add_folder(src(tmp_path / "b", "b"), REPO)  # main moves on: first is unnamed
    clock = AheadClock()
    scan = scan_bucket(store, clock=clock)
    hour = plan_prune(scan, PrunePolicy(older_than=3600.0), clock=clock)
    assert [r.commit for r in hour.repos[0].revisions] == []
    now = plan_prune(scan, PrunePolicy(older_than=0.0), clock=clock, now=clock.time() + 1)
    assert [r.commit for r in now.repos[0].revisions] == [first.commit]


def test_executes_a_subset_of_the_plan_it_showed(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    store = open_store(seaweed_bucket)
    folder = store.folder(REPO, "model")
    first = store.add_folder(src(tmp_path / "a", "a"), REPO)
    second = store.add_folder(src(tmp_path / "b", "b"), REPO)
    policy = PrunePolicy(keep_latest=1)
    shown = plan_prune(scan_bucket(store), policy)
    assert [r.commit for r in shown.repos[0].revisions] == [first.commit]
    # Meanwhile an import moves main on: by the policy, second could go now too, and
    # an orphan blob appears; neither was shown, so neither may go.
    third = store.add_folder(src(tmp_path / "c", "c"), REPO)
    orphan = store.blob_name(folder, "e" * 64)
    store.objects.put(orphan, b"orphan")
    told: list[int] = []
    report = execute_bucket_plan(store, shown, settle=0, clock=FakeClock(), progress=told.append)
    assert told == [shown.repos[0].freed]  # the progress bar moves per repo, as for a folder
    done = report.repos[0]
    shown_repo = shown.repos[0]
    assert {r.commit for r in done.revisions} <= {r.commit for r in shown_repo.revisions}
    assert {i.path for i in done.items} <= {i.path for i in shown_repo.items}
    assert {r.commit for r in done.revisions} == {first.commit}
    assert store.read_tree(folder, second.commit) is not None
    store.objects.head(orphan)  # still there
    assert history(store, folder, pruned=True) == [third.commit, second.commit]


def test_a_writer_waiting_on_a_lease_says_so_and_goes_on_once_it_expired(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    notices: list[str] = []
    clock = FakeClock()
    store = BucketStore.open(seaweed_bucket.url, lease_poll=60.0, clock=clock,
                             on_notice=notices.append)  # fmt: skip
    folder = store.folder(REPO, "model")
    store.add_folder(src(tmp_path / "a", "a"), REPO)
    store.objects.put(store.lease_name(folder), b'{"owner": "cmh prune pid 1 (killed)"}')
    started = time.monotonic()
    result = store.add_folder(src(tmp_path / "b", "b"), REPO)
    assert time.monotonic() - started < 60  # the 600 s passed on the injected clock only
    assert result.ref_moved and store.resolve_revision(folder, "main") == result.commit
    assert any("waiting for cmh prune pid 1 (killed)" in n for n in notices), notices
    assert any("expired" in n for n in notices), notices
    assert sum(clock.slept) >= store.lease_ttl - 5


def test_expired_leases_are_taken_over_by_prune_and_mirror_add(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    """A lease older than its lifetime on the storage's clock (a killed pruner's): both a
    pruner and a writer take it over at once. The storage's clock is real (no test can
    move a Last-Modified time): this test waits until the storage itself says the lease
    is older than its 1 s lifetime (and the second of LEASE_TIME_RESOLUTION)."""
    store = open_store(seaweed_bucket, lease_ttl=1.0)
    folder = store.folder(REPO, "model")
    store.add_folder(src(tmp_path / "a", "a"), REPO)
    store.add_folder(src(tmp_path / "b", "b"), REPO)
    store.objects.put(store.lease_name(folder), b'{"owner": "a killed pruner"}')
    fresh = open_store(seaweed_bucket, lease_ttl=600.0)
    assert not fresh.take_lease(folder, "test")  # young: held
    deadline = time.monotonic() + TEST_DEADLINE
    # Expired once its age is past the lifetime plus the storage's whole-second resolution.
    while (lease := store.lease_state(folder)) is not None and lease_left(
        lease.age, store.lease_ttl
    ) >= 0:
        assert time.monotonic() < deadline, "the storage's clock did not move"
        time.sleep(0.1)  # the storage's clock moves on its own
    notices: list[str] = []
    writer = open_store(seaweed_bucket, lease_ttl=1.0, clock=FakeClock(),
                        on_notice=notices.append)  # fmt: skip
    writer.add_folder(src(tmp_path / "c", "c"), REPO)
    assert any("expired" in n for n in notices), notices
    _, report = prune_bucket(store, PrunePolicy(keep_latest=1), settle=0, clock=FakeClock())
    assert report is not None and not report.repos[0].skipped
    assert len(report.repos[0].revisions) == 2
    with pytest.raises(ObjectNotFound):
        store.objects.head(store.lease_name(folder))


def test_prune_of_100_repos_with_nothing_to_delete_settles_once(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    store = open_store(seaweed_bucket)
    source = src(tmp_path / "one", "one")
    repos = [f"cmh-test/quiet-{i:03d}" for i in range(100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda r: store.add_folder(source, r), repos))
    # two repos that do have something to delete: the settle runs once, not per repo
    for i in range(2):
        store.add_folder(src(tmp_path / f"x{i}", f"x{i}"), repos[i])
    settle = 4.0
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "prune", "--store", seaweed_bucket.url,
         "--keep-latest", "1", "--settle", str(settle), "--yes", "--json"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=300,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    print(f"prune of 102 bucket repos (2 to prune), settle {settle} s: {elapsed:.1f} s")
    # A settle per repo would take 102 x 4 s; 120 s tells them apart with room for load.
    assert elapsed < 120, elapsed
    assert elapsed >= settle  # it did settle (once)
    doc = json.loads(proc.stdout)
    changed = [r for r in doc["repos"] if r["revisions"]]
    assert len(changed) == 2
    for repo in repos:
        folder = store.folder(repo, "model")
        with pytest.raises(ObjectNotFound):
            store.objects.head(store.lease_name(folder))


def test_expired_and_max_size_on_a_bucket_use_the_one_planner(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    """``--expired`` reads the stamp from the blob's header by range requests;
    ``--max-size`` evicts deepest in ref history first and never a served commit."""
    import numpy as np

    from cmh import save_file

    store = open_store(seaweed_bucket)
    folder = store.folder(REPO, "model")
    stamped = tmp_path / "stamped"
    stamped.mkdir()
    save_file({"w": np.arange(64, dtype=np.float32)}, stamped / "model.safetensors", ttl="1d")
    expiring = store.add_folder(stamped, REPO, revision="exp")
    kept = [store.add_folder(src(tmp_path / f"k{i}", f"k{i}"), REPO) for i in range(3)]
    later = time.time() + 3 * 86400
    plan, _ = prune_bucket(store, PrunePolicy(expired=True, include_referenced=True),
                           dry_run=True, now=later)  # fmt: skip
    (repo,) = plan.repos
    assert [(r.commit, r.reasons) for r in repo.revisions] == [(expiring.commit, ("expired",))]
    assert repo.revisions[0].expires_at is not None
    plan, _ = prune_bucket(store, PrunePolicy(expired=True), dry_run=True, now=later)
    assert plan.repos[0].revisions == ()  # referenced: only with --include-referenced

    # --max-size 0: everything that may go goes, deepest first; both ref heads stay.
    plan, report = prune_bucket(store, PrunePolicy(max_size=0), settle=0, clock=FakeClock())
    assert report is not None and not report.all_errors
    gone = {r.commit for r in report.repos[0].revisions}
    assert gone == {kept[0].commit, kept[1].commit}
    assert store.resolve_revision(folder, "main") == kept[2].commit
    assert store.resolve_revision(folder, "exp") == expiring.commit
    assert any("still" in n for n in plan.notes)  # served commits keep it over the size


def test_cli_mirror_add_says_it_waits_on_a_lease(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    store = open_store(seaweed_bucket)
    folder = store.folder(REPO, "model")
    store.add_folder(src(tmp_path / "a", "a"), REPO)
    store.objects.put(store.lease_name(folder), b'{"owner": "cmh prune pid 7 on host-x"}')
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmh.cli.main", "mirror", "add", str(src(tmp_path / "b", "b")),
         "--store", seaweed_bucket.url, "--repo", REPO],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.stderr is not None
    said = ""
    while "waiting for" not in said:  # it hashed, uploaded and reached the lease check
        line = proc.stderr.readline()
        assert line, f"ended without waiting: {said}"
        said += line
    assert proc.poll() is None  # still waiting
    store.objects.delete(store.lease_name(folder))  # the pruner finishes
    out, err = proc.communicate(timeout=60)
    err = said + err
    assert proc.returncode == 0, err
    assert "waiting for cmh prune pid 7 on host-x" in err
    assert "(new commit)" in out


class JumpyClock(FakeClock):
    """A clock that moves ``step`` seconds forward each time it is read."""

    def __init__(self, step: float) -> None:
        super().__init__()
        self.step = step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def test_a_long_settle_renews_the_leases_and_a_slow_repo_stops_in_time(
    seaweed_bucket: SeaweedBucket, env: dict, tmp_path: Path
) -> None:
    store = open_store(seaweed_bucket)
    folder = store.folder(REPO, "model")
    first = store.add_folder(src(tmp_path / "a", "a"), REPO)
    store.add_folder(src(tmp_path / "b", "b"), REPO)
    etags: list[str] = []
    real_renew = store.renew_lease

    def renew(folder: str, owner: str) -> bool:
        ok = real_renew(folder, owner)
        etags.append(store.objects.head(store.lease_name(folder)).etag)
        return ok

    store.renew_lease = renew  # type: ignore[method-assign]
    plan = plan_prune(scan_bucket(store), PrunePolicy(keep_latest=1))
    report = execute_bucket_plan(store, plan, settle=1000.0, clock=FakeClock())
    assert len(etags) >= 1000 // (store.lease_ttl / 4)  # every 150 s of the 1000 s
    assert len(set(etags)) == len(etags)  # each renewal is a new ETag: writers see it
    assert {r.commit for r in report.repos[0].revisions} == {first.commit}

    # A repo whose work outlasts half the lease's lifetime stops deleting, reported.
    store.add_folder(src(tmp_path / "c", "c"), REPO)
    plan = plan_prune(scan_bucket(store), PrunePolicy(keep_latest=1))
    assert plan.repos[0].revisions
    report = execute_bucket_plan(store, plan, settle=0.0, clock=JumpyClock(store.lease_ttl / 2 + 1))
    assert any("outlasted half the lease" in e for e in report.all_errors)
    assert report.repos[0].revisions == []
    with pytest.raises(ObjectNotFound):
        store.objects.head(store.lease_name(folder))
