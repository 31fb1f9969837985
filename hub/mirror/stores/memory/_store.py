"""A store held in memory (``memory://NAME``): the protocol over dictionaries.

A repo keeps its refs, its commits (each a :class:`~cmh.hub.mirror._index.CommitIndex`
and a :class:`~cmh.hub.mirror._history.CommitRecord`) and its blobs by name; an import
reads, hashes and names every file as the other kinds do, so a blob's bytes are
checked against its name wherever they are read (a wrong blob is refused, never
served). A blob's ``source`` is its name in the layout every kind shares
(``{repo folder}/blobs/{etag}``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from cmh.hub.cache import COMMIT_RE, CUT_MEMORY, Clock, process_clock, repo_folder_name

from ..._errors import BlobUnavailable, StoreError
from ..._gitobjects import commit_oid, is_lfs, lfs_pointer_oid, object_id, tree_oids
from ..._history import CommitRecord, place_changes
from ..._index import CommitIndex, FileEntry, revision_refs
from ..._manifests import ManifestError, compute_streamed
from .._base import HEADER_COPY_MARGIN, WEIGHT_FILES, Document, ScrubView
from .._delivery import PROXY, BlobDelivery, BlobMismatch, BlobMissing
from .._sync import UNCHANGED, UPDATED, SyncRequest, SyncResult, default_sync_cache

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .._pull import PullThrough
    from ..local._folder import ImportOptions, ImportResult, RepoSummary
    from ..local._scrub import ScrubOptions, ScrubReport

#: Every memory store of this process, by name (``memory://NAME``).
_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def open_memory(location: str, clock: Clock | None = None) -> MemoryStore:
    """The store ``memory://NAME`` names in this process (made empty on first use)."""
    with _STORES_LOCK:
        store = _STORES.get(location)
        if store is None:
            store = _STORES[location] = MemoryStore(location, clock)
        return store


def blob_matches(data: bytes, etag: str) -> bool:
    """True when ``data`` hashes to the blob name ``etag`` (SHA-256, or git's blob id)."""
    if len(etag) == 64:
        return hashlib.sha256(data).hexdigest() == etag
    return object_id("blob", data) == etag


@dataclass
class _Repo:
    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, tuple[CommitIndex, CommitRecord]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[str, Document] = field(default_factory=dict)


class MemoryStore:
    """The mirror store of one ``memory://NAME``: repos in this process's memory."""

    deliveries: tuple[str, ...] = (PROXY,)

    def __init__(self, location: str = "memory://", clock: Clock | None = None) -> None:
        self.location = location
        self.clock = clock if clock is not None else process_clock()
        self.on_notice: Callable[[str], None] | None = None
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._lock = threading.RLock()
        self._quarantined: list[Document] = []
        self._last_scrub: Document | None = None
        self._deliveries: dict[str, BlobDelivery] = {}
        #: cut records and access records, kept for every worker of this process
        self.cuts: dict[tuple[str, str, str], float] = {}
        self.access: dict[tuple[str, str], tuple[bool, bool]] = {}

    def __repr__(self) -> str:
        return f"MemoryStore({self.location!r})"

    # -- reading -------------------------------------------------------------------------

    def _repo(self, repo_type: str, repo_id: str) -> _Repo | None:
        return self._repos.get((repo_type, repo_id))

    def repos(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(k for k, r in self._repos.items() if r.commits)

    def repo_exists(self, repo_type: str, repo_id: str) -> bool:
        repo = self._repo(repo_type, repo_id)
        return repo is not None and bool(repo.commits)

    def resolve(
        self, repo_type: str, repo_id: str, revision: str, *, used: bool = False
    ) -> CommitIndex | None:
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            return None
        names = revision_refs(revision)
        with self._lock:
            if names and revision in repo.commits and COMMIT_RE.match(revision):
                return repo.commits[revision][0]
            for name in names:  # the same lookup as every store kind (spec 1.3)
                held = repo.commits.get(repo.refs.get(name, ""))
                if held is not None:
                    return held[0]
        return None

    def refs(self, repo_type: str, repo_id: str) -> dict[str, str]:
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            return {}
        with self._lock:
            return {name: c for name, c in repo.refs.items() if c in repo.commits}

    def commits(self, repo_type: str, repo_id: str) -> list[str]:
        repo = self._repo(repo_type, repo_id)
        return sorted(repo.commits) if repo is not None else []

    def history(self, repo_type: str, repo_id: str, head: CommitIndex) -> list[CommitRecord]:
        repo = self._repo(repo_type, repo_id)
        chain: list[CommitRecord] = []
        commit: str | None = head.commit
        while repo is not None and commit is not None and commit in repo.commits:
            record = repo.commits[commit][1]
            if record in chain:
                break
            chain.append(record)
            commit = record.parent
        return chain or [CommitRecord(head.commit, None, head.last_modified, False)]

    def last_commits(
        self, repo_type: str, repo_id: str, head: CommitIndex, paths: list[str]
    ) -> dict[str, CommitRecord]:
        chain = self.history(repo_type, repo_id, head)
        return place_changes(chain, head, paths, lambda c: self.resolve(repo_type, repo_id, c))

    def _bytes(self, entry: FileEntry) -> bytes:
        """The blob's bytes, checked against its name (:class:`BlobUnavailable` otherwise)."""
        data = self._stored(entry)
        if data is None:
            raise BlobMissing("blob unavailable: not in the store")
        if len(data) != entry.size or not blob_matches(data, entry.etag):
            raise BlobMismatch
        return data

    def _stored(self, entry: FileEntry) -> bytes | None:
        """The bytes stored under the entry's blob name, unchecked (None: absent)."""
        folder, _, name = entry.source.as_posix().rpartition("/blobs/")
        with self._lock:
            for (repo_type, repo_id), repo in self._repos.items():
                if repo_folder_name(repo_id, repo_type) == folder:
                    return repo.blobs.get(name)
        return None

    def opener(self, entry: FileEntry) -> BinaryIO:
        return io.BytesIO(self._bytes(entry))

    @contextlib.contextmanager
    def local_files(
        self, index: CommitIndex, paths: list[str], *, stamped_headers: bool = False
    ) -> Iterator[dict[str, Path]]:
        """Checked copies of ``paths`` in a temporary folder. With ``stamped_headers``, a
        model's own weights (:data:`~.._base.WEIGHT_FILES`) in a commit without code,
        whose kept manifest shows the stamp true, get their stamp's check record (as a
        bucket's do): a fingerprint reads their header and hashes nothing."""
        from .._copies import checked_copies

        def copy(entry: FileEntry, path: str, dest: Path, vouch: bool) -> bool:
            try:
                data = self._bytes(entry)
            except BlobUnavailable as exc:
                raise OSError(str(exc)) from None
            dest.write_bytes(data)
            return (
                vouch
                and WEIGHT_FILES.fullmatch(path) is not None
                and (self._vouch(entry, data, dest))
            )

        with checked_copies(index, paths, stamped_headers, copy) as files:
            yield files

    def _vouch(self, entry: FileEntry, data: bytes, dest: Path) -> bool:
        """Record the stamp of ``dest`` (the checked bytes of ``entry``) as checked when the
        manifest kept at import vouches for it; False otherwise."""
        from cmh import CMHError, header_size_from_prefix, parse_header, record_check

        from ..._manifests import vouched_root

        doc = next(
            (r.manifests[entry.etag] for r in self._repos.values() if entry.etag in r.manifests),
            None,
        )
        if doc is None or len(data) < 8:
            return False
        try:
            size = header_size_from_prefix(data[:8])
            header = parse_header(data[8 : 8 + size], entry.size)
        except (CMHError, ValueError):
            return False
        root = vouched_root(doc, entry.etag, header, self.clock.time() + HEADER_COPY_MARGIN)
        return root is not None and record_check(dest, root)

    def blob_present(self, entry: FileEntry) -> bool:
        return self._stored(entry) is not None

    def manifest(self, repo_type: str, repo_id: str, entry: FileEntry) -> Document:
        repo = self._repo(repo_type, repo_id)
        kept = repo.manifests.get(entry.etag) if repo is not None else None
        if kept is not None:
            return kept
        data = self._stored(entry)
        if data is None:
            raise OSError("blob unavailable: not in the store")
        doc: Document = compute_streamed([data], entry.etag, entry.size)  # checks the body
        if repo is not None:
            repo.manifests[entry.etag] = doc
        return doc

    # -- writing -------------------------------------------------------------------------

    def create(self) -> None:
        """Nothing to make: a memory store exists from its first use."""

    def add_folder(self, src: Path, repo_id: str, **options: Unpack[ImportOptions]) -> ImportResult:
        from ..local._folder import (
            ImportResult,
            SourceFile,
            check_import_names,
            hash_source,
            scan_folder,
        )

        revision = options.get("revision", "main")
        repo_type = options.get("repo_type", "model")
        check_import_names(repo_id, revision, repo_type)
        files: list[tuple[SourceFile, bytes]] = []
        for rel, path in scan_folder(src):
            size, sha256, git_oid = hash_source(path, options.get("progress"))
            data = path.read_bytes()
            f = SourceFile(rel, path, size, sha256, git_oid, is_lfs(rel, size))
            if len(data) != size or not blob_matches(data, f.etag):
                raise StoreError(f"{path} changed while it was imported")
            files.append((f, data))
        dirs = tree_oids({f.path: f.tree_oid for f, _ in files})
        folder = repo_folder_name(repo_id, repo_type)
        with self._lock:
            repo = self._repos.setdefault((repo_type, repo_id), _Repo())
            head = repo.refs.get(revision)
            parent = head if head is not None else repo.refs.get("main")
            if parent not in repo.commits:
                parent = None
            new_blobs = new_bytes = 0
            for f, data in files:
                stored = repo.blobs.get(f.etag)
                if stored is None or not blob_matches(stored, f.etag):  # repairs a bad one
                    repo.blobs[f.etag] = data
                    new_blobs += 1
                    new_bytes += f.size
                if f.path.endswith(".safetensors") and f.lfs and f.etag not in repo.manifests:
                    with contextlib.suppress(ManifestError):  # as a folder's import keeps them
                        repo.manifests[f.etag] = compute_streamed([data], f.etag, f.size)
            created = parent is None or repo.commits[parent][0].tree != dirs[""]
            commit = commit_oid(dirs[""], [parent] if parent else []) if created else parent
            assert commit is not None
            if created:
                now = self.clock.time()
                entries = {
                    f.path: FileEntry(
                        f.path,
                        f.size,
                        f.etag,
                        lfs_pointer_oid(f.sha256, f.size) if f.lfs else f.git_oid,
                        f.sha256 if f.lfs else None,
                        Path(f"{folder}/blobs/{f.etag}"),
                    )
                    for f, _ in files
                }
                index = CommitIndex(commit, entries, dirs, now)
                repo.commits[commit] = (index, CommitRecord(commit, parent, now, True))
            repo.refs[revision] = commit
        return ImportResult(
            repo_id=repo_id, repo_type=repo_type, revision=revision, commit=commit,
            parent=repo.commits[commit][1].parent, created=created, ref_moved=head != commit,
            files=len(files), total_bytes=sum(f.size for f, _ in files),
            new_blobs=new_blobs, new_bytes=new_bytes,
        )  # fmt: skip

    def sync(self, request: SyncRequest) -> SyncResult:
        """Resolve into ``cache_dir`` (or the default sync cache), then import its snapshot
        at ``revision``."""
        cache = request.cache_dir or default_sync_cache(self.location)
        res = request.fetch(cache)
        before = self.resolve(request.repo_type, request.repo_id, request.revision)
        result = self.add_folder(Path(res.path), request.repo_id, revision=request.revision,
                                 repo_type=request.repo_type)  # fmt: skip
        same = before is not None and before.commit == result.commit
        return SyncResult(res, UNCHANGED if same else UPDATED, cache)

    def record_upstream_freshness(
        self, repo_type: str, repo_id: str, commit: str, fresh_until: float
    ) -> None:
        raise StoreError("a memory store does not pull through")

    # -- delivery ------------------------------------------------------------------------

    def delivery(self, mode: str) -> BlobDelivery:
        """The ``proxy`` delivery: this process sends the checked bytes."""
        made = self._deliveries.get(mode)
        if made is None:
            if mode not in self.deliveries:
                raise StoreError(f"a memory store has no {mode!r} delivery")
            from ._delivery import MemoryDelivery

            made = self._deliveries[mode] = MemoryDelivery(self._bytes, mode)
        return made

    # -- pull-through ----------------------------------------------------------------------

    def pull_through(self, fresh_for: float, *, fill_lease_ttl: float | None = None) -> PullThrough:
        """The store's records (access, cuts); it fills nothing (``check`` refuses)."""
        from ._pull import MemoryRecords

        return MemoryRecords(self)

    def cut_recently(self, key: tuple[str, str, str]) -> bool:
        """True when ``key``'s blob was cut less than ``CUT_MEMORY`` s ago (a time in the
        future counts as recent)."""
        at = self.cuts.get(key)
        return at is not None and self.clock.time() - at < CUT_MEMORY

    # -- housekeeping ----------------------------------------------------------------------

    def check(self) -> None:
        """A memory store can always be served."""

    def size(self, skip: Callable[[str, str], bool]) -> tuple[int, int]:
        total = repos = 0
        with self._lock:
            for (repo_type, repo_id), repo in self._repos.items():
                if skip(repo_type, repo_id) or not repo.commits:
                    continue
                repos += 1
                total += sum(len(b) for b in repo.blobs.values())
        return total, repos

    def list_store(self) -> list[RepoSummary]:
        from ..local._folder import RefSummary, RepoSummary

        out = []
        with self._lock:
            for (repo_type, repo_id), repo in sorted(self._repos.items()):
                refs = []
                for name, commit in sorted(repo.refs.items()):
                    files = repo.commits[commit][0].files.values()
                    refs.append(RefSummary(name, commit, len(files), sum(f.size for f in files)))
                usage = len(repo.blobs), sum(map(len, repo.blobs.values()))
                out.append(RepoSummary(repo_id, repo_type, refs, sorted(repo.commits), *usage))
        return out

    def scrub(self, **options: Unpack[ScrubOptions]) -> ScrubReport:
        """Re-hash every blob; a bad one is taken out of the store (quarantined: kept
        aside with a note, never served) unless ``do_quarantine`` is False."""
        from ..local._scrub import BlobCheck, ScrubReport

        report = ScrubReport()
        progress = options.get("progress")
        with self._lock:
            for (repo_type, repo_id), repo in sorted(self._repos.items()):
                for etag, data in sorted(repo.blobs.items()):
                    ok = blob_matches(data, etag)
                    method = "sha256" if len(etag) == 64 else "sha1"
                    where = None
                    if not ok and options.get("do_quarantine", True):
                        del repo.blobs[etag]
                        where = f"{self.location}/.quarantine/{etag}"
                        self._quarantined.append({"repo": repo_id, "repo_type": repo_type,
                                                  "blob": etag, "size": len(data),
                                                  "quarantined_at": self.clock.time()})  # fmt: skip
                    report.checks.append(BlobCheck(repo_id, etag, len(data), method, ok,
                                                   quarantined_to=where))  # fmt: skip
                    if progress is not None:
                        progress(len(data))
            self._last_scrub = {**report.to_dict(), "finished_at": self.clock.time()}
        return report

    def scrub_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for r in self._repos.values() for b in r.blobs.values())

    def scrub_history(self) -> ScrubView:
        return ScrubView(self._last_scrub, list(self._quarantined))
