"""Prune policies and the plan they make: what goes from a cache or store, and why.

:func:`plan_prune` is a pure function of a :class:`~cmh.hub.prune._scan.CacheScan`,
a :class:`PrunePolicy` and a clock: it reads no file and changes nothing.
:mod:`cmh.hub.prune._execute` carries a plan out under the repo and revision locks.

Policies select revisions; a revision goes when any selected policy names it
(reasons accumulate). Removing a revision removes the refs that name it, its
snapshot, its ``.no_exist/``, ``trees/``, usage record and lock, and every blob
that no surviving snapshot links to. Housekeeping always runs: orphan blobs,
stale ``*.incomplete`` files, dangling or malformed refs, stray files, the
leftovers of revisions that are gone and, in a bucket, the state of abandoned
pull-through fills. Housekeeping never touches anything modified within
:attr:`PrunePolicy.in_flight_grace` (a download in flight), nor a fill whose lease
is live (:attr:`PrunePolicy.fill_lease_ttl`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cmh.hub.cache import (
    CHECK_RECORDS,
    COMMIT_RE,
    CUT_MEMORY,
    CUT_RECORDS,
    FILL_LEASE_TTL,
    FILL_STATE,
    SYSTEM_CLOCK,
    VERIFIED_MARKERS,
    Clock,
    lease_left,
)

from ._scan import REPO_TRASH, ROOT_TRASH, CacheScan, FillScan, RepoScan, etag_of

DAY = 86400.0

# Why a revision goes.
EXPIRED = "expired"
UNREFERENCED = "unreferenced"
BEYOND_KEEP_LATEST = "beyond-keep-latest"
UNUSED = "unused"
OVER_SIZE = "over-size"
BROKEN = "broken"

# Why a housekeeping item goes.
ORPHAN = "orphan"
UNLINKED = "unlinked"
STALE = "stale"
DANGLING = "dangling"
INVALID = "invalid"
NOT_EXACT = "not-exact"
REVISION_GONE = "revision-gone"
BLOB_GONE = "blob-gone"
REPO_GONE = "repo-gone"
LEFTOVER = "leftover"
EMPTY = "empty"
ABANDONED = "abandoned"  # a fill with no live lease whose objects all outlived it
BLOB_STORED = "blob-stored"  # a fill's state left beside the blob it filled
BLOB_PRESENT = "blob-present"  # a partial download beside the complete blob it was for

#: Every reason a plan gives a revision, and every reason it gives a housekeeping item.
REVISION_REASONS = (EXPIRED, UNREFERENCED, BEYOND_KEEP_LATEST, UNUSED, OVER_SIZE, BROKEN)
ITEM_REASONS = (ORPHAN, UNLINKED, STALE, DANGLING, INVALID, NOT_EXACT, REVISION_GONE,
                BLOB_GONE, REPO_GONE, LEFTOVER, EMPTY, ABANDONED, BLOB_STORED,
                BLOB_PRESENT)  # fmt: skip

# Kinds of housekeeping items (each path relative to the cache root).
KIND_BLOB = "blob"
KIND_INCOMPLETE = "incomplete"
KIND_REF = "ref"
KIND_REF_REWRITE = "ref-rewrite"
KIND_REFS_FILE = "refs-file"
KIND_SNAPSHOT_STRAY = "snapshot-stray"
KIND_TEMP = "temp"
KIND_NO_EXIST = "no-exist"
KIND_TREE = "tree"
KIND_USAGE = "usage"
KIND_LOCK = "lock"
KIND_LOCK_DIR = "lock-dir"
KIND_TRASH = "trash"
KIND_PARTIAL = "partial"
KIND_VERIFIED = "verified"
KIND_CHECKED = "checked"  # a mirror's record of a good blob check (spec/hub-mirror.md 2.1)
KIND_COMMIT_META = "commit-meta"
KIND_UPSTREAM = "upstream-record"
KIND_FILL = "fill"  # a bucket pull-through fill's state: {repo}/.cmh/fills/{etag}/
KIND_CUT = "cut-record"  # when a body of a blob was last cut (spec/hub-mirror.md 8.3)
KIND_UPLOAD = "upload"  # a bucket's incomplete multipart upload: ``{name}?uploadId={id}``

#: Kinds whose size counts as freed (blobs and partial downloads hold the bytes).
_SIZED_KINDS = frozenset(
    {KIND_BLOB, KIND_INCOMPLETE, KIND_TEMP, KIND_PARTIAL, KIND_TREE, KIND_SNAPSHOT_STRAY,
     KIND_FILL, KIND_UPLOAD}
)  # fmt: skip


@dataclass(frozen=True)
class PrunePolicy:
    """Which revisions go. Durations in seconds, sizes in bytes; ``None`` = policy off."""

    expired: bool = False
    grace: float = 0.0
    include_referenced: bool = False
    unreferenced: bool = False
    keep_latest: int | None = None
    older_than: float | None = None
    max_size: int | None = None
    stale_incomplete: float = DAY
    in_flight_grace: float = 600.0
    #: A fill lease's lifetime (seconds): a fill's state goes only once its lease is older
    #: than the longer of this and the lifetime its holder wrote in it.
    fill_lease_ttl: float = FILL_LEASE_TTL

    def __post_init__(self) -> None:
        for name in ("grace", "stale_incomplete", "in_flight_grace"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} cannot be negative")
        if not self.fill_lease_ttl > 0:
            raise ValueError("fill_lease_ttl must be above 0")
        if self.keep_latest is not None and self.keep_latest < 0:
            raise ValueError("keep_latest cannot be negative")
        if self.older_than is not None and self.older_than < 0:
            raise ValueError("older_than cannot be negative")
        if self.max_size is not None and self.max_size < 0:
            raise ValueError("max_size cannot be negative")

    @property
    def ranks(self) -> bool:
        """True when a policy ranks revisions (``keep_latest``, ``max_size``): the scan
        then reads the store's commit records (creation times and parents)."""
        return self.keep_latest is not None or self.max_size is not None


@dataclass(frozen=True)
class RevisionRemoval:
    """A revision that goes: its refs go with it; ``freed`` counts the blobs it takes along."""

    commit: str
    reasons: tuple[str, ...]
    refs: tuple[str, ...]
    size: int
    freed: int
    plain_bytes: int
    last_activity: float
    expires_at: int | None


@dataclass(frozen=True)
class ItemRemoval:
    """A housekeeping item; ``path`` is relative to the cache root."""

    kind: str
    path: str
    reason: str
    size: int = 0


@dataclass(frozen=True)
class RepoPlan:
    """What goes from one repo."""

    repo_id: str
    repo_type: str
    folder: str
    revisions: tuple[RevisionRemoval, ...]
    items: tuple[ItemRemoval, ...]
    remove_repo: bool
    kept: tuple[str, ...]
    size_before: int
    size_after: int
    #: The scan's :attr:`~cmh.hub.prune._scan.RepoScan.pinned`: the executor's second
    #: scan, of this repo alone, keeps them too.
    pinned: frozenset[str] = frozenset()

    @property
    def freed(self) -> int:
        return self.size_before - self.size_after

    @property
    def empty(self) -> bool:
        return not (self.revisions or self.items or self.remove_repo)

    def removes(self, commit: str) -> bool:
        return any(r.commit == commit for r in self.revisions)


@dataclass(frozen=True)
class PrunePlan:
    """What goes from a whole cache or store, judged at ``now``."""

    root: Path | str
    now: float
    policy: PrunePolicy
    repos: tuple[RepoPlan, ...]
    root_items: tuple[ItemRemoval, ...] = ()
    strays: tuple[str, ...] = ()
    size_before: int = 0
    size_after: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Planned from a store's scan (:attr:`CacheScan.refs_served`): the executor's
    #: second scan reads it the same way.
    refs_served: bool = False

    @property
    def freed(self) -> int:
        return self.size_before - self.size_after

    @property
    def changes(self) -> tuple[RepoPlan, ...]:
        """The repo plans that remove something."""
        return tuple(r for r in self.repos if not r.empty)

    @property
    def empty(self) -> bool:
        return not self.changes and not self.root_items

    @property
    def revision_count(self) -> int:
        return sum(len(r.revisions) for r in self.repos)

    def repo(self, folder: str) -> RepoPlan | None:
        for r in self.repos:
            if r.folder == folder:
                return r
        return None


# -- planning --------------------------------------------------------------------------


def plan_prune(
    scan: CacheScan, policy: PrunePolicy, now: float | None = None, clock: Clock = SYSTEM_CLOCK
) -> PrunePlan:
    """The plan for ``scan`` under ``policy`` at ``now`` (default: ``clock``'s time)."""
    at = clock.time() if now is None else now
    repo_plans = {r.layout.folder_name: plan_repo(r, policy, at) for r in scan.repos}
    notes: list[str] = list(scan.notes)
    evictions: dict[str, list[str]] = {}
    if policy.max_size is not None:
        evictions = _evict_for_size(scan, repo_plans, policy, at)
        for repo in scan.repos:
            chosen = evictions.get(repo.layout.folder_name)
            if chosen:
                repo_plans[repo.layout.folder_name] = plan_repo(repo, policy, at, chosen)
        total = sum(p.size_after for p in repo_plans.values())
        if total > policy.max_size:
            notes.append(
                f"still {total} bytes after evicting every revision that can go "
                f"(over --max-size {policy.max_size})"
            )
    notes += _read_notes(scan, policy, at, evictions)
    root_items = _plan_root(scan, policy, at)
    plans = tuple(repo_plans[r.layout.folder_name] for r in scan.repos)
    return PrunePlan(
        root=scan.root,
        now=at,
        policy=policy,
        repos=plans,
        root_items=root_items,
        strays=scan.strays,
        size_before=sum(p.size_before for p in plans),
        size_after=sum(p.size_after for p in plans),
        notes=tuple(notes),
        refs_served=scan.refs_served,
    )


def _read_notes(
    scan: CacheScan, policy: PrunePolicy, now: float, evictions: dict[str, list[str]]
) -> list[str]:
    """A note for each revision a policy names that is kept because it was read lately."""
    notes = []
    for repo in scan.repos:
        held = read_lately(repo, policy, now)
        if not held:
            continue
        evict = evictions.get(repo.layout.folder_name, ())
        for commit in sorted(held & set(select_revisions(repo, policy, now, evict,
                                                         honour_reads=False))):  # fmt: skip
            minutes = policy.in_flight_grace / 60
            notes.append(f"{repo.repo_id}: revision {commit[:12]} was read within the last "
                         f"{minutes:g} minutes (the mirror may be sending it): kept")  # fmt: skip
    return notes


def revision_time(repo: RepoScan, commit: str) -> float:
    """How recent a revision is, for ``--keep-latest``.

    A mirror store's record of when it created the commit, else the later of
    the snapshot folder's and its refs' modification times (when it was last
    fetched or pointed at).
    """
    rev = repo.revision(commit)
    if rev is not None and rev.created_at is not None:
        return rev.created_at
    times = [r.mtime for r in repo.refs if r.commit == commit]
    if rev is not None:
        times.append(rev.mtime)
    return max(times, default=0.0)


def history_depths(repo: RepoScan) -> dict[str, float] | None:
    """How far each revision is from the nearest ref head along recorded parents (0 for
    a commit a ref names; infinity for one no ref reaches, such as the leftover tree of
    an interrupted import); ``None`` when the store records no parents."""
    by_commit = {rev.commit: rev for rev in repo.revisions}
    if not any(rev.parents is not None for rev in repo.revisions):
        return None
    depth: dict[str, float] = {}
    frontier = sorted({r.commit for r in repo.refs if r.commit in by_commit})
    level = 0
    while frontier:
        following: set[str] = set()
        for commit in frontier:
            if commit in depth:
                continue
            depth[commit] = level
            following.update(by_commit[commit].parents or ())
        frontier = sorted(c for c in following if c in by_commit and c not in depth)
        level += 1
    return {c: depth.get(c, math.inf) for c in by_commit}


def recency(repo: RepoScan) -> dict[str, tuple[float, float]]:
    """A sort key per revision, larger = more recent: ref history first (nearer a ref
    head is newer) when the store records it, then :func:`revision_time`."""
    depths = history_depths(repo)
    return {
        rev.commit: (-(depths[rev.commit]) if depths is not None else 0.0,
                     revision_time(repo, rev.commit))
        for rev in repo.revisions
    }  # fmt: skip


def protected(repo: RepoScan) -> frozenset[str]:
    """Commits that go by no rank, age or size: those a ref names in a served store
    (a folder or a bucket alike)."""
    if not repo.refs_served:
        return frozenset()
    return frozenset(r.commit for r in repo.refs if r.commit is not None)


def latest(repo: RepoScan, keep: int) -> frozenset[str]:
    """The revisions ``--keep-latest keep`` keeps: the ``keep`` newest of the repo by
    :func:`recency` and, where the store records parents, the ``keep`` latest commits
    of each branch's history (a ref's commit and its ``keep - 1`` nearest ancestors),
    so no timestamp of any writer decides what a branch keeps."""
    order = recency(repo)
    commits = [rev.commit for rev in repo.revisions if rev.is_commit]
    newest = sorted(commits, key=lambda c: (order[c], c), reverse=True)
    kept = set(newest[:keep])
    depths = history_depths(repo)
    if depths is not None:
        kept.update(c for c in commits if depths[c] < keep)
    return frozenset(kept)


def read_lately(repo: RepoScan, policy: PrunePolicy, now: float) -> frozenset[str]:
    """Revisions of a served store read within the in-flight grace: kept by every policy.

    The mirror records a read (``.cmh/used/{commit}``, at most a minute stale) before it
    sends a body, and takes no lock while it sends: a blob deleted under it cuts the body.
    A cache's readers hold the revision lock instead."""
    if not (repo.refs_served and repo.reads_recorded):
        return frozenset()
    since = now - policy.in_flight_grace
    return frozenset(
        rev.commit for rev in repo.revisions if rev.last_used is not None and rev.last_used > since
    )


def select_revisions(
    repo: RepoScan,
    policy: PrunePolicy,
    now: float,
    evict: Iterable[str] = (),
    *,
    honour_reads: bool = True,
) -> dict[str, list[str]]:
    """Commits the policies select, each with its reasons (none :func:`read_lately`,
    unless ``honour_reads`` is false: what would go but for the reads)."""
    commits = {rev.commit: rev for rev in repo.revisions if rev.is_commit}
    referenced = {r.commit for r in repo.refs if r.commit in commits}
    kept_anyway = protected(repo)
    in_use = read_lately(repo, policy, now) if honour_reads else frozenset()
    reasons: dict[str, list[str]] = {}
    if repo.refs_unknown:  # a ref it cannot read may name any revision: none goes
        return reasons

    def select(commit: str, reason: str) -> None:
        if commit in in_use or (commit in kept_anyway and reason != EXPIRED):
            return
        reasons.setdefault(commit, []).append(reason)

    for commit, rev in sorted(commits.items()):
        if rev.broken and rev.upstream_until is None:  # a pull-through fills those on demand
            select(commit, BROKEN)
        stamped = rev.expires_at
        exp = stamped if rev.upstream_until is None else rev.upstream_until
        if stamped is not None and rev.upstream_until is not None:
            exp = min(stamped, rev.upstream_until)
        expired = policy.expired and exp is not None and now >= exp + policy.grace
        if expired and (policy.include_referenced or commit not in referenced):
            select(commit, EXPIRED)
        if policy.unreferenced and commit not in referenced:
            select(commit, UNREFERENCED)
        if policy.older_than is not None and rev.last_activity < now - policy.older_than:
            select(commit, UNUSED)
    if policy.keep_latest is not None:
        kept = latest(repo, policy.keep_latest)
        for commit in sorted(commits):
            if commit not in kept:
                select(commit, BEYOND_KEEP_LATEST)
    for commit in evict:
        if commit in commits:
            select(commit, OVER_SIZE)
    return reasons


def plan_repo(
    repo: RepoScan,
    policy: PrunePolicy,
    now: float,
    evict: Iterable[str] = (),
    only: Collection[str] | None = None,
) -> RepoPlan:
    """The plan for one repo; ``evict`` adds revisions chosen by ``--max-size``.

    ``only`` restricts which revisions may go (the executor re-plans under the
    repo lock with the revisions the user was shown and could lock).
    """
    reasons = select_revisions(repo, policy, now, evict)
    if only is not None:
        reasons = {c: r for c, r in reasons.items() if c in only}
    return _RepoPlanner(repo, policy, now, reasons).plan()


class _RepoPlanner:
    """Housekeeping and accounting around a chosen set of revisions (one repo)."""

    def __init__(
        self, repo: RepoScan, policy: PrunePolicy, now: float, reasons: dict[str, list[str]]
    ) -> None:
        self.repo = repo
        self.policy = policy
        self.now = now
        self.settled = now - policy.in_flight_grace
        self.reasons = reasons
        self.removed = set(reasons)
        self.folder = repo.layout.folder_name
        self.kept = [rev for rev in repo.revisions if rev.commit not in self.removed]
        self.kept_commits = {rev.commit for rev in self.kept}
        self.items: list[ItemRemoval] = []
        self.surviving_refs: set[str] = set()
        self.freed_blobs: set[str] = set()

    def old(self, mtime: float) -> bool:
        """Settled: not touched within the in-flight grace."""
        return mtime <= self.settled

    def stale(self, mtime: float) -> bool:
        """An interrupted download or write old enough to drop."""
        return mtime <= self.now - self.policy.stale_incomplete and self.old(mtime)

    def item(self, kind: str, rel: str, reason: str, size: int = 0) -> None:
        self.items.append(ItemRemoval(kind, f"{self.folder}/{rel}", reason, size))

    def plan(self) -> RepoPlan:
        self._refs()
        self._snapshots()
        self._blobs()
        self._fills()
        self._cuts()
        named = self.kept_commits | self.surviving_refs
        self._per_commit(named)
        self._per_blob()
        lock_items = self._locks()
        size_before = _repo_size(self.repo)
        removals = self._removals()
        removed_bytes = sum(r.plain_bytes for r in removals) + sum(
            i.size for i in self.items if i.kind in _SIZED_KINDS
        )
        remove_repo = self._repo_empties()
        items = self.items + lock_items
        if remove_repo:
            # The whole folder goes in one rename; only its lock folder lives outside.
            lock_dir = ItemRemoval(KIND_LOCK_DIR, f".locks/{self.folder}", REPO_GONE)
            items = [lock_dir] if self.repo.lock_files else []
            removed_bytes = size_before
        return RepoPlan(
            repo_id=self.repo.repo_id,
            repo_type=self.repo.repo_type,
            folder=self.folder,
            revisions=tuple(removals),
            items=tuple(items),
            remove_repo=remove_repo,
            kept=tuple(sorted(self.kept_commits)),
            size_before=size_before,
            size_after=size_before - removed_bytes,
            pinned=self.repo.pinned,
        )

    def _refs(self) -> None:
        """Refs of removed revisions go with them; dangling and invalid ones once settled."""
        commits = {rev.commit for rev in self.repo.revisions if rev.is_commit}
        for ref in self.repo.refs:
            if ref.unreadable is not None:  # not invalid: unknown, so kept
                self.surviving_refs.add(f"unreadable:{ref.name}")
                continue
            if ref.commit in self.removed:
                continue
            path = f"refs/{ref.name}"
            if ref.commit is None and self.old(ref.mtime):
                self.item(KIND_REF, path, INVALID)
                continue
            if ref.commit is not None and ref.commit not in commits and self.old(ref.mtime):
                self.item(KIND_REF, path, DANGLING)
                continue
            if ref.commit in commits and not ref.exact and self.old(ref.mtime):
                self.item(KIND_REF_REWRITE, path, NOT_EXACT)
            self.surviving_refs.add(ref.commit or f"invalid:{ref.name}")
        if self.repo.refs_is_file and self.old(self.repo.mtime):
            self.item(KIND_REFS_FILE, "refs", INVALID)

    def _snapshots(self) -> None:
        for stray in self.repo.snapshot_strays:
            if self.old(stray.mtime):
                self.item(KIND_SNAPSHOT_STRAY, f"snapshots/{stray.name}", INVALID, stray.size)
        for rev in self.kept:
            for f in rev.files:
                if f.temp and self.old(rev.mtime):
                    self.item(KIND_TEMP, f"snapshots/{rev.commit}/{f.path}", LEFTOVER)

    def _blobs(self) -> None:
        """Blobs only removed revisions linked go now; other orphans once settled."""
        going_temps = {i.path for i in self.items if i.kind == KIND_TEMP}
        live = {
            f.blob
            for rev in self.kept
            for f in rev.files
            if f.blob is not None
            and f"{self.folder}/snapshots/{rev.commit}/{f.path}" not in going_temps
        }
        live |= self.repo.pinned  # other repos' snapshots link to them
        by_commit = {rev.commit: rev for rev in self.repo.revisions}
        linked_by_removed = {b for c in self.removed for b in by_commit[c].blobs}
        for name, blob in sorted(self.repo.blobs.items()):
            if name in live:
                continue
            if name in linked_by_removed:
                self.item(KIND_BLOB, f"blobs/{name}", UNLINKED, blob.size)
                self.freed_blobs.add(name)
            elif self.old(blob.mtime):
                self.item(KIND_BLOB, f"blobs/{name}", ORPHAN, blob.size)
                self.freed_blobs.add(name)
        for kind, entries, prefix in (
            (KIND_INCOMPLETE, self.repo.incomplete, "blobs/"),
            (KIND_TEMP, self.repo.blob_temps, "blobs/"),
            (KIND_PARTIAL, self.repo.partials, ".cmh/partial/"),
        ):
            for e in entries:
                etag = etag_of(e.name)
                if kind != KIND_TEMP and etag in self.repo.blobs and etag not in self.freed_blobs:
                    # Nothing left to resume, whatever its age: the blob is complete (prune
                    # does not hash it; a download in flight holds the blob lock, which
                    # the executor takes).
                    self.item(kind, prefix + e.name, BLOB_PRESENT, e.size)
                elif self.stale(e.mtime):
                    self.item(kind, prefix + e.name, STALE, e.size)

    def _fills(self) -> None:
        """The state of pull-through fills nobody holds: beside the blob it filled, or
        abandoned (every object of it older than the lease's lifetime). A live lease
        keeps it whole: its holder still writes parts and deletes them itself."""
        for f in self.repo.fills:
            lifetime = fill_lifetime(f, self.policy)
            written = f.lease_written
            if written is not None and lease_left(self.now - written, lifetime) >= 0:
                continue
            if f.etag in self.repo.blobs:
                reason = BLOB_STORED
            elif f.newest is None or lease_left(self.now - f.newest, lifetime) < 0:
                reason = ABANDONED
            else:
                continue  # a failure record its waiters still read, parts of a stalled holder
            self.item(KIND_FILL, f"{FILL_STATE}/{f.etag}", reason, f.size)

    def _cuts(self) -> None:
        """Cut records that no longer change any answer: a cut counts for
        :data:`CUT_MEMORY` seconds; the in-flight grace on top covers the clocks of the
        servers that compare it with their own."""
        for e in self.repo.cuts:
            if cut_spent(e.mtime, self.policy, self.now):
                self.item(KIND_CUT, f"{CUT_RECORDS}/{e.name}", STALE)

    def _per_commit(self, named: set[str]) -> None:
        """``.no_exist/``, ``trees/``, usage and commit records of revisions that are gone."""
        for kind, entries, prefix in (
            (KIND_NO_EXIST, self.repo.no_exist, ".no_exist/"),
            (KIND_TREE, self.repo.trees, "trees/"),
            (KIND_TREE, self.repo.cmh_trees, ".cmh/trees/"),
            (KIND_USAGE, self.repo.used_records, ".cmh/used/"),
            (KIND_COMMIT_META, self.repo.commit_meta, ".cmh/commits/"),
            (KIND_UPSTREAM, self.repo.upstream_records, ".cmh/upstream/"),
        ):
            for e in entries:
                commit = e.name.split(".", 1)[0]
                if not COMMIT_RE.match(commit) or commit in named:
                    continue
                if commit in self.removed or self.old(e.mtime):
                    size = e.size if kind == KIND_TREE else 0
                    self.item(kind, prefix + e.name, REVISION_GONE, size)
        for e in self.repo.trash:
            self.item(KIND_TRASH, "/".join((*REPO_TRASH, e.name)), LEFTOVER)

    def _surviving_etags(self) -> set[str]:
        going = {i.path for i in self.items}
        out = set(self.repo.blobs) - self.freed_blobs
        for prefix, entries in (
            ("blobs/", self.repo.incomplete),
            (".cmh/partial/", self.repo.partials),
        ):
            out |= {
                etag_of(e.name) for e in entries if f"{self.folder}/{prefix}{e.name}" not in going
            }
        return out

    def _per_blob(self) -> None:
        surviving = self._surviving_etags()
        for kind, folder, entries in (
            (KIND_VERIFIED, VERIFIED_MARKERS, self.repo.verified),
            (KIND_CHECKED, CHECK_RECORDS, self.repo.checked),
        ):
            for e in entries:
                if e.name not in surviving and (e.name in self.freed_blobs or self.old(e.mtime)):
                    self.item(kind, f"{folder}/{e.name}", BLOB_GONE)

    def _locks(self) -> list[ItemRemoval]:
        surviving = self._surviving_etags()
        out: list[ItemRemoval] = []
        for e in self.repo.lock_files:
            path = f".locks/{self.folder}/{e.name}"
            if e.name.startswith("cmh.rev.") and e.name.endswith(".lock"):
                commit = e.name[len("cmh.rev.") : -len(".lock")]
                if commit not in self.kept_commits and (
                    commit in self.removed or self.old(e.mtime)
                ):
                    out.append(ItemRemoval(KIND_LOCK, path, REVISION_GONE))
            elif e.name.endswith(".lock") and not e.name.startswith("cmh."):
                etag = e.name[: -len(".lock")]
                if etag not in surviving and (etag in self.freed_blobs or self.old(e.mtime)):
                    out.append(ItemRemoval(KIND_LOCK, path, BLOB_GONE))
        return out

    def _removals(self) -> list[RevisionRemoval]:
        """Each removed revision, with the freed blobs counted once (with the first)."""
        counted: set[str] = set()
        out: list[RevisionRemoval] = []
        by_commit = {rev.commit: rev for rev in self.repo.revisions}
        for commit in sorted(self.removed):
            rev = by_commit[commit]
            plain = sum(f.size for f in rev.files if f.plain)
            freed = plain
            for b in sorted(rev.blobs & self.freed_blobs - counted):
                counted.add(b)
                freed += self.repo.blobs[b].size
            out.append(
                RevisionRemoval(
                    commit=commit,
                    reasons=tuple(self.reasons[commit]),
                    refs=self.repo.refs_to(commit),
                    size=sum(f.size for f in rev.files),
                    freed=freed,
                    plain_bytes=plain,
                    last_activity=rev.last_activity,
                    expires_at=rev.expires_at,
                )
            )
        return out

    def _repo_empties(self) -> bool:
        """True when nothing of the repo survives and nothing in it is fresh."""
        if not self.repo.whole_folder or self.repo.foreign_entries:
            return False  # (what is not cache content is never removed)
        if self.kept or self.surviving_refs or self._surviving_etags():
            return False
        going = {i.path for i in self.items}
        for prefix, entries in (
            (".no_exist/", self.repo.no_exist),
            ("trees/", self.repo.trees),
            (".cmh/trees/", self.repo.cmh_trees),
            ("snapshots/", self.repo.snapshot_strays),
            ("blobs/", self.repo.blob_temps),
            (".cmh/commits/", self.repo.commit_meta),
            (f"{CUT_RECORDS}/", self.repo.cuts),  # a recent cut outlives its blob
        ):
            if any(f"{self.folder}/{prefix}{e.name}" not in going for e in entries):
                return False
        if self.repo.refs_is_file and not self.old(self.repo.mtime):
            return False
        # A folder with nothing in it at all goes only once it has been there a while.
        return bool(self.removed or self.items) or self.old(self.repo.mtime)


def cut_spent(written: float, policy: PrunePolicy, now: float) -> bool:
    """True when a cut record written at ``written`` no longer changes any answer (the
    executors check it again just before deleting: a cut may have rewritten it)."""
    return now - written >= CUT_MEMORY + policy.in_flight_grace


def fill_lifetime(fill: FillScan, policy: PrunePolicy) -> float:
    """How long a fill's lease lives: the longer of the policy's and its holder's."""
    return max(policy.fill_lease_ttl, fill.lease_ttl or 0.0)


def _repo_size(repo: RepoScan) -> int:
    plain = sum(f.size for rev in repo.revisions for f in rev.files if f.plain)
    return (
        sum(b.size for b in repo.blobs.values())
        + sum(f.size for f in repo.fills)
        + sum(e.size for e in (*repo.incomplete, *repo.blob_temps, *repo.partials))
        + sum(t.size for t in (*repo.trees, *repo.cmh_trees))
        + sum(s.size for s in repo.snapshot_strays)
        + plain
    )


def _evict_for_size(
    scan: CacheScan, plans: dict[str, RepoPlan], policy: PrunePolicy, now: float
) -> dict[str, list[str]]:
    """Least recently used surviving revisions to evict until the total fits ``max_size``."""
    max_size = policy.max_size
    assert max_size is not None
    total = sum(p.size_after for p in plans.values())
    if total <= max_size:
        return {}
    candidates: list[tuple[float, float, str, str]] = []
    refcount: dict[str, dict[str, int]] = {}
    repos = {r.layout.folder_name: r for r in scan.repos}
    for folder, plan in plans.items():
        if plan.remove_repo:
            continue
        repo = repos[folder]
        counts: dict[str, int] = {}
        order = recency(repo)
        kept_anyway = protected(repo) | read_lately(repo, policy, now)
        for commit in plan.kept:
            rev = repo.revision(commit)
            if rev is None:
                continue
            for b in rev.blobs:
                counts[b] = counts.get(b, 0) + 1
            if rev.is_commit and commit not in kept_anyway:
                candidates.append((order[commit][0], rev.last_activity, folder, commit))
        refcount[folder] = counts
    candidates.sort()
    chosen: dict[str, list[str]] = {}
    for _, _, folder, commit in candidates:
        if total <= max_size:
            break
        repo = repos[folder]
        rev = repo.revision(commit)
        assert rev is not None
        counts = refcount[folder]
        freed = sum(f.size for f in rev.files if f.plain)
        for b in rev.blobs:
            counts[b] -= 1
            if counts[b] == 0 and b in repo.blobs and b not in repo.pinned:
                freed += repo.blobs[b].size
        total -= freed
        chosen.setdefault(folder, []).append(commit)
    return chosen


def _plan_root(scan: CacheScan, policy: PrunePolicy, now: float) -> tuple[ItemRemoval, ...]:
    items = [
        ItemRemoval(KIND_LOCK_DIR, f".locks/{e.name}", REPO_GONE)
        for e in scan.orphan_lock_dirs
        if e.mtime <= now - policy.in_flight_grace
    ]
    items += [
        ItemRemoval(KIND_TRASH, "/".join((*ROOT_TRASH, e.name)), LEFTOVER) for e in scan.trash
    ]
    items += [
        ItemRemoval(KIND_UPLOAD, upload_path(u.name, u.upload_id), STALE, u.size)
        for u in scan.uploads
        if upload_stale(u.mtime, policy, now)
    ]
    return tuple(items)


def upload_path(name: str, upload_id: str) -> str:
    """How a plan names an incomplete multipart upload (as S3 addresses it)."""
    return f"{name}?uploadId={upload_id}"


def upload_stale(written: float, policy: PrunePolicy, now: float) -> bool:
    """True when an incomplete multipart upload last written at ``written`` is an
    interrupted one (``--stale-incomplete``, as a folder's partial files; the executor
    checks it again just before aborting it)."""
    settled = now - max(policy.stale_incomplete, policy.in_flight_grace)
    return written <= settled
