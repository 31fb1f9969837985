"""The Hub's JSON documents of a commit: repo info, tree entries and listings, paging cursors.

Pure functions of a :class:`~cmh.hub.mirror._index.CommitIndex` (no I/O, no
aiohttp): :mod:`cmh.hub.mirror._app` sends what they build.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime, timezone
from typing import Any

from ._index import CommitIndex


class BadCursor(ValueError):
    """A ``cursor`` query value that this listing did not hand out."""


def iso(ts: float) -> str:
    """A timestamp as the Hub writes it (``2024-01-31T12:00:00.000Z``)."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def repo_info(
    repo_type: str, repo_id: str, index: CommitIndex, *, private: bool, blobs: bool
) -> dict[str, Any]:
    """``GET /api/{type}s/{repo}/revision/{rev}``: siblings, sizes and blob ids if ``blobs``."""
    siblings: list[dict[str, Any]] = []
    for entry in index.files.values():
        sibling: dict[str, Any] = {"rfilename": entry.path}
        if blobs:
            sibling["size"] = entry.size
            sibling["blobId"] = entry.oid
            if entry.lfs_sha256:
                sibling["lfs"] = {
                    "sha256": entry.lfs_sha256,
                    "size": entry.size,
                    "pointerSize": entry.pointer_size,
                }
        siblings.append(sibling)
    author = repo_id.split("/")[0] if "/" in repo_id else None
    body: dict[str, Any] = {
        "_id": index.commit[:24],
        "id": repo_id,
        "author": author,
        "sha": index.commit,
        "lastModified": iso(index.last_modified),
        "createdAt": iso(index.last_modified),
        "private": private,
        "disabled": False,
        "gated": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
        "usedStorage": index.total_size,
    }
    if repo_type == "model":
        body["modelId"] = repo_id
    return body


def tree_entry(index: CommitIndex, path: str) -> dict[str, Any]:
    """One entry of a tree listing or a paths-info answer (a file or a folder)."""
    entry = index.files.get(path)
    if entry is None:
        return {"type": "directory", "oid": index.dir_oids[path], "size": 0, "path": path}
    out: dict[str, Any] = {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
    if entry.lfs_sha256:
        out["lfs"] = {
            "oid": entry.lfs_sha256,
            "size": entry.size,
            "pointerSize": entry.pointer_size,
        }
    return out


def children(index: CommitIndex, directory: str, recursive: bool) -> list[str]:
    """Paths under ``directory``, in the Hub's order (folders first unless ``recursive``)."""
    prefix = f"{directory}/" if directory else ""
    names = [p for p in index.dir_oids if p and p.startswith(prefix)]
    names += [p for p in index.files if p.startswith(prefix)]
    if not recursive:
        names = [p for p in names if "/" not in p[len(prefix) :]]
    dirs = sorted(p for p in names if p in index.dir_oids)
    files = sorted(p for p in names if p not in index.dir_oids)
    return dirs + files if not recursive else sorted(names)


def encode_cursor(commit: str, offset: int) -> str:
    """The opaque ``cursor`` of the page starting at ``offset`` of a listing of ``commit``."""
    return base64.urlsafe_b64encode(f"{commit}:{offset}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str, commit: str) -> int:
    """The offset a cursor names; :class:`BadCursor` unless it belongs to ``commit``'s listing."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, offset = raw.partition(":")
        value = int(offset)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadCursor("invalid cursor") from None
    if at != commit or value < 0:
        raise BadCursor("cursor does not belong to this listing")
    return value
