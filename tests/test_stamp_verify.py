"""Stamping and verification: outcomes, in-place restamps, expiry, signatures."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from format_support import synthetic_tensors
from safetensors.numpy import load_file, save_file

import cmh
from cmh import Outcome
from cmh._carrier import KEY_RECORD, KEY_SHA256
from cmh._signing import TrustedKeys, generate_keypair, load_private_key

MakeFile = Callable[..., Path]


def rewrite_header(path: Path, edit: Callable[[dict[str, object]], None]) -> None:
    """Re-encode a file's header after ``edit``, keeping its tensor bytes."""
    header = cmh.read_header(path)
    obj = json.loads(header.raw)
    edit(obj)
    raw = json.dumps(obj).encode()
    data = path.read_bytes()[header.data_start :]
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def flip_byte(path: Path, tensor: str, offset: int = 0) -> None:
    header = cmh.read_header(path)
    entry = header.by_name()[tensor]
    with open(path, "r+b") as f:
        f.seek(header.data_start + entry.begin + offset)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def test_stamp_then_verify_ok(make_file: MakeFile) -> None:
    path = make_file()
    result = cmh.stamp(path, ttl="30d", now=1_700_000_000)
    assert not result.in_place
    assert result.record.expires_at == 1_700_000_000 + 30 * 86400
    verdict = cmh.verify(path, at=1_700_000_001)
    assert verdict.ok, verdict.message
    assert verdict.outcome is Outcome.OK


def test_stamp_keeps_tensors_and_metadata(make_file: MakeFile) -> None:
    tensors = synthetic_tensors(3)
    path = make_file(tensors=tensors, metadata={"format": "pt", "note": "é"})
    cmh.stamp(path)
    loaded = load_file(str(path))
    assert loaded.keys() == tensors.keys()
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype
        assert loaded[name].tobytes() == value.tobytes()
    assert cmh.inspect(path).metadata == {"format": "pt", "note": "é"}


def test_flipped_byte_names_the_tensor(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path)
    flip_byte(path, "layer.2.weight", 5)
    for fast in (False, True):
        verdict = cmh.verify(path, fast=fast)
        assert verdict.outcome is Outcome.TENSOR_MISMATCH
        assert verdict.mismatched == ("layer.2.weight",)
        assert "layer.2.weight" in verdict.message


def test_changed_metadata_value_fails(make_file: MakeFile) -> None:
    path = make_file(metadata={"format": "pt"})
    cmh.stamp(path)

    def edit(obj: dict[str, object]) -> None:
        meta = obj["__metadata__"]
        assert isinstance(meta, dict)
        meta["format"] = "np"

    rewrite_header(path, edit)
    verdict = cmh.verify(path)
    assert verdict.outcome is Outcome.ROOT_MISMATCH


def test_renamed_tensor_fails(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path)
    rewrite_header(path, lambda obj: obj.__setitem__("renamed", obj.pop("scalar")))
    assert cmh.verify(path).outcome is Outcome.ROOT_MISMATCH


def test_reordered_save_keeps_the_fingerprint(tmp_path: Path) -> None:
    tensors = synthetic_tensors(1)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file(tensors, str(a), {"x": "1", "y": "2"})
    reordered = dict(reversed(list(tensors.items())))
    # The reference writer sorts by dtype and name; force another byte layout by hand.
    header: dict[str, object] = {"__metadata__": {"y": "2", "x": "1"}}
    data = b""
    for name, value in reordered.items():
        raw = value.tobytes()
        dtype = {"float32": "F32", "float16": "F16", "int64": "I64", "int8": "I8"}.get(
            str(value.dtype), {"uint8": "U8", "float64": "F64"}.get(str(value.dtype))
        )
        header[name] = {
            "dtype": dtype,
            "shape": list(value.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    body = json.dumps(header).encode()
    b.write_bytes(struct.pack("<Q", len(body)) + body + data)
    assert a.read_bytes() != b.read_bytes()
    assert cmh.fingerprint(a).value == cmh.fingerprint(b).value
    cmh.stamp(a)
    cmh.stamp(b)
    assert cmh.inspect(a).record.fingerprint == cmh.inspect(b).record.fingerprint  # type: ignore[union-attr]


def test_restamp_is_in_place_and_moves_no_byte(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path, ttl="1d", now=1_700_000_000)
    before = path.read_bytes()
    header = cmh.read_header(path)
    result = cmh.stamp(path, ttl="2d", now=1_700_000_100)
    after = path.read_bytes()
    assert result.in_place
    assert len(before) == len(after)
    assert before[header.data_start :] == after[header.data_start :]
    assert cmh.read_header(path).header_size == header.header_size
    assert result.record.expires_at == 1_700_000_100 + 2 * 86400
    assert cmh.verify(path, at=1_700_000_200).ok


def test_restamp_without_ttl_keeps_the_lifetime(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path, ttl="12h", now=1_000)
    result = cmh.stamp(path, now=5_000)
    assert result.record.expires_at == 5_000 + 12 * 3600
    assert cmh.stamp(path, ttl="never", now=6_000).record.expires_at == 0


def test_restamp_after_in_place_content_change(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path)
    flip_byte(path, "layer.0.weight")
    assert not cmh.verify(path).ok
    assert cmh.stamp(path).in_place
    assert cmh.verify(path).ok


def test_expiry_is_judged_at_the_given_time(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path, ttl="90s", now=1_000)
    assert cmh.verify(path, at=1_089).ok
    expired = cmh.verify(path, at=1_090)
    assert expired.outcome is Outcome.EXPIRED
    assert expired.expired and "expired at 1970-01-01T00:18:10Z" in expired.message
    allowed = cmh.verify(path, at=1_090, allow_expired=True)
    assert allowed.ok and allowed.expired


def test_unstamped_file(make_file: MakeFile) -> None:
    verdict = cmh.verify(make_file())
    assert verdict.outcome is Outcome.UNSTAMPED
    assert not verdict.ok


def _set_metadata(path: Path, key: str, value: str) -> None:
    def edit(obj: dict[str, object]) -> None:
        meta = obj["__metadata__"]
        assert isinstance(meta, dict)
        meta[key] = value

    rewrite_header(path, edit)


def test_torn_record_is_corrupt(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path)
    record = cmh.read_header(path).metadata[KEY_RECORD]  # type: ignore[index]
    torn = record[:64] + "0" * 64  # second half of the record lost
    _set_metadata(path, KEY_RECORD, torn)
    assert cmh.verify(path).outcome is Outcome.CORRUPT_RECORD
    # the stock loader still loads it
    assert set(load_file(str(path))) == set(synthetic_tensors(0))


def test_unsupported_version(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path)
    record = bytearray(bytes.fromhex(cmh.read_header(path).metadata[KEY_RECORD]))  # type: ignore[index]
    record[4] = 9
    _set_metadata(path, KEY_RECORD, bytes(record).hex())
    verdict = cmh.verify(path)
    assert verdict.outcome is Outcome.UNSUPPORTED_VERSION
    assert "9" in verdict.message


def test_manifest_with_wrong_count_is_inconsistent(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path)
    manifest = cmh.read_header(path).metadata[KEY_SHA256]  # type: ignore[index]
    _set_metadata(path, KEY_SHA256, manifest.rsplit(",", 1)[0])
    assert cmh.verify(path).outcome is Outcome.MANIFEST_INCONSISTENT


def test_forged_manifest_is_a_root_mismatch(make_file: MakeFile) -> None:
    path = make_file()
    cmh.stamp(path)
    flip_byte(path, "layer.1.weight")
    # An attacker recomputes the manifest but cannot fix the record's root.
    digests = {d.name: d.sha256 for d in cmh.hash_tensors(path, cmh.read_header(path))}
    header = cmh.read_header(path)
    _set_metadata(
        path,
        KEY_SHA256,
        ",".join(digests[t.name].hex() for t in header.tensors),  # type: ignore[union-attr]
    )
    verdict = cmh.verify(path)
    assert verdict.outcome is Outcome.ROOT_MISMATCH


def test_no_metadata_empty_and_scalar_tensors(tmp_path: Path) -> None:
    path = tmp_path / "edge.safetensors"
    save_file({"s": np.array(1.0, dtype=np.float32), "e": np.zeros((0,), np.int8)}, str(path))
    assert cmh.read_header(path).metadata is None
    cmh.stamp(path)
    assert cmh.verify(path).ok
    assert load_file(str(path))["s"] == np.float32(1.0)


def test_file_with_no_tensors(tmp_path: Path) -> None:
    path = tmp_path / "none.safetensors"
    save_file({}, str(path))
    cmh.stamp(path)
    assert cmh.verify(path).ok


# -- signatures --------------------------------------------------------------------


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path, str]:
    private_pem, public_pem, kid = generate_keypair()
    priv, pub = tmp_path / "k.key", tmp_path / "k.pub"
    priv.write_bytes(private_pem)
    pub.write_bytes(public_pem)
    return priv, pub, kid


def test_signed_stamp_verifies_with_the_trusted_key(
    make_file: MakeFile, keypair: tuple[Path, Path, str]
) -> None:
    priv, pub, kid = keypair
    path = make_file()
    result = cmh.stamp(path, sign_key=load_private_key(priv))
    assert result.signer_key_id == kid
    verdict = cmh.verify(path, trusted_keys=TrustedKeys.load([pub]), require_signature=True)
    assert verdict.ok, verdict.message
    assert verdict.signer_key_id == kid and verdict.signature_checked


def test_untrusted_key_fails(
    make_file: MakeFile, keypair: tuple[Path, Path, str], tmp_path: Path
) -> None:
    priv, _, _ = keypair
    path = make_file()
    cmh.stamp(path, sign_key=load_private_key(priv))
    _, other_pub, _ = generate_keypair()
    (tmp_path / "other.pub").write_bytes(other_pub)
    verdict = cmh.verify(path, trusted_keys=TrustedKeys.load([tmp_path / "other.pub"]))
    assert verdict.outcome is Outcome.SIGNATURE_UNTRUSTED


def test_restamp_without_resigning_removes_the_signature(
    make_file: MakeFile, keypair: tuple[Path, Path, str]
) -> None:
    priv, pub, kid = keypair
    path = make_file()
    cmh.stamp(path, sign_key=load_private_key(priv))
    result = cmh.stamp(path, ttl="1d")
    assert result.removed_signature_key_id == kid and not result.record.signed
    info = cmh.inspect(path)
    assert not info.signed and info.signer_key_id is None
    keys = TrustedKeys.load([pub])
    assert cmh.verify(path, trusted_keys=keys).outcome is Outcome.SIGNATURE_MISSING
    assert cmh.verify(path, trusted_keys=keys, require_signature=False).ok


def test_record_changed_after_signing_fails(
    make_file: MakeFile, keypair: tuple[Path, Path, str]
) -> None:
    priv, pub, _ = keypair
    path = make_file()
    cmh.stamp(path, sign_key=load_private_key(priv))
    record = bytearray(bytes.fromhex(cmh.read_header(path).metadata[KEY_RECORD]))  # type: ignore[index]
    record[5:9] = struct.pack("<I", 4_000_000_000)  # extend the expiry
    from cmh._record import Record

    forged = Record.from_bytes(
        bytes(record[:60])
        + struct.pack("<I", __import__("xxhash").xxh32_intdigest(bytes(record[:60])))
    )
    _set_metadata(path, KEY_RECORD, forged.to_hex())
    verdict = cmh.verify(path, trusted_keys=TrustedKeys.load([pub]))
    assert verdict.outcome is Outcome.SIGNATURE_INVALID


def test_sign_in_place_then_require(make_file: MakeFile, keypair: tuple[Path, Path, str]) -> None:
    priv, pub, kid = keypair
    path = make_file()
    cmh.stamp(path, ttl="1d", now=1_000)
    assert cmh.verify(path, require_signature=True, at=1_001).outcome is Outcome.SIGNATURE_MISSING
    size = path.stat().st_size
    cmh.sign(path, load_private_key(priv))
    assert path.stat().st_size == size
    verdict = cmh.verify(
        path, trusted_keys=TrustedKeys.load([pub.parent]), require_signature=True, at=1_001
    )
    assert verdict.ok and verdict.signer_key_id == kid


def test_signing_an_unstamped_file_is_refused(
    make_file: MakeFile, keypair: tuple[Path, Path, str]
) -> None:
    priv, _, _ = keypair
    with pytest.raises(cmh.NotStampedError):
        cmh.sign(make_file(), load_private_key(priv))


def test_encrypted_key_needs_a_passphrase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private_pem, _, kid = generate_keypair(b"s3cret")
    path = tmp_path / "enc.key"
    path.write_bytes(private_pem)
    monkeypatch.delenv("CMH_KEY_PASSPHRASE", raising=False)
    with pytest.raises(cmh.SigningKeyError, match="encrypted"):
        load_private_key(path)
    with pytest.raises(cmh.SigningKeyError, match="wrong passphrase"):
        load_private_key(path, b"nope")
    monkeypatch.setenv("CMH_KEY_PASSPHRASE", "s3cret")
    from cmh._signing import key_id

    assert key_id(load_private_key(path).public_key()) == kid


def test_dead_temporaries_are_cleaned(make_file: MakeFile) -> None:
    path = make_file()
    stale = path.parent / f".{path.name}.cmh-stamp.999999999.tmp"
    stale.write_bytes(b"junk")
    cmh.stamp(path)
    assert not stale.exists()
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_buffer_alignment_of_a_first_stamp(tmp_path: Path) -> None:
    """Spec 8.5: an aligned buffer keeps its offset modulo 4096; an unaligned one moves to 8."""
    header = json.dumps({"u": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}}).encode()
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(struct.pack("<Q", len(header)) + header + b"abc")
    assert (8 + len(header)) % 8 != 0
    cmh.stamp(odd)
    assert cmh.read_header(odd).data_start % 8 == 0
    assert cmh.verify(odd).ok

    aligned = tmp_path / "aligned.safetensors"
    save_file({"w": np.arange(6, dtype=np.float32)}, str(aligned))
    before = cmh.read_header(aligned).data_start
    cmh.stamp(aligned)
    assert cmh.read_header(aligned).data_start % 4096 == before % 4096


def test_a_later_stamp_rewrites_when_a_value_has_no_slot(make_file: MakeFile) -> None:
    """Spec 8.2: in place only when every value has a slot of its width; else a rewrite."""
    path = make_file()
    cmh.stamp(path, xxh3=False)
    assert cmh.stamp(path, xxh3=False).in_place
    grown = cmh.stamp(path, xxh3=True)  # cmh.xxh3 has no slot yet
    assert not grown.in_place and cmh.inspect(path).has_xxh3_manifest
    assert cmh.verify(path, fast=True).ok


def test_stamp_result_repr_is_short(tmp_path: Path) -> None:
    path = tmp_path / "many.safetensors"
    save_file({f"t{i}": np.zeros(4, dtype=np.float32) for i in range(2000)}, str(path))
    result = cmh.stamp(path)
    text = repr(result)
    assert len(text) < 300 and "tensors=2000" in text and str(path) in text


def test_default_threads_follow_the_cpus_the_process_may_use() -> None:
    """A process pinned to one CPU (``taskset``, a container's cpuset) hashes on one
    thread, not on as many as the machine has (``cmh.usable_cpus``, which the mirror's
    compute pool and scrub size by too)."""
    import subprocess
    import sys

    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from cmh import usable_cpus; from cmh._digests import default_threads; "
        "print(usable_cpus(), default_threads())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]


def escape_in_header(path: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` (the same JSON string, other escapes) in the header text."""
    header = cmh.read_header(path)
    text = header.raw.decode()
    assert text.count(old) == 1
    raw = text.replace(old, new).encode()
    data = path.read_bytes()[header.data_start :]
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    assert cmh.read_header(path).metadata == header.metadata  # the same values


@pytest.mark.parametrize(
    "spelling",
    ["key", "record"],
    ids=["key-cmh.s\\u0069g", "record-value-starting-with-an-escape"],
)
def test_sign_rewrites_a_file_whose_values_cannot_be_located(
    make_file: MakeFile, keypair: tuple[Path, Path, str], spelling: str
) -> None:
    """Spec 8.2: values that cannot be located unambiguously (written with JSON escapes)
    are written by a rewrite under rule 1, for sign as for a restamp; sign refused before."""
    priv, pub, kid = keypair
    path = make_file("sub/model.safetensors")
    stamped = cmh.stamp(path, ttl="1d", now=1_000)
    if spelling == "key":
        escape_in_header(path, '"cmh.sig"', '"cmh.s\\u0069g"')
    else:
        first = stamped.record.to_hex()[0]
        escape_in_header(path, f'"cmh":"{first}', f'"cmh":"\\u{ord(first):04x}')
    tensors_before = load_file(str(path))
    result = cmh.sign(path, load_private_key(priv))
    assert not result.in_place and result.signer_key_id == kid
    assert result.record.fingerprint == stamped.record.fingerprint
    assert (result.record.expires_at, result.record.stamped_at) == (86_400 + 1_000, 1_000)
    keys = TrustedKeys.load([pub])
    verdict = cmh.verify(path, trusted_keys=keys, require_signature=True, at=1_001)
    assert verdict.ok and verdict.signer_key_id == kid, verdict.message
    loaded = load_file(str(path))
    assert loaded.keys() == tensors_before.keys()
    assert all(np.array_equal(loaded[k], tensors_before[k]) for k in loaded)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    # Written plainly now: the next signature goes in place.
    assert cmh.sign(path, load_private_key(priv)).in_place


def test_the_sign_command_rewrites_a_file_whose_key_is_escaped(
    make_file: MakeFile, keypair: tuple[Path, Path, str]
) -> None:
    from cli_support import run_runner

    priv, pub, _ = keypair
    path = make_file()
    cmh.stamp(path)
    escape_in_header(path, '"cmh.sig"', '"cmh.s\\u0069g"')
    r = run_runner(["sign", path, "--key", priv, "--json"])
    assert r.exit_code == 0, r.stdout + r.stderr
    entry = r.json()["files"][0]
    assert entry["outcome"] == "signed" and entry["in_place"] is False
    assert run_runner(["verify", path, "--key", pub]).exit_code == 0


def test_a_restamp_rewrites_a_file_whose_values_cannot_be_located(make_file: MakeFile) -> None:
    """The same writer as sign's: the values hashed once are written by a rewrite."""
    path = make_file("sub/model.safetensors")
    cmh.stamp(path, ttl="1d", now=1_000)
    escape_in_header(path, '"cmh.sha256"', '"cmh.sha\\u0032\\u00356"')
    result = cmh.stamp(path, ttl="2d", now=2_000)
    assert not result.in_place and result.record.expires_at == 2_000 + 2 * 86_400
    assert cmh.verify(path, at=2_001).ok
    assert b"\\u0032" not in cmh.read_header(path).raw
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.parametrize("expires_at", [900, 1_000], ids=["before-stamped_at", "at-stamped_at"])
def test_a_restamp_keeps_a_lifetime_of_zero_from_a_record_expired_when_written(
    make_file: MakeFile, expires_at: int
) -> None:
    """Spec 8.3: a previous expires_at not after its stamped_at (and not 0) is a kept
    lifetime of 0: the restamped file expires at its new stamped_at, neither fresh nor
    never (expires_at 0)."""
    from cmh._record import Record

    path = make_file()
    old = cmh.stamp(path, ttl="1d", now=1_000).record
    early = Record(expires_at, old.fingerprint, old.flags, old.stamped_at)
    cmh.write_values_in_place(str(path), cmh.read_header(path), {KEY_RECORD: early.to_hex()})
    assert cmh.verify(path, at=1_000).outcome is Outcome.EXPIRED
    record = cmh.stamp(path, now=5_000).record
    assert (record.stamped_at, record.expires_at) == (5_000, 5_000)
    assert cmh.verify(path, at=5_000).outcome is Outcome.EXPIRED
    assert cmh.stamp(path, ttl="1h", now=6_000).record.expires_at == 6_000 + 3_600
