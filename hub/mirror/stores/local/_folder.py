"""A mirror store: import a local folder as a new commit of a repo, and list what a store holds.

The store is a directory in the stock Hugging Face cache layout (see
:mod:`cmh.hub.cache._layout`), so a cache filled by any tool can be served as it is
and content is stored once per blob whatever the number of revisions.

Import rules (normative text in ``spec/hub-mirror.md``):

- every regular file under the source folder becomes a repo file (``.git/``
  is skipped; symlinks are followed only when they stay inside the folder);
- LFS files (name pattern or >= 10 MB, see :func:`~cmh.hub.mirror._gitobjects.is_lfs`)
  are named by their SHA-256, the others by their git blob SHA-1, as the Hub
  does; each blob is re-read and checked against its name before it is kept;
- the commit id is the git id of a commit of the tree with the current head of
  the revision as parent and a fixed author, time and message; an unchanged
  tree creates nothing;
- the snapshot and tree listing are written first, the ref moved atomically last.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from cmh.hub.cache import (
    COMMIT_RE,
    SYSTEM_CLOCK,
    Clock,
    LayoutError,
    RepoLayout,
    blob_lock,
    blob_matches,
    hash_blob,
    iter_repos,
    repo_lock,
    validate_relpath,
    validate_repo_id,
    validate_revision,
)

from cmh import atomic_file, atomic_write

from ..._errors import StoreError
from ..._gitobjects import commit_oid, is_lfs, lfs_pointer_oid, tree_oids
from ..._index import build_index, commit_meta_path, resolve_revision
from ..._manifests import keep_for as keep_manifest

SKIPPED_DIRS = frozenset({".git"})

ProgressCallback = Callable[[int], None]


class ImportOptions(TypedDict, total=False):
    """What an import takes beside its source and repo id (:func:`add_folder`); the
    stores pass them on as they are."""

    revision: str  # the ref the import moves ("main")
    repo_type: str  # "model" (default) or "dataset"
    progress: ProgressCallback | None  # told the bytes of both passes


class InvalidNameError(StoreError):
    """A repo id, revision or repo type that cannot name anything in a store."""


@dataclass(frozen=True)
class SourceFile:
    """A file of the folder being imported and the ids it gets."""

    path: str
    source: Path
    size: int
    sha256: str
    git_oid: str
    lfs: bool

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid

    @property
    def tree_oid(self) -> str:
        return lfs_pointer_oid(self.sha256, self.size) if self.lfs else self.git_oid


@dataclass(frozen=True)
class ImportResult:
    """What :func:`add_folder` did."""

    repo_id: str
    repo_type: str
    revision: str
    commit: str
    parent: str | None
    created: bool  # a new commit was written
    ref_moved: bool
    files: int
    total_bytes: int
    new_blobs: int
    new_bytes: int

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def hash_source(path: Path, progress: ProgressCallback | None = None) -> tuple[int, str, str]:
    """``(size, sha256, git blob sha1)`` of a file, in one read (``progress`` sees every piece)."""
    size = os.stat(path).st_size
    read, sha256, git_oid = hash_blob(path, size, progress=progress)
    if read != size:
        raise StoreError(f"{path} changed size while it was read")
    return size, sha256, git_oid


def scan_folder(src: Path, *, links_within: Path | None = None) -> list[tuple[str, Path]]:
    """Files of a source folder by repo path (sorted), refusing links that leave it
    (``links_within``: or leave that folder instead, as a cache snapshot's links into
    its repo's ``blobs/`` do; each path is then the file linked to, so nothing is copied)."""
    root = src.resolve()
    within = links_within.resolve() if links_within is not None else root
    if not root.is_dir():
        raise StoreError(f"{src}: not a directory")
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS or here != root)
        for d in list(dirnames):
            if (here / d).is_symlink():
                raise StoreError(f"{here / d}: symlinked directories are not imported")
        for name in sorted(filenames):
            full = here / name
            rel = full.relative_to(root).as_posix()
            try:
                validate_relpath(rel)
            except LayoutError as exc:
                raise StoreError(f"{full}: {exc}") from None
            if full.is_symlink():
                target = full.resolve()
                if within not in target.parents or not target.is_file():
                    raise StoreError(f"{full}: symlink points outside the folder or at no file")
                full = target
            elif not full.is_file():
                continue  # sockets, fifos, devices
            out.append((rel, full))
    if not out:
        raise StoreError(f"{src}: no file to import")
    return out


def check_import_names(repo_id: str, revision: str, repo_type: str) -> None:
    """Refuse names an import may not use (:class:`InvalidNameError`): any store, any backend."""
    try:
        validate_repo_id(repo_id)
        validate_revision(revision)
    except LayoutError as exc:
        raise InvalidNameError(str(exc)) from None
    if COMMIT_RE.match(revision):
        raise InvalidNameError(f"revision {revision!r} is a commit id: give a branch or tag")
    if repo_type not in ("model", "dataset"):
        raise InvalidNameError(f"invalid repo type {repo_type!r}: model or dataset")


def add_folder(
    store: Path,
    src: Path,
    repo_id: str,
    *,
    revision: str = "main",
    repo_type: str = "model",
    progress: ProgressCallback | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ImportResult:
    """Import ``src`` as a new commit of ``repo_id`` at ``revision`` in ``store``
    (``created_at`` on ``clock``, the store's).

    ``progress`` is told the bytes of two passes: hashing the folder, then storing it
    (a blob already stored counts whole once checked): twice the folder's size in all.
    """
    check_import_names(repo_id, revision, repo_type)
    listed = scan_folder(src)  # a name no client could ask for fails before any write
    store.mkdir(parents=True, exist_ok=True)
    repo = RepoLayout(store, repo_id, repo_type)
    files: list[SourceFile] = []
    for rel, path in listed:
        size, sha256, git_oid = hash_source(path, progress)
        files.append(SourceFile(rel, path, size, sha256, git_oid, is_lfs(rel, size)))
    oids = {f.path: f.tree_oid for f in files}
    tree = tree_oids(oids)[""]
    with repo_lock(repo, shared=True):
        head = repo.read_ref(revision)
        parent = (
            head if head is not None else (repo.read_ref("main") if revision != "main" else None)
        )
        if parent is not None and resolve_revision(repo, parent) is None:
            parent = None  # a dangling ref: start a new history
        new_blobs = new_bytes = 0
        repo.blobs.mkdir(parents=True, exist_ok=True)
        for f in files:  # also repairs a missing or corrupt blob of an unchanged tree
            if _store_blob(repo, f, progress):
                new_blobs += 1
                new_bytes += f.size
            elif progress is not None:
                progress(f.size)
            keep_manifest(repo, f.etag, f.path)  # tensor manifest of a safetensors blob
        if parent is not None and _tree_of(repo, parent) == tree:
            commit, created = parent, False
        else:
            commit = commit_oid(tree, [parent] if parent else [])
            # the same tree on the same parent may have been written by an import to
            # another revision: its snapshot and record (its created_at) are kept, only
            # the ref moves (1.2 step 7: written unless present)
            created = not _present(repo, commit, tree)
        if created:
            for f in files:
                repo.link_snapshot_file(commit, f.path, f.etag)
            _write_tree_cache(repo, commit, files)
            meta = {"tree": tree, "parents": [parent] if parent else [], "created_at": clock.time()}
            commit_meta_path(repo, commit).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(commit_meta_path(repo, commit), json.dumps(meta, indent=1).encode())
        if head != commit:
            repo.write_ref(revision, commit)
    return ImportResult(
        repo_id=repo_id,
        repo_type=repo_type,
        revision=revision,
        commit=commit,
        parent=parent if created else _parent_of(repo, commit),
        created=created,
        ref_moved=head != commit,
        files=len(files),
        total_bytes=sum(f.size for f in files),
        new_blobs=new_blobs,
        new_bytes=new_bytes,
    )


def _present(repo: RepoLayout, commit: str, tree: str) -> bool:
    """Whether ``commit`` is stored whole: its snapshot folder and its record naming ``tree``
    (the record is written last, 1.2 step 7)."""
    return resolve_revision(repo, commit) == commit and _tree_of_record(repo, commit) == tree


def _tree_of_record(repo: RepoLayout, commit: str) -> str | None:
    """The tree id ``commit``'s record names (``None``: no readable record)."""
    try:
        data = json.loads(commit_meta_path(repo, commit).read_text())
        if isinstance(data, dict) and isinstance(data.get("tree"), str):
            return str(data["tree"])
    except (OSError, ValueError):
        pass
    return None


def _tree_of(repo: RepoLayout, commit: str) -> str | None:
    recorded = _tree_of_record(repo, commit)
    if recorded is not None:
        return recorded
    try:
        index = build_index(repo, commit)
    except (OSError, LayoutError):
        return None
    return index.tree


def _parent_of(repo: RepoLayout, commit: str) -> str | None:
    try:
        data = json.loads(commit_meta_path(repo, commit).read_text())
        parents = data.get("parents") if isinstance(data, dict) else None
        return str(parents[0]) if isinstance(parents, list) and parents else None
    except (OSError, ValueError):
        return None


def _store_blob(repo: RepoLayout, f: SourceFile, progress: ProgressCallback | None) -> bool:
    """Make ``blobs/{etag}`` hold ``f``'s checked bytes; True when a new copy was written."""
    dest = repo.blob_path(f.etag)
    with blob_lock(repo, f.etag):
        started = time.time_ns()
        if blob_matches(dest, f.etag, f.size):
            _record_check(dest, f.etag, started)
            return False
        with atomic_file(dest, tag="incoming") as out:
            _, sha256, git_oid = hash_blob(f.source, f.size, copy_to=out, progress=progress)
            out.flush()
            if (sha256, git_oid) != (f.sha256, f.git_oid):
                raise StoreError(f"{f.source} changed while it was imported")
            # Backdated before its check: any later write gives the file a new mtime, so
            # the check recorded below names this version's bytes only (never "racy").
            past = started - BACKDATE_NS
            os.utime(out.name, ns=(past, past))
            os.chmod(out.name, 0o444)
            if not blob_matches(Path(out.name), f.etag, f.size):
                raise StoreError(f"blob {f.etag} of {f.path} failed its check after writing")
        _record_check(dest, f.etag, time.time_ns())
    return True


#: How far back a new blob's mtime is set before its check (see :func:`_store_blob`).
BACKDATE_NS = 5 * 1_000_000_000  # more than any file-time tick, far less than prune's settle


def _record_check(blob: Path, etag: str, started_ns: int) -> None:
    """Record the check ``mirror add`` made of ``blob`` for the server (verify.py), unless
    the version changed too recently before the check for the record to be trusted."""
    from ._verify import FileVersion, racy_seconds, record_path, write_record

    record = record_path(blob, etag)
    if record is None:
        return
    try:
        fd = os.open(blob, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        version = FileVersion.of(fd)
    finally:
        os.close(fd)
    racy = started_ns - max(version.mtime_ns, version.ctime_ns) < racy_seconds(version) * 1e9
    if racy and version.mtime_ns > started_ns - BACKDATE_NS // 2:
        return  # written within the racy window: the server checks it itself
    write_record(record, version)


def _write_tree_cache(repo: RepoLayout, commit: str, files: list[SourceFile]) -> None:
    """``trees/{commit}.json`` in the stock client's format (so the store is also a stock cache)."""
    entries: dict[str, dict[str, object]] = {}
    for f in sorted(files, key=lambda f: f.path):
        info: dict[str, object] = {"size": f.size, "blob_id": f.tree_oid}
        if f.lfs:
            info["lfs_sha256"] = f.sha256
            info["lfs_size"] = f.size
        entries[f.path] = info
    repo.trees.mkdir(parents=True, exist_ok=True)
    data = {"format_version": 1, "files": entries}
    atomic_write(repo.trees / f"{commit}.json", json.dumps(data, indent=1).encode())


# -- listing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RefSummary:
    name: str
    commit: str
    files: int
    bytes: int


@dataclass(frozen=True)
class RepoSummary:
    """One repo of a store: its refs, commits and blob usage."""

    repo_id: str
    repo_type: str
    refs: list[RefSummary] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    blobs: int = 0
    blob_bytes: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "repo_id": self.repo_id,
            "repo_type": self.repo_type,
            "refs": [r.__dict__ for r in self.refs],
            "commits": self.commits,
            "blobs": self.blobs,
            "blob_bytes": self.blob_bytes,
        }


def list_store(store: Path) -> list[RepoSummary]:
    """Every repo of a store with its refs (and each ref's file count and size)."""
    out: list[RepoSummary] = []
    for repo in iter_repos(store):
        refs: list[RefSummary] = []
        for name, commit in sorted(repo.refs_by_name().items()):
            if resolve_revision(repo, commit) is None:
                continue
            index = build_index(repo, commit)
            refs.append(RefSummary(name, commit, len(index.files), index.total_size))
        blobs, blob_bytes = _blob_usage(repo)
        out.append(
            RepoSummary(repo.repo_id, repo.repo_type, refs, repo.commits(), blobs, blob_bytes)
        )
    return out


def _blob_usage(repo: RepoLayout) -> tuple[int, int]:
    count = total = 0
    with contextlib.suppress(OSError), os.scandir(repo.blobs) as it:
        for entry in it:
            if entry.is_file(follow_symlinks=False) and not entry.name.startswith("."):
                count += 1
                total += entry.stat(follow_symlinks=False).st_size
    return count, total
