"""``cmh prune`` of a bucket store removes the state of pull-through fills nobody holds,
one suite over a SeaweedFS and a moto bucket (real servers started by the fixtures).

A bucket pull-through (spec/hub-mirror.md 8.6) keeps each fill under
``{repo}/.cmh/fills/{etag}/``: its ``lease``, its ``part-NNNNNN`` objects and ``failed``.
A replica that dies mid-fill leaves them; the planner lists them (kind ``fill``) when their
lease is absent or older than its lifetime on the storage's clock (reason ``abandoned``),
or when the blob they filled is stored (``blob-stored``), and never while a lease is live.
The fill states are written here as a replica writes them (through the store's lease
calls); the lifetime is the planner's parameter, set small, and the test polls until the
storage's own clock has aged the lease past it (no test can move a Last-Modified time).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from bucket_support import S3_KINDS, use_bucket
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.cache import CUT_MEMORY
from cmh.hub.mirror import SYSTEM_CLOCK, BucketStore, ObjectNotFound
from cmh.hub.prune import (
    PrunePlan,
    PrunePolicy,
    execute_bucket_plan,
    plan_prune,
    prune_bucket,
    scan_bucket,
)

REPO = "cmh-test/fills"
FOLDER = "models--cmh-test--fills"
DEAD = "d" * 64  # a fill whose replica died: its lease expired
LIVE = "1" * 64  # a fill in progress: its lease is renewed
TTL = 0.5  # the planner's fill lease lifetime, seconds
PARTS = (b"a" * 3000, b"b" * 1000)


@dataclass
class Fills:
    store: BucketStore
    served: str  # the blob the repo's ref serves
    location: str

    def fill(self, etag: str) -> str:
        return self.store.fill_name(FOLDER, etag)

    def names(self, etag: str) -> set[str]:
        """The objects of a fill's state, by their own name."""
        base = self.fill(etag) + "/"
        return {i.name[len(base) :] for i in self.store.objects.list(self.fill(etag))}

    def has(self, name: str) -> bool:
        try:
            self.store.objects.head(name)
            return True
        except ObjectNotFound:
            return False

    def write(self, etag: str, *, lease_ttl: float | None, failed: bool = False) -> None:
        """A replica's fill: its lease (``None``: none), its parts, maybe a failure."""
        if lease_ttl is not None:
            replica = BucketStore.open(self.location)
            assert replica.take_lease(FOLDER, "cmh serve replica", name=self.fill(etag) + "/lease",
                                      ttl=lease_ttl)  # fmt: skip
        for n, data in enumerate(PARTS):
            self.store.objects.put(f"{self.fill(etag)}/part-{n:06d}", data)
        if failed:
            self.store.objects.put(f"{self.fill(etag)}/failed", b'{"at": 1, "error": "x"}')


@pytest.fixture(params=S3_KINDS)
def fills(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fills:
    bucket = request.getfixturevalue(f"{request.param}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    store = BucketStore.open(bucket.url, write_window=5.0, lease_poll=0.1)
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights.bin").write_bytes(b"served" * 5000)
    result = store.add_folder(src, REPO)
    tree = store.read_tree(FOLDER, result.commit)
    assert tree is not None
    (served,) = (f.etag for f in tree.files)
    return Fills(store, served, bucket.url)


def fill_items(plan: PrunePlan) -> dict[str, tuple[str, int]]:
    """etag -> (reason, bytes) of each fill state the plan removes."""
    return {
        i.path.rsplit("/", 1)[1]: (i.reason, i.size)
        for r in plan.repos
        for i in r.items
        if i.kind == "fill"
    }


def poll_until(what: str, check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what}: the storage's clock did not move"
        time.sleep(0.1)  # the storage's clock moves on its own


def planned(store: BucketStore, policy: PrunePolicy) -> PrunePlan:
    return plan_prune(scan_bucket(store), policy)


#: Last-Modified times have a resolution of one second: a plan made this long after the
#: first that listed the dead fill is judged the same by the executor's own probe.
RESOLUTION = 1.1


def aged_plan(fills: Fills, policy: PrunePolicy) -> PrunePlan:
    """The plan, once the storage's clock has aged the dead fill past its lifetime by more
    than the storage's time resolution (the executor judges it again with its own look at
    the storage's clock)."""
    plans: list[PrunePlan] = []
    first: list[float] = []

    def dead_listed_long_enough() -> bool:
        plans.append(planned(fills.store, policy))
        if DEAD not in fill_items(plans[-1]):
            return False
        first.append(first[0] if first else time.monotonic())
        return time.monotonic() - first[0] >= RESOLUTION

    poll_until("the dead fill's lease", dead_listed_long_enough)
    return plans[-1]


class Clock:
    """A monotonic clock whose sleeps only move it (the settle is 0 here anyway)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return SYSTEM_CLOCK.time()

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_dead_fills_go_live_ones_stay_and_the_served_blob_is_never_touched(
    fills: Fills,
) -> None:
    store = fills.store
    fills.write(DEAD, lease_ttl=TTL, failed=True)
    fills.write(LIVE, lease_ttl=600.0)  # its holder's lifetime, longer than the planner's
    fills.write(fills.served, lease_ttl=None)  # parts left beside the blob they filled
    policy = PrunePolicy(fill_lease_ttl=TTL)
    plan = aged_plan(fills, policy)
    size = sum(len(p) for p in PARTS)
    failed_size = len(b'{"at": 1, "error": "x"}')
    assert fill_items(plan) == {
        DEAD: ("abandoned", size + failed_size),
        fills.served: ("blob-stored", size),
    }
    assert plan.freed == 2 * size + failed_size
    assert not plan.repos[0].revisions

    report = execute_bucket_plan(store, plan, settle=0, clock=Clock())
    assert not report.all_errors
    (outcome,) = report.repos
    assert {i.path.rsplit("/", 1)[1] for i in outcome.items} == {DEAD, fills.served}
    assert outcome.freed == 2 * size + failed_size
    assert fills.names(DEAD) == set()  # the lease, parts and failure record
    assert fills.names(fills.served) == set()
    assert fills.names(LIVE) == {"lease", "part-000000", "part-000001"}
    # The served blob, its check record, its tree and its ref are untouched.
    assert store.objects.get(store.blob_name(FOLDER, fills.served)) == b"served" * 5000
    assert store.read_check(FOLDER, fills.served) is not None
    assert store.resolve_revision(FOLDER, "main") is not None
    # Nothing is left to remove: the live fill stays while its lease lives.
    assert fill_items(planned(store, policy)) == {}


def test_a_live_lease_keeps_its_fill_whatever_the_planner_lifetime(fills: Fills) -> None:
    """A lease the storage says is young keeps the fill, even with the planner's lifetime
    below its age; one whose holder wrote a long lifetime is judged by that lifetime."""
    fills.write(DEAD, lease_ttl=TTL)
    fills.write(LIVE, lease_ttl=600.0)
    plan = aged_plan(fills, PrunePolicy(fill_lease_ttl=TTL))
    assert LIVE not in fill_items(plan)
    # At the default lifetime (30 s) neither lease has expired: nothing goes.
    assert fill_items(planned(fills.store, PrunePolicy())) == {}


def test_a_fill_taken_over_after_the_plan_was_shown_is_kept(fills: Fills) -> None:
    """The executor re-plans under the repo's lease and takes the fill's own lease before
    deleting: a replica that took the dead fill over meanwhile keeps it whole."""
    store = fills.store
    fills.write(DEAD, lease_ttl=TTL)
    plan = aged_plan(fills, PrunePolicy(fill_lease_ttl=TTL))
    replica = BucketStore.open(fills.location)
    lease, owner = fills.fill(DEAD) + "/lease", "a replica resuming the fill"
    assert replica.take_lease(FOLDER, owner, name=lease, ttl=TTL)  # the dead one's expired
    # The replica renews it with a lifetime of its own: a lease of 0.5 s made the test a
    # race with the machine's load (a busy executor found it expired too, by that time).
    assert replica.renew_lease(FOLDER, owner, name=lease, ttl=60.0)
    report = execute_bucket_plan(store, plan, settle=0, clock=Clock())
    assert not report.all_errors
    assert report.repos[0].items == []
    assert fills.names(DEAD) == {"lease", "part-000000", "part-000001"}


def test_dry_run_lists_fills_with_reason_and_bytes_and_removes_nothing(
    fills: Fills,
) -> None:
    fills.write(DEAD, lease_ttl=TTL)
    fills.write(fills.served, lease_ttl=None)
    before = {i.name for i in fills.store.objects.list(FOLDER)}
    plan, report = prune_bucket(fills.store, PrunePolicy(fill_lease_ttl=TTL), dry_run=True)
    assert report is None and fills.served in fill_items(plan)
    # The CLI's dry run (default lifetime, 30 s: the dead fill's lease is still young).
    result = CliRunner().invoke(cli, ["prune", "--store", fills.location, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (repo,) = doc["repos"]
    fill_docs = [i for i in repo["items"] if i["kind"] == "fill"]
    assert fill_docs == [
        {
            "kind": "fill",
            "path": fills.fill(fills.served),
            "reason": "blob-stored",
            "size": sum(len(p) for p in PARTS),
        }
    ]
    text = CliRunner().invoke(cli, ["prune", "--store", fills.location, "--dry-run"])
    assert text.exit_code == 0, text.output
    assert "fill x1 (blob-stored: a fill whose blob is stored)" in text.output
    assert {i.name for i in fills.store.objects.list(FOLDER)} == before


def test_cut_records_go_once_they_change_no_answer(fills: Fills) -> None:
    """``.cmh/cuts/{etag}`` answers ranges of a blob whole for an hour after a cut (8.3);
    past that (plus the in-flight grace, for the servers' clocks) the record goes, judged by
    its age on the storage's clock (here at an injected time: no test waits an hour)."""
    store = fills.store
    gone, served = "c" * 64, store.cut_name(FOLDER, fills.served)
    store.objects.put(store.cut_name(FOLDER, gone), f"{time.time():.3f}\n".encode())
    store.objects.put(served, f"{time.time():.3f}\n".encode())
    policy = PrunePolicy(in_flight_grace=0)
    assert not [i for r in planned(store, policy).repos for i in r.items if i.kind == "cut-record"]
    later = time.time() + CUT_MEMORY + 5
    plan = plan_prune(scan_bucket(store), policy, now=later)
    items = sorted((i.path, i.reason) for r in plan.repos for i in r.items)
    assert items == sorted([(store.cut_name(FOLDER, gone), "stale"), (served, "stale")])
    report = execute_bucket_plan(store, plan, settle=0, clock=Clock())
    assert not report.all_errors and len(report.repos[0].items) == 2
    assert not fills.has(store.cut_name(FOLDER, gone)) and not fills.has(served)
    assert fills.has(store.blob_name(FOLDER, fills.served))


def test_cut_records_of_a_folder_store_go_by_the_same_rule(tmp_path: Path) -> None:
    from cmh.hub.mirror import open_store
    from cmh.hub.prune import execute_plan, scan_cache

    root = tmp_path / "store"
    store = open_store(root)
    store.create()
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights.bin").write_bytes(b"served" * 5000)
    store.add_folder(src, REPO)
    cuts = root / FOLDER / ".cmh" / "cuts"
    cuts.mkdir(parents=True)
    old, recent = cuts / ("a" * 64), cuts / ("b" * 64)
    for path in (old, recent):
        path.write_text(f"{time.time():.3f}\n")
    spent = time.time() - CUT_MEMORY - PrunePolicy().in_flight_grace - 60
    os.utime(old, (spent, spent))
    plan = plan_prune(scan_cache(root), PrunePolicy())
    (repo,) = plan.repos
    assert [(i.kind, i.path, i.reason) for i in repo.items] == [
        ("cut-record", f"{FOLDER}/.cmh/cuts/{'a' * 64}", "stale")
    ]
    report = execute_plan(plan)
    assert not report.all_errors
    assert not old.exists() and recent.exists()
