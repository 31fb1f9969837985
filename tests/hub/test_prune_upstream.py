"""``cmh prune --expired`` by upstream freshness, one suite over every store kind: a local
folder, a SeaweedFS bucket and a moto bucket (real servers started by the fixtures).

A pull-through mirror (``cmh serve --upstream``) keeps, per commit, when its upstream
freshness ends (``{repo}/.cmh/upstream/{commit}.json``, spec/hub-mirror.md 8.5). The
records are written here through the store interface, as the mirror writes them, and
the one planner judges both kinds the same way: a commit goes once past the record's
``fresh_until`` (plus ``--grace``), a branch's commit only with ``--include-referenced``,
the record goes with its commit, and a record renewed after the plan was shown keeps
the commit (the executor re-plans). Expiry is judged at an injected time (``--at``) in
dry runs; executions are judged at the wall clock against records an hour off it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from bucket_support import S3_KINDS
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.mirror import BucketStore, ObjectNotFound
from cmh.hub.mirror.stores import MirrorStore
from cmh.hub.prune import PrunePolicy, plan_prune
from cmh.hub.prune._targets import ExecuteOptions, open_target
from hublike import running
from mirror_support import TINY_REPO, MirrorServer, write_tiny_repo
from prune_support import open_kind

KINDS = ("local", *S3_KINDS)
STALE = "cmh-test/stale"  # its freshness ended an hour ago
FRESH = "cmh-test/fresh"  # fresh for another hour
PLAIN = "cmh-test/plain"  # imported, never pulled through: no record
HOUR = 3600.0


@dataclass
class Kind:
    name: str
    location: str  # what --store takes
    store: MirrorStore

    @property
    def settle(self) -> list[str]:
        return [] if self.name == "local" else ["--settle", "0"]

    def target(self) -> Path | str:
        return Path(self.location) if self.name == "local" else self.location

    def has(self, name: str) -> bool:
        """True when the store holds ``name`` (a path relative to the store's root)."""
        if self.name == "local":
            return (Path(self.location) / name).exists()
        try:
            BucketStore.open(self.location).objects.head(name)
            return True
        except ObjectNotFound:
            return False


@pytest.fixture(params=KINDS)
def kind(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Kind]:
    location, store = open_kind(request, tmp_path, monkeypatch, "local")
    yield Kind(request.param, location, store)


def prune(kind: Kind, *args: str) -> dict:
    result = CliRunner().invoke(cli, ["prune", "--store", kind.location, "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def removed(doc: dict) -> dict[str, list[str]]:
    """repo id -> reasons of each revision the plan or report removes."""
    return {
        r["repo_id"]: sorted(reason for rev in r["revisions"] for reason in rev["reasons"])
        for r in doc["repos"]
        if r["revisions"]
    }


def import_three(kind: Kind, tmp_path: Path) -> dict[str, str]:
    commits = {}
    for n, repo in enumerate((STALE, FRESH, PLAIN)):
        result = kind.store.add_folder(write_tiny_repo(tmp_path / f"src-{n}", n + 1), repo)
        commits[repo] = result.commit
    now = time.time()
    kind.store.record_upstream_freshness("model", STALE, commits[STALE], now - HOUR)
    kind.store.record_upstream_freshness("model", FRESH, commits[FRESH], now + HOUR)
    return commits


def record(repo: str, commit: str) -> str:
    return f"models--{repo.replace('/', '--')}/.cmh/upstream/{commit}.json"


def test_expired_by_upstream_freshness_judged_alike_on_every_kind(
    kind: Kind, tmp_path: Path
) -> None:
    commits = import_three(kind, tmp_path)
    # A branch's commit is served: --expired alone keeps it, on every kind.
    assert removed(prune(kind, "--expired", "--dry-run")) == {}
    stale = prune(kind, "--expired", "--include-referenced", "--dry-run")
    assert removed(stale) == {STALE: ["expired"]}
    graced = prune(kind, "--expired", "--include-referenced", "--grace", "2h", "--dry-run")
    assert removed(graced) == {}  # expired an hour ago, not two
    later = prune(kind, "--expired", "--include-referenced", "--dry-run", "--at", "+2h")
    assert removed(later) == {STALE: ["expired"], FRESH: ["expired"]}  # PLAIN never expires

    done = prune(kind, "--expired", "--include-referenced", "--yes", *kind.settle)
    assert removed(done) == {STALE: ["expired"]}
    assert kind.store.resolve("model", STALE, "main") is None
    assert not kind.has(record(STALE, commits[STALE]))  # the record went with its commit
    for repo in (FRESH, PLAIN):
        index = kind.store.resolve("model", repo, "main")
        assert index is not None and index.commit == commits[repo]
        assert all(kind.store.blob_present(e) for e in index.files.values())
    assert kind.has(record(FRESH, commits[FRESH]))


def test_a_record_renewed_after_the_plan_keeps_the_commit(kind: Kind, tmp_path: Path) -> None:
    """The mirror revalidated between the plan shown and its execution: the executor's
    second scan sees the new record and deletes nothing of that commit."""
    commits = import_three(kind, tmp_path)
    target = open_target(kind.target(), store=True)
    policy = PrunePolicy(expired=True, include_referenced=True)
    plan = plan_prune(target.scan(policy), policy)
    assert [r.repo_id for r in plan.changes] == [STALE]
    kind.store.record_upstream_freshness("model", STALE, commits[STALE], time.time() + HOUR)
    report = target.execute(plan, ExecuteOptions(settle=0.0))
    assert not report.all_errors
    assert all(not o.revisions for o in report.repos)
    index = kind.store.resolve("model", STALE, "main")
    assert index is not None and index.commit == commits[STALE]
    assert all(kind.store.blob_present(e) for e in index.files.values())


def test_an_unreadable_record_never_expires_a_commit(kind: Kind, tmp_path: Path) -> None:
    commits = import_three(kind, tmp_path)
    name = record(FRESH, commits[FRESH])
    if kind.name == "local":
        (Path(kind.location) / name).write_text('{"fresh_until": "soon"}')
    else:
        BucketStore.open(kind.location).objects.put(name, b"\xff not json")
    later = prune(kind, "--expired", "--include-referenced", "--dry-run", "--at", "+2h")
    assert removed(later) == {STALE: ["expired"]}


def filled(kind: Kind, commit: str, within: float = 30.0) -> None:
    """Wait until the fill of ``weights.bin`` is installed (it lands just after the last
    byte was sent; a plan made before would not name the blob)."""
    deadline = time.monotonic() + within
    while True:
        index = kind.store.resolve("model", TINY_REPO, commit)
        if index is not None and kind.store.blob_present(index.files["weights.bin"]):
            return
        assert time.monotonic() < deadline, "the fill was never installed"
        time.sleep(0.05)


def test_a_pulled_through_commit_goes_by_its_freshness_and_is_filled_again(
    kind: Kind, mirror: MirrorServer, tmp_path: Path
) -> None:
    """``cmh serve --store S --upstream`` (one replica of a fleet for a bucket) records the
    freshness; the one planner judges it at an injected time, the executor removes the
    commit with its record, and the mirror fills it again on the next request."""
    with running(mirror.url) as front:
        pull = MirrorServer(kind.location, tmp_path / "logs",  # type: ignore[arg-type]
                            extra_args=("--upstream", front.url, "--fresh-for", "1m",
                                        "--ref-ttl", "0"))  # fmt: skip
        try:
            url = f"{pull.url}/{TINY_REPO}/resolve/main/weights.bin"
            first = httpx2.get(url, follow_redirects=True, timeout=60)
            assert first.status_code == 200, first.text
            commit = first.headers["X-Repo-Commit"]
            assert kind.has(record(TINY_REPO, commit))
            filled(kind, commit)
            target = open_target(kind.target(), store=True)
            policy = PrunePolicy(expired=True, include_referenced=True)
            scan = target.scan(policy)
            now = time.time()
            assert plan_prune(scan, policy, now).changes == ()  # fresh for a minute
            # Past the freshness, and past the in-flight grace after the read the mirror
            # recorded (a folder store keeps a revision read within it: it may be sending).
            later = plan_prune(scan, policy, now + 120 + policy.in_flight_grace)
            (repo_plan,) = later.changes
            assert repo_plan.repo_id == TINY_REPO
            assert [(r.commit, r.reasons) for r in repo_plan.revisions] == [(commit, ("expired",))]
            report = target.execute(later, ExecuteOptions(settle=0.0))
            assert not report.all_errors
            assert [r.commit for o in report.repos for r in o.revisions] == [commit]
            assert report.freed >= 300_000  # weights.bin went with its commit
            assert not kind.has(record(TINY_REPO, commit))
            assert kind.store.resolve("model", TINY_REPO, "main") is None
            again = httpx2.get(url, follow_redirects=True, timeout=60)
            assert again.status_code == 200, again.text
            assert hashlib.sha256(again.content).digest() == hashlib.sha256(first.content).digest()
            assert kind.has(record(TINY_REPO, commit))
        finally:
            pull.stop()
