"""The 64-byte CMH record: build and parse (spec section "Record")."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import xxhash

from ._errors import CorruptRecordError, NotARecordError, UnsupportedVersionError

MAGIC = b"CMH\x00"
VERSION = 1
RECORD_SIZE = 64
FLAG_SHA256 = 0x01
FLAG_SIGNED = 0x02
FLAG_XXH3 = 0x04
KNOWN_FLAGS = FLAG_SHA256 | FLAG_SIGNED | FLAG_XXH3

_LAYOUT = struct.Struct("<4sBI32sBI14s")  # 60 bytes, then the u32 check
_CHECK = struct.Struct("<I")
_U32_MAX = 0xFFFFFFFF
#: The last time a record holds (an unsigned 32-bit Unix time: 2106-02-07T06:28:15Z).
LATEST_TIME = _U32_MAX


@dataclass(frozen=True)
class Record:
    """One CMH v1 record. Times are Unix seconds; ``expires_at == 0`` means never."""

    expires_at: int
    fingerprint: bytes
    flags: int
    stamped_at: int
    version: int = VERSION

    def __post_init__(self) -> None:
        if len(self.fingerprint) != 32:
            raise ValueError("fingerprint must be 32 bytes")
        for name in ("expires_at", "stamped_at"):
            value = getattr(self, name)
            if not 0 <= value <= _U32_MAX:
                raise ValueError(f"{name} must fit in an unsigned 32-bit integer")
        if self.flags & ~KNOWN_FLAGS:
            raise ValueError(f"unknown flag bits 0x{self.flags & ~KNOWN_FLAGS:02x}")

    @property
    def has_sha256_manifest(self) -> bool:
        return bool(self.flags & FLAG_SHA256)

    @property
    def has_xxh3_manifest(self) -> bool:
        return bool(self.flags & FLAG_XXH3)

    @property
    def signed(self) -> bool:
        return bool(self.flags & FLAG_SIGNED)

    def is_expired(self, at: float) -> bool:
        """True when ``at`` (Unix seconds) is at or past ``expires_at``."""
        return self.expires_at != 0 and at >= self.expires_at

    def to_bytes(self) -> bytes:
        body = _LAYOUT.pack(
            MAGIC,
            self.version,
            self.expires_at,
            self.fingerprint,
            self.flags,
            self.stamped_at,
            bytes(14),
        )
        return body + _CHECK.pack(xxhash.xxh32_intdigest(body, seed=0))

    def to_hex(self) -> str:
        return self.to_bytes().hex()

    @classmethod
    def from_bytes(cls, data: bytes) -> Record:
        """Parse 64 bytes; raise a typed error for each rule of the spec."""
        if len(data) != RECORD_SIZE:
            raise CorruptRecordError(f"a CMH record is 64 bytes, got {len(data)}")
        magic, version, expires_at, fingerprint, flags, stamped_at, reserved = _LAYOUT.unpack(
            data[:60]
        )
        if magic != MAGIC:
            raise NotARecordError(f"not a CMH record (magic {magic.hex()}, expected 434d4800)")
        # The version is judged before the check: a later version may lay out
        # the bytes after offset 5 differently, so only its number is known.
        if version != VERSION:
            raise UnsupportedVersionError(version)
        (check,) = _CHECK.unpack(data[60:])
        if xxhash.xxh32_intdigest(data[:60], seed=0) != check:
            raise CorruptRecordError("corrupt CMH record: check value does not match")
        if reserved != bytes(14):
            raise CorruptRecordError("corrupt CMH record: reserved bytes are not zero")
        if flags & ~KNOWN_FLAGS:
            raise CorruptRecordError(f"corrupt CMH record: unknown flag bits 0x{flags:02x}")
        return cls(
            expires_at=expires_at,
            fingerprint=fingerprint,
            flags=flags,
            stamped_at=stamped_at,
            version=version,
        )

    @classmethod
    def from_hex(cls, text: str) -> Record:
        if len(text) != 2 * RECORD_SIZE or not is_lower_hex(text):
            raise CorruptRecordError("corrupt CMH record: expected 128 lowercase hex characters")
        return cls.from_bytes(bytes.fromhex(text))


_LOWER_HEX = re.compile(r"[0-9a-f]*")


def is_lower_hex(text: str) -> bool:
    """True when ``text`` is made only of ``0-9a-f``."""
    return _LOWER_HEX.fullmatch(text) is not None
