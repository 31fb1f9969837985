"""Prune a bucket store (``s3://...``): the same scan, pure plan and report as a local
store, and an executor that deletes refs first, then tree objects, blobs last.

:func:`scan_bucket` turns a bucket's listing into the kind-agnostic
:class:`~cmh.hub.prune._scan.CacheScan` that :func:`~cmh.hub.prune._plan.plan_prune`
plans from: a tree object is a revision (its entries the files, its parents
recorded, so ``--keep-latest`` and ``--max-size`` rank by ref history, never by
the writers' clocks), and a commit a ref names is served, so only ``--expired
--include-referenced`` removes it. A pull-through commit's freshness record
(``{repo}/.cmh/upstream/{commit}.json``, written by ``cmh serve --upstream``) gives
its upstream expiry, as in a folder. Every time the plan goes by is on the storage's
clock, moved onto this process's by one offset (:class:`StorageTime`): the objects'
``Last-Modified`` (a blob's grace, a fill's lease, a cut record) and a revision's
``created_at`` (written from :meth:`BucketStore.storage_time`), so a pruner whose own
clock is off ages nothing wrongly. The lease below keeps an import in flight whole.

:func:`execute_bucket_plan` carries out a plan that was shown:

1. take the lease ``{repo}/.cmh/lease`` of every repo the plan changes
   (``If-None-Match: *``; a lease older than its lifetime on the storage's clock is
   taken over with ``If-Match``; a live one makes the repo skipped);
2. wait ``settle`` seconds, once for the whole run: a writer that found no lease
   moves its ref within its write window, so after the settle every such move is
   visible; later writers wait for the lease. Every held lease is rewritten (a new
   ETag) each quarter of its lifetime, while waiting and while working;
3. per repo: scan the repo again, re-plan it restricted to the revisions shown,
   and delete only what both plans name (a subset of what was shown, never
   more): refs, then tree objects, then the freshness records of commits gone,
   then blobs, then the check records of removed blobs (``.cmh/checked/{etag}``),
   then spent cut records (each unless rewritten since), then the state of fills
   nobody holds, each under its own fill lease taken as a
   replica takes it (a live one keeps the fill); stop (reported) once half the
   lease's lifetime has passed since it was last rewritten; release the lease.

Repos with nothing to delete get no lease, and a run with nothing to delete no wait.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from cmh.hub.cache import RepoLayout, record_number
from cmh.hub.mirror import (
    SYSTEM_CLOCK,
    BucketError,
    BucketStore,
    Clock,
    ObjectNotFound,
    ObjectStoreError,
    TreeObject,
)

from ._execute import PruneReport, RepoOutcome
from ._plan import (
    KIND_BLOB,
    KIND_CHECKED,
    KIND_CUT,
    KIND_FILL,
    KIND_REF,
    KIND_UPLOAD,
    KIND_UPSTREAM,
    OVER_SIZE,
    ItemRemoval,
    PrunePlan,
    PrunePolicy,
    RepoPlan,
    cut_spent,
    fill_lifetime,
    plan_prune,
    plan_repo,
    upload_path,
    upload_stale,
)
from ._scan import (
    CacheScan,
    Entry,
    FillScan,
    RefScan,
    RepoScan,
    RevisionScan,
    SnapshotFile,
    UploadScan,
)
from ._scan import stamped_expiry_from as _stamped_expiry_from

#: The longest cmh's S3 client keeps trying one request (``ObjectStore``'s defaults: a
#: 60 s timeout, 3 retries): a write is assumed applied within this or not at all.
REQUEST_TIMEOUT = 60.0 * (3 + 1)
SKIPPED_LEASE = "another prune holds the repo's lease"


def default_settle(store: BucketStore) -> float:
    """The wait after taking the leases that makes the writers' rule safe."""
    return store.write_window + REQUEST_TIMEOUT


# -- scan ------------------------------------------------------------------------------


class StorageTime:
    """The storage's clock moved onto this process's: object times become comparable with
    a plan's ``now`` while every age is still measured on the storage's clock alone.

    The offset is taken once, when first needed, from a scratch object
    (:meth:`BucketStore.storage_now`); a storage that refuses it leaves every time
    unknown (:attr:`error` says why), and what needs one is then kept."""

    def __init__(self, store: BucketStore, clock: Clock | None = None) -> None:
        self.store = store
        self.clock = clock or store.clock
        self.offset: float | None = None
        self.error: str | None = None

    def local(self, when: datetime) -> float | None:
        """``when`` (a Last-Modified) on this process's clock, ``None`` when unknown."""
        return self.moved(when.timestamp())

    def moved(self, storage_seconds: float) -> float | None:
        """A time on the storage's clock (a Last-Modified, a tree's ``created_at``) on this
        process's clock, ``None`` when unknown."""
        if self.offset is None and self.error is None:
            try:
                storage = self.store.storage_now()
                self.offset = self.clock.time() - storage  # taken after: ages come out no longer
            except ObjectStoreError as exc:
                self.error = str(exc)
        return None if self.offset is None else storage_seconds + self.offset

    def written(self, when: datetime) -> float:
        """:meth:`local`, infinitely recent when the storage's clock is unknown (the
        in-flight grace then keeps what was written then)."""
        local = self.local(when)
        return math.inf if local is None else local


def scan_bucket(
    store: BucketStore, *, read_expiry: bool = False, clock: Clock | None = None
) -> CacheScan:
    """Scan every repo of a bucket store (a repo with an unreadable tree object is left
    out, with a note: nothing of it can be judged); ``clock``: the store's by default."""
    times = StorageTime(store, clock)
    started = times.clock.time()
    repos: list[RepoScan] = []
    notes: list[str] = []
    for repo_type, repo_id, folder in store.repos():
        try:
            repos.append(
                scan_bucket_repo(store, repo_type, repo_id, folder, read_expiry, times=times)
            )
        except BucketError as exc:
            notes.append(f"{repo_id}: {exc}: nothing pruned in this repo")
    uploads = _uploads(store, times, notes)
    if times.error is not None:
        notes.append(
            f"fills, cut records and uploads kept: cannot read the storage's clock: {times.error}"
        )
    return CacheScan(store.url, started, tuple(repos), read_expiry=read_expiry,
                     notes=tuple(notes), refs_served=True, uploads=uploads)  # fmt: skip


def _uploads(store: BucketStore, times: StorageTime, notes: list[str]) -> tuple[UploadScan, ...]:
    """The store's incomplete multipart uploads, by when each was last written on the
    storage's clock (none when that clock or the listing is not available: none goes)."""
    try:
        listed = store.objects.list_uploads()
    except ObjectStoreError as exc:
        notes.append(f"incomplete multipart uploads kept: cannot list them: {exc}")
        return ()
    out = []
    for u in sorted(listed, key=lambda u: (u.name, u.upload_id)):
        written = times.local(u.last_modified)
        if written is None:
            return ()
        out.append(UploadScan(u.name, u.upload_id, u.size, written))
    return tuple(out)


def scan_bucket_repo(
    store: BucketStore,
    repo_type: str,
    repo_id: str,
    folder: str,
    read_expiry: bool = False,
    *,
    times: StorageTime | None = None,
) -> RepoScan:
    """One repo of a bucket as a :class:`RepoScan` (raises :class:`BucketError` on a tree
    object that is not one); ``times`` reads the storage's clock for the ages of fills and
    cut records."""
    times = times or StorageTime(store)
    refs = tuple(
        RefScan(name, state.commit or None, True, 0.0)
        for name, state in sorted(store.refs(folder).items())
    )
    blobs = {
        etag: Entry(etag, info.size, times.written(info.last_modified))
        for etag, info in store.blob_infos(folder).items()
    }
    upstream = store.upstream_record_infos(folder)
    checked = tuple(
        Entry(etag, info.size, times.written(info.last_modified))
        for etag, info in sorted(store.check_infos(folder).items())
    )
    expiry: dict[str, int | None] = {}
    revisions: list[RevisionScan] = []
    for commit in sorted(store.tree_infos(folder)):
        tree = store.read_tree(folder, commit)
        if tree is not None:
            until = store.read_upstream_freshness(folder, commit) if commit in upstream else None
            revision = _revision(store, folder, tree, read_expiry, expiry, until)
            # Its last activity (--older-than) is its ``created_at``, on the storage's
            # clock (BucketStore.storage_time): moved onto this process's like every
            # other age; unknown, it is infinitely recent.
            created = times.moved(tree.created_at)
            created = math.inf if created is None else created
            revisions.append(replace(revision, last_used=created))
    return RepoScan(
        layout=RepoLayout(Path(folder), repo_id, repo_type),
        mtime=0.0,
        has_snapshots_dir=True,
        refs_is_file=False,
        refs=refs,
        revisions=tuple(revisions),
        snapshot_strays=(),
        blobs=blobs,
        incomplete=(),
        blob_temps=(),
        no_exist=(),
        trees=(),
        used_records=(),
        trash=(),
        lock_files=(),
        checked=checked,
        refs_served=True,
        whole_folder=False,
        upstream_records=tuple(
            Entry(f"{commit}.json", info.size, times.written(info.last_modified))
            for commit, info in sorted(upstream.items())
        ),
        fills=_fills(store, folder, times),
        cuts=_cuts(store, folder, times),
    )


def _cuts(store: BucketStore, folder: str, times: StorageTime) -> tuple[Entry, ...]:
    """The cut records of a repo, by when the storage wrote them (none when its clock is
    unknown: then none goes)."""
    out = []
    for etag, info in sorted(store.cut_infos(folder).items()):
        written = times.local(info.last_modified)
        if written is None:
            return ()
        out.append(Entry(etag, info.size, written))
    return tuple(out)


def _fills(store: BucketStore, folder: str, times: StorageTime) -> tuple[FillScan, ...]:
    """The fills of a repo, their ages on the storage's clock (none when it is unknown:
    then no fill can be judged, so none is listed and none goes)."""
    out = []
    for etag, objects in sorted(store.fill_infos(folder).items()):
        lease_written = lease_ttl = None
        if "lease" in objects:
            try:  # its own read: a lease renewed since the listing is judged by its renewal
                data, info = store.read_small(objects["lease"].name)
            except ObjectNotFound:
                pass  # released meanwhile
            else:
                # A lease not signed with the fleet key has no lifetime to go by.
                body = store.unseal(objects["lease"].name, data, info)
                lease_written = times.local(info.last_modified)
                lease_ttl = None if body is None else record_number(body, "ttl")
                if lease_written is None:
                    return ()
        others = [times.local(i.last_modified) for n, i in objects.items() if n != "lease"]
        if None in others:
            return ()
        newest = max((t for t in others if t is not None), default=None)
        size = sum(i.size for n, i in objects.items() if n != "lease")
        out.append(FillScan(etag, size, lease_written, lease_ttl, newest))
    return tuple(out)


def _revision(
    store: BucketStore,
    folder: str,
    tree: TreeObject,
    read_expiry: bool,
    cache: dict[str, int | None],
    upstream_until: float | None,
) -> RevisionScan:
    files = []
    for f in tree.files:
        expires = None
        if read_expiry and f.path.endswith(".safetensors"):
            if f.etag not in cache:
                cache[f.etag] = _blob_expiry(store, store.blob_name(folder, f.etag), f.size)
            expires = cache[f.etag]
        files.append(SnapshotFile(f.path, f.etag, f.size, False, expires))
    return RevisionScan(tree.commit, tuple(files), 0.0, tree.created_at,
                        upstream_until=upstream_until, parents=tree.parents)  # fmt: skip


def _blob_expiry(store: BucketStore, name: str, size: int) -> int | None:
    try:
        return _stamped_expiry_from(
            lambda start, length: store.objects.get_range(name, start, start + length), size
        )
    except ObjectStoreError:
        return None  # a blob missing or unreadable now: scrub reports it, it never expires


# -- execute ---------------------------------------------------------------------------


def lease_owner() -> str:
    return f"cmh prune pid {os.getpid()} on {socket.gethostname()}"


def execute_bucket_plan(
    store: BucketStore,
    plan: PrunePlan,
    *,
    settle: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
    progress: Callable[[int], None] | None = None,
) -> PruneReport:
    """Delete what ``plan`` (made by :func:`scan_bucket` and ``plan_prune``) names, as far
    as it still holds under the leases; what went, repo by repo. ``progress`` is told the
    bytes each repo was planned to free once it is done (as for a local store)."""
    report = PruneReport(plan)
    _abort_uploads(store, plan, report, clock)
    changes = plan.changes
    if not changes:
        return report
    store.ensure_conditional_writes()
    leases = _Leases(store, clock)
    leased: list[tuple[RepoPlan, RepoOutcome]] = []
    for repo_plan in changes:
        outcome = RepoOutcome(repo_plan.folder, repo_plan.repo_id, repo_plan.repo_type)
        report.repos.append(outcome)
        try:
            if leases.take(repo_plan.folder):
                leased.append((repo_plan, outcome))
            else:
                outcome.skipped = SKIPPED_LEASE
        except ObjectStoreError as exc:
            outcome.errors.append(str(exc))
    if leased:
        wait = default_settle(store) if settle is None else settle
        store.notice(
            f"{store.url}: holding the leases of {len(leased)} "
            f"{'repo' if len(leased) == 1 else 'repos'}; waiting {wait:.0f} s "
            "(--settle, once for the run) for imports in flight before deleting"
        )
        leases.wait(wait)
    for repo_plan, outcome in leased:
        try:
            leases.keep_alive()
            if repo_plan.folder in leases.renewed:
                _RepoDeleter(store, plan, repo_plan, outcome, leases).run()
            else:
                outcome.skipped = SKIPPED_LEASE
        except (ObjectStoreError, BucketError) as exc:
            outcome.errors.append(str(exc))
        finally:
            try:
                store.release_lease(repo_plan.folder)
            except ObjectStoreError as exc:
                outcome.errors.append(f"{exc} (the lease expires by itself)")
            if progress is not None:
                progress(repo_plan.freed)
    return report


def _abort_uploads(store: BucketStore, plan: PrunePlan, report: PruneReport, clock: Clock) -> None:
    """Abort the incomplete multipart uploads the plan shows, each still there and still
    stale when listed again (a part written since keeps it)."""
    shown = {i.path: i for i in plan.root_items if i.kind == KIND_UPLOAD}
    if not shown:
        return
    times = StorageTime(store, clock)
    try:
        uploads = store.objects.list_uploads()
    except ObjectStoreError as exc:
        report.errors.append(str(exc))
        return
    for upload in uploads:
        item = shown.get(upload_path(upload.name, upload.upload_id))
        written = times.local(upload.last_modified)
        if item is None or written is None or not upload_stale(written, plan.policy, plan.now):
            continue
        try:
            store.objects.abort_listed_upload(upload)
        except ObjectStoreError as exc:
            report.errors.append(str(exc))
            continue
        report.root_items.append(item)


class _Leases:
    """The leases one run holds, renewed every quarter of their lifetime."""

    def __init__(self, store: BucketStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.owner = lease_owner()
        self.renewed: dict[str, float] = {}  # folder -> monotonic time of the last write

    def take(self, folder: str) -> bool:
        if not self.store.take_lease(folder, self.owner):
            return False
        self.renewed[folder] = self.clock.monotonic()
        return True

    def keep_alive(self) -> None:
        """Renew the leases written more than a quarter of their lifetime ago (one lost
        to a taker is dropped: its repo is then skipped)."""
        for folder, at in list(self.renewed.items()):
            if self.clock.monotonic() - at >= self.store.lease_ttl / 4:
                if self.store.renew_lease(folder, self.owner):
                    self.renewed[folder] = self.clock.monotonic()
                else:
                    del self.renewed[folder]

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds`` (the settle, once per run), keeping the leases alive."""
        end = self.clock.monotonic() + seconds
        while (left := end - self.clock.monotonic()) > 0:
            self.clock.sleep(min(left, self.store.lease_ttl / 4))
            self.keep_alive()

    def check(self, folder: str) -> None:
        """Refuse to delete once half the lease's lifetime has passed since it was written
        (writers take a lease as abandoned only after the whole lifetime)."""
        at = self.renewed.get(folder)
        if at is None or self.clock.monotonic() - at > self.store.lease_ttl / 2:
            raise BucketError(
                f"{self.store.url}{folder}: stopped, the prune of this repo outlasted half "
                "the lease's lifetime"
            )


@dataclass
class _RepoDeleter:
    """Re-plan one leased repo within what was shown, and delete it in order."""

    store: BucketStore
    plan: PrunePlan
    shown: RepoPlan
    outcome: RepoOutcome
    leases: _Leases

    def run(self) -> None:
        store, shown = self.store, self.shown
        times = StorageTime(store, self.leases.clock)
        repo = scan_bucket_repo(store, shown.repo_type, shown.repo_id, shown.folder,
                                self.plan.policy.expired, times=times)  # fmt: skip
        shown_commits = {r.commit for r in shown.revisions}
        evicted = [r.commit for r in shown.revisions if OVER_SIZE in r.reasons]
        fresh = plan_repo(repo, self.plan.policy, self.plan.now, evicted, only=shown_commits)
        shown_paths = {i.path for i in shown.items}
        items = [i for i in fresh.items if i.path in shown_paths]
        for revision in fresh.revisions:
            for ref in revision.refs:
                self.delete(store.ref_name(shown.folder, ref), 0)
        for item in items:
            if item.kind == KIND_REF:
                self.delete(item.path, 0)
                self.outcome.items.append(item)
        for revision in fresh.revisions:
            self.delete(store.tree_name(shown.folder, revision.commit), 0)
            self.outcome.revisions.append(revision)
        for item in items:
            if item.kind == KIND_UPSTREAM:  # a freshness record of a commit that is gone
                self.delete(item.path, 0)
                self.outcome.items.append(item)
        for item in items:
            if item.kind == KIND_BLOB:
                self.delete(item.path, item.size)
                self.outcome.items.append(item)
        for item in items:  # a blob's check record goes after the blob: never one without it
            if item.kind == KIND_CHECKED:
                self.delete(item.path, 0)
                self.outcome.items.append(item)
        for item in items:
            if item.kind == KIND_CUT and self.cut_still_spent(item.path, times):
                self.delete(item.path, 0)
                self.outcome.items.append(item)
        fills = {store.fill_name(shown.folder, f.etag): f for f in repo.fills}
        for item in items:
            fill = fills.get(item.path)
            if item.kind == KIND_FILL and fill is not None:
                self.remove_fill(item, fill)

    def cut_still_spent(self, name: str, times: StorageTime) -> bool:
        """The cut record was not written again since the scan (a cut just now)."""
        try:
            written = times.local(self.store.objects.head(name).last_modified)
        except ObjectNotFound:
            return False
        return written is not None and cut_spent(written, self.plan.policy, self.plan.now)

    def remove_fill(self, item: ItemRemoval, fill: FillScan) -> None:
        """Delete a fill's state under its own lease, taken as a replica takes it (created,
        or taken over once older than its lifetime): a replica that holds it, or takes it
        first, keeps its fill; one that comes later waits, then fills anew."""
        store, folder = self.store, self.shown.folder
        lease = f"{item.path}/lease"
        self.leases.check(folder)
        ttl = fill_lifetime(fill, self.plan.policy)
        if not store.take_lease(folder, self.leases.owner, name=lease, ttl=ttl):
            return
        try:
            for info in list(store.objects.list(item.path)):
                if info.name != lease:
                    self.delete(info.name, info.size)
        finally:
            store.release_lease(folder, name=lease)
        self.outcome.items.append(item)

    def delete(self, name: str, size: int) -> None:
        self.leases.check(self.shown.folder)
        self.store.objects.delete(name)
        self.outcome.freed += size


def prune_bucket(
    store: BucketStore,
    policy: PrunePolicy,
    *,
    dry_run: bool = False,
    settle: float | None = None,
    now: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> tuple[PrunePlan, PruneReport | None]:
    """Scan, plan and (unless ``dry_run``) execute in one call; the plan and the report."""
    scan = scan_bucket(store, read_expiry=policy.expired, clock=clock)
    plan = plan_prune(scan, policy, now, clock)
    if dry_run:
        return plan, None
    return plan, execute_bucket_plan(store, plan, settle=settle, clock=clock)


__all__ = [
    "REQUEST_TIMEOUT",
    "default_settle",
    "execute_bucket_plan",
    "prune_bucket",
    "scan_bucket",
    "scan_bucket_repo",
]
