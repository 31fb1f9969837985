"""The store protocol, one small protocol per role, composed.

A store is read (:class:`StoreReader`: repos, refs, commits, files), written
(:class:`StoreWriter`: imports, syncs, freshness records), delivers blobs
(:class:`StoreDelivery`), pulls through (:class:`StorePullThrough`) and is kept
(:class:`StoreHousekeeping`: checks, sizes, scrubs, prune's scan). A caller that needs
one role takes that protocol; :class:`MirrorStore` is every role of one store. No
role names the kind of store it is: a folder's path, a bucket's client stay inside
the kind (``stores.local``, ``stores.bucket``, ``stores.memory``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .._history import CommitRecord
    from .._index import CommitIndex, FileEntry
    from ._delivery import BlobDelivery
    from ._pull import PullThrough
    from ._sync import SyncRequest, SyncResult
    from .local._folder import ImportOptions, ImportResult, RepoSummary
    from .local._scrub import ScrubOptions, ScrubReport


#: The files a fingerprint reads as a model's weights (their stamps stand for their bytes):
#: a top-level model or adapter file, or a shard of a sharded model. Any other file may be
#: read byte for byte (remote code's data, a module's weights), so it is copied whole.
WEIGHT_FILES = re.compile(r"(model|adapter_model|model-\d{5}-of-\d{5})\.safetensors")
#: Seconds a stamp must stay unexpired for a store to vouch for it by its kept manifest.
HEADER_COPY_MARGIN = 3600.0
#: A JSON object a store keeps (a tensor manifest, a scrub report, a quarantine note).
Document = dict[str, object]
#: The file of a store's last scrub report, beside its quarantined blobs.
LAST_SCRUB = "last-scrub.json"
#: What the operator page reads of a store's quarantine, folder and bucket alike (anyone
#: who may write to the store decides the notes' number and sizes): the last report up to
#: :data:`MAX_LAST_SCRUB_BYTES`, at most :data:`MAX_QUARANTINE_NOTES` notes of at most
#: :data:`MAX_NOTE_BYTES` each (a scrub writes a few KiB), :data:`MAX_NOTES_BYTES` in all
#: (the newest are not chosen: a folder's are read by name, a bucket's as listed).
MAX_LAST_SCRUB_BYTES = 64 << 20
MAX_QUARANTINE_NOTES = 1000
MAX_NOTE_BYTES = 1 << 20
MAX_NOTES_BYTES = 16 << 20


def gather_notes(found: Iterable[tuple[int, Callable[[], bytes | None]]]) -> list[Document]:
    """The quarantine notes of ``found`` (each its size and a reader that gives its bytes,
    or None when it cannot be read), newest first, within the bounds above: a note larger
    than :data:`MAX_NOTE_BYTES` or not a JSON object is left out; reading stops at
    :data:`MAX_QUARANTINE_NOTES` notes or :data:`MAX_NOTES_BYTES` bytes."""
    from cmh.hub.cache import json_value

    notes: list[Document] = []
    total = 0
    for size, read in found:
        if size > MAX_NOTE_BYTES:
            continue
        if len(notes) >= MAX_QUARANTINE_NOTES or total + size > MAX_NOTES_BYTES:
            break  # enough for one page
        data = read()
        if data is None or len(data) > MAX_NOTE_BYTES:
            continue
        total += len(data)
        try:
            doc = json_value(data)
        except ValueError:
            continue
        if isinstance(doc, dict):
            notes.append(doc)
    notes.sort(key=lambda n: -_number(n.get("quarantined_at")))
    return notes


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


@dataclass(frozen=True)
class ScrubView:
    """The last ``cmh mirror scrub`` (if recorded) and every quarantined blob."""

    last: Document | None
    quarantined: list[Document]


class StoreReader(Protocol):
    """What is read of a store: repos, refs, commits and the bytes of their files.

    Repos are named by ``(repo_type, repo_id)``. Reads of a storage that fails
    raise :class:`StoreUnavailable`.
    """

    def repos(self) -> list[tuple[str, str]]:
        """Every ``(repo_type, repo_id)`` the store holds, sorted."""

    def repo_exists(self, repo_type: str, repo_id: str) -> bool:
        """True when the store holds the repo (a ref or a commit)."""

    def resolve(
        self, repo_type: str, repo_id: str, revision: str, *, used: bool = False
    ) -> CommitIndex | None:
        """The index of the commit ``revision`` names; None when it names none.
        ``used``: a download is about to be served (recorded where the kind keeps use)."""

    def refs(self, repo_type: str, repo_id: str) -> dict[str, str]:
        """Every ref whose commit the store holds: name -> commit."""

    def commits(self, repo_type: str, repo_id: str) -> list[str]:
        """Every commit the store holds of the repo (named by a ref or not), sorted."""

    def history(self, repo_type: str, repo_id: str, head: CommitIndex) -> list[CommitRecord]:
        """``head`` and its first parents, newest first."""

    def last_commits(
        self, repo_type: str, repo_id: str, head: CommitIndex, paths: list[str]
    ) -> dict[str, CommitRecord]:
        """The commit that last changed each path."""

    def opener(self, entry: FileEntry) -> BinaryIO:
        """A seekable reader of an entry's stored bytes (for documents derived from files)."""

    def local_files(
        self, index: CommitIndex, paths: list[str], *, stamped_headers: bool = False
    ) -> AbstractContextManager[dict[str, Path]]:
        """The files ``paths`` of a commit as local files (checked against their names
        where they had to be copied), for readers that need paths. ``stamped_headers``:
        a reader that takes a checked stamp for a file's tensor bytes (the semantic
        fingerprint) may get such a file as its header alone, with its check record."""

    def blob_present(self, entry: FileEntry) -> bool:
        """True when the entry's blob is in the store (it may still be bad)."""

    def manifest(self, repo_type: str, repo_id: str, entry: FileEntry) -> Document:
        """The tensor manifest of a safetensors entry, computed and kept if there is none
        (:class:`~cmh.hub.mirror._manifests.ManifestError` for an unusable file)."""


class StoreWriter(Protocol):
    """What writes a store: imports, syncs from a Hub, pull-through's freshness records."""

    #: Told what a writer waits for (a pruner's lease), for the terminal; None: silent.
    on_notice: Callable[[str], None] | None

    def create(self) -> None:
        """Make an empty store where there is none (a pull-through cache starts empty);
        a store whose storage must exist already makes nothing."""

    def add_folder(self, src: Path, repo_id: str, **options: Unpack[ImportOptions]) -> ImportResult:
        """Import ``src`` as a commit of ``repo_id`` at ``revision``."""

    def sync(self, request: SyncRequest) -> SyncResult:
        """Fill the store from a Hub: ``request.fetch(cache)`` resolves into a local Hugging
        Face cache kept between runs (the store itself when it is one, else ``cache_dir`` or
        :func:`~._sync.default_sync_cache`, whose snapshot is then imported), so a sync again
        fetches only what changed and an interrupted one resumes."""

    def record_upstream_freshness(
        self, repo_type: str, repo_id: str, commit: str, fresh_until: float
    ) -> None:
        """Keep when a pull-through commit's upstream freshness ends (``{repo}/.cmh/
        upstream/{commit}.json``; ``cmh prune --expired`` reads it): after the commit is
        in the store, replacing the previous record."""


class StoreDelivery(Protocol):
    """How a store's blobs reach clients: its ``--blob-delivery`` modes."""

    #: The ``--blob-delivery`` modes this store can do (the first is the default).
    deliveries: tuple[str, ...]

    def delivery(self, mode: str) -> BlobDelivery:
        """How a blob's bytes reach a client in ``mode`` (one of :attr:`deliveries`; one
        object per worker and mode, :class:`StoreError` for a mode the store cannot do)."""


class StorePullThrough(Protocol):
    """A store's side of ``cmh serve --upstream`` (and of its access and cut records)."""

    def pull_through(self, fresh_for: float, *, fill_lease_ttl: float | None = None) -> PullThrough:
        """The store's side of ``cmh serve --upstream`` (``fresh_for``: seconds an unstamped
        branch stays fresh after a validation; ``fill_lease_ttl``: the lifetime of a fill's
        lease, ``None`` for the default; a store without fill leases raises
        :class:`StoreError` when it is given)."""


class StoreHousekeeping(Protocol):
    """What keeps a store: checks, sizes, listings, scrubs and prune's scan."""

    def check(self) -> None:
        """Raise :class:`StoreMissing` / :class:`StoreUnavailable` unless it can be served."""

    def size(self, skip: Callable[[str, str], bool]) -> tuple[int, int]:
        """Bytes of blobs and number of the repos ``skip(repo_type, repo_id)`` keeps."""

    def list_store(self) -> list[RepoSummary]:
        """Every repo with its refs and blob usage."""

    def scrub(self, **options: Unpack[ScrubOptions]) -> ScrubReport:
        """Re-hash every blob; quarantine the bad ones; keep the report for the web page."""

    def scrub_bytes(self) -> int:
        """Bytes a scrub reads (for its progress bar; 0: unknown)."""

    def scrub_history(self) -> ScrubView:
        """The last recorded scrub and the notes of quarantined blobs (the operator page)."""


class MirrorStore(
    StoreReader, StoreWriter, StoreDelivery, StorePullThrough, StoreHousekeeping, Protocol
):
    """Every role of one store, whatever holds it (:func:`~.open_store` makes one)."""

    #: Where the store is, for messages (a folder path, an ``s3://`` URL, a ``memory://`` name).
    location: str
