"""Differential run: hostile files and checkpoint directories through cmh and the spec reader.

tests/spec_reader.py was written from spec/cmh-v1.md alone. On every generated
input, in a mode picked at random, ``cmh verify --json`` (in this process) and
the spec reader must report the same outcome; cmh never raises, and its JSON
holds only valid Unicode. ``cmh fingerprint --json DIR`` must name the same
``invalid_file`` / ``index_inconsistent`` as ``cmh verify DIR``. A few runs of
the real ``cmh`` command check the bytes on stdout are UTF-8 JSON and that no
traceback reaches stderr, whatever the file names.

The inputs include what is not a regular file (FIFOs, sockets, devices, link
loops, dangling links: as PATH, as a shard, a stray or the index), deep and wide
JSON and huge numbers (spec 2.2's own limits), and snapshots laid out as the
Hugging Face cache lays them out, some with a link out. The real command then
runs over every case with ``PYTHONINTMAXSTRDIGITS`` at its default and at 0
(under a small recursion limit): the outcomes must be equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import spec_reader
import xxhash
from click.testing import CliRunner
from cmh.cli.main import cli
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import cmh

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "fixtures" / "vectors"
SIGNING_SEED = bytes(range(32))  # tools/make_vectors.py's signing key, whose public half is here
KEY = str(VECTORS / "signing-key.pub")
OTHER_KEY = str(VECTORS / "other-key.pub")
AT = 1_767_225_601
MODES = [
    [],
    ["--fast"],
    ["--key", KEY],
    ["--key", KEY, "--allow-unsigned"],
    ["--key", KEY, "--require-signature"],
    ["--fast", "--key", KEY],
    ["--fast", "--key", KEY, "--allow-unsigned"],
    ["--key", OTHER_KEY],
]
FILES = 320
DIRECTORIES = 320
CACHE_SNAPSHOTS = 40
INDEX = "model.safetensors.index.json"

Header = dict[str, Any]


# -- writing ------------------------------------------------------------------------------


def container(header: bytes, buffer: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + buffer


def tensors_file(tensors: dict[str, tuple[str, list[int], bytes]], meta: dict[str, str]) -> bytes:
    obj: Header = {"__metadata__": meta} if meta else {}
    buffer = b""
    for name, (dtype, shape, data) in tensors.items():
        obj[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(buffer), len(buffer) + len(data)],
        }
        buffer += data
    return container(json.dumps(obj).encode(), buffer)


def split(data: bytes) -> tuple[Header, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def stamp_bytes(folder: Path, name: str, data: bytes, **kw: Any) -> bytes:
    path = folder / name
    path.write_bytes(data)
    cmh.stamp(path, now=AT - 1, hashing=cmh.Hashing(threads=1), **kw)
    return path.read_bytes()


@dataclass(frozen=True)
class Seeds:
    files: list[bytes]  # valid files: unsigned, signed, no XXH3, expiring, unstamped
    shards: dict[str, bytes]  # two stamped shards of one state, by tensor group
    state: dict[str, tuple[str, list[int], bytes]]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Seeds:
    folder = tmp_path_factory.mktemp("seeds")
    key = Ed25519PrivateKey.from_private_bytes(SIGNING_SEED)
    base = tensors_file(
        {
            "w": ("F32", [2, 3], bytes(range(24))),
            "b": ("F16", [3], b"abcdef"),
            "e": ("U8", [0], b""),
        },
        {"format": "pt"},
    )
    files = [
        stamp_bytes(folder, "a", base, ttl="30d"),
        stamp_bytes(folder, "b", base, sign_key=key),
        stamp_bytes(folder, "c", base, xxh3=False),
        stamp_bytes(folder, "d", base, ttl=1),
        base,
    ]
    state = {f"t.{i}": ("F32", [2, 2], bytes(range(16 * i, 16 * i + 16))) for i in range(4)}
    shards = {
        "ab": stamp_bytes(
            folder, "s1", tensors_file({k: state[k] for k in ("t.0", "t.1")}, {"f": "pt"})
        ),
        "cd": stamp_bytes(
            folder, "s2", tensors_file({k: state[k] for k in ("t.2", "t.3")}, {"f": "pt"})
        ),
        "bc": stamp_bytes(
            folder, "s3", tensors_file({k: state[k] for k in ("t.1", "t.2")}, {"f": "pt"})
        ),
        "cd-signed": stamp_bytes(
            folder,
            "s4",
            tensors_file({k: state[k] for k in ("t.2", "t.3")}, {"f": "pt"}),
            sign_key=key,
        ),
        "ab-unstamped": tensors_file({k: state[k] for k in ("t.0", "t.1")}, {"f": "pt"}),
    }
    return Seeds(files, shards, state)


# -- hostile files ------------------------------------------------------------------------


def _record_variant(rng: random.Random, value: str) -> str:
    try:
        raw = bytearray(bytes.fromhex(value))
    except ValueError:  # an earlier mutation already broke it
        return value
    choice = rng.randrange(8)
    if choice == 0:
        return value.upper()
    if choice == 1:
        return value[: rng.choice([126, 127])] if rng.random() < 0.5 else value + "00"
    if choice == 2:
        return value[:-1] + rng.choice("gG ")
    offset = rng.choice([0, 4, 4, 0x29, 0x29, 0x30, 0x3C, 5])
    raw[offset] = rng.choice([0, 1, 2, 0x08, 0xFF, raw[offset] ^ 0x01])
    if rng.random() < 0.7:  # recompute the check, so the later steps are reached
        raw[60:] = struct.pack("<I", xxhash.xxh32_intdigest(bytes(raw[:60]), seed=0))
    return raw.hex()


def _manifest_variant(rng: random.Random, value: str) -> str | None:
    items = value.split(",") if value else []
    choice = rng.randrange(7)
    if choice == 0:
        return None
    if choice == 1:
        return value.upper()
    if choice == 2:
        return value + ","
    if choice == 3:
        return ", ".join(items)
    if choice == 4:
        return ",".join("0" * len(i) for i in items)
    if choice == 5:
        return ",".join(items[:-1])
    return ",".join(reversed(items))


def _mutate_metadata(rng: random.Random, meta: dict[str, Any]) -> None:
    key = rng.choice(
        [
            "cmh",
            "cmh",
            "cmh",
            "cmh.sha256",
            "cmh.xxh3",
            "cmh.sig",
            "cmh.key",
            "cmh.future",
            "format",
        ]
    )
    value = meta.get(key)
    if key == "cmh" and isinstance(value, str):
        meta[key] = _record_variant(rng, value)
    elif key in ("cmh.sha256", "cmh.xxh3") and isinstance(value, str):
        variant = _manifest_variant(rng, value)
        if variant is None:
            meta.pop(key)
        else:
            meta[key] = variant
    elif key in ("cmh.sig", "cmh.key"):
        width = 128 if key == "cmh.sig" else 16
        meta[key] = rng.choice(
            ["0" * width, "5a" * (width // 2), "0" * (width - 2), "0" * (width + 2), "A" * width]
        )
        if rng.random() < 0.2:
            meta.pop(key)
    elif key == "cmh.future":
        meta[key] = "anything"
    else:
        meta[key] = rng.choice(["np", "changed", 1, None])


def _mutate_tensor(rng: random.Random, obj: Header) -> None:
    names = [n for n in obj if n != "__metadata__"]
    if not names:
        return
    name = rng.choice(names)
    info = obj[name]
    choice = rng.randrange(8)
    if not isinstance(info, dict) or len(info.get("data_offsets", ())) != 2 or "shape" not in info:
        return  # an earlier mutation already broke this tensor
    if choice == 0:
        info["dtype"] = rng.choice(["I32", "U32", "f32", "F64", "U4", "BF16", "F4"])
    elif choice == 1:
        info["shape"] = rng.choice(
            [
                list(reversed(info["shape"])),
                [*info["shape"], 1],
                [2**64 - 1, 0],
                [2**64, 0],
                [4611686018427387905, 4],
                ["#4.0"],
                ["#-0"],
                ["#1e0"],
            ]
        )
    elif choice == 2:
        begin, end = info["data_offsets"]
        info["data_offsets"] = rng.choice(
            [
                [begin],
                [begin, end, end],
                [end, begin],
                [begin + 1, end],
                ["#-0", end],
                [begin, 2**64],
            ]
        )
    elif choice == 3:
        obj[name + rng.choice(["x", "\ud800", "\u00e9"])] = obj.pop(name)
    elif choice == 4:
        info["extra"] = 1
    elif choice == 5:
        obj["z"] = {"dtype": "U8", "shape": [0], "data_offsets": [1, 1]}
    elif choice == 6:
        del info["dtype"]
    else:
        obj[name] = rng.choice([None, [], "x"])


def _text_variant(rng: random.Random, text: bytes) -> bytes:
    choice = rng.randrange(10)
    if choice == 0:
        return b"\xef\xbb\xbf" + text
    if choice == 1:
        return text + rng.choice([b"\t\n\r ", b"  ", b"x", b"\x00", b"}"])
    if choice == 2:
        return text.replace(b'"format"', b'"format":"a","\\u0066ormat"', 1)
    if choice == 3:
        return text.replace(b'"w"', rng.choice([b'"w\xff"', b'"w\xc0\xaf"', b'"w\xed\xa0\x80"']), 1)
    if choice == 4:
        return text.replace(b'"dtype"', b'"dtype": "F32", "dtype"', 1)
    if choice == 5:
        return text.replace(
            b"[0, 24]", rng.choice([b"[0, NaN]", b"[0, 24.0]", b"[0, Infinity]"]), 1
        )
    if choice == 6:
        return b" " + text
    if choice == 7:  # huge numbers where a count must be (issue 39)
        return text.replace(b"[0, 24]", b"[0, " + b"9" * rng.choice([21, 101, 5000]) + b"]", 1)
    if choice == 8:  # deep JSON in the header
        return text.replace(b'"pt"', rng.choice(METADATA_VALUES)(rng).encode(), 1)
    return text


def hostile_file(rng: random.Random, seeds: Seeds) -> bytes:
    data = rng.choice(seeds.files)
    obj, buffer = split(data)
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.randrange(4)
        if kind == 0 and isinstance(obj.get("__metadata__"), dict):
            _mutate_metadata(rng, obj["__metadata__"])
        elif kind == 1:
            _mutate_tensor(rng, obj)
        elif kind == 2 and buffer:
            at = rng.randrange(len(buffer))
            buffer = buffer[:at] + bytes([buffer[at] ^ 0x01]) + buffer[at + 1 :]
        elif kind == 3 and rng.random() < 0.3:
            obj["__metadata__"] = rng.choice([None, "x", {"n": 1}])
    text = json.dumps(obj).encode()
    for marker in (b"4.0", b"-0", b"1e0"):  # numbers JSON writers never make
        text = text.replace(b'"#' + marker + b'"', marker)
    if rng.random() < 0.35:
        text = _text_variant(rng, text)
    out = container(text, buffer)
    if rng.random() < 0.03:
        out = rng.choice([out[:5], struct.pack("<Q", 100_000_001) + out[8:], out + b"!"])
    return out


# -- hostile directories --------------------------------------------------------------------

SHARD_NAMES = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "extra.safetensors",
    "caf\u00e9.safetensors",
    "cafe\u0301.safetensors",
]
GROUP_TENSORS = {
    "ab": ["t.0", "t.1"],
    "cd": ["t.2", "t.3"],
    "bc": ["t.1", "t.2"],
    "cd-signed": ["t.2", "t.3"],
    "ab-unstamped": ["t.0", "t.1"],
}
RAW_NAMES = [b"\xff.safetensors", b"m\xc0\xaf.safetensors", b"\xed\xa0\x80.safetensors"]


#: JSON values for an index's ``metadata``: deep, wide, huge numbers (issue 39). The index
#: object is depth 1, so a metadata value of depth d makes an index of depth d + 1.
def _deep(depth: int, rng: random.Random) -> str:
    opener = rng.choice(["[", '{"k":'])
    closer = "]" if opener == "[" else "}"
    return opener * depth + "1" + closer * depth


METADATA_VALUES: list[Callable[[random.Random], str]] = [
    lambda rng: _deep(rng.choice([62, 63, 63, 64, 64, 65, 200, 1000, 5000]), rng),
    lambda rng: "[" + ",".join(["[]"] * rng.choice([10, 10_000])) + "]",
    lambda rng: "{" + ",".join(f'"k{i}":{i}' for i in range(rng.choice([10, 5_000]))) + "}",
    lambda rng: rng.choice(["", "-"]) + "9" * rng.choice([20, 99, 100, 101, 4300, 4301, 5000]),
    lambda rng: rng.choice(["1e400", "-1E-400", "0.1e99999", "1." + "5" * 98, "1." + "5" * 99]),
    lambda rng: rng.choice(["Infinity", "-Infinity", "True", "None", "'x'", "0x10", "01", "+1"]),
]


def _index_text(rng: random.Random, weight_map: dict[str, Any]) -> bytes:
    choice = rng.randrange(24)  # 13 and over: a well-formed index (but its metadata)
    if choice == 0:
        weight_map = {
            k: rng.choice(["./", ""]) + v + rng.choice(["/", ""]) for k, v in weight_map.items()
        }
    elif choice == 1 and weight_map:
        k = next(iter(weight_map))
        weight_map[k] = rng.choice(
            [
                "sub/" + weight_map[k],
                "a\\b.safetensors",
                "x\u0000.safetensors",
                "\udcff.safetensors",
                "model.bin",
                "../basic.safetensors",
                "gone.safetensors",
                1,
            ]
        )
    elif choice == 2:
        weight_map = {}
    elif choice == 3:
        weight_map["t.9"] = "model-00001-of-00002.safetensors"
    elif choice == 4 and weight_map:
        weight_map.pop(next(iter(weight_map)))
    obj: Any = {"metadata": {"total_size": 64}, "weight_map": weight_map}
    if choice == 5:
        obj = rng.choice([[1], "x", {"metadata": {}}, {"weight_map": [1]}])
    text = json.dumps(obj).encode()
    if choice == 6:
        text = b"\xef\xbb\xbf" + text
    elif choice == 7:
        text = text.replace(b"64", b"NaN")
    elif choice == 8 and weight_map:
        k = json.dumps(next(iter(weight_map))).encode()
        text = text.replace(b'"weight_map": {', b'"weight_map": {' + k + b': "x.safetensors", ', 1)
    elif choice == 9:
        text = text.replace(b'"metadata"', b'"m\\ud800"')
    elif choice == 10:
        text = b" \n" + text + b"\t\r\n"
    elif choice == 11:
        text = text.replace(b'"metadata"', rng.choice([b'"m\xff"', b'"m\xed\xa0\x80"']))
    elif choice == 12:
        text = text[: len(text) // 2]
    elif choice in (13, 14, 15, 16):
        text = text.replace(b"64", rng.choice(METADATA_VALUES)(rng).encode(), 1)
    elif choice == 17:
        text = text + rng.choice([b" x", b"{}", b",", b"\x00", b"//", b" \t\r\n"])
    elif choice == 18 and weight_map:
        k, v = next(iter(weight_map.items()))
        escaped = json.dumps(k)[:-2] + f"\\u{ord(k[-1]):04x}" + '"'
        text = text.replace(b'"weight_map": {', b'"weight_map": {' + escaped.encode() + b": "
                            + json.dumps(v).encode() + b", ", 1)  # fmt: skip
    return text


def _special_entry(rng: random.Random, folder: Path, name: str) -> None:
    """``name`` in ``folder`` made something that is not a regular file (issue 39)."""
    path = folder / name
    path.unlink(missing_ok=True)
    kind = rng.randrange(7)
    if kind == 0:
        os.mkfifo(path)
    elif kind == 1:
        bind_socket(path)
    elif kind == 2:
        path.symlink_to(name)  # a loop
    elif kind == 3:
        path.symlink_to("gone.safetensors")
    elif kind == 4:
        path.symlink_to("/dev/null")
    elif kind == 5:
        path.mkdir()
    else:
        (folder / "a-loop").symlink_to("b-loop")
        (folder / "b-loop").symlink_to("a-loop")
        path.symlink_to("a-loop")


def bind_socket(path: Path) -> None:
    """A Unix-domain socket file at ``path`` (bound through /proc/self/fd: short address)."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(f"/proc/self/fd/{parent}/{path.name}")
    finally:
        os.close(parent)


def hostile_directory(
    rng: random.Random, seeds: Seeds, folder: Path, files: Callable[[], bytes]
) -> None:
    folder.mkdir()
    layout = rng.choice(
        [("ab", "cd"), ("ab", "cd"), ("ab", "bc"), ("ab", "cd-signed"), ("ab-unstamped", "cd")]
    )
    names = (
        rng.sample(SHARD_NAMES[:2] + SHARD_NAMES[3:], 2) if rng.random() < 0.3 else SHARD_NAMES[:2]
    )
    weight_map: dict[str, Any] = {}
    for name, group in zip(names, layout, strict=True):
        if rng.random() < 0.1:
            (folder / name).write_bytes(files())
            continue
        (folder / name).write_bytes(seeds.shards[group])
        for tensor in GROUP_TENSORS[group]:
            weight_map.setdefault(tensor, name)
    if rng.random() < 0.7:
        (folder / rng.choice([INDEX, INDEX, "a.safetensors.index.json"])).write_bytes(
            _index_text(rng, weight_map)
        )
        if rng.random() < 0.1:
            (folder / "b.safetensors.index.json").write_bytes(b"{}")
    extra = rng.randrange(14)
    if extra in (10, 11):  # a shard, a stray or the index that is no regular file
        victims = [*names, INDEX, "stray.safetensors"]
        _special_entry(rng, folder, rng.choice(victims))
    elif extra == 12 and (folder / names[0]).exists():  # a link inside, at some depth
        (folder / "blobs").mkdir(exist_ok=True)
        (folder / names[0]).rename(folder / "blobs" / "x")
        (folder / names[0]).symlink_to(rng.choice(["blobs/x", "./blobs/../blobs/x"]))
    elif extra == 13:  # a link to a sibling whose name starts with this directory's
        sibling = folder.parent / (folder.name + "-x")
        sibling.mkdir(exist_ok=True)
        (sibling / "s.safetensors").write_bytes(seeds.shards["ab"])
        (folder / "s.safetensors").symlink_to(f"../{folder.name}-x/s.safetensors")
    elif extra == 0:
        (folder / os.fsdecode(rng.choice(RAW_NAMES))).write_bytes(seeds.shards["ab"])
    elif extra == 1:
        (folder / "extra.safetensors").write_bytes(rng.choice([seeds.shards["bc"], b"\x05\x00"]))
    elif extra == 2:
        (folder / "link.safetensors").symlink_to(rng.choice(["../outside.safetensors", "gone"]))
    elif extra == 3:
        (folder / "dir.safetensors").mkdir()
    elif extra == 4:
        for name in names:
            (folder / name).unlink()
        if rng.random() < 0.5:
            (folder / os.fsdecode(rng.choice(RAW_NAMES))).write_bytes(seeds.shards["ab"])


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_snapshot(rng: random.Random, seeds: Seeds, cache: Path, i: int) -> Path:
    """A snapshot laid out as the Hugging Face cache lays it out, sometimes with a way out."""
    prefix = rng.choice(["models--", "models--", "datasets--", "", "models-"])
    repo = cache / f"{prefix}org--m{i}"
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    groups = rng.choice([("ab", "cd"), ("ab", "cd-signed"), ("ab", "bc")])
    weight_map: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for name, group in zip(SHARD_NAMES[:2], groups, strict=True):
        files[name] = seeds.shards[group]
        for tensor in GROUP_TENSORS[group]:
            weight_map.setdefault(tensor, name)
    if rng.random() < 0.7:
        files[INDEX] = json.dumps(
            {"metadata": {"total_size": 64}, "weight_map": weight_map}
        ).encode()
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snap / name).symlink_to(f"../../blobs/{blob}")
    way = rng.randrange(8)
    victim = snap / rng.choice(list(files))
    if way == 0:  # into another repository's blobs
        other = cache / "models--org--other" / "blobs"
        other.mkdir(parents=True, exist_ok=True)
        (other / "x").write_bytes(victim.read_bytes())
        victim.unlink()
        victim.symlink_to("../../../models--org--other/blobs/x")
    elif way == 1:  # a blob gone: a dangling link
        os.unlink(os.path.realpath(victim))
    elif way == 2:  # a link to a link inside the repository folder
        (repo / "refs").mkdir()
        target = os.readlink(victim)
        (repo / "refs" / "alias").symlink_to("../blobs/" + target.split("/")[-1])
        victim.unlink()
        victim.symlink_to("../../refs/alias")
    return snap


# -- the run --------------------------------------------------------------------------------


def cmh_verify(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["verify", "--json", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (0, 1, 3), result.output
    document = json.loads(result.stdout)
    _assert_unicode(document)
    return document


def _assert_unicode(value: Any) -> None:
    """Every string in a document encodes as UTF-8 (no lone surrogate from a file name)."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            _assert_unicode(k)
            _assert_unicode(v)
    elif isinstance(value, list):
        for v in value:
            _assert_unicode(v)


def test_cmh_and_the_spec_reader_agree_on_hostile_inputs(seeds: Seeds, tmp_path: Path) -> None:
    rng = random.Random(27)
    (tmp_path / "outside.safetensors").write_bytes(seeds.shards["ab"])
    cases: list[tuple[str, Path]] = []
    for i in range(FILES):
        path = tmp_path / f"f{i}.safetensors"
        path.write_bytes(hostile_file(rng, seeds))
        cases.append(("file", path))
    for i in range(DIRECTORIES):
        folder = tmp_path / f"d{i}"
        hostile_directory(rng, seeds, folder, lambda: hostile_file(rng, seeds))
        cases.append(("directory", folder))
    (tmp_path / "empty").mkdir()  # git keeps no empty directory, so no vector has one
    cases.append(("directory", tmp_path / "empty"))
    for i in range(CACHE_SNAPSHOTS):
        cases.append(("directory", cache_snapshot(rng, seeds, tmp_path / "cache", i)))
    cases += [("other", p) for p in special_paths(tmp_path / "special")]
    disagreements = []
    seen: dict[str, int] = {}
    for kind, path in cases:
        mode = rng.choice(MODES)
        args = [*mode, "--at", str(AT), str(path)]
        ours = cmh_verify(args)["outcome"]
        theirs = spec_reader.run(args)["outcome"]
        seen[ours] = seen.get(ours, 0) + 1
        if ours != theirs:
            disagreements.append((str(path), mode, ours, theirs))
        if kind == "directory":
            _check_fingerprint_agrees(path, ours)
    assert disagreements == []
    assert len(cases) >= 690
    _check_no_setting_changes_a_verdict(cases, tmp_path)
    # The generator reaches every outcome, so the agreement means something.
    assert set(seen) >= {
        "ok", "invalid_file", "index_inconsistent", "unstamped", "corrupt_record",
        "unsupported_version", "manifest_inconsistent", "root_mismatch", "tensor_mismatch",
        "signature_missing", "signature_untrusted", "expired",
    }  # fmt: skip


def special_paths(folder: Path) -> list[Path]:
    """PATHs of every file type: FIFO, socket, device, missing, dangling link, loops."""
    folder.mkdir()
    os.mkfifo(folder / "fifo.safetensors")
    bind_socket(folder / "socket.safetensors")
    (folder / "null.safetensors").symlink_to("/dev/null")
    (folder / "loop.safetensors").symlink_to("loop.safetensors")
    (folder / "dangling.safetensors").symlink_to("gone.safetensors")
    (folder / "fifo-link.safetensors").symlink_to("fifo.safetensors")
    (folder / "dir-loop").symlink_to("dir-loop")
    names = ["fifo", "socket", "null", "loop", "dangling", "fifo-link", "missing"]
    return [
        *(folder / f"{n}.safetensors" for n in names),
        folder / "dir-loop",
        Path("/dev/zero"),
        Path("/dev/null"),
    ]


def _check_no_setting_changes_a_verdict(cases: list[tuple[str, Path]], tmp_path: Path) -> None:
    """The same outcomes, in full mode, with ``PYTHONINTMAXSTRDIGITS`` at its default and at
    0 under a small recursion limit (the real command, one process per setting over every
    case), and from the spec reader under both changed: the JSON limits are the format's
    own (spec section 2.2)."""
    paths = [str(p) for _, p in cases]
    listing = tmp_path / "paths.json"
    listing.write_text(json.dumps(paths))
    script = (
        "import json, sys\n"
        "sys.setrecursionlimit(int(sys.argv[2]))\n"
        "from cmh.cli.main import cli\n"
        f"cli(['verify', '--json', '--at', '{AT}', *json.load(open(sys.argv[1]))])\n"
    )
    runs = {}
    for digits, limit in (("4300", 1000), ("0", 250)):
        env = {**os.environ, "PYTHONINTMAXSTRDIGITS": digits}
        proc = subprocess.run(
            [sys.executable, "-c", script, str(listing), str(limit)],
            capture_output=True, timeout=600, check=False, env=env,
        )  # fmt: skip
        assert b"Traceback" not in proc.stderr, proc.stderr[-2000:]
        document = json.loads(proc.stdout)
        outcomes = {f["path"]: f["outcome"] for f in document["files"] if f["checkpoint"] is None}
        outcomes.update({c["path"]: c["outcome"] for c in document["checkpoints"]})
        runs[(digits, limit)] = [outcomes[p] for p in paths]
    default = runs[("4300", 1000)]
    assert runs[("0", 250)] == default
    # The spec reader too, in this process, with the same settings changed.
    old_digits, old_limit = sys.get_int_max_str_digits(), sys.getrecursionlimit()
    try:
        sys.set_int_max_str_digits(0)
        sys.setrecursionlimit(250)
        theirs = [spec_reader.run(["--at", str(AT), p])["outcome"] for p in paths]
    finally:
        sys.set_int_max_str_digits(old_digits)
        sys.setrecursionlimit(old_limit)
    assert theirs == default


def _check_fingerprint_agrees(folder: Path, verify_outcome: str) -> None:
    """``cmh fingerprint DIR`` refuses exactly where ``cmh verify DIR`` finds it unusable."""
    result = CliRunner().invoke(cli, ["fingerprint", "--json", str(folder)])
    document = json.loads(result.stdout)
    _assert_unicode(document)
    expected = verify_outcome if verify_outcome in ("invalid_file", "index_inconsistent") else "ok"
    assert (document["outcome"], result.exit_code) == (
        expected,
        {"ok": 0, "invalid_file": 3, "index_inconsistent": 1}[expected],
    ), (folder, document)


def test_the_cmh_command_prints_utf8_json_and_no_traceback(seeds: Seeds, tmp_path: Path) -> None:
    """The real command, on names that are not UTF-8 and inputs that are not files."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / os.fsdecode(b"\xff\xfe.safetensors")).write_bytes(seeds.shards["ab"])
    (folder / os.fsdecode(b"m\xed\xa0\x80.safetensors")).write_bytes(b"\x05\x00")
    indexed = tmp_path / "i"
    indexed.mkdir()
    (indexed / "model.safetensors").write_bytes(seeds.shards["ab"])
    (indexed / os.fsdecode(b"\xff.safetensors")).write_bytes(seeds.shards["cd"])
    (indexed / INDEX).write_text(
        json.dumps({"weight_map": dict.fromkeys(["t.0", "t.1"], "model.safetensors")})
    )
    nul = tmp_path / "nul"
    nul.mkdir()
    (nul / INDEX).write_text(json.dumps({"weight_map": {"t.0": "a\u0000.safetensors"}}))
    exe = str(Path(sys.executable).parent / "cmh")
    runs = [
        ["verify", "--json", "--at", str(AT), str(folder), str(indexed), str(nul)],
        ["verify", "--at", str(AT), str(folder), str(indexed), str(nul)],
        ["fingerprint", "--json", str(indexed)],
        ["fingerprint", "--json", str(nul)],
    ]
    for args in runs:
        # A strict UTF-8 stdout, as under a UTF-8 locale other than C: names must not crash it.
        env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
        proc = subprocess.run([exe, *args], capture_output=True, timeout=60, check=False, env=env)
        assert b"Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in (1, 3), (args, proc.returncode, proc.stderr)
        if "--json" in args:
            document = json.loads(proc.stdout.decode("utf-8"))  # strict: valid UTF-8
            assert document["ok"] is False
    document = json.loads(
        subprocess.run([exe, *runs[0]], capture_output=True, check=False).stdout.decode("utf-8")
    )
    paths = {f["path"]: f["path_hex"] for f in document["files"]}
    ff = str(folder / "\ufffd\ufffd.safetensors")
    assert paths[ff] == os.fsencode(str(folder / os.fsdecode(b"\xff\xfe.safetensors"))).hex()
    outcomes = [c["outcome"] for c in document["checkpoints"]]
    assert outcomes == ["invalid_file", "index_inconsistent", "invalid_file"]
