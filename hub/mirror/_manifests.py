"""Tensor manifests for every safetensors blob a mirror stores, stamped or not.

The mirror computes, for each ``*.safetensors`` blob, the SHA-256 of every
tensor's bytes and the file's v1 fingerprint root (``cmh.file_root``,
the root a CMH record would carry), keeps them in
``{repo}/.cmh/manifests/{etag}.json`` and serves them on
``GET /api/cmh/manifest/{repo}/{revision}/{path}`` (``spec/hub-mirror.md``,
2.9). A resolver whose Hub is a cmh mirror uses them to update an unstamped
file tensor by tensor; the assembled file is still checked whole against its
SHA-256 ETag, so a manifest only ever decides what to fetch, never what is
accepted.

A manifest is computed once per blob (a blob's bytes never change under its
name) and written atomically; one computed from a blob that changed while it
was read is not kept.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from cmh.hub.cache import UNREADABLE_HEADER, RepoLayout, blob_matches

from cmh import (
    CMHError,
    FileVersion,
    atomic_write,
    claimed_digests,
    file_root,
    hash_tensors,
    read_carrier,
    read_header,
    record_check,
    root_entries,
    user_metadata,
)

SCHEMA = "cmh-tensor-manifest/1"


class ManifestError(ValueError):
    """The blob is not a usable safetensors file (its header cannot be read)."""


def manifest_path(repo: RepoLayout, etag: str) -> Path:
    """Where the manifest of blob ``etag`` is kept."""
    repo.blob_path(etag)  # validates the name
    return repo.cmh_dir / "manifests" / f"{etag}.json"


def compute(blob: Path, etag: str) -> dict[str, Any]:
    """The manifest document of one safetensors blob (hashes every tensor)."""
    before = os.stat(blob)
    if not blob_matches(blob, etag, before.st_size):
        raise ManifestError("the blob does not hash to its name")
    try:
        header = read_header(blob)
    except UNREADABLE_HEADER as exc:
        raise ManifestError(f"not a usable safetensors file: {exc}") from None
    digests = hash_tensors(blob, header)
    sha = [d.sha256 for d in digests]
    if any(d is None for d in sha):
        raise ManifestError("a tensor could not be hashed")
    checked = [d for d in sha if d is not None]
    root = file_root(root_entries(header.tensors, checked), user_metadata(header.metadata))
    after = os.stat(blob)
    if (before.st_ino, before.st_size, before.st_mtime_ns) != (
        after.st_ino,
        after.st_size,
        after.st_mtime_ns,
    ):
        raise ManifestError("the blob changed while it was read")
    _record_stamp_check(blob, header, checked, root, before)
    return {
        "schema": SCHEMA,
        "etag": etag,
        "size": header.file_size,
        "header_size": header.header_size,
        "root": root.hex(),
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "begin": t.begin,
                "end": t.end,
                "sha256": d.hex(),
            }
            for t, d in zip(header.tensors, checked, strict=True)
        ],
    }


def _record_stamp_check(
    blob: Path, header: Any, digests: list[bytes], root: bytes, before: os.stat_result
) -> None:
    """A stamped blob whose every tensor and root were just found to match its stamp gets
    the stamp's check record (:mod:`cmh._checks`): fingerprints then read its header only."""
    with contextlib.suppress(CMHError, OSError):
        carrier = read_carrier(header.metadata, len(header.tensors))
        if carrier is None or carrier.record.fingerprint != root:
            return
        if claimed_digests(header) != digests:
            return
        if FileVersion.of(os.stat(blob)) == FileVersion.of(before):
            record_check(blob, root)


def load_or_compute(repo: RepoLayout, etag: str, blob: Path) -> dict[str, Any]:
    """The kept manifest of ``etag``, computed and kept first if there is none."""
    path = manifest_path(repo, etag)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA and doc.get("etag") == etag:
            return doc
    except (OSError, ValueError):
        pass
    doc = compute(blob, etag)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(doc, separators=(",", ":")).encode())
    return doc


def keep_for(repo: RepoLayout, etag: str, relpath: str) -> None:
    """Compute and keep the manifest of a stored ``*.safetensors`` blob (others: nothing).

    Called when a blob enters the store (import, pull-through fill); a blob
    that is not a usable safetensors file gets no manifest.
    """
    if not relpath.endswith(".safetensors") or len(etag) != 64:
        return
    blob = repo.blob_path(etag)
    if not blob.is_file():
        return
    with contextlib.suppress(ManifestError, OSError):  # then the endpoint answers 422 for it
        load_or_compute(repo, etag, blob)
