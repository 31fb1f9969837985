"""Reading what a file says about itself, without hashing tensor data."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from ._carrier import read_carrier, user_metadata
from ._errors import CMHError
from ._header import read_header
from ._record import Record
from ._signing import TrustedKeys, signature_status


@dataclass(frozen=True)
class Inspection:
    """A summary of a safetensors file and of its CMH record, if any.

    ``record_error`` explains why a present record could not be read.
    ``signature`` says what is known of a signature: ``None`` when unsigned,
    ``"unchecked"`` when no trusted key was given, else ``"valid"``,
    ``"invalid"`` (it does not match the record) or ``"untrusted"`` (its key
    id is not among the trusted keys).
    """

    path: str
    file_size: int
    header_size: int
    tensor_count: int
    tensor_bytes: int
    dtypes: dict[str, int]
    metadata: dict[str, str]
    stamped: bool
    record: Record | None
    record_error: str | None
    has_sha256_manifest: bool
    has_xxh3_manifest: bool
    signed: bool
    signer_key_id: str | None
    signature: str | None = None


def inspect(path: str | os.PathLike[str], trusted_keys: TrustedKeys | None = None) -> Inspection:
    """Summarize the file at ``path``; raises :class:`~cmh._errors.InvalidFileError` if invalid.

    With ``trusted_keys``, a signature is checked against the record (no tensor is read).
    """
    target = os.fspath(path)
    header = read_header(target)
    record = None
    error = None
    carrier = None
    stamped = bool(header.metadata and "cmh" in header.metadata)
    try:
        carrier = read_carrier(header.metadata, len(header.tensors))
    except CMHError as exc:
        error = str(exc)
    signature: str | None = None
    if carrier is not None:
        record = carrier.record
        if record.signed and carrier.signature is not None:
            signer = carrier.key_id or ""
            signature = signature_status(record.to_bytes(), carrier.signature, signer, trusted_keys)
    return Inspection(
        path=target,
        file_size=header.file_size,
        header_size=header.header_size,
        tensor_count=len(header.tensors),
        tensor_bytes=header.data_size,
        dtypes=dict(Counter(t.dtype for t in header.tensors)),
        metadata=user_metadata(header.metadata),
        stamped=stamped,
        record=record,
        record_error=error,
        has_sha256_manifest=bool(carrier and carrier.sha256 is not None),
        has_xxh3_manifest=bool(carrier and carrier.xxh3 is not None),
        signed=bool(record and record.signed),
        signer_key_id=carrier.key_id if carrier else None,
        signature=signature,
    )
