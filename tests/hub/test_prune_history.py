"""One planner for every store kind: a folder store, a SeaweedFS bucket and a moto bucket
(real servers started by the fixtures) are pruned alike.

On every kind a commit a ref names is never removed by rank, age or size, ``--keep-latest``
counts each branch's history (parents recorded by ``cmh mirror add``), never file or
record times, and a writer whose clock ran 10 minutes ahead cannot make the commit a
branch serves look old. ``--settle`` means the same on both kinds: one wait per run
before deleting, on the injected clock.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from bucket_support import S3_KINDS
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.cache import Clock
from cmh.hub.mirror import BucketStore
from cmh.hub.mirror.stores import MirrorStore
from cmh.hub.prune import ExecuteOptions, PrunePolicy, open_target, plan_prune
from mirror_support import write_tiny_repo
from prune_support import open_kind

KINDS = ("folder", *S3_KINDS)
REPO = "cmh-test/history"
AHEAD = 600.0  # a writer's clock 10 minutes ahead


@dataclass
class Kind:
    name: str
    location: str  # what --store takes
    store: MirrorStore

    def target(self) -> Path | str:
        return Path(self.location) if self.name == "folder" else self.location

    def add(self, tmp_path: Path, version: int, revision: str = "main") -> str:
        src = write_tiny_repo(tmp_path / f"src-{version}", version)
        return self.store.add_folder(src, REPO, revision=revision).commit

    def written_ahead(self, commit: str, seconds: float) -> None:
        """Leave ``commit``'s creation record as a writer whose clock ran ``seconds``
        ahead would have written it (the folder's commit record, the bucket's tree)."""
        if self.name == "folder":
            folder = f"models--{REPO.replace('/', '--')}"
            path = Path(self.location, folder, ".cmh", "commits", f"{commit}.json")
            record = json.loads(path.read_text())
            record["created_at"] += seconds
            path.write_text(json.dumps(record))
            return
        bucket = BucketStore.open(self.location)
        folder = bucket.folder(REPO, "model")
        tree = bucket.read_tree(folder, commit)
        assert tree is not None
        ahead = dataclasses.replace(tree, created_at=tree.created_at + seconds)
        bucket.objects.put(bucket.tree_name(folder, commit), ahead.to_bytes())

    def head(self, ref: str) -> str | None:
        index = self.store.resolve("model", REPO, ref)
        if index is None:
            return None
        assert all(self.store.blob_present(e) for e in index.files.values())
        return index.commit


@pytest.fixture(params=KINDS)
def kind(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Kind]:
    location, store = open_kind(request, tmp_path, monkeypatch, "folder")
    yield Kind(request.param, location, store)


def prune(kind: Kind, *args: str) -> dict:
    result = CliRunner().invoke(
        cli, ["prune", "--store", kind.location, "--json", "--yes", "--settle", "0", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def removed(doc: dict) -> dict[str, list[str]]:
    """commit -> reasons, of each revision the report removes."""
    return {rev["commit"]: rev["reasons"] for r in doc["repos"] for rev in r["revisions"]}


def test_keep_latest_one_keeps_every_branch_head(kind: Kind, tmp_path: Path) -> None:
    main = kind.add(tmp_path, 1)
    dev = kind.add(tmp_path, 2, revision="dev")  # newer than main's commit by every clock
    assert removed(prune(kind, "--keep-latest", "1")) == {}
    assert (kind.head("main"), kind.head("dev")) == (main, dev)


def test_a_writer_ten_minutes_ahead_cannot_push_out_the_served_commit(
    kind: Kind, tmp_path: Path
) -> None:
    old = kind.add(tmp_path, 1)
    kind.written_ahead(old, AHEAD)  # its record says it is the newest commit
    served = kind.add(tmp_path, 2)  # main moves on, from a writer with a true clock
    doc = prune(kind, "--keep-latest", "1")
    assert removed(doc) == {old: ["beyond-keep-latest"]}
    assert kind.head("main") == served


def test_keep_latest_counts_each_branch_history(kind: Kind, tmp_path: Path) -> None:
    first = kind.add(tmp_path, 1)
    second = kind.add(tmp_path, 2)
    third = kind.add(tmp_path, 3)
    dev = kind.add(tmp_path, 4, revision="dev")
    kind.written_ahead(first, AHEAD)
    # main keeps its two latest commits (dev's newer one takes no place of main's).
    assert removed(prune(kind, "--keep-latest", "2")) == {first: ["beyond-keep-latest"]}
    assert (kind.head("main"), kind.head("dev")) == (third, dev)
    assert kind.head(second) == second


def test_older_than_and_max_size_never_take_a_served_commit(kind: Kind, tmp_path: Path) -> None:
    old = kind.add(tmp_path, 1)
    served = kind.add(tmp_path, 2)
    dev = kind.add(tmp_path, 3, revision="dev")
    doc = prune(kind, "--older-than", "0s", "--max-size", "0", "--at", "+30d", "--dry-run")
    assert set(removed(doc)) == {old}
    assert removed(prune(kind, "--max-size", "0")) == {old: ["over-size"]}
    assert (kind.head("main"), kind.head("dev")) == (served, dev)


class SleepyClock(Clock):
    """Real wall time; a monotonic time that only sleeps move, and they move it at once."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return 1000.0 + sum(self.slept)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_settle_is_one_wait_before_deleting_on_every_kind(kind: Kind, tmp_path: Path) -> None:
    kind.add(tmp_path, 1)
    served = kind.add(tmp_path, 2)
    clock = SleepyClock()
    target = open_target(kind.target(), store=True, clock=clock)
    policy = PrunePolicy(keep_latest=1)
    plan = plan_prune(target.scan(policy), policy, clock=clock)
    report = target.execute(plan, ExecuteOptions(settle=40.0))
    assert not report.all_errors and len(report.repos[0].revisions) == 1
    assert sum(clock.slept) == pytest.approx(40.0)
    assert kind.head("main") == served


def test_the_in_flight_grace_keeps_a_fresh_orphan_on_every_kind(kind: Kind, tmp_path: Path) -> None:
    kind.add(tmp_path, 1)
    etag = "b" * 64  # a blob no revision names yet: an import in flight, or a leftover
    name = f"models--{REPO.replace('/', '--')}/blobs/{etag}"
    if kind.name == "folder":
        (Path(kind.location) / name).write_bytes(b"in flight")
    else:
        BucketStore.open(kind.location).objects.put(name, b"in flight")

    def orphans(*at: str) -> list[str]:
        doc = prune(kind, "--dry-run", *at)
        return [i["path"] for r in doc["repos"] for i in r["items"] if i["reason"] == "orphan"]

    assert orphans() == []  # written just now: left alone for the 10-minute grace
    assert orphans("--at", "+1h") == [name]
