"""Git object ids as the Hub computes them: blobs, LFS pointers, trees and commits.

The Hub names a small file by its git blob SHA-1 and a large (LFS) file by the
SHA-256 of its content; in tree listings an LFS file's ``oid`` is the git blob
SHA-1 of its pointer file. A store import derives the commit id from the tree
and the parent exactly as git would for a commit with a fixed author and time,
so the same tree on the same parent always gives the same commit.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Mapping

#: Files at least this large are stored as LFS files (the Hub's threshold is 10 MB).
LFS_SIZE_THRESHOLD = 10 * 1000 * 1000

#: Name patterns of the Hub's default ``.gitattributes``: always LFS, whatever the size.
LFS_PATTERNS: tuple[str, ...] = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gguf", "*.gz", "*.h5",
    "*.joblib", "*.lfs.*", "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx",
    "*.ot", "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar",
    "*.safetensors", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip",
    "*.zst", "*tfevents*",
)  # fmt: skip

COMMIT_AUTHOR = "cmh mirror <cmh@localhost> 0 +0000"
COMMIT_MESSAGE = "cmh mirror add\n"


def is_lfs(path: str, size: int) -> bool:
    """True when the Hub would store ``path`` of ``size`` bytes with LFS."""
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_SIZE_THRESHOLD or any(fnmatch.fnmatchcase(name, p) for p in LFS_PATTERNS)


def object_id(kind: str, payload: bytes) -> str:
    """The git object id (SHA-1) of an object of ``kind`` with ``payload``."""
    return hashlib.sha1(f"{kind} {len(payload)}\0".encode() + payload).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file of a content with this SHA-256 and size."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def lfs_pointer_oid(sha256: str, size: int) -> str:
    """The git blob id of the LFS pointer (the ``oid`` of an LFS file in a tree listing)."""
    return object_id("blob", lfs_pointer(sha256, size))


def tree_oids(files: Mapping[str, str]) -> dict[str, str]:
    """Git tree ids of every directory (``""`` is the root) given each file's git blob id."""
    subdirs: dict[str, set[str]] = {"": set()}
    blobs: dict[str, list[tuple[str, str]]] = {}
    for path, oid in files.items():
        head, _, name = path.rpartition("/")
        blobs.setdefault(head, []).append((name, oid))
        while head:
            parent, _, dirname = head.rpartition("/")
            subdirs.setdefault(head, set())
            siblings = subdirs.setdefault(parent, set())
            if dirname in siblings:
                break
            siblings.add(dirname)
            head = parent
    oids: dict[str, str] = {}
    for directory in sorted(subdirs, key=lambda d: d.count("/") + 1 if d else 0, reverse=True):
        prefix = f"{directory}/" if directory else ""
        entries = [
            (n.encode() + b"/", b"40000 " + n.encode(), oids[prefix + n])
            for n in subdirs[directory]
        ]
        entries += [
            (n.encode(), b"100644 " + n.encode(), oid) for n, oid in blobs.get(directory, [])
        ]
        entries.sort(key=lambda e: e[0])
        payload = b"".join(mode_name + b"\0" + bytes.fromhex(oid) for _, mode_name, oid in entries)
        oids[directory] = object_id("tree", payload)
    return oids


def commit_oid(tree: str, parents: Iterable[str] = ()) -> str:
    """The id of a commit of ``tree`` on ``parents`` with cmh's fixed author, time and message."""
    lines = [f"tree {tree}", *(f"parent {p}" for p in parents)]
    lines += [f"author {COMMIT_AUTHOR}", f"committer {COMMIT_AUTHOR}", "", COMMIT_MESSAGE]
    return object_id("commit", "\n".join(lines).encode())
