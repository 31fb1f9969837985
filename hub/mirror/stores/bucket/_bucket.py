"""A mirror store kept in an S3-compatible bucket (``s3://bucket/prefix``).

The bucket layout (normative text in ``spec/hub-mirror.md`` section 7); names are
relative to the store URL's prefix, ``{repo}`` is the stock folder name
(``models--org--name``):

```
{repo}/blobs/{etag}            content, named as the Hub names it (SHA-256 or git blob SHA-1)
{repo}/trees/{commit}.json     one immutable tree object per commit (cmh-tree/1)
{repo}/refs/{revision}         40 hex + "\\n"; moved last, by compare-and-swap
{repo}/.cmh/lease              held by a pruner while it works on the repo
{repo}/.cmh/fills/{etag}/...   a pull-through fill: its lease and parts (spec 8.6);
                               cmh prune removes those nobody holds any more
{repo}/.cmh/upstream/...       pull-through records: validations, access, freshness
{repo}/.cmh/checked/{etag}     the blob object version (storage ETag) known to hash to its name
{repo}/.cmh/manifests/{etag}.json  the tensor manifest of a safetensors blob
{repo}/.cmh/upstream/{commit}.json  a pull-through commit's upstream freshness (fresh_until)
.quarantine/{repo}/{etag}.{t}  a blob removed by scrub, and {etag}.{t}.json its note
```

No symlinks and no renames: a tree object maps each path to its blob, so any
replica serves a commit from the tree object alone, with no local state.

Writing a commit (:meth:`BucketStore.add_folder`): blobs first (each hashed while
it is uploaded; an upload whose bytes do not hash to the name is aborted, so no
wrong object is ever created), then the tree object with ``If-None-Match: *``,
then, after a check that no pruner holds the repo's lease, every blob and the tree
are confirmed present, and the ref is moved with ``If-Match`` on the ETag it had
when read (``If-None-Match: *`` when new). A writer that loses the race re-reads
the ref and makes its commit a child of the winner's, so no commit is lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from cmh.hub.cache import (
    CHECK_RECORDS,
    COMMIT_RE,
    CUT_RECORDS,
    ETAG_RE,
    FILL_STATE,
    LEASE_TIME_RESOLUTION,
    MAX_REF_BYTES,
    READ_CHUNK,
    SYSTEM_CLOCK,
    Clock,
    LayoutError,
    git_blob_hasher,
    json_value,
    lease_left,
    parse_ref,
    parse_repo_folder,
    process_clock,
    record_number,
    repo_folder_name,
    validate_relpath,
    validate_revision,
)

from ..._errors import INVALID_OBJECT, StoreError, StoreUnavailable
from ..._gitobjects import commit_oid, is_lfs, lfs_pointer_oid, tree_oids
from ..._index import CommitIndex, FileEntry, revision_refs
from ..local._folder import (
    ImportResult,
    InvalidNameError,
    ProgressCallback,
    RefSummary,
    RepoSummary,
    SourceFile,
    check_import_names,
    hash_source,
    scan_folder,
)
from ._objectstore import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectTooLarge,
    PreconditionFailed,
)
from ._records import FleetKey, fleet_key_from_env, unsealed

TREE_FORMAT = "cmh-tree/1"
QUARANTINE = ".quarantine"
URL_SCHEME = "s3://"
#: Longest a writer lets pass between finding no lease and sending its ref move.
WRITE_WINDOW = 10.0
#: A lease seen unchanged this long is taken as abandoned by writers (a pruner stops
#: deleting well before: see :mod:`cmh.hub.mirror.bucket_prune`).
LEASE_TTL = 600.0
LEASE_POLL = 1.0
MAX_REF_ATTEMPTS = 50
MAX_TREE_BYTES = 64 << 20
#: Largest ref object read (a ref is a commit id and a newline).
#: Largest record, lease, validation or access object read (each is a small JSON or line).
MAX_RECORD_BYTES = 1 << 20

PROBE_FOLDER = ".cmh/probe"
#: Seconds after which a process looks at the storage's clock again (between two looks it
#: counts on its own monotonic clock, which does not drift by much in an hour).
STORAGE_CLOCK_RESYNC = 3600.0
#: The same for judging a lease's age (:meth:`BucketStore.lease_state`): a replica waiting
#: on another's fill looks every 0.25 s and probes the storage's clock once per window, and
#: a process clock that jumped further (a test's) never ages a live lease.
LEASE_CLOCK_RESYNC = 2.0
#: Per commit, when its upstream freshness ends (spec/hub-mirror.md 8.5), as in a folder.
UPSTREAM_RECORDS = ".cmh/upstream"

#: Told, in a sentence, why a writer waits (a pruner's lease).
NoticeCallback = Callable[[str], None]


def is_bucket_url(text: str) -> bool:
    """True when ``text`` names a bucket store (``s3://...``)."""
    return text.startswith(URL_SCHEME)


class BucketError(StoreError):
    """A bucket store that cannot be read or written as asked."""


class ConditionalWritesUnsupported(BucketError):
    """The storage ignores ``If-None-Match`` or ``If-Match`` on PUT: concurrent writers
    would lose commits, so nothing is written."""


@dataclass(frozen=True)
class LeaseState:
    """A lease as seen: its ETag, its age on the storage's own clock, who wrote it."""

    etag: str
    age: float
    owner: str


@dataclass(frozen=True)
class TreeFile:
    """One file of a tree object."""

    path: str
    size: int
    etag: str
    oid: str
    lfs_sha256: str | None


@dataclass(frozen=True)
class TreeObject:
    """``{repo}/trees/{commit}.json``: a commit and every file it holds."""

    commit: str
    tree: str
    parents: tuple[str, ...]
    created_at: float
    files: tuple[TreeFile, ...]

    def to_bytes(self) -> bytes:
        doc = {
            "format": TREE_FORMAT,
            "commit": self.commit,
            "tree": self.tree,
            "parents": list(self.parents),
            "created_at": self.created_at,
            "entries": [
                {"type": "file", "path": f.path, "size": f.size, "oid": f.oid, "etag": f.etag,
                 **({"lfs": {"oid": f.lfs_sha256, "size": f.size}} if f.lfs_sha256 else {})}
                for f in self.files
            ],
        }  # fmt: skip
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, commit: str) -> TreeObject:
        """Parse and check a tree object (:class:`BucketError` when it is not one)."""
        try:
            doc = json_value(data)
            if not isinstance(doc, dict) or doc.get("format") != TREE_FORMAT:
                raise ValueError("not a cmh-tree/1 object")
            if doc.get("commit") != commit:
                raise ValueError(f"names commit {doc.get('commit')!r}")
            files = tuple(_tree_file(e) for e in doc["entries"])
            parents = tuple(str(p) for p in doc.get("parents", []))
            if not all(COMMIT_RE.match(p) for p in parents):
                raise ValueError("bad parent id")
            tree = str(doc["tree"])
            if tree_oids({f.path: f.oid for f in files})[""] != tree:
                raise ValueError("its entries do not give its tree id")
            return cls(commit, tree, parents, float(doc.get("created_at", 0.0)), files)
        except (ValueError, KeyError, TypeError, LayoutError) as exc:
            raise BucketError(f"tree object of commit {commit} is invalid: {exc}") from None


def _tree_file(entry: Any) -> TreeFile:
    path = validate_relpath(str(entry["path"]))
    size, etag, oid = entry["size"], str(entry["etag"]), str(entry["oid"])
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"bad size for {path}")
    if not ETAG_RE.match(etag):
        raise ValueError(f"bad blob name for {path}")
    lfs = entry.get("lfs")
    if len(etag) == 64:
        if (
            not isinstance(lfs, dict)
            or lfs.get("oid") != etag
            or oid != lfs_pointer_oid(etag, size)
        ):
            raise ValueError(f"bad LFS entry for {path}")
        return TreeFile(path, size, etag, oid, etag)
    if lfs is not None or oid != etag:
        raise ValueError(f"bad entry for {path}")
    return TreeFile(path, size, etag, oid, None)


@dataclass(frozen=True)
class RefState:
    """A ref as read: the commit it names and the object's ETag (for compare-and-swap)."""

    commit: str
    etag: str


@dataclass(eq=False, repr=False)
class BucketStore:
    """A mirror store in a bucket: read by any number of replicas, written by any number
    of importers, maintained by scrub and prune (:mod:`cmh.hub.mirror.bucket_prune`)."""

    objects: ObjectStore
    _: KW_ONLY
    write_window: float = WRITE_WINDOW
    lease_ttl: float = LEASE_TTL
    lease_poll: float = LEASE_POLL
    clock: Clock = field(default_factory=process_clock)  # this process's (cmh.hub.cache._clock)
    on_notice: NoticeCallback | None = None
    #: Signs and checks the fleet's records (``CMH_FLEET_KEY_FILE``); None: not signed.
    fleet_key: FleetKey | None = None
    _conditional_writes_checked: bool = field(default=False, init=False)
    #: lease object -> ETag of a lease held here
    _leases: dict[str, str] = field(default_factory=dict, init=False)
    #: lease rewrites whose answer never came (the storage may have taken them)
    _unsure: dict[str, bytes] = field(default_factory=dict, init=False)
    #: (storage time, this process's monotonic time) of the last look at the storage's clock
    _storage_base: tuple[float, float] | None = field(default=None, init=False)
    _lease_base: tuple[float, float] | None = field(default=None, init=False)  # leases'

    @classmethod
    def open(cls, url: str, *, profile: str | None = None, **options: Any) -> BucketStore:
        """Open ``s3://bucket/prefix`` with the standard AWS settings (and the fleet key
        ``CMH_FLEET_KEY_FILE`` names, unless ``fleet_key`` is given)."""
        if "fleet_key" not in options:
            options["fleet_key"] = fleet_key_from_env()
        return cls(ObjectStore.open(url, profile=profile), **options)

    @property
    def url(self) -> str:
        return str(self.objects.location)

    def __repr__(self) -> str:
        return f"BucketStore({self.url!r})"

    # -- names --------------------------------------------------------------------------

    @staticmethod
    def folder(repo_id: str, repo_type: str) -> str:
        """The repo's folder name (``models--org--name``), checked."""
        try:
            return repo_folder_name(repo_id, repo_type)
        except LayoutError as exc:
            raise InvalidNameError(str(exc)) from None

    @staticmethod
    def blob_name(folder: str, etag: str) -> str:
        return f"{folder}/blobs/{etag}"

    @staticmethod
    def tree_name(folder: str, commit: str) -> str:
        return f"{folder}/trees/{commit}.json"

    @staticmethod
    def ref_name(folder: str, revision: str) -> str:
        return f"{folder}/refs/{validate_revision(revision)}"

    @staticmethod
    def lease_name(folder: str) -> str:
        return f"{folder}/.cmh/lease"

    # -- reads --------------------------------------------------------------------------

    def read_ref(self, folder: str, revision: str) -> RefState | None:
        """The commit ``refs/{revision}`` names, or ``None`` (absent or not a commit id)."""
        try:
            data, info = self.read_small(self.ref_name(folder, revision), MAX_REF_BYTES)
        except ObjectNotFound:
            return None
        return RefState(parse_ref(data) or "", info.etag)  # as a folder's ref is read

    def read_tree(self, folder: str, commit: str) -> TreeObject | None:
        """The tree object of ``commit``, or ``None`` when there is none."""
        if not COMMIT_RE.match(commit):
            return None
        name = self.tree_name(folder, commit)
        try:
            info = self.objects.head(name)
            if info.size > MAX_TREE_BYTES:
                raise BucketError(f"tree object {name} is too large ({info.size} bytes)")
            return TreeObject.from_bytes(self.objects.get(name, limit=MAX_TREE_BYTES), commit)
        except ObjectNotFound:
            return None

    def resolve_revision(self, folder: str, revision: str) -> str | None:
        """The commit a branch, tag, ``refs/pr/N`` or commit id names, if its tree exists:
        a commit id first, then the first of :func:`revision_refs` naming one (spec 1.3)."""
        names = revision_refs(revision)
        if names and COMMIT_RE.match(revision) and self._has_tree(folder, revision):
            return revision
        for name in names:
            ref = self.read_ref(folder, name)
            if ref is not None and ref.commit and self._has_tree(folder, ref.commit):
                return ref.commit
        return None

    def _has_tree(self, folder: str, commit: str) -> bool:
        try:
            self.objects.head(self.tree_name(folder, commit))
        except ObjectNotFound:
            return False
        return True

    def repo_exists(self, folder: str) -> bool:
        """True when the repo has at least one ref or tree object."""
        for prefix in (f"{folder}/refs", f"{folder}/trees"):
            for _ in self.objects.list(prefix):
                return True
        return False

    def repos(self) -> list[tuple[str, str, str]]:
        """``(repo_type, repo_id, folder)`` of every repo folder in the bucket, sorted."""
        out = []
        for name in self.objects.list_folders(""):
            parsed = parse_repo_folder(name)
            if parsed is not None:
                out.append((parsed[0], parsed[1], name))
        return sorted(out, key=lambda r: r[2])

    def refs(self, folder: str) -> dict[str, RefState]:
        """Every ref of a repo by revision name (``refs/pr/N`` nests)."""
        out: dict[str, RefState] = {}
        base = f"{folder}/refs/"
        for info in self.objects.list(f"{folder}/refs"):
            revision = info.name[len(base) :]
            state = self.read_ref(folder, revision)
            if state is not None:
                out[revision] = state
        return out

    def tree_infos(self, folder: str) -> dict[str, ObjectInfo]:
        """Tree objects of a repo by commit id."""
        return self._infos(folder, "trees", COMMIT_RE, ".json")

    def blob_infos(self, folder: str) -> dict[str, ObjectInfo]:
        """Blobs of a repo by name (only names that are ETags)."""
        return self._infos(folder, "blobs", ETAG_RE)

    def check_infos(self, folder: str) -> dict[str, ObjectInfo]:
        """Check records of a repo (``.cmh/checked/{etag}``) by blob name."""
        return self._infos(folder, CHECK_RECORDS, ETAG_RE)

    @staticmethod
    def cut_name(folder: str, etag: str) -> str:
        return f"{folder}/{CUT_RECORDS}/{etag}"

    def cut_infos(self, folder: str) -> dict[str, ObjectInfo]:
        """Cut records of a repo (``.cmh/cuts/{etag}``, spec 8.3) by blob name."""
        return self._infos(folder, CUT_RECORDS, ETAG_RE)

    @staticmethod
    def fill_name(folder: str, etag: str) -> str:
        """The folder of a pull-through fill's state (spec/hub-mirror.md 8.6)."""
        return f"{folder}/{FILL_STATE}/{etag}"

    def fill_infos(self, folder: str) -> dict[str, dict[str, ObjectInfo]]:
        """The pull-through fills of a repo (one listing): blob name -> the objects of its
        ``.cmh/fills/{etag}/`` (``lease``, ``part-NNNNNN``, ``hashed``, ``failed``) by their
        own name."""
        base = f"{folder}/{FILL_STATE}/"
        out: dict[str, dict[str, ObjectInfo]] = {}
        for info in self.objects.list(f"{folder}/{FILL_STATE}"):
            etag, _, name = info.name[len(base) :].partition("/")
            if ETAG_RE.match(etag) and name:
                out.setdefault(etag, {})[name] = info
        return out

    def _infos(
        self, folder: str, sub: str, pattern: re.Pattern[str], suffix: str = ""
    ) -> dict[str, ObjectInfo]:
        """Objects ``{folder}/{sub}/{name}{suffix}`` whose ``name`` matches ``pattern``."""
        base = f"{folder}/{sub}/"
        out = {}
        for info in self.objects.list(f"{folder}/{sub}"):
            name = info.name[len(base) :]
            if suffix and not name.endswith(suffix):
                continue
            name = name.removesuffix(suffix)
            if pattern.match(name):
                out[name] = info
        return out

    def index(self, folder: str, tree: TreeObject) -> CommitIndex:
        """The commit index the mirror's documents are built from.

        Each entry's ``source`` is the blob's object name under the store's prefix
        (not a local path): the bucket server reads it through :attr:`objects`.
        """
        files = {
            f.path: FileEntry(f.path, f.size, f.etag, f.oid, f.lfs_sha256,
                              Path(self.blob_name(folder, f.etag)))
            for f in sorted(tree.files, key=lambda f: f.path)
        }  # fmt: skip
        return CommitIndex(
            commit=tree.commit,
            files=files,
            dir_oids=tree_oids({p: f.oid for p, f in files.items()}),
            last_modified=tree.created_at,
        )

    # -- import -------------------------------------------------------------------------

    def add_folder(
        self,
        src: Path,
        repo_id: str,
        *,
        revision: str = "main",
        repo_type: str = "model",
        progress: ProgressCallback | None = None,
        commit: str | None = None,
        links_within: Path | None = None,
    ) -> ImportResult:
        """Import ``src`` as a new commit of ``repo_id`` at ``revision`` (spec 7.2).

        ``commit``: the id the commit keeps (a commit synced from a Hub keeps the Hub's,
        spec 8.4); its tree object is then named so, and ``revision`` may be that id
        itself (no ref moves). ``None``: the id is computed (1.2 step 6).
        ``links_within``: links of ``src`` may point anywhere in that folder (a cache
        snapshot, read through its links into ``blobs/``: see :func:`scan_folder`)."""
        if commit is not None and not COMMIT_RE.match(commit):
            raise InvalidNameError(f"{commit!r} is not a commit id")
        ref = None if commit is not None and revision == commit else revision
        check_import_names(repo_id, ref or "main", repo_type)
        folder = self.folder(repo_id, repo_type)
        self.ensure_conditional_writes()
        files: list[SourceFile] = []
        for rel, path in scan_folder(src, links_within=links_within):
            size, sha256, git_oid = hash_source(path, progress)  # pass 1 of 2 (see add_folder)
            files.append(SourceFile(rel, path, size, sha256, git_oid, is_lfs(rel, size)))
        tree = tree_oids({f.path: f.tree_oid for f in files})[""]
        new_blobs = new_bytes = 0
        for f in files:
            if self._store_blob(folder, f):
                new_blobs += 1
                new_bytes += f.size
            if progress is not None:  # pass 2: stored (uploads report no finer steps)
                progress(f.size)
        if ref is None:
            assert commit is not None
            parent, created, moved = None, self._commit_unnamed(folder, commit, tree, files), False
        else:
            commit, parent, created, moved = self._commit(folder, ref, tree, files, commit)
        return ImportResult(
            repo_id=repo_id,
            repo_type=repo_type,
            revision=revision,
            commit=commit,
            parent=parent,
            created=created,
            ref_moved=moved,
            files=len(files),
            total_bytes=sum(f.size for f in files),
            new_blobs=new_blobs,
            new_bytes=new_bytes,
        )

    def _commit_unnamed(self, folder: str, commit: str, tree: str, files: list[SourceFile]) -> bool:
        """Write the tree object of ``commit`` (kept if there) and move no ref; True when
        it was created. Blobs and tree are confirmed after the lease check (7.2 step 5)."""
        self.ensure_conditional_writes()
        existing = self.read_tree(folder, commit)
        if existing is not None and existing.tree != tree:
            raise BucketError(f"{folder}: commit {commit} is stored with other files")
        obj = existing or TreeObject(
            commit, tree, (), self.storage_time(), tuple(_tree_files(files))
        )
        self._put_tree(folder, obj)
        self._wait_for_no_lease(folder)
        self._put_tree(folder, obj)  # a pruner may have removed it meanwhile
        for f in files:
            self._store_blob(folder, f)
        return existing is None

    def _commit(
        self,
        folder: str,
        revision: str,
        tree: str,
        files: list[SourceFile],
        named: str | None = None,
    ) -> tuple[str, str | None, bool, bool]:
        """Write the tree object and move the ref; ``(commit, parent, created, moved)``.
        ``named``: the commit's id when given (else computed from tree and parent)."""
        self.ensure_conditional_writes()  # whatever path writes, never on a storage without
        created_commits: set[str] = set()
        for _ in range(MAX_REF_ATTEMPTS):
            head = self.read_ref(folder, revision)
            base = head.commit if head is not None and head.commit else None
            if base is None and revision != "main":
                main = self.read_ref(folder, "main")
                base = main.commit if main is not None and main.commit else None
            base_tree = self.read_tree(folder, base) if base else None
            parent = base if base_tree is not None else None  # a dangling ref: new history
            known = self.read_tree(folder, named) if named is not None else None
            if known is not None and known.tree != tree:
                raise BucketError(f"{folder}: commit {named} is stored with other files")
            if known is not None:  # synced before (this branch or another)
                commit, created, obj = known.commit, False, known
            elif named is None and base_tree is not None and base_tree.tree == tree:
                commit, created = base_tree.commit, False
                obj = base_tree
            else:
                commit = named or commit_oid(tree, [parent] if parent else [])
                obj = TreeObject(commit, tree, (parent,) if parent else (), self.storage_time(),
                                 tuple(_tree_files(files)))  # fmt: skip
                # False: the same tree on the same parent, written before by an import
                # to another revision (its tree object, its created_at, is kept)
                created = self._put_tree(folder, obj)
                if created:
                    created_commits.add(commit)
            checked_at = self._wait_for_no_lease(folder)
            self._put_tree(folder, obj)  # a pruner may have removed it meanwhile
            for f in files:
                self._store_blob(folder, f)  # likewise (a HEAD when it is there)
            if self.clock.monotonic() - checked_at > self.write_window:
                continue  # too slow since the lease check: check again
            if head is not None and head.commit == commit:
                return commit, parent if created else _first(obj.parents), created, False
            try:
                if head is None:
                    self.objects.put_if_absent(
                        self.ref_name(folder, revision), f"{commit}\n".encode()
                    )
                else:
                    self.objects.put_if_match(
                        self.ref_name(folder, revision), f"{commit}\n".encode(), head.etag
                    )
            except PreconditionFailed:
                continue  # another writer moved it: build on its commit
            return commit, _first(obj.parents), created or commit in created_commits, True
        raise BucketError(
            f"{folder}/refs/{revision} kept moving: gave up after {MAX_REF_ATTEMPTS} attempts"
        )

    def _put_tree(self, folder: str, obj: TreeObject) -> bool:
        """Write ``obj`` unless its commit's tree object is there; True when written."""
        # A 412 means the same commit id: the same tree on the same parent.
        try:
            self.objects.put_if_absent(self.tree_name(folder, obj.commit), obj.to_bytes())
        except PreconditionFailed:
            return False
        return True

    def _wait_for_no_lease(self, folder: str) -> float:
        """Wait while a pruner holds the repo's lease; the monotonic time of the check
        that found none, or found it expired (older than :attr:`lease_ttl`: its age on the
        storage's clock when first seen, plus the time this process has seen it unchanged).
        Says on :attr:`on_notice` that it waits, and when it takes an expired lease over."""
        seen: LeaseState | None = None
        seen_at = 0.0
        told = False
        while True:
            try:
                etag = self.objects.head(self.lease_name(folder)).etag
            except ObjectNotFound:
                return self.clock.monotonic()
            if seen is None or seen.etag != etag:
                seen = self.lease_state(folder)
                if seen is None:
                    continue  # it went meanwhile: check again
                seen_at = self.clock.monotonic()
            now = self.clock.monotonic()
            remaining = lease_left(seen.age + now - seen_at, self.lease_ttl)
            if remaining <= 0:
                self.notice(
                    f"{self.url}{folder}: the lease of {seen.owner} expired "
                    f"(held over {self.lease_ttl:.0f} s): going on without it"
                )
                return now
            if not told:
                self.notice(
                    f"{self.url}{folder}: waiting for {seen.owner} to release the repo's "
                    f"lease (a prune is working on it); taken as abandoned in {remaining:.0f} s"
                )
                told = True
            self.clock.sleep(min(self.lease_poll, remaining))

    def notice(self, text: str) -> None:
        """Tell :attr:`on_notice` (the terminal, for the CLI) what is being waited for."""
        if self.on_notice is not None:
            self.on_notice(text)

    # -- fleet records (every record replicas share goes through these) -----------------

    def seal(self, name: str, body: bytes) -> bytes:
        """The bytes to write for the record ``name``: signed with the fleet key when the
        store has one (:mod:`~cmh.hub.mirror.stores.bucket._records`), else ``body``."""
        if self.fleet_key is None:
            return body
        return self.fleet_key.seal(name, body, self.storage_time())

    def unseal(self, name: str, data: bytes, info: ObjectInfo) -> bytes | None:
        """The body of the record ``name`` as read (``data``, ``info``); ``None`` when the
        store has a fleet key and the record is not one it signed then (logged once)."""
        if self.fleet_key is None:
            return unsealed(data)
        return self.fleet_key.open(name, data, info.last_modified.timestamp())

    def put_record(self, name: str, body: bytes) -> str:
        """Write the record ``name`` (sealed); its storage ETag."""
        return self.objects.put(name, self.seal(name, body))

    def read_small(self, name: str, limit: int = MAX_RECORD_BYTES) -> tuple[bytes, ObjectInfo]:
        """The bytes and info of a ref, record or lease object (:class:`ObjectNotFound`
        when absent). One larger than ``limit`` is not read and reads as ``b""``: no such
        object of cmh's is that large, so every reader takes it as unreadable, as it does
        any other bytes a co-tenant wrote, and its size costs no memory."""
        try:
            return self.objects.get_with_info(name, limit=limit)
        except ObjectTooLarge as exc:
            return b"", exc.info

    def get_record(self, name: str) -> tuple[bytes, ObjectInfo] | None:
        """The record ``name``'s body and object info; ``None`` when it is absent or, with
        a fleet key, not trusted (a forged or unsigned record counts as absent)."""
        try:
            data, info = self.read_small(name)
        except ObjectNotFound:
            return None
        body = self.unseal(name, data, info)
        return None if body is None else (body, info)

    # -- leases and the storage's guarantees ---------------------------------------------

    def storage_now(self) -> float:
        """The storage's own clock (unix seconds): the time it gives a scratch object.

        Lease ages are measured on this clock alone, so no two machines' clocks are ever
        compared."""
        name = f"{PROBE_FOLDER}/clock-{uuid.uuid4().hex}"
        self.objects.put(name, b"")
        try:
            return self.objects.head(name).last_modified.timestamp()
        finally:
            with contextlib.suppress(ObjectStoreError):
                self.objects.delete(name)

    def storage_time(self) -> float:
        """The storage's clock now (unix seconds), from one look at it (:meth:`storage_now`)
        plus the time passed since on this process's monotonic clock; looked at again every
        :data:`STORAGE_CLOCK_RESYNC` seconds. Every fleet record (cuts, failed fills, claims,
        validations, ``created_at``) is written and aged on it, so no two replicas' wall
        clocks are ever compared (spec/hub-mirror.md 8.6)."""
        base = self._storage_base = self._counted(self._storage_base, STORAGE_CLOCK_RESYNC)
        return base[0] + (self.clock.monotonic() - base[1])

    def _counted(self, base: tuple[float, float] | None, window: float) -> tuple[float, float]:
        """``base`` (storage time, monotonic time of that look), or a new look at the
        storage's clock when it is older than ``window`` seconds."""
        if base is None or not 0 <= self.clock.monotonic() - base[1] < window:
            return (self.storage_now(), self.clock.monotonic())
        return base

    def storage_age(self, at: float) -> float:
        """Seconds since ``at`` (a time on the storage's clock); negative when ``at`` is in
        its future, which a caller takes as recent."""
        return self.storage_time() - at

    def lease_state(self, folder: str, *, name: str | None = None) -> LeaseState | None:
        """The repo's lease (or the lease object ``name``; ``None`` when there is none),
        with its age on the storage's clock: one GET, the clock probed at most every
        :data:`LEASE_CLOCK_RESYNC` seconds and counted on this process's in between."""
        key = name or self.lease_name(folder)
        try:
            data, info = self.read_small(key)
        except ObjectNotFound:
            return None
        body = self.unseal(key, data, info)
        if body is None:  # not the fleet's: taken as expired (over with If-Match on it)
            return LeaseState(info.etag, math.inf, "a lease not signed with the fleet key")
        owner = "an unknown pruner"
        with contextlib.suppress(ValueError, AttributeError):
            owner = str(json_value(body).get("owner") or owner)[:200]
        base = self._lease_base = self._counted(self._lease_base, LEASE_CLOCK_RESYNC)
        now = base[0] + (self.clock.monotonic() - base[1])
        age = max(0.0, now - info.last_modified.timestamp())
        return LeaseState(info.etag, age, owner)

    def take_lease(
        self, folder: str, owner: str, *, name: str | None = None, ttl: float | None = None
    ) -> bool:
        """Create the repo's lease (``If-None-Match: *``), or take over an expired one
        (``If-Match`` on its ETag, so one taker wins); False when another holds it.

        ``name``/``ttl``: another lease object with its own lifetime (a pull-through
        fill's, ``{repo}/.cmh/fills/{etag}/lease``); the same rules."""
        ttl = self.lease_ttl if ttl is None else ttl
        key = name or self.lease_name(folder)
        doc = self._lease_doc(key, owner, ttl)
        for _ in range(3):
            try:
                self._leases[key] = self.objects.put_if_absent(key, doc)
                return True
            except PreconditionFailed:
                pass
            state = self.lease_state(folder, name=key)
            if state is None:
                continue  # released meanwhile
            if lease_left(state.age, ttl) >= 0:  # live, allowing for whole-second times
                return False
            try:
                self._leases[key] = self.objects.put_if_match(key, doc, state.etag)
            except PreconditionFailed:
                return False  # someone else took it over first
            self.notice(
                f"{self.url}{key}: took over the lease {state.owner} left "
                f"{state.age:.0f} s ago (expired after {ttl:.0f} s, and "
                f"{LEASE_TIME_RESOLUTION:.0f} s more for the storage's whole-second times)"
                if math.isfinite(state.age)
                else f"{self.url}{key}: took over {state.owner}"
            )
            return True
        return False

    def renew_lease(
        self, folder: str, owner: str, *, name: str | None = None, ttl: float | None = None
    ) -> bool:
        """Rewrite a lease this store holds (``If-Match``), so its lifetime starts again;
        False when it is no longer ours (it expired and was taken over).

        A rewrite whose answer was lost (the client retried it and the storage refused
        the retry, or it failed after the storage may have taken it) is not a lost lease:
        on a refusal the lease is read, and if it holds this rewrite or the one whose
        answer never came (each has a unique nonce), it is still ours."""
        key = name or self.lease_name(folder)
        etag = self._leases.get(key)
        if etag is None:
            return False
        doc = self._lease_doc(key, owner, self.lease_ttl if ttl is None else ttl)
        try:
            self._leases[key] = self.objects.put_if_match(key, doc, etag)
        except PreconditionFailed:
            unsure = self._unsure.pop(key, None)
            try:
                data, info = self.read_small(key)
            except ObjectNotFound:
                data = b""
            if data == doc:  # this rewrite landed; its retry was refused
                self._leases[key] = info.etag
                return True
            if unsure is not None and data == unsure:  # the unanswered one landed
                self._leases[key] = info.etag
                return self.renew_lease(folder, owner, name=key, ttl=ttl)
            del self._leases[key]
            return False
        except ObjectStoreError:
            self._unsure[key] = doc
            raise
        self._unsure.pop(key, None)
        return True

    def release_lease(self, folder: str, *, name: str | None = None) -> None:
        """Delete the repo's lease (or the lease object ``name``) if this store still holds it:
        the object must still be this holder's last write of it (or the rewrite whose answer
        was lost). A lease that expired and was taken over is the new holder's: left alone
        (a holder may not know yet that it lost its lease)."""
        key = name or self.lease_name(folder)
        etag = self._leases.pop(key, None)
        unsure = self._unsure.pop(key, None)
        if etag is None:
            return
        try:
            data, info = self.read_small(key)
        except ObjectNotFound:
            return
        if info.etag == etag or (unsure is not None and data == unsure):
            self.objects.delete(key)

    def _lease_doc(self, key: str, owner: str, ttl: float) -> bytes:
        # A fresh nonce each write, so each renewal has a new ETag (writers go by ETags).
        doc = {"owner": owner, "ttl": ttl, "nonce": uuid.uuid4().hex}
        return self.seal(key, json.dumps(doc).encode())

    def ensure_conditional_writes(self) -> None:
        """Refuse a storage that ignores conditional writes, before anything is written.

        Probes a scratch key under ``.cmh/probe/``: a second create-only PUT
        (``If-None-Match: *``) must be refused, and so must a PUT with ``If-Match`` on an
        ETag the object does not have. Checked once per store object.
        """
        if self._conditional_writes_checked:
            return
        name = f"{PROBE_FOLDER}/cas-{uuid.uuid4().hex}"
        missing: list[str] = []
        try:
            self.objects.put_if_absent(name, b"cmh probe 1\n")
            try:
                self.objects.put_if_absent(name, b"cmh probe 2\n")
                missing.append("If-None-Match: * (a create-only PUT replaced an existing object)")
            except PreconditionFailed:
                pass
            try:
                self.objects.put_if_match(name, b"cmh probe 3\n", '"' + "0" * 32 + '"')
                missing.append("If-Match (a PUT on a stale ETag replaced the object)")
            except PreconditionFailed:
                pass
        finally:
            with contextlib.suppress(ObjectStoreError):
                self.objects.delete(name)
        if missing:
            endpoint = self.objects.settings.endpoint or "AWS S3"
            raise ConditionalWritesUnsupported(
                f"storage {endpoint} ({self.url}) does not honour conditional writes: "
                f"it ignores {' and '.join(missing)}. cmh needs If-None-Match: * and If-Match "
                "on PUT so that concurrent writers never lose a commit; nothing was written "
                "(use a storage that supports them, as AWS S3 and SeaweedFS do)"
            )
        self._conditional_writes_checked = True

    def _store_blob(self, folder: str, f: SourceFile) -> bool:
        """Make ``blobs/{etag}`` hold ``f``'s bytes; True when it was uploaded.

        A blob already there with the right size is kept (scrub checks stored bytes).
        The upload hashes the bytes it sends and aborts before completing when they
        differ from the name (the source changed), so a wrong blob is never created.
        """
        self.ensure_conditional_writes()
        name = self.blob_name(folder, f.etag)
        try:
            if self.objects.head(name).size == f.size:
                return False
        except ObjectNotFound:
            pass
        if f.size <= self.objects.part_size:
            data = f.source.read_bytes()
            if _digests(data, f.size) != (f.sha256, f.git_oid):
                raise StoreError(f"{f.source} changed while it was imported")
            stored = self.objects.put(name, data)
        else:
            stored = self.objects.put_stream(name, _checked_chunks(f))
        self.record_check(folder, f.etag, stored)  # its bytes were hashed on the way up
        return True

    @staticmethod
    def check_name(folder: str, etag: str) -> str:
        return f"{folder}/{CHECK_RECORDS}/{etag}"

    def record_check(self, folder: str, etag: str, storage_etag: str) -> None:
        """Record that the blob object version ``storage_etag`` hashes to ``etag``, for
        every replica (best effort: without it a replica checks the object itself)."""
        if not storage_etag:
            return
        body = json.dumps({"storage_etag": storage_etag}).encode()
        with contextlib.suppress(ObjectStoreError):
            self.put_record(self.check_name(folder, etag), body)

    def read_check(self, folder: str, etag: str) -> str | None:
        """The blob object version (storage ETag) recorded as hashing to ``etag``."""
        record = self.get_record(self.check_name(folder, etag))
        if record is None:
            return None
        try:
            doc = json_value(record[0])
        except ValueError:
            return None
        value = doc.get("storage_etag") if isinstance(doc, dict) else None
        return value if isinstance(value, str) else None

    # -- upstream freshness (pull-through) ----------------------------------------------

    @staticmethod
    def upstream_record_name(folder: str, commit: str) -> str:
        if not COMMIT_RE.match(commit):
            raise InvalidNameError(f"{commit!r} is not a commit id")
        return f"{folder}/{UPSTREAM_RECORDS}/{commit}.json"

    def record_upstream_freshness(self, folder: str, commit: str, fresh_until: float) -> None:
        """Keep when ``commit``'s upstream freshness ends (``cmh prune --expired`` reads it);
        written after the commit's tree object, replacing the previous record."""
        doc = {"fresh_until": fresh_until, "at": self.storage_time()}
        self.put_record(self.upstream_record_name(folder, commit), json.dumps(doc).encode())

    def upstream_record_infos(self, folder: str) -> dict[str, ObjectInfo]:
        """The upstream freshness records of a repo by commit id (one listing)."""
        base = f"{folder}/{UPSTREAM_RECORDS}/"
        out = {}
        for info in self.objects.list(f"{folder}/{UPSTREAM_RECORDS}"):
            commit = info.name[len(base) :].removesuffix(".json")
            if COMMIT_RE.match(commit) and info.name.endswith(".json"):
                out[commit] = info
        return out

    def read_upstream_freshness(self, folder: str, commit: str) -> float | None:
        """``fresh_until`` of ``commit``'s record; ``None`` when absent or unreadable."""
        record = self.get_record(self.upstream_record_name(folder, commit))
        return None if record is None else record_number(record[0], "fresh_until")

    # -- listing ------------------------------------------------------------------------

    def list_store(self) -> list[RepoSummary]:
        """Every repo with its refs (file count and size of each) and blob usage."""
        out: list[RepoSummary] = []
        for repo_type, repo_id, folder in self.repos():
            refs: list[RefSummary] = []
            for name, state in sorted(self.refs(folder).items()):
                tree = self.read_tree(folder, state.commit) if state.commit else None
                if tree is not None:
                    refs.append(
                        RefSummary(name, tree.commit, len(tree.files),
                                   sum(f.size for f in tree.files))
                    )  # fmt: skip
            blobs = self.blob_infos(folder)
            out.append(
                RepoSummary(repo_id, repo_type, refs, sorted(self.tree_infos(folder)),
                            len(blobs), sum(b.size for b in blobs.values()))
            )  # fmt: skip
        return out


def _first(parents: tuple[str, ...]) -> str | None:
    return parents[0] if parents else None


def _tree_files(files: list[SourceFile]) -> Iterator[TreeFile]:
    for f in sorted(files, key=lambda f: f.path):
        yield TreeFile(f.path, f.size, f.etag, f.tree_oid, f.sha256 if f.lfs else None)


def _digests(data: bytes, size: int) -> tuple[str, str]:
    git = git_blob_hasher(size)
    git.update(data)
    return hashlib.sha256(data).hexdigest(), git.hexdigest()


class SourceChanged(BucketError):
    """A file's bytes changed between hashing and upload (the upload was aborted)."""


def _checked_chunks(f: SourceFile) -> Iterator[bytes]:
    """The file's bytes in chunks, hashed on the way; raises before the last chunk is
    handed over when they differ from ``f``'s hashes, which aborts the upload."""
    sha, git = hashlib.sha256(), git_blob_hasher(f.size)
    sent = 0
    pending: bytes | None = None
    with open(f.source, "rb") as fh:
        while True:
            chunk = fh.read(READ_CHUNK)
            if not chunk:
                break
            sha.update(chunk)
            git.update(chunk)
            sent += len(chunk)
            if pending is not None:
                yield pending
            pending = chunk
    if sent != f.size or (sha.hexdigest(), git.hexdigest()) != (f.sha256, f.git_oid):
        raise SourceChanged(f"{f.source} changed while it was imported")
    if pending is not None:
        yield pending


def open_bucket(url: str, **options: Any) -> BucketStore:
    """Open a bucket store, turning settings problems into :class:`BucketError`."""
    try:
        return BucketStore.open(url, **options)
    except ObjectStoreError as exc:
        raise BucketError(str(exc)) from None


__all__ = [
    "SYSTEM_CLOCK",
    "BucketError",
    "BucketStore",
    "Clock",
    "ConditionalWritesUnsupported",
    "LeaseState",
    "RefState",
    "TreeFile",
    "TreeObject",
    "is_bucket_url",
    "open_bucket",
]


@contextlib.contextmanager
def _storage_errors() -> Iterator[None]:
    """A storage that fails (or holds an invalid object) is :class:`StoreUnavailable`."""
    try:
        yield
    except (ObjectStoreError, BucketError) as exc:
        if isinstance(exc, StoreUnavailable):
            raise
        if isinstance(exc, BucketError):
            raise StoreUnavailable(str(exc), INVALID_OBJECT) from None
        raise StoreUnavailable(str(exc)) from None


def manifest_name(folder: str, etag: str) -> str:
    """Where the tensor manifest of blob ``etag`` is kept in the bucket."""
    return f"{folder}/.cmh/manifests/{etag}.json"
