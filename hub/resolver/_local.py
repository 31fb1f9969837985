"""What the local cache holds for one repo: snapshots, tree listings, validations.

Reads and writes only files of the stock layout (``trees/{commit}.json`` in
the stock client's own format) and cmh's bookkeeping under ``{repo}/.cmh/``:
``validated/{revision}.json`` records when a revision was last confirmed
against the Hub and which commit it named (the last known good snapshot).

The stock client writes ``trees/{commit}.json`` only from ``snapshot_download``
(a later offline ``snapshot_download`` trusts it to say which files the snapshot
lacks). A resolve for one file (``hf_hub_download`` under ``install()``) keeps
its listing under ``.cmh/trees/{commit}.json`` instead (:func:`one_file_listing`),
so the stock layout holds what a stock-filled cache would hold.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from cmh.hub.cache import COMMIT_RE, UNREADABLE_HEADER, LayoutError, RepoLayout

from cmh import atomic_write, read_carrier, read_header

from ._types import RemoteFile

TREE_FORMAT_VERSION = 1


def select(paths: Iterable[str], allow_patterns: Sequence[str] | str | None) -> list[str]:
    """Paths matching any pattern (``fnmatch``, a trailing ``/`` means the folder), sorted."""
    if allow_patterns is None:
        return sorted(paths)
    patterns = [allow_patterns] if isinstance(allow_patterns, str) else list(allow_patterns)
    patterns = [p + "*" if p.endswith("/") else p for p in patterns]
    return sorted(p for p in paths if any(fnmatch.fnmatch(p, pat) for pat in patterns))


@dataclass(frozen=True)
class LocalEntry:
    """One file of a commit as recorded in the local tree listing."""

    path: str
    size: int
    etag: str
    #: The git object id the listing gives (an LFS file's is not its ``etag``, the SHA-256).
    blob_id: str = ""
    #: Listed with an LFS pointer (``lfs_sha256``).
    lfs: bool = False


#: False while a resolve brings one file for ``hf_hub_download``: its listing is cmh's own.
_stock_listing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cmh_stock_listing", default=True
)


@contextlib.contextmanager
def one_file_listing() -> Iterator[None]:
    """Within: listings are written under ``.cmh/trees/``, not where the stock client
    reads them (stock writes ``trees/`` from ``snapshot_download`` only)."""
    token = _stock_listing.set(False)
    try:
        yield
    finally:
        _stock_listing.reset(token)


def _own_tree(repo: RepoLayout, commit: str) -> Path:
    return repo.cmh_dir / "trees" / f"{commit}.json"


def read_tree(repo: RepoLayout, commit: str) -> dict[str, LocalEntry] | None:
    """The listing of ``commit``: the stock ``trees/{commit}.json``, else cmh's own copy
    (``.cmh/trees/``); ``None`` if neither is there and readable."""
    if not COMMIT_RE.match(commit):
        return None
    stock = _read_tree_file(repo.trees / f"{commit}.json")
    return stock if stock is not None else _read_tree_file(_own_tree(repo, commit))


def _read_tree_file(listing: Path) -> dict[str, LocalEntry] | None:
    try:
        data = json.loads(listing.read_text(encoding="utf-8"))
        if data.get("format_version") != TREE_FORMAT_VERSION:
            return None
        out: dict[str, LocalEntry] = {}
        for path, info in data["files"].items():
            lfs = bool(info.get("lfs_sha256"))
            etag = info.get("lfs_sha256") or info["blob_id"]
            size = info.get("lfs_size") if lfs else info["size"]
            blob_id = info["blob_id"]
            if not all(isinstance(v, str) for v in (etag, blob_id)) or not isinstance(size, int):
                return None
            out[path] = LocalEntry(path, size, etag, blob_id, lfs)
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_tree(
    repo: RepoLayout, commit: str, files: dict[str, RemoteFile], *, replace: bool = False
) -> None:
    """Write the listing of ``commit`` atomically (kept if present, unless ``replace``):
    the stock ``trees/{commit}.json``, or cmh's own within :func:`one_file_listing`."""
    stock = _stock_listing.get()
    path = repo.trees / f"{commit}.json" if stock else _own_tree(repo, commit)
    if not replace and _read_tree_file(path) is not None:
        return
    data = {
        "format_version": TREE_FORMAT_VERSION,
        "files": {p: files[p].tree_entry() for p in sorted(files)},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1).encode())


def discard_tree(repo: RepoLayout, commit: str) -> None:
    """Forget the cached listing of ``commit`` (it led to a failed check: fetch it again)."""
    if COMMIT_RE.match(commit):
        for path in (repo.trees / f"{commit}.json", _own_tree(repo, commit)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def remote_files_from_tree(entries: dict[str, LocalEntry]) -> dict[str, RemoteFile]:
    """A cached listing seen as remote files (a commit's listing never changes)."""
    return {
        p: RemoteFile(p, e.size, e.etag, e.lfs, e.blob_id or e.etag) for p, e in entries.items()
    }


def publish_tree(repo: RepoLayout, commit: str) -> None:
    """Write the stock ``trees/{commit}.json`` from cmh's own listing of ``commit`` when
    only that one is there (a ``snapshot_download`` answered from the cache: stock's, online,
    writes the listing it asked; a commit's listing never changes). Best effort."""
    if not COMMIT_RE.match(commit) or _read_tree_file(repo.trees / f"{commit}.json") is not None:
        return
    own = _read_tree_file(_own_tree(repo, commit))
    if own is None:
        return
    token = _stock_listing.set(True)
    try:
        with contextlib.suppress(OSError):
            write_tree(repo, commit, remote_files_from_tree(own))
    finally:
        _stock_listing.reset(token)


def hub_said_absent(repo: RepoLayout, commit: str, path: str) -> bool:
    """The Hub answered ``EntryNotFound`` for ``path`` at ``commit`` (its ``.no_exist``
    marker, written by the stock client or by cmh from a Hub answer; a commit's files
    never change)."""
    try:
        return (repo.no_exist / commit / path).is_file()
    except (OSError, LayoutError):
        return False


def linked_etag(repo: RepoLayout, commit: str, path: str) -> str | None:
    """The blob a snapshot file links to, if it is a link into ``blobs/``."""
    try:
        link = repo.snapshot_file(commit, path)
        target = os.readlink(link)
    except (OSError, LayoutError):
        return None
    name = os.path.basename(target)
    try:
        repo.blob_path(name)
    except LayoutError:
        return None
    return name


def find_old_version(repo: RepoLayout, path: str, prefer: Sequence[str]) -> str | None:
    """An etag of some cached version of ``path``: preferred commits first, then newest."""
    seen: list[str] = [c for c in prefer if c]
    others = sorted(
        (c for c in repo.commits() if c not in seen),
        key=lambda c: _mtime(repo.snapshot_dir(c)),
        reverse=True,
    )
    for commit in [*seen, *others]:
        etag = linked_etag(repo, commit, path)
        if etag is not None and repo.blob_path(etag).is_file():
            return etag
    return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# -- validation records -------------------------------------------------------------------


@dataclass(frozen=True)
class Validation:
    """The last time ``revision`` was confirmed against the Hub, and its commit then."""

    commit: str
    at: float


def _validation_path(repo: RepoLayout, revision: str) -> Path:
    return repo.cmh_dir / "validated" / (quote(revision, safe="") + ".json")


def read_validation(repo: RepoLayout, revision: str) -> Validation | None:
    try:
        data = json.loads(_validation_path(repo, revision).read_text())
        commit, at = data["commit"], float(data["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Validation(commit, at) if isinstance(commit, str) and COMMIT_RE.match(commit) else None


def write_validation(repo: RepoLayout, revision: str, commit: str, *, at: float) -> None:
    """Record that the Hub named ``commit`` for ``revision`` at ``at`` (the caller's clock)."""
    path = _validation_path(repo, revision)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"commit": commit, "at": at}).encode())


# -- freshness ----------------------------------------------------------------------------


def stamped_expiry(path: Path) -> int | None:
    """``expires_at`` of a stamped safetensors file (0 = never), ``None`` if unstamped."""
    try:
        header = read_header(path)
        carrier = read_carrier(header.metadata, len(header.tensors))
    except UNREADABLE_HEADER:
        return None
    return None if carrier is None else carrier.record.expires_at


def snapshot_expiry(
    repo: RepoLayout,
    commit: str,
    paths: Sequence[str],
    *,
    validated_at: float | None,
    default_lifetime: float,
) -> float:
    """When the snapshot's selection goes stale (``inf`` = never).

    Each selected ``*.safetensors`` file contributes its CMH ``expires_at``
    (0 = never) when stamped, else ``validated_at + default_lifetime``; a
    selection without safetensors files contributes the latter once. The
    snapshot expires at the smallest contribution. Unvalidated means expired.
    """
    unstamped_expiry = (
        float("-inf") if validated_at is None else validated_at + max(0.0, default_lifetime)
    )
    weights = [p for p in paths if p.endswith(".safetensors")]
    if not weights:
        return unstamped_expiry
    expiry = float("inf")
    for p in weights:
        stamped = stamped_expiry(repo.snapshot_file(commit, p))
        if stamped is None:
            expiry = min(expiry, unstamped_expiry)
        elif stamped != 0:
            expiry = min(expiry, float(stamped))
    return expiry
