"""A fast, read-only scan of a Hugging Face cache or a mirror store, for pruning.

Unlike the stock ``scan_cache_dir`` it never gives up on a repo: a missing
``snapshots/`` folder, a dangling ref or a broken link is recorded as a fact
about the repo, so that a plan can repair what the stock scanner only warns
about. It reads each directory once with ``os.scandir``, stats each blob once,
and reads the safetensors header of each stamped blob once (only when asked),
never tensor data.

Nothing here writes to the disk; :mod:`cmh.hub.prune._plan` turns a scan into a
plan and :mod:`cmh.hub.prune._execute` carries it out.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cmh.hub.cache import (
    CHECK_RECORDS,
    COMMIT_RE,
    CUT_RECORDS,
    SYSTEM_CLOCK,
    VERIFIED_MARKERS,
    Clock,
    RepoLayout,
    iter_repos,
    json_value,
    parse_repo_folder,
    record_number,
    usage_path,
)

from cmh import open_regular, read_small_file

#: Names the stock scanner skips wherever they appear.
IGNORED_NAMES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})
#: Top-level entries of a cache or store that are not repos and are not strays: the
#: stock client's, and a store's quarantine (``cmh mirror scrub``). Never removed.
ROOT_SPECIAL = frozenset({".locks", "CACHEDIR.TAG", "blobs", ".quarantine"})
#: Where whole repos are moved before they are deleted (the stock scanner skips ``.locks``).
ROOT_TRASH = (".locks", ".cmh-trash")
#: Where one repo's snapshots are moved before they are deleted.
REPO_TRASH = (".cmh", "trash")
#: Marks of cmh's own temporary files (atomic ref writes, atomic links).
TEMP_MARKS = (".cmh-tmp.", ".cmh-link.")
INCOMPLETE_SUFFIX = ".incomplete"
#: The folders of a repo that prune walks and removes entries from (relative to the repo
#: folder; ``""``: the repo folder itself). One of them that is a symbolic link leaves
#: the whole repo out of the scan: prune never follows a link out of the store.
WALKED_FOLDERS = ("", "blobs", "snapshots", "refs", ".no_exist", "trees", ".cmh",
                  ".cmh/used", ".cmh/commits", ".cmh/upstream", ".cmh/partial", ".cmh/trees",
                  "/".join(REPO_TRASH), VERIFIED_MARKERS, CHECK_RECORDS, CUT_RECORDS)  # fmt: skip


#: What a repo folder holds in the stock layout (and cmh's own ``.cmh/``): anything else
#: in it (a user's notes, a copy of a model) is not cache content, and keeps the folder.
REPO_ENTRIES = frozenset({"blobs", "snapshots", "refs", ".no_exist", "trees", ".cmh"})


class NotACacheError(ValueError):
    """The folder given to prune is no cache or store: it has no repo folder, ``.locks/``
    or ``CACHEDIR.TAG``, and entries of its own. Nothing in it is judged or removed."""

    def __init__(self, root: Path, strays: tuple[str, ...]) -> None:
        shown = ", ".join(repr(n) for n in strays[:3]) + (", ..." if len(strays) > 3 else "")
        hint = "give the cache folder itself (e.g. ~/.cache/huggingface/hub)"
        if (root / "hub").is_dir() and _looks_like_cache(root / "hub"):
            hint = f"did you mean {root / 'hub'}?"
        super().__init__(
            f"{root} is not a Hugging Face cache or mirror store: it holds no repo folder "
            f"(models--ORG--NAME), .locks/ or CACHEDIR.TAG, but {len(strays)} other "
            f"entr{'y' if len(strays) == 1 else 'ies'} ({shown}); nothing pruned: {hint}"
        )
        self.root = root
        self.hint = hint


def _looks_like_cache(folder: Path) -> bool:
    try:
        with os.scandir(folder) as it:
            return any(_marks_cache(e) for e in it)
    except OSError:
        return False


def _marks_cache(entry: os.DirEntry[str]) -> bool:
    """An entry only a cache or store has at its top: a repo folder or the stock files."""
    if entry.name in ROOT_SPECIAL or entry.name == "version.txt":  # transformers 4 writes it
        return True
    return entry.is_dir() and parse_repo_folder(entry.name) is not None


class LinkedFolder(Exception):
    """A folder prune would walk, or a lock file of the repo, is a symbolic link: the repo
    is left alone."""


@dataclass(frozen=True)
class Entry:
    """A file or folder with its size in bytes and modification time."""

    name: str
    size: int
    mtime: float
    #: a symbolic link (removing it removes the link, never what it points to)
    link: bool = False


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a snapshot.

    ``blob`` is the name in ``blobs/`` the link points to, or ``None`` for a
    plain file or a link elsewhere. ``broken`` when the link target is missing.
    ``expires_at`` is the stamped expiry (Unix seconds; 0 = never), ``None``
    when the file is not a stamped safetensors file or was not read.
    """

    path: str
    blob: str | None
    size: int
    broken: bool = False
    expires_at: int | None = None
    temp: bool = False
    #: A link to a blob of another repo of the cache: ``(its folder, the blob's name)``;
    #: ``("", name)`` when the folder the link names could not be looked at (then a blob
    #: of that name is kept in every repo). Such a blob is not this revision's to free.
    elsewhere: tuple[str, str] | None = None

    @property
    def plain(self) -> bool:
        """A file of the snapshot itself (or a link out of the cache), not a blob's link."""
        return self.blob is None and self.elsewhere is None


@dataclass(frozen=True)
class FillScan:
    """A bucket pull-through fill's state, ``{repo}/.cmh/fills/{etag}/`` (spec/hub-mirror.md
    8.6): its lease, part objects and failure record.

    Times are the storage's (each object's Last-Modified) moved onto this process's clock
    by one offset taken at the scan, so an age is measured on the storage's clock alone.
    """

    etag: str
    #: bytes of its objects (the parts hold them)
    size: int
    #: when its lease was last written, ``None`` when it has none
    lease_written: float | None
    #: the lifetime its holder wrote in the lease (``None``: none readable)
    lease_ttl: float | None
    #: when its newest object other than the lease was written (``None``: it has none)
    newest: float | None


@dataclass(frozen=True)
class UploadScan:
    """An incomplete multipart upload in a bucket store (a killed import's, or one in
    flight): the object it would create, its id, its parts' bytes, and when it was last
    written (its newest part), on this process's clock."""

    name: str
    upload_id: str
    size: int
    mtime: float


@dataclass(frozen=True)
class RevisionScan:
    """One folder of ``snapshots/``: a revision."""

    commit: str
    files: tuple[SnapshotFile, ...]
    mtime: float
    last_used: float | None
    created_at: float | None = None
    #: A pull-through mirror's record (``.cmh/upstream/{commit}.json``): when its upstream
    #: freshness ends; its links to blobs not yet filled are then not broken.
    upstream_until: float | None = None
    #: The commit's parents when the store records them (a bucket's tree objects), which
    #: ranks revisions by ref history rather than by timestamps; ``None`` when unknown.
    parents: tuple[str, ...] | None = None

    @property
    def is_commit(self) -> bool:
        """True when the folder is named by a 40-hex commit (refs can only name those)."""
        return COMMIT_RE.match(self.commit) is not None

    @property
    def broken(self) -> tuple[str, ...]:
        """Paths whose blob is missing: the stock scanner gives up on the repo."""
        return tuple(f.path for f in self.files if f.broken)

    @property
    def expires_at(self) -> int | None:
        """The earliest expiry among the stamped files, ``None`` when none expires."""
        stamps = [f.expires_at for f in self.files if f.expires_at]
        return min(stamps) if stamps else None

    @property
    def blobs(self) -> frozenset[str]:
        return frozenset(f.blob for f in self.files if f.blob is not None)

    @property
    def last_activity(self) -> float:
        """Last recorded use, else the snapshot folder's modification time."""
        return self.last_used if self.last_used is not None else self.mtime


@dataclass(frozen=True)
class RefScan:
    """One file under ``refs/``.

    ``commit`` is the commit it names (surrounding whitespace ignored, as cmh
    reads it) or ``None`` when unreadable or not a commit; ``exact`` when the
    text is the bare commit, as the stock scanner requires.
    """

    name: str
    commit: str | None
    exact: bool
    mtime: float
    #: Why the ref could not be read (no permission, a link, not a regular file), or
    #: ``None``. Such a ref may name any revision: it is kept, and so is every revision
    #: of its repo.
    unreadable: str | None = None


@dataclass(frozen=True)
class RepoScan:
    """Everything a prune plan needs to know about one repo folder."""

    layout: RepoLayout
    mtime: float
    has_snapshots_dir: bool
    refs_is_file: bool
    refs: tuple[RefScan, ...]
    revisions: tuple[RevisionScan, ...]
    snapshot_strays: tuple[Entry, ...]
    blobs: dict[str, Entry]
    incomplete: tuple[Entry, ...]
    blob_temps: tuple[Entry, ...]
    no_exist: tuple[Entry, ...]
    trees: tuple[Entry, ...]
    used_records: tuple[Entry, ...]
    trash: tuple[Entry, ...]
    lock_files: tuple[Entry, ...]
    partials: tuple[Entry, ...] = ()
    verified: tuple[Entry, ...] = ()
    checked: tuple[Entry, ...] = ()
    commit_meta: tuple[Entry, ...] = ()
    upstream_records: tuple[Entry, ...] = ()
    #: A bucket's pull-through fills (a folder fills ``blobs/{etag}.incomplete`` under the
    #: blob lock: those are :attr:`incomplete`).
    fills: tuple[FillScan, ...] = ()
    #: Records of cut bodies (``.cmh/cuts/{etag}``), by their time of writing.
    cuts: tuple[Entry, ...] = ()
    #: The resolver's own listings of commits fetched one file at a time
    #: (``.cmh/trees/{commit}.json``): each belongs to its commit, as ``trees/`` does.
    cmh_trees: tuple[Entry, ...] = ()
    #: True when what refs name is served to clients (a bucket store's replicas): a commit
    #: a ref names then goes only by ``--expired --include-referenced``, never by rank,
    #: age or size.
    refs_served: bool = False
    #: True when the repo is a folder that can go in one rename once empty; False where
    #: each object goes by itself (a bucket), so the plan lists every one.
    whole_folder: bool = True
    #: Blobs of this repo that snapshots of other repos link to (or may: see
    #: :attr:`SnapshotFile.elsewhere`): kept whatever this repo's own snapshots say.
    pinned: frozenset[str] = frozenset()
    #: Entries of the repo folder that are not cache content (:data:`REPO_ENTRIES`; a
    #: folder in ``blobs/``), relative to the repo folder: never removed, and the repo
    #: folder that holds them never goes whole.
    foreign_entries: tuple[str, ...] = ()
    #: What the scan could not read or did not understand here, and kept (for the notes).
    notes: tuple[str, ...] = ()
    #: True when :attr:`RevisionScan.last_used` is a mirror's record of its last read
    #: (a folder store's ``.cmh/used/``; a bucket's replicas record none).
    reads_recorded: bool = False

    @property
    def repo_id(self) -> str:
        return self.layout.repo_id

    @property
    def repo_type(self) -> str:
        return self.layout.repo_type

    def revision(self, commit: str) -> RevisionScan | None:
        for rev in self.revisions:
            if rev.commit == commit:
                return rev
        return None

    @property
    def refs_unknown(self) -> tuple[RefScan, ...]:
        """Refs that could not be read: what they name is not known."""
        return tuple(r for r in self.refs if r.unreadable is not None)

    def refs_to(self, commit: str) -> tuple[str, ...]:
        """Names of the refs that name ``commit``."""
        return tuple(r.name for r in self.refs if r.commit == commit)


@dataclass(frozen=True)
class CacheScan:
    """A scan of a whole cache or store root."""

    root: Path | str  # a folder, or a bucket store's s3:// URL
    scanned_at: float
    repos: tuple[RepoScan, ...]
    strays: tuple[str, ...] = ()
    trash: tuple[Entry, ...] = ()
    orphan_lock_dirs: tuple[Entry, ...] = ()
    read_expiry: bool = field(default=True)
    #: Repos the scan could not judge (left out of it, so nothing of them goes), and why.
    notes: tuple[str, ...] = ()
    #: A store: what its refs name is served (see :attr:`RepoScan.refs_served`).
    refs_served: bool = False
    #: A bucket store's incomplete multipart uploads.
    uploads: tuple[UploadScan, ...] = ()

    @property
    def revision_count(self) -> int:
        return sum(len(r.revisions) for r in self.repos)


@dataclass(frozen=True)
class ScanOptions:
    """What a folder scan reads besides the listing.

    ``read_expiry`` reads the header of each stamped blob; ``read_commit_times``
    reads a mirror store's commit records (``.cmh/commits/{commit}.json``: when it
    created each commit, and its parents); ``served`` scans a mirror store, whose
    refs name what it serves (a cache's refs do not: it can fetch again).
    """

    read_expiry: bool = True
    read_commit_times: bool = False
    served: bool = False


def scan_cache(
    root: str | os.PathLike[str],
    *,
    read_expiry: bool = True,
    read_commit_times: bool = False,
    served: bool = False,
    clock: Clock = SYSTEM_CLOCK,
) -> CacheScan:
    """Scan every repo under ``root`` (the options as in :class:`ScanOptions`).

    Raises :class:`FileNotFoundError` / :class:`NotADirectoryError` when
    ``root`` is not a folder.
    """
    base = Path(root)
    if not base.exists():
        raise FileNotFoundError(2, "No such directory", str(base))
    if not base.is_dir():
        raise NotADirectoryError(20, "Not a directory", str(base))
    top = _check_is_cache(base)
    started = clock.time()
    options = ScanOptions(read_expiry, read_commit_times, served)
    repos: list[RepoScan] = []
    notes: list[str] = []
    layouts = list(iter_repos(base))
    blob_dirs = blob_folders(layouts)
    for layout in layouts:
        try:
            repos.append(scan_repo(layout, options, blob_dirs=blob_dirs))
        except FileNotFoundError:  # removed while we scanned
            continue
        except LinkedFolder as exc:
            notes.append(f"{layout.repo_id}: {exc}")
        except OSError as exc:  # e.g. another user's private snapshot: the repo stays whole
            notes.append(f"{layout.repo_id}: {_unreadable(exc, base)}: nothing pruned in this repo")
    repos = _pin_shared_blobs(repos)
    notes.extend(note for repo in repos for note in repo.notes)
    repo_names = {layout.folder_name for layout in layouts}
    strays = tuple(sorted(e.name for e in top if not _marks_cache(e)))
    orphan_locks: tuple[Entry, ...] = ()
    trash: tuple[Entry, ...] = ()
    linked = linked_folder(base, (".locks", "/".join(ROOT_TRASH)))
    if linked is not None:
        notes.append(f"{linked} is a link to another folder, never followed: left alone")
    else:
        try:
            orphan_locks = tuple(
                e
                for e in _entries(base / ".locks")
                if e.name != ROOT_TRASH[1]
                and parse_repo_folder(e.name) is not None
                and e.name not in repo_names
                and not e.link
            )
            trash = _entries(base.joinpath(*ROOT_TRASH))
        except OSError as exc:
            orphan_locks, trash = (), ()
            notes.append(f"{_unreadable(exc, base)}: its lock folders and trash left alone")
    return CacheScan(base, started, tuple(repos), strays, trash, orphan_locks, read_expiry,
                     notes=tuple(notes), refs_served=served)  # fmt: skip


#: A folder's identity, ``(st_dev, st_ino)``: the same however the path to it is spelled
#: (``X/../X``, a root reached through a link, an absolute link's target).
FolderId = tuple[int, int]


def blob_folders(layouts: list[RepoLayout]) -> dict[FolderId, str]:
    """Each repo's ``blobs/`` folder (not a link) by its identity, to its repo's folder."""
    out: dict[FolderId, str] = {}
    for layout in layouts:
        try:
            st = os.lstat(layout.blobs)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            out[(st.st_dev, st.st_ino)] = layout.folder_name
    return out


def _pin_shared_blobs(repos: list[RepoScan]) -> list[RepoScan]:
    """Give each repo the blobs other repos' snapshots link to (:attr:`RepoScan.pinned`);
    a link whose folder could not be looked at pins its blob's name in every repo."""
    wanted: dict[str, set[str]] = {}
    anywhere: set[str] = set()
    for repo in repos:
        for rev in repo.revisions:
            for f in rev.files:
                if f.elsewhere is None:
                    continue
                folder, name = f.elsewhere
                if folder:
                    wanted.setdefault(folder, set()).add(name)
                else:
                    anywhere.add(name)
    if not wanted and not anywhere:
        return repos
    out = []
    for repo in repos:
        pinned = (wanted.get(repo.layout.folder_name, set()) | anywhere) & set(repo.blobs)
        out.append(dataclasses.replace(repo, pinned=frozenset(pinned)) if pinned else repo)
    return out


def blobs_linked_now(root: Path, folder: str, *, own: bool = True) -> frozenset[str]:
    """The names in ``{folder}/blobs/`` that a snapshot of any repo under ``root`` (that
    repo too unless ``own`` is false) links to now, read again: one ``readlink`` a snapshot
    file, no blob opened. A link of the stock shape (``../../blobs/{name}``) names a blob
    of the repo it is in; any other is told as the scan tells it (:class:`_Links`: a link
    into a folder that cannot be looked at counts for its name, as in
    :func:`_pin_shared_blobs`). A repo whose ``snapshots/`` is a link is not followed
    (the scan leaves that repo alone too).

    The executor asks it under the repo lock just before deleting blobs, so a link another
    repo's snapshot made to one of them after the scan (a dedupe) keeps it. It costs a
    ``readlink`` for each snapshot file of the cache, once for each repo whose blobs go."""
    walk = _LinkNames(Path(root), folder)
    base = os.fspath(root)
    with os.scandir(base) as it:
        repos = [e.name for e in it if parse_repo_folder(e.name) is not None and e.is_dir()]
    for name in repos:
        mine = name == folder
        if mine and not own:
            continue
        snapshots = os.path.join(base, name, "snapshots")
        try:
            if stat.S_ISLNK(os.lstat(snapshots).st_mode):
                continue
            with os.scandir(snapshots) as it:
                entries = [e for e in it if e.name not in IGNORED_NAMES]
        except OSError:  # none, or unreadable: no link of it to read
            continue
        walk.repo(name, snapshots)
        for entry in entries:
            try:
                if entry.is_dir():
                    walk.walk(entry.path, (entry.name,), 2, mine)
            except OSError:  # removed meanwhile, or unreadable (the scan kept it whole)
                continue
    return frozenset(walk.names)


class _LinkNames:
    """The walk of :func:`blobs_linked_now`: the names of ``folder``'s blobs that links
    name (stock-shaped links told by their text, any other by :class:`_Links`, whose
    folder identities are looked up the first time one is met)."""

    def __init__(self, root: Path, folder: str) -> None:
        self.root, self.folder = root, folder
        self.names: set[str] = set()
        self.dirs: dict[FolderId, str] | None = None
        self.current: tuple[str, str] = ("", "")  # the repo walked: its folder, snapshots/
        self.links: _Links | None = None
        self.real: str | None = None

    def repo(self, name: str, snapshots: str) -> None:
        self.current, self.links, self.real = (name, snapshots), None, None

    def walk(self, directory: str, rel: tuple[str, ...], depth: int, mine: bool) -> None:
        stock = "../" * depth + "blobs/"
        with os.scandir(directory) as it:
            for e in it:
                if e.is_symlink():
                    target = os.readlink(e.path)
                    blob = target[len(stock) :] if target.startswith(stock) else ""
                    if blob and "/" not in blob and blob not in (".", ".."):
                        if mine:  # a blob of the repo the link is in (the scan's reading)
                            self.names.add(blob)
                        continue
                    self._other(e.path, target, rel, e.name, depth, mine)
                elif e.is_dir(follow_symlinks=False):
                    self.walk(e.path, (*rel, e.name), depth + 1, mine)

    def _other(
        self, link: str, target: str, rel: tuple[str, ...], name: str, depth: int, mine: bool
    ) -> None:
        """A link not of the stock shape, told as the scan tells it."""
        if self.links is None:
            if self.dirs is None:
                self.dirs = blob_folders(list(iter_repos(self.root)))
            repo, snapshots = self.current
            layout_blobs = self.root / repo / "blobs"
            self.links = _Links(layout_blobs, {}, self.dirs)
            self.real = os.path.realpath(snapshots)
        assert self.real is not None
        real_dir = os.path.join(self.real, *rel)
        f = self.links._link(link, real_dir, target, "/".join((*rel, name)), False, depth)
        if mine and f.blob is not None:
            self.names.add(f.blob)
        elif f.elsewhere is not None and f.elsewhere[0] in (self.folder, ""):
            self.names.add(f.elsewhere[1])


def _unreadable(exc: OSError, base: Path) -> str:
    """``{path} cannot be read ({why})``, the path relative to the root."""
    where = exc.filename
    if isinstance(where, str) and where.startswith(f"{base}{os.sep}"):
        where = where[len(f"{base}{os.sep}") :]
    return f"{where or 'a folder'} cannot be read ({exc.strerror or exc})"


def _check_is_cache(base: Path) -> list[os.DirEntry[str]]:
    """The entries at the top of ``base``; raises :class:`NotACacheError` when it holds
    entries of its own and nothing that marks a cache or store (an empty folder is an
    empty cache)."""
    with os.scandir(base) as it:
        top = [e for e in it if e.name not in IGNORED_NAMES]
    if top and not any(_marks_cache(e) for e in top):
        raise NotACacheError(base, tuple(sorted(e.name for e in top)))
    return top


def linked_folder(base: Path, folders: tuple[str, ...]) -> str | None:
    """The first of ``folders`` (relative to ``base``) that is a symbolic link."""
    for rel in folders:
        try:
            mode = os.lstat(base / rel if rel else base).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISLNK(mode):
            return f"{rel}/" if rel else "the repo folder"
    return None


def scan_repo(
    layout: RepoLayout,
    options: ScanOptions = ScanOptions(),
    *,
    blob_dirs: dict[FolderId, str] | None = None,
) -> RepoScan:
    """Scan one repo folder (which need not be well formed).

    ``blob_dirs`` (:func:`blob_folders`) tells links to other repos' blobs apart from
    links out of the cache. Raises :class:`LinkedFolder` when a folder it walks
    (:data:`WALKED_FOLDERS`, the repo's lock folder) or a lock file is a symbolic link."""
    read_expiry, read_commit_times = options.read_expiry, options.read_commit_times
    path = layout.path
    linked = linked_folder(path, WALKED_FOLDERS) or linked_folder(
        layout.root, (".locks", f".locks/{layout.folder_name}")
    )
    if linked is not None:
        raise LinkedFolder(
            f"{linked} is a link to another folder, never followed: nothing pruned in this repo"
        )
    lock_files = _entries(layout.locks)
    linked_lock = next((e.name for e in lock_files if e.link), None)
    if linked_lock is not None:
        raise LinkedFolder(
            f".locks/{layout.folder_name}/{linked_lock} is a link, never followed: "
            "nothing pruned in this repo"
        )
    repo_stat = path.stat()
    with os.scandir(path) as it:
        foreign = sorted(
            e.name + ("/" if e.is_dir(follow_symlinks=False) else "")
            for e in it
            if e.name not in REPO_ENTRIES and e.name not in IGNORED_NAMES
        )
    blobs_path, snapshots_path, refs_path, cmh_path = (
        path / "blobs",
        path / "snapshots",
        path / "refs",
        path / ".cmh",
    )
    blobs, incomplete, blob_temps, blob_folders_in = _scan_blobs(blobs_path)
    foreign += [f"blobs/{name}/" for name in blob_folders_in]
    refs_is_file = refs_path.is_file()
    refs = () if refs_is_file else _scan_refs(refs_path)
    notes = [
        f"{layout.repo_id}: refs/{r.name} cannot be read ({r.unreadable}): kept, and every "
        "revision of the repo with it (it may name any)"
        for r in refs
        if r.unreadable is not None
    ]
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        notes.append(f"{layout.repo_id}: {shown}: not cache content, left alone, "
                     "and so is the repo folder")  # fmt: skip
    has_snapshots = snapshots_path.is_dir()
    used_records = _entries(_usage_dir(layout))
    last_used = {e.name: e.mtime for e in used_records}
    commit_meta = _entries(cmh_path / "commits")
    with_meta = {e.name for e in commit_meta} if read_commit_times else set()
    upstream_records = _entries(cmh_path / "upstream")
    with_upstream = {e.name for e in upstream_records}
    revisions: list[RevisionScan] = []
    strays: list[Entry] = []
    expiry_cache: dict[str, int | None] = {}
    if has_snapshots:
        blobs_dir = os.fspath(blobs_path)
        links = _Links(blobs_path, blobs, blob_dirs or {})
        real_snapshots = os.path.realpath(snapshots_path)  # only the root may be a link
        for entry in sorted(os.scandir(snapshots_path), key=lambda e: e.name):
            if entry.name in IGNORED_NAMES:
                continue
            if not entry.is_dir():
                strays.append(_entry(entry))
                continue
            try:
                files = links.snapshot(entry.path, os.path.join(real_snapshots, entry.name))
                mtime = entry.stat().st_mtime
            except FileNotFoundError:  # removed while we scanned
                continue
            if read_expiry:
                files = [_with_expiry(f, entry.path, blobs_dir, expiry_cache) for f in files]
            name = entry.name
            created, parents = None, None
            if f"{name}.json" in with_meta and COMMIT_RE.match(name):
                created, parents = _commit_record(cmh_path / "commits" / f"{name}.json")
            until = None
            if f"{name}.json" in with_upstream and COMMIT_RE.match(name):
                until = _record_number(cmh_path / "upstream" / f"{name}.json", "fresh_until")
            revisions.append(
                RevisionScan(name, tuple(files), mtime, last_used.get(name), created, until,
                             parents)
            )  # fmt: skip
    return RepoScan(
        layout=layout,
        mtime=repo_stat.st_mtime,
        has_snapshots_dir=has_snapshots,
        refs_is_file=refs_is_file,
        refs=refs,
        revisions=tuple(revisions),
        snapshot_strays=tuple(strays),
        blobs=blobs,
        incomplete=incomplete,
        blob_temps=blob_temps,
        no_exist=_entries(path / ".no_exist"),
        trees=_entries(path / "trees"),
        used_records=used_records,
        trash=_entries(path.joinpath(*REPO_TRASH)),
        lock_files=lock_files,
        partials=_entries(cmh_path / "partial"),
        verified=_entries(path / VERIFIED_MARKERS),
        checked=_entries(path / CHECK_RECORDS),
        commit_meta=commit_meta,
        upstream_records=upstream_records,
        cuts=_entries(path / CUT_RECORDS),
        cmh_trees=_entries(cmh_path / "trees"),
        refs_served=options.served,
        foreign_entries=tuple(foreign),
        notes=tuple(notes),
        reads_recorded=options.served,
    )


def _usage_dir(layout: RepoLayout) -> Path:
    """The folder of :mod:`cmh.hub.cache._usage` records (one listing, not a stat per commit)."""
    return usage_path(layout, "0" * 40).parent


# -- helpers ---------------------------------------------------------------------------


def _entry(entry: os.DirEntry[str]) -> Entry:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return Entry(entry.name, 0, 0.0)
    return Entry(entry.name, 0 if stat.S_ISDIR(st.st_mode) else st.st_size, st.st_mtime,
                 stat.S_ISLNK(st.st_mode))  # fmt: skip


def _entries(folder: Path) -> tuple[Entry, ...]:
    """Direct children of ``folder`` (none when it does not exist or is not a folder)."""
    try:
        with os.scandir(folder) as it:
            return tuple(sorted((_entry(e) for e in it), key=lambda e: e.name))
    except (FileNotFoundError, NotADirectoryError):
        return ()


def _scan_blobs(
    folder: Path,
) -> tuple[dict[str, Entry], tuple[Entry, ...], tuple[Entry, ...], tuple[str, ...]]:
    """Blobs, partial downloads, writers' temporary files, and folders (no blob is one)."""
    blobs: dict[str, Entry] = {}
    incomplete: list[Entry] = []
    temps: list[Entry] = []
    folders: list[str] = []
    try:
        it = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return blobs, (), (), ()
    with it:
        for e in it:
            if e.name.endswith(INCOMPLETE_SUFFIX):
                incomplete.append(_entry(e))
                continue
            if e.name.startswith("."):  # a writer's temporary file (e.g. the store's import)
                temps.append(_entry(e))
                continue
            try:
                st = e.stat()  # follows a blob that links into a shared store
            except OSError:
                continue  # a dangling blob link: links to it count as broken
            if stat.S_ISDIR(st.st_mode):
                folders.append(e.name)
            else:
                blobs[e.name] = Entry(e.name, st.st_size, st.st_mtime)
    by_name = lambda x: x.name  # noqa: E731
    return (blobs, tuple(sorted(incomplete, key=by_name)), tuple(sorted(temps, key=by_name)),
            tuple(sorted(folders)))  # fmt: skip


def _scan_refs(folder: Path) -> tuple[RefScan, ...]:
    out: list[RefScan] = []

    def walk(directory: str, prefix: str) -> None:
        try:
            it = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return
        with it:
            for e in it:
                if e.name in IGNORED_NAMES:
                    continue
                name = prefix + e.name
                if e.is_dir(follow_symlinks=False):
                    walk(e.path, name + "/")
                    continue
                try:
                    mtime = e.stat(follow_symlinks=False).st_mtime
                    with open_regular(e.path, follow_links=False) as f:  # never blocks
                        data = f.read(1024)
                except OSError as exc:  # unreadable is not invalid: kept, see RefScan
                    out.append(RefScan(name, None, False, 0.0, exc.strerror or str(exc)))
                    continue
                try:
                    raw = data.decode()
                except UnicodeDecodeError:
                    out.append(RefScan(name, None, False, mtime))
                    continue
                text = raw.strip()
                commit = text if COMMIT_RE.match(text) else None
                out.append(RefScan(name, commit, commit is not None and raw == text, mtime))

    walk(os.fspath(folder), "")
    return tuple(sorted(out, key=lambda r: r.name))


class _Links:
    """Reads one repo's snapshots and tells what each link names: a blob of this repo, a
    blob of another repo of the cache, or a file elsewhere.

    Folders are compared by identity (:data:`FolderId`), never by how a path is
    spelled, so ``--cache-dir X/../X``, a root reached through a link and absolute links
    all name the same ``blobs/``. One ``stat`` per distinct folder a link names (for the
    stock relative links, one per repo)."""

    def __init__(self, blobs_path: Path, blobs: dict[str, Entry], blob_dirs: dict[FolderId, str]):
        self.blobs = blobs
        self.blob_dirs = blob_dirs
        self.ids: dict[str, FolderId | int] = {}  # a folder's identity, or the errno
        own = self._id(os.fspath(blobs_path))
        self.own = own if isinstance(own, tuple) else None

    def _id(self, folder: str) -> FolderId | int:
        known = self.ids.get(folder)
        if known is None:
            try:
                st = os.stat(folder)
                known = (st.st_dev, st.st_ino)
            except OSError as exc:
                known = exc.errno or errno.EIO
            self.ids[folder] = known
        return known

    def snapshot(self, snapshot: str, real: str) -> list[SnapshotFile]:
        """The files of the snapshot folder ``snapshot``, whose real path is ``real``."""
        files: list[SnapshotFile] = []

        def walk(directory: str, real_dir: str, prefix: str, depth: int) -> None:
            with os.scandir(directory) as it:
                for e in it:
                    rel = prefix + e.name
                    temp = any(mark in e.name for mark in TEMP_MARKS)
                    if e.is_symlink():
                        target = os.readlink(e.path)
                        files.append(self._link(e.path, real_dir, target, rel, temp, depth))
                    elif e.is_dir(follow_symlinks=False):
                        walk(e.path, os.path.join(real_dir, e.name), rel + "/", depth + 1)
                    else:
                        size = e.stat(follow_symlinks=False).st_size
                        files.append(SnapshotFile(rel, None, size, False, None, temp))

        walk(snapshot, real, "", 2)  # {repo}/snapshots/{commit}: two folders below the repo
        files.sort(key=lambda f: f.path)
        return files

    def _link(
        self, link: str, real_dir: str, target: str, rel: str, temp: bool, depth: int
    ) -> SnapshotFile:
        """What the link at ``link`` (in the real folder ``real_dir``, ``depth`` folders
        below the repo folder) names."""
        parts = target.split("/")
        if (  # the stock shape, ../../blobs/{name}: no folder outside the repo is involved
            len(parts) == depth + 2
            and parts[depth] == "blobs"
            and parts[-1] not in ("", ".", "..")
            and all(p == ".." for p in parts[:depth])
            and self.own is not None
        ):
            return self._own(rel, parts[-1], temp)
        joined = os.path.join(real_dir, target)
        lead = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
        if ".." not in parts[lead:]:  # only leading "..": lexical and real paths agree
            joined = os.path.normpath(joined)
        folder = self._id(os.path.dirname(joined))
        if folder == self.own:
            return self._own(rel, os.path.basename(joined), temp)
        # Not the stock shape: follow every link to where the file really is.
        real = os.path.realpath(joined)
        real_folder = self._id(os.path.dirname(real))
        if real_folder == self.own:
            return self._own(rel, os.path.basename(real), temp)
        try:
            size, broken = os.stat(link).st_size, False
        except OSError:
            size, broken = 0, True
        other = self.blob_dirs.get(real_folder) if isinstance(real_folder, tuple) else None
        if other is not None:
            return SnapshotFile(
                rel, None, size, broken, None, temp, (other, os.path.basename(real))
            )
        unknown = [f for f in (folder, real_folder) if isinstance(f, int)]
        if any(code not in (errno.ENOENT, errno.ENOTDIR) for code in unknown):
            # A folder that could not be looked at may be any repo's blobs/: keep the name.
            return SnapshotFile(rel, None, size, broken, None, temp, ("", os.path.basename(real)))
        return SnapshotFile(rel, None, size, broken, None, temp)

    def _own(self, rel: str, name: str, temp: bool) -> SnapshotFile:
        blob = self.blobs.get(name)
        size = blob.size if blob is not None else 0
        return SnapshotFile(rel, name, size, blob is None, None, temp)


def _with_expiry(
    f: SnapshotFile, snapshot: str, blobs_dir: str, cache: dict[str, int | None]
) -> SnapshotFile:
    if f.broken or f.temp or not f.path.endswith(".safetensors"):
        return f
    if not f.plain and f.blob is None:
        return f  # a link to another repo's blob: not read (it never expires here)
    key = f.blob if f.blob is not None else f"\0{snapshot}/{f.path}"
    if key not in cache:
        if f.blob is not None:  # a blob (which may link into a shared store)
            cache[key] = stamped_expiry(os.path.join(blobs_dir, f.blob))
        else:  # a file of the snapshot itself; a link out of the cache is not followed
            cache[key] = stamped_expiry(f"{snapshot}/{f.path}", follow_links=False)
    expires = cache[key]
    if expires is None:
        return f
    return dataclasses.replace(f, expires_at=expires)


def etag_of(name: str) -> str:
    """The blob a partial or temporary file is for: ``{etag}.{id}.incomplete``, ``.{etag}.x``."""
    return name.lstrip(".").split(".", 1)[0]


def _commit_record(path: Path) -> tuple[float | None, tuple[str, ...] | None]:
    """A store's record of a commit: when it created it (``created_at``) and its
    ``parents``, each ``None`` when unreadable."""
    try:
        text = read_small_file(path, follow_links=False)  # never blocks on a FIFO
    except OSError:
        return None, None
    return record_number(text, "created_at"), record_parents(text)


def record_parents(text: bytes) -> tuple[str, ...] | None:
    """The ``parents`` of a commit record, ``None`` unless a list of commit ids."""
    try:
        data = json_value(text)
    except ValueError:
        return None
    parents = data.get("parents") if isinstance(data, dict) else None
    if not isinstance(parents, list) or not all(
        isinstance(p, str) and COMMIT_RE.match(p) for p in parents
    ):
        return None
    return tuple(parents)


def _record_number(path: Path, key: str) -> float | None:
    """The number under ``key`` in a small JSON record file, if readable."""
    try:
        return record_number(read_small_file(path, follow_links=False), key)
    except OSError:
        return None


def stamped_expiry(path: str | os.PathLike[str], *, follow_links: bool = True) -> int | None:
    """``expires_at`` of a stamped safetensors file, from its header's record alone.

    Reads the 8-byte length and the JSON header (bounded by the file size),
    decodes ``__metadata__["cmh"]`` and checks the record; tensors and
    manifests are not validated (a verifier does that). Unreadable, invalid
    or unstamped files give ``None``: they never expire, and so does anything but a
    regular file (a FIFO or a device is never opened to block; a link is not followed
    unless ``follow_links``).
    """
    try:
        with open_regular(path, follow_links=follow_links) as f:
            size = os.fstat(f.fileno()).st_size

            def read(start: int, length: int) -> bytes:
                f.seek(start)
                return f.read(length)

            return stamped_expiry_from(read, size)
    except OSError:
        return None


def stamped_expiry_from(read: Callable[[int, int], bytes], size: int) -> int | None:
    """:func:`stamped_expiry` of any ``size``-byte object that ``read(start, length)``
    reads (a local file, a bucket's blob by range requests). Errors of ``read``
    propagate; an invalid or unstamped header gives ``None``."""
    from cmh import (
        KEY_RECORD,
        MAX_HEADER_SIZE,
        METADATA_KEY,
        PREFIX_SIZE,
        CMHError,
        Record,
        header_size_from_prefix,
    )

    if size <= PREFIX_SIZE:
        return None
    try:
        length = header_size_from_prefix(read(0, PREFIX_SIZE))
        if length > min(MAX_HEADER_SIZE, size - PREFIX_SIZE):
            return None
        header = _json_object(read(PREFIX_SIZE, length))
        metadata = header.get(METADATA_KEY) if header is not None else None
        text = metadata.get(KEY_RECORD) if isinstance(metadata, dict) else None
        if not isinstance(text, str):
            return None
        return Record.from_hex(text).expires_at
    except (CMHError, ValueError):
        return None


def _json_object(raw: bytes) -> dict[str, object] | None:
    value = json_value(raw.decode("utf-8"))
    return value if isinstance(value, dict) else None
