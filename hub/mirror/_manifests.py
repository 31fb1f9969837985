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
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cmh.hub.cache import UNREADABLE_HEADER, RepoLayout, blob_matches, new_digest

from cmh import (
    MAX_HEADER_SIZE,
    CMHError,
    FileVersion,
    Header,
    atomic_write,
    claimed_digests,
    file_root,
    hash_tensors,
    header_size_from_prefix,
    parse_header,
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
    return _document(etag, header, checked, root)


def compute_streamed(chunks: Iterable[bytes], etag: str, size: int) -> dict[str, Any]:
    """The manifest document of a blob read once, in order, as ``chunks`` (a storage's
    stream): no local copy. Every tensor is hashed as its bytes pass, and the whole body
    against the blob's name; :class:`ManifestError` unless both hold."""
    whole = new_digest(etag, size)
    head = bytearray()
    header: Header | None = None
    hashes: list[Any] = []  # one per tensor, in the header's order
    spans: list[tuple[int, int, Any]] = []  # (start, end, hash) of each tensor with bytes
    at = 0  # bytes of the blob seen
    for chunk in chunks:
        whole.update(chunk)
        view = memoryview(chunk)
        if header is None:
            head += view
            header = _complete_header(head, size)
            if header is None:
                at += len(view)
                continue
            hashes = [hashlib.sha256() for _ in header.tensors]
            base = header.data_start
            spans = sorted(
                (base + t.begin, base + t.end, h)
                for t, h in zip(header.tensors, hashes, strict=True)
                if t.end > t.begin
            )
            spans.reverse()  # taken from the end as the stream reaches each
            view = view[len(view) - (len(head) - base) :]
            at = base
        while view and spans:
            _, end, digest = spans[-1]
            take = min(len(view), end - at)  # the spans cover the body without holes
            digest.update(view[:take])
            view, at = view[take:], at + take
            if at == end:
                spans.pop()
        at += len(view)
    if header is None or at != size or whole.hexdigest() != etag:
        raise ManifestError("the blob does not hash to its name")
    digests = [h.digest() for h in hashes]
    root = file_root(root_entries(header.tensors, digests), user_metadata(header.metadata))
    return _document(etag, header, digests, root)


def _complete_header(head: bytearray, size: int) -> Header | None:
    """The header once ``head`` holds all of it, else ``None``."""
    if len(head) < 8:
        return None
    try:
        length = header_size_from_prefix(bytes(head[:8]))
        if length > MAX_HEADER_SIZE:  # never held whole: refused now
            raise ManifestError(f"header length {length} exceeds the format's limit")
        if len(head) < 8 + length:
            return None
        return parse_header(bytes(head[8 : 8 + length]), size)
    except UNREADABLE_HEADER as exc:
        raise ManifestError(f"not a usable safetensors file: {exc}") from None


def _document(etag: str, header: Header, digests: list[bytes], root: bytes) -> dict[str, Any]:
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
            for t, d in zip(header.tensors, digests, strict=True)
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


def vouched_root(doc: Any, etag: str, header: Any, unexpired_at: float) -> bytes | None:
    """The record fingerprint of ``header``'s stamp when the kept manifest ``doc`` of blob
    ``etag`` (made by hashing every tensor of that blob) shows the stamp true: the same
    blob and size, every tensor's digest the one the stamp claims, the root the record's,
    and the record unexpired at ``unexpired_at``. ``None`` otherwise (no stamp, another
    blob, a disagreement, an expiry)."""
    with contextlib.suppress(CMHError, TypeError, KeyError, ValueError):
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("etag") != etag:
            return None
        if doc.get("size") != header.file_size:
            return None
        carrier = read_carrier(header.metadata, len(header.tensors))
        claimed = claimed_digests(header)
        if carrier is None or claimed is None:
            return None
        kept = [bytes.fromhex(t["sha256"]) for t in doc["tensors"]]
        if kept != claimed or bytes.fromhex(doc["root"]) != carrier.record.fingerprint:
            return None
        if carrier.record.is_expired(unexpired_at):
            return None
        root: bytes = carrier.record.fingerprint
        return root
    return None
