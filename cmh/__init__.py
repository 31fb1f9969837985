"""cmh: the Cache Metadata Header for safetensors files.

Stamp a file with a 64-byte record (expiry, SHA-256 fingerprint root, check)
carried inside its ``__metadata__`` so every stock loader still loads it;
verify it, inspect it, fingerprint it, load it verified.

>>> import cmh
>>> cmh.stamp("model.safetensors", ttl="30d")          # doctest: +SKIP
>>> cmh.verify("model.safetensors").ok                 # doctest: +SKIP
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# The modules are private (``_name.py``, tools/privatize.py); this is the face.
from ._atomic import (
    atomic_file,
    atomic_symlink,
    atomic_write,
    fsync_dir,
    remove_temporaries,
    start_writeback,
    temp_path,
    write_new,
)
from ._carrier import KEY_RECORD, carrier_values, read_carrier, user_metadata
from ._checkpoint import (
    Checkpoint,
    DirectoryIdentity,
    claimed_digests,
    directory_identity,
    find_checkpoint,
    index_problems,
    name_bytes,
)
from ._checks import FileVersion, forget_check, record_check
from ._digests import (
    Hashing,
    ProgressCallback,
    TensorDigest,
    file_root,
    hash_tensors,
    root_entries,
    usable_cpus,
)
from ._duration import format_duration, format_size, parse_duration, parse_size, plural
from ._errors import (
    CarrierError,
    CMHError,
    CorruptRecordError,
    DurationError,
    IndexInconsistentError,
    InputValueError,
    InvalidFileError,
    NotARecordError,
    NotStampedError,
    RecordError,
    SigningKeyError,
    SizeError,
    StampError,
    UnsupportedVersionError,
    VerificationError,
)
from ._header import (
    MAX_HEADER_SIZE,
    METADATA_KEY,
    PREFIX_SIZE,
    Header,
    TensorEntry,
    TensorSpec,
    header_size_from_prefix,
    parse_header,
    read_header,
    read_header_from,
)
from ._inspection import Inspection, inspect
from ._libc import libc_function
from ._record import LATEST_TIME, Record
from ._regular import NotARegularFileError, open_regular, read_small_file
from ._signing import (
    TrustedKeys,
    generate_keypair,
    load_private_key,
    private_key_is_encrypted,
    signature_status,
)
from ._stamping import StampResult, sign, stamp, write_values_in_place
from ._verification import Outcome, Problem, VerifyResult, verify
from ._writer import SaveResult, save_file

__version__ = "0.1.0"


@dataclass(frozen=True)
class Fingerprint:
    """The v1 root of a file, or the identity of a checkpoint directory."""

    path: str
    kind: str  # "file" or "directory"
    value: bytes
    tensor_count: int
    tensor_bytes: int
    files: tuple[str, ...]

    @property
    def hex(self) -> str:
        return self.value.hex()


def fingerprint(
    path: str | os.PathLike[str],
    *,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
) -> Fingerprint:
    """Hash the tensors at ``path``: a file's root, or a directory's identity."""
    target = os.fspath(path)
    if os.path.isdir(target):
        ident = directory_identity(target, threads=threads, progress=progress)
        return Fingerprint(
            target, "directory", ident.identity, ident.tensor_count, ident.tensor_bytes, ident.files
        )
    header = read_header(target)
    digests = hash_tensors(target, header, threads=threads, progress=progress)
    sha = [d.sha256 for d in digests if d.sha256 is not None]
    root = file_root(root_entries(header.tensors, sha), user_metadata(header.metadata))
    return Fingerprint(
        target, "file", root, len(header.tensors), header.data_size, (os.path.basename(target),)
    )


__all__ = [
    "CMHError",
    "CarrierError",
    "CorruptRecordError",
    "DirectoryIdentity",
    "DurationError",
    "Fingerprint",
    "Hashing",
    "Header",
    "IndexInconsistentError",
    "InputValueError",
    "Inspection",
    "InvalidFileError",
    "NotARecordError",
    "NotStampedError",
    "Outcome",
    "Problem",
    "Record",
    "RecordError",
    "SaveResult",
    "SigningKeyError",
    "SizeError",
    "StampError",
    "StampResult",
    "TensorDigest",
    "TensorEntry",
    "TensorSpec",
    "UnsupportedVersionError",
    "VerificationError",
    "VerifyResult",
    "__version__",
    "directory_identity",
    "find_checkpoint",
    "fingerprint",
    "inspect",
    "parse_duration",
    "parse_size",
    "read_header",
    "save_file",
    "sign",
    "stamp",
    "verify",
]
# Building blocks of the format for cmh.hub and cmh.cli (and tools that need them):
# headers and their parts, the carrier, digests, signing keys, check records,
# atomic file writes.
__all__ += [
    "KEY_RECORD",
    "LATEST_TIME",
    "MAX_HEADER_SIZE",
    "METADATA_KEY",
    "PREFIX_SIZE",
    "Checkpoint",
    "FileVersion",
    "NotARegularFileError",
    "ProgressCallback",
    "TrustedKeys",
    "atomic_file",
    "atomic_symlink",
    "atomic_write",
    "carrier_values",
    "claimed_digests",
    "file_root",
    "forget_check",
    "format_duration",
    "format_size",
    "fsync_dir",
    "generate_keypair",
    "hash_tensors",
    "header_size_from_prefix",
    "index_problems",
    "libc_function",
    "load_private_key",
    "name_bytes",
    "open_regular",
    "parse_header",
    "plural",
    "private_key_is_encrypted",
    "read_carrier",
    "read_header_from",
    "read_small_file",
    "record_check",
    "remove_temporaries",
    "root_entries",
    "signature_status",
    "start_writeback",
    "temp_path",
    "usable_cpus",
    "user_metadata",
    "write_new",
    "write_values_in_place",
]
