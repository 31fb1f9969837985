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

import json
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
from cmh.digests import hash_tensors

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "vectors"
STAMPED_AT = 1_767_225_600  # 2026-01-01T00:00:00Z
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

    @property
    def negative(self) -> bool:
        """Made to fail: in full or fast mode, or with the signing key as the trusted one."""
        failing_signature = self.signature in ("invalid", "other") or self.made_to_fail_with_key
        return "ok" not in (self.full, self.fast or self.full) or failing_signature

    def _with_key(self, base: str, trusted: str, required: bool) -> str:
        """Section 9's order: a signature outcome comes after base's early outcomes."""
        if base in BEFORE_SIGNATURE:
            return base
        signer = {"valid": "signing", "invalid": "signing", "other": "other"}.get(
            self.signature or ""
        )
        if signer is None:
            found = "signature_missing" if required else None
        elif signer != trusted:
            found = "signature_untrusted"  # the key id decides first
        elif self.signature == "invalid":
            found = "signature_invalid"
        else:
            found = None
        return found or base

    def checks(self) -> list[dict[str, Any]]:
        at = ["--at", str(BEFORE)]
        out = [
            ("full", [*at], self.full),
            ("fast", ["--fast", *at], self.fast or self.full),
        ]
        if self.kind == "file":
            out += [
                ("key", ["--key", KEY, *at], self._with_key(self.full, "signing", True)),
                (
                    "key-allow-unsigned",
                    ["--key", KEY, "--allow-unsigned", *at],
                    self._with_key(self.full, "signing", False),
                ),
                (
                    "require-signature",
                    ["--key", KEY, "--require-signature", *at],
                    self._with_key(self.full, "signing", True),
                ),
                (
                    "fast-key",
                    ["--fast", "--key", KEY, *at],
                    self._with_key(self.full, "signing", True),
                ),
                ("other-key", ["--key", OTHER_KEY, *at], self._with_key(self.full, "other", True)),
            ]
        if self.expires_at and self.full == "ok":
            out += [
                ("before-expiry", ["--at", str(self.expires_at - 1)], "ok"),
                ("at-expiry", ["--at", str(self.expires_at)], "expired"),
            ]
        checks = [{"mode": m, "args": a, "outcome": o} for m, a, o in out]
        return checks

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
        cmh.stamp(path, ttl=ttl, now=now, xxh3=xxh3, sign_key=sign, threads=1)
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
    directories(b)
    index = {
        "format": "cmh-v1-vectors",
        "version": 1,
        "stamped_at": STAMPED_AT,
        "reader": (
            "Run the reader once per check: its command, then the check's args with {dir} "
            "replaced by this directory, then the vector's path. The reader prints one JSON "
            "object whose 'outcome' is one of section 9's names (or index_inconsistent)."
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
    cmh.stamp(odd, now=STAMPED_AT, threads=1)
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

    meta = split(base)[0]["__metadata__"]
    stale = ",".join("0" * 31 + "1" for _ in meta["cmh.xxh3"].split(","))
    rewrite(base, b.file("xxh3-stale"), set_metadata(cmh_xxh3=stale))
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


def directories(b: Builder) -> None:
    state = {f"layer.{i}.weight": grid((4, 4), np.float32, i) for i in range(4)}
    names = list(state)

    def shard_dir(name: str, parts: list[list[str]], index: dict[str, str] | None) -> Path:
        folder = b.out / name
        folder.mkdir()
        for i, part in enumerate(parts):
            file = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
            write_tensors(folder / file, arrays({n: state[n] for n in part}), {"format": "pt"})
            cmh.stamp(folder / file, now=STAMPED_AT, threads=1)
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
    cmh.stamp(single / "model.safetensors", now=STAMPED_AT, threads=1)
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else OUT
    write_vectors(out)
    count = len(json.loads((out / "index.json").read_text())["vectors"])
    print(f"wrote {count} vectors to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
