"""The reserved ``cmh*`` keys that carry the record inside ``__metadata__``.

Every key equal to ``cmh`` or starting with ``cmh.`` belongs to the format and
is excluded from the fingerprint. Values are fixed-width lowercase hex so that
a later stamp can overwrite them in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._errors import CarrierError
from ._record import FLAG_SHA256, FLAG_SIGNED, FLAG_XXH3, RECORD_SIZE, Record, is_lower_hex

KEY_RECORD = "cmh"
KEY_SHA256 = "cmh.sha256"
KEY_XXH3 = "cmh.xxh3"
KEY_SIGNATURE = "cmh.sig"
KEY_KEY_ID = "cmh.key"

SHA256_HEX = 64
XXH3_HEX = 32
SIGNATURE_HEX = 128
KEY_ID_HEX = 16


def is_reserved(key: str) -> bool:
    """True for the keys the format owns: ``cmh`` and ``cmh.*``."""
    return key == KEY_RECORD or key.startswith("cmh.")


def user_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """The metadata entries that are not reserved (those the fingerprint covers)."""
    return {k: v for k, v in (metadata or {}).items() if not is_reserved(k)}


@dataclass(frozen=True)
class Carrier:
    """The decoded ``cmh*`` values of one file.

    ``signature`` and ``key_id`` are ``None`` when zero-filled (unsigned).
    ``sha256`` and ``xxh3`` are ``None`` when the manifest is absent.
    """

    record: Record
    sha256: tuple[bytes, ...] | None
    xxh3: tuple[bytes, ...] | None
    signature: bytes | None
    key_id: str | None


def encode_digests(digests: Sequence[bytes]) -> str:
    """Comma-separated lowercase hex, in the order given."""
    return ",".join(d.hex() for d in digests)


def decode_digests(text: str, width: int, count: int, key: str) -> tuple[bytes, ...]:
    """Decode a manifest of ``count`` digests of ``width`` hex characters each."""
    items = text.split(",") if text else []
    if len(items) != count:
        raise CarrierError(f"{key} lists {len(items)} digests for {count} tensors")
    if not is_lower_hex(text.replace(",", "")) or any(len(item) != width for item in items):
        bad = next(
            i for i, item in enumerate(items) if len(item) != width or not is_lower_hex(item)
        )
        raise CarrierError(f"{key} entry {bad} is not {width} lowercase hex characters")
    return tuple(bytes.fromhex(item) for item in items)


def read_carrier(metadata: Mapping[str, str] | None, tensor_count: int) -> Carrier | None:
    """Decode the carrier; ``None`` when the file is unstamped.

    Raises :class:`~cmh._errors.RecordError` for a bad record and
    :class:`~cmh._errors.CarrierError` for malformed or inconsistent values.
    """
    if not metadata or KEY_RECORD not in metadata:
        return None
    record = Record.from_hex(metadata[KEY_RECORD])
    sha256 = _manifest(metadata, KEY_SHA256, SHA256_HEX, tensor_count, record.flags & FLAG_SHA256)
    xxh3 = _manifest(metadata, KEY_XXH3, XXH3_HEX, tensor_count, record.flags & FLAG_XXH3)
    signature_hex = metadata.get(KEY_SIGNATURE)
    key_id = metadata.get(KEY_KEY_ID)
    if signature_hex is None or key_id is None:
        raise CarrierError("cmh.sig and cmh.key must both be present in a stamped file")
    if len(signature_hex) != SIGNATURE_HEX or not is_lower_hex(signature_hex):
        raise CarrierError("cmh.sig is not 128 lowercase hex characters")
    if len(key_id) != KEY_ID_HEX or not is_lower_hex(key_id):
        raise CarrierError("cmh.key is not 16 lowercase hex characters")
    signed = bool(record.flags & FLAG_SIGNED)
    zero_sig = signature_hex == "0" * SIGNATURE_HEX
    zero_key = key_id == "0" * KEY_ID_HEX
    if signed and zero_sig:
        raise CarrierError("the record says signed but cmh.sig is zero-filled")
    if signed and zero_key:
        raise CarrierError("the record says signed but cmh.key is zero-filled")
    if not signed and not (zero_sig and zero_key):
        raise CarrierError("the record says unsigned but cmh.sig or cmh.key is not zero-filled")
    return Carrier(
        record=record,
        sha256=sha256,
        xxh3=xxh3,
        signature=None if zero_sig else bytes.fromhex(signature_hex),
        key_id=None if zero_key else key_id,
    )


def _manifest(
    metadata: Mapping[str, str], key: str, width: int, count: int, flagged: int
) -> tuple[bytes, ...] | None:
    text = metadata.get(key)
    if not flagged:
        if text is not None and text.strip("0,") != "":
            raise CarrierError(f"{key} is present but the record's flags say it is not")
        return None
    if text is None:
        raise CarrierError(f"the record's flags announce {key} but it is missing")
    return decode_digests(text, width, count, key)


def carrier_values(
    record: Record,
    sha256: Sequence[bytes] | None,
    xxh3: Sequence[bytes] | None,
    signature: bytes | None = None,
    key_id: str | None = None,
) -> dict[str, str]:
    """The ``cmh*`` metadata values for a record, each at its final width."""
    if len(record.to_bytes()) != RECORD_SIZE:  # pragma: no cover - guarded by Record
        raise CarrierError("record is not 64 bytes")
    values = {KEY_RECORD: record.to_hex()}
    if sha256 is not None:
        values[KEY_SHA256] = encode_digests(sha256)
    if xxh3 is not None:
        values[KEY_XXH3] = encode_digests(xxh3)
    values[KEY_SIGNATURE] = signature.hex() if signature else "0" * SIGNATURE_HEX
    values[KEY_KEY_ID] = key_id or "0" * KEY_ID_HEX
    return values
