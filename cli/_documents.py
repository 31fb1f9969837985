"""The ``--json`` documents of the format commands (schema in docs/cli.md).

Every document starts with :func:`~cmh.cli._common.envelope`'s fields. Builders here
take library objects and return plain dicts; printing is the caller's job.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ._common import iso_utc

if TYPE_CHECKING:
    from cmh import Inspection, Record, VerifyResult

    from ._targets import Target


def path_hex(path: str | None) -> str | None:
    """The path's bytes in lowercase hex when they are not UTF-8 (``path`` then has U+FFFD).

    The path is the one the document reports, as given (the argument, joined to an
    entry's name), never made absolute: spec section 6, "Names in reports".
    """
    if path is None:
        return None
    try:
        path.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return os.fsencode(path).hex()


def paths_hex(paths: list[str] | tuple[str, ...]) -> list[str | None]:
    """:func:`path_hex` of each path of a list (the ``files_hex`` beside a ``files``)."""
    return [path_hex(p) for p in paths]


def record_document(record: Record, now: float) -> dict[str, Any]:
    """A record's fields; ``expires_*`` are ``null`` for a record that never expires."""
    never = record.expires_at == 0
    return {
        "version": record.version,
        "fingerprint": record.fingerprint.hex(),
        "flags": record.flags,
        "sha256_manifest": record.has_sha256_manifest,
        "xxh3_manifest": record.has_xxh3_manifest,
        "signed": record.signed,
        "stamped_at": record.stamped_at,
        "stamped_at_iso": iso_utc(record.stamped_at),
        "expires_at": None if never else record.expires_at,
        "expires_at_iso": None if never else iso_utc(record.expires_at),
        "expires_in_seconds": None if never else int(record.expires_at - now),
        "expired": record.is_expired(now),
    }


def verify_document(result: VerifyResult, now: float, checkpoint: str | None) -> dict[str, Any]:
    """One file's verdict."""
    return {
        "path": result.path,
        "path_hex": path_hex(result.path),
        "checkpoint": checkpoint,
        "outcome": result.outcome.value,
        "ok": result.ok,
        "problems": [{"outcome": p.outcome.value, "message": p.message} for p in result.problems],
        "mismatched_tensors": list(result.mismatched),
        "signer_key_id": result.signer_key_id,
        "signature_checked": result.signature_checked,
        "expired": result.expired,
        "mode": result.mode,
        "notes": list(result.notes),
        "record": record_document(result.record, now) if result.record else None,
    }


def inspection_document(insp: Inspection, now: float) -> dict[str, Any]:
    """What a file says about itself."""
    return {
        "path": insp.path,
        "path_hex": path_hex(insp.path),
        "file_size": insp.file_size,
        "header_size": insp.header_size,
        "tensor_count": insp.tensor_count,
        "tensor_bytes": insp.tensor_bytes,
        "dtypes": dict(sorted(insp.dtypes.items())),
        "metadata": dict(sorted(insp.metadata.items())),
        "stamped": insp.stamped,
        "record": record_document(insp.record, now) if insp.record else None,
        "record_error": insp.record_error,
        "sha256_manifest": insp.has_sha256_manifest,
        "xxh3_manifest": insp.has_xxh3_manifest,
        "signed": insp.signed,
        "signer_key_id": insp.signer_key_id if insp.signed else None,
        "signature": insp.signature,
    }


def checkpoint_document(target: Target, ok: bool, identity: str | None = None) -> dict[str, Any]:
    """A directory argument: its shards, its index and what disagrees."""
    return {
        "path": target.argument,
        "path_hex": path_hex(target.argument),
        "index": target.index,
        "index_hex": path_hex(target.index),
        "files": list(target.files),
        "files_hex": paths_hex(target.files),
        "problems": list(target.problems),
        "error": target.error,
        "ok": ok,
        "identity": identity,
    }
