"""What the pages show, read through the store the app serves and the one prune planner.

Plain functions of a :class:`~cmh.hub.mirror.stores.MirrorStore` (no aiohttp, no
templates, no folder or bucket named): the repo list, a repo's revisions and
tree, a file's stamp details, the operator's view. Everything a page reads
about a repo comes from the store (the same checked index the API serves
from); stamp details are read from the blob headers once per blob version
(:class:`StampCache`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from cmh.hub.cache import SYSTEM_CLOCK, repo_folder_name

from cmh import TensorSpec

from .._auth import AccessPolicy, repo_key
from .._index import CommitIndex, FileEntry
from .._memo import Memo
from ..stores import ScrubView, StoreError

if TYPE_CHECKING:
    from cmh import VerifyResult

    from .._history import CommitRecord
    from ..stores import MirrorStore
from ._session import Viewer

#: Rows per page of the repo list.
PAGE_SIZE = 100
#: Tensors listed on a file page (the rest are counted).
MAX_TENSORS_SHOWN = 300
#: Bytes read from the end of the access log for the busiest repos.
ACCESS_LOG_TAIL = 4 << 20


# -- stamps --------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRow(TensorSpec):
    nbytes: int
    sha256: str | None  # the manifest's digest (hex), None when not stamped


@dataclass(frozen=True)
class FileStamp:
    """What a safetensors file says about itself (header only, no tensor hashed)."""

    stamped: bool
    error: str | None = None
    expires_at: int | None = None  # 0 = never
    stamped_at: int | None = None
    signed: bool = False
    signer_key_id: str | None = None
    signature: str | None = None  # valid | invalid | untrusted | unchecked
    has_sha256: bool = False
    has_xxh3: bool = False
    tensor_count: int = 0
    tensor_bytes: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)
    tensors: tuple[TensorRow, ...] = ()

    def expired(self, now: float) -> bool:
        return bool(self.expires_at) and now >= (self.expires_at or 0)


@dataclass(frozen=True)
class Verification:
    """The verdict of ``cmh.verify`` on a file (tensors hashed against the manifest) and
    when it was reached."""

    result: VerifyResult
    at: float


BlobKey = tuple[str, str, int]


def blob_key(entry: FileEntry) -> BlobKey:
    """One blob version: its place in the store, its ETag (a digest of its bytes), its size."""
    return (str(entry.source), entry.etag, entry.size)


class StampCache:
    """Stamp details and verifications of blobs, computed once per blob version."""

    def __init__(self, trusted_keys: Any = None) -> None:
        self.trusted_keys = trusted_keys
        self._stamps: Memo[BlobKey, FileStamp] = Memo(8192)
        self._verified: Memo[BlobKey, Verification] = Memo(1024)

    def stamp(self, store: MirrorStore, entry: FileEntry) -> FileStamp:
        """The stamp details of an entry, its header read through the store."""

        def compute() -> FileStamp:
            with store.opener(entry) as f:
                return read_stamp(f, entry.size, entry.path, self.trusted_keys)

        return self._stamps.get_or_compute(blob_key(entry), compute)

    def verify(self, store: MirrorStore, index: CommitIndex, entry: FileEntry) -> Verification:
        """``cmh.verify`` of an entry (on a local copy where the store is not a folder)."""

        def compute() -> Verification:
            with store.local_files(index, [entry.path]) as files:
                return verify_file(files[entry.path], self.trusted_keys)

        return self._verified.get_or_compute(blob_key(entry), compute)

    def verified(self, entry: FileEntry) -> Verification | None:
        """A verification already made of this blob version, if any."""
        return self._verified.get(blob_key(entry))


def read_stamp(f: BinaryIO, size: int, name: str, trusted_keys: Any = None) -> FileStamp:
    """Stamp details of one safetensors file (open as ``f``, ``size`` bytes, ``name`` in
    messages); no tensor byte is read.

    What ``cmh.inspect`` reports, plus the manifest's per-tensor digests, from
    one read of the header (``cmh.inspect`` would read it a second time: the
    repo list reads every weight file's header once on a cold start).
    """
    from collections import Counter

    from cmh import CMHError, read_carrier, read_header_from, signature_status

    try:
        header = read_header_from(f, size, path=name)
    except (CMHError, OSError) as exc:
        return FileStamp(stamped=False, error=str(exc))
    base = FileStamp(
        stamped=False,
        tensor_count=len(header.tensors),
        tensor_bytes=header.data_size,
        dtypes=dict(Counter(t.dtype for t in header.tensors)),
        tensors=tuple(
            TensorRow(t.name, t.dtype, t.shape, t.nbytes, None)
            for t in header.tensors[:MAX_TENSORS_SHOWN]
        ),
    )
    try:
        carrier = read_carrier(header.metadata, len(header.tensors))
    except CMHError as exc:
        return replace(base, error=str(exc))
    if carrier is None:
        return base
    record = carrier.record
    signature = None
    if record.signed and carrier.signature is not None:
        signer = carrier.key_id or ""
        signature = signature_status(record.to_bytes(), carrier.signature, signer, trusted_keys)
    digests = list(carrier.sha256) if carrier.sha256 is not None else None
    return replace(
        base,
        stamped=True,
        expires_at=record.expires_at,
        stamped_at=record.stamped_at,
        signed=record.signed,
        signer_key_id=carrier.key_id,
        signature=signature,
        has_sha256=carrier.sha256 is not None,
        has_xxh3=carrier.xxh3 is not None,
        tensors=tuple(
            replace(row, sha256=digests[i].hex() if digests else None)
            for i, row in enumerate(base.tensors)
        ),
    )


def verify_file(path: Path, trusted_keys: Any = None, at: float | None = None) -> Verification:
    """``cmh.verify`` of one file: every tensor hashed; a signature checked when keys are given.

    Expiry is shown on its own, so it does not fail the verification here. ``at``: when it
    was verified (default: the system clock's now), shown on the page.
    """
    from cmh import verify

    result = verify(path, trusted_keys=trusted_keys, require_signature=False, allow_expired=True)
    return Verification(result, SYSTEM_CLOCK.time() if at is None else at)


# -- repos -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StampState:
    """A revision's stamps: how many of its safetensors files are stamped, earliest expiry."""

    safetensors: int
    stamped: int
    expires_at: int | None  # earliest non-zero expiry, None when nothing expires
    expired: bool
    signed: int

    @property
    def label(self) -> str:
        if not self.safetensors:
            return "no weights"
        if self.expired:
            return "expired"
        if self.stamped == self.safetensors:
            return "stamped"
        return "partly stamped" if self.stamped else "unstamped"


@dataclass(frozen=True)
class RepoRow:
    """One line of the repo list."""

    repo_type: str
    repo_id: str
    private: bool
    commit: str | None
    revision: str | None
    files: int
    size: int
    last_modified: float | None
    stamp: StampState | None

    @property
    def key(self) -> str:
        return repo_key(self.repo_type, self.repo_id)


@dataclass(frozen=True)
class RepoName:
    """A repo a page shows: its type and id (what it holds is read through the store)."""

    repo_type: str
    repo_id: str


def visible_repos(
    store: MirrorStore, policy: AccessPolicy, viewer: Viewer, query: str = "", repo_type: str = ""
) -> list[RepoName]:
    """Repos of the store this viewer may see, filtered by a name substring and type,
    sorted by folder name (``models--org--name``, as spec/hub-mirror.md 6 lists them)."""
    needle = query.strip().lower()
    out = []
    for kind, repo_id in store.repos():
        if kind not in ("model", "dataset"):
            continue
        if (repo_type and kind != repo_type) or (needle and needle not in repo_id.lower()):
            continue
        if viewer.can_read(policy, kind, repo_id):
            out.append(RepoName(kind, repo_id))
    return sorted(out, key=lambda r: repo_folder_name(r.repo_id, r.repo_type))


def default_revision(store: MirrorStore, repo: RepoName) -> tuple[str | None, CommitIndex | None]:
    """``(revision, index)`` a repo page opens on: ``main``, else the first ref, else a
    commit; ``(None, None)`` when the store holds no commit of the repo."""
    t, name = repo.repo_type, repo.repo_id
    index = store.resolve(t, name, "main")
    if index is not None:
        return "main", index
    for ref, target in sorted(store.refs(t, name).items()):
        index = store.resolve(t, name, target)
        if index is not None:
            return ref, index
    commits = store.commits(t, name)
    index = store.resolve(t, name, commits[-1]) if commits else None
    return (commits[-1], index) if index is not None else (None, None)


def stamp_state(
    store: MirrorStore, index: CommitIndex, stamps: StampCache, now: float
) -> StampState:
    """The stamp state of one commit (from the cached header reads)."""
    weights = [e for e in index.files.values() if e.path.endswith(".safetensors")]
    stamped = signed = 0
    expiries: list[int] = []
    for entry in weights:
        try:
            info = stamps.stamp(store, entry)
        except OSError:
            continue
        if info.stamped:
            stamped += 1
            signed += info.signed
            if info.expires_at:
                expiries.append(info.expires_at)
    first = min(expiries) if expiries else None
    return StampState(len(weights), stamped, first, first is not None and now >= first, signed)


def repo_row(
    store: MirrorStore, repo: RepoName, policy: AccessPolicy, stamps: StampCache, now: float
) -> RepoRow:
    """The list line of one repo, at its default revision."""
    private = policy.is_private(repo.repo_type, repo.repo_id)
    revision, index = default_revision(store, repo)
    if index is None:
        return RepoRow(repo.repo_type, repo.repo_id, private, None, None, 0, 0, None, None)
    return RepoRow(
        repo.repo_type,
        repo.repo_id,
        private,
        index.commit,
        revision,
        len(index.files),
        index.total_size,
        index.last_modified,
        stamp_state(store, index, stamps, now),
    )


@dataclass(frozen=True)
class RefRow:
    name: str
    commit: str


@dataclass(frozen=True)
class CommitRow:
    commit: str
    created: float | None
    refs: tuple[str, ...]


def revisions(store: MirrorStore, repo: RepoName) -> tuple[list[RefRow], list[CommitRow]]:
    """A repo's refs and its commits (newest first), each commit with the refs naming it."""
    refs = [RefRow(n, c) for n, c in sorted(store.refs(repo.repo_type, repo.repo_id).items())]
    commits = []
    for commit in store.commits(repo.repo_type, repo.repo_id):
        try:
            index = store.resolve(repo.repo_type, repo.repo_id, commit)
        except (OSError, StoreError):
            index = None
        created = index.last_modified if index is not None else None
        names = tuple(r.name for r in refs if r.commit == commit)
        commits.append(CommitRow(commit, created, names))
    commits.sort(key=lambda c: c.created or 0.0, reverse=True)
    return refs, commits


def commit_records(
    store: MirrorStore, repo: RepoName, head: CommitIndex, refs: list[RefRow]
) -> dict[str, CommitRecord]:
    """The records (title, authors, time) of the commits in the history of ``head`` and
    of every ref; a commit made without one (not by ``cmh mirror add``) is left out."""
    heads = [head]
    for commit in sorted({r.commit for r in refs} - {head.commit}):
        index = store.resolve(repo.repo_type, repo.repo_id, commit)
        if index is not None:
            heads.append(index)
    out: dict[str, CommitRecord] = {}
    for index in heads:
        for record in store.history(repo.repo_type, repo.repo_id, index):
            if record.recorded:
                out.setdefault(record.commit, record)
    return out


@dataclass(frozen=True)
class TreeRow:
    path: str
    name: str
    is_dir: bool
    size: int
    lfs: bool
    stamp: FileStamp | None


def tree(
    store: MirrorStore, index: CommitIndex, directory: str, stamps: StampCache
) -> list[TreeRow]:
    """The entries of one folder of a commit: folders first, then files."""
    from .._documents import children

    rows = []
    for path in children(index, directory, recursive=False):
        name = path.rsplit("/", 1)[-1]
        entry = index.files.get(path)
        if entry is None:
            size = sum(f.size for p, f in index.files.items() if p.startswith(path + "/"))
            rows.append(TreeRow(path, name, True, size, False, None))
            continue
        rows.append(
            TreeRow(
                path,
                name,
                False,
                entry.size,
                bool(entry.lfs_sha256),
                file_stamp(store, entry, stamps),
            )
        )
    return rows


def file_stamp(store: MirrorStore, entry: FileEntry, stamps: StampCache) -> FileStamp | None:
    """Stamp details of a repo file, ``None`` when it is not a safetensors file (or its
    blob cannot be read now)."""
    if not entry.path.endswith(".safetensors"):
        return None
    try:
        return stamps.stamp(store, entry)
    except OSError:
        return None


# -- the operator's view --------------------------------------------------------------


@dataclass(frozen=True)
class RepoSize:
    label: str
    repo_type: str
    repo_id: str
    bytes: int
    revisions: int


@dataclass(frozen=True)
class RevisionNote:
    label: str
    commit: str
    refs: tuple[str, ...]
    expires_at: int | None
    last_activity: float


@dataclass(frozen=True)
class TrafficView:
    """Request and byte counts from this server's Prometheus metrics."""

    requests: int
    errors: int  # 5xx answers
    bytes_sent: int
    by_route: list[tuple[str, int, int]]  # route, requests, bytes
    by_status: list[tuple[str, int]]
    upstream: str  # what the hit ratio is measured against


@dataclass(frozen=True)
class PrunePreview:
    """What ``cmh prune`` would do to the store now: prune's read-only scan and its dry runs.

    Computed by :class:`cmh.hub.prune.StorePreview`, which ``cmh serve`` passes in
    (:attr:`~cmh.hub.mirror.web.WebOptions.prune_preview`): the pages import nothing of prune."""

    scan: Any  # cmh.hub.prune.CacheScan, with expiries and commit times
    plan: Any  # cmh.hub.prune.PrunePlan of the default policy
    expired_plan: Any  # the plan of ``cmh prune --expired``
    referenced_plan: Any  # the plan of ``cmh prune --expired --include-referenced``


#: Computes the :class:`PrunePreview` at a time (the server's clock).
PrunePreviewer = Callable[[float], PrunePreview]


@dataclass(frozen=True)
class OperatorView:
    """Everything the operator page shows."""

    total_bytes: int
    sizes: list[RepoSize]
    expired: list[RevisionNote]
    stale: list[RevisionNote]
    plan: Any  # cmh.hub.prune.PrunePlan (default policy, dry run)
    expired_plan: Any  # the plan of ``cmh prune --expired`` (dry run)
    referenced_plan: Any  # ``cmh prune --expired --include-referenced`` (dry run)
    scrub: ScrubView
    traffic: TrafficView
    busiest: list[tuple[str, int, int]]  # repo, requests, bytes
    busiest_note: str
    now: float

    @property
    def plans(self) -> list[tuple[str, Any, str]]:
        """The dry runs the page shows: (title, plan, command). ``--include-referenced``
        is shown when it would remove more than ``--expired`` alone (an expired revision
        a ref names is kept without it)."""
        command = "cmh prune --store STORE"
        plans = [
            ("Default policy (housekeeping only)", self.plan, command),
            ("With --expired", self.expired_plan, f"{command} --expired"),
        ]
        if self.referenced_plan.revision_count > self.expired_plan.revision_count:
            plans.append(("With --expired --include-referenced", self.referenced_plan,
                          f"{command} --expired --include-referenced"))  # fmt: skip
        return plans

    @property
    def expired_kept(self) -> int:
        """Expired revisions ``--expired`` keeps because a ref names them."""
        kept: int = self.referenced_plan.revision_count - self.expired_plan.revision_count
        return kept


def _label(repo_type: str, repo_id: str) -> str:
    return repo_key(repo_type, repo_id)


def operator_view(
    store: MirrorStore,
    preview: PrunePreviewer | None,
    exposition: bytes,
    access_log: Path | None,
    now: float,
) -> OperatorView:
    """Read the whole store (``preview``: prune's scan, read-only) and this server's metrics,
    at ``now`` (the server's clock); a server given no ``preview`` cannot show the page."""
    if preview is None:
        raise StoreError("this server has no prune preview for its store")
    at = now
    dry_run = preview(at)
    scan = dry_run.scan
    sizes: list[RepoSize] = []
    expired: list[RevisionNote] = []
    stale: list[RevisionNote] = []
    for repo in scan.repos:
        label = _label(repo.repo_type, repo.repo_id)
        size = sum(e.size for e in repo.blobs.values())
        sizes.append(RepoSize(label, repo.repo_type, repo.repo_id, size, len(repo.revisions)))
        for rev in repo.revisions:
            refs = repo.refs_to(rev.commit)
            note = RevisionNote(label, rev.commit, refs, rev.expires_at, rev.last_activity)
            if rev.expires_at and at >= rev.expires_at:
                expired.append(note)
            if rev.is_commit and not refs:
                stale.append(note)
    sizes.sort(key=lambda s: (-s.bytes, s.label))
    busiest, busiest_note = busiest_repos(access_log)
    return OperatorView(
        total_bytes=sum(s.bytes for s in sizes),
        sizes=sizes,
        expired=expired,
        stale=stale,
        plan=dry_run.plan,
        expired_plan=dry_run.expired_plan,
        referenced_plan=dry_run.referenced_plan,
        scrub=store.scrub_history(),
        traffic=traffic(exposition),
        busiest=busiest,
        busiest_note=busiest_note,
        now=at,
    )


def traffic(exposition: bytes) -> TrafficView:
    """Totals from the Prometheus text this server exposes."""
    from prometheus_client.parser import text_string_to_metric_families

    requests: Counter[str] = Counter()
    status: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    for family in text_string_to_metric_families(exposition.decode("utf-8", "replace")):
        for sample in family.samples:
            if sample.name == "cmh_mirror_requests_total":
                requests[sample.labels.get("route", "")] += int(sample.value)
                status[sample.labels.get("status", "")] += int(sample.value)
            elif sample.name == "cmh_mirror_response_bytes_total":
                sent[sample.labels.get("route", "")] += int(sample.value)
    routes = sorted(set(requests) | set(sent), key=lambda r: -requests[r])
    return TrafficView(
        requests=sum(requests.values()),
        errors=sum(v for k, v in status.items() if k.startswith("5")),
        bytes_sent=sum(sent.values()),
        by_route=[(r, requests[r], sent[r]) for r in routes],
        by_status=sorted(status.items()),
        upstream="none: this mirror serves its own store, so every answer comes from it",
    )


def busiest_repos(access_log: Path | None, top: int = 10) -> tuple[list[tuple[str, int, int]], str]:
    """Repos with the most requests in the last part of the JSON access log."""
    if access_log is None:
        return [], "the server logs to stderr: start it with --access-log FILE to see this"
    try:
        with open(access_log, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - ACCESS_LOG_TAIL))
            data = f.read()
    except OSError as exc:
        return [], f"cannot read the access log: {exc.strerror}"
    counts: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    lines = data.splitlines()[1:] if size > ACCESS_LOG_TAIL else data.splitlines()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        repo = entry.get("repo") if isinstance(entry, dict) else None
        if isinstance(repo, str):
            counts[repo] += 1
            nbytes = entry.get("bytes")
            sent[repo] += nbytes if isinstance(nbytes, int) else 0
    note = f"from the last {len(lines)} lines of the access log"
    return [(r, n, sent[r]) for r, n in counts.most_common(top)], note


@dataclass(frozen=True)
class Bar:
    label: str
    bytes: int
    x: float  # bar width, in chart units
    y: float


#: Width of the bars' area and height of one bar in the SVG chart (user units).
CHART_WIDTH = 540.0
BAR_HEIGHT = 22.0


def size_chart(sizes: list[RepoSize], top: int = 20) -> list[Bar]:
    """Bars of the largest repos for the operator page's SVG chart (no script needed)."""
    shown = sizes[:top]
    largest = max((s.bytes for s in shown), default=0) or 1
    return [
        Bar(s.label, s.bytes, max(1.0, CHART_WIDTH * s.bytes / largest), i * BAR_HEIGHT)
        for i, s in enumerate(shown)
    ]
