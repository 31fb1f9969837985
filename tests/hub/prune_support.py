"""Build caches in the stock layout for the prune tests: real files, real links, chosen times.

``CacheBuilder(root).revision(repo, files, ref="main", fetched=t)`` writes the
blobs (named as the Hub names them: SHA-256 for ``*.safetensors``, git blob
SHA-1 otherwise), links a snapshot to them, points a ref at it and sets the
modification times a cache would have after a fetch at ``t``.
``stamped_weights(seed, ttl, stamped_at)`` gives the bytes of a safetensors
file stamped by :func:`cmh.stamp` with that lifetime.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from cmh.hub.cache import RepoLayout
from safetensors.numpy import save_file

import cmh

#: The tests' clock: now, so that a real prune judges the built cache as the plan does.
NOW = float(int(time.time()))
DAY = 86400.0


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def etag_for(path: str, data: bytes) -> str:
    if path.endswith(".safetensors"):
        return hashlib.sha256(data).hexdigest()
    return git_blob_sha1(data)


def weights(seed: int, *, ttl: float | None = None, stamped_at: float = NOW - DAY) -> bytes:
    """A small safetensors file; stamped with lifetime ``ttl`` seconds when given."""
    rng = np.random.default_rng(seed)
    tensors = {
        "a.weight": rng.standard_normal((8, 16)).astype(np.float32),
        "b.bias": rng.standard_normal(16).astype(np.float32),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        save_file(tensors, str(path), {"format": "np"})
        if ttl is not None:
            cmh.stamp(path, ttl=int(ttl), now=stamped_at)
        return path.read_bytes()


def fake_commit(label: str) -> str:
    return hashlib.sha1(label.encode()).hexdigest()


class CacheBuilder:
    """Write repos into ``root`` in the stock cache layout."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def layout(self, repo_id: str, repo_type: str = "model") -> RepoLayout:
        return RepoLayout(self.root, repo_id, repo_type)

    def blob(self, repo_id: str, relpath: str, data: bytes, *, mtime: float = NOW - DAY) -> str:
        layout = self.layout(repo_id)
        etag = etag_for(relpath, data)
        path = layout.blob_path(etag)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_bytes(data)
        os.utime(path, (mtime, mtime))
        return etag

    def revision(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        commit: str | None = None,
        ref: str | None = "main",
        fetched: float = NOW - DAY,
        used: float | None = None,
    ) -> str:
        """A complete snapshot of ``files``; ``ref`` (if any) names it. Returns the commit."""
        layout = self.layout(repo_id)
        commit = commit or fake_commit(f"{repo_id}:{sorted(files.items())!r}:{fetched}")
        for relpath, data in files.items():
            etag = self.blob(repo_id, relpath, data, mtime=fetched)
            layout.link_snapshot_file(commit, relpath, etag)
        snap = layout.snapshot_dir(commit)
        for dirpath, _, _ in os.walk(snap):
            os.utime(dirpath, (fetched, fetched))
        if ref is not None:
            self.ref(repo_id, ref, commit, mtime=fetched)
        if used is not None:
            record = layout.cmh_dir / "used" / commit
            record.parent.mkdir(parents=True, exist_ok=True)
            record.touch()
            os.utime(record, (used, used))
        return commit

    def ref(self, repo_id: str, name: str, commit: str, *, mtime: float = NOW - DAY) -> Path:
        layout = self.layout(repo_id)
        layout.write_ref(name, commit)
        path = layout.ref_path(name)
        os.utime(path, (mtime, mtime))
        return path

    def file(self, rel: str, data: bytes = b"", *, mtime: float = NOW - DAY) -> Path:
        """Any file under the root (a partial download, a stray, a lock...)."""
        path = self.root / rel
        created = [d for d in path.relative_to(self.root).parents if not (self.root / d).exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        for d in [path, *(self.root / d for d in created)]:  # as old as what they hold
            os.utime(d, (mtime, mtime))
        return path


def tree_state(root: Path) -> dict[str, tuple[str, str | int]]:
    """Every path under ``root`` with its kind and link target or size (to compare trees)."""
    out: dict[str, tuple[str, str | int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", 0)
            else:
                out[rel] = ("file", p.stat().st_size)
    return out


def stock_warnings(root: Path) -> list[str]:
    """The stock scanner's warnings, as text."""
    from huggingface_hub import scan_cache_dir

    return sorted(str(w) for w in scan_cache_dir(root).warnings)


def stock_revisions(root: Path) -> dict[str, set[str]]:
    """Repo id -> commits the stock scanner sees."""
    from huggingface_hub import scan_cache_dir

    return {r.repo_id: {rev.commit_hash for rev in r.revisions} for r in scan_cache_dir(root).repos}


def open_kind(request: Any, tmp_path: Path, monkeypatch: Any, folder_kind: str) -> tuple[str, Any]:
    """The ``--store`` location and the opened (created) store of the kind
    ``request.param`` names: ``folder_kind`` for a folder, else a bucket fixture's name
    without ``_bucket`` (``seaweed``, ``moto``, ``ministack``), this process's AWS
    settings pointed at it."""
    from bucket_support import use_bucket
    from cmh.hub.mirror.stores import open_store

    if request.param == folder_kind:
        location = str(tmp_path / "store")
    else:
        bucket = request.getfixturevalue(f"{request.param}_bucket")
        use_bucket(bucket, tmp_path, monkeypatch)
        location = bucket.url
    store = open_store(location if location.startswith("s3://") else Path(location))
    store.create()
    return location, store
