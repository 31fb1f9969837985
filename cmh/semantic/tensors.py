"""``weights`` and ``graph`` of a set of safetensors files, from their headers.

``weights`` is the v1 directory identity of the format spec. A stamped file
whose SHA-256 manifest agrees with its record contributes its manifest
digests, so no tensor byte is read; any other file is hashed.
``graph`` hashes the same tensor entries without any digest: names, dtypes
and shapes only.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..checkpoint import Checkpoint, claimed_digests, index_problems
from ..digests import RootEntry, directory_root, hash_tensors, root_entries
from ..errors import InvalidFileError
from ..header import Header, TensorEntry, read_header

GRAPH_DOMAIN = b"CMH-SEM-GRAPH-v1\n"


@dataclass(frozen=True)
class TensorSummary:
    """What the tensors of a checkpoint contribute to a fingerprint."""

    weights: str
    graph: str
    tensor_count: int
    tensor_bytes: int
    hashed_files: tuple[str, ...]


def graph_hash(tensors: Iterable[TensorEntry]) -> str:
    """SHA-256 over every tensor's name, dtype and shape, sorted by UTF-8 name bytes."""
    encoded = sorted(((t.name.encode(), t) for t in tensors), key=lambda pair: pair[0])
    h = hashlib.sha256(GRAPH_DOMAIN)
    h.update(struct.pack("<Q", len(encoded)))
    for name, t in encoded:
        dtype = t.dtype.encode()
        h.update(struct.pack("<I", len(name)) + name)
        h.update(struct.pack("<I", len(dtype)) + dtype)
        h.update(struct.pack("<I", len(t.shape)) + b"".join(struct.pack("<Q", d) for d in t.shape))
    return h.hexdigest()


def summarize(
    files: Mapping[str, str | os.PathLike[str]],
    weight_map: Mapping[str, str] | None = None,
    *,
    threads: int | None = None,
    source: str | None = None,
) -> TensorSummary:
    """Read the headers of ``files`` (name -> path) and derive ``weights`` and ``graph``.

    ``weight_map`` is the index's tensor -> file map, checked against the shards.
    """
    headers: dict[str, Header] = {name: read_header(path) for name, path in sorted(files.items())}
    checkpoint = Checkpoint("", tuple(headers), None, dict(weight_map) if weight_map else None)
    problems = index_problems(checkpoint, headers)
    if problems:
        raise InvalidFileError("; ".join(problems[:5]), source)
    entries: list[RootEntry] = []
    hashed: list[str] = []
    for name, header in headers.items():
        digests = claimed_digests(header)
        if digests is None:
            hashed.append(name)
            computed = hash_tensors(files[name], header, threads=threads)
            digests = [d.sha256 for d in computed if d.sha256 is not None]
        entries.extend(root_entries(header.tensors, digests))
    all_tensors = [t for h in headers.values() for t in h.tensors]
    return TensorSummary(
        weights=directory_root(entries).hex(),
        graph=graph_hash(all_tensors),
        tensor_count=len(all_tensors),
        tensor_bytes=sum(t.nbytes for t in all_tensors),
        hashed_files=tuple(hashed),
    )
