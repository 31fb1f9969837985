"""Scrub a bucket store: stream every blob, hash it, quarantine the ones that differ.

Each blob of each repo is read from the storage in chunks and hashed as it arrives
(SHA-256 for a 64-hex name, the git blob SHA-1 for a 40-hex one); blobs are checked
in parallel. A blob whose bytes do not hash to its name is copied by the storage to
``.quarantine/{repo}/{etag}.{unix time}`` beside a JSON note and then deleted from
``blobs/``: files that used it answer ``503 BlobUnavailable`` until a re-import
uploads it again. Tree entries whose blob is missing or of the wrong size are
reported as broken (a pull-through commit's missing blob is one not filled yet: not
broken), as are tree objects that cannot be parsed.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from cmh.hub.cache import new_digest

from cmh import usable_cpus

from ..local._scrub import UNREADABLE, BlobCheck, ScrubOptions, ScrubReport
from ._bucket import QUARANTINE, BucketError, BucketStore
from ._objectstore import ObjectInfo, ObjectNotFound, ObjectStoreError

if TYPE_CHECKING:
    from typing_extensions import Unpack


def _label(repo_type: str, repo_id: str) -> str:
    return repo_id if repo_type == "model" else f"{repo_type}s/{repo_id}"


def check_blob(store: BucketStore, label: str, info: ObjectInfo, etag: str) -> BlobCheck:
    """Stream one blob and compare its hash with its name."""
    method = "sha256" if len(etag) == 64 else "sha1"
    digest = new_digest(etag, info.size)
    read = 0
    try:
        for chunk in store.objects.iter_chunks(info.name):
            digest.update(chunk)
            read += len(chunk)
    except ObjectNotFound:
        return BlobCheck(label, etag, info.size, method, True, (), "gone before it was read")
    except ObjectStoreError as exc:  # neither good nor bad: reported, never quarantined
        return BlobCheck(label, etag, info.size, method, False, (), str(exc), error=UNREADABLE)
    ok = read == info.size and digest.hexdigest() == etag
    return BlobCheck(label, etag, read, method, ok, (), "" if ok else f"{method} mismatch")


def quarantine_blob(store: BucketStore, folder: str, check: BlobCheck) -> str:
    """Copy a bad blob to ``.quarantine/`` with its note, then delete it; where it went."""
    at = store.storage_time()  # the fleet's clock, as every record in the bucket
    dest = f"{QUARANTINE}/{folder}/{check.blob}.{int(at)}"
    store.objects.copy(store.blob_name(folder, check.blob), dest)
    note = {**check.__dict__, "quarantined_at": at}
    store.objects.put(dest + ".json", json.dumps(note, indent=1).encode())
    store.objects.delete(store.check_name(folder, check.blob))  # no replica trusts it now
    store.objects.delete(store.blob_name(folder, check.blob))
    return f"{store.url}{dest}"


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
        with ThreadPoolExecutor(max_workers=workers) as pool:
            infos = [blobs[n] for n in names]
            results = list(pool.map(check_blob, [store] * len(names), [label] * len(names),
                                    infos, names))  # fmt: skip
        for check in results:
            if progress is not None:
                progress(check.size)
            if not check.ok and check.error is None and do_quarantine:
                where = quarantine_blob(store, folder, check)
                check = BlobCheck(**{**check.__dict__, "quarantined_to": where})
            report.checks.append(check)
    return report
