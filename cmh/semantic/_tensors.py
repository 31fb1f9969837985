"""``weights`` and ``graph`` of a set of safetensors files, from their headers.

``weights`` is the v1 directory identity of the format spec. A stamped file
contributes its manifest digests, so no tensor byte is read, only while there
is a check record of this file version (:func:`stamp_trust`);
any other file is hashed.
``graph`` hashes the same tensor entries without any digest: names, dtypes
and shapes only.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._carrier import read_carrier
from .._checkpoint import Checkpoint, claimed_digests, index_problems
from .._checks import checked_fingerprint
from .._digests import RootEntry, directory_root, hash_tensors, root_entries
from .._errors import CMHError, InvalidFileError
from .._header import Header, TensorEntry, read_header

NS = 1_000_000_000

GRAPH_DOMAIN = b"CMH-SEM-GRAPH-v1\n"


@dataclass(frozen=True)
class TensorSummary:
    """What the tensors of a checkpoint contribute to a fingerprint."""

    weights: str
    graph: str
    tensor_count: int
    tensor_bytes: int
    hashed_files: tuple[str, ...]
    #: Stamped files that were hashed anyway, each with the reason its stamp was not trusted.
    untrusted_stamps: tuple[tuple[str, str], ...] = ()
    #: The dtype transformers takes from the weights when nothing else names one: that of
    #: the first file's first floating tensor (:func:`weights_dtype`).
    first_file_dtype: str = "float32"


#: safetensors dtype names as torch names them (``config.json``'s ``dtype`` spelling).
TORCH_DTYPE_NAMES: dict[str, str] = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}  # fmt: skip
#: The floating dtypes transformers may make the model's dtype (``get_state_dict_dtype``
#: skips float8 and float4 tensors: torch cannot build a model in them).
LOADABLE_FLOAT_DTYPES: frozenset[str] = frozenset({"F16", "BF16", "F32", "F64"})


def weights_dtype(tensors: Iterable[TensorEntry]) -> str:
    """The dtype transformers (``dtype="auto"``) derives from one checkpoint file.

    Its tensors in the order ``safe_open(...).keys()`` gives them (UTF-8 bytes of the
    name), the first whose dtype is floating and not float8/float4; else the first
    tensor's; ``float32`` for a file without tensors. Torch's name (``bfloat16``); a dtype
    torch has no name for keeps the header's.
    """
    ordered = sorted(tensors, key=lambda t: t.name.encode())
    chosen = next((t for t in ordered if t.dtype in LOADABLE_FLOAT_DTYPES), None)
    if chosen is None and ordered:
        chosen = ordered[0]
    return "float32" if chosen is None else TORCH_DTYPE_NAMES.get(chosen.dtype, chosen.dtype)


@dataclass(frozen=True)
class StampTrust:
    """Whether a file's stamp may stand for its bytes: the digests, else why not."""

    digests: list[bytes] | None
    reason: str | None


def stamp_trust(path: str | os.PathLike[str], header: Header, now: float) -> StampTrust:
    """The manifest digests of a stamped file, when its stamp may be taken as its identity.

    The rule (``spec/semantic.md`` 2.1): the file is stamped with a SHA-256
    manifest that agrees with its record, the record has not expired at
    ``now``, and a check record (:mod:`cmh._checks`) says that this very version
    of the file (device, inode, size, mtime and ctime) was hashed and found to
    match the stamp with this record fingerprint. Otherwise ``digests`` is
    ``None``: ``reason`` says why, or is ``None`` for an unstamped file.
    """
    try:
        carrier = read_carrier(header.metadata, len(header.tensors))
    except CMHError as exc:
        return StampTrust(None, f"unreadable stamp: {exc}")
    if carrier is None:
        return StampTrust(None, None)
    if carrier.sha256 is None:
        return StampTrust(None, "stamp has no SHA-256 manifest")
    digests = claimed_digests(header)
    if digests is None:
        return StampTrust(None, "the manifest does not agree with the record")
    record = carrier.record
    if record.is_expired(now):
        return StampTrust(None, f"stamp expired at Unix time {record.expires_at}")
    checked, why = checked_fingerprint(path)
    if checked is None:
        return StampTrust(None, why)
    if checked != record.fingerprint:
        return StampTrust(None, "the check record is of another stamp")
    return StampTrust(digests, None)


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
    now = time.time()
    headers: dict[str, Header] = {name: read_header(path) for name, path in sorted(files.items())}
    checkpoint = Checkpoint("", tuple(headers), None, dict(weight_map) if weight_map else None)
    problems = index_problems(checkpoint, headers)
    if problems:
        raise InvalidFileError("; ".join(problems[:5]), source)
    entries: list[RootEntry] = []
    hashed: list[str] = []
    untrusted: list[tuple[str, str]] = []
    for name, header in headers.items():
        trust = stamp_trust(files[name], header, now)
        digests = trust.digests
        if trust.reason is not None:
            untrusted.append((name, trust.reason))
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
        untrusted_stamps=tuple(untrusted),
        first_file_dtype=weights_dtype(headers[min(headers)].tensors) if headers else "float32",
    )
