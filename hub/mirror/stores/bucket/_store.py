"""A store in an S3-compatible bucket (delegates to :mod:`~cmh.hub.mirror.stores.bucket._bucket`,
:mod:`~cmh.hub.mirror.stores.bucket._read` and :mod:`~cmh.hub.mirror.stores.bucket._scrub`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from errno import EIO
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from cmh.hub.cache import Clock, json_value, new_digest, repo_folder_name

from ..._errors import StoreError, StoreMissing, StoreUnavailable, storage_failed
from ..._history import CommitRecord
from ..._index import CommitIndex, FileEntry
from .._base import HEADER_COPY_MARGIN, MAX_NOTE_BYTES, WEIGHT_FILES
from .._delivery import PROXY, REDIRECT, X_ACCEL, BlobDelivery
from .._sync import UNCHANGED, UPDATED, SyncRequest, SyncResult, default_sync_cache
from ..local._folder import ImportOptions, ImportResult, RepoSummary
from ..local._scrub import ScrubOptions, ScrubReport
from ._bucket import BucketError, BucketStore, _storage_errors, manifest_name, open_bucket
from ._objectstore import ObjectNotFound, ObjectStoreError, ObjectTooLarge, PreconditionFailed
from ._read import DEFAULT_REF_TTL, BucketReader

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .._base import ScrubView
    from ._delivery import BucketDelivery

_WEIGHTS = WEIGHT_FILES  # one definition for every kind (stores._base)


class BucketBackedStore:
    """The mirror store of one ``s3://bucket/prefix``."""

    deliveries: tuple[str, ...] = (PROXY, REDIRECT, X_ACCEL)

    def __init__(
        self, bucket: BucketStore, *, ref_ttl: float | None = None, signer: Any = None
    ) -> None:
        self.bucket = bucket
        self.location = bucket.url
        self.reader = BucketReader(bucket, ref_ttl=DEFAULT_REF_TTL if ref_ttl is None else ref_ttl)
        self.signer = signer or bucket.objects  # signs the URLs clients are sent to
        self._deliveries: dict[str, BucketDelivery] = {}

    @classmethod
    def open(
        cls,
        url: str,
        *,
        ref_ttl: float | None = None,
        public_storage_url: str | None = None,
        clock: Clock | None = None,
    ) -> BucketBackedStore:
        """Open ``s3://bucket/prefix``; redirects signed for ``public_storage_url`` when
        given (signing is local: that address is never contacted by the server); waits and
        memories on ``clock`` (this process's by default)."""
        bucket = open_bucket(url) if clock is None else open_bucket(url, clock=clock)
        signer = None
        if public_storage_url is not None:
            from dataclasses import replace

            from ._objectstore import ObjectStore

            objects = bucket.objects
            settings = replace(objects.settings, endpoint=public_storage_url)
            try:
                signer = ObjectStore(objects.location, settings)
            except ObjectStoreError as exc:
                raise BucketError(str(exc)) from None
        return cls(bucket, ref_ttl=ref_ttl, signer=signer)

    def __repr__(self) -> str:
        return f"BucketBackedStore({self.location!r})"

    @property
    def on_notice(self) -> Callable[[str], None] | None:
        return self.bucket.on_notice

    @on_notice.setter
    def on_notice(self, value: Callable[[str], None] | None) -> None:
        self.bucket.on_notice = value

    @staticmethod
    def _folder(repo_type: str, repo_id: str) -> str:
        return repo_folder_name(repo_id, repo_type)

    def create(self) -> None:
        """Nothing to make: the bucket is the storage's (``check`` says when it is missing)."""

    def check(self) -> None:
        from ._objectstore import NoSuchBucket

        try:
            self.bucket.objects.list_folders("")
        except NoSuchBucket as exc:
            raise StoreMissing(str(exc)) from None
        except ObjectStoreError as exc:
            raise StoreUnavailable(str(exc)) from None

    def pull_through(self, fresh_for: float, *, fill_lease_ttl: float | None = None) -> Any:
        from ._pull import BucketPullThrough

        pull = BucketPullThrough(self.bucket, self.reader, fresh_for, fill_lease_ttl)
        pull.store_backend = self
        return pull

    def delivery(self, mode: str) -> BlobDelivery:
        """The ``proxy``, ``redirect`` or ``x-accel`` delivery of this store (one per
        worker and mode, made on first use)."""
        made = self._deliveries.get(mode)
        if made is None:
            if mode not in self.deliveries:
                raise StoreError(f"a bucket store has no {mode!r} delivery")
            from ._delivery import BucketDelivery

            made = self._deliveries[mode] = BucketDelivery(self.reader, mode, self.signer)
        return made

    def repos(self) -> list[tuple[str, str]]:
        """Folders with a ref or a tree object (a folder holding only blobs, such as an
        import that never moved a ref, is no repo: as a local folder without one)."""
        with _storage_errors():
            return sorted(
                (kind, repo_id)
                for kind, repo_id, folder in self.bucket.repos()
                if self.reader.repo_exists(folder)
            )

    def repo_exists(self, repo_type: str, repo_id: str) -> bool:
        with _storage_errors():
            return self.reader.repo_exists(self._folder(repo_type, repo_id))

    def resolve(
        self, repo_type: str, repo_id: str, revision: str, *, used: bool = False
    ) -> CommitIndex | None:
        with _storage_errors():
            return self.reader.resolve(self._folder(repo_type, repo_id), revision)

    def refs(self, repo_type: str, repo_id: str) -> dict[str, str]:
        with _storage_errors():
            return self.reader.refs(self._folder(repo_type, repo_id))

    def commits(self, repo_type: str, repo_id: str) -> list[str]:
        with _storage_errors():
            return sorted(self.bucket.tree_infos(self._folder(repo_type, repo_id)))

    def history(self, repo_type: str, repo_id: str, head: CommitIndex) -> list[CommitRecord]:
        with _storage_errors():
            return self.reader.history(self._folder(repo_type, repo_id), head)

    def last_commits(
        self, repo_type: str, repo_id: str, head: CommitIndex, paths: list[str]
    ) -> dict[str, CommitRecord]:
        with _storage_errors():
            return self.reader.last_commits(self._folder(repo_type, repo_id), head, paths)

    def opener(self, entry: FileEntry) -> BinaryIO:
        return self.reader.opener(entry)

    def blob_present(self, entry: FileEntry) -> bool:
        try:
            self.reader.blob_info(entry.source.as_posix())
        except ObjectNotFound:
            return False
        except ObjectStoreError as exc:
            raise StoreUnavailable(str(exc)) from None
        return True

    def _download(self, entry: FileEntry, dest: Path) -> None:
        """Copy an entry's blob to ``dest``; ``OSError`` unless its bytes hash to its name."""
        digest = new_digest(entry.etag, entry.size)
        try:
            with open(dest, "wb") as out:
                for chunk in self.bucket.objects.iter_chunks(entry.source.as_posix()):
                    digest.update(chunk)
                    out.write(chunk)
        except ObjectStoreError as exc:
            raise OSError(EIO, storage_failed(exc, "blob unavailable")) from None
        if digest.hexdigest() != entry.etag or dest.stat().st_size != entry.size:
            raise OSError("blob does not match its name")

    @contextlib.contextmanager
    def local_files(
        self, index: CommitIndex, paths: list[str], *, stamped_headers: bool = False
    ) -> Iterator[dict[str, Path]]:
        """Checked copies of ``paths``. With ``stamped_headers``, a model's own weights
        (:data:`_WEIGHTS`) in a commit without code, whose kept manifest shows the stamp
        true, are copied as their header alone (a sparse file of the blob's size) with the
        stamp's check record: a fingerprint reads their header and hashes nothing."""
        from .._copies import checked_copies

        def copy(entry: FileEntry, path: str, dest: Path, vouch: bool) -> bool:
            if vouch and _WEIGHTS.fullmatch(path) and self._header_copy(entry, dest):
                return True
            self._download(entry, dest)
            return False

        with checked_copies(index, paths, stamped_headers, copy) as files:
            yield files

    def _header_copy(self, entry: FileEntry, dest: Path) -> bool:
        """Write the blob's header into ``dest`` (sparse, the blob's size) and its stamp's
        check record, when the manifest kept beside the blob vouches for the stamp
        (``mirror add`` or a fill hashed every tensor to make it); False otherwise."""
        from cmh import CMHError, header_size_from_prefix, parse_header, record_check

        from ..._manifests import vouched_root

        name = entry.source.as_posix()
        folder = entry.source.parent.parent.as_posix()
        try:
            doc = json_value(self.bucket.objects.get(manifest_name(folder, entry.etag)))
            if entry.size < 8:
                return False
            size = header_size_from_prefix(self.bucket.objects.get_range(name, 0, 8))
            if size > entry.size - 8:
                return False
            raw = self.bucket.objects.get_range(name, 0, 8 + size)
            header = parse_header(raw[8:], entry.size)
        except (ObjectStoreError, CMHError, ValueError):  # ObjectNotFound: no manifest
            return False
        # The copy's tensor bytes are zeros: it is used only while its stamp stands for
        # them, so a stamp that expires before the reader is done is copied whole.
        later = self.bucket.clock.time() + HEADER_COPY_MARGIN
        root = vouched_root(doc, entry.etag, header, later)
        if root is None or len(raw) != 8 + size:
            return False
        with open(dest, "wb") as out:
            out.write(raw)
            out.truncate(entry.size)
        if record_check(dest, root):
            return True
        dest.unlink()  # no record: the reader would hash the zeros
        return False

    def manifest(self, repo_type: str, repo_id: str, entry: FileEntry) -> dict[str, Any]:
        from ..._manifests import SCHEMA, compute_streamed

        name = manifest_name(self._folder(repo_type, repo_id), entry.etag)
        try:
            doc = json_value(self.bucket.objects.get(name))
            if (
                isinstance(doc, dict)
                and doc.get("schema") == SCHEMA
                and doc.get("etag") == entry.etag
            ):
                return doc
        except ObjectNotFound:
            pass
        except (ValueError, ObjectTooLarge):
            pass  # an unreadable manifest: computed again
        except ObjectStoreError as exc:
            raise OSError(EIO, storage_failed(exc, "store unavailable")) from None
        try:  # one pass over the storage's stream: no local copy of the blob
            chunks = self.bucket.objects.iter_chunks(entry.source.as_posix())
            doc = compute_streamed(chunks, entry.etag, entry.size)
        except ObjectStoreError as exc:
            raise OSError(EIO, storage_failed(exc, "blob unavailable")) from None
        self._keep_manifest(name, doc)
        return doc

    def _keep_manifest(self, name: str, doc: dict[str, Any]) -> None:
        with contextlib.suppress(PreconditionFailed, ObjectStoreError):  # kept best effort
            self.bucket.objects.put_if_absent(name, json.dumps(doc, separators=(",", ":")).encode())

    def size(self, skip: Callable[[str, str], bool]) -> tuple[int, int]:
        total = repos = 0
        with _storage_errors():
            for repo_type, repo_id, folder in self.bucket.repos():
                if skip(repo_type, repo_id):
                    continue
                repos += 1
                total += sum(b.size for b in self.bucket.blob_infos(folder).values())
        return total, repos

    def add_folder(self, src: Path, repo_id: str, **options: Unpack[ImportOptions]) -> ImportResult:
        result = self.bucket.add_folder(src, repo_id, **options)
        self._keep_manifests(src, result)
        return result

    def _keep_manifests(
        self, src: Path, result: ImportResult, *, links_within: Path | None = None
    ) -> None:
        """The tensor manifest of every safetensors file just imported, as a local import
        keeps them."""
        from ..._manifests import ManifestError, compute
        from ..local._folder import scan_folder

        folder = self._folder(result.repo_type, result.repo_id)
        tree = self.bucket.read_tree(folder, result.commit)
        by_path = {f.path: f for f in tree.files} if tree is not None else {}
        for rel, path in scan_folder(src, links_within=links_within):
            f = by_path.get(rel)
            if f is None or not rel.endswith(".safetensors") or f.lfs_sha256 is None:
                continue
            name = manifest_name(folder, f.etag)
            with contextlib.suppress(ObjectNotFound):
                self.bucket.objects.head(name)
                continue
            with contextlib.suppress(ManifestError, OSError):
                self._keep_manifest(name, compute(path, f.etag))

    def list_store(self) -> list[RepoSummary]:
        with _storage_errors():
            return self.bucket.list_store()

    def scrub_history(self) -> ScrubView:
        """The report kept by the last scrub (``.quarantine/last-scrub.json``) and the
        notes beside the quarantined blobs (within the bounds of
        :func:`~cmh.hub.mirror.stores._base.gather_notes`)."""
        from .._base import LAST_SCRUB, MAX_LAST_SCRUB_BYTES, ScrubView, gather_notes
        from ._bucket import QUARANTINE

        objects = self.bucket.objects

        def read(name: str) -> bytes | None:
            with contextlib.suppress(ObjectNotFound, ObjectTooLarge):
                return objects.get(name, limit=MAX_NOTE_BYTES)
            return None

        last: dict[str, Any] | None = None
        with _storage_errors():
            with contextlib.suppress(ObjectNotFound, ObjectTooLarge, ValueError):
                data = json_value(objects.get(f"{QUARANTINE}/{LAST_SCRUB}",
                                              limit=MAX_LAST_SCRUB_BYTES))  # fmt: skip
                last = data if isinstance(data, dict) else None
            listed = (
                (info.size, partial(read, info.name))
                for info in objects.list(QUARANTINE)
                if info.name.endswith(".json") and info.name != f"{QUARANTINE}/{LAST_SCRUB}"
            )
            notes = gather_notes(listed)
        return ScrubView(last, notes)

    def record_upstream_freshness(
        self, repo_type: str, repo_id: str, commit: str, fresh_until: float
    ) -> None:
        with _storage_errors():
            self.bucket.record_upstream_freshness(
                self._folder(repo_type, repo_id), commit, fresh_until
            )

    def scrub_bytes(self) -> int:
        return 0  # the scrub reports its progress blob by blob without a total

    def scrub(self, **options: Unpack[ScrubOptions]) -> ScrubReport:
        from .._base import LAST_SCRUB
        from ._bucket import QUARANTINE
        from ._scrub import scrub_bucket

        with _storage_errors():  # every blob is streamed and hashed whole (full or not)
            report = scrub_bucket(self.bucket, **options)
            finished = self.bucket.storage_time()  # for the web page, on the storage's clock
            body = {**report.to_dict(), "finished_at": finished}
            self.bucket.objects.put(f"{QUARANTINE}/{LAST_SCRUB}", json.dumps(body).encode())
        return report

    def sync(self, request: SyncRequest) -> SyncResult:
        """Resolve into a cache kept between runs (``cache_dir``, else
        :func:`default_sync_cache`: a sync again asks what changed and fetches only that,
        an interrupted one resumes), then import its snapshot here as the Hub's commit
        (same id, so clients pinned to it are answered): at ``revision``, or under its id
        alone when ``revision`` is a commit id (no branch moves). Nothing is read or
        written when the bucket holds that commit at that revision already."""
        from cmh.hub.cache import COMMIT_RE

        cache = request.cache_dir or default_sync_cache(self.location)
        res = request.fetch(cache)
        target = res.commit if COMMIT_RE.match(request.revision) else request.revision
        folder = self.bucket.folder(request.repo_id, request.repo_type)
        if self._holds(folder, target, res):
            return SyncResult(res, UNCHANGED, cache)
        snapshot = Path(res.path)  # read through its links: no copy of the files
        repo_root = snapshot.parent.parent  # {cache}/{models--org--name}: blobs/ and snapshots/
        result = self.bucket.add_folder(snapshot, request.repo_id, revision=target,
                                        repo_type=request.repo_type, commit=res.commit,
                                        links_within=repo_root)  # fmt: skip
        self._keep_manifests(snapshot, result, links_within=repo_root)
        return SyncResult(res, UPDATED, cache, result.new_blobs, result.new_bytes)

    def _holds(self, folder: str, target: str, res: Any) -> bool:
        """True when the bucket has the tree object of ``res.commit`` with the resolved
        files, each of its blobs stored at its size, and ``target`` (a ref, or that commit
        id itself) names it."""
        with _storage_errors():
            tree = self.bucket.read_tree(folder, res.commit)
            if tree is None:
                return False
            if {f.path: (f.etag, f.size) for f in tree.files} != {
                f.path: (f.etag, f.size) for f in res.files
            }:
                return False  # another selection, or other files: the import decides
            blobs = self.bucket.blob_infos(folder)
            if any(f.etag not in blobs or blobs[f.etag].size != f.size for f in tree.files):
                return False  # a blob scrub quarantined or prune removed: import it again
            if target == res.commit:
                return True
            ref = self.bucket.read_ref(folder, target)
            return ref is not None and ref.commit == res.commit
