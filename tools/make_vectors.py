"""Write the CMH v1 conformance vectors in fixtures/vectors/ (spec section 10).

Deterministic, byte for byte: tensors, header text, times and Ed25519 seeds
are fixed, and every file is written by this script's own small writer (the
stock writer does not keep metadata key order across processes). Stamps are
made by ``cmh.stamp``; negative vectors are then edited by hand, one rule
broken each.

``index.json`` lists every vector with, for each mode of verification, the
outcome a conforming reader must report. Those outcomes are declared here
from the spec (section 9's order), never read back from cmh.

Run: ``python tools/make_vectors.py [OUT]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import cmh
from cmh import hash_tensors

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "vectors"
STAMPED_AT = 1_767_225_600  # 2026-01-01T00:00:00Z
ONE_THREAD = cmh.Hashing(threads=1)  # the vectors come out the same on every machine
BEFORE = STAMPED_AT + 1  # every check is judged at a given time, never the clock
SIGNING_SEED = bytes(range(32))
OTHER_SEED = bytes(range(32, 64))
KEY = "{dir}/signing-key.pub"
OTHER_KEY = "{dir}/other-key.pub"

#: Outcomes judged before any signature (section 9): a key changes nothing for them.
BEFORE_SIGNATURE = {
    "invalid_file",
    "index_inconsistent",
    "unstamped",
    "corrupt_record",
    "unsupported_version",
    "manifest_inconsistent",
    "root_mismatch",
    "tensor_mismatch",
}

Tensor = tuple[str, str, list[int], bytes]  # name, dtype, shape, bytes

#: Section 9's reporting order ("ok" last: the first failing outcome wins).
ORDER = [
    "invalid_file", "index_inconsistent", "unstamped", "corrupt_record", "unsupported_version",
    "manifest_inconsistent", "root_mismatch", "tensor_mismatch", "signature_missing",
    "signature_invalid", "signature_untrusted", "expired", "ok",
]  # fmt: skip
#: Directory outcomes decided before any file's (section 6).
DIRECTORY_OUTCOMES = {"invalid_file", "index_inconsistent"}
#: Every mode of section 10 but the expiry ones, with its reader options; files and directories.
MODES: list[tuple[str, list[str]]] = [
    ("full", []),
    ("fast", ["--fast"]),
    ("key", ["--key", KEY]),
    ("key-allow-unsigned", ["--key", KEY, "--allow-unsigned"]),
    ("require-signature", ["--key", KEY, "--require-signature"]),
    ("fast-key", ["--fast", "--key", KEY]),
    ("fast-key-allow-unsigned", ["--fast", "--key", KEY, "--allow-unsigned"]),
    ("other-key", ["--key", OTHER_KEY]),
]


# -- writing ----------------------------------------------------------------------------


def grid(shape: tuple[int, ...], dtype: type, offset: int = 0) -> np.ndarray:
    return (np.arange(int(np.prod(shape))) + offset).reshape(shape).astype(dtype)


_NUMPY = {
    "float32": "F32",
    "float16": "F16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


def arrays(named: dict[str, np.ndarray]) -> list[Tensor]:
    """Tensors from numpy arrays, in the given order."""
    return [
        (n, _NUMPY[a.dtype.name], list(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes())
        for n, a in named.items()
    ]


def header_text(tensors: list[Tensor], metadata: dict[str, str] | None) -> bytes:
    """Compact JSON: ``__metadata__`` first, then the tensors in order, offsets packed."""
    obj: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, data in tensors:
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def write_file(path: Path, header: bytes, buffer: bytes, *, align: int = 8) -> Path:
    """``u64 N``, the header padded with spaces so the buffer starts at a multiple of ``align``."""
    header += b" " * (-(8 + len(header)) % align)
    path.write_bytes(struct.pack("<Q", len(header)) + header + buffer)
    return path


def write_tensors(path: Path, tensors: list[Tensor], metadata: dict[str, str] | None) -> Path:
    return write_file(path, header_text(tensors, metadata), b"".join(t[3] for t in tensors))


def split(path: Path) -> tuple[dict[str, Any], bytes]:
    """A file's header object (key order kept) and buffer."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def rewrite(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Copy ``src`` to ``dst`` with its header object edited."""
    obj, data = split(src)
    edit(obj)
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return write_file(dst, text, data)


def set_metadata(**values: str | None) -> Callable[[dict[str, Any]], None]:
    """An edit that sets (or, for ``None``, deletes) ``__metadata__`` entries.

    Keyword ``cmh_sha256`` stands for the key ``cmh.sha256`` (and so on).
    """

    def edit(obj: dict[str, Any]) -> None:
        meta = obj["__metadata__"]
        for key, value in values.items():
            key = key.replace("_", ".") if key.startswith("cmh_") else key
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value

    return edit


def stale_xxh3(src: Path, dst: Path) -> Path:
    """Copy ``src`` to ``dst`` with each ``cmh.xxh3`` digest replaced by a wrong one."""
    count = len(split(src)[0]["__metadata__"]["cmh.xxh3"].split(","))
    return rewrite(src, dst, set_metadata(cmh_xxh3=",".join(["0" * 31 + "1"] * count)))


def record_of(path: Path) -> bytes:
    return bytes.fromhex(split(path)[0]["__metadata__"]["cmh"])


def expiry_of(path: Path) -> int:
    (expires_at,) = struct.unpack("<I", record_of(path)[5:9])
    return int(expires_at)


def with_check(body: bytes) -> bytes:
    """60 record bytes plus their XXH32 check."""
    return body[:60] + struct.pack("<I", xxhash.xxh32_intdigest(body[:60], seed=0))


def patched(record: bytes, offset: int, value: bytes) -> bytes:
    """The record with ``value`` at ``offset`` and a correct check."""
    return with_check(record[:offset] + value + record[offset + len(value) : 60])


# -- Ed25519 by hand, for the one signature a library will not make ----------------------
# (RFC 8032's arithmetic in extended coordinates; only make_vectors uses it.)
_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_Point = tuple[int, int, int, int]


def _add(a: _Point, b: _Point) -> _Point:
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa, bb = (y1 - x1) * (y2 - x2) % _P, (y1 + x1) * (y2 + x2) % _P
    cc, dd = 2 * t1 * t2 * _D % _P, 2 * z1 * z2 % _P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _times(n: int, point: _Point) -> _Point:
    out: _Point = (0, 1, 1, 0)
    while n:
        if n & 1:
            out = _add(out, point)
        point, n = _add(point, point), n >> 1
    return out


def _encode(point: _Point) -> bytes:
    x, y, z, _ = point
    zi = pow(z, _P - 2, _P)
    x, y = x * zi % _P, y * zi % _P
    return (y | (x & 1) << 255).to_bytes(32, "little")


def _from_y(y: int) -> _Point | None:
    """The point with this y and an even x, if there is one."""
    xx = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    x = pow(xx, (_P + 3) // 8, _P)
    if (x * x - xx) % _P:
        x = x * pow(2, (_P - 1) // 4, _P) % _P
    if (x * x - xx) % _P:
        return None
    x = _P - x if x & 1 else x
    return (x, y, 1, x * y % _P)


def _order_eight() -> _Point:
    """A point of order 8: [L] of a curve point whose small-order part has order 8."""
    for y in range(2, 1000):
        point = _from_y(y)
        if point is None:
            continue
        small = _times(_L, point)
        if _encode(_times(4, small)) != _encode((0, 1, 1, 0)):
            return small
    raise AssertionError("no point of order 8 found")


def small_order_signature(seed: bytes, message: bytes) -> bytes:
    """An Ed25519 signature of ``message`` by ``seed`` whose R is [r]B plus a point of order 8:
    ``[8][S]B = [8]R + [8][k]A`` holds, ``[S]B = R + [k]A`` does not."""
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little") & ((1 << 254) - 8) | (1 << 254)
    base = _from_y(4 * pow(5, _P - 2, _P) % _P)
    assert base is not None
    public = _encode(_times(a, base))
    r = int.from_bytes(hashlib.sha512(h[32:] + message).digest(), "little") % _L
    big_r = _encode(_add(_times(r, base), _order_eight()))
    k = int.from_bytes(hashlib.sha512(big_r + public + message).digest(), "little") % _L
    return big_r + ((r + k * a) % _L).to_bytes(32, "little")


def flip_byte(path: Path, tensor: str) -> None:
    header = cmh.read_header(path)
    offset = header.data_start + header.by_name()[tensor].begin
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# -- the index ----------------------------------------------------------------------------


@dataclass
class Vector:
    """One vector: what it is, which rule it tests, what each mode must report."""

    name: str
    path: str
    description: str
    spec: str
    full: str
    kind: str = "file"
    fast: str | None = None
    signature: str | None = None  # None, "valid", "invalid" (record changed), "other" (other key)
    expires_at: int = 0
    details: dict[str, Any] | None = None
    made_to_fail_with_key: bool = False
    parts: list[Vector] | None = None  # a directory's files, each judged as a file
    made: list[dict[str, Any]] | None = None  # steps that build it in a scratch directory

    @property
    def negative(self) -> bool:
        """Made to fail: in full or fast mode, or with the signing key as the trusted one."""
        failing_signature = self.signature in ("invalid", "other", "unknown")
        failing_signature |= self.made_to_fail_with_key
        return "ok" not in (self.outcome("full"), self.outcome("fast")) or failing_signature

    def _with_key(self, base: str, trusted: str, required: bool) -> str:
        """Section 9's order: a signature outcome comes after base's early outcomes."""
        if base in BEFORE_SIGNATURE:
            return base
        signers = {"valid": "signing", "invalid": "signing", "other": "other", "unknown": "unknown"}
        signer = signers.get(self.signature or "")
        if signer is None:
            found = "signature_missing" if required else None
        elif signer != trusted:
            found = "signature_untrusted"  # the key id decides first
        elif self.signature == "invalid":
            found = "signature_invalid"
        else:
            found = None
        return found or base

    def outcome(self, mode: str) -> str:
        """What a conforming reader reports in ``mode`` (section 9; section 6 for directories)."""
        if self.parts and self.full not in DIRECTORY_OUTCOMES:
            # Section 6: the first of the files' outcomes in section 9's order.
            return min((p.outcome(mode) for p in self.parts), key=ORDER.index)
        if self.full in DIRECTORY_OUTCOMES:
            return self.full
        # A trusted key or a required signature makes a fast verification a full one (9).
        return {
            "full": self.full,
            "fast": self.fast or self.full,
            "key": self._with_key(self.full, "signing", True),
            "key-allow-unsigned": self._with_key(self.full, "signing", False),
            "require-signature": self._with_key(self.full, "signing", True),
            "fast-key": self._with_key(self.full, "signing", True),
            "fast-key-allow-unsigned": self._with_key(self.full, "signing", False),
            "other-key": self._with_key(self.full, "other", True),
        }[mode]

    def checks(self) -> list[dict[str, Any]]:
        at = ["--at", str(BEFORE)]
        out = [(mode, [*args, *at], self.outcome(mode)) for mode, args in MODES]
        if self.expires_at and self.full == "ok":
            out += [
                ("before-expiry", ["--at", str(self.expires_at - 1)], "ok"),
                ("at-expiry", ["--at", str(self.expires_at)], "expired"),
            ]
        return [{"mode": m, "args": a, "outcome": o} for m, a, o in out]

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "path": self.path,
            "kind": self.kind,
            "negative": self.negative,
            "spec": self.spec,
            "description": self.description,
            "checks": self.checks(),
        }
        if self.kind == "directory":
            # Section 6: the identity is refused exactly where a verification says so.
            out["fingerprint"] = self.full if self.full in DIRECTORY_OUTCOMES else "ok"
        if self.made is not None:
            out["made"] = self.made
        if self.details is not None:
            out["details"] = self.details
        return out


def describe(path: Path) -> dict[str, Any]:
    """What a reader must find in a stamped vector: record fields, root, digests."""
    header = cmh.read_header(path)
    info = cmh.inspect(path)
    record = info.record
    assert record is not None
    digests = hash_tensors(path, header, xxh3=True, threads=1)
    return {
        "record_hex": record.to_hex(),
        "record": {
            "magic": "434d4800",
            "version": record.version,
            "expires_at": record.expires_at,
            "fingerprint": record.fingerprint.hex(),
            "flags": record.flags,
            "stamped_at": record.stamped_at,
        },
        "root": record.fingerprint.hex(),
        "tensor_count": len(header.tensors),
        # Large vectors list their first and last tensors only; the root covers all.
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "data_offsets": [t.begin, t.end],
                "sha256": d.sha256.hex() if d.sha256 else None,
                "xxh3_128": d.xxh3.hex() if d.xxh3 else None,
            }
            for i, (t, d) in enumerate(zip(header.tensors, digests, strict=True))
            if len(header.tensors) <= 100 or i in (0, len(header.tensors) - 1)
        ],
        "metadata_covered": info.metadata,
        "signed_by_key_id": info.signer_key_id,
    }


# -- the vectors --------------------------------------------------------------------------


class Builder:
    """Writes vector files into ``out`` and collects their index entries."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.vectors: list[Vector] = []
        self.key = Ed25519PrivateKey.from_private_bytes(SIGNING_SEED)
        self.other = Ed25519PrivateKey.from_private_bytes(OTHER_SEED)

    def file(self, name: str) -> Path:
        return self.out / f"{name}.safetensors"

    def add(self, name: str, description: str, spec: str, full: str, **kw: Any) -> Vector:
        vector = Vector(name, f"{name}.safetensors", description, spec, full, **kw)
        self.vectors.append(vector)
        return vector

    def stamped(
        self,
        name: str,
        tensors: list[Tensor],
        metadata: dict[str, str] | None,
        *,
        ttl: int | None = None,
        xxh3: bool = True,
        sign: Ed25519PrivateKey | None = None,
        now: int = STAMPED_AT,
    ) -> Path:
        path = write_tensors(self.file(name), tensors, metadata)
        cmh.stamp(path, ttl=ttl, now=now, xxh3=xxh3, sign_key=sign, hashing=ONE_THREAD)
        return path

    def positive(self, name: str, description: str, spec: str, path: Path, **kw: Any) -> None:
        record = cmh.inspect(path).record
        assert record is not None
        vector = self.add(name, description, spec, "ok", expires_at=record.expires_at, **kw)
        vector.details = describe(path)

    def raw(
        self, name: str, header: str | bytes, buffer: bytes, description: str, spec: str
    ) -> None:
        """An invalid container, written byte for byte (escapes kept as written)."""
        text = header.encode() if isinstance(header, str) else header
        self.file(name).write_bytes(struct.pack("<Q", len(text)) + text + buffer)
        self.add(name, description, spec, "invalid_file")


def write_vectors(out: Path) -> None:
    """Write every vector and ``index.json`` into ``out`` (emptied first)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    b = Builder(out)
    for file, key in (("signing-key.pub", b.key), ("other-key.pub", b.other)):
        (out / file).write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    positives(b)
    unstamped_and_containers(b)
    records_and_manifests(b)
    contents_and_signatures(b)
    more_containers(b)
    more_records_and_manifests(b)
    more_contents_and_signatures(b)
    directories(b)
    paths_of_every_type(b)
    index = {
        "format": "cmh-v1-vectors",
        "version": 1,
        "stamped_at": STAMPED_AT,
        "reader": (
            "Run the reader once per check: its command, then the check's args with {dir} "
            "replaced by this directory, then the vector's path. The reader prints one JSON "
            "object whose 'outcome' is one of section 9's names (or index_inconsistent). "
            "A vector with 'made' is first built in a scratch directory by its steps, and its "
            "path is relative to that directory."
        ),
        "vectors": [v.entry() for v in b.vectors],
    }
    (out / "index.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n")


def positives(b: Builder) -> None:
    basic = arrays({"weight": grid((2, 3), np.float32), "bias": grid((3,), np.float16, 7)})
    path = b.stamped("basic", basic, {"format": "pt", "note": "basic"}, ttl=30 * 86400)
    b.positive("basic", "two tensors, user metadata, a 30-day TTL", "3, 4, 5", path)
    path = b.stamped("no-user-metadata", arrays({"x": grid((4,), np.int64)}), None)
    b.positive("no-user-metadata", "stamped from a file that had no __metadata__", "5", path)
    path = b.stamped(
        "empty-and-scalar",
        arrays(
            {
                "empty": np.zeros((0, 5), np.float32),
                "also-empty": np.zeros((3, 0), np.int8),
                "scalar": np.array(2.5, np.float64),
            }
        ),
        {"format": "np"},
    )
    b.positive("empty-and-scalar", "empty tensors and a scalar (shape [])", "2.5, 4", path)
    path = b.stamped(
        "non-ascii-names",
        arrays(
            {
                "poids.é": grid((2,), np.float32),
                "重み": grid((2,), np.float32, 2),
                "Ω": grid((1,), np.uint8),
            }
        ),
        {"clé": "valeur ✓"},
    )
    b.positive("non-ascii-names", "UTF-8 names and metadata, sorted bytewise", "5", path)
    path = b.stamped("one-tensor", arrays({"only": grid((8,), np.uint8)}), {"f": "pt"}, xxh3=False)
    b.positive("one-tensor", "one tensor, no XXH3 manifest (fast falls back)", "4, 9", path)
    many = arrays({f"t{i:05d}": np.array([i], dtype=np.int32) for i in range(10_000)})
    path = b.stamped("many-tensors", many, {"format": "pt"})
    b.positive("many-tensors", "10,000 tensors", "4, 5", path)
    f8 = ("f8", "F8_E4M3", [16], bytes(range(16)))
    path = b.stamped("bool-and-f8", [*arrays({"mask": np.array([True, False, True])}), f8], None)
    b.positive("bool-and-f8", "BOOL and an 8-bit float dtype", "2", path)
    signed = arrays({"w": grid((4, 4), np.float32)})
    path = b.stamped("signed", signed, {"format": "pt"}, ttl=86400, sign=b.key)
    b.positive("signed", "signed by the vectors' signing key", "7", path, signature="valid")
    path = b.stamped("expired", arrays({"w": grid((2,), np.float32)}), None, ttl=60)
    b.positive("expired", "expires 60 s after stamping (judged before and at expiry)", "3", path)
    path = b.stamped("no-tensors", [], {"format": "pt"})
    b.positive("no-tensors", "a file with no tensors (empty manifests)", "4, 5", path)
    # Point 3: an empty tensor at (0,0), one at (0,8), an empty one at (8,8): (begin, end) order.
    edges = [("z-empty-start", "F32", [0], b""), ("a-full", "U8", [8], bytes(range(8)))]
    edges.append(("m-empty-end", "I8", [0, 3], b""))
    path = b.stamped("empty-at-buffer-edges", edges, None)
    b.positive("empty-at-buffer-edges", "manifest order is (begin, end), then name", "4", path)
    # Point 12: an original whose buffer starts at an odd offset is moved to a multiple of 8.
    odd = b.file("unaligned-original")
    write_file(odd, header_text(arrays({"u": grid((3,), np.uint8)}), None), bytes(3), align=1)
    cmh.stamp(odd, now=STAMPED_AT, hashing=ONE_THREAD)
    b.positive("unaligned-original", "first stamp of a file whose buffer was unaligned", "8", odd)
    # Point 6: flags bit0 clear (no SHA-256 manifest): verified by hashing every tensor.
    bare = b.file("no-sha256-manifest")
    record = record_of(b.file("basic"))
    no_sha = patched(record, 0x29, bytes([record[0x29] & ~0x01]))
    rewrite(b.file("basic"), bare, set_metadata(cmh=no_sha.hex(), cmh_sha256=None))
    b.positive(
        "no-sha256-manifest", "flags bit0 clear: the root is checked from the bytes", "4, 9", bare
    )


def unstamped_and_containers(b: Builder) -> None:
    write_tensors(b.file("no-metadata"), arrays({"x": grid((4,), np.int64)}), None)
    b.add("no-metadata", "unstamped, and no __metadata__ entry at all", "2.4, 9", "unstamped")
    write_tensors(b.file("unstamped"), arrays({"x": grid((4,), np.int64)}), {"format": "pt"})
    b.add("unstamped", "user metadata but no cmh key", "9", "unstamped")
    w = '"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}'
    buf = b"abcd"

    def one(spec_shape: str, offsets: str = "[0,4]", dtype: str = "U8") -> str:
        return f'{{"w":{{"dtype":"{dtype}","shape":{spec_shape},"data_offsets":{offsets}}}}}'

    b.file("file-too-short").write_bytes(b"\x05\x00\x00")
    b.add("file-too-short", "3 bytes: no room for the header length", "2.1", "invalid_file")
    text = ("{" + w + "}").encode()
    b.file("header-length-past-end").write_bytes(struct.pack("<Q", len(text) + 100) + text + buf)
    b.add("header-length-past-end", "N runs past the end of the file", "2.1", "invalid_file")
    b.file("header-length-over-limit").write_bytes(struct.pack("<Q", 100_000_001) + text + buf)
    b.add("header-length-over-limit", "N over 100,000,000", "2.1", "invalid_file")
    cases: list[tuple[str, str | bytes, bytes, str, str]] = [
        ("header-not-object", "[1]", b"", "header is a JSON array", "2.2"),
        ("header-leading-space", " {" + w + "}", buf, "header starts with a space", "2.2"),
        (
            "header-bad-utf8",
            b'{"w\xff":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
            buf,
            "header is not UTF-8",
            "2.2",
        ),
        ("header-invalid-json", "{" + w + ",}", buf, "trailing comma", "2.2"),
        ("header-nan", one("[NaN]"), buf, "NaN is not JSON", "2.2"),
        ("header-trailing-garbage", "{" + w + "}x", buf, "a byte after the object", "2.2"),
        (
            "duplicate-key",
            '{"__metadata__":{"a":"1","a":"2"},' + w + "}",
            buf,
            "a metadata key twice",
            "2.3",
        ),
        (
            "duplicate-key-escaped",
            '{"__metadata__":{"a":"1","\\u0061":"2"},' + w + "}",
            buf,
            "the same key twice, once escaped",
            "2.3",
        ),
        (
            "metadata-twice",
            '{"__metadata__":{},' + w + ',"__metadata__":{}}',
            buf,
            "two __metadata__ entries",
            "2.3",
        ),
        ("metadata-null", '{"__metadata__":null,' + w + "}", buf, "__metadata__ is null", "2.4"),
        (
            "metadata-not-object",
            '{"__metadata__":"x",' + w + "}",
            buf,
            "__metadata__ is a string",
            "2.4",
        ),
        (
            "metadata-non-string-value",
            '{"__metadata__":{"n":1},' + w + "}",
            buf,
            "a metadata value is a number",
            "2.4",
        ),
        (
            "tensor-extra-field",
            '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1}}',
            buf,
            "a tensor with an unknown field",
            "2.5",
        ),
        (
            "tensor-missing-field",
            '{"w":{"dtype":"U8","shape":[4]}}',
            buf,
            "a tensor without data_offsets",
            "2.5",
        ),
        ("dtype-unknown", one("[4]", dtype="U4"), buf, "dtype U4 is not in the table", "2.5"),
        ("shape-float", one("[4.0]"), buf, "a dimension written 4.0", "2.5"),
        ("shape-exponent", one("[4e0]"), buf, "a dimension written 4e0", "2.5"),
        ("shape-negative", one("[-4]"), buf, "a negative dimension", "2.5"),
        (
            "shape-minus-zero",
            '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
            '"z":{"dtype":"U8","shape":[-0],"data_offsets":[4,4]}}',
            buf,
            "a dimension written -0",
            "2.5",
        ),
        (
            "shape-over-u64",
            '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
            '"z":{"dtype":"U8","shape":[18446744073709551616,0],"data_offsets":[4,4]}}',
            buf,
            "a dimension of 2^64 in a tensor of zero elements",
            "2.5",
        ),
        ("offsets-float", one("[4]", "[0,4.0]"), buf, "an offset written 4.0", "2.5"),
        ("offsets-exponent", one("[4]", "[0,4e0]"), buf, "an offset written 4e0", "2.5"),
        ("offsets-negative", one("[0]", "[-1,0]"), buf[:0], "an offset written -1", "2.5"),
        ("offsets-minus-zero", one("[4]", "[-0,4]"), buf, "an offset written -0", "2.5"),
        (
            "offsets-over-u64",
            '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
            '"z":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551616,'
            "18446744073709551616]}}",
            buf,
            "an offset of 2^64",
            "2.5",
        ),
        ("offsets-reversed", one("[0]", "[4,0]"), buf, "begin after end", "2.5"),
        ("size-mismatch", one("[3]"), buf, "3 elements of U8 in 4 bytes", "2.6"),
        ("partial-byte", one("[3]", "[0,2]", "F4"), b"ab", "3 F4 elements: 12 bits", "2.6"),
        ("offsets-gap", one("[3]", "[1,4]"), buf, "the buffer's first byte is no tensor's", "2.7"),
        (
            "offsets-overlap",
            '{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},'
            '"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}',
            buf,
            "two tensors share a byte",
            "2.7",
        ),
        ("trailing-bytes", "{" + w + "}", buf + b"!", "a byte after the last tensor", "2.7"),
        (
            "name-lone-surrogate",
            '{"w\\ud800":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
            buf,
            "a tensor name with an unpaired surrogate escape",
            "2.2",
        ),
        (
            "value-lone-surrogate",
            '{"__metadata__":{"note":"\\udc00"},' + w + "}",
            buf,
            "a metadata value with an unpaired surrogate escape",
            "2.2",
        ),
    ]
    for name, header, buffer, description, spec in cases:
        b.raw(name, header, buffer, description, spec)


def records_and_manifests(b: Builder) -> None:
    base = b.file("basic")
    record = record_of(base)

    def mutant(name: str, description: str, spec: str, full: str, **values: str | None) -> None:
        rewrite(base, b.file(name), set_metadata(**values))
        b.add(name, description, spec, full)

    corrupt = "corrupt_record"
    mutant(
        "record-bad-magic", "magic CMH\\x01", "3", corrupt, cmh=patched(record, 0, b"CMH\x01").hex()
    )
    bad_check = record[:60] + bytes(x ^ 0xFF for x in record[60:])
    mutant("record-bad-check", "check does not match", "3", corrupt, cmh=bad_check.hex())
    mutant(
        "record-reserved-nonzero",
        "a reserved byte set (check valid)",
        "3",
        corrupt,
        cmh=patched(record, 0x30, b"\x01").hex(),
    )
    mutant(
        "record-unknown-flag",
        "flags bit3 set (check valid)",
        "3",
        corrupt,
        cmh=patched(record, 0x29, bytes([record[0x29] | 0x08])).hex(),
    )
    v2 = patched(record, 4, b"\x02")
    mutant("record-version-2", "version 2 (check valid)", "3", "unsupported_version", cmh=v2.hex())
    v2_bad = v2[:60] + bytes(x ^ 0xFF for x in v2[60:])
    mutant(
        "record-version-2-bad-check",
        "version 2 and a bad check: the version wins",
        "3",
        "unsupported_version",
        cmh=v2_bad.hex(),
    )
    mutant(
        "record-uppercase-hex",
        "the record in uppercase hex",
        "3, 4",
        corrupt,
        cmh=record.hex().upper(),
    )
    mutant("record-short-hex", "126 hex characters", "3, 4", corrupt, cmh=record.hex()[:-2])
    mutant(
        "record-not-hex",
        "128 characters, one of them 'g'",
        "3, 4",
        corrupt,
        cmh=record.hex()[:-1] + "g",
    )

    meta = split(base)[0]["__metadata__"]
    sha = meta["cmh.sha256"]
    inconsistent = "manifest_inconsistent"
    mutant(
        "manifest-sha256-count",
        "one digest for two tensors",
        "4",
        inconsistent,
        cmh_sha256=sha.split(",")[0],
    )
    mutant(
        "manifest-sha256-uppercase",
        "a digest in uppercase hex",
        "4",
        inconsistent,
        cmh_sha256=sha.upper(),
    )
    mutant(
        "manifest-sha256-short",
        "a digest of 62 hex characters",
        "4",
        inconsistent,
        cmh_sha256=sha[2:],
    )
    mutant(
        "manifest-sha256-missing", "bit0 set, cmh.sha256 absent", "4", inconsistent, cmh_sha256=None
    )
    no_xxh3 = patched(record, 0x29, bytes([record[0x29] & ~0x04]))
    mutant(
        "manifest-xxh3-unflagged",
        "bit2 clear, cmh.xxh3 holds digests",
        "4",
        inconsistent,
        cmh=no_xxh3.hex(),
    )
    mutant("manifest-sig-missing", "no cmh.sig key", "4", inconsistent, cmh_sig=None)
    mutant(
        "manifest-unsigned-nonzero-sig",
        "bit1 clear, cmh.sig not zero",
        "4, 7",
        inconsistent,
        cmh_sig="1" * 128,
    )
    mutant(
        "manifest-unsigned-nonzero-key",
        "bit1 clear, cmh.key not zero",
        "4, 7",
        inconsistent,
        cmh_key="1" * 16,
    )
    signed = b.file("signed")
    rewrite(signed, b.file("manifest-signed-zero-sig"), set_metadata(cmh_sig="0" * 128))
    b.add("manifest-signed-zero-sig", "bit1 set, cmh.sig zero", "4, 7", inconsistent)
    rewrite(signed, b.file("manifest-signed-zero-key"), set_metadata(cmh_key="0" * 16))
    b.add("manifest-signed-zero-key", "bit1 set, cmh.key zero", "4, 7", inconsistent)
    mutant(
        "manifest-key-uppercase",
        "cmh.key in uppercase hex",
        "4",
        inconsistent,
        cmh_key="0" * 15 + "A",
    )


def contents_and_signatures(b: Builder) -> None:
    base = b.file("basic")
    rewrite(base, b.file("root-mismatch"), set_metadata(note="changed"))
    b.add("root-mismatch", "a covered metadata value changed", "5, 9", "root_mismatch")

    def renamed(obj: dict[str, Any]) -> None:
        obj["weights"] = obj.pop("weight")

    rewrite(base, b.file("root-mismatch-renamed"), renamed)
    b.add("root-mismatch-renamed", "a tensor renamed", "5, 9", "root_mismatch")
    shutil.copyfile(b.file("no-sha256-manifest"), b.file("root-mismatch-no-sha256"))
    flip_byte(b.file("root-mismatch-no-sha256"), "weight")
    b.add("root-mismatch-no-sha256", "bit0 clear and a byte changed", "4, 9", "root_mismatch")
    shutil.copyfile(base, b.file("tensor-mismatch"))
    flip_byte(b.file("tensor-mismatch"), "bias")
    b.add("tensor-mismatch", "a tensor byte changed", "9", "tensor_mismatch")

    stale_xxh3(base, b.file("xxh3-stale"))
    b.add(
        "xxh3-stale",
        "XXH3 manifest wrong, bytes right: only fast mode reads it",
        "4, 9",
        "ok",
        fast="tensor_mismatch",
        expires_at=expiry_of(base),
    )

    # Item 12: bytes changed in a signed file, XXH3 manifest rewritten to match.
    forged = b.file("xxh3-forged-signed")
    shutil.copyfile(b.file("signed"), forged)
    flip_byte(forged, "w")
    header = cmh.read_header(forged)
    digests = hash_tensors(forged, header, sha256=False, xxh3=True, threads=1)
    xxh3 = ",".join(d.xxh3.hex() for d in digests if d.xxh3 is not None)
    rewrite(forged, forged, set_metadata(cmh_xxh3=xxh3))
    b.add(
        "xxh3-forged-signed",
        "signed; bytes changed and cmh.xxh3 rewritten to match",
        "9",
        "tensor_mismatch",
        fast="ok",
        signature="valid",
    )

    # The record changed after signing (a later expiry, check recomputed).
    record = record_of(b.file("signed"))
    later = patched(record, 5, struct.pack("<I", STAMPED_AT + 365 * 86400))
    rewrite(b.file("signed"), b.file("signature-invalid"), set_metadata(cmh=later.hex()))
    b.add(
        "signature-invalid",
        "record changed after signing",
        "7, 9",
        "ok",
        signature="invalid",
        expires_at=STAMPED_AT + 365 * 86400,
    )
    # The signature stripped: bit1 cleared, cmh.sig and cmh.key zeroed, check recomputed.
    stripped = patched(record, 0x29, bytes([record[0x29] & ~0x02]))
    rewrite(
        b.file("signed"),
        b.file("signature-stripped"),
        set_metadata(cmh=stripped.hex(), cmh_sig="0" * 128, cmh_key="0" * 16),
    )
    b.add(
        "signature-stripped",
        "a signed file with its signature removed",
        "7, 9",
        "ok",
        expires_at=expiry_of(b.file("signed")),
        made_to_fail_with_key=True,
    )
    b.stamped("signature-untrusted", arrays({"w": grid((3,), np.float32)}), None, sign=b.other)
    b.add("signature-untrusted", "signed by the other key", "7, 9", "ok", signature="other")
    b.stamped("signature-legacy-restamp", arrays({"w": grid((3,), np.float32)}), None, sign=b.key)
    path = b.file("signature-legacy-restamp")
    old = record_of(path)
    restamped = patched(old, 0x2A, struct.pack("<I", STAMPED_AT + 3600))
    rewrite(path, path, set_metadata(cmh=restamped.hex()))
    b.add(
        "signature-legacy-restamp",
        "re-stamped by a 0.1 writer: the old signature kept",
        "7, 8.3",
        "ok",
        signature="invalid",
    )
    b.stamped(
        "expired-long-ago",
        arrays({"w": grid((2,), np.float32)}),
        None,
        ttl=60,
        now=STAMPED_AT - 3600,
    )
    b.add("expired-long-ago", "expired before the time judged", "3, 9", "expired")


def more_containers(b: Builder) -> None:
    """Section 2 rules that had no vector (issue 27)."""
    w = '"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}'
    buf = b"abcd"

    def one(shape: str, offsets: str = "[0,4]", dtype: str = "U8") -> str:
        return f'{{"w":{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offsets}}}}}'

    cases: list[tuple[str, str | bytes, bytes, str, str]] = [
        (
            "header-overlong-utf8",
            b'{"w\xc0\xaf":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
            buf,
            "a name with the overlong UTF-8 form C0 AF of '/'",
            "2.2",
        ),
        (
            "header-raw-surrogate",
            b'{"w\xed\xa0\x80":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
            buf,
            "a name with the UTF-8-encoded surrogate ED A0 80",
            "2.2",
        ),
        ("header-bom", b"\xef\xbb\xbf{" + w.encode() + b"}", buf, "a byte-order mark first", "2.2"),
        (
            "tensor-duplicate-key",
            '{"w":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
            buf,
            "dtype twice inside one tensor object",
            "2.3",
        ),
        ("dtype-lowercase", one("[4]", dtype="u8"), buf, "dtype u8: names compare exactly", "2.5"),
        ("offsets-three", one("[4]", "[0,4,4]"), buf, "data_offsets of length 3", "2.5"),
        ("offsets-one", one("[4]", "[4]"), buf, "data_offsets of length 1", "2.5"),
        (
            "shape-product-wraps",
            one("[4611686018427387905,4]"),
            buf,
            "(2^62+1)*4 elements: 4 modulo 2^64, so 4 bytes to a reader that wraps",
            "2.6",
        ),
        (
            "shape-bits-wrap",
            one("[2305843009213693953]", "[0,1]"),
            buf[:1],
            "(2^61+1) U8 elements: 8 * that is 8 modulo 2^64",
            "2.6",
        ),
        (
            "shape-product-4300-digits",
            one("[" + ",".join(["18446744073709551615"] * 240) + "]", "[0,0]"),
            b"",
            "240 dimensions of 2^64-1 at [0,0]: a product of 4,623 decimal digits (more than "
            "CPython converts to text by default); judged without writing it out",
            "2.2, 2.6",
        ),
        (
            "header-unterminated-string",
            b'{"' + b'\\"' * 2000,
            b"",
            'a header that ends inside a string holding 2,000 escaped quotes (\\")',
            "2.2",
        ),
        (
            "empty-inside-another",
            '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
            '"e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}}',
            buf,
            "an empty tensor at (2,2), inside a's range (0,4)",
            "2.7",
        ),
    ]
    for name, header, buffer, description, spec in cases:
        b.raw(name, header, buffer, description, spec)

    # Positive: padding with every JSON whitespace byte, not only spaces.
    src = b.file("basic")
    obj, data = split(src)
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    path = b.file("header-padded-whitespace")
    path.write_bytes(struct.pack("<Q", len(text) + 6) + text + b"\t\n\r \n\t" + data)
    b.positive(
        "header-padded-whitespace", "the header padded with tab, LF, CR and space", "2.2", path
    )
    # Positive: a dimension of exactly 2^64-1 (in an empty tensor).
    huge = [("huge", "U8", [2**64 - 1, 0], b""), ("w", "U8", [4], b"abcd")]
    path = b.stamped("shape-u64-max", huge, None)
    b.positive(
        "shape-u64-max", "a dimension of 2^64-1 in a tensor of zero elements", "2.5, 5", path
    )
    # Positive: 240 dimensions of 2^64-1 and a 0 (a product of 0, whatever the others).
    many = [("huge", "U8", [2**64 - 1] * 240 + [0], b""), ("w", "U8", [4], b"abcd")]
    path = b.stamped("shape-u64-max-240", many, None)
    b.positive(
        "shape-u64-max-240",
        "240 dimensions of 2^64-1, then a 0: zero elements",
        "2.5, 2.6, 5",
        path,
    )


def more_records_and_manifests(b: Builder) -> None:
    """Section 3 and 4 rules that had no vector (issue 27)."""
    base = b.file("basic")
    record = record_of(base)
    meta = split(base)[0]["__metadata__"]
    sha, xxh3 = meta["cmh.sha256"], meta["cmh.xxh3"]

    def mutant(name: str, description: str, spec: str, full: str, **values: str | None) -> None:
        rewrite(base, b.file(name), set_metadata(**values))
        b.add(name, description, spec, full)

    corrupt, inconsistent = "corrupt_record", "manifest_inconsistent"
    mutant("record-long-hex", "130 hex characters", "3", corrupt, cmh=record.hex() + "00")
    bad_magic_v2 = patched(patched(record, 0, b"CMH\x01"), 4, b"\x02")
    mutant(
        "record-bad-magic-version-2",
        "magic CMH\\x01 and version 2: the magic is judged first",
        "3",
        corrupt,
        cmh=bad_magic_v2.hex(),
    )
    mutant(
        "record-version-0",
        "version 0 (check valid)",
        "3",
        "unsupported_version",
        cmh=patched(record, 4, b"\x00").hex(),
    )
    mutant("manifest-key-missing", "no cmh.key key", "4", inconsistent, cmh_key=None)
    mutant("manifest-sig-short", "cmh.sig of 126 characters", "4", inconsistent, cmh_sig="0" * 126)
    mutant("manifest-sig-long", "cmh.sig of 130 characters", "4", inconsistent, cmh_sig="0" * 130)
    mutant("manifest-xxh3-missing", "bit2 set, cmh.xxh3 absent", "4", inconsistent, cmh_xxh3=None)
    mutant(
        "manifest-xxh3-uppercase",
        "bit2 set, cmh.xxh3 in uppercase hex",
        "4",
        inconsistent,
        cmh_xxh3=xxh3.upper(),
    )
    mutant(
        "manifest-xxh3-count",
        "bit2 set, one XXH3 digest for two tensors",
        "4",
        inconsistent,
        cmh_xxh3=xxh3.split(",")[0],
    )
    mutant(
        "manifest-trailing-comma",
        "cmh.sha256 ends with a comma",
        "4",
        inconsistent,
        cmh_sha256=sha + ",",
    )
    mutant(
        "manifest-spaces",
        "cmh.sha256 joined by ', '",
        "4",
        inconsistent,
        cmh_sha256=", ".join(sha.split(",")),
    )
    # Positive: bit2 clear and cmh.xxh3 made of 0 and ',' only: ignored.
    no_xxh3 = patched(record, 0x29, bytes([record[0x29] & ~0x04]))
    zeros = ",".join("0" * 32 for _ in xxh3.split(","))
    path = rewrite(
        base, b.file("manifest-unflagged-zeros"), set_metadata(cmh=no_xxh3.hex(), cmh_xxh3=zeros)
    )
    b.positive("manifest-unflagged-zeros", "bit2 clear, cmh.xxh3 all zeros: ignored", "4", path)
    # Positive: an unknown cmh.* key is ignored (and not covered by the root).
    path = rewrite(base, b.file("unknown-cmh-key"), set_metadata(cmh_future="anything at all"))
    b.positive("unknown-cmh-key", "an unknown cmh.future key is ignored", "4, 5", path)


def more_contents_and_signatures(b: Builder) -> None:
    """Section 5, 7 and 9 rules that had no vector (issue 27)."""
    base = b.file("basic")

    def retyped(obj: dict[str, Any]) -> None:
        obj["weight"]["dtype"] = "I32"  # same width: the file stays valid

    rewrite(base, b.file("root-mismatch-dtype"), retyped)
    b.add("root-mismatch-dtype", "a tensor's dtype F32 -> I32", "5, 9", "root_mismatch")

    def reshaped(obj: dict[str, Any]) -> None:
        obj["weight"]["shape"] = [3, 2]

    rewrite(base, b.file("root-mismatch-shape"), reshaped)
    b.add("root-mismatch-shape", "a tensor's shape [2,3] -> [3,2]", "5, 9", "root_mismatch")

    signed = b.file("signed")
    sig = bytes.fromhex(split(signed)[0]["__metadata__"]["cmh.sig"])
    rewrite(
        signed,
        b.file("signature-unknown-key-garbage"),
        set_metadata(cmh_key="0123456789abcdef", cmh_sig="5a" * 64),
    )
    b.add(
        "signature-unknown-key-garbage",
        "an unknown key id and a signature that verifies under no key: the key id decides",
        "7",
        "ok",
        signature="unknown",
        expires_at=expiry_of(signed),
    )
    # RFC 8032: S must be below the group order L; S + L is the same point, non-canonical.
    order = 2**252 + 27742317777372353535851937790883648493
    s_value = int.from_bytes(sig[32:], "little") + order
    noncanonical = sig[:32] + s_value.to_bytes(32, "little")
    rewrite(signed, b.file("signature-non-canonical"), set_metadata(cmh_sig=noncanonical.hex()))
    b.add(
        "signature-non-canonical",
        "the signature's S replaced by S + L (RFC 8032 requires S < L)",
        "7",
        "ok",
        signature="invalid",
        expires_at=expiry_of(signed),
    )
    # Section 7: the cofactorless check. R carries a point of order 8, so only the cofactored
    # equation holds; with the signing key, a conforming reader reports signature_invalid.
    torsion = small_order_signature(SIGNING_SEED, b"CMH-SIG-v1\0" + record_of(signed))
    rewrite(signed, b.file("signature-small-order-r"), set_metadata(cmh_sig=torsion.hex()))
    b.add(
        "signature-small-order-r",
        "a signature by the signing key whose R has a small-order part: it passes the "
        "cofactored equation only, and section 7 checks the cofactorless one",
        "7",
        "ok",
        signature="invalid",
        expires_at=expiry_of(signed),
    )
    # Fast mode falls back to full with bit0 clear: a stale cmh.xxh3 is then not read.
    path = stale_xxh3(b.file("no-sha256-manifest"), b.file("fast-fallback-no-sha256"))
    b.add(
        "fast-fallback-no-sha256",
        "bit0 clear and a stale cmh.xxh3: fast mode must hash with SHA-256 instead",
        "9",
        "ok",
        expires_at=expiry_of(path),
    )
    # tensor_mismatch comes before expired (section 9's order).
    shutil.copyfile(b.file("expired-long-ago"), b.file("tensor-mismatch-expired"))
    flip_byte(b.file("tensor-mismatch-expired"), "w")
    b.add(
        "tensor-mismatch-expired",
        "expired and a byte changed: tensor_mismatch is reported",
        "9",
        "tensor_mismatch",
    )


def directories(b: Builder) -> None:
    state = {f"layer.{i}.weight": grid((4, 4), np.float32, i) for i in range(4)}
    names = list(state)

    def shard_dir(name: str, parts: list[list[str]], index: dict[str, str] | None) -> Path:
        folder = b.out / name
        folder.mkdir()
        for i, part in enumerate(parts):
            file = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
            write_tensors(folder / file, arrays({n: state[n] for n in part}), {"format": "pt"})
            cmh.stamp(folder / file, now=STAMPED_AT, hashing=ONE_THREAD)
        if index is not None:
            text = json.dumps({"metadata": {"total_size": 256}, "weight_map": index}, indent=1)
            (folder / "model.safetensors.index.json").write_text(text + "\n")
        return folder

    def mapping(parts: list[list[str]]) -> dict[str, str]:
        return {
            n: f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
            for i, part in enumerate(parts)
            for n in part
        }

    halves = [names[:2], names[2:]]
    shard_dir("sharded", halves, mapping(halves))
    single = b.out / "unsharded-dir"
    single.mkdir()
    write_tensors(single / "model.safetensors", arrays(state), {"format": "pt"})
    cmh.stamp(single / "model.safetensors", now=STAMPED_AT, hashing=ONE_THREAD)
    identity = cmh.directory_identity(b.out / "sharded").hex
    assert cmh.directory_identity(single).hex == identity
    for name, description in (
        ("sharded", "two shards and an index; same identity as unsharded-dir"),
        ("unsharded-dir", "the same tensors in one file, no index"),
    ):
        vector = Vector(name, name, description, "6", "ok", kind="directory")
        vector.details = {"identity": identity}
        b.vectors.append(vector)

    def bad(name: str, description: str, full: str) -> None:
        b.vectors.append(Vector(name, name, description, "6", full, kind="directory"))

    folder = shard_dir("dir-stray-shard", halves, mapping(halves))
    write_tensors(folder / "extra.safetensors", arrays({"x": grid((2,), np.uint8)}), None)
    bad("dir-stray-shard", "a *.safetensors file the index does not name", "index_inconsistent")
    folder = shard_dir("dir-two-indexes", halves, mapping(halves))
    shutil.copyfile(
        folder / "model.safetensors.index.json", folder / "other.safetensors.index.json"
    )
    bad("dir-two-indexes", "two *.safetensors.index.json files", "index_inconsistent")
    index = mapping(halves)
    index["layer.9.weight"] = "model-00003-of-00003.safetensors"
    shard_dir("dir-missing-shard", halves, index)
    bad("dir-missing-shard", "the index names a shard that is not there", "invalid_file")
    twice = [names[:3], names[2:]]
    index = mapping([names[:2], names[2:]])
    shard_dir("dir-tensor-in-two-shards", twice, index)
    bad("dir-tensor-in-two-shards", "layer.2.weight in both shards", "index_inconsistent")
    shard_dir("dir-no-index-tensor-twice", twice, None)
    bad("dir-no-index-tensor-twice", "no index; a tensor in two files", "index_inconsistent")
    more_directories(b, shard_dir, mapping, halves)


def more_directories(
    b: Builder,
    shard_dir: Callable[[str, list[list[str]], dict[str, str] | None], Path],
    mapping: Callable[[list[list[str]]], dict[str, str]],
    halves: list[list[str]],
) -> None:
    """Every rule of section 6 (issue 27), each directory judged in every mode."""
    index_name = "model.safetensors.index.json"
    first, second = (f"model-0000{i}-of-00002.safetensors" for i in (1, 2))

    def add(name: str, description: str, full: str, **kw: Any) -> Vector:
        vector = Vector(name, name, description, "6", full, kind="directory", **kw)
        b.vectors.append(vector)
        return vector

    def with_index(name: str, raw: bytes, description: str, full: str = "invalid_file") -> Path:
        folder = shard_dir(name, halves, mapping(halves))
        (folder / index_name).write_bytes(raw)
        add(name, description, full)
        return folder

    good = json.dumps({"weight_map": mapping(halves)}, separators=(",", ":")).encode()
    entry = f'"{halves[0][0]}":"{first}"'
    rest = ",".join(f'"{n}":"{f}"' for n, f in mapping(halves).items() if n != halves[0][0])
    with_index("dir-index-bom", b"\xef\xbb\xbf" + good, "the index starts with a byte-order mark")
    with_index(
        "dir-index-nan",
        b'{"metadata":{"total_size":NaN},"weight_map":' + good[len(b'{"weight_map":') :],
        "NaN in the index's metadata",
    )
    with_index(
        "dir-index-duplicate-key",
        ("{" + f'"weight_map":{{{entry},{entry},{rest}}}' + "}").encode(),
        "a tensor named twice in weight_map, both times with the same file",
    )
    with_index(
        "dir-index-lone-surrogate",
        ("{" + f'"weight_map":{{{entry},{rest},"x\\ud800":"{first}"}}' + "}").encode(),
        "a weight_map key with an unpaired surrogate escape",
    )
    with_index(
        "dir-index-raw-surrogate",
        good[:-2] + b',"x\xed\xa0\x80":"' + first.encode() + b'"}}',
        "the index holds the UTF-8-encoded surrogate ED A0 80",
    )
    with_index("dir-index-not-object", b"[1]", "the index is a JSON array")
    with_index("dir-index-no-weight-map", b'{"metadata":{}}', "the index has no weight_map")
    with_index(
        "dir-index-value-not-string",
        good[:-2] + b',"x":1}}',
        "a weight_map value is a number",
    )
    folder = b.out / "dir-index-empty"
    folder.mkdir()
    (folder / index_name).write_bytes(b'{"weight_map": {}}\n')
    add(
        "dir-index-empty",
        "weight_map is empty and there is no shard: nothing to verify",
        "invalid_file",
    )
    folder = shard_dir("dir-index-empty-with-stray", halves, None)
    (folder / index_name).write_bytes(b'{"weight_map": {}}\n')
    add("dir-index-empty-with-stray", "weight_map is empty; shards lie beside it", "invalid_file")

    def aliased(name: str, shard_name: str, description: str) -> None:
        index = {n: (shard_name if f == first else f) for n, f in mapping(halves).items()}
        raw = json.dumps({"weight_map": index}).encode()
        with_index(name, raw, description)

    aliased(
        "dir-shard-dot-slash", "./" + first, "a shard named ./model-...: names are not normalised"
    )
    aliased("dir-shard-trailing-slash", first + "/", "a shard named model-.../")
    aliased("dir-shard-subdirectory", "sub/" + first, "a shard in a subdirectory")
    aliased("dir-shard-backslash", "sub\\" + first, "a shard name with a backslash")
    aliased("dir-shard-nul", first[:-12] + "\0.safetensors", "a shard name with a NUL character")
    aliased(
        "dir-shard-not-safetensors", first[:-12] + ".bin", "a shard name not ending in .safetensors"
    )
    # Names are bytes, never normalised: the index's NFC name does not name the NFD file.
    index = {n: ("caf\u00e9.safetensors" if f == first else f) for n, f in mapping(halves).items()}
    folder = with_index(
        "dir-shard-nfd",
        json.dumps({"weight_map": index}).encode(),
        "the index names caf\u00e9 (NFC), the file on disk is cafe\u0301 (NFD): a missing shard",
    )
    (folder / first).rename(folder / "cafe\u0301.safetensors")
    # An escaped lone surrogate does not name the file FF on disk: the index is invalid.
    folder = with_index(
        "dir-shard-escaped-surrogate",
        ("{" + f'"weight_map":{{{entry},{rest},"x":"\\udcff.safetensors"}}' + "}").encode(),
        "a shard name \\udcff.safetensors beside a file named FF 2E 73...",
    )
    write_tensors(
        folder / os.fsdecode(b"\xff.safetensors"), arrays({"x": grid((2,), np.uint8)}), None
    )
    # A shard that resolves outside the directory (a symbolic link to ../basic.safetensors).
    folder = shard_dir("dir-shard-outside", halves, mapping(halves))
    (folder / second).unlink()
    (folder / second).symlink_to(os.path.join("..", "basic.safetensors"))
    add("dir-shard-outside", "a shard that is a symbolic link out of the directory", "invalid_file")

    folder = b.out / "dir-no-shard"
    folder.mkdir()
    (folder / "README.md").write_text(
        "No index and no *.safetensors file (git keeps no empty directory).\n"
    )
    add("dir-no-shard", "no index file and no *.safetensors file", "invalid_file")
    folder = shard_dir("dir-invalid-shard", halves, mapping(halves))
    (folder / second).write_bytes(b"\x05\x00\x00")
    add("dir-invalid-shard", "a shard that is not a valid safetensors file", "invalid_file")
    folder = shard_dir("dir-shard-huge-shape", halves, mapping(halves))
    huge = '{"z":{"dtype":"U8","shape":[' + ",".join(["18446744073709551615"] * 240) + "],"
    raw = (huge + '"data_offsets":[0,0]}}').encode()
    (folder / second).write_bytes(struct.pack("<Q", len(raw)) + raw)
    add(
        "dir-shard-huge-shape",
        "a shard whose tensor has 240 dimensions of 2^64-1 (a 4,623-digit product) at [0,0]",
        "invalid_file",
    )
    folder = shard_dir("dir-invalid-stray", halves, mapping(halves))
    (folder / "extra.safetensors").write_bytes(b"\x05\x00\x00")
    add(
        "dir-invalid-stray",
        "an invalid stray file: invalid_file before index_inconsistent",
        "invalid_file",
    )
    folder = shard_dir("dir-stray-non-utf8", halves, mapping(halves))
    write_tensors(
        folder / os.fsdecode(b"\xff.safetensors"), arrays({"x": grid((2,), np.uint8)}), None
    )
    add(
        "dir-stray-non-utf8",
        "a stray file whose name is the byte FF then .safetensors",
        "index_inconsistent",
    )
    folder = shard_dir("dir-non-utf8-name", [halves[0] + halves[1]], None)
    (folder / "model-00001-of-00001.safetensors").rename(folder / os.fsdecode(b"m\xff.safetensors"))
    add("dir-non-utf8-name", "no index; the one shard's name is not UTF-8", "ok")

    # Rule 4, each way.
    index = mapping(halves)
    index["layer.9.weight"] = first
    shard_dir("dir-index-ghost-tensor", halves, index)
    add("dir-index-ghost-tensor", "the index names a tensor no shard holds", "index_inconsistent")
    index = mapping(halves)
    index[halves[0][0]] = second
    shard_dir("dir-index-wrong-shard", halves, index)
    add("dir-index-wrong-shard", "the index puts a tensor in the other shard", "index_inconsistent")
    index = mapping(halves)
    del index[halves[1][1]]
    shard_dir("dir-index-missing-tensor", halves, index)
    add(
        "dir-index-missing-tensor",
        "a shard holds a tensor the index does not name",
        "index_inconsistent",
    )

    # Which index is read.
    folder = shard_dir("dir-other-index-name", halves, None)
    (folder / "weights.safetensors.index.json").write_bytes(good)
    add("dir-other-index-name", "the one index file is not model.safetensors.index.json", "ok")
    folder = shard_dir("dir-two-indexes-first-invalid", halves, None)
    (folder / "a.safetensors.index.json").write_bytes(b"{not json")
    (folder / "b.safetensors.index.json").write_bytes(good)
    add(
        "dir-two-indexes-first-invalid",
        "two indexes, no model.safetensors.index.json: the first by name (invalid) is read",
        "invalid_file",
    )
    folder = shard_dir("dir-two-indexes-model-wins", halves, mapping(halves))
    (folder / "a.safetensors.index.json").write_bytes(b"{not json")
    add(
        "dir-two-indexes-model-wins",
        "model.safetensors.index.json is read, not the first (invalid) one: rule 1",
        "index_inconsistent",
    )

    # A shard's outcome passed up, in section 9's order across shards.
    folder = shard_dir("dir-shard-tensor-mismatch", halves, mapping(halves))
    flip_byte(folder / second, halves[1][0])
    add("dir-shard-tensor-mismatch", "a byte changed in one shard", "tensor_mismatch")
    folder = shard_dir("dir-shard-outcomes-ordered", halves, mapping(halves))
    flip_byte(folder / second, halves[1][0])
    write_tensors(
        folder / first,
        arrays({n: grid((4, 4), np.float32, int(n.split(".")[1])) for n in halves[0]}),
        {"format": "pt"},
    )
    add(
        "dir-shard-outcomes-ordered",
        "one shard unstamped, the other with a changed byte: unstamped comes first",
        "unstamped",
    )

    # Key modes: every shard signed; one signed and one not.
    folder = shard_dir("dir-signed", halves, mapping(halves))
    for file in (first, second):
        cmh.stamp(folder / file, now=STAMPED_AT, sign_key=b.key, hashing=ONE_THREAD)
    add("dir-signed", "every shard signed by the signing key", "ok", signature="valid")
    folder = shard_dir("dir-half-signed", halves, mapping(halves))
    cmh.stamp(folder / first, now=STAMPED_AT, sign_key=b.key, hashing=ONE_THREAD)
    add(
        "dir-half-signed",
        "one shard signed, one not: a required signature is missing",
        "ok",
        parts=[
            Vector(first, first, "", "6", "ok", signature="valid"),
            Vector(second, second, "", "6", "ok"),
        ],
    )
    index_json_limits(b, with_index, halves, mapping)
    entries_and_links(b, shard_dir, mapping, halves)


def index_json_limits(
    b: Builder,
    with_index: Callable[..., Path],
    halves: list[list[str]],
    mapping: Callable[[list[list[str]]], dict[str, str]],
) -> None:
    """Section 6 rules c-e beyond NaN, and section 2.2's limits applied to the index (issue 39)."""
    weight_map = json.dumps(mapping(halves), separators=(",", ":"))
    body = weight_map[1:-1]
    first_tensor, first_file = next(iter(mapping(halves).items()))

    def index(metadata: str, tail: str = "") -> bytes:
        return ("{" + f'"metadata":{metadata},"weight_map":{weight_map}' + "}" + tail).encode()

    with_index(
        "dir-index-whitespace",
        b" \t\r\n" + index('{"total_size":256}') + b"\n\r\t ",
        "JSON whitespace (0x20, 0x09, 0x0D, 0x0A) before and after the index: rule c allows it",
        "ok",
    )
    with_index("dir-index-trailing-data", index("{}", " x"), "a stray token after the object")
    with_index("dir-index-second-value", index("{}", "{}"), "a second JSON value after the object")
    with_index("dir-index-infinity", index('{"total_size":Infinity}'), "Infinity in the metadata")
    with_index(
        "dir-index-python-true", index('{"sharded":True}'), "True (not JSON's true) in the metadata"
    )
    with_index(
        "dir-index-trailing-comma", index('{"total_size":256,}'), "a trailing comma in an object"
    )
    with_index(
        "dir-index-escaped-duplicate",
        (
            "{" + f'"weight_map":{{{body},"{first_tensor[:-1]}\\u{ord(first_tensor[-1]):04x}":'
            f'"{first_file}"}}' + "}"
        ).encode(),
        f"weight_map names {first_tensor!r} twice, once with its last letter escaped (rule d)",
    )
    with_index(
        "dir-index-duplicate-in-metadata",
        index('{"total_size":256,"total_size":256}'),
        "a key twice in metadata, outside weight_map (rule d: any object)",
    )
    with_index(
        "dir-index-duplicate-member",
        ("{" + f'"metadata":{{}},"weight_map":{weight_map},"metadata":{{}}' + "}").encode(),
        "the top-level member metadata twice",
    )
    with_index(
        "dir-index-surrogate-at-depth",
        index('{"a":[[{"b":["x","\\ud800"]}]]}'),
        "an unpaired surrogate escape in a list item four levels down (rule e, any depth)",
    )
    with_index(
        "dir-index-surrogate-key-at-depth",
        index('{"a":{"b":{"\\udc00":1}}}'),
        "an unpaired surrogate escape in a key three objects down",
    )
    # Section 2.2's limits: the index object is depth 1, metadata's value depth 2.
    with_index(
        "dir-index-depth-64",
        index("[" * 63 + "]" * 63),
        "arrays nested 64 deep, the index object counted: the limit",
        "ok",
    )
    with_index(
        "dir-index-depth-65",
        index("[" * 64 + "]" * 64),
        "arrays nested 65 deep: past the 64 of section 2.2, whatever a parser allows",
    )
    with_index(
        "dir-index-depth-1000",
        index('{"a":' * 999 + "1" + "}" * 999),
        "objects nested 1,000 deep (a parser's recursion limit must not decide)",
    )
    with_index(
        "dir-index-number-100",
        index('{"total_size":' + "9" * 100 + "}"),
        "a 100-digit integer: the longest number section 2.2 allows",
        "ok",
    )
    with_index(
        "dir-index-number-101",
        index('{"total_size":-' + "9" * 100 + "}"),
        "a number token of 101 characters (a sign and 100 digits)",
    )
    with_index(
        "dir-index-number-5000",
        index('{"total_size":' + "1" * 5000 + "}"),
        "a 5,000-digit integer (no integer-digit setting may decide)",
    )
    with_index(
        "dir-index-huge-exponent",
        index('{"total_size":1e400,"tiny":-1E-400,"pi":3.14159265358979323846264338327950288}'),
        "numbers past a double's range and precision: valid JSON numbers below the length limit",
        "ok",
    )
    with_index(
        "dir-index-unterminated-string",
        b'{"metadata":{"' + b'\\"' * 2000,
        'an index that ends inside a string holding 2,000 escaped quotes (\\")',
    )


def entries_and_links(
    b: Builder,
    shard_dir: Callable[[str, list[list[str]], dict[str, str] | None], Path],
    mapping: Callable[[list[list[str]]], dict[str, str]],
    halves: list[list[str]],
) -> None:
    """Section 6's Entries, rule h and the Links rule, with and without an index (issue 39)."""
    index_name = "model.safetensors.index.json"
    first, second = (f"model-0000{i}-of-00002.safetensors" for i in (1, 2))

    def add(name: str, description: str, full: str, **kw: Any) -> Vector:
        vector = Vector(name, name, description, "6", full, kind="directory", **kw)
        b.vectors.append(vector)
        return vector

    def link(path: Path, target: str) -> None:
        path.unlink(missing_ok=True)
        path.symlink_to(target)

    folder = shard_dir("dir-shard-dangling-link", halves, mapping(halves))
    link(folder / second, "gone.safetensors")
    add(
        "dir-shard-dangling-link",
        "the index names a dangling link: a missing shard",
        "invalid_file",
    )
    folder = shard_dir("dir-shard-link-loop", halves, mapping(halves))
    link(folder / second, second)
    add(
        "dir-shard-link-loop",
        "the index names a link to itself (a loop): a missing shard, not a crash",
        "invalid_file",
    )
    folder = shard_dir("dir-shard-is-directory", halves, mapping(halves))
    (folder / second).unlink()
    (folder / second).mkdir()
    (folder / second / "README.md").write_text("A directory named like a shard.\n")
    add(
        "dir-shard-is-directory",
        "the index names a directory called model-00002-of-00002.safetensors: a missing shard",
        "invalid_file",
    )
    index = {n: (f[0].upper() + f[1:] if f == second else f) for n, f in mapping(halves).items()}
    shard_dir("dir-shard-other-case", halves, index)
    add(
        "dir-shard-other-case",
        "the index names Model-00002-..., the file is model-00002-...: missing on every file "
        "system, since the listing decides (never an open)",
        "invalid_file",
    )
    folder = shard_dir("dir-dangling-link-beside", halves, None)
    link(folder / "gone.safetensors", "nowhere.safetensors")
    add("dir-dangling-link-beside", "no index; a dangling *.safetensors link is no shard", "ok")
    folder = shard_dir("dir-link-loop-beside", halves, mapping(halves))
    link(folder / "loop.safetensors", "loop.safetensors")
    add("dir-link-loop-beside", "a link loop the index does not name is not a stray file", "ok")
    folder = shard_dir("dir-directory-beside", halves, None)
    (folder / "sub.safetensors").mkdir()
    (folder / "sub.safetensors" / "README.md").write_text("A directory is not a shard.\n")
    add("dir-directory-beside", "no index; a directory named sub.safetensors is no shard", "ok")
    folder = shard_dir("dir-index-link-loop", halves, None)
    link(folder / index_name, index_name)
    add(
        "dir-index-link-loop",
        "model.safetensors.index.json is a link loop: no index file, the shards are judged alone",
        "ok",
    )
    # Links that stay inside the directory, at any depth: positives.
    folder = shard_dir("dir-link-inside", halves, mapping(halves))
    (folder / "blobs").mkdir()
    (folder / second).rename(folder / "blobs" / "second.bin")
    link(folder / second, "blobs/second.bin")
    add("dir-link-inside", "a shard that is a link into a subfolder of the directory", "ok")
    folder = shard_dir("dir-link-inside-no-index", halves, None)
    (folder / first).rename(folder / "first.bin")
    link(folder / first, "first.bin")
    add("dir-link-inside-no-index", "no index; a shard linked to a file beside it", "ok")
    folder = shard_dir("dir-index-link-inside", halves, None)
    (folder / "meta").mkdir()
    good = json.dumps({"weight_map": mapping(halves)}).encode()
    (folder / "meta" / "index.json").write_bytes(good)
    link(folder / index_name, "meta/index.json")
    add("dir-index-link-inside", "the index is a link to a file in a subfolder", "ok")
    # Links out: with an index, without one, as the index, as a stray.
    folder = shard_dir("dir-index-link-outside", halves, None)
    link(folder / index_name, "../sharded/" + index_name)
    add(
        "dir-index-link-outside",
        "the index is a link to another directory's index: it resolves outside",
        "invalid_file",
    )
    folder = shard_dir("dir-no-index-link-outside", halves, None)
    link(folder / second, "../sharded/" + second)
    add(
        "dir-no-index-link-outside",
        "no index; a shard is a link out of the directory (Links: with or without an index)",
        "invalid_file",
    )
    folder = shard_dir("dir-stray-link-outside", halves, mapping(halves))
    link(folder / "extra.safetensors", "../basic.safetensors")
    add(
        "dir-stray-link-outside", "a stray file that is a link out of the directory", "invalid_file"
    )
    folder = shard_dir("dir-shard-link-prefix", halves, mapping(halves))
    sibling = b.out / "dir-shard-link-prefix-2"
    sibling.mkdir()
    (folder / second).rename(sibling / second)
    link(folder / second, "../dir-shard-link-prefix-2/" + second)
    add(
        "dir-shard-link-prefix",
        "a shard linked into dir-shard-link-prefix-2, whose name starts with the directory's: "
        "outside (paths compare by components)",
        "invalid_file",
    )
    add(
        "dir-shard-link-prefix-2",
        "holds one shard, no index (the target of dir-shard-link-prefix)",
        "ok",
    )
    cache_snapshots(b, shard_dir, mapping, halves)
    made_directories(b)


def cache_snapshots(
    b: Builder,
    shard_dir: Callable[[str, list[list[str]], dict[str, str] | None], Path],
    mapping: Callable[[list[list[str]]], dict[str, str]],
    halves: list[list[str]],
) -> None:
    """Snapshots laid out as the Hugging Face cache lays them out: links into ``../../blobs``."""
    commit = "0123456789abcdef0123456789abcdef01234567"

    def snapshot(repo: str, source: Path, parent: str = "cache") -> Path:
        """``parent/repo/{blobs,refs,snapshots/commit}``, each file of ``source`` a blob."""
        root = b.out / parent / repo
        snap = root / "snapshots" / commit
        snap.mkdir(parents=True)
        (root / "blobs").mkdir()
        (root / "refs").mkdir()
        (root / "refs" / "main").write_text(commit)
        for file in sorted(source.iterdir()):
            data = file.read_bytes()
            blob = hashlib.sha256(data).hexdigest()
            (root / "blobs" / blob).write_bytes(data)
            (snap / file.name).symlink_to(f"../../blobs/{blob}")
        shutil.rmtree(source)
        return snap

    def add(name: str, snap: Path, description: str, full: str) -> None:
        path = snap.relative_to(b.out).as_posix()
        b.vectors.append(Vector(name, path, description, "6", full, kind="directory"))

    staging = b.out / "staging"
    shard_dir("staging", halves, mapping(halves))
    add(
        "cache-snapshot-sharded",
        snapshot("models--acme--sharded", staging),
        "a stock-cache snapshot: index and shards are links into ../../blobs",
        "ok",
    )
    shard_dir("staging", halves, None)
    add(
        "cache-snapshot-no-index",
        snapshot("models--acme--no-index", staging),
        "a stock-cache snapshot of two shards and no index",
        "ok",
    )
    shard_dir("staging", [halves[0] + halves[1]], None)
    add(
        "cache-snapshot-single",
        snapshot("models--acme--single", staging),
        "a stock-cache snapshot of one model.safetensors",
        "ok",
    )
    shard_dir("staging", halves, mapping(halves))
    snap = snapshot("models--acme--escape", staging)
    second = "model-00002-of-00002.safetensors"
    target = os.readlink(snap / second)
    (snap / second).unlink()
    (snap / second).symlink_to("../../../models--acme--sharded/blobs/" + target.split("/")[-1])
    add(
        "cache-snapshot-other-repo",
        snap,
        "a snapshot whose shard links into another repository's blobs: outside",
        "invalid_file",
    )
    shard_dir("staging", halves, mapping(halves))
    add(
        "cache-snapshot-not-a-repo",
        snapshot("acme--sharded", staging, parent="not-a-cache"),
        "the cache layout under a folder not named models--...: links into ../../blobs leave "
        "the directory",
        "invalid_file",
    )


def made_directories(b: Builder) -> None:
    """Vectors no source tree can hold, built by the runner from their ``made`` steps."""
    second = "model-00002-of-00002.safetensors"
    index_name = "model.safetensors.index.json"

    def add(name: str, kind: str, description: str, full: str, made: list[dict[str, Any]]) -> None:
        path = name if kind == "directory" else f"{name}.safetensors"
        b.vectors.append(Vector(name, path, description, "6, 9", full, kind=kind, made=made))

    def copy(name: str) -> dict[str, Any]:
        return {"op": "copy", "from": "sharded", "to": name}

    add(
        "dir-shard-fifo",
        "directory",
        "the index names a FIFO: a missing shard, judged without opening it",
        "invalid_file",
        [copy("dir-shard-fifo"), {"op": "remove", "path": f"dir-shard-fifo/{second}"},
         {"op": "fifo", "path": f"dir-shard-fifo/{second}"}],
    )  # fmt: skip
    add(
        "dir-fifo-beside",
        "directory",
        "a FIFO named x.safetensors beside the shards is not a stray file",
        "ok",
        [copy("dir-fifo-beside"), {"op": "fifo", "path": "dir-fifo-beside/x.safetensors"}],
    )
    add(
        "dir-socket-beside",
        "directory",
        "a socket named x.safetensors beside the shards is not a stray file",
        "ok",
        [copy("dir-socket-beside"), {"op": "socket", "path": "dir-socket-beside/x.safetensors"}],
    )
    add(
        "dir-index-fifo",
        "directory",
        "model.safetensors.index.json is a FIFO: not an index file, the shards are judged alone",
        "ok",
        [copy("dir-index-fifo"), {"op": "remove", "path": f"dir-index-fifo/{index_name}"},
         {"op": "fifo", "path": f"dir-index-fifo/{index_name}"}],
    )  # fmt: skip
    weight_map = json.loads((b.out / "sharded" / index_name).read_text())["weight_map"]
    good = json.dumps({"weight_map": weight_map})
    add(
        "dir-index-over-limit",
        "directory",
        "an index of 100,000,001 bytes (a valid index padded with spaces): rule a, by stat",
        "invalid_file",
        [copy("dir-index-over-limit"),
         {"op": "write", "path": f"dir-index-over-limit/{index_name}", "text": good,
          "pad_to": 100_000_001}],
    )  # fmt: skip
    add("path-fifo", "other", "PATH is a FIFO: invalid_file, without blocking", "invalid_file",
        [{"op": "fifo", "path": "path-fifo.safetensors"}])  # fmt: skip
    add(
        "path-socket",
        "other",
        "PATH is a Unix-domain socket",
        "invalid_file",
        [{"op": "socket", "path": "path-socket.safetensors"}],
    )
    add("path-missing", "other", "PATH does not exist", "invalid_file", [])


def paths_of_every_type(b: Builder) -> None:
    """Section 9, What a PATH is: links to a file or a directory, and what is neither."""
    target = "no-user-metadata.safetensors"
    (b.out / "path-link-to-file.safetensors").symlink_to(target)
    record = cmh.inspect(b.out / target).record
    assert record is not None
    vector = b.add("path-link-to-file", "PATH is a link to a valid file", "9", "ok")
    vector.details = describe(b.out / target)
    (b.out / "path-link-to-directory").symlink_to("sharded")
    b.vectors.append(
        Vector(
            "path-link-to-directory",
            "path-link-to-directory",
            "PATH is a link to a checkpoint directory",
            "6, 9",
            "ok",
            kind="directory",
        )
    )
    for name, link, description in (
        ("path-dangling-link", "gone.safetensors", "PATH is a dangling link"),
        ("path-link-loop", "path-link-loop.safetensors", "PATH is a link to itself"),
        ("path-char-device", "/dev/null", "PATH is a link to a character device (/dev/null)"),
    ):
        (b.out / f"{name}.safetensors").symlink_to(link)
        b.vectors.append(
            Vector(name, f"{name}.safetensors", description, "9", "invalid_file", kind="other")
        )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else OUT
    write_vectors(out)
    count = len(json.loads((out / "index.json").read_text())["vectors"])
    print(f"wrote {count} vectors to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
