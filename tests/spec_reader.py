"""An independent CMH v1 reader written from spec/cmh-v1.md alone.

It imports nothing from cmh: JSON, SHA-256, XXH32, XXH3-128 and Ed25519
only. The test vectors are checked with it, which shows they can be checked
by anyone holding the spec.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import xxhash
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip


@dataclass
class Parsed:
    tensors: list[tuple[str, str, list[int], int, int]]  # offset order
    metadata: dict[str, str]
    buffer: bytes


def parse(data: bytes) -> Parsed:
    (n,) = struct.unpack("<Q", data[:8])
    assert n <= 100_000_000 and 8 + n <= len(data)
    text = data[8 : 8 + n].decode("utf-8")
    assert text.startswith("{")
    obj = json.loads(text)
    metadata = obj.pop("__metadata__", {}) or {}
    buffer = data[8 + n :]
    tensors = []
    for name, info in obj.items():
        assert set(info) == {"dtype", "shape", "data_offsets"}
        begin, end = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        assert count * BITS[info["dtype"]] == 8 * (end - begin)
        tensors.append((name, info["dtype"], info["shape"], begin, end))
    tensors.sort(key=lambda t: (t[3], t[4], t[0].encode()))
    position = 0
    for t in tensors:
        assert t[3] == position
        position = t[4]
    assert position == len(buffer)
    return Parsed(tensors, metadata, buffer)


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def tensor_entries(tensors: list[tuple[str, str, list[int], int, int]], buffer: bytes) -> bytes:
    out = u64(len(tensors))
    for name, dtype, shape, begin, end in sorted(tensors, key=lambda t: t[0].encode()):
        n, d = name.encode(), dtype.encode()
        out += u32(len(n)) + n + u32(len(d)) + d + u32(len(shape))
        out += b"".join(u64(x) for x in shape)
        out += hashlib.sha256(buffer[begin:end]).digest()
    return out


def root(parsed: Parsed) -> bytes:
    covered = {k: v for k, v in parsed.metadata.items() if k != "cmh" and not k.startswith("cmh.")}
    body = b"CMH-FP-v1\n" + tensor_entries(parsed.tensors, parsed.buffer)
    items = sorted((k.encode(), v.encode()) for k, v in covered.items())
    body += u64(len(items))
    for k, v in items:
        body += u32(len(k)) + k + u32(len(v)) + v
    return hashlib.sha256(body).digest()


def directory_identity(shards: list[Parsed]) -> bytes:
    tensors: list[tuple[str, str, list[int], int, int]] = []
    buffer = b""
    for shard in shards:
        # Rebase each shard's offsets into one concatenated buffer.
        base = len(buffer)
        tensors += [(n, d, s, b + base, e + base) for n, d, s, b, e in shard.tensors]
        buffer += shard.buffer
    return hashlib.sha256(b"CMH-DIR-v1\n" + tensor_entries(tensors, buffer)).digest()


@dataclass
class Record:
    version: int
    expires_at: int
    fingerprint: bytes
    flags: int
    stamped_at: int
    raw: bytes


def record(parsed: Parsed) -> Record:
    raw = bytes.fromhex(parsed.metadata["cmh"])
    assert len(raw) == 64 and raw[:4] == b"CMH\x00" and raw[4] == 1
    assert struct.unpack("<I", raw[60:])[0] == xxhash.xxh32_intdigest(raw[:60], 0)
    assert raw[0x2E:0x3C] == bytes(14) and raw[0x29] & ~0x07 == 0
    (expires_at,) = struct.unpack("<I", raw[5:9])
    (stamped_at,) = struct.unpack("<I", raw[0x2A:0x2E])
    return Record(raw[4], expires_at, raw[9:41], raw[0x29], stamped_at, raw)


def manifest(parsed: Parsed, key: str) -> list[str]:
    text = parsed.metadata.get(key, "")
    return text.split(",") if text else []


def check_file(path: Path, key: Ed25519PublicKey | None = None) -> dict[str, object]:
    """Everything the spec lets a reader establish about a stamped file."""
    parsed = parse(path.read_bytes())
    rec = record(parsed)
    digests = [hashlib.sha256(parsed.buffer[b:e]).hexdigest() for _, _, _, b, e in parsed.tensors]
    fast = [xxhash.xxh3_128_digest(parsed.buffer[b:e]).hex() for _, _, _, b, e in parsed.tensors]
    if rec.flags & 1:
        assert manifest(parsed, "cmh.sha256") == digests
    if rec.flags & 4:
        assert manifest(parsed, "cmh.xxh3") == fast
    computed = root(parsed)
    assert computed == rec.fingerprint
    key_id = parsed.metadata["cmh.key"]
    if rec.flags & 2:
        assert key is not None
        key.verify(bytes.fromhex(parsed.metadata["cmh.sig"]), b"CMH-SIG-v1\x00" + rec.raw)
    else:
        assert set(parsed.metadata["cmh.sig"]) == {"0"} and set(key_id) == {"0"}
    return {
        "root": computed.hex(),
        "record_hex": rec.raw.hex(),
        "expires_at": rec.expires_at,
        "stamped_at": rec.stamped_at,
        "flags": rec.flags,
        "sha256": digests,
        "xxh3_128": fast,
        "key_id": None if set(key_id) == {"0"} else key_id,
    }
