"""Writing a stamped safetensors file in one pass (``save_file``-style).

The digests come from tensors already in memory, so the file is written once,
through a temporary file beside the target and an atomic rename: the tensor
bytes go to disk while they are hashed (the header's size does not depend on
the digests), then the header is written with its record and manifests.
numpy and torch are never imported here: tensors are read through their
``dtype``, ``shape`` and buffer.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import xxhash
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ._atomic import atomic_file
from ._carrier import carrier_values, is_reserved
from ._digests import DEFAULT_HASHING, Hashing, RootEntry, default_threads, file_root
from ._duration import TTL, ttl_seconds
from ._errors import CMHError, StampError
from ._header import DTYPE_BITS, METADATA_KEY, PREFIX_SIZE, TensorSpec
from ._record import FLAG_SHA256, FLAG_SIGNED, FLAG_XXH3, Record
from ._signing import key_id, sign_record
from ._stamping import record_own_stamp, set_mtime_to_stamp

_NUMPY_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "float16": "F16", "int32": "I32", "uint32": "U32", "float32": "F32", "float64": "F64",
    "int64": "I64", "uint64": "U64", "complex64": "C64",
}  # fmt: skip
_TORCH_DTYPES = {
    "torch.bool": "BOOL", "torch.uint8": "U8", "torch.int8": "I8", "torch.int16": "I16",
    "torch.uint16": "U16", "torch.float16": "F16", "torch.bfloat16": "BF16",
    "torch.int32": "I32", "torch.uint32": "U32", "torch.float32": "F32",
    "torch.float64": "F64", "torch.int64": "I64", "torch.uint64": "U64",
    "torch.complex64": "C64", "torch.float8_e5m2": "F8_E5M2", "torch.float8_e4m3fn": "F8_E4M3",
}  # fmt: skip


@dataclass(frozen=True)
class _Tensor(TensorSpec):
    data: memoryview


def _as_tensor(name: str, value: Any) -> _Tensor:
    """The dtype name, shape and little-endian bytes of a numpy array or torch tensor."""
    dtype = str(getattr(value, "dtype", ""))
    shape = tuple(int(d) for d in getattr(value, "shape", ()))
    if dtype in _TORCH_DTYPES:
        import torch  # only reached for torch tensors

        flat = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        return _Tensor(name, _TORCH_DTYPES[dtype], shape, memoryview(flat.numpy()).cast("B"))
    numpy_name = getattr(getattr(value, "dtype", None), "name", None)
    if numpy_name in _NUMPY_DTYPES and hasattr(value, "astype"):
        array = value.astype(value.dtype.newbyteorder("<"), order="C", copy=False)
        data = memoryview(array.reshape(-1)).cast("B")
        return _Tensor(name, _NUMPY_DTYPES[numpy_name], shape, data)
    raise CMHError(f"tensor {name!r}: unsupported type {type(value).__name__} with dtype {dtype!r}")


@dataclass(frozen=True)
class SaveResult:
    """What :func:`save_file` wrote."""

    path: str
    record: Record
    signer_key_id: str | None


def save_file(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
    *,
    ttl: TTL = None,
    sign_key: Ed25519PrivateKey | None = None,
    now: float | None = None,
    hashing: Hashing = DEFAULT_HASHING,
) -> SaveResult:
    """Write ``tensors`` (numpy arrays or torch tensors) as a stamped safetensors file.

    One pass: every tensor is hashed from memory (in ``hashing.threads``
    threads) while its bytes are written and written back to disk, then the
    header is written with its final record; the file appears at ``path`` only
    once complete and synced. The record carries both manifests (SHA-256 and
    XXH3), as ``cmh stamp`` writes them.
    """
    target = os.fspath(path)
    user = dict(metadata or {})
    reserved = [k for k in user if is_reserved(k)]
    if reserved:
        raise CMHError(f"metadata keys {reserved} are reserved for the CMH format")
    if any(not isinstance(v, str) for v in user.values()):
        raise CMHError("metadata values must be strings")
    items = sorted((_as_tensor(n, v) for n, v in tensors.items()), key=lambda t: t.name.encode())
    for t in items:
        if t.name == METADATA_KEY:
            raise CMHError(f"{METADATA_KEY!r} cannot name a tensor")
        bits = DTYPE_BITS[t.dtype]
        count = 1
        for d in t.shape:
            count *= d
        if count * bits != 8 * len(t.data):
            raise CMHError(f"tensor {t.name!r}: shape {t.shape} does not match its bytes")

    def digest(t: _Tensor) -> tuple[bytes, bytes]:
        digests = hashlib.sha256(t.data).digest(), xxhash.xxh3_128_digest(t.data)
        if hashing.progress is not None:
            hashing.progress(len(t.data))
        return digests

    lifetime = ttl_seconds(ttl)
    stamped_at = int(time.time() if now is None else now)
    flags = FLAG_SHA256 | FLAG_XXH3 | (FLAG_SIGNED if sign_key else 0)
    expires_at = 0 if lifetime is None else stamped_at + lifetime
    signer = key_id(sign_key.public_key()) if sign_key else None

    def header_bytes(
        fingerprint: bytes, sha256: list[bytes], fast: list[bytes] | None, signature: bytes | None
    ) -> tuple[Record, bytes]:
        record = Record(
            expires_at=expires_at, fingerprint=fingerprint, flags=flags, stamped_at=stamped_at
        )
        header: dict[str, object] = {
            METADATA_KEY: {**user, **carrier_values(record, sha256, fast, signature, signer)}
        }
        offset = 0
        for t in items:
            header[t.name] = {
                "dtype": t.dtype,
                "shape": list(t.shape),
                "data_offsets": [offset, offset + len(t.data)],
            }
            offset += len(t.data)
        raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        raw += b" " * (-(PREFIX_SIZE + len(raw)) % 8)
        return record, len(raw).to_bytes(PREFIX_SIZE, "little") + raw

    # Every carrier value has its final width whatever the digests, so the header's
    # size is known before hashing: the tensor bytes are written (and written back to
    # disk) while the digests are computed, and the header is filled in last.
    _, placeholder = header_bytes(
        bytes(32),
        [bytes(32)] * len(items),
        [bytes(16)] * len(items),
        bytes(64) if sign_key else None,
    )
    try:
        with (
            ThreadPoolExecutor(max_workers=hashing.threads or default_threads()) as pool,
            atomic_file(target, tag="save", suffix=".tmp") as f,
        ):
            futures = [pool.submit(digest, t) for t in items]
            f.write(placeholder)
            for t in items:
                f.write(t.data)
            f.flush()
            failed: list[OSError] = []

            def write_back(fd: int = f.fileno()) -> None:
                try:
                    os.fdatasync(fd)
                except OSError as exc:  # raised below: a later fsync may not report it again
                    failed.append(exc)

            writeback = threading.Thread(target=write_back, name="cmh-writeback")
            writeback.start()
            digests = [fut.result() for fut in futures]
            sha256 = [d[0] for d in digests]
            entries = [
                RootEntry(t.name, t.dtype, t.shape, d) for t, d in zip(items, sha256, strict=True)
            ]
            root = file_root(entries, user)
            unsigned = Record(
                expires_at=expires_at, fingerprint=root, flags=flags, stamped_at=stamped_at
            )
            signature = sign_record(unsigned.to_bytes(), sign_key) if sign_key else None
            xxh3_digests = [d[1] for d in digests]
            record, final = header_bytes(root, sha256, xxh3_digests, signature)
            writeback.join()
            if failed:
                raise failed[0]
            f.seek(0)
            if len(final) != len(placeholder):  # pragma: no cover - widths are fixed
                f.truncate()
                f.write(final)
                for t in items:
                    f.write(t.data)
            else:
                f.write(final)
            f.flush()  # nothing may be written after the mtime is set
            set_mtime_to_stamp(f.name, stamped_at)
            written = os.fstat(f.fileno())
    except OSError as exc:
        raise StampError(f"{target}: could not write: {exc}") from exc
    record_own_stamp(target, written, record.fingerprint)
    return SaveResult(target, record, signer)
