"""Scrub a bucket store: stream every blob, hash it, quarantine the ones that differ.

Each blob of each repo is read from the storage in chunks and hashed as it arrives
(SHA-256 for a 64-hex name, the git blob SHA-1 for a 40-hex one); blobs are checked
in parallel. A blob whose bytes do not hash to its name is copied by the storage to
``.quarantine/{repo}/{etag}.{unix time}`` beside a JSON note and then deleted from
``blobs/``: files that used it answer ``503 BlobUnavailable`` until a re-import
uploads it again. Only the version hashed goes: the read is pinned to the listed
storage ETag, the copy to the ETag read, and the blob (and its check record) deleted
only while it still has that ETag, right after the hash; a re-import that replaced it
meanwhile (spec/hub-mirror.md 7.2 step 1) keeps its blob. Tree entries whose blob is
missing or of the wrong size are reported as broken (a pull-through commit's missing
blob is one not filled yet: not broken), as are tree objects that cannot be parsed.
"""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING

from cmh.hub.cache import json_value, new_digest

from cmh import usable_cpus

from ..local._scrub import REPAIRED, UNREADABLE, BlobCheck, ScrubOptions, ScrubReport
from ._bucket import QUARANTINE, BucketError, BucketStore
from ._objectstore import ObjectInfo, ObjectNotFound, ObjectStoreError, PreconditionFailed

if TYPE_CHECKING:
    from typing_extensions import Unpack


def _label(repo_type: str, repo_id: str) -> str:
    return repo_id if repo_type == "model" else f"{repo_type}s/{repo_id}"


#: A blob replaced (or deleted) after it was listed: not checked by this scrub.
REPLACED = "replaced since it was listed (an import or a prune): checked by the next scrub"


def check_blob(store: BucketStore, label: str, info: ObjectInfo, etag: str) -> BlobCheck:
    """Stream one blob, the version listed (``info.etag``), and compare its hash with its
    name."""
    method = "sha256" if len(etag) == 64 else "sha1"
    digest = new_digest(etag, info.size)
    read = 0
    try:
        for chunk in store.objects.iter_chunks(info.name, if_match=info.etag or None):
            digest.update(chunk)
            read += len(chunk)
    except (ObjectNotFound, PreconditionFailed):
        return BlobCheck(label, etag, info.size, method, True, (), REPLACED)
    except ObjectStoreError as exc:  # neither good nor bad: reported, never quarantined
        return BlobCheck(label, etag, info.size, method, False, (), str(exc), error=UNREADABLE)
    ok = read == info.size and digest.hexdigest() == etag
    return BlobCheck(label, etag, read, method, ok, (), "" if ok else f"{method} mismatch")


def quarantine_blob(
    store: BucketStore, folder: str, check: BlobCheck, storage_etag: str
) -> BlobCheck:
    """Copy the bad version ``storage_etag`` of a blob to ``.quarantine/`` with its note,
    then delete its check record if it names that version, and the blob while it is still
    that version: the check with where it went (``quarantined_to``), or with why it stays.
    """
    at = store.storage_time()  # the fleet's clock, as every record in the bucket
    dest = f"{QUARANTINE}/{folder}/{check.blob}.{int(at)}"
    blob = store.blob_name(folder, check.blob)
    try:
        store.objects.compose([(blob, storage_etag)], dest)  # a copy pinned to that version
    except (PreconditionFailed, ObjectNotFound):
        return _kept(check, REPAIRED)
    note = {**check.__dict__, "storage_etag": storage_etag, "quarantined_at": at}
    store.objects.put(dest + ".json", json.dumps(note, indent=1).encode())
    forget_check(store, folder, check.blob, storage_etag)
    try:
        store.objects.delete_if_match(blob, storage_etag)
    except PreconditionFailed:
        where = f"{store.url}{dest}"
        return _kept(check, f"{REPAIRED}; the version found bad was copied to {where}")
    return BlobCheck(**{**check.__dict__, "quarantined_to": f"{store.url}{dest}"})


def forget_check(store: BucketStore, folder: str, etag: str, storage_etag: str) -> None:
    """Delete the check record of blob ``etag`` if it names the version ``storage_etag``
    (found bad: no replica trusts it now); a record of another version, a re-import's,
    stays (the delete is pinned to the record read)."""
    name = store.check_name(folder, etag)
    record = store.get_record(name)
    if record is not None and _names(record[0], storage_etag):
        with contextlib.suppress(PreconditionFailed):
            store.objects.delete_if_match(name, record[1].etag)


def _names(record: bytes, storage_etag: str) -> bool:
    """Whether a check record names the object version ``storage_etag``."""
    try:
        doc = json_value(record)
    except ValueError:
        return False
    value = doc.get("storage_etag") if isinstance(doc, dict) else None
    return isinstance(value, str) and value.strip('"') == storage_etag.strip('"')


def _kept(check: BlobCheck, why: str) -> BlobCheck:
    """A bad version the scrub did not take out of ``blobs/`` (still reported bad)."""
    return BlobCheck(**{**check.__dict__, "message": f"{check.message}; not quarantined: {why}"})


def _check_and_quarantine(
    store: BucketStore, folder: str, label: str, info: ObjectInfo, etag: str, quarantine: bool
) -> BlobCheck:
    """Hash one blob and, when it is bad, quarantine that version at once (with
    ``quarantine`` false, forget its check record alone, as a folder scrub does)."""
    check = check_blob(store, label, info, etag)
    if check.ok or check.error is not None:
        return check
    # A read that does not hash to the name may have been changed on the way (a byte
    # flipped between an http:// storage and here): the version is read once more, and
    # only a second bad read takes it out of blobs/ (or forgets its check record).
    check = check_blob(store, label, info, etag)
    if check.ok or check.error is not None:
        return check
    try:
        if not quarantine:
            if info.etag:
                forget_check(store, folder, etag, info.etag)
            return check
        if not info.etag:
            return _kept(check, "the storage gave the object no ETag to pin its deletion to")
        return quarantine_blob(store, folder, check, info.etag)
    except ObjectStoreError as exc:  # the blob stays; the scrub goes on, as in a folder
        return _kept(check, str(exc)) if quarantine else check


def scrub_bucket(store: BucketStore, **options: Unpack[ScrubOptions]) -> ScrubReport:
    """Check every blob of every repo of a bucket store; quarantine the bad ones unless
    told not to."""
    do_quarantine, progress = options.get("do_quarantine", True), options.get("progress")
    report = ScrubReport()
    workers = options.get("threads") or max(2, min(8, 2 * usable_cpus()))  # I/O bound
    for repo_type, repo_id, folder in store.repos():
        label = _label(repo_type, repo_id)
        blobs = store.blob_infos(folder)
        pulled = store.upstream_record_infos(folder)  # pull-through commits (spec 8.5)
        for commit in sorted(store.tree_infos(folder)):
            try:
                tree = store.read_tree(folder, commit)
            except (BucketError, ObjectStoreError) as exc:
                report.broken_links.append(f"{label}@{commit}: {exc}")
                continue
            for f in tree.files if tree is not None else ():
                info = blobs.get(f.etag)
                if info is None and commit in pulled:
                    continue  # not filled yet: the next request for it fills it
                if info is None or info.size != f.size:
                    report.broken_links.append(f"{label}@{commit}:{f.path} (blob {f.etag} missing)")
        names = sorted(blobs)
        one = partial(_check_and_quarantine, store, folder, label, quarantine=do_quarantine)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for check in pool.map(one, [blobs[n] for n in names], names):
                if progress is not None:
                    progress(check.size)
                report.checks.append(check)
    return report
