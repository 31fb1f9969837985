"""Prune a bucket store (``s3://...``): refs first, then tree objects, blobs last.

Per repo, unless it is a dry run, the pruner first creates the repo's lease
(``{repo}/.cmh/lease``, ``If-None-Match: *``; another pruner's lease makes it skip
the repo) and then waits ``settle`` seconds before it lists anything. A writer
(:meth:`cmh.hub.mirror.bucket.BucketStore.add_folder`) checks that no lease exists,
and moves its ref at most ``write_window`` seconds later; so with ``settle`` larger
than that window plus the storage's request timeout, every ref move a writer
started before the lease is visible in the pruner's listing, and writers that
came later wait for the lease to go. Only durations measured on one clock are
compared, never two machines' clocks.

Then, in this order: refs that name a removed commit or no tree object (dangling),
the removed commits' tree objects, and the blobs no remaining tree object names.
A reader that resolved a ref just before it went may still fetch a blob of that
commit for as long as the blob stays; blobs go last so that no remaining ref
ever names a tree whose blobs are missing. The pruner stops deleting (and
reports it) if its work on a repo outlasts half the lease's lifetime, after which
writers stop waiting for the lease.

Policies, as for a local store (:class:`~cmh.hub.prune.plan.PrunePolicy`):
``unreferenced``, ``keep_latest`` and ``older_than`` (by the commit's creation
time: a bucket has no use records). ``expired`` and ``max_size`` are not
supported on a bucket (:class:`UnsupportedPolicy`). Unlike a local store, there is
no "recently touched" grace: it would compare the storage's clock with this
machine's, and the lease already keeps every import's commit whole (an import
waiting for the lease uploads again whatever was pruned meanwhile).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from ..mirror.bucket import BucketError, BucketStore, TreeObject
from ..mirror.objectstore import ObjectStoreError, PreconditionFailed
from .plan import PrunePolicy

#: The longest cmh's S3 client keeps trying one request (``ObjectStore``'s defaults: a
#: 60 s timeout, 3 retries): a write is assumed applied within this or not at all.
REQUEST_TIMEOUT = 60.0 * (3 + 1)


class UnsupportedPolicy(ValueError):
    """A prune policy that a bucket store cannot apply."""


@dataclass
class BucketRepoPrune:
    """What went (or would go) from one repo of a bucket."""

    repo_id: str
    repo_type: str
    commits: dict[str, list[str]] = field(default_factory=dict)  # commit -> reasons
    refs: list[str] = field(default_factory=list)
    trees: list[str] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)
    freed: int = 0
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class BucketPruneReport:
    """Every repo of a bucket prune; ``freed`` counts the bytes of every object deleted
    (would be deleted, in a dry run)."""

    store: str
    dry_run: bool
    repos: list[BucketRepoPrune] = field(default_factory=list)

    @property
    def freed(self) -> int:
        return sum(r.freed for r in self.repos)

    @property
    def errors(self) -> list[str]:
        return [e for r in self.repos for e in r.errors]

    def to_dict(self) -> dict[str, object]:
        return {
            "store": self.store,
            "dry_run": self.dry_run,
            "freed": self.freed,
            "repos": [r.to_dict() for r in self.repos],
        }


def default_settle(store: BucketStore) -> float:
    """The wait after taking a lease that makes the writers' rule safe."""
    return store.write_window + REQUEST_TIMEOUT


def check_policy(policy: PrunePolicy) -> None:
    """Refuse the policies a bucket cannot apply."""
    if policy.expired:
        raise UnsupportedPolicy("--expired is not supported on a bucket store")
    if policy.max_size is not None:
        raise UnsupportedPolicy("--max-size is not supported on a bucket store")


def prune_bucket(
    store: BucketStore,
    policy: PrunePolicy,
    *,
    dry_run: bool = False,
    settle: float | None = None,
    now: float | None = None,
) -> BucketPruneReport:
    """Prune every repo of ``store`` by ``policy`` (see the module text for the order)."""
    check_policy(policy)
    report = BucketPruneReport(store.url, dry_run)
    wait = default_settle(store) if settle is None else settle
    for repo_type, repo_id, folder in store.repos():
        outcome = BucketRepoPrune(repo_id, repo_type)
        report.repos.append(outcome)
        try:
            if dry_run:
                _prune_repo(store, folder, policy, outcome, True, now, None)
                continue
            lease = _take_lease(store, folder)
            if lease is None:
                outcome.skipped = "another prune holds the repo's lease"
                continue
            started = time.monotonic()
            try:
                time.sleep(wait)
                _prune_repo(store, folder, policy, outcome, False, now, started)
            finally:
                store.objects.delete(store.lease_name(folder))
        except ObjectStoreError as exc:
            outcome.errors.append(str(exc))
    return report


def _take_lease(store: BucketStore, folder: str) -> str | None:
    doc = {"owner": f"cmh prune pid {os.getpid()}", "ttl": store.lease_ttl}
    try:
        return store.objects.put_if_absent(store.lease_name(folder), json.dumps(doc).encode())
    except PreconditionFailed:
        return None


def _prune_repo(
    store: BucketStore,
    folder: str,
    policy: PrunePolicy,
    out: BucketRepoPrune,
    dry_run: bool,
    now: float | None,
    started: float | None,
) -> None:
    clock = time.time() if now is None else now
    refs = store.refs(folder)
    ref_sizes = {i.name: i.size for i in store.objects.list(f"{folder}/refs")}
    tree_infos = store.tree_infos(folder)
    blob_infos = store.blob_infos(folder)
    trees: dict[str, TreeObject] = {}
    for commit in tree_infos:
        try:
            tree = store.read_tree(folder, commit)
        except ObjectStoreError as exc:
            out.errors.append(str(exc))
            return
        except BucketError as exc:  # an invalid tree object: its blobs cannot be known
            out.errors.append(f"{exc}: nothing pruned in this repo")
            return
        if tree is not None:
            trees[commit] = tree
    referenced = {r.commit for r in refs.values() if r.commit in trees}
    reasons: dict[str, list[str]] = {}
    for commit, tree in sorted(trees.items()):
        if policy.unreferenced and commit not in referenced:
            reasons.setdefault(commit, []).append("unreferenced")
        if policy.older_than is not None and tree.created_at < clock - policy.older_than:
            reasons.setdefault(commit, []).append("unused")
    if policy.keep_latest is not None:
        newest = sorted(trees, key=lambda c: (trees[c].created_at, c), reverse=True)
        for commit in newest[policy.keep_latest :]:
            reasons.setdefault(commit, []).append("beyond-keep-latest")
    doomed = set(reasons)
    out.commits = {c: reasons[c] for c in sorted(doomed)}
    out.refs = sorted(n for n, r in refs.items() if r.commit in doomed or r.commit not in trees)
    out.trees = sorted(doomed)
    keep = {f.etag for c, t in trees.items() if c not in doomed for f in t.files}
    out.blobs = sorted(e for e in blob_infos if e not in keep)
    steps = (
        [(store.ref_name(folder, n), ref_sizes.get(store.ref_name(folder, n), 0)) for n in out.refs]
        + [(store.tree_name(folder, c), tree_infos[c].size) for c in out.trees]
        + [(store.blob_name(folder, e), blob_infos[e].size) for e in out.blobs]
    )
    if dry_run:
        out.freed = sum(size for _, size in steps)
        return
    for name, size in steps:
        if started is not None and time.monotonic() - started > store.lease_ttl / 2:
            out.errors.append("stopped: the prune outlasted half the lease's lifetime")
            return
        store.objects.delete(name)
        out.freed += size
