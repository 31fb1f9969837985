"""Regression tests for the format hardening issue, items 10-13.

10. lone surrogates and dimensions >= 2^64 are ``invalid_file`` everywhere (no traceback);
11. ``"__metadata__": null`` is ``invalid_file``, not "unstamped";
12. ``--fast`` never vouches for a signature: the XXH3 manifest is covered by neither the
    root nor the signature, so a signature check hashes with SHA-256;
13. signature checks are safe by default: ``--key`` requires a signature, a restamp
    without the key removes the signature, and ``inspect`` says what it knows of one.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from cli_support import RUNNERS, flip_tensor_byte, run_runner, tensors, write_keypair
from safetensors.numpy import save_file

import cmh
from cmh._carrier import KEY_XXH3, encode_digests
from cmh._record import Record
from cmh._signing import TrustedKeys, load_private_key
from cmh._stamping import write_values_in_place
from cmh._verification import Outcome


def write_raw(path: Path, header: str, buffer: bytes = b"") -> Path:
    """A file with exactly this header text (escapes kept as written) and buffer."""
    raw = header.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + buffer)
    return path


#: Headers that crashed stamp / fingerprint / verify with a traceback before the fix.
BAD_HEADERS = {
    "surrogate-in-name": '{"w\\ud800":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
    "surrogate-in-value": (
        '{"__metadata__":{"note":"\\udfff"},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    ),
    "dimension-over-u64": (
        '{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
        '"z":{"dtype":"F32","shape":[18446744073709551616,0],"data_offsets":[2,2]}}'
    ),
    "metadata-null": '{"__metadata__":null,"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
    # 240 dimensions of 2^64-1: a product past CPython's 4,300-digit limit for int -> str
    "shape-product-over-4300-digits": (
        '{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
        '"z":{"dtype":"U8","shape":[' + ",".join(["18446744073709551615"] * 240) + "],"
        '"data_offsets":[2,2]}}'
    ),
}


@pytest.fixture(params=sorted(BAD_HEADERS))
def bad_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return write_raw(tmp_path / f"{request.param}.safetensors", BAD_HEADERS[request.param], b"ab")


def test_item10_11_library_rejects_at_header_read(bad_file: Path) -> None:
    with pytest.raises(cmh.InvalidFileError):
        cmh.read_header(bad_file)
    with pytest.raises(cmh.InvalidFileError):
        cmh.fingerprint(bad_file)
    with pytest.raises(cmh.InvalidFileError):
        cmh.stamp(bad_file)
    with pytest.raises(cmh.InvalidFileError):
        cmh.inspect(bad_file)
    assert cmh.verify(bad_file).outcome is Outcome.INVALID_FILE


@pytest.mark.parametrize("command", ["stamp", "fingerprint", "verify", "inspect"])
def test_item10_11_cli_exits_3_with_one_json_document(bad_file: Path, command: str) -> None:
    before = bad_file.read_bytes()
    r = run_runner([command, bad_file, "--json"])  # fails the test on any traceback
    assert r.exit_code == 3, r.stdout + r.stderr
    doc = r.json()  # exactly one JSON document on stdout
    assert doc["ok"] is False and doc["exit_status"] == 3
    if command in ("stamp", "verify"):
        assert doc["files"][0]["outcome"] == "invalid_file"
    assert bad_file.read_bytes() == before  # nothing written


def test_item10_verify_as_a_subprocess(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "s.safetensors", BAD_HEADERS["surrogate-in-name"], b"ab")
    r = RUNNERS["subprocess"](["verify", path, "--json"])
    assert r.exit_code == 3 and r.json()["outcome"] == "invalid_file"


def test_item11_metadata_null_is_not_unstamped(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", BAD_HEADERS["metadata-null"], b"ab")
    verdict = cmh.verify(path)
    assert verdict.outcome is Outcome.INVALID_FILE
    assert "__metadata__" in verdict.message


# -- item 12 ---------------------------------------------------------------------------


@pytest.fixture
def signed_model(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A signed stamped file: (file, private key, public key)."""
    private, public, _ = write_keypair(tmp_path / "release")
    path = tmp_path / "model.safetensors"
    save_file(tensors(3), str(path), {"format": "pt"})
    cmh.stamp(path, "30d", sign_key=load_private_key(private))
    return path, private, public


def forge_xxh3_manifest(path: Path) -> None:
    """Change a tensor's bytes, then rewrite the XXH3 manifest to match the new bytes."""
    flip_tensor_byte(path, "layer.0.weight")
    header = cmh.read_header(path)
    digests = cmh.hash_tensors(path, header, sha256=False, xxh3=True)
    forged = encode_digests([d.xxh3 for d in digests if d.xxh3 is not None])
    write_values_in_place(str(path), header, {KEY_XXH3: forged})


def test_item12_fast_with_a_key_is_not_fooled_by_a_rewritten_xxh3_manifest(
    signed_model: tuple[Path, Path, Path],
) -> None:
    path, _, public = signed_model
    forge_xxh3_manifest(path)
    keys = TrustedKeys.load([public])
    verdict = cmh.verify(path, fast=True, trusted_keys=keys, require_signature=True)
    assert verdict.outcome is Outcome.TENSOR_MISMATCH
    assert verdict.mode == "full" and any("fell back to SHA-256" in n for n in verdict.notes)
    # Without a signature to check, fast mode is what it says: accidental corruption only.
    assert cmh.verify(path, fast=True).mode == "fast"

    r = run_runner(["verify", path, "--fast", "--key", public, "--require-signature", "--json"])
    assert r.exit_code == 1
    entry = r.json()["files"][0]
    assert entry["outcome"] == "tensor_mismatch" and entry["mode"] == "full"
    assert entry["mismatched_tensors"] == ["layer.0.weight"]


# -- item 13 ---------------------------------------------------------------------------


def test_item13_key_implies_a_required_signature(signed_model: tuple[Path, Path, Path]) -> None:
    path, _, public = signed_model
    # Re-stamped without the key after a change: the signature is gone.
    flip_tensor_byte(path, "layer.1.weight")
    cmh.stamp(path)
    r = run_runner(["verify", path, "--key", public, "--json"])
    assert r.exit_code == 1
    assert r.json()["files"][0]["outcome"] == "signature_missing"
    r = run_runner(["verify", path, "--key", public, "--allow-unsigned", "--json"])
    assert r.exit_code == 0, r.stdout
    assert run_runner(["verify", path, "--allow-unsigned"]).exit_code == 2
    both = ["verify", path, "--key", public, "--allow-unsigned", "--require-signature"]
    assert run_runner(both).exit_code == 2


def test_item13_restamp_without_the_key_no_longer_looks_signed(
    signed_model: tuple[Path, Path, Path],
) -> None:
    path = signed_model[0]
    r = run_runner(["stamp", path, "--ttl", "1d"])
    assert r.exit_code == 0 and "was removed" in r.stderr
    r = run_runner(["inspect", path])
    assert "signature:   none" in r.stdout
    assert run_runner(["inspect", path, "--json"]).json()["files"][0]["signed"] is False


def test_item13_inspect_and_verify_say_when_a_signature_no_longer_matches(
    signed_model: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    path, _, public = signed_model
    # The record changed after signing (a later expiry, its check recomputed).
    old = cmh.inspect(path).record
    assert old is not None
    later = Record(old.expires_at + 86400, old.fingerprint, old.flags, old.stamped_at)
    write_values_in_place(str(path), cmh.read_header(path), {"cmh": later.to_hex()})

    r = run_runner(["verify", path])
    assert r.exit_code == 0 and "NOT checked (no --key)" in r.stdout
    r = run_runner(["inspect", path])
    assert "NOT checked" in r.stdout
    r = run_runner(["inspect", path, "--key", public])
    assert "does NOT match the record" in r.stdout
    doc = run_runner(["inspect", path, "--key", public, "--json"]).json()
    assert doc["files"][0]["signature"] == "invalid"
    _, other, _ = write_keypair(tmp_path / "other")
    doc = run_runner(["inspect", path, "--key", other, "--json"]).json()
    assert doc["files"][0]["signature"] == "untrusted"
    r = run_runner(["verify", path, "--key", public, "--json"])
    assert r.exit_code == 1 and r.json()["files"][0]["outcome"] == "signature_invalid"


def test_item13_inspect_reports_a_valid_signature(signed_model: tuple[Path, Path, Path]) -> None:
    path, _, public = signed_model
    r = run_runner(["inspect", path, "--key", public])
    assert "valid, matches the record" in r.stdout


# -- a shape whose product has thousands of digits -------------------------------------


def test_a_huge_shape_product_is_invalid_for_sign_and_in_a_directory(tmp_path: Path) -> None:
    """Every command, and a checkpoint directory holding such a shard, says invalid_file
    (exit 3) where the message used to format the product and raise ValueError."""
    private, _, _ = write_keypair(tmp_path / "k")
    bad = BAD_HEADERS["shape-product-over-4300-digits"]
    path = write_raw(tmp_path / "big.safetensors", bad, b"ab")
    r = run_runner(["sign", path, "--key", private, "--json"])
    assert r.exit_code == 3 and r.json()["files"][0]["outcome"] == "invalid_file"
    with pytest.raises(cmh.InvalidFileError):
        cmh.sign(path, load_private_key(private))

    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(tensors(1), str(folder / "a.safetensors"), {"format": "pt"})
    write_raw(folder / "b.safetensors", bad, b"ab")
    before = (folder / "b.safetensors").read_bytes()
    for command in (
        ["verify"],
        ["fingerprint"],
        ["inspect"],
        ["stamp"],
        ["sign", "--key", private],
    ):
        r = run_runner([*command, folder, "--json"])
        assert r.exit_code == 3, (command, r.stdout, r.stderr)
    assert (folder / "b.safetensors").read_bytes() == before
    assert cmh.verify(folder).outcome is Outcome.INVALID_FILE


def test_a_huge_shape_product_is_judged_the_same_under_any_digit_limit(tmp_path: Path) -> None:
    """No interpreter setting changes a verdict (spec 2.2): the lowest digit limit too."""
    path = write_raw(
        tmp_path / "big.safetensors", BAD_HEADERS["shape-product-over-4300-digits"], b"ab"
    )
    r = RUNNERS["subprocess"](["verify", path, "--json"], env={"PYTHONINTMAXSTRDIGITS": "640"})
    assert r.exit_code == 3 and r.json()["outcome"] == "invalid_file"
