"""Housekeeping of what the stock client leaves behind in a cache.

- Orphan ``blobs/{etag}.{id}.incomplete`` files of killed stock downloads
  (the stock client never reuses them): when no process holds the blob lock,
  the longest one becomes ``blobs/{etag}.incomplete``, the resumable partial
  of the resolver, and the others are removed; all are removed once the
  blob exists.
- Stale ``.no_exist/{commit}/{path}`` entries: a path recorded as absent
  that the commit's listing contains, and whole ``.no_exist/{commit}``
  folders of commits that have neither a snapshot nor a ref (with the
  resolver's own listing of such a commit, ``.cmh/trees/{commit}.json``).
- ``CACHEDIR.TAG`` at the cache root, written as the stock client writes it
  (huggingface_hub 2.x, before it downloads a file into the cache), so backup
  tools skip the cache (https://bford.info/cachedir/).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from ._layout import COMMIT_RE, ETAG_PATTERN, RepoLayout
from ._locks import LockBusy, blob_lock

#: What huggingface_hub 2.x writes in ``{cache}/CACHEDIR.TAG`` (``_local_folder.py``).
CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by huggingface_hub.\n"
    "# For information about cache directory tags, see:\n"
    "#\thttps://bford.info/cachedir/\n"
)


def tag_cache_dir(root: Path) -> None:
    """Write ``root/CACHEDIR.TAG`` as the stock client does: once, best effort (a
    read-only cache stays as it is)."""
    tag = root / "CACHEDIR.TAG"
    if not tag.exists():
        with contextlib.suppress(OSError):
            tag.write_text(CACHEDIR_TAG)


_ORPHAN_RE = re.compile(rf"^({ETAG_PATTERN})\.[0-9a-f]+\.incomplete\Z")


@dataclass
class HousekeepingReport:
    """What one pass removed or adopted (paths)."""

    adopted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def adopt_orphans(repo: RepoLayout, report: HousekeepingReport | None = None) -> HousekeepingReport:
    """Turn orphan stock partial downloads into resumable partials, or remove them."""
    report = report if report is not None else HousekeepingReport()
    if not repo.blobs.is_dir():
        return report
    by_etag: dict[str, list[Path]] = {}
    for entry in repo.blobs.iterdir():
        match = _ORPHAN_RE.match(entry.name)
        if match:
            by_etag.setdefault(match.group(1), []).append(entry)
    for etag, orphans in by_etag.items():
        try:
            with blob_lock(repo, etag, timeout=0):
                _adopt(repo, etag, orphans, report)
        except LockBusy:
            continue  # a live download owns them
    return report


def _adopt(repo: RepoLayout, etag: str, orphans: list[Path], report: HousekeepingReport) -> None:
    target = repo.blobs / f"{etag}.incomplete"
    blob_exists = repo.blob_path(etag).exists()

    def size(p: Path) -> int:
        try:
            return p.stat().st_size
        except OSError:
            return -1

    best = max(orphans, key=size)
    if not blob_exists and size(best) > max(size(target), 0):
        os.replace(best, target)
        report.adopted.append(str(target))
        orphans = [o for o in orphans if o != best]
    for o in orphans:
        with contextlib.suppress(FileNotFoundError):
            o.unlink()
            report.removed.append(str(o))
    if blob_exists:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
            report.removed.append(str(target))


def clean_no_exist(
    repo: RepoLayout,
    commit: str | None = None,
    files: Collection[str] | None = None,
    report: HousekeepingReport | None = None,
) -> HousekeepingReport:
    """Remove ``.no_exist`` entries of ``commit`` naming paths in ``files``, and dead commits'
    (their ``.no_exist/{commit}`` and their ``.cmh/trees/{commit}.json``)."""
    report = report if report is not None else HousekeepingReport()
    base = repo.no_exist
    own_trees = repo.cmh_dir / "trees"
    if not base.is_dir() and not own_trees.is_dir():
        return report
    if commit is not None and files is not None:
        folder = base / commit
        for path in files:
            entry = folder.joinpath(*path.split("/"))
            if entry.is_file():
                with contextlib.suppress(OSError):
                    entry.unlink()
                    report.removed.append(str(entry))
    live = set(repo.commits()) | set(repo.refs_by_name().values()) | {commit}
    for folder in base.iterdir() if base.is_dir() else ():
        if COMMIT_RE.match(folder.name) and folder.name not in live and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            report.removed.append(str(folder))
    for listing in own_trees.iterdir() if own_trees.is_dir() else ():
        commit = listing.name.removesuffix(".json")
        if listing.name.endswith(".json") and COMMIT_RE.match(commit) and commit not in live:
            with contextlib.suppress(OSError):
                listing.unlink()
                report.removed.append(str(listing))
    return report
