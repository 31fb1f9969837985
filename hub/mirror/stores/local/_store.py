"""A store in a local folder (the stock Hugging Face cache layout)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from cmh.hub.cache import (
    COMMIT_RE,
    Clock,
    LayoutError,
    RepoLayout,
    iter_repos,
    parse_repo_folder,
    process_clock,
    record_use,
)

from ..._errors import BlobUnavailable, StoreError, StoreMissing
from ..._history import CommitRecord, history, last_commits
from ..._index import CommitIndex, FileEntry, IndexCache, repo_exists, resolve_revision
from ..._send import open_blob
from .._delivery import PROXY, X_ACCEL, BlobDelivery
from .._sync import UNCHANGED, UPDATED, SyncRequest, SyncResult
from ._delivery import FileDelivery
from ._folder import ImportOptions, ImportResult, RepoSummary
from ._scrub import ScrubOptions, ScrubReport
from ._verify import BlobVerifier

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .._base import ScrubView


#: Whether a repo folder holds a snapshot, by the mtime of its ``snapshots/`` folder:
#: every list page reads every repo, and a ``stat`` is cheaper than a ``scandir``.
_snapshot_seen: dict[str, tuple[int, bool]] = {}
#: A ``snapshots/`` folder changed this recently is read again (its mtime may not
#: yet show a change made within the same clock tick).
SNAPSHOT_SETTLE_NS = 2_000_000_000


def _has_snapshot(folder: str) -> bool:
    snapshots = os.path.join(folder, "snapshots")
    try:
        mtime = os.stat(snapshots).st_mtime_ns
    except OSError:
        return False
    seen = _snapshot_seen.get(folder)
    if seen is not None and seen[0] == mtime:
        return seen[1]
    try:
        with os.scandir(snapshots) as it:
            found = any(COMMIT_RE.match(e.name) and e.is_dir(follow_symlinks=False) for e in it)
    except OSError:
        return False
    if time.time_ns() - mtime > SNAPSHOT_SETTLE_NS:
        if len(_snapshot_seen) > 100_000:
            _snapshot_seen.clear()
        _snapshot_seen[folder] = (mtime, found)
    return found


class LocalStore:
    """The mirror store of one folder."""

    deliveries: tuple[str, ...] = (PROXY, X_ACCEL)

    def __init__(self, root: Path, clock: Clock | None = None) -> None:
        self.clock = clock if clock is not None else process_clock()  # its records' times
        self.on_notice: Callable[[str], None] | None = None  # a folder's writers never wait
        self.root = root.resolve() if root.exists() else root.absolute()
        self.location = str(root)
        self.indexes = IndexCache()
        #: Which blob versions hash to their names (one per worker: its deliveries share it).
        self.verifier = BlobVerifier()
        self._deliveries: dict[str, FileDelivery] = {}

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"

    def _repo(self, repo_type: str, repo_id: str) -> RepoLayout:
        return RepoLayout(self.root, repo_id, repo_type)

    def check(self) -> None:
        if not self.root.is_dir():
            raise StoreMissing(
                f"{self.location}: store folder not found (a store is made by the first import: "
                f"cmh mirror add DIR --store {self.location} --repo ORG/NAME)"
            )
        self.root = self.root.resolve()

    def create(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.location}: cannot make the store folder: {exc}") from None

    def pull_through(self, fresh_for: float, *, fill_lease_ttl: float | None = None) -> Any:
        if fill_lease_ttl is not None:
            raise StoreError(
                "a fill lease's lifetime applies to bucket stores (--store s3://...) only: "
                "a folder's fills are held by the blob lock, which has no lifetime"
            )
        from ._pull import LocalPullThrough

        return LocalPullThrough(self.root, fresh_for, self.clock)

    def delivery(self, mode: str) -> BlobDelivery:
        """The ``proxy`` (sendfile) or ``x-accel`` (nginx) delivery of this store, one per
        worker and mode, made on first use."""
        made = self._deliveries.get(mode)
        if made is None:
            if mode not in self.deliveries:
                raise StoreError(f"a folder store has no {mode!r} delivery")
            made = self._deliveries[mode] = FileDelivery(self.root, self.verifier, mode)
        return made

    def repos(self) -> list[tuple[str, str]]:
        """Read on every list page and listing (one ``scandir``): a repo with a snapshot
        costs one ``stat`` of its ``snapshots/`` folder once seen (:func:`_has_snapshot`)."""
        out = []
        try:
            with os.scandir(self.root) as it:
                folders = [(e.name, e.path) for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []
        for name, path in folders:
            parsed = parse_repo_folder(name)
            if parsed is None:
                continue
            if _has_snapshot(path) or repo_exists(self._repo(*parsed)):
                out.append(parsed)
        return sorted(out)

    def repo_exists(self, repo_type: str, repo_id: str) -> bool:
        return repo_exists(self._repo(repo_type, repo_id))

    def resolve(
        self, repo_type: str, repo_id: str, revision: str, *, used: bool = False
    ) -> CommitIndex | None:
        repo = self._repo(repo_type, repo_id)
        commit = resolve_revision(repo, revision)
        if commit is None:
            return None
        try:
            index = self.indexes.get(repo, commit)
        except (OSError, LayoutError):
            return None  # a snapshot removed since
        if used:
            record_use(repo, commit, self.clock.time())
        return index

    def refs(self, repo_type: str, repo_id: str) -> dict[str, str]:
        repo = self._repo(repo_type, repo_id)
        return {
            name: commit
            for name, commit in repo.refs_by_name().items()
            if resolve_revision(repo, commit) is not None
        }

    def commits(self, repo_type: str, repo_id: str) -> list[str]:
        return self._repo(repo_type, repo_id).commits()

    def history(self, repo_type: str, repo_id: str, head: CommitIndex) -> list[CommitRecord]:
        return history(self._repo(repo_type, repo_id), head)

    def last_commits(
        self, repo_type: str, repo_id: str, head: CommitIndex, paths: list[str]
    ) -> dict[str, CommitRecord]:
        return last_commits(self._repo(repo_type, repo_id), head, paths, self.indexes)

    def open_checked(self, entry: FileEntry) -> Any:
        """Open an entry's blob; its folder may be reached through links, the file itself
        not, and it must lie inside the store (:class:`BlobUnavailable` otherwise)."""
        folder = os.path.realpath(entry.source.parent)
        if not (folder + os.sep).startswith(str(self.root) + os.sep):
            raise BlobUnavailable("blob lies outside the store")
        return open_blob(Path(folder) / entry.source.name, entry.size)

    def opener(self, entry: FileEntry) -> BinaryIO:
        f: BinaryIO = self.open_checked(entry)
        return f

    @contextlib.contextmanager
    def local_files(
        self, index: CommitIndex, paths: list[str], *, stamped_headers: bool = False
    ) -> Iterator[dict[str, Path]]:
        yield {p: index.files[p].source for p in paths}  # the blobs, with their records

    def blob_present(self, entry: FileEntry) -> bool:
        return os.path.lexists(entry.source)

    def manifest(self, repo_type: str, repo_id: str, entry: FileEntry) -> dict[str, Any]:
        from ..._manifests import load_or_compute

        return load_or_compute(self._repo(repo_type, repo_id), entry.etag, entry.source)

    def size(self, skip: Callable[[str, str], bool]) -> tuple[int, int]:
        total = repos = 0
        for repo in iter_repos(self.root):
            if skip(repo.repo_type, repo.repo_id):
                continue
            repos += 1
            try:
                with os.scandir(repo.blobs) as it:
                    for entry in it:
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
        return total, repos

    def add_folder(self, src: Path, repo_id: str, **options: Unpack[ImportOptions]) -> ImportResult:
        from ._folder import add_folder

        result = add_folder(self.root, src, repo_id, clock=self.clock, **options)
        self.root = self.root.resolve()
        return result

    def list_store(self) -> list[RepoSummary]:
        from ._folder import list_store

        self.check()
        return list_store(self.root)

    def scrub_history(self) -> ScrubView:
        from ._scrub_history import scrub_view

        return scrub_view(self.root)

    def record_upstream_freshness(
        self, repo_type: str, repo_id: str, commit: str, fresh_until: float
    ) -> None:
        from ._pull import write_upstream_record

        try:
            write_upstream_record(
                self._repo(repo_type, repo_id), commit, fresh_until, self.clock.time()
            )
        except OSError as exc:
            raise StoreError(f"{repo_id}@{commit}: cannot record its freshness: {exc}") from None

    def scrub_bytes(self) -> int:
        total = 0
        for repo in iter_repos(self.root):
            if repo.blobs.is_dir():
                total += sum(p.stat().st_size for p in repo.blobs.iterdir() if p.is_file())
        return total

    def scrub(self, **options: Unpack[ScrubOptions]) -> ScrubReport:
        from ._scrub import scrub_store
        from ._scrub_history import record_scrub

        self.check()
        report = scrub_store(self.root, clock=self.clock, **options)
        record_scrub(self.root, report.to_dict(), self.clock.time())  # for the web operator page
        return report

    def sync(self, request: SyncRequest) -> SyncResult:
        """Resolve into the store itself (it is a Hugging Face cache, so a sync again
        asks what changed and an interrupted one resumes); ``cache_dir`` is not used."""
        self.root.mkdir(parents=True, exist_ok=True)
        before = self._held(request.repo_type, request.repo_id, request.revision)
        res = request.fetch(self.root)
        same = before == res.commit and not any(f.bytes_transferred for f in res.files)
        return SyncResult(res, UNCHANGED if same else UPDATED, self.root)

    def _held(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        """The commit ``revision`` names here before a sync (None: none, or unreadable)."""
        try:
            return resolve_revision(self._repo(repo_type, repo_id), revision)
        except (LayoutError, StoreError, OSError):
            return None  # the resolver says what is wrong with the names
