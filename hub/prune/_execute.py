"""Carry out a prune plan under the locks the resolver and the mirror use.

Per repo: take the repo lock exclusively (wait at most ``lock_timeout``, else
skip the repo), scan the repo again and re-plan it with the same policy and
clock, restricted to what the user was shown; take each doomed revision's lock
exclusively without waiting (a revision in use is kept); then delete in an
order that leaves a cache the stock client and the resolver can read after a
crash at any point:

1. refs that name removed revisions (and dangling or invalid refs): the
   revision is then merely unreferenced;
2. each snapshot folder, moved in one ``rename`` into ``{repo}/.cmh/trash/``
   (never half a snapshot) and then deleted;
3. ``.no_exist/``, ``trees/`` and usage records of removed revisions;
4. blobs no snapshot links to, each under the stock per-blob lock (a download of
   that blob in progress keeps it), and stale ``*.incomplete``. The links are read
   again just before, those of every repo's snapshots (``blobs_linked_now``): a
   snapshot of another repo linked to a blob since the scan (a dedupe) keeps it, as
   it keeps a repo from going whole;
5. lock files of what is gone, each deleted while held.

A repo with nothing left is moved in one ``rename`` into
``{root}/.locks/.cmh-trash/`` (ignored by the stock scanner) and deleted there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cmh.hub.cache import (
    LockBusy,
    LockFileRefused,
    RepoLayout,
    blob_lock,
    flock,
    parse_repo_folder,
    repo_lock,
    revision_lock,
    usage_path,
)

from ._fs import Below
from ._plan import (
    KIND_BLOB,
    KIND_CUT,
    KIND_INCOMPLETE,
    KIND_LOCK,
    KIND_LOCK_DIR,
    KIND_PARTIAL,
    KIND_REF,
    KIND_REF_REWRITE,
    KIND_REFS_FILE,
    KIND_TEMP,
    KIND_TRASH,
    OVER_SIZE,
    ItemRemoval,
    PrunePlan,
    RepoPlan,
    RevisionRemoval,
    cut_spent,
    plan_repo,
    read_lately,
)
from ._scan import (
    REPO_TRASH,
    ROOT_TRASH,
    LinkedFolder,
    RepoScan,
    ScanOptions,
    blobs_linked_now,
    etag_of,
    scan_repo,
)

#: Called with a short action name and the path just before each change on disk.
ChangeHook = Callable[[str, Path], None]

_counter = itertools.count()
#: Items removed under the stock per-blob lock.
_BLOB_KINDS = (KIND_BLOB, KIND_INCOMPLETE, KIND_PARTIAL, KIND_TEMP)


@dataclass
class RepoOutcome:
    """What actually went from one repo."""

    folder: str
    repo_id: str
    repo_type: str
    revisions: list[RevisionRemoval] = field(default_factory=list)
    items: list[ItemRemoval] = field(default_factory=list)
    removed_repo: bool = False
    skipped: str | None = None
    kept_in_use: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    freed: int = 0


@dataclass
class PruneReport:
    """What a prune did, repo by repo."""

    plan: PrunePlan
    repos: list[RepoOutcome] = field(default_factory=list)
    root_items: list[ItemRemoval] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def freed(self) -> int:
        return sum(r.freed for r in self.repos)

    @property
    def skipped(self) -> list[RepoOutcome]:
        return [r for r in self.repos if r.skipped]

    @property
    def all_errors(self) -> list[str]:
        return self.errors + [e for r in self.repos for e in r.errors]


def execute_plan(
    plan: PrunePlan,
    *,
    lock_timeout: float = 10.0,
    on_change: ChangeHook | None = None,
    progress: Callable[[int], None] | None = None,
) -> PruneReport:
    """Delete what ``plan`` names, as far as locks allow; return what went.

    ``progress`` is told the bytes each repo was planned to free once it is done.
    """
    report = PruneReport(plan)
    for repo_plan in plan.changes:
        report.repos.append(_RepoPruner(plan, repo_plan, lock_timeout, on_change).run())
        if progress is not None:
            progress(repo_plan.freed)
    root = _RootPruner(Path(plan.root), on_change)
    for root_item in plan.root_items:
        try:
            if root.remove(root_item):
                report.root_items.append(root_item)
        except OSError as exc:
            report.errors.append(f"{root_item.path}: {exc.strerror or exc}")
    return report


class _RepoPruner:
    def __init__(
        self,
        plan: PrunePlan,
        repo_plan: RepoPlan,
        lock_timeout: float,
        on_change: ChangeHook | None,
    ) -> None:
        self.plan = plan
        self.root = Path(plan.root)  # a local plan: its root is a folder
        self.below = Below(self.root)
        self.planned = repo_plan
        self.layout = RepoLayout(self.root, repo_plan.repo_id, repo_plan.repo_type)
        self.lock_timeout = lock_timeout
        self.on_change = on_change
        self.out = RepoOutcome(repo_plan.folder, repo_plan.repo_id, repo_plan.repo_type)

    def change(self, action: str, path: Path) -> None:
        if self.on_change is not None:
            self.on_change(action, path)

    def run(self) -> RepoOutcome:
        try:
            with repo_lock(self.layout, shared=False, timeout=self.lock_timeout):
                self._run_locked()
        except LockBusy:
            self.out.skipped = "busy: a resolver or the mirror held the repo lock"
        except OSError as exc:  # e.g. no permission on the lock folder: report, go on
            self.out.errors.append(f"{exc.filename or self.layout.path}: {exc.strerror or exc}")
        return self.out

    def _run_locked(self) -> None:
        try:
            policy = self.plan.policy
            options = ScanOptions(policy.expired, policy.ranks, self.plan.refs_served)
            scan = scan_repo(self.layout, options)
            if self.planned.pinned:  # what other repos' snapshots link to stays
                scan = dataclasses.replace(scan, pinned=self.planned.pinned & set(scan.blobs))
        except FileNotFoundError:
            self.out.skipped = "gone: the repo was removed meanwhile"
            return
        except LinkedFolder as exc:
            self.out.skipped = str(exc)
            return
        planned = {r.commit for r in self.planned.revisions}
        evict = [r.commit for r in self.planned.revisions if OVER_SIZE in r.reasons]
        policy, now = self.plan.policy, self.plan.now
        only = planned
        fresh = plan_repo(scan, policy, now, evict, only=only)
        going = {r.commit for r in fresh.revisions}
        self.out.kept_in_use += sorted(read_lately(scan, policy, now) & planned - going)
        with contextlib.ExitStack() as held:
            locked = set()
            for rev in fresh.revisions:
                try:
                    held.enter_context(
                        revision_lock(self.layout, rev.commit, shared=False, timeout=0)
                    )
                    locked.add(rev.commit)
                except LockBusy:
                    self.out.kept_in_use.append(rev.commit)
            for commit in sorted(locked):  # read by the mirror since the scan: it may send it
                if self._read_since_scan(commit):
                    locked.discard(commit)
                    self.out.kept_in_use.append(commit)
            if self.out.kept_in_use:
                only = locked
                fresh = plan_repo(scan, policy, now, evict, only=only)
            if fresh.remove_repo and self.planned.remove_repo:
                folder = self.layout.folder_name  # its own snapshots all go
                linked = blobs_linked_now(self.root, folder, own=False) & set(scan.blobs)
                if linked:  # a snapshot of another repo links to one of its blobs now
                    scan = dataclasses.replace(scan, pinned=scan.pinned | linked)
                    fresh = plan_repo(scan, policy, now, evict, only=only)
            allowed = {(i.kind, i.path) for i in self.planned.items}
            items = [i for i in fresh.items if (i.kind, i.path) in allowed]
            if fresh.remove_repo and self.planned.remove_repo and self._remove_repo(fresh):
                return
            self._remove_parts(scan, fresh, items)

    def _read_since_scan(self, commit: str) -> bool:
        """True when a served store's mirror recorded a read of ``commit`` within the
        in-flight grace (looked at again just before deleting: it takes no lock)."""
        if not self.plan.refs_served:
            return False
        try:
            read = os.lstat(usage_path(self.layout, commit)).st_mtime
        except (OSError, ValueError):
            return False
        return read > self.plan.now - self.plan.policy.in_flight_grace

    # -- a whole repo ------------------------------------------------------------------

    def _remove_repo(self, fresh: RepoPlan) -> bool:
        trash = _trash_name("/".join(ROOT_TRASH), self.layout.folder_name)
        self.change("rename-repo", self.layout.path)
        try:
            self.below.rename(self.layout.folder_name, trash)
        except OSError as exc:
            self.out.errors.append(f"{self.layout.path}: {exc.strerror or exc}")
            return False
        self.out.removed_repo = True
        self.out.revisions = list(fresh.revisions)
        self.out.freed = fresh.size_before
        self.change("delete-trash", self.root / trash)
        _delete_trash(self.below, trash)
        # Lock files last, each removed while held (the repo and revision locks are ours).
        held = {"cmh.repo.lock"} | {f"cmh.rev.{r.commit}.lock" for r in fresh.revisions}
        _remove_lock_dir(self.below, f".locks/{self.layout.folder_name}", held, self.change)
        self.out.items = [i for i in fresh.items if i.kind == KIND_LOCK_DIR]
        return True

    # -- parts of a repo ---------------------------------------------------------------

    def _remove_parts(self, scan: RepoScan, fresh: RepoPlan, items: list[ItemRemoval]) -> None:
        by_kind: dict[str, list[ItemRemoval]] = {}
        for item in items:
            by_kind.setdefault(item.kind, []).append(item)

        # 1. refs: of removed revisions, then dangling and invalid ones.
        folder = self.layout.folder_name
        for rev in fresh.revisions:
            for name in rev.refs:
                self._attempt("unlink-ref", f"{folder}/refs/{name}", self.below.unlink)
        for item in by_kind.pop(KIND_REF, []) + by_kind.pop(KIND_REFS_FILE, []):
            self._attempt_item("unlink-ref", item, self.below.remove_tree)
        for item in by_kind.pop(KIND_REF_REWRITE, []):
            self._attempt_item("rewrite-ref", item, self._rewrite_ref)
        with contextlib.suppress(OSError):  # no refs/ (or not a folder): nothing to tidy
            self.below.remove_empty_folders(f"{folder}/refs")

        # 2. snapshots, each in one rename.
        for rev in fresh.revisions:
            snapshot = f"{folder}/snapshots/{rev.commit}"
            if self._attempt("rename-snapshot", snapshot, self._trash_snapshot):
                self.out.revisions.append(rev)
                self.out.freed += rev.plain_bytes
        removed = {r.commit for r in self.out.revisions}
        failed = {r.commit for r in fresh.revisions} - removed

        # 3. per-revision leftovers, strays, snapshot temporaries, trash.
        locks = {i.path: i for i in by_kind.pop(KIND_LOCK, [])}
        per_blob: list[ItemRemoval] = []
        for kind in _BLOB_KINDS:
            for item in by_kind.pop(kind, []):
                if "/snapshots/" in item.path:  # a temporary link inside a snapshot
                    by_kind.setdefault(KIND_TEMP + "-link", []).append(item)
                else:
                    per_blob.append(item)
        for item in by_kind.pop(KIND_CUT, []):  # unless a cut rewrote it meanwhile
            try:
                written = self.below.lstat(item.path).st_mtime
            except OSError:
                continue  # gone meanwhile
            if cut_spent(written, self.plan.policy, self.plan.now):
                self._attempt_item("unlink-cut", item, self.below.unlink)
        for kind_items in by_kind.values():
            for item in kind_items:
                if leftover_commit(item) not in failed:
                    self._attempt_item(f"remove-{item.kind}", item, self.below.remove_tree)

        # 4. blobs no surviving snapshot links to, and stale partials, under the blob lock.
        still_linked: set[str] = set()
        for commit in failed:
            scanned = scan.revision(commit)
            still_linked |= scanned.blobs if scanned is not None else set()
        if any(item.kind == KIND_BLOB for item in per_blob):  # the links of now, any repo's
            still_linked |= blobs_linked_now(self.root, folder)
        remaining: dict[str, int] = {}
        for name in (*scan.blobs, *(e.name for e in (*scan.incomplete, *scan.partials))):
            remaining[etag_of(name)] = remaining.get(etag_of(name), 0) + 1
        for item in per_blob:
            name = item.path.rsplit("/", 1)[1]
            etag = etag_of(name)
            if item.kind == KIND_BLOB and name in still_linked:
                continue
            try:
                with blob_lock(self.layout, etag, timeout=0):
                    if not self._attempt_item(f"unlink-{item.kind}", item, self.below.unlink):
                        continue
                    if item.kind == KIND_TEMP:
                        continue
                    remaining[etag] = remaining.get(etag, 1) - 1
                    if remaining[etag] <= 0:  # nothing of this blob is left: nor its lock
                        key = f".locks/{folder}/{etag}.lock"
                        self.change("unlink-lock", self.root / key)
                        with contextlib.suppress(OSError):  # gone, or not ours to follow
                            self.below.unlink(key)
                        if key in locks:
                            self.out.items.append(locks.pop(key))
            except LockBusy:
                continue
            except OSError as exc:  # e.g. a lock file that is a link: never followed
                self.out.errors.append(f"{exc.filename or item.path}: {exc.strerror or exc}")
                continue

        # 5. lock files of what is gone, each removed while held.
        held = {f"cmh.rev.{c}.lock" for c in removed}
        for name in sorted(held):  # ours: taken above, whether or not the plan listed them
            key = f".locks/{folder}/{name}"
            listed = locks.pop(key, None)
            self.change("unlink-lock", self.root / key)
            with contextlib.suppress(FileNotFoundError):
                self.below.unlink(key)
                if listed is not None:
                    self.out.items.append(listed)
        for item in locks.values():
            path = self.root / item.path
            if leftover_commit(item) in failed:
                continue
            if path.name in held:
                self._attempt_item("unlink-lock", item, self.below.unlink)
                continue
            try:
                with flock(path, timeout=0):
                    self._attempt_item("unlink-lock", item, self.below.unlink)
            except LockBusy:
                continue
            except OSError as exc:  # e.g. a lock file that is a link: never followed
                self.out.errors.append(f"{exc.filename or item.path}: {exc.strerror or exc}")

    def _trash_snapshot(self, snapshot: str) -> None:
        trash_folder = "/".join((self.layout.folder_name, *REPO_TRASH))
        trash = _trash_name(trash_folder, snapshot.rsplit("/", 1)[1])
        self.below.rename(snapshot, trash)
        self.change("delete-trash", self.root / trash)
        _delete_trash(self.below, trash)

    def _rewrite_ref(self, rel: str) -> None:
        name = rel.split("/refs/", 1)[1]
        commit = self.layout.read_ref(name)
        if commit is not None:
            self.layout.write_ref(name, commit)

    def _attempt(self, action: str, rel: str, do: Callable[[str], None]) -> bool:
        """Do ``do(rel)`` (``rel`` relative to the root); an error is reported, not raised."""
        self.change(action, self.root / rel)
        try:
            do(rel)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self.out.errors.append(f"{self.root / rel}: {exc.strerror or exc}")
            return False
        return True

    def _attempt_item(self, action: str, item: ItemRemoval, do: Callable[[str], None]) -> bool:
        if self._attempt(action, item.path, do):
            self.out.items.append(item)
            self.out.freed += item.size
            return True
        return False


class _RootPruner:
    """Root-level housekeeping: lock folders of repos that are gone, trash."""

    def __init__(self, root: Path, on_change: ChangeHook | None) -> None:
        self.root = root
        self.below = Below(root)
        self.on_change = on_change

    def change(self, action: str, path: Path) -> None:
        if self.on_change is not None:
            self.on_change(action, path)

    def remove(self, item: ItemRemoval) -> bool:
        path = self.root / item.path
        if item.kind == KIND_TRASH:
            self.change("delete-trash", path)
            _delete_trash(self.below, item.path)
            return True
        if item.kind == KIND_LOCK_DIR:
            if (self.root / path.name).exists() or parse_repo_folder(path.name) is None:
                return False  # the repo came back meanwhile
            return _remove_lock_dir(self.below, item.path, set(), self.change)
        return False


# -- helpers ---------------------------------------------------------------------------


def _trash_name(folder: str, name: str) -> str:
    return f"{folder}/{name}.{os.getpid()}.{next(_counter)}"


def _delete_trash(below: Below, trash: str) -> None:
    """Delete a folder moved to a trash, then the trash folder itself once empty."""
    with contextlib.suppress(OSError):
        below.remove_tree(trash)
    with contextlib.suppress(OSError):
        below.rmdir(trash.rsplit("/", 1)[0])


def _remove_lock_dir(below: Below, folder: str, held: set[str], change: ChangeHook) -> bool:
    """Delete every lock file in ``folder`` (taking each that is not ours), then the folder."""
    try:
        names = sorted(below.listdir(folder))
    except FileNotFoundError:
        return False
    except NotADirectoryError:  # a link: never followed
        return False
    for name in names:
        key = f"{folder}/{name}"
        path = below.root / key
        if name in held:
            change("unlink-lock", path)
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                below.unlink(key)
            continue
        with (
            contextlib.suppress(LockBusy, LockFileRefused, IsADirectoryError, FileNotFoundError),
            flock(path, timeout=0),
        ):
            change("unlink-lock", path)
            below.unlink(key)
    try:
        below.rmdir(folder)
    except OSError:
        return False
    return True


def leftover_commit(item: ItemRemoval) -> str | None:
    """The commit a per-revision leftover (no-exist, tree, usage, revision lock) belongs to."""
    name = item.path.rsplit("/", 1)[1]
    if name.startswith("cmh.rev.") and name.endswith(".lock"):
        return name[len("cmh.rev.") : -len(".lock")]
    return name.split(".", 1)[0] or None
