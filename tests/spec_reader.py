"""An independent CMH v1 reader written from spec/cmh-v1.md alone.

It imports nothing from cmh: JSON, SHA-256, XXH32, XXH3-128 and Ed25519
only. It is a *reader* in the sense of the conformance runner
(tools/conformance.py): given a file or checkpoint directory and the options
of section 10 it prints one JSON object with the section 9 outcome::

    python tests/spec_reader.py [--fast] [--key FILE]... [--require-signature]
                                [--allow-unsigned] [--at SECONDS] PATH
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
#: Section 9, in reporting order.
ORDER = [
    "ok", "invalid_file", "unstamped", "corrupt_record", "unsupported_version",
    "manifest_inconsistent", "root_mismatch", "tensor_mismatch", "signature_missing",
    "signature_invalid", "signature_untrusted", "expired",
]  # fmt: skip
U64_MAX = 2**64 - 1
INTEGER = re.compile(r"0|[1-9][0-9]*")  # section 2.5: no sign, fraction or exponent
MAX_DEPTH = 64  # section 2.2: arrays and objects nest at most 64 deep
MAX_NUMBER = 100  # section 2.2: no number token over 100 characters
LIMIT = 100_000_000  # sections 2.1 and 6 rule a


class Verdict(Exception):
    """Stops reading with one outcome."""

    def __init__(self, outcome: str, why: str = "") -> None:
        super().__init__(f"{outcome}: {why}")
        self.outcome = outcome


def hexed(text: object, width: int) -> bool:
    """Exactly ``width`` characters from [0-9a-f] (section 4)."""
    if not isinstance(text, str) or len(text) != width:
        return False
    return re.fullmatch("[0-9a-f]*", text) is not None


# -- section 2: the container -----------------------------------------------------------


class _Number:
    """A JSON number kept as written, judged by section 2.5."""

    def __init__(self, text: str) -> None:
        self.text = text


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        for s in (key, value):
            if isinstance(s, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in s):
                raise Verdict("invalid_file", "unpaired surrogate")
        if key in out:
            raise Verdict("invalid_file", f"duplicate key {key!r}")
        out[key] = value
    return out


def _bad_constant(name: str) -> Any:
    raise Verdict("invalid_file", f"{name} is not JSON")


def _count(value: object) -> int:
    if not isinstance(value, _Number) or not INTEGER.fullmatch(value.text):
        raise Verdict("invalid_file", "not an unsigned integer")
    if len(value.text) > 20:
        raise Verdict("invalid_file", "integer over 2^64-1")
    n = int(value.text)
    if n > U64_MAX:
        raise Verdict("invalid_file", "integer over 2^64-1")
    return n


#: The tokens that matter for section 2.2's limits: a string, a bracket, a number.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|-?[0-9][-+.0-9eE]*')


def check_limits(text: str) -> None:
    """Section 2.2's depth and number limits, on the text, before any parser sees it."""
    depth = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                raise Verdict("invalid_file", "nested too deep")
        elif token in ("]", "}"):
            depth -= 1
        elif token[0] != '"' and len(token) > MAX_NUMBER:
            raise Verdict("invalid_file", "number too long")


def read_regular(path: bytes | str, limit: int | None = None) -> bytes:
    """Section 9's PATH rule: stat first, open without blocking, check the open file again.

    ``limit``: a file larger than it (by fstat) raises Verdict before a byte is read.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise Verdict("invalid_file", "not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Verdict("invalid_file", "not a regular file")
        if limit is not None and info.st_size > limit:
            raise Verdict("invalid_file", "over the size limit")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass
class Parsed:
    tensors: list[tuple[str, str, list[int], int, int]]  # manifest order
    metadata: dict[str, str] | None
    buffer: bytes


def parse(data: bytes) -> Parsed:
    """Section 2, rule by rule; raises Verdict("invalid_file")."""
    if len(data) < 8:
        raise Verdict("invalid_file", "short")
    (n,) = struct.unpack("<Q", data[:8])
    if n > 100_000_000 or 8 + n > len(data):
        raise Verdict("invalid_file", "header length")
    try:
        text = data[8 : 8 + n].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Verdict("invalid_file", "not UTF-8") from exc
    if not text.startswith("{"):
        raise Verdict("invalid_file", "no {")
    check_limits(text)
    try:
        obj = json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_int=_Number,
            parse_float=_Number,
            parse_constant=_bad_constant,
        )
    except ValueError as exc:
        raise Verdict("invalid_file", "not JSON") from exc
    metadata = None
    if "__metadata__" in obj:
        metadata = obj.pop("__metadata__")
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise Verdict("invalid_file", "__metadata__")
    buffer = data[8 + n :]
    tensors = []
    for name, info in obj.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise Verdict("invalid_file", "tensor keys")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in BITS or not isinstance(shape, list) or not isinstance(offsets, list):
            raise Verdict("invalid_file", "tensor entry")
        dims = [_count(d) for d in shape]
        if len(offsets) != 2:
            raise Verdict("invalid_file", "offsets")
        begin, end = _count(offsets[0]), _count(offsets[1])
        if begin > end:
            raise Verdict("invalid_file", "begin > end")
        elements = 1
        for d in dims:
            elements *= d
        if elements * BITS[dtype] != 8 * (end - begin):
            raise Verdict("invalid_file", "size")
        tensors.append((name, dtype, dims, begin, end))
    tensors.sort(key=lambda t: (t[3], t[4], t[0].encode()))
    position = 0
    for t in tensors:
        if t[3] != position:
            raise Verdict("invalid_file", "gap or overlap")
        position = t[4]
    if position != len(buffer):
        raise Verdict("invalid_file", "coverage")
    return Parsed(tensors, metadata, buffer)


# -- section 5/6: roots -------------------------------------------------------------------


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def tensor_entries(tensors: list[tuple[str, str, list[int], bytes]]) -> bytes:
    """Section 5's tensor part; each tensor as (name, dtype, shape, SHA-256 digest)."""
    out = u64(len(tensors))
    for name, dtype, shape, digest in sorted(tensors, key=lambda t: t[0].encode()):
        n, d = name.encode(), dtype.encode()
        out += u32(len(n)) + n + u32(len(d)) + d + u32(len(shape))
        out += b"".join(u64(x) for x in shape) + digest
    return out


def sha256_digests(parsed: Parsed) -> list[bytes]:
    return [hashlib.sha256(parsed.buffer[b:e]).digest() for _, _, _, b, e in parsed.tensors]


def root(parsed: Parsed, digests: list[bytes] | None = None) -> bytes:
    digests = sha256_digests(parsed) if digests is None else digests
    entries = [(t[0], t[1], t[2], d) for t, d in zip(parsed.tensors, digests, strict=True)]
    covered = {
        k: v for k, v in (parsed.metadata or {}).items() if k != "cmh" and not k.startswith("cmh.")
    }
    body = b"CMH-FP-v1\n" + tensor_entries(entries)
    items = sorted((k.encode(), v.encode()) for k, v in covered.items())
    body += u64(len(items))
    for k, v in items:
        body += u32(len(k)) + k + u32(len(v)) + v
    return hashlib.sha256(body).digest()


def directory_identity(shards: list[Parsed]) -> bytes:
    entries = []
    for shard in shards:
        digests = sha256_digests(shard)
        entries += [(t[0], t[1], t[2], d) for t, d in zip(shard.tensors, digests, strict=True)]
    return hashlib.sha256(b"CMH-DIR-v1\n" + tensor_entries(entries)).digest()


# -- sections 3, 4, 7, 9: one file ----------------------------------------------------------


@dataclass
class Options:
    keys: dict[str, Ed25519PublicKey]
    require: bool
    fast: bool
    at: int


@dataclass
class Record:
    version: int
    expires_at: int
    fingerprint: bytes
    flags: int
    stamped_at: int
    raw: bytes


def record(value: str) -> Record:
    """Section 3, in its order; raises Verdict."""
    if not hexed(value, 128):
        raise Verdict("corrupt_record", "not 128 lowercase hex")
    raw = bytes.fromhex(value)
    if raw[:4] != b"CMH\x00":
        raise Verdict("corrupt_record", "magic")
    if raw[4] != 1:
        raise Verdict("unsupported_version", str(raw[4]))
    if struct.unpack("<I", raw[60:])[0] != xxhash.xxh32_intdigest(raw[:60], seed=0):
        raise Verdict("corrupt_record", "check")
    if raw[0x2E:0x3C] != bytes(14) or raw[0x29] & 0xF8:
        raise Verdict("corrupt_record", "reserved or flags")
    (expires_at,) = struct.unpack("<I", raw[5:9])
    (stamped_at,) = struct.unpack("<I", raw[0x2A:0x2E])
    return Record(raw[4], expires_at, raw[9:41], raw[0x29], stamped_at, raw)


def manifest(
    metadata: dict[str, str], key: str, width: int, flagged: bool, count: int
) -> list[bytes] | None:
    """Section 4: the digests of a flagged manifest, ``None`` for an unflagged one."""
    text = metadata.get(key)
    if not flagged:
        if text is not None and set(text) - {"0", ","}:
            raise Verdict("manifest_inconsistent", f"{key} not announced")
        return None
    if text is None:
        raise Verdict("manifest_inconsistent", f"{key} missing")
    items = text.split(",") if text else []
    if len(items) != count or not all(hexed(i, width) for i in items):
        raise Verdict("manifest_inconsistent", key)
    return [bytes.fromhex(i) for i in items]


def verify_file(path: Path | bytes, options: Options) -> str:
    try:
        return _verify(parse(read_regular(path)), options)
    except Verdict as verdict:
        return verdict.outcome
    except OSError:  # no file to read is no valid file
        return "invalid_file"


def _verify(parsed: Parsed, options: Options) -> str:
    metadata = parsed.metadata or {}
    if "cmh" not in metadata:
        return "unstamped"
    rec = record(metadata["cmh"])
    count = len(parsed.tensors)
    sha = manifest(metadata, "cmh.sha256", 64, bool(rec.flags & 1), count)
    fast_manifest = manifest(metadata, "cmh.xxh3", 32, bool(rec.flags & 4), count)
    sig, key_id = metadata.get("cmh.sig"), metadata.get("cmh.key")
    if not hexed(sig, 128) or not hexed(key_id, 16):
        raise Verdict("manifest_inconsistent", "cmh.sig / cmh.key")
    assert sig is not None and key_id is not None
    signed = bool(rec.flags & 2)
    if signed == (set(sig) == {"0"}) or signed == (set(key_id) == {"0"}):
        raise Verdict("manifest_inconsistent", "signature values against bit1")

    checks_signature = bool(options.keys) or options.require
    fast = options.fast and not checks_signature and sha is not None and fast_manifest is not None
    found: set[str] = set()
    if sha is not None:
        if root(parsed, sha) != rec.fingerprint:
            found.add("root_mismatch")
        if fast:
            assert fast_manifest is not None
            actual = [xxhash.xxh3_128_digest(parsed.buffer[b:e]) for *_, b, e in parsed.tensors]
            if actual != fast_manifest:
                found.add("tensor_mismatch")
        elif sha256_digests(parsed) != sha:
            found.add("tensor_mismatch")
    elif root(parsed) != rec.fingerprint:
        found.add("root_mismatch")

    if not signed:
        if options.require:
            found.add("signature_missing")
    elif options.keys:
        public = options.keys.get(key_id)
        if public is None:
            found.add("signature_untrusted")
        else:
            try:
                public.verify(bytes.fromhex(sig), b"CMH-SIG-v1\x00" + rec.raw)
            except InvalidSignature:
                found.add("signature_invalid")
    elif options.require:
        found.add("signature_untrusted")
    if rec.expires_at != 0 and options.at >= rec.expires_at:
        found.add("expired")
    return min(found, key=ORDER.index) if found else "ok"


# -- section 6: a checkpoint directory --------------------------------------------------


def _strings(value: Any) -> list[str]:
    """Every string in a parsed JSON value that is not an object key or member value."""
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            out += [x for x in item if isinstance(x, str)]
            stack += item
        elif isinstance(item, dict):
            stack += item.values()
    return out


def read_index(data: bytes) -> dict[str, str]:
    """Section 6 index rules b-g (rule a is judged by stat, before reading); raises Verdict."""
    if len(data) > LIMIT or data.startswith(b"\xef\xbb\xbf"):
        raise Verdict("invalid_file", "index size or byte-order mark")
    try:
        text = data.decode("utf-8")
        check_limits(text)
        obj = json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_int=_Number,
            parse_float=_Number,
            parse_constant=_bad_constant,
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise Verdict("invalid_file", "index is not UTF-8 JSON") from exc
    if any(0xD800 <= ord(c) <= 0xDFFF for s in _strings(obj) for c in s):
        raise Verdict("invalid_file", "unpaired surrogate in a list")
    weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise Verdict("invalid_file", "no weight_map, or an empty one")
    for name in weight_map.values():
        if not isinstance(name, str) or not name.endswith(".safetensors"):
            raise Verdict("invalid_file", "shard name")
        if "/" in name or "\\" in name or "\0" in name:
            raise Verdict("invalid_file", "shard name is not a plain file name")
    return weight_map


def verify_directory(folder: Path, options: Options) -> str:
    try:
        return _verify_directory(os.fsencode(folder), options)
    except Verdict as verdict:
        return verdict.outcome
    except OSError:
        return "invalid_file"


def _is_regular(path: bytes) -> bool:
    """Section 6: the type after following links, by stat; no type learnt is not regular."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _allowed_root(folder: bytes) -> bytes:
    """Section 6, Links: the directory's real path, or a cache snapshot's repository folder."""
    real = os.path.realpath(folder)
    parent = os.path.dirname(real)
    repo = os.path.dirname(parent)
    cache = (b"models--", b"datasets--", b"spaces--")
    if os.path.basename(parent) == b"snapshots" and os.path.basename(repo).startswith(cache):
        return repo
    return real


def _stays_inside(folder: bytes, name: bytes, allowed: bytes) -> bool:
    real = os.path.realpath(os.path.join(folder, name)).split(b"/")
    parts = allowed.rstrip(b"/").split(b"/")
    return len(real) > len(parts) and real[: len(parts)] == parts


def _verify_directory(folder: bytes, options: Options) -> str:
    names = sorted(e.name for e in os.scandir(folder) if _is_regular(os.path.join(folder, e.name)))
    indexes = [n for n in names if n.endswith(b".safetensors.index.json")]
    top = [n for n in names if n.endswith(b".safetensors")]
    allowed = _allowed_root(folder)
    weight_map: dict[str, str] | None = None
    if indexes:
        chosen = b"model.safetensors.index.json"
        chosen = chosen if chosen in indexes else indexes[0]
        if not _stays_inside(folder, chosen, allowed):
            return "invalid_file"
        weight_map = read_index(read_regular(os.path.join(folder, chosen), LIMIT))
        shards = sorted({v.encode("utf-8") for v in weight_map.values()})
        if any(name not in names for name in shards):  # the listing decides (rule h)
            return "invalid_file"
    else:
        shards = top
        if not shards:
            return "invalid_file"
    files = sorted(set(shards) | set(top))
    if not all(_stays_inside(folder, name, allowed) for name in files):
        return "invalid_file"
    outcomes = {name: verify_file(os.path.join(folder, name), options) for name in files}
    if "invalid_file" in outcomes.values():
        return "invalid_file"
    holder: dict[str, bytes] = {}
    disagree = len(indexes) > 1 or (weight_map is not None and set(top) - set(shards) != set())
    for name in shards:
        tensors = parse(read_regular(os.path.join(folder, name))).tensors
        for tensor in tensors:
            disagree |= tensor[0] in holder
            holder[tensor[0]] = name
    if weight_map is not None:
        disagree |= set(weight_map) != set(holder)
        disagree |= any(holder.get(t) != f.encode("utf-8") for t, f in weight_map.items())
    if disagree:
        return "index_inconsistent"
    return min(outcomes.values(), key=lambda o: ORDER.index(o) if o != "ok" else len(ORDER))


# -- the reader's command line (section 10) ----------------------------------------------


def load_keys(paths: list[str]) -> dict[str, Ed25519PublicKey]:
    keys = {}
    for item in paths:
        key = serialization.load_pem_public_key(Path(item).read_bytes())
        assert isinstance(key, Ed25519PublicKey)
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        keys[hashlib.sha256(raw).hexdigest()[:16]] = key
    return keys


def run(argv: list[str]) -> dict[str, object]:
    """The reader's answer for one command line."""
    parser = argparse.ArgumentParser(prog="spec_reader")
    parser.add_argument("path")
    parser.add_argument("--fast", action="store_true")
    parser.add_argument("--key", action="append", default=[])
    parser.add_argument("--require-signature", action="store_true")
    parser.add_argument("--allow-unsigned", action="store_true")
    parser.add_argument("--at", type=int, required=True)
    args = parser.parse_args(argv)
    keys = load_keys(args.key)
    require = args.require_signature or (bool(keys) and not args.allow_unsigned)
    options = Options(keys, require, args.fast, args.at)
    path = Path(args.path)
    try:  # section 9, What a PATH is: its type by stat, links followed
        mode = os.stat(path).st_mode
    except OSError:
        return {"outcome": "invalid_file"}
    if stat.S_ISDIR(mode):
        return {"outcome": verify_directory(path, options)}
    return {"outcome": verify_file(path, options)}


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(run(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
