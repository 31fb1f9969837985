"""Re-check every blob of a store against its name and quarantine the bad ones.

A blob named by a SHA-256 that is a stamped safetensors file whose manifest
agrees with its record is checked tensor by tensor against the CMH manifest
(hashed in parallel, and the bad tensors are named); with ``full=True``, or
for any other blob, the whole file is hashed and compared with its name
(SHA-256, or the git blob SHA-1 for small files). Bad blobs are moved to
``{store}/.quarantine/{repo folder}/`` with a note, where the mirror never
looks: a file whose blob is quarantined answers 503 until it is imported again.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cmh._atomic import atomic_write

from ..cache.blobs import blob_matches
from ..cache.layout import ETAG_RE, RepoLayout, iter_repos
from ..cache.locks import blob_lock
from .index import build_index

QUARANTINE = ".quarantine"

ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class BlobCheck:
    """The outcome for one blob."""

    repo: str
    blob: str
    size: int
    method: str  # tensors | sha256 | sha1
    ok: bool
    bad_tensors: tuple[str, ...] = ()
    message: str = ""
    quarantined_to: str | None = None


@dataclass
class ScrubReport:
    """Every blob checked, and snapshot entries that point nowhere safe."""

    checks: list[BlobCheck] = field(default_factory=list)
    broken_links: list[str] = field(default_factory=list)

    @property
    def bad(self) -> list[BlobCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def bytes_checked(self) -> int:
        return sum(c.size for c in self.checks)

    def to_dict(self) -> dict[str, object]:
        return {
            "blobs": len(self.checks),
            "bytes": self.bytes_checked,
            "bad": [c.__dict__ for c in self.bad],
            "broken_links": self.broken_links,
            "ok": not self.bad,
        }


def _label(repo: RepoLayout) -> str:
    return repo.repo_id if repo.repo_type == "model" else f"{repo.repo_type}s/{repo.repo_id}"


def check_stamped(path: Path, threads: int | None) -> tuple[bool, tuple[str, ...]] | None:
    """Per-tensor check of a stamped safetensors file; ``None`` when it is not one."""
    from cmh.checkpoint import claimed_digests
    from cmh.digests import hash_tensors
    from cmh.errors import CMHError
    from cmh.header import read_header

    try:
        header = read_header(path)
    except (CMHError, OSError, ValueError):
        return None
    claimed = claimed_digests(header)
    if claimed is None:
        return None
    digests = hash_tensors(path, header, threads=threads)
    bad = tuple(d.name for d, want in zip(digests, claimed, strict=True) if d.sha256 != want)
    return not bad, bad


def _check(repo: RepoLayout, name: str, full: bool, threads: int | None) -> BlobCheck:
    path = repo.blobs / name
    size = os.lstat(path).st_size
    if len(name) == 64 and not full:
        stamped = check_stamped(path, threads)
        if stamped is not None:
            ok, bad = stamped
            msg = "" if ok else f"{len(bad)} tensor(s) differ from the CMH manifest"
            return BlobCheck(_label(repo), name, size, "tensors", ok, bad, msg)
    method = "sha256" if len(name) == 64 else "sha1"
    ok = blob_matches(path, name, size)
    return BlobCheck(_label(repo), name, size, method, ok, (), "" if ok else f"{method} mismatch")


def quarantine(store: Path, repo: RepoLayout, check: BlobCheck) -> str:
    """Move a bad blob out of the served tree; return where it went."""
    dest_dir = store / QUARANTINE / repo.folder_name
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / f"{check.blob}.{int(time.time())}"
    with blob_lock(repo, check.blob):
        os.replace(repo.blobs / check.blob, dest)
    note = {**check.__dict__, "quarantined_at": time.time()}
    atomic_write(dest.with_name(dest.name + ".json"), json.dumps(note, indent=1).encode())
    return str(dest)


def scrub_store(
    store: Path,
    *,
    do_quarantine: bool = True,
    full: bool = False,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
) -> ScrubReport:
    """Check every blob of every repo of ``store``; quarantine the bad ones unless told not to."""
    report = ScrubReport()
    workers = threads or max(1, min(8, os.cpu_count() or 1))
    for repo in iter_repos(store):
        for commit in repo.commits():
            with contextlib.suppress(OSError):
                skipped = build_index(repo, commit).skipped
                report.broken_links += [f"{_label(repo)}@{commit}:{p}" for p in skipped]
        names: list[str] = []
        with contextlib.suppress(OSError), os.scandir(repo.blobs) as it:
            names = sorted(
                e.name for e in it if ETAG_RE.match(e.name) and e.is_file(follow_symlinks=False)
            )
        stamped = [n for n in names if len(n) == 64 and not full and _looks_safetensors(repo, n)]
        others = [n for n in names if n not in set(stamped)]
        results = [_check(repo, n, full, workers) for n in stamped]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results += list(
                pool.map(
                    _check, [repo] * len(others), others, [full] * len(others), [1] * len(others)
                )
            )
        for check in results:
            if progress is not None:
                progress(check.size)
            if not check.ok and do_quarantine:
                check = BlobCheck(
                    **{**check.__dict__, "quarantined_to": quarantine(store, repo, check)}
                )
            report.checks.append(check)
    return report


def _looks_safetensors(repo: RepoLayout, name: str) -> bool:
    """A cheap sniff: an 8-byte header length followed by ``{``."""
    try:
        with open(repo.blobs / name, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{"
