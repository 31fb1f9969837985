"""The read side of a store: which commit a revision names and what files it holds.

A snapshot is read without trusting it: each entry must be a symlink whose
target is exactly ``blobs/{40 or 64 hex}`` of the same repo (or a regular file
inside the snapshot, as a copy-mode cache holds). Anything else is left out of
the index, so it can never be listed or served. A blob that is missing or not a
regular file (a symlink is never followed) keeps a link's entry, which answers 503.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cmh.hub.cache import COMMIT_RE, ETAG_RE, LayoutError, RepoLayout, hash_blob, validate_revision

from ._gitobjects import is_lfs, lfs_pointer, lfs_pointer_oid, tree_oids
from ._memo import Memo


@dataclass(frozen=True)
class FileEntry:
    """One file of a commit: where its bytes are and the ids the Hub reports for it."""

    path: str
    size: int
    etag: str  # blob name: SHA-256 for LFS files, git blob SHA-1 otherwise
    oid: str  # git blob id in tree listings (of the LFS pointer for LFS files)
    lfs_sha256: str | None
    source: Path  # the regular file holding the bytes

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.lfs_sha256, self.size)) if self.lfs_sha256 else 0


@dataclass(frozen=True)
class CommitIndex:
    """Every file and directory of one commit of one repo."""

    commit: str
    files: dict[str, FileEntry]
    dir_oids: dict[str, str]  # "" is the root tree
    last_modified: float
    skipped: tuple[str, ...] = field(default=())  # entries refused (unsafe or broken)
    unavailable: frozenset[str] = field(default=frozenset())  # links to a blob that is gone

    @property
    def tree(self) -> str:
        return self.dir_oids[""]

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files.values())

    def is_dir(self, path: str) -> bool:
        return path in self.dir_oids


def revision_refs(revision: str) -> tuple[str, ...]:
    """The stored refs (names below ``refs/``) a revision may name, in the order they are
    looked up (spec 1.3), for every store kind: the name as given; then, for a plain name
    ``X`` (not under ``refs/``), ``refs/heads/X`` and ``refs/tags/X``; for ``refs/heads/X``,
    ``X`` (a plain name is a branch, spec 2.10). ``()`` for an invalid revision."""
    try:
        validate_revision(revision)
    except LayoutError:
        return ()
    if revision.startswith("refs/heads/"):
        return (revision, revision.removeprefix("refs/heads/"))
    if revision.startswith("refs/"):
        return (revision,)
    return (revision, f"refs/heads/{revision}", f"refs/tags/{revision}")


def branch_name(revision: str) -> str:
    """``X`` for ``refs/heads/X`` (the Hub's full name of branch ``X``), else ``revision``:
    what a pull-through revalidates and keeps, so one branch is one ref whatever name
    asked for it."""
    return revision.removeprefix("refs/heads/") or revision


def resolve_revision(repo: RepoLayout, revision: str) -> str | None:
    """The commit a branch, tag, ``refs/pr/N`` or commit names, if its snapshot exists:
    a commit id first, then the first of :func:`revision_refs` naming one."""
    names = revision_refs(revision)
    if names and COMMIT_RE.match(revision) and _is_real_dir(repo.snapshots / revision):
        return revision
    for name in names:
        commit = repo.read_ref(name)
        if commit is not None and _is_real_dir(repo.snapshots / commit):
            return commit
    return None


def repo_exists(repo: RepoLayout) -> bool:
    """True when the repo folder is a real directory with at least one snapshot or ref.

    A held repo takes the steps a missing one does (a look at the folder and one at its
    snapshots; its refs are read only when it has no snapshot), though not the same
    time: listing a held repo's snapshots costs 20-60 µs more than failing to open a
    missing one's (a known limit, docs/mirror.md "Private repos")."""
    folder = _is_real_dir(repo.path)
    try:
        snapshots = any(COMMIT_RE.match(name) for name in os.listdir(repo.snapshots))
    except OSError:
        snapshots = False
    if not folder:
        return False
    return snapshots or bool(repo.refs_by_name())


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _blob_of_link(link: Path, blobs: Path) -> str | None:
    """The blob name a snapshot symlink points at, if it points exactly into ``blobs``."""
    try:
        target = os.readlink(link)
    except OSError:
        return None
    if os.path.isabs(target):
        return None
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    head, name = os.path.split(resolved)
    if head != os.path.normpath(blobs) or not ETAG_RE.match(name):
        return None
    return name


def regular_size(path: Path) -> int | None:
    """The size of the regular file at ``path`` (a link is not followed), else ``None``."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _read_tree_cache(repo: RepoLayout, commit: str) -> dict[str, dict[str, object]]:
    """The stock client's ``trees/{commit}.json`` file entries, or ``{}``."""
    try:
        data = json.loads((repo.trees / f"{commit}.json").read_text())
        files = data["files"] if data.get("format_version") == 1 else {}
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def build_index(repo: RepoLayout, commit: str) -> CommitIndex:
    """Index one commit's snapshot (``LayoutError`` if the commit is not a valid id)."""
    base = repo.snapshot_dir(commit)
    cached = _read_tree_cache(repo, commit)
    files: dict[str, FileEntry] = {}
    skipped: list[str] = []
    unavailable: set[str] = set()
    real_repo = os.path.realpath(repo.path) + os.sep
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        here = Path(dirpath)
        names = list(filenames)
        for d in list(dirnames):
            if os.path.islink(here / d):
                dirnames.remove(d)
                names.append(d)  # a symlink to a directory is never followed
        for name in names:
            full = here / name
            rel = full.relative_to(base).as_posix()
            if name.startswith(".") and ".cmh-" in name:
                continue  # a temporary file of an import in progress
            try:
                entry = _entry(repo, rel, full, cached.get(rel))
            except UnavailableEntry:
                unavailable.add(rel)
                continue
            if entry is not None and not (
                os.path.realpath(entry.source.parent) + os.sep
            ).startswith(real_repo):
                entry = None  # reached through a symlinked folder that leaves the repo
            if entry is None:
                skipped.append(rel)
            else:
                files[rel] = entry
    files = dict(sorted(files.items()))
    try:
        mtime = os.lstat(base).st_mtime
    except OSError:
        mtime = 0.0
    meta = _commit_meta(repo, commit)
    created = meta.get("created_at")
    return CommitIndex(
        commit=commit,
        files=files,
        dir_oids=tree_oids({p: f.oid for p, f in files.items()}),
        last_modified=float(created) if isinstance(created, (int, float)) else mtime,
        skipped=tuple(sorted(skipped)),
        unavailable=frozenset(unavailable),
    )


def _cached_size(cached: dict[str, object] | None) -> int | None:
    size = cached.get("size") if cached else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


def _entry(
    repo: RepoLayout, rel: str, full: Path, cached: dict[str, object] | None
) -> FileEntry | None:
    """The entry of one snapshot file, or ``None`` when it must not be served.

    A link to a blob that is missing, not a regular file (a link, a folder), or whose
    size differs from the recorded listing still gives an entry (with the recorded
    size): serving it then fails its open (``O_NOFOLLOW``) or size check and answers
    503 instead of pretending the file is absent. Such a link without a recorded size
    is reported as unavailable through :class:`UnavailableEntry`.
    """
    if os.path.islink(full):
        name = _blob_of_link(full, repo.blobs)
        if name is None:
            return None
        source = repo.blobs / name
        lfs_sha = cached.get("lfs_sha256") if cached else None
        if len(name) == 40 and isinstance(lfs_sha, str) and lfs_sha:
            return None  # an LFS file must be named by its SHA-256
        # a blob that is a link, folder or device is never read (nor followed): it
        # counts as absent, listed by its recorded size and answered 503 when asked
        size = regular_size(source)
        recorded = _cached_size(cached)
        if recorded is not None:
            size = recorded
        elif size is None:
            raise UnavailableEntry(rel)
        if len(name) == 64:
            return FileEntry(rel, size, name, lfs_pointer_oid(name, size), name, source)
        return FileEntry(rel, size, name, name, None, source)
    size = regular_size(full)
    if size is None:
        return None
    _, sha256, git_oid = hash_blob(full, size)
    if is_lfs(rel, size):
        return FileEntry(rel, size, sha256, lfs_pointer_oid(sha256, size), sha256, full)
    return FileEntry(rel, size, git_oid, git_oid, None, full)


class UnavailableEntry(LookupError):
    """A snapshot link to a blob that is gone, with no recorded size to list it by."""


def commit_meta_path(repo: RepoLayout, commit: str) -> Path:
    """cmh's record of an imported commit (tree, parent, creation time)."""
    repo.snapshot_dir(commit)
    return repo.cmh_dir / "commits" / f"{commit}.json"


def _commit_meta(repo: RepoLayout, commit: str) -> dict[str, object]:
    try:
        data = json.loads(commit_meta_path(repo, commit).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


#: Entries (files and folders) of the commit indexes one worker keeps, the least recently
#: used going first: the commits asked for are the clients' choice and one lists up to
#: 100,000 files (about 2 KiB of memory each), so the bound is on entries, not commits
#: (three of the largest listings; 300,000 entries is about 600 MiB at most).
MAX_INDEXED = 300_000
#: What each kept index weighs besides its entries (so small ones are bounded in number).
INDEX_BASE = 256


def index_weight(index: CommitIndex | None) -> int:
    """An index's weight in :data:`MAX_INDEXED`: its files and folders, plus :data:`INDEX_BASE`."""
    return INDEX_BASE + (0 if index is None else len(index.files) + len(index.dir_oids))


class IndexCache:
    """Commit indexes kept in memory (weighing at most ``size``, :func:`index_weight`),
    rebuilt when the snapshot folder or tree file changes."""

    def __init__(self, size: int = MAX_INDEXED) -> None:
        self._entries: Memo[tuple[Path, str], tuple[tuple[int, int], CommitIndex]] = Memo(
            size, weight=lambda kept: index_weight(kept[1])
        )

    def get(self, repo: RepoLayout, commit: str) -> CommitIndex:
        key = (repo.path, commit)
        stamp = self._stamp(repo, commit)
        hit = self._entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        index = build_index(repo, commit)
        self._entries.put(key, (stamp, index))
        return index

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _stamp(repo: RepoLayout, commit: str) -> tuple[int, int]:
        out = [0, 0]
        for i, p in enumerate((repo.snapshots / commit, repo.trees / f"{commit}.json")):
            with contextlib.suppress(OSError):
                out[i] = os.stat(p).st_mtime_ns
        return out[0], out[1]
