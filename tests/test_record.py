"""The 64-byte record: layout and every parsing rule of the spec."""

from __future__ import annotations

import struct

import pytest
import xxhash

from cmh._errors import CorruptRecordError, NotARecordError, UnsupportedVersionError
from cmh._record import FLAG_SHA256, FLAG_SIGNED, FLAG_XXH3, RECORD_SIZE, Record

FP = bytes(range(32))


def make(**kw: int) -> Record:
    base = {
        "expires_at": 1_800_000_000,
        "flags": FLAG_SHA256 | FLAG_XXH3,
        "stamped_at": 1_700_000_000,
    }
    base.update(kw)
    return Record(fingerprint=FP, **base)


def recheck(data: bytearray) -> bytes:
    data[60:64] = struct.pack("<I", xxhash.xxh32_intdigest(bytes(data[:60]), seed=0))
    return bytes(data)


def test_layout_matches_the_spec_offsets() -> None:
    raw = make().to_bytes()
    assert len(raw) == RECORD_SIZE == 64
    assert raw[0:4] == b"CMH\x00"
    assert raw[4] == 1
    assert struct.unpack_from("<I", raw, 5)[0] == 1_800_000_000
    assert raw[9:41] == FP
    assert raw[0x29] == FLAG_SHA256 | FLAG_XXH3
    assert struct.unpack_from("<I", raw, 0x2A)[0] == 1_700_000_000
    assert raw[0x2E:0x3C] == bytes(14)
    assert struct.unpack_from("<I", raw, 0x3C)[0] == xxhash.xxh32_intdigest(raw[:60], seed=0)


def test_round_trip_bytes_and_hex() -> None:
    record = make(flags=FLAG_SHA256 | FLAG_SIGNED)
    assert Record.from_bytes(record.to_bytes()) == record
    assert Record.from_hex(record.to_hex()) == record
    assert record.to_hex() == record.to_hex().lower()
    assert len(record.to_hex()) == 128


def test_wrong_magic_is_not_a_record() -> None:
    data = bytearray(make().to_bytes())
    data[0:4] = b"CMX\x00"
    with pytest.raises(NotARecordError, match="magic"):
        Record.from_bytes(recheck(data))


def test_failed_check_is_corrupt() -> None:
    data = bytearray(make().to_bytes())
    data[20] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="check"):
        Record.from_bytes(bytes(data))


def test_nonzero_reserved_is_corrupt() -> None:
    data = bytearray(make().to_bytes())
    data[0x30] = 1
    with pytest.raises(CorruptRecordError, match="reserved"):
        Record.from_bytes(recheck(data))


def test_unknown_version_is_named() -> None:
    data = bytearray(make().to_bytes())
    data[4] = 2
    with pytest.raises(UnsupportedVersionError, match="version 2") as info:
        Record.from_bytes(recheck(data))
    assert info.value.version == 2


def test_unknown_flag_bits_are_corrupt() -> None:
    data = bytearray(make().to_bytes())
    data[0x29] = 0x80
    with pytest.raises(CorruptRecordError, match="flag"):
        Record.from_bytes(recheck(data))


@pytest.mark.parametrize("text", ["", "00" * 63, "AB" * 64, "zz" * 64, "00" * 65])
def test_bad_hex_is_corrupt(text: str) -> None:
    with pytest.raises(CorruptRecordError):
        Record.from_hex(text)


def test_expiry() -> None:
    assert not make(expires_at=0).is_expired(4_000_000_000)
    record = make(expires_at=100)
    assert not record.is_expired(99)
    assert record.is_expired(100)


def test_construction_rejects_out_of_range_fields() -> None:
    with pytest.raises(ValueError):
        make(expires_at=1 << 32)
    with pytest.raises(ValueError):
        Record(expires_at=0, fingerprint=b"short", flags=0, stamped_at=0)
    with pytest.raises(ValueError):
        make(flags=0x10)
