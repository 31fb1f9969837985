"""Re-check every blob of a store against its name and quarantine the bad ones.

Every blob is hashed whole and compared with its name (SHA-256, or the git
blob SHA-1 for small files); blobs are hashed in parallel. A blob that is a
stamped safetensors file whose manifest agrees with its record is also
checked tensor by tensor against the CMH manifest (hashed in parallel, and the
bad tensors are named), so a blob replaced by another valid, re-stamped file
under the old name is caught by its name, and a tensor that differs is named.
Bad blobs are moved to ``{store}/.quarantine/{repo folder}/`` with a note,
where the mirror never looks: a file whose blob is quarantined answers 503
until it is imported again. Only the version hashed goes (as in a bucket): a blob
whose file changed while it was hashed is not judged, and one a re-import replaced
after it was hashed (under the blob lock, as the import writes) stays, with its
check record.

Problems are per blob: a blob that looks like a safetensors file but whose
header cannot be used is reported as ``invalid_file`` (and still compared with
its name), a blob that cannot be read as ``unreadable``; the scrub goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from cmh.hub.cache import (
    ETAG_RE,
    SYSTEM_CLOCK,
    Clock,
    RepoLayout,
    blob_lock,
    blob_matches,
    iter_repos,
)

from cmh import FileVersion, atomic_write, usable_cpus

from ..._index import build_index, regular_size
from ._folder import ProgressCallback
from ._pull import upstream_record_path
from ._verify import read_record, record_path

QUARANTINE = ".quarantine"


class ScrubOptions(TypedDict, total=False):
    """What a scrub takes beside its store (:func:`scrub_store`); the stores pass them on."""

    do_quarantine: bool  # move bad blobs aside (default True)
    full: bool  # kept for compatibility: every blob is hashed whole anyway
    threads: int | None  # hashing threads (default: by the CPU count)
    progress: ProgressCallback | None  # told the bytes of each blob checked


@dataclass(frozen=True)
class BlobCheck:
    """The outcome for one blob."""

    repo: str
    blob: str
    size: int
    method: str  # tensors (manifest and name) | sha256 | sha1
    ok: bool  # the bytes hash to the name (and match the manifest, for "tensors")
    bad_tensors: tuple[str, ...] = ()
    message: str = ""
    quarantined_to: str | None = None
    error: str | None = None  # invalid_file | unreadable


#: ``BlobCheck.error`` of a blob that looks like safetensors but whose header cannot be used.
INVALID_FILE = "invalid_file"
#: ``BlobCheck.error`` of a blob that could not be read (it is neither good nor quarantined).
UNREADABLE = "unreadable"


@dataclass
class ScrubReport:
    """Every blob checked, and snapshot entries that point nowhere safe."""

    checks: list[BlobCheck] = field(default_factory=list)
    broken_links: list[str] = field(default_factory=list)

    @property
    def bad(self) -> list[BlobCheck]:
        """Blobs read whole whose bytes differ from their name or manifest."""
        return [c for c in self.checks if not c.ok and c.error != UNREADABLE]

    @property
    def errors(self) -> list[BlobCheck]:
        """Blobs that are invalid safetensors files or could not be read."""
        return [c for c in self.checks if c.error is not None]

    @property
    def bytes_checked(self) -> int:
        return sum(c.size for c in self.checks)

    def to_dict(self) -> dict[str, object]:
        return {
            "blobs": len(self.checks),
            "bytes": self.bytes_checked,
            "bad": [c.__dict__ for c in self.bad],
            "errors": [c.__dict__ for c in self.errors],
            "broken_links": self.broken_links,
            "ok": not self.bad and not self.errors,
        }


def _label(repo: RepoLayout) -> str:
    return repo.repo_id if repo.repo_type == "model" else f"{repo.repo_type}s/{repo.repo_id}"


def check_stamped(path: Path, threads: int | None) -> tuple[bool, tuple[str, ...]] | None:
    """Per-tensor check of a stamped safetensors file; ``None`` when it is not stamped.

    Raises :class:`~cmh.InvalidFileError` when the header cannot be
    parsed or used (a lone surrogate in a name, a dimension of 2**64 or more),
    whichever layer notices it.
    """
    from cmh import CMHError, InvalidFileError, claimed_digests, hash_tensors, read_header

    try:
        header = read_header(path)
        claimed = claimed_digests(header)
        if claimed is None:
            return None
        digests = hash_tensors(path, header, threads=threads)
    except InvalidFileError:
        raise
    except CMHError:
        return None  # a carrier or record that does not apply: not a usable manifest
    except (ValueError, OverflowError, struct.error) as exc:  # UnicodeError is a ValueError
        raise InvalidFileError(f"header cannot be used: {exc}", str(path)) from exc
    bad = tuple(d.name for d, want in zip(digests, claimed, strict=True) if d.sha256 != want)
    return not bad, bad


def _check_all(
    repo: RepoLayout,
    stamped: list[str],
    others: list[str],
    workers: int,
    progress: ProgressCallback | None,
) -> list[tuple[BlobCheck, FileVersion | None]]:
    """Check every blob named, each with the version hashed; ``progress`` hears of each as
    soon as it is checked."""
    results: list[tuple[BlobCheck, FileVersion | None]] = []

    def done(checked: tuple[BlobCheck, FileVersion | None]) -> None:
        results.append(checked)
        if progress is not None:
            progress(checked[0].size)

    for name in stamped:
        done(_check(repo, name, workers))  # threads inside each file
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for check in pool.map(_check, [repo] * len(others), others, [1] * len(others)):
            done(check)
    return results


#: A blob whose file changed while it was hashed: not judged by this scrub.
REPLACED = "replaced while it was hashed (an import or a prune): checked by the next scrub"
#: A bad blob replaced after it was hashed (a re-import repaired it): it stays.
REPAIRED = "replaced since it was hashed (an import or a prune): checked by the next scrub"


def _version(path: Path) -> FileVersion | None:
    try:
        return FileVersion.of(os.lstat(path))
    except OSError:
        return None


def _check(
    repo: RepoLayout, name: str, threads: int | None
) -> tuple[BlobCheck, FileVersion | None]:
    """Compare one blob with its name and, when stamped, with its manifest; and the
    version of the file that was hashed (``None`` when it changed meanwhile)."""
    before = _version(repo.blobs / name)
    check = _check_bytes(repo, name, threads)
    if check.error == UNREADABLE or before is None:
        return check, None
    if _version(repo.blobs / name) != before:
        return BlobCheck(check.repo, name, check.size, check.method, True, (), REPLACED), None
    return check, before


def _check_bytes(repo: RepoLayout, name: str, threads: int | None) -> BlobCheck:
    """Compare one blob with its name and, when stamped, with its manifest."""
    from cmh import InvalidFileError

    path = repo.blobs / name
    method = "sha256" if len(name) == 64 else "sha1"
    try:
        size = os.lstat(path).st_size
    except OSError as exc:
        return BlobCheck(_label(repo), name, 0, method, False, (), _why(exc), None, UNREADABLE)
    stamped: tuple[bool, tuple[str, ...]] | None = None
    error: str | None = None
    notes: list[str] = []
    try:
        if len(name) == 64 and _looks_safetensors(path):
            try:
                stamped = check_stamped(path, threads)
            except InvalidFileError as exc:
                error = INVALID_FILE
                notes.append(f"not a valid safetensors file: {exc}")
        named = blob_matches(path, name, size)
    except OSError as exc:
        return BlobCheck(_label(repo), name, size, method, False, (), _why(exc), None, UNREADABLE)
    bad_tensors: tuple[str, ...] = ()
    if stamped is not None:
        method = "tensors"
        tensors_ok, bad_tensors = stamped
        if not tensors_ok:
            notes.append(f"{len(bad_tensors)} tensor(s) differ from the CMH manifest")
    if not named:
        kind = "sha256" if len(name) == 64 else "sha1"
        also = (
            " (its tensors agree with its own manifest: replaced or re-stamped)"
            if stamped is not None and stamped[0]
            else ""
        )
        notes.insert(0, f"{kind} mismatch: the bytes differ from the blob's name{also}")
    ok = named and (stamped is None or stamped[0])
    return BlobCheck(
        _label(repo), name, size, method, ok, bad_tensors, "; ".join(notes), None, error
    )


def _why(exc: OSError) -> str:
    return f"cannot read the blob: {exc.strerror or exc}"


class Replaced(OSError):
    """The blob is no longer the version a scrub hashed (a re-import replaced it)."""


def _forget(blob: Path, etag: str, version: FileVersion | None) -> None:
    """Remove the check record of ``blob`` if it names ``version`` (found bad): a record
    of another version, a re-import's, stays."""
    record = record_path(blob, etag)
    if record is not None and version is not None and read_record(record) == version:
        with contextlib.suppress(FileNotFoundError):
            record.unlink()


def quarantine(
    store: Path, repo: RepoLayout, check: BlobCheck, at: float, version: FileVersion
) -> str:
    """Move a bad blob, the version hashed, out of the served tree at ``at`` (unix
    seconds); where it went. :class:`Replaced` (nothing moved) when the file is another
    version now."""
    dest_dir = store / QUARANTINE / repo.folder_name
    dest = dest_dir / f"{check.blob}.{int(at)}"
    blob = repo.blobs / check.blob
    with blob_lock(repo, check.blob):  # as an import writes it
        if _version(blob) != version:
            raise Replaced(0, REPAIRED)
        dest_dir.mkdir(parents=True, exist_ok=True)
        os.replace(blob, dest)
    note = {**check.__dict__, "quarantined_at": at}
    atomic_write(dest.with_name(dest.name + ".json"), json.dumps(note, indent=1).encode())
    return str(dest)


def scrub_store(
    store: Path,
    *,
    do_quarantine: bool = True,
    full: bool = False,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ScrubReport:
    """Check every blob of every repo of ``store``; quarantine the bad ones unless told not to.

    ``full`` is kept for compatibility: every blob is hashed whole anyway. ``clock``: the
    store's, for the quarantine's times.
    """
    del full
    report = ScrubReport()
    workers = threads or min(8, usable_cpus())
    for repo in iter_repos(store):
        for commit in repo.commits():
            with contextlib.suppress(OSError):
                report.broken_links += _broken(repo, commit)
        names: list[str] = []
        with contextlib.suppress(OSError), os.scandir(repo.blobs) as it:
            names = sorted(
                e.name for e in it if ETAG_RE.match(e.name) and e.is_file(follow_symlinks=False)
            )
        stamped = [n for n in names if len(n) == 64 and _looks_safetensors(repo.blobs / n)]
        others = [n for n in names if n not in set(stamped)]
        results = _check_all(repo, stamped, others, workers, progress)
        for check, version in results:
            blob = repo.blobs / check.blob
            if not check.ok:
                # A bad blob loses the server's record of a good check (bit rot keeps the
                # file's version): workers started after this scrub hash it again.
                _forget(blob, check.blob, _version(blob) if version is None else version)
            if not check.ok and check.error != UNREADABLE and do_quarantine and version:
                try:
                    where: str | None = quarantine(store, repo, check, clock.time(), version)
                    message = check.message
                except Replaced:
                    where, message = None, f"{check.message}; not quarantined: {REPAIRED}"
                except OSError as exc:
                    where, message = None, f"{check.message}; not quarantined: {_why(exc)}"
                check = BlobCheck(**{**check.__dict__, "quarantined_to": where, "message": message})
            report.checks.append(check)
    return report


def _broken(repo: RepoLayout, commit: str) -> list[str]:
    """The snapshot entries of ``commit`` that 1.3 refuses, and those whose blob is absent,
    not a regular file or of another size than recorded (``(blob E missing)``, as a bucket
    scrub says); a missing blob of a pull-through commit is one not filled yet."""
    index = build_index(repo, commit)
    label = f"{_label(repo)}@{commit}"
    out = [f"{label}:{p}" for p in index.skipped]
    if upstream_record_path(repo, commit).exists():
        return out
    missing = {p: f"{label}:{p} (blob missing)" for p in index.unavailable}
    for p, entry in index.files.items():
        if entry.source.parent == repo.blobs and regular_size(entry.source) != entry.size:
            missing[p] = f"{label}:{p} (blob {entry.etag} missing)"
    return sorted(out + list(missing.values()))


def _looks_safetensors(path: Path) -> bool:
    """A cheap sniff: an 8-byte header length followed by ``{``."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{"
