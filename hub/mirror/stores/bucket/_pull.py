"""Pull-through into a bucket: one upstream transfer per blob for the whole fleet.

Normative text: ``spec/hub-mirror.md`` 8.6. In short, under ``{repo}/``:

```
trees/{commit}.json                  the upstream commit's listing, as a cmh-tree/1 object
refs/{revision}                      moved after each validation
.cmh/upstream/validated/{revision}   {"commit", "at"}: the fleet's last validation (+ a claim)
                                     (times on the storage's clock, BucketStore.storage_time)
.cmh/upstream/access.json            present while the upstream says private or gated
.cmh/upstream/{commit}.json          {"fresh_until"}: for cmh prune --expired
.cmh/fills/{etag}/lease              the filling replica's lease (conditional writes)
.cmh/fills/{etag}/part-{n:06d}       bytes [n * PART, (n + 1) * PART) as they arrived
.cmh/fills/{etag}/hashed             {"size", "etags"}: the whole hash matched, blob not made yet
.cmh/fills/{etag}/failed             {"at", "error"}: a fill failed (aged by its Last-Modified)
                                     (cmh prune removes a fill's state once nobody holds it)
.cmh/cuts/{etag}                     a filling body of the blob was cut (its Last-Modified)
blobs/{etag}                         written only once the whole SHA-256 matched
```

The replica holding the lease streams the blob from the upstream and stores it
part by part (each part one PUT, so a part is whole or absent; :data:`PUTS_AT_ONCE`
at once, told stored in order); every replica's clients read the parts as they
appear (this replica's readers are woken as each part is stored and take its bytes
from memory, :class:`_StoredParts`; another replica's look every :data:`READ_POLL`
and read :data:`READ_AHEAD` parts ahead; the whole bodies of one worker are hashed
once, :class:`~cmh.hub.mirror.stores._body_hash.SharedHash`). Once the digest of
the whole blob matched, the parts become ``blobs/{etag}`` by the storage's own copy
(:meth:`ObjectStore.compose`: a multipart upload of part copies, each pinned to the
ETag of the part that was hashed), so the bytes are uploaded once; a blob that fails
its check is never made, so no wrong blob is ever visible under its name. The copies
start only then, not during the transfer, where on a storage sharing the fill's cores
they took CPU from the fill and its clients (issue 37; with ``https`` storage, where the
parts cannot be spliced, each is still copied as soon as it is stored:
:func:`copies_wait`). Until the blob is made, a
request for it is sent the hashed parts (the ``hashed`` record, every replica; each
part's GET pinned to its ETag and spliced to the client like a blob's, not read through
Python: :func:`hashed_parts`). Then the check record is written and, once no body of
this process is sent from them (:data:`PARTS_READ_WAIT` at most; a body whose part goes
continues from the blob), the ``hashed`` record, the parts and the lease are deleted. A
lease not renewed for
its lifetime (on the storage's clock) is taken over; the new holder re-reads the
stored parts (rebuilding the digest) and asks the upstream for the rest with
``Range``.

Every age of a record here is measured on the storage's clock: an object's
``Last-Modified``, or a time written from :meth:`BucketStore.storage_time`, against
``storage_time()``; a record in the storage's future counts as recent. No replica's wall
clock is ever compared with another's. Waits and per-process memories are on the store's
:class:`~cmh.hub.cache.Clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache
from cmh.hub.cache import (
    COMMIT_RE,
    CUT_MEMORY,
    FILL_LEASE_TTL,
    SYSTEM_CLOCK,
    Clock,
    json_value,
    new_digest,
)

from ..._errors import printable
from ..._gitobjects import lfs_pointer_oid, tree_oids
from ..._upstream import NEGATIVE_FOR
from .._body_hash import SharedHash, new_serial, shared_hash
from .._pull import FillFailed, FillWait, SentRanges
from ._bucket import BucketError, BucketStore, TreeFile, TreeObject, _storage_errors
from ._objectstore import (
    Composition,
    ObjectNotFound,
    ObjectStoreError,
    ObjectTooLarge,
    PreconditionFailed,
)

if TYPE_CHECKING:
    from cmh.hub.resolver import RemoteFile

    from ..._index import FileEntry
    from ._objectstore import ObjectStore
    from ._read import BucketReader

#: Bytes of each part object of a fill (the last may be shorter).
PART = 8 << 20
#: Parts one fill uploads at once (each PUT on its own thread).
PUTS_AT_ONCE = 3
#: Parts one fill copies into its blob's upload at once, once its hash matched (each on
#: its own thread; the storage does the copy).
COPIES_AT_ONCE = 3
#: Seconds a fill whose blob is made waits for this process's bodies still sent from its
#: parts before it deletes them (a body whose part is gone goes on from the blob).
PARTS_READ_WAIT = 30.0
#: Parts a fill may hold in memory besides those being uploaded (waiting for an upload,
#: or stored after one still being uploaded): a fill holds at most
#: ``PUTS_AT_ONCE + PARTS_AHEAD`` parts, and the one it is receiving.
PARTS_AHEAD = 2
#: Segments (:data:`PART` bytes each) one worker keeps for its readers of fills: the
#: clients of one blob read each segment from the storage once per worker, not once each.
KEPT_SEGMENTS = 6
#: Segments a reader reading from the storage GETs ahead of the one it sends (shared by
#: the worker's readers, kept among its :data:`KEPT_SEGMENTS`).
READ_AHEAD = 2
#: Seconds between a waiting replica's looks at a fill another replica runs.
FILL_POLL = 0.25
#: Seconds between a filling answer's looks for the next part.
READ_POLL = 0.05
#: Seconds without a part stored by this process's fill after which its readers look at
#: the storage too (its lease may have been taken over and the fill ended elsewhere).
LOCAL_STALL = 1.0
#: Seconds a ``failed`` record's ``at`` may differ from the object's ``Last-Modified``
#: (both the storage's clock; a record written at another time is not one cmh wrote).
FAILED_SKEW = 60.0
#: Seconds a revalidation claim is honoured by the other replicas (then ignored).
CLAIM_TTL = 30.0
#: Seconds a replica waits for the outcome of another replica's revalidation.
CLAIM_WAIT = 5.0
#: Entries of each per-revision, per-repo or per-blob memory of one worker (docs/mirror.md).
MAX_KEPT = 4096
MAX_ATTEMPTS = 5  # upstream transfers of one fill (each resumes where the last stopped)


def fill_lease_ttl(given: float | None = None) -> float:
    """The fill lease's lifetime: ``given`` (``cmh serve --fill-lease-ttl``), else
    ``CMH_FILL_LEASE_TTL`` seconds (tests), else :data:`FILL_LEASE_TTL` (30 s)."""
    if given is not None:
        if not given > 0:
            raise ValueError("the fill lease's lifetime must be above 0 seconds")
        return float(given)
    try:
        value = float(os.environ.get("CMH_FILL_LEASE_TTL", FILL_LEASE_TTL))
    except ValueError:
        return FILL_LEASE_TTL
    return value if value > 0 else FILL_LEASE_TTL


def _owner() -> str:
    return f"cmh serve {socket.gethostname()}:{os.getpid()}"


class _LeaseLost(Exception):
    """Another replica took this fill's lease over (it judged it expired): this replica
    stops filling and waits for that fill like any other replica, its clients with it."""


class BucketPullThrough:
    """The pull-through state and fills of one bucket store (one per worker)."""

    def __init__(
        self,
        store: BucketStore,
        reader: BucketReader,
        fresh_for: float,
        lease_ttl: float | None = None,
    ) -> None:
        self.store = store
        self.objects = store.objects
        self.cache = reader
        self.fresh_for = fresh_for
        self.lease_ttl = fill_lease_ttl(lease_ttl)
        self.owner = _owner()
        self._lock = threading.Lock()
        # Keyed by what clients name: bounded, least recently used first out (under _lock).
        self._expiries: LRUCache[tuple[str, str, str], tuple[float, float]] = LRUCache(MAX_KEPT)
        self._stamps: LRUCache[str, int | None] = LRUCache(MAX_KEPT)  # etag -> expires_at
        self._access: LRUCache[str, tuple[float, bool, bool]] = LRUCache(MAX_KEPT)
        self._cuts: LRUCache[str, tuple[float, float | None]] = LRUCache(MAX_KEPT)

    @staticmethod
    def _folder(repo_type: str, repo_id: str) -> str:
        return BucketStore.folder(repo_id, repo_type)

    @staticmethod
    def _validation_name(folder: str, revision: str) -> str:
        return f"{folder}/.cmh/upstream/validated/{revision}"

    def check(self) -> None:
        """Fills and validations take leases and create-only writes: probe the storage
        (:class:`~cmh.hub.mirror.ConditionalWritesUnsupported`; a failing one:
        :class:`~cmh.hub.mirror.StoreUnavailable`)."""
        from ..._errors import StoreUnavailable

        try:
            self.store.ensure_conditional_writes()
        except ObjectStoreError as exc:
            raise StoreUnavailable(str(exc)) from None

    # -- revisions -----------------------------------------------------------------------

    def held(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        folder = self._folder(repo_type, repo_id)
        try:
            index = self.cache.resolve(folder, revision)
        except (ObjectStoreError, BucketError):  # an unusable tree: asked again, replaced
            return None
        if index is None or (COMMIT_RE.match(revision) and index.commit != revision):
            return None
        return index.commit

    def listing(self, repo_type: str, repo_id: str, commit: str) -> dict[str, RemoteFile] | None:
        with _storage_errors():
            from cmh.hub.resolver import RemoteFile

            try:
                tree = self.cache.tree(self._folder(repo_type, repo_id), commit)
            except BucketError:  # unusable: the upstream's listing replaces it (install)
                return None
            if tree is None:
                return None
            return {
                f.path: RemoteFile(f.path, f.size, f.etag, f.lfs_sha256 is not None, f.oid)
                for f in tree.files
            }

    def _validation(self, folder: str, revision: str) -> tuple[dict[str, Any], str] | None:
        name = self._validation_name(folder, revision)
        try:
            data, info = self.store.read_small(name)
        except ObjectNotFound:
            return None
        body = self.store.unseal(name, data, info)
        if body is None:  # not the fleet's: no validation, but claimed over by its ETag
            return {}, info.etag
        try:
            doc = json_value(body)
        except ValueError:
            return {}, ""
        return (doc if isinstance(doc, dict) else {}), info.etag

    def expiry(self, repo_type: str, repo_id: str, revision: str, commit: str) -> float:
        """Read from the bucket at most once every ``ref_ttl`` seconds per revision (the
        fleet's validation record), so every replica sees another's validation."""
        with _storage_errors():
            key = (repo_type, repo_id, revision)
            now = self.store.clock.monotonic()
            with self._lock:
                hit = self._expiries.get(key)
            if hit is not None and now - hit[0] < self.cache.ref_ttl:
                return hit[1]
            value = self._expiry(repo_type, repo_id, revision, commit)
            with self._lock:
                self._expiries[key] = (now, value)
            return value

    def _forget(self, repo_type: str, repo_id: str, revision: str) -> None:
        with self._lock:
            self._expiries.pop((repo_type, repo_id, revision), None)

    def _expiry(self, repo_type: str, repo_id: str, revision: str, commit: str) -> float:
        """When the held commit goes stale, on this process's clock (``clock.time()``): the
        validation record's ``at`` is on the storage's clock, so what is left of its
        freshness there is added to this clock's now; stamped expiries are unix times."""
        folder = self._folder(repo_type, repo_id)
        at: float | None = None
        found = None if COMMIT_RE.match(revision) else self._validation(folder, revision)
        if found is not None and found[0].get("commit") == commit:
            with contextlib.suppress(TypeError, ValueError):
                at = float(found[0]["at"])
        unstamped = float("-inf")
        if at is not None:
            left = at + max(0.0, self.fresh_for) - self.store.storage_time()
            unstamped = self.store.clock.time() + left
        index = self.cache.index(folder, commit)
        if index is None:
            return float("-inf")
        weights = [e for p, e in index.files.items() if p.endswith(".safetensors")]
        if not weights:
            return unstamped
        expiry = float("inf")
        for entry in weights:
            stamped = self._stamp(entry)
            if stamped is None:
                expiry = min(expiry, unstamped)
            elif stamped != 0:
                expiry = min(expiry, float(stamped))
        return expiry

    def _stamp(self, entry: FileEntry) -> int | None:
        """``expires_at`` of a stored stamped safetensors blob (0: never), None when unstamped
        or not stored yet (its header read with ranged GETs, once per blob)."""
        with self._lock:
            if entry.etag in self._stamps:
                return self._stamps[entry.etag]
        from cmh import read_carrier, read_header_from

        try:
            self.cache.blob_info(entry.source.as_posix())
        except ObjectNotFound:
            return None  # not filled yet: unstamped until it is
        value: int | None = None
        try:
            with self.cache.opener(entry) as f:
                header = read_header_from(f, entry.size)
            carrier = read_carrier(header.metadata, len(header.tensors))
            value = None if carrier is None else carrier.record.expires_at
        except Exception:  # an unreadable header is an unstamped file, as on a folder
            value = None
        with self._lock:
            self._stamps[entry.etag] = value
        return value

    def claim(self, repo_type: str, repo_id: str, revision: str) -> bool:
        """Claim the revalidation in the validation record (``If-Match``). False when
        another replica's validation serves this one: one that landed since this replica
        judged the revision stale, or the winner's, written while this replica waited up
        to :data:`CLAIM_WAIT` for it. The record decides, not how much time passed here
        meanwhile (a busy replica may look late: the fleet still asks once)."""
        with _storage_errors():
            folder = self._folder(repo_type, repo_id)
            name = self._validation_name(folder, revision)
            found = self._validation(folder, revision)
            if found is None or not found[1]:
                return True
            doc, etag = found
            since = doc.get("checking_since")
            if since is None and self._fresh_record(repo_type, repo_id, revision, doc):
                return False  # validated by another replica since this one last read it
            if not (  # a claim in the storage's future is recent
                isinstance(since, (int, float)) and self.store.storage_age(since) < CLAIM_TTL
            ):
                claimed = {**doc, "checking_since": self.store.storage_time(), "by": self.owner}
                try:
                    sealed = self.store.seal(name, json.dumps(claimed).encode())
                    self.objects.put_if_match(name, sealed, etag)
                    return True
                except PreconditionFailed:
                    pass  # another replica claimed it first
            clock = self.store.clock
            deadline = clock.monotonic() + CLAIM_WAIT
            again: tuple[dict[str, Any], str] | None = found
            while clock.monotonic() < deadline:
                clock.sleep(FILL_POLL)
                again = self._validation(folder, revision)
                if again is None or "checking_since" not in again[0]:
                    break
            landed = (
                again is not None
                and "checking_since" not in again[0]
                and isinstance(again[0].get("commit"), str)
                and again[0].get("at") != doc.get("at")
            )
            if landed:
                self._forget(repo_type, repo_id, revision)
                self.cache.forget_ref(folder, revision)
            return not landed  # no new validation (the winner died or is slow): ask

    def _fresh_record(
        self, repo_type: str, repo_id: str, revision: str, doc: dict[str, Any]
    ) -> bool:
        """True when the unclaimed validation record ``doc`` (just read) keeps its commit
        fresh now: another replica validated it after this one's last look."""
        commit = doc.get("commit")
        if not isinstance(commit, str):
            return False
        self._forget(repo_type, repo_id, revision)
        self.cache.forget_ref(self._folder(repo_type, repo_id), revision)
        return self.store.clock.time() < self._expiry(repo_type, repo_id, revision, commit)

    def install(
        self, upstream: Any, repo_type: str, repo_id: str, commit: str, files: dict[str, RemoteFile]
    ) -> None:
        """Write the commit's tree object (``If-None-Match: *``; a commit never changes).
        A blob already stored under its name was checked when it was written. Written at
        every revalidation, also when this replica has the tree in memory: a prune may
        have removed it from the bucket (a 412 says it is there)."""
        with _storage_errors():
            folder = self._folder(repo_type, repo_id)
            self.store.ensure_conditional_writes()
            entries = []
            for path, remote in sorted(files.items()):
                if remote.lfs:
                    oid = lfs_pointer_oid(remote.etag, remote.size)
                    entries.append(TreeFile(path, remote.size, remote.etag, oid, remote.etag))
                else:
                    entries.append(TreeFile(path, remote.size, remote.etag, remote.etag, None))
            tree = tree_oids({f.path: f.oid for f in entries})[""]
            obj = TreeObject(commit, tree, (), self.store.storage_time(), tuple(entries))
            name = self.store.tree_name(folder, commit)
            try:
                self.objects.put_if_absent(name, obj.to_bytes())
            except PreconditionFailed:
                self._replace_unusable_tree(folder, commit, name, obj)

    def _replace_unusable_tree(self, folder: str, commit: str, name: str, obj: TreeObject) -> None:
        """The tree object already there is the commit's (a commit never changes), unless
        it cannot be used (not a valid tree object: written wrong, or by a co-tenant), which
        would stay for good (written once): then the upstream's listing replaces it, over
        that version only. Read through this replica's memory (no request when held)."""
        try:
            self.cache.tree(folder, commit)
            return
        except BucketError:
            pass
        with contextlib.suppress(PreconditionFailed, ObjectNotFound):  # replaced or gone
            self.objects.put_if_match(name, obj.to_bytes(), self.objects.head(name).etag)

    def validated(
        self, repo_type: str, repo_id: str, revision: str, commit: str, *, pinned: bool
    ) -> None:
        with _storage_errors():
            folder = self._folder(repo_type, repo_id)
            if not pinned:
                ref = self.store.ref_name(folder, revision)
                current = self.store.read_ref(folder, revision)
                if current is None or current.commit != commit:
                    self.objects.put(ref, f"{commit}\n".encode())
                record = {"commit": commit, "at": self.store.storage_time()}
                self.store.put_record(
                    self._validation_name(folder, revision), json.dumps(record).encode()
                )
                self.cache.forget_ref(folder, revision)
                self._forget(repo_type, repo_id, revision)
                until = self._expiry(repo_type, repo_id, revision, commit)
                if until not in (float("inf"), float("-inf")):  # onto the storage's clock
                    until += self.store.storage_time() - self.store.clock.time()
            else:
                until = self.store.storage_time() + self.fresh_for
            if until == float("inf"):
                return
            with contextlib.suppress(ObjectStoreError):  # for prune only: best effort
                self.store.record_upstream_freshness(folder, commit, until)

    def record_access(self, repo_type: str, repo_id: str, private: bool, gated: bool) -> None:
        with _storage_errors():
            folder = self._folder(repo_type, repo_id)
            name = f"{folder}/.cmh/upstream/access.json"
            if private or gated:
                doc = {"private": private, "gated": gated, "at": self.store.storage_time()}
                self.store.put_record(name, json.dumps(doc).encode())
            else:
                with contextlib.suppress(ObjectNotFound):
                    self.objects.head(name)
                    self.objects.delete(name)
            with self._lock:
                seen = self.store.clock.monotonic()
                self._access[folder] = (seen, private or gated, gated and not private)

    def restricted(self, repo_type: str, repo_id: str) -> bool:
        """Read at most once every ``ref_ttl`` seconds; a storage that fails: restricted
        (deny by default)."""
        return self._access_of(repo_type, repo_id)[0]

    def gated(self, repo_type: str, repo_id: str) -> bool:
        return self._access_of(repo_type, repo_id)[1]

    def _access_of(self, repo_type: str, repo_id: str) -> tuple[bool, bool]:
        """(restricted, gated and not private) as the access record says, read at most
        once every ``ref_ttl`` seconds; a storage that fails: restricted, not gated."""
        try:
            folder = self._folder(repo_type, repo_id)
        except ValueError:
            return False, False
        now = self.store.clock.monotonic()
        with self._lock:
            hit = self._access.get(folder)
        if hit is not None and now - hit[0] < self.cache.ref_ttl:
            return hit[1], hit[2]
        name = f"{folder}/.cmh/upstream/access.json"
        value = (False, False)
        try:
            data, info = self.store.read_small(name)
        except ObjectNotFound:
            data = None
        except ObjectStoreError:
            return True, False
        if data is not None:
            # Unreadable, or not the fleet's (a fleet key and no valid signature):
            # restricted, and none of its words used (deny by default).
            body = self.store.unseal(name, data, info)
            try:
                record = None if body is None else json_value(body)
            except ValueError:
                record = None
            gated = isinstance(record, dict) and bool(record.get("gated"))
            value = (True, gated and not (isinstance(record, dict) and record.get("private")))
        with self._lock:
            self._access[folder] = (now, *value)
        return value

    def record_cut(self, repo_type: str, repo_id: str, etag: str) -> None:
        """``{repo}/.cmh/cuts/{etag}``: a cut now (best effort). Its age is its
        ``Last-Modified`` on the storage's clock; the body says the same time for people."""
        folder = self._folder(repo_type, repo_id)
        at: float | None = float("inf")  # the write failed: cut, until read again
        with contextlib.suppress(ObjectStoreError):
            at = self.store.storage_time()
            self.store.put_record(self.store.cut_name(folder, etag), f"{at:.3f}\n".encode())
        with self._lock:
            self._cuts[f"{folder}/{etag}"] = (self.store.clock.monotonic(), at)

    def recently_cut(self, repo_type: str, repo_id: str, etag: str) -> bool:
        """True when the blob's cut record is younger than :data:`CUT_MEMORY` on the
        storage's clock (or in its future: two replicas' clocks are never compared). Read
        at most once every ``ref_ttl`` seconds per blob; a storage that fails: cut (a
        whole body is always safe)."""
        folder = self._folder(repo_type, repo_id)
        key = f"{folder}/{etag}"
        now = self.store.clock.monotonic()
        with self._lock:
            hit = self._cuts.get(key)
        try:
            if hit is None or now - hit[0] >= self.cache.ref_ttl:
                try:
                    at: float | None = self._written_at(self.store.cut_name(folder, etag))
                except ObjectNotFound:
                    at = None
                with self._lock:
                    self._cuts[key] = hit = (now, at)
            return hit[1] is not None and self.store.storage_age(hit[1]) < CUT_MEMORY
        except ObjectStoreError:
            return True

    def _written_at(self, name: str) -> float:
        """When the record ``name`` was last written, on the storage's clock
        (:class:`ObjectNotFound` when absent or not the fleet's)."""
        found = self.store.get_record(name)
        if found is None:
            raise ObjectNotFound(f"{name}: no trusted record", name)
        return found[1].last_modified.timestamp()

    # -- fills ---------------------------------------------------------------------------

    def _entry(self, folder: str, commit: str, path: str) -> TreeFile:
        from ..._upstream import UpstreamError

        tree = self.cache.tree(folder, commit)
        found = None if tree is None else next((f for f in tree.files if f.path == path), None)
        if found is None:
            raise UpstreamError(404, "EntryNotFound", "Entry not found (no listing kept)")
        return found

    def _present(self, name: str) -> bool:
        try:
            self.objects.head(name)
            return True
        except ObjectNotFound:
            return False

    def fill(
        self,
        upstream: Any,
        repo_type: str,
        repo_id: str,
        commit: str,
        path: str,
        done_by: float | None = None,
    ) -> None:
        """Fill the blob under the fleet's lease, or wait while another replica holds it
        (taking it over once it expired); raise what a failed fill of it recorded."""
        from ..._upstream import UpstreamError, unavailable

        folder = self._folder(repo_type, repo_id)
        try:
            f = self._entry(folder, commit, path)
            blob = self.store.blob_name(folder, f.etag)
            fills = self.store.fill_name(folder, f.etag)
            while not self._present(blob):
                # A fill this request waited for failed: its outcome is shared, not retried.
                failure = self._failure(fills)
                if failure is not None:
                    raise UpstreamError(502, "UpstreamProtocolError", failure)
                lease = f"{fills}/lease"
                if self.store.take_lease(folder, self.owner, name=lease, ttl=self.lease_ttl):
                    try:
                        if not self._present(blob):  # filled between the look and the lease
                            _Fill(self, upstream, folder, commit, f, done_by).run()
                    except _LeaseLost:
                        continue  # the fill goes on elsewhere: wait for it (or take it back)
                    finally:
                        with contextlib.suppress(ObjectStoreError):
                            self.store.release_lease(folder, name=lease)
                    break
                self.store.clock.sleep(FILL_POLL)
        except (ObjectStoreError, BucketError) as exc:
            raise unavailable(f"store unavailable during the fill: {exc}") from None
        if path.endswith(".safetensors") and f.lfs_sha256 is not None:
            self._keep_manifest(repo_type, repo_id, folder, commit, path)

    def _failure(self, fills: str) -> str | None:
        """The error of a fill of the blob that failed less than :data:`NEGATIVE_FOR`
        seconds ago on the storage's clock (or in its future), at any replica: the fleet's
        negative cache. An older failure is tried again.

        The record is read strictly (anyone who can write to the bucket can write one):
        exactly ``at`` (the storage's time it was written, within :data:`FAILED_SKEW` of
        the object's own ``Last-Modified``) and ``error`` (at most 500 printable
        characters); anything else is not a record cmh writes and is ignored (the fill is
        tried again), so a forged record cannot put words in an answer, and it ages out
        like any other."""
        found = self.store.get_record(f"{fills}/failed")  # None: absent or not the fleet's
        if found is None:
            return None
        data, info = found
        if self.store.storage_age(info.last_modified.timestamp()) >= NEGATIVE_FOR:
            return None
        try:
            doc = json_value(data)
        except ValueError:
            return None
        if not isinstance(doc, dict) or set(doc) != {"at", "error"}:
            return None
        at, error = doc["at"], doc["error"]
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            return None
        if abs(at - info.last_modified.timestamp()) > FAILED_SKEW:
            return None  # not written when it says: not a record cmh wrote
        if not isinstance(error, str) or len(error) > 500 or not error.isprintable():
            return None
        return f"the upstream's blob failed its check at another replica: {error}"

    def _keep_manifest(
        self, repo_type: str, repo_id: str, folder: str, commit: str, path: str
    ) -> None:
        """The tensor manifest of a filled safetensors blob, computed in the background
        (the fill's waiters do not wait for it; a request for it computes it if absent)."""
        from ._bucket import manifest_name

        index = self.cache.index(folder, commit)
        entry = None if index is None else index.files.get(path)
        if entry is None or self._present(manifest_name(folder, entry.etag)):
            return
        backend = self.store_backend

        def work() -> None:
            with contextlib.suppress(Exception):  # best effort: computed again on request
                backend.manifest(repo_type, repo_id, entry)

        threading.Thread(target=work, name="cmh-manifest", daemon=True).start()

    store_backend: Any = None  # the BucketBackedStore (set by it), for manifests

    def reader_for(self, entry: FileEntry, fill: asyncio.Future[None]) -> PartTail:
        folder, _, etag = entry.source.as_posix().rpartition("/blobs/")
        return PartTail(self.objects, entry.source.as_posix(),
                        BucketStore.fill_name(folder, etag), entry.size, fill,
                        self.store.clock)  # fmt: skip

    def reader(
        self, repo_type: str, repo_id: str, entry: FileEntry, fill: asyncio.Future[None]
    ) -> PartTail:
        return self.reader_for(entry, fill)


class _PartSignals:
    """Wakes this process's readers of a fill the moment its thread stores a part (the
    readers of another replica's fill look every :data:`READ_POLL`: the storage tells
    nobody)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def subscribe(self, fills: str) -> asyncio.Event:
        event = asyncio.Event()
        with self._lock:
            self._waiting.setdefault(fills, set()).add((asyncio.get_running_loop(), event))
        return event

    def unsubscribe(self, fills: str, event: asyncio.Event) -> None:
        with self._lock:
            waiting = self._waiting.get(fills, set())
            waiting = {w for w in waiting if w[1] is not event}
            if waiting:
                self._waiting[fills] = waiting
            else:
                self._waiting.pop(fills, None)

    def notify(self, fills: str) -> None:
        with self._lock:
            waiting = list(self._waiting.get(fills, ()))
        for loop, event in waiting:
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(event.set)


_PART_SIGNALS = _PartSignals()


class _StoredParts:
    """What this process's fills stored: how many parts each running fill has stored, and
    the latest parts' bytes as PUT (by part object name).

    A reader here takes a part from memory instead of GETting it back from the storage,
    and waits for a part this process's fill has not stored yet without asking the
    storage at all (woken by :func:`part_stored`), so the filling replica sends one GET
    of a part only for a reader so far behind that the part left memory. The bytes are
    kept only while the fill that stored them runs here (dropped when it ends, whatever
    its outcome, and when another run of the same fill starts), so no part of a fill
    that failed or was taken over is read for another one. Every body's digest checks
    these bytes like those of any part (hashed once per worker, :class:`SharedHash`). Each
    part kept has its own serial (:func:`new_serial`): the identity of those bytes."""

    def __init__(self, kept: int) -> None:
        self._lock = threading.Lock()
        self._parts: LRUCache[str, tuple[bytes, int]] = LRUCache(kept)
        #: fills run here -> (parts stored so far, the store clock's monotonic time then)
        self._filling: dict[str, tuple[int, float]] = {}

    def start(self, fills: str, stored: int, at: float) -> None:
        """This process fills ``fills``; parts ``[0, stored)`` are in the storage."""
        with self._lock:
            self._drop(fills)
            self._filling[fills] = (stored, at)

    def keep(self, fills: str, n: int, data: bytes, at: float) -> None:
        """Part ``n`` of the fill ``fills`` run here is stored (kept while that fill runs)."""
        with self._lock:
            if fills in self._filling:
                self._parts[f"{fills}/part-{n:06d}"] = (data, new_serial())
                self._filling[fills] = (max(self._filling[fills][0], n + 1), at)

    def end(self, fills: str) -> None:
        """This process's fill of ``fills`` ended: its parts are forgotten, its readers
        woken to look at the storage."""
        with self._lock:
            self._filling.pop(fills, None)
            self._drop(fills)
        part_stored(fills)

    def look(self, fills: str, n: int, now: float) -> tuple[bytes, int] | bool:
        """Part ``n``'s bytes and their serial when kept here; True when this process's
        fill has not stored it yet and stored a part less than :data:`LOCAL_STALL` s before
        ``now`` (wait for :func:`part_stored`); False: ask the storage."""
        with self._lock:
            found = self._parts.get(f"{fills}/part-{n:06d}")
            if found is not None:
                return found
            stored, at = self._filling.get(fills, (n + 1, now))
            return n >= stored and now - at < LOCAL_STALL

    def _drop(self, fills: str) -> None:
        for name in [n for n in self._parts if n.startswith(f"{fills}/part-")]:
            del self._parts[name]


_STORED_PARTS = _StoredParts(KEPT_SEGMENTS)


class _HashedParts:
    """The fills of this process whose hash matched and whose blob is not made yet: their
    parts (name, storage ETag) as hashed, and how many bodies are sent from them here.

    Between the last byte and the blob (the storage's copies take a while), a request
    for the blob is answered from these parts by the proxy's data plane (each part's GET
    spliced to the client, pinned to the ETag hashed, :func:`hashed_parts`), not through
    Python; the fill deletes the parts only once no body here is sent from them (at most
    :data:`PARTS_READ_WAIT`; a body whose part is gone goes on from the blob, made by
    then)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._parts: dict[str, list[tuple[str, str]]] = {}
        self._reading: dict[str, int] = {}

    def publish(self, fills: str, parts: list[tuple[str, str]]) -> None:
        with self._lock:
            self._parts[fills] = list(parts)

    def get(self, fills: str) -> list[tuple[str, str]] | None:
        with self._lock:
            return self._parts.get(fills)

    def withdraw(self, fills: str) -> None:
        """No new body is sent from the fill's parts (its blob is made, or it failed)."""
        with self._lock:
            self._parts.pop(fills, None)

    @contextlib.contextmanager
    def reading(self, fills: str) -> Any:
        """Held while a body is sent from the fill's parts."""
        with self._lock:
            self._reading[fills] = self._reading.get(fills, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._reading.pop(fills) - 1
                if left:
                    self._reading[fills] = left
                self._lock.notify_all()

    def wait_read(self, fills: str, timeout: float, clock: Clock) -> None:
        """Wait until no body here is sent from the fill's parts (at most ``timeout``)."""
        deadline = clock.monotonic() + timeout
        with self._lock:
            while self._reading.get(fills) and (left := deadline - clock.monotonic()) > 0:
                self._lock.wait(min(left, 1.0))


_HASHED_PARTS = _HashedParts()


def _valid_etag(etag: object) -> bool:
    """A storage ETag as a record may hold one (it goes into an ``If-Match`` header)."""
    return (
        isinstance(etag, str) and 0 < len(etag) <= 200 and etag.isprintable()
        and not any(c.isspace() for c in etag)
    )  # fmt: skip


def hashed_parts(store: BucketStore, blob: str, size: int) -> list[tuple[str, str]] | None:
    """The parts (name, storage ETag) of the blob ``blob`` (``{repo}/blobs/{etag}``) whose
    whole hash a fill matched, while the storage makes the blob of them (spec 8.6): this
    process's fill's, else the ``hashed`` record another replica's fill wrote. ``None``
    when there are none (no such fill, a record not the fleet's or not of ``size`` bytes).
    Each part is read pinned to its ETag, so its bytes are those hashed."""
    folder, _, etag = blob.rpartition("/blobs/")
    fills = BucketStore.fill_name(folder, etag)
    here = _HASHED_PARTS.get(fills)
    if here is not None:
        return here
    if size <= 0:
        return None
    found = store.get_record(f"{fills}/hashed")
    if found is None:
        return None
    try:
        doc = json_value(found[0])
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("size") != size:
        return None
    etags = doc.get("etags")
    if not isinstance(etags, list) or len(etags) != (size + PART - 1) // PART:
        return None
    if not all(_valid_etag(e) for e in etags):
        return None
    return [(f"{fills}/part-{n:06d}", e) for n, e in enumerate(etags)]


def copies_wait(objects: Any) -> bool:
    """Whether a fill's copies into its blob wait for its last byte (issue 37): made as
    each part is stored, they cost a storage on the fill's cores a third of its CPU during
    the transfer (SeaweedFS: about 5 CPU-s per GiB), taken from the fill and its clients.
    Only where the hashed parts can be sent meanwhile the way a blob is, spliced from the
    storage's plain-HTTP answers (:mod:`._splice`); with ``https`` storage each part is
    copied as soon as it is stored, as before: a request in the window would read the
    parts through Python and hash them (measured: twice the CPU per GiB warm)."""
    from ._splice import available

    endpoint = getattr(getattr(objects, "settings", None), "endpoint", None)
    return available() and isinstance(endpoint, str) and endpoint.startswith("http://")


def reading_parts(blob: str) -> Any:
    """A context held while a body of ``blob`` is sent from its fill's hashed parts."""
    folder, _, etag = blob.rpartition("/blobs/")
    return _HASHED_PARTS.reading(BucketStore.fill_name(folder, etag))


def part_stored(fills: str) -> None:
    """A part of the fill ``fills`` is stored: wake this process's readers of it."""
    _PART_SIGNALS.notify(fills)


class _PartWriter:
    """PUTs a fill's parts on :data:`PUTS_AT_ONCE` threads, so that the upstream's bytes
    keep arriving while parts are uploaded and one slow PUT does not hold the next (issue
    37: one PUT at a time paced the whole fleet's cold fill at the storage's latency per
    part). A part is told stored (to ``stored``, to this process's readers) only once
    every part before it is, so the parts told are always ``0..n``. At most
    ``PUTS_AT_ONCE + PARTS_AHEAD`` parts handed over and not told are held: waiting,
    being PUT, or stored after a part still being PUT (:meth:`put` waits for room)."""

    _END = object()

    def __init__(
        self,
        objects: Any,
        fills: str,
        stored: list[tuple[str, str]],
        clock: Clock,
        on_stored: Callable[[str, str], None] | None = None,
    ) -> None:
        self.objects = objects
        self.clock = clock
        self.fills = fills
        self.stored = stored
        self.on_stored = on_stored  # told (name, ETag) of each part stored, in order
        self._queue: queue.Queue[Any] = queue.Queue()  # bounded by ``_held``
        self._error: list[BaseException] = []
        self._next = len(stored)  # the number of the next part handed over (resumed first)
        self._room = threading.Condition()
        self._held = 0  # parts handed over and not told stored (nor dropped), under _room
        #: Parts stored while one before them is not yet: number -> (name, ETag, bytes).
        self._done: dict[int, tuple[str, str, bytes]] = {}
        self._threads = [
            threading.Thread(target=self._run, name="cmh-fill-parts", daemon=True)
            for _ in range(PUTS_AT_ONCE)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not self._END:
            n, name, data = item
            if self._error:
                self._release(1)  # drain: nothing more is stored after a failure
                continue
            try:
                etag = self.objects.put(name, data)
            except BaseException as exc:  # raised by put() or finish()
                with self._room:
                    self._error.append(exc)
                self._release(1)
                continue
            self._stored(n, name, etag, data)

    def _release(self, count: int) -> None:
        with self._room:
            self._held -= count
            self._room.notify_all()

    def _stored(self, n: int, name: str, etag: str, data: bytes) -> None:
        """Part ``n`` is stored: tell it, with every later one already stored, once the
        parts before it are."""
        with self._room:
            self._done[n] = (name, etag, data)
            told = 0
            while (first := len(self.stored)) in self._done:
                name, etag, data = self._done.pop(first)
                self.stored.append((name, etag))
                if self.on_stored is not None:
                    self.on_stored(name, etag)
                _STORED_PARTS.keep(self.fills, first, data, self.clock.monotonic())
                told += 1
            self._held -= told
            self._room.notify_all()
        if told:
            part_stored(self.fills)  # wakes this process's readers

    def put(self, name: str, data: bytes) -> None:
        """Hand the next part over, once fewer than the bound are held; raise what a PUT
        raised. (Each PUT has the storage client's deadline: the wait ends with it.)"""
        with self._room:
            while self._held >= PUTS_AT_ONCE + PARTS_AHEAD and not self._error:
                self._room.wait()
            if self._error:
                raise self._error[0]
            self._held += 1
        n, self._next = self._next, self._next + 1
        self._queue.put((n, name, data))

    def finish(self) -> None:
        for _ in self._threads:
            self._queue.put(self._END)
        for thread in self._threads:
            thread.join()
        if self._error:
            raise self._error[0]


class _PartCopier:
    """Copies the parts of a fill into the blob's multipart upload (:class:`Composition`,
    :data:`COPIES_AT_ONCE` threads), each as it is added: all of them once the hash
    matched, or each as soon as it is stored where :func:`copies_wait` is false. The
    upload starts with the second part (a one-part blob is one copy). Nothing is visible
    under the blob's name until :meth:`finish`; a fill that fails calls :meth:`abandon`
    (a killed replica's upload is aborted by ``cmh prune``)."""

    _END = object()

    def __init__(self, composition: Composition) -> None:
        self.composition = composition
        self._queue: queue.Queue[Any] = queue.Queue()  # (number, name, ETag) to copy
        self._lock = threading.Lock()
        self._first: tuple[str, str] | None = None  # held until a second part comes
        self._told = 0  # parts told stored
        self._errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._run, name="cmh-fill-copies", daemon=True)
            for _ in range(COPIES_AT_ONCE)
        ]
        for thread in self._threads:
            thread.start()

    def add(self, name: str, etag: str) -> None:
        """Copy part ``name`` (ETag ``etag``) (parts are told in order)."""
        with self._lock:
            self._told += 1
            if self._told == 1:
                self._first = (name, etag)
                return
            if self._first is not None:
                self._queue.put((1, *self._first))
                self._first = None
            self._queue.put((self._told, name, etag))

    def _run(self) -> None:
        while (item := self._queue.get()) is not self._END:
            if self._errors:
                continue
            number, name, etag = item
            try:
                self.composition.add(name, etag, number)
            except BaseException as exc:  # told by finish()
                self._errors.append(exc)

    def _stop(self) -> None:
        for _ in self._threads:
            self._queue.put(self._END)
        for thread in self._threads:
            thread.join()

    def finish(self, parts: int) -> tuple[str, bool] | None:
        """Complete the blob of the ``parts`` parts stored: its ETag and whether the copies
        are known to be the parts hashed; None when no upload holds them all (one part,
        or a copy failed on the way: the caller composes them).
        :class:`PreconditionFailed` when a part changed since it was stored."""
        self._stop()
        try:
            changed = [e for e in self._errors if isinstance(e, PreconditionFailed)]
            if changed:
                raise changed[0]
            if self._errors or self._told != parts or len(self.composition.parts) != parts:
                return None
            try:
                return self.composition.complete()
            except PreconditionFailed:
                raise
            except ObjectStoreError:
                return None
        finally:
            self.composition.abort()  # nothing once completed; else no upload is left

    def abandon(self) -> None:
        """The fill ends without its blob: stop copying and abort the upload."""
        self._stop()
        self.composition.abort()


class _Gathered:
    """The upstream's chunks of the part being received, kept as they came (no copy):
    :meth:`part` joins them into the part's bytes, the one copy a fill makes of them
    (issue 37: appending to a buffer, slicing and freezing it copied each byte three
    times). The part is immutable, so it is PUT and kept for this process's readers as
    is; each part gathers into a new instance."""

    def __init__(self) -> None:
        self.chunks: list[bytes | memoryview] = []
        self.size = 0

    def add(self, chunk: bytes | memoryview) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)

    def part(self) -> bytes:
        """The gathered bytes as one object (a lone chunk of ``bytes``: itself)."""
        return b"".join(self.chunks)


class _Fill:
    """One replica's fill of one blob under the lease: resume, stream, check, compose."""

    def __init__(
        self,
        pull: BucketPullThrough,
        upstream: Any,
        folder: str,
        commit: str,
        f: TreeFile,
        done_by: float | None = None,
    ) -> None:
        from cmh.hub.cache import parse_repo_folder

        self.pull, self.upstream, self.commit, self.f = pull, upstream, commit, f
        self.done_by = done_by  # no try starts past it (upstream.clock)
        self.folder = folder
        parsed = parse_repo_folder(folder)
        assert parsed is not None  # the folder was made from a repo name
        self.repo_type, self.repo_id = parsed
        self.objects = pull.objects
        self.fills = pull.store.fill_name(folder, f.etag)
        self.digest = new_digest(f.etag, f.size)
        self.pos = 0  # bytes hashed, stored as parts or in ``gathered``
        self.part = 0  # the next part number
        self.stored: list[tuple[str, str]] = []  # (name, storage ETag) of each part stored
        self.writer: _PartWriter | None = None
        self.copier: _PartCopier | None = None
        self.gathered = _Gathered()
        self.lost = threading.Event()
        self.done = threading.Event()
        self.renewing = threading.Lock()

    def part_name(self, n: int) -> str:
        return f"{self.fills}/part-{n:06d}"

    def run(self) -> None:
        from cmh.hub.resolver import IntegrityError

        from ..._upstream import failed

        name = self.pull.store.blob_name(self.folder, self.f.etag)
        keeper = threading.Thread(target=self._keep_lease, name="cmh-fill-lease", daemon=True)
        keeper.start()
        self.objects.warm_s3_client()  # the compose's client, made while the bytes stream
        try:
            self._resume()
            if not copies_wait(self.objects):  # each part copied as soon as it is stored
                self.copier = _PartCopier(Composition(self.objects, name))
                for part_name, etag in self.stored:  # a previous holder's, re-read
                    self.copier.add(part_name, etag)
            now = self.pull.store.clock.monotonic()
            _STORED_PARTS.start(self.fills, self.part, now)  # its readers here wait, no GET
            try:
                self._transfer()
                if self.gathered.size:
                    self._store_part(self.gathered.part())
            finally:
                self._flush_parts()
            # Building the blob, deleting the parts, a ``failed`` record: the holder's alone.
            # A holder whose lease expired and was taken over may not know it yet (no
            # renewal since): renewed now, the lease is this fill's for its whole lifetime.
            if not self._renew():
                raise _LeaseLost(self.fills)
            if self.pos != self.f.size or self.digest.hexdigest() != self.f.etag:
                error = IntegrityError(
                    f"{self.f.path}: {self.pos} bytes whose hash is not the listed {self.f.etag}"
                )
                self._failed(str(error))
                raise failed(error, "fill failed")
            self._hashed()  # served from the parts until the blob is made
            try:  # the parts become the blob, copied by the storage: no second upload
                confirmed = self._compose(name)
            except PreconditionFailed:  # a part changed since it was hashed
                error = IntegrityError(f"{self.f.path}: a stored part changed during the fill")
                self._failed(str(error))
                raise failed(error, "fill failed") from None
            storage_etag = self.objects.head(name).etag
        except BaseException:
            _HASHED_PARTS.withdraw(self.fills)  # a part may change or go: no body from them
            raise
        finally:
            if self.copier is not None:  # the fill failed or was lost: no upload left
                self.copier.abandon()
            self.done.set()
            # A renewal under way ends first: answered after the release read the lease,
            # it left the lease rewritten and unreleased (one request: its deadline bounds
            # the wait).
            keeper.join()
            _STORED_PARTS.end(self.fills)
        try:
            if confirmed:  # else the first reader checks the blob (the parts were not pinned)
                self.pull.store.record_check(self.folder, self.f.etag, storage_etag)
        finally:  # the blob is made: bodies start from it now
            _HASHED_PARTS.withdraw(self.fills)
        # Those sent from the parts here end first (a body whose part is gone, here after
        # PARTS_READ_WAIT or at another replica, goes on from the blob).
        _HASHED_PARTS.wait_read(self.fills, PARTS_READ_WAIT, self.pull.store.clock)
        self._delete_parts()
        with contextlib.suppress(ObjectStoreError):  # an earlier failure is history now
            self.objects.delete(f"{self.fills}/failed")

    def _hashed(self) -> None:
        """The whole hash matched: the parts may be sent as the blob until it is made, by
        this process (:class:`_HashedParts`) and by every replica (the ``hashed`` record:
        the size and each part's ETag as hashed; best effort, the other replicas read the
        parts through their fill reader without it)."""
        _HASHED_PARTS.publish(self.fills, self.stored)
        if self.stored:
            doc = {"size": self.f.size, "etags": [etag for _, etag in self.stored]}
            with contextlib.suppress(ObjectStoreError):
                self.pull.store.put_record(f"{self.fills}/hashed", json.dumps(doc).encode())

    def _compose(self, name: str) -> bool:
        """Make the blob of the parts stored (their hash matched): the storage copies them
        into a multipart upload now (:data:`COPIES_AT_ONCE` at once; already under way
        when :func:`copies_wait` is false), and it is completed (a copy that failed on the
        way: one compose of them); whether the copies are known to be the parts hashed.
        :class:`PreconditionFailed` when a part changed since it was hashed."""
        if self.copier is None:
            self.copier = _PartCopier(Composition(self.objects, name))
            for part_name, etag in self.stored:
                self.copier.add(part_name, etag)
        copier, self.copier = self.copier, None
        made = copier.finish(len(self.stored))  # PreconditionFailed: a part changed
        if made is not None:
            return made[1]
        return self.objects.compose(self.stored, name)[1]

    def _failed(self, error: str) -> None:
        """Nothing wrong is kept: the parts deleted (no blob was made), the failure told."""
        _HASHED_PARTS.withdraw(self.fills)
        self._delete_parts()
        said = printable(error)  # read strictly
        with contextlib.suppress(ObjectStoreError):
            doc = {"at": self.pull.store.storage_time(), "error": said}
            self.pull.store.put_record(f"{self.fills}/failed", json.dumps(doc).encode())

    def _store_part(self, data: bytes) -> None:
        """Hand the next part to the writer thread (one PUT each, in order, while the
        upstream's next bytes arrive); its readers here are woken once it is stored."""
        name = self.part_name(self.part)
        self.part += 1
        if self.writer is None:
            on_stored = None if self.copier is None else self.copier.add
            self.writer = _PartWriter(
                self.objects, self.fills, self.stored, self.pull.store.clock, on_stored
            )
        self.writer.put(name, data)

    def _flush_parts(self) -> None:
        """Wait until every part handed over is stored; raise what a PUT raised."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.finish()

    def _delete_parts(self) -> None:
        with contextlib.suppress(ObjectStoreError):  # first: no body starts from the parts
            self.objects.delete(f"{self.fills}/hashed")
        with contextlib.suppress(ObjectStoreError):
            for info in list(self.objects.list(self.fills)):
                if "/part-" in info.name:
                    self.objects.delete(info.name)

    def _keep_lease(self) -> None:
        """Renew the lease every quarter of its lifetime until the fill ends."""
        while not self.done.wait(self.pull.lease_ttl / 4):
            try:
                if not self._renew():
                    return
            except ObjectStoreError:
                continue  # the storage is away: try again; the lease may expire meanwhile

    def _renew(self) -> bool:
        """Rewrite the lease (its lifetime starts again); False, and :attr:`lost` set, when
        it is no longer this fill's. One renewal at a time: each goes by the ETag the last
        one left."""
        with self.renewing:
            if self.lost.is_set():
                return False
            name, ttl = f"{self.fills}/lease", self.pull.lease_ttl
            if self.pull.store.renew_lease(self.folder, self.pull.owner, name=name, ttl=ttl):
                return True
            self.lost.set()
            return False

    def _resume(self) -> None:
        """Re-read the parts a previous holder stored, in order, while they are whole."""
        n = 0
        while self.pos < self.f.size:
            try:
                data, info = self.objects.get_with_info(self.part_name(n), limit=PART)
            except (ObjectNotFound, ObjectTooLarge):  # absent, or not a part of this fill
                break
            whole = len(data) == PART or self.pos + len(data) == self.f.size
            if not whole or self.pos + len(data) > self.f.size:
                break
            self._take(data)
            self.stored.append((info.name, info.etag))
            n += 1
        self.part = n
        self.gathered = _Gathered()
        for info in list(self.objects.list(self.fills)):  # later parts: not contiguous
            if "/part-" in info.name and info.name >= self.part_name(n):
                self.objects.delete(info.name)

    def _take(self, data: bytes | memoryview) -> None:
        self.digest.update(data)
        self.pos += len(data)

    def _gather(self, chunk: bytes | memoryview) -> None:
        """Keep ``chunk`` for the part it belongs to; store each part it completes."""
        while self.gathered.size + len(chunk) >= PART:
            view = memoryview(chunk)
            cut = PART - self.gathered.size
            self.gathered.add(view[:cut])
            self._store_part(self.gathered.part())
            self.gathered = _Gathered()
            chunk = view[cut:]
        if len(chunk):
            self.gathered.add(chunk)

    def _transfer(self) -> None:
        """Stream the rest from the upstream (its redirect to the CDN followed without the
        token), resuming with ``Range`` after a failure, at most :data:`MAX_ATTEMPTS`."""
        from cmh.hub.resolver import AccessError, HubUnreachableError, NotFoundError, ResolveError

        from ..._upstream import failed, typed, unavailable

        client = self.upstream.client(done_by=self.done_by)
        url = client.file_url(self.repo_id, self.repo_type, self.commit, self.f.path)
        try:
            for attempt in range(MAX_ATTEMPTS):
                if self.pos >= self.f.size and self.f.size:
                    return
                start = self.pos
                skip = [0]

                def restart(start: int = start, skip: list[int] = skip) -> None:
                    skip[0] = start  # a 200 to a ranged request: the body from byte 0

                def sink(data: bytes, skip: list[int] = skip) -> None:
                    chunk: bytes | memoryview = data
                    if skip[0]:
                        cut = min(skip[0], len(chunk))
                        skip[0] -= cut
                        chunk = memoryview(data)[cut:]
                        if not chunk:
                            return
                    if self.lost.is_set():
                        raise _LeaseLost(self.fills)
                    self._take(chunk)
                    self._gather(chunk)

                try:
                    client.stream(url, start, sink, on_restart=restart, limit=self.f.size)
                except HubUnreachableError as exc:
                    if attempt == MAX_ATTEMPTS - 1 or not exc.transient:
                        raise  # the last try, or the fill's time for tries has passed
                else:
                    if self.pos >= self.f.size:
                        return
                    # A body that ended whole but short of the listed size (a 200 or 206
                    # whose Content-Length is less): resumed as a broken transfer is.
                    if attempt == MAX_ATTEMPTS - 1:
                        raise FillFailed(
                            f"{self.f.path}: the upstream's body ended after {self.pos} of "
                            f"{self.f.size} bytes, {MAX_ATTEMPTS} transfers"
                        )
                self.pull.store.clock.sleep(min(2.0, 0.2 * (attempt + 1)))
        except (NotFoundError, AccessError) as exc:
            raise typed(exc) from None
        except ResolveError as exc:
            raise failed(exc, "fill failed") from None
        except FillFailed as exc:
            raise unavailable(str(exc)) from None
        finally:
            self.upstream.count(client.requests, client.bytes_received)


#: Segments loaded or being loaded for this worker's readers of one fill (its future: the
#: parts of a fill that failed are never read for the next one):
#: (fills, n, fill) -> (loop, task, the serial of the bytes it reads).
_SEGMENTS: LRUCache[tuple[str, int, Any], tuple[Any, asyncio.Task[bytes | None], int]] = LRUCache(
    KEPT_SEGMENTS
)


class PartTail:
    """Reads a blob being filled into a bucket: its part objects as they appear, then the
    blob once it is stored (segments of :data:`PART` bytes, one GET each)."""

    def __init__(
        self,
        objects: ObjectStore,
        blob: str,
        fills: str,
        size: int,
        fill: asyncio.Future[None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.objects = objects
        self.clock = clock
        self.blob = blob
        self.fills = fills
        self.size = size
        self.fill = fill
        self.etag = blob.rpartition("/")[2]
        self._segment: tuple[int, bytes] | None = None
        self._installed = False
        self._stored: asyncio.Event | None = None  # set when this process stores a part
        self._hash: SharedHash | None = None  # joined by a read from byte 0 first
        self._vouched = False  # the current segment's bytes are hashed by ``_hash``

    def close(self) -> None:
        self._segment = None
        self._hash = None
        if self._stored is not None:
            _PART_SIGNALS.unsubscribe(self.fills, self._stored)
            self._stored = None

    async def _next_part(self) -> None:
        """Wait until a part is stored here, the fill ends, or :data:`READ_POLL` passed."""
        if self._stored is None:
            self._stored = _PART_SIGNALS.subscribe(self.fills)
        if not self._stored.is_set():
            stored = asyncio.ensure_future(self._stored.wait())
            either: list[asyncio.Future[Any]] = [self.fill, stored]
            try:
                await asyncio.wait(either, timeout=READ_POLL, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stored.cancel()
        self._stored.clear()

    def _task(self, n: int) -> tuple[Any, asyncio.Task[bytes | None], int]:
        """The read of segment ``n`` shared by every reader of this worker (started now
        unless one is kept). A read that failed or found nothing is not kept: the next
        reader who asks looks again."""
        key, loop = (self.fills, n, self.fill), asyncio.get_running_loop()
        kept = _SEGMENTS.get(key)
        if kept is None or kept[0] is not loop:
            task = loop.create_task(self._load(n))
            kept = (loop, task, new_serial())
            _SEGMENTS[key] = kept

            def settled(done: asyncio.Task[bytes | None], kept: Any = kept) -> None:
                failed = done.cancelled() or done.exception() is not None
                if (failed or done.result() is None) and _SEGMENTS.get(key) is kept:
                    del _SEGMENTS[key]

            task.add_done_callback(settled)
        return kept

    async def _shared(self, n: int) -> tuple[bytes, int] | None:
        """Segment ``n`` as :meth:`_load` reads it and its serial, one read for every reader
        of this worker (a segment not stored yet is looked for again by the next reader
        who asks)."""
        _, task, serial = self._task(n)
        data = await asyncio.shield(task)
        return None if data is None else (data, serial)

    def _read_ahead(self, n: int) -> None:
        """Start the shared reads of the :data:`READ_AHEAD` segments after ``n`` (those
        not started), so a reader behind the fill GETs a part while it sends the one
        before (issue 37: one GET after another paced a waiting replica's clients).

        Only as many as the worker's :data:`KEPT_SEGMENTS` have room for beside the other
        fills read (a share each): a segment read ahead and pushed out before it is sent
        would be read twice. With :data:`KEPT_SEGMENTS` fills read at once, none."""
        fills = {key[0] for key in list(_SEGMENTS)} | {self.fills}
        room = KEPT_SEGMENTS // len(fills) - 1  # this fill's share, beside segment n
        last = (self.size - 1) // PART
        for ahead in range(n + 1, min(last, n + min(READ_AHEAD, room)) + 1):
            self._task(ahead)

    async def _load(self, n: int) -> bytes | None:
        start = n * PART
        end = min(self.size, start + PART)
        if not self._installed:
            try:
                return await self.objects.get_range_async(f"{self.fills}/part-{n:06d}", 0, PART)
            except ObjectStoreError:  # absent, or gone while read: the fill's end deletes
                pass  # the parts once the blob is stored (a storage that is down: the HEAD)
            try:
                await self.objects.head_async(self.blob)
            except ObjectNotFound:
                return None
            self._installed = True
        return await self.objects.get_range_async(self.blob, start, end)

    def voucher(self) -> SharedHash | None:
        """The worker's hash of the whole blob, when it hashes the bytes last read (a body
        read from byte 0 on, whose segment is the bytes it took), else ``None``."""
        return self._hash if self._vouched else None

    async def _use(self, n: int, data: bytes, serial: int) -> None:
        """Send segment ``n`` from now on (offered to the body hash a read from byte 0
        joined, once it has room)."""
        self._segment = (n, data)
        self._vouched = False
        if self._hash is not None:
            self._vouched = await self._hash.offer_in_turn(n * PART, serial, data)

    async def read(self, pos: int, count: int) -> bytes | memoryview:
        """A view of the segment (no copy: every reader of this worker shares its bytes)."""
        n = pos // PART
        if pos == 0 and self._segment is None and self.size:
            self._hash = shared_hash((self.fills, self.fill), self.etag, self.size)
        waiting = FillWait(self.fill, "the filled blob is not in the store", READ_POLL)
        while True:
            if self._segment is not None and self._segment[0] == n:
                data = self._segment[1]
                off = pos - n * PART
                if off < len(data):
                    return memoryview(data)[off : off + count]
                raise FillFailed("a stored part is shorter than the blob's listed size")
            now = self.clock.monotonic()
            here = False if self._installed else _STORED_PARTS.look(self.fills, n, now)
            if isinstance(here, tuple):  # stored by this process's fill: no GET back
                await self._use(n, *here)
                continue
            if here:  # this process's fill stores it next: wait to be told, no GET
                if self._stored is None:  # subscribed before the next look
                    self._stored = _PART_SIGNALS.subscribe(self.fills)
                    continue
                if not self.fill.done():
                    await self._next_part()
                    continue
            try:
                loaded = await self._shared(n)
            except ObjectStoreError as exc:
                raise FillFailed(f"store unavailable: {exc}") from None
            if loaded is not None:
                await self._use(n, *loaded)
                self._read_ahead(n)
                continue
            if self._stored is None:  # subscribed before the next look: no part missed
                self._stored = _PART_SIGNALS.subscribe(self.fills)
                continue
            if not self.fill.done():
                await self._next_part()
                continue
            await waiting.wait()

    def ranges_match(self, sent: SentRanges) -> bool:
        try:
            for offset, count, digest in sent:
                h = hashlib.sha256()
                for chunk in self.objects.iter_chunks(self.blob, offset, offset + count):
                    h.update(chunk)
                if h.digest() != digest.digest():
                    return False
            return True
        except ObjectStoreError:
            return False
