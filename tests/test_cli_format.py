"""The format commands end to end, each through click's runner and as a subprocess.

Every exit status of every command is driven here (0 ok, 1 check failed,
2 usage error, 3 unreadable input), and every ``--json`` document is parsed
and checked against the library's own answer.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import (
    RUNNERS,
    Run,
    flip_tensor_byte,
    make_sharded,
    tensors,
    write_keypair,
)
from safetensors.numpy import save_file

import cmh

DAY = 86400


@pytest.fixture(params=sorted(RUNNERS))
def run(request: pytest.FixtureRequest) -> Callable[..., Run]:
    """``run(args, env=None, input=None)`` through the runner or a subprocess."""
    return RUNNERS[request.param]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(tensors(1), str(path), {"format": "pt"})
    return path


@pytest.fixture
def garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(b"\xff" * 8 + b"not a safetensors file")
    return path


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path, str]]:
    return {
        "alice": write_keypair(tmp_path / "alice"),
        "mallory": write_keypair(tmp_path / "mallory"),
    }


def check_envelope(doc: dict, command: str, exit_status: int) -> None:
    assert doc["schema"] == 1
    assert doc["command"] == command
    assert doc["cmh_version"] == cmh.__version__
    assert doc["exit_status"] == exit_status
    assert doc["ok"] is (exit_status == 0)


# -- stamp -----------------------------------------------------------------------------


def test_stamp_json_matches_library(run, model: Path) -> None:
    r = run(["stamp", model, "--ttl", "30d", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    check_envelope(doc, "stamp", 0)
    (entry,) = doc["files"]
    assert entry["path"] == str(model)
    assert entry["outcome"] == "stamped"
    assert entry["in_place"] is False
    record = entry["record"]
    assert record["expires_at"] - record["stamped_at"] == 30 * DAY
    assert record["signed"] is False and record["sha256_manifest"] and record["xxh3_manifest"]
    assert record["fingerprint"] == cmh.fingerprint(model).hex
    assert cmh.inspect(model).record.expires_at == record["expires_at"]
    assert cmh.verify(model).ok


def test_stamp_human_output_and_restamp(run, model: Path) -> None:
    r = run(["stamp", model, "--ttl", "never"])
    assert r.exit_code == 0
    assert f"stamped  {model}" in r.stdout and "never expires" in r.stdout
    assert r.stderr == ""  # no progress bar when stderr is not a terminal
    r = run(["stamp", model, "--ttl", "12h", "--json"])
    entry = r.json()["files"][0]
    assert entry["in_place"] is True
    assert entry["record"]["expires_at"] - entry["record"]["stamped_at"] == 12 * 3600


def test_stamp_signed(run, model: Path, keys) -> None:
    private, public, kid = keys["alice"]
    r = run(["stamp", model, "--sign-key", private, "--json"])
    assert r.exit_code == 0, r.stderr
    entry = r.json()["files"][0]
    assert entry["signer_key_id"] == kid and entry["record"]["signed"] is True
    assert entry["record"]["expires_at"] is None
    assert run(["verify", model, "--key", public, "--require-signature"]).exit_code == 0


def test_stamp_warns_about_a_private_key_readable_by_others(run, model: Path, keys) -> None:
    """Issue 23 (low): a 0644 private key was used without a word."""
    import os

    private, _, _ = keys["alice"]
    os.chmod(private, 0o644)
    r = run(["stamp", model, "--sign-key", private])
    assert r.exit_code == 0, r.stderr
    assert "private key is readable by others (mode 0644)" in r.stderr
    os.chmod(private, 0o600)
    r = run(["stamp", model, "--sign-key", private])
    assert "readable by others" not in r.stderr


def test_stamp_usage_errors_change_nothing(run, model: Path, tmp_path: Path) -> None:
    before = model.read_bytes()
    r = run(["stamp", model, "--ttl", "soon"])
    assert r.exit_code == 2 and "invalid duration 'soon'" in r.stderr
    r = run(["stamp", model, "--sign-key", tmp_path / "missing.key"])
    assert r.exit_code == 2 and "cannot read key file" in r.stderr
    assert run(["stamp"]).exit_code == 2
    assert model.read_bytes() == before
    # a lifetime past the record's last time (2106-02-07, an unsigned 32-bit Unix time)
    for ttl in ("40000d", "100000000w"):
        r = run(["stamp", model, "--ttl", ttl, "--json"])
        assert r.exit_code == 2 and r.stdout == "" and model.read_bytes() == before
        assert "--ttl" in r.stderr and "ends after 2106-02-07T06:28:15Z" in r.stderr, r.stderr


def test_stamp_a_kept_lifetime_past_2106_fails_for_that_file(
    run, model: Path, tmp_path: Path
) -> None:
    """A restamp keeps the lifetime; one that no longer fits fails that file (1), not usage."""
    long_lived = tmp_path / "long.safetensors"
    save_file(tensors(2), str(long_lived))
    cmh.stamp(long_lived, ttl=f"{100 * 365}d", now=1_000_000_000)  # 2001 + 100 years: fits
    before = long_lived.read_bytes()
    r = run(["stamp", long_lived, model, "--json"])  # 2026 + 100 years does not
    assert r.exit_code == 1 and long_lived.read_bytes() == before
    doc = r.json()
    check_envelope(doc, "stamp", 1)
    failed, stamped = doc["files"]
    assert failed["outcome"] == "failed" and "ends after 2106-02-07" in failed["error"]
    assert stamped["outcome"] == "stamped" and cmh.verify(model).ok


def test_stamp_unreadable_inputs(run, model: Path, garbage: Path, tmp_path: Path) -> None:
    before = garbage.read_bytes()
    missing = tmp_path / "missing.safetensors"
    r = run(["stamp", garbage, model, missing, "--json"])
    assert r.exit_code == 3
    doc = r.json()
    check_envelope(doc, "stamp", 3)
    outcomes = {Path(f["path"]).name: f["outcome"] for f in doc["files"]}
    assert outcomes == {
        "garbage.safetensors": "invalid_file",
        "model.safetensors": "stamped",
        "missing.safetensors": "invalid_file",
    }
    assert "No such file" in doc["files"][2]["error"]
    assert garbage.read_bytes() == before
    assert cmh.verify(model).ok
    r = run(["stamp", garbage])
    assert r.exit_code == 3 and f"FAILED   {garbage}" in r.stdout


def test_stamp_checkpoint_directory(run, tmp_path: Path) -> None:
    ckpt = make_sharded(tmp_path / "ckpt", tensors(2, count=7), shards=3)
    r = run(["stamp", ckpt, "--ttl", "1d", "--json"])
    assert r.exit_code == 0, r.stdout
    doc = r.json()
    assert len(doc["files"]) == 3 and all(f["outcome"] == "stamped" for f in doc["files"])
    assert all(f["checkpoint"] == str(ckpt) for f in doc["files"])
    (checkpoint,) = doc["checkpoints"]
    assert checkpoint["ok"] and checkpoint["problems"] == []
    assert checkpoint["index"] == str(ckpt / "model.safetensors.index.json")
    for shard in ckpt.glob("*.safetensors"):
        assert cmh.verify(shard).ok


def test_stamp_refuses_inconsistent_index(run, tmp_path: Path) -> None:
    ckpt = make_sharded(tmp_path / "ckpt", tensors(3), shards=2)
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["layer.0.weight"] = "model-00002-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    before = {p: p.read_bytes() for p in ckpt.glob("*.safetensors")}
    r = run(["stamp", ckpt, "--json"])
    assert r.exit_code == 1
    doc = r.json()
    assert doc["files"] == []
    (checkpoint,) = doc["checkpoints"]
    assert checkpoint["ok"] is False
    assert any("'layer.0.weight'" in p for p in checkpoint["problems"])
    assert {p: p.read_bytes() for p in ckpt.glob("*.safetensors")} == before
    r = run(["stamp", ckpt])
    assert r.exit_code == 1 and "index and shards disagree" in r.stdout


def test_stamp_directory_without_weights(run, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(["stamp", empty, "--json"])
    assert r.exit_code == 3
    assert "no *.safetensors" in r.json()["checkpoints"][0]["error"]


# -- verify ----------------------------------------------------------------------------


def test_verify_ok(run, model: Path) -> None:
    cmh.stamp(model, "30d")
    r = run(["verify", model, "--json"])
    assert r.exit_code == 0
    doc = r.json()
    check_envelope(doc, "verify", 0)
    (entry,) = doc["files"]
    assert entry["outcome"] == "ok" and entry["problems"] == [] and entry["mode"] == "full"
    assert entry["record"]["fingerprint"] == cmh.fingerprint(model).hex
    assert 29 * DAY < entry["record"]["expires_in_seconds"] <= 30 * DAY
    r = run(["verify", model])
    assert r.exit_code == 0
    assert f"ok       {model}" in r.stdout and "1 file: 1 ok, 0 failed" in r.stdout
    r = run(["verify", model, "--fast", "--json"])
    assert r.exit_code == 0 and r.json()["files"][0]["mode"] == "fast"


def test_verify_names_changed_tensor(run, model: Path) -> None:
    cmh.stamp(model)
    flip_tensor_byte(model, "layer.3.weight")
    r = run(["verify", model, "--json"])
    assert r.exit_code == 1
    doc = r.json()
    check_envelope(doc, "verify", 1)
    entry = doc["files"][0]
    assert entry["outcome"] == "tensor_mismatch"
    assert entry["mismatched_tensors"] == ["layer.3.weight"]
    r = run(["verify", model])
    assert r.exit_code == 1
    assert "tensor_mismatch" in r.stdout and "'layer.3.weight'" in r.stdout


def test_verify_expiry(run, model: Path) -> None:
    cmh.stamp(model, "30d")
    r = run(["verify", model, "--at", "+31d", "--json"])
    assert r.exit_code == 1
    entry = r.json()["files"][0]
    assert entry["outcome"] == "expired" and entry["expired"] is True
    assert entry["record"]["expires_in_seconds"] < 0
    assert entry["record"]["expires_at_iso"] in entry["problems"][0]["message"]
    r = run(["verify", model, "--at", "+31d"])
    assert r.exit_code == 1 and f"expired at {entry['record']['expires_at_iso']}" in r.stdout
    r = run(["verify", model, "--at", "+31d", "--allow-expired", "--json"])
    assert r.exit_code == 0
    assert any("allowed" in n for n in r.json()["files"][0]["notes"])
    at = entry["record"]["expires_at"] - 10
    assert run(["verify", model, "--at", str(at)]).exit_code == 0


def test_verify_unstamped(run, model: Path) -> None:
    r = run(["verify", model, "--json"])
    assert r.exit_code == 1
    assert r.json()["files"][0]["outcome"] == "unstamped"
    assert "unstamped" in run(["verify", model]).stdout


def test_verify_signatures(run, model: Path, keys) -> None:
    alice_key, alice_pub, alice_id = keys["alice"]
    _, mallory_pub, _ = keys["mallory"]
    cmh.stamp(model, "30d")
    r = run(["verify", model, "--key", alice_pub, "--require-signature", "--json"])
    assert r.exit_code == 1 and r.json()["files"][0]["outcome"] == "signature_missing"

    assert run(["sign", model, "--key", alice_key]).exit_code == 0
    r = run(["verify", model, "--key", alice_pub, "--require-signature", "--json"])
    assert r.exit_code == 0
    entry = r.json()["files"][0]
    assert entry["signer_key_id"] == alice_id and entry["signature_checked"] is True
    assert "signed by trusted key " + alice_id in run(["verify", model, "--key", alice_pub]).stdout

    # A directory of trusted keys works too; a key that is not trusted fails, named.
    r = run(["verify", model, "--key", alice_pub.parent, "--json"])
    assert r.exit_code == 0
    r = run(["verify", model, "--key", mallory_pub, "--json"])
    assert r.exit_code == 1
    entry = r.json()["files"][0]
    assert entry["outcome"] == "signature_untrusted" and alice_id in entry["problems"][0]["message"]

    # The record changed after signing (a later expiry written in place, valid check):
    # the signature no longer matches it.
    from cmh import Record, write_values_in_place

    header = cmh.read_header(model)
    old = cmh.inspect(model).record
    extended = Record(old.expires_at + 365 * DAY, old.fingerprint, old.flags, old.stamped_at)
    write_values_in_place(str(model), header, {"cmh": extended.to_hex()})
    r = run(["verify", model, "--key", alice_pub, "--json"])
    assert r.exit_code == 1
    assert r.json()["files"][0]["outcome"] == "signature_invalid"
    assert run(["sign", model, "--key", alice_key]).exit_code == 0
    assert run(["verify", model, "--key", alice_pub]).exit_code == 0

    # Re-stamped without re-signing: the signature, which would no longer match, is removed.
    r = run(["stamp", model, "--ttl", "60d"])
    assert r.exit_code == 0 and f"signature by key {alice_id} was removed" in r.stderr
    r = run(["verify", model, "--key", alice_pub, "--json"])
    assert r.exit_code == 1
    assert r.json()["files"][0]["outcome"] == "signature_missing"


def test_verify_usage_errors(run, model: Path, tmp_path: Path) -> None:
    cmh.stamp(model)
    r = run(["verify", model, "--require-signature"])
    assert r.exit_code == 2 and "--require-signature needs" in r.stderr
    assert r.stdout == ""
    r = run(["verify", model, "--at", "yesterday-ish"])
    assert r.exit_code == 2 and "invalid time" in r.stderr
    r = run(["verify", model, "--key", tmp_path / "nope.pub"])
    assert r.exit_code == 2 and "cannot read key file" in r.stderr
    not_a_key = tmp_path / "not-a-key.pem"
    not_a_key.write_text("hello")
    r = run(["verify", model, "--key", not_a_key, "--json"])
    assert r.exit_code == 2 and r.stdout == "" and "not a PEM" in r.stderr
    assert run(["verify"]).exit_code == 2


def test_verify_unreadable(run, model: Path, garbage: Path, tmp_path: Path) -> None:
    cmh.stamp(model)
    flip_tensor_byte(model, "layer.0.weight")
    r = run(["verify", model, garbage, tmp_path / "missing.safetensors", "--json"])
    assert r.exit_code == 3  # unreadable input wins over a failed check
    doc = r.json()
    check_envelope(doc, "verify", 3)
    assert [f["outcome"] for f in doc["files"]] == [
        "tensor_mismatch",
        "invalid_file",
        "invalid_file",
    ]
    r = run(["verify", garbage])
    assert r.exit_code == 3 and "invalid_file" in r.stdout


def test_verify_checkpoint_directory(run, tmp_path: Path) -> None:
    state = tensors(4, count=9)
    ckpt = make_sharded(tmp_path / "ckpt", state, shards=3)
    single = tmp_path / "single"
    single.mkdir()
    save_file(state, str(single / "model.safetensors"))
    for shard in ckpt.glob("*.safetensors"):
        cmh.stamp(shard, "1d")
    r = run(["verify", ckpt, "--json"])
    assert r.exit_code == 0, r.stdout
    doc = r.json()
    assert len(doc["files"]) == 3
    (checkpoint,) = doc["checkpoints"]
    assert checkpoint["ok"] is True
    # The identity is the library's, and re-sharding the same weights keeps it.
    assert checkpoint["identity"] == cmh.directory_identity(ckpt).hex
    assert checkpoint["identity"] == cmh.fingerprint(single).hex
    r = run(["verify", ckpt])
    assert f"ok       {ckpt}/ (3 files, model.safetensors.index.json)" in r.stdout

    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"]["layer.2.weight"]
    index_path.write_text(json.dumps(index))
    r = run(["verify", ckpt, "--json"])
    assert r.exit_code == 1
    doc = r.json()
    assert all(f["ok"] for f in doc["files"])
    assert doc["checkpoints"][0]["ok"] is False
    assert doc["checkpoints"][0]["identity"] is None
    assert doc["checkpoints"][0]["problems"] == [
        "tensor 'layer.2.weight' in model-00003-of-00003.safetensors is missing from the index"
    ]
    assert "index_inconsistent" in run(["verify", ckpt]).stdout

    (ckpt / "model-00002-of-00003.safetensors").unlink()
    r = run(["verify", ckpt, "--json"])
    assert r.exit_code == 3
    assert "missing shard" in r.json()["checkpoints"][0]["error"]


# -- inspect ---------------------------------------------------------------------------


def test_inspect_unstamped_and_stamped(run, model: Path, keys) -> None:
    r = run(["inspect", model, "--json"])
    assert r.exit_code == 0
    doc = r.json()
    check_envelope(doc, "inspect", 0)
    assert doc["kind"] == "file" and doc["checkpoint"] is None
    (entry,) = doc["files"]
    header = cmh.read_header(model)
    assert entry["tensor_count"] == len(header.tensors) == 6
    assert entry["tensor_bytes"] == header.data_size
    assert entry["file_size"] == model.stat().st_size
    assert entry["dtypes"] == {"F32": 6} and entry["metadata"] == {"format": "pt"}
    assert entry["stamped"] is False and entry["record"] is None
    assert "stamped:     no" in run(["inspect", model]).stdout

    private, _, kid = keys["alice"]
    cmh.stamp(model, "30d", sign_key=cmh._signing.load_private_key(private))
    entry = run(["inspect", model, "--json"]).json()["files"][0]
    assert entry["stamped"] and entry["signed"] and entry["signer_key_id"] == kid
    assert entry["sha256_manifest"] and entry["xxh3_manifest"]
    assert entry["record"]["flags"] == 0x07
    assert entry["record"]["fingerprint"] == cmh.fingerprint(model).hex
    assert entry["metadata"] == {"format": "pt"}  # reserved cmh* keys are not user metadata
    text = run(["inspect", model]).stdout
    assert "(in 29d 23h)" in text or "(in 30d)" in text
    assert f"signature:   by key {kid}" in text
    assert "SHA-256 manifest, XXH3 manifest, signed" in text


def test_inspect_errors(run, garbage: Path, tmp_path: Path) -> None:
    r = run(["inspect", garbage, "--json"])
    assert r.exit_code == 3
    assert "garbage.safetensors" in r.json()["files"][0]["error"]
    r = run(["inspect", garbage])
    assert r.exit_code == 3 and r.stdout == ""
    assert r.stderr.startswith(f"error: {garbage}: not a readable safetensors file: "), r.stderr
    missing, empty = tmp_path / "missing.safetensors", tmp_path / "empty"
    empty.mkdir()
    r = run(["inspect", missing])  # every error line says `error:` (docs/cli.md, Output)
    assert r.exit_code == 3 and r.stderr.startswith(f"error: {missing}: not a readable"), r.stderr
    r = run(["inspect", empty])  # the folder named once
    assert r.exit_code == 3 and r.stdout == ""
    assert r.stderr == f"error: {empty}: directory holds no *.safetensors file\n", r.stderr
    assert run(["inspect"]).exit_code == 2
    assert run(["inspect", garbage, garbage]).exit_code == 2


def test_inspect_directory(run, tmp_path: Path) -> None:
    ckpt = make_sharded(tmp_path / "ckpt", tensors(5), shards=2)
    r = run(["inspect", ckpt, "--json"])
    assert r.exit_code == 0
    doc = r.json()
    assert doc["kind"] == "directory" and len(doc["files"]) == 2
    assert sum(f["tensor_count"] for f in doc["files"]) == 6
    assert doc["checkpoint"]["ok"] is True


# -- fingerprint -----------------------------------------------------------------------


def test_fingerprint_file_and_directory(run, model: Path, tmp_path: Path) -> None:
    expected = cmh.fingerprint(model).hex
    r = run(["fingerprint", model])
    assert r.exit_code == 0 and r.stdout == f"{expected}  {model}\n"
    cmh.stamp(model, "1d")  # stamping does not change what a loader gets
    doc = run(["fingerprint", model, "--json"]).json()
    check_envelope(doc, "fingerprint", 0)
    assert doc["fingerprint"] == expected == cmh.inspect(model).record.fingerprint.hex()
    assert doc["error"] is None
    assert doc["kind"] == "file" and doc["tensor_count"] == 6

    state = tensors(6, count=8)
    two = make_sharded(tmp_path / "two", state, shards=2)
    four = make_sharded(tmp_path / "four", state, shards=4)
    a = run(["fingerprint", two, "--json"]).json()
    b = run(["fingerprint", four, "--json"]).json()
    assert a["kind"] == "directory" and a["tensor_count"] == 8 and len(b["files"]) == 4
    assert a["fingerprint"] == b["fingerprint"] == cmh.directory_identity(two).hex


def test_fingerprint_errors(run, garbage: Path, tmp_path: Path) -> None:
    r = run(["fingerprint", garbage])
    assert r.exit_code == 3 and r.stderr.startswith("error: ") and r.stdout == ""
    r = run(["fingerprint", tmp_path / "missing.safetensors", "--json"])
    assert r.exit_code == 3 and "No such file" in r.stderr
    doc = r.json()
    check_envelope(doc, "fingerprint", 3)
    assert doc["kind"] == "file" and "No such file" in doc["error"]
    assert run(["fingerprint"]).exit_code == 2


# -- keygen and sign -------------------------------------------------------------------


def test_keygen(run, tmp_path: Path) -> None:
    prefix = tmp_path / "keys" / "release"
    r = run(["keygen", "--out", prefix, "--json"])
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    check_envelope(doc, "keygen", 0)
    private, public = Path(doc["private_key"]), Path(doc["public_key"])
    assert private == Path(f"{prefix}.key") and public == Path(f"{prefix}.pub")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    key = cmh._signing.load_private_key(private)
    assert doc["key_id"] == cmh._signing.key_id(key.public_key())
    assert doc["key_id"] == cmh._signing.key_id(cmh._signing.load_public_key(public))
    assert doc["encrypted"] is False
    assert [p.name for p in prefix.parent.iterdir()] == sorted(["release.key", "release.pub"])

    # Never overwrite without --force.
    before = private.read_bytes()
    r = run(["keygen", "--out", prefix])
    assert r.exit_code == 2 and "--force" in r.stderr
    assert private.read_bytes() == before
    r = run(["keygen", "--out", prefix, "--force"])
    assert r.exit_code == 0 and "key id:" in r.stdout
    assert private.read_bytes() != before and stat.S_IMODE(private.stat().st_mode) == 0o600
    assert run(["keygen"]).exit_code == 2
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    r = run(["keygen", "--out", blocker / "release"])
    assert r.exit_code == 3 and r.stderr.startswith("error: ") and r.stdout == ""
    r = run(["keygen", "--out", blocker / "release", "--json"])  # one document all the same
    assert r.exit_code == 3
    doc = r.json()
    check_envelope(doc, "keygen", 3)
    assert r.stderr == f"error: {doc['error']}\n" and "private_key" not in doc


def test_keygen_encrypted_and_sign_with_passphrase(run, model: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "enc"
    r = run(["keygen", "--out", prefix, "--encrypt"], env={"CMH_KEY_PASSPHRASE": None})
    assert r.exit_code == 2 and "CMH_KEY_PASSPHRASE" in r.stderr
    assert not Path(f"{prefix}.key").exists()
    r = run(["keygen", "--out", prefix, "--encrypt", "--json"], env={"CMH_KEY_PASSPHRASE": "s3"})
    assert r.exit_code == 0 and r.json()["encrypted"] is True
    assert b"ENCRYPTED" in Path(f"{prefix}.key").read_bytes()
    kid = r.json()["key_id"]

    cmh.stamp(model, "1d")
    key = f"{prefix}.key"
    r = run(["sign", model, "--key", key], env={"CMH_KEY_PASSPHRASE": None})
    assert r.exit_code == 2 and "passphrase" in r.stderr
    r = run(["sign", model, "--key", key], env={"CMH_KEY_PASSPHRASE": "wrong"})
    assert r.exit_code == 2 and "wrong passphrase" in r.stderr
    assert not cmh.inspect(model).signed
    r = run(["sign", model, "--key", key, "--json"], env={"CMH_KEY_PASSPHRASE": "s3"})
    assert r.exit_code == 0
    assert r.json()["files"][0]["signer_key_id"] == kid
    r = run(["verify", model, "--key", f"{prefix}.pub", "--require-signature"])
    assert r.exit_code == 0


def test_sign(run, model: Path, garbage: Path, keys, tmp_path: Path) -> None:
    private, public, kid = keys["alice"]
    r = run(["sign", model, "--key", private, "--json"])
    assert r.exit_code == 1
    doc = r.json()
    check_envelope(doc, "sign", 1)
    assert doc["files"][0]["outcome"] == "unstamped"
    assert "stamp it first" in run(["sign", model, "--key", private]).stdout

    cmh.stamp(model, "7d")
    root = cmh.inspect(model).record.fingerprint
    r = run(["sign", model, "--key", private, "--json"])
    assert r.exit_code == 0
    entry = r.json()["files"][0]
    assert entry["outcome"] == "signed" and entry["signer_key_id"] == kid
    assert entry["record"]["fingerprint"] == root.hex() and entry["record"]["signed"]
    result = cmh.verify(model, trusted_keys=cmh._signing.TrustedKeys.load([public]))
    assert result.ok and result.signature_checked

    r = run(["sign", garbage, "--key", private, "--json"])
    assert r.exit_code == 3 and r.json()["files"][0]["outcome"] == "invalid_file"
    assert run(["sign", model]).exit_code == 2
    r = run(["sign", model, "--key", public])
    assert r.exit_code == 2 and "not a PEM private key: it holds a public key" in r.stderr
    # What the file is comes first: a public key (mode 0644) draws no warning on its mode.
    assert "readable by others" not in r.stderr
    os.chmod(private, 0o644)
    r = run(["sign", model, "--key", private])
    assert r.exit_code == 0 and "private key is readable by others" in r.stderr


def test_sign_checkpoint_directory(run, tmp_path: Path, keys) -> None:
    private, public, _ = keys["alice"]
    ckpt = make_sharded(tmp_path / "ckpt", tensors(7), shards=2)
    assert run(["stamp", ckpt]).exit_code == 0
    r = run(["sign", ckpt, "--key", private, "--json"])
    assert r.exit_code == 0 and len(r.json()["files"]) == 2
    r = run(["verify", ckpt, "--key", public, "--require-signature", "--json"])
    assert r.exit_code == 0 and all(f["signature_checked"] for f in r.json()["files"])


def test_version_and_help(run) -> None:
    r = run(["--version"])
    assert r.exit_code == 0 and r.stdout == f"cmh, version {cmh.__version__}\n"
    r = run(["verify", "--help"])
    assert r.exit_code == 0 and "--require-signature" in r.stdout
    assert run(["no-such-command"]).exit_code == 2


def test_fingerprint_semantic(run, minilm_dir: Path, garbage: Path) -> None:
    from cmh import semantic

    r = run(["fingerprint", minilm_dir, "--semantic", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    check_envelope(doc, "fingerprint", 0)
    assert doc["kind"] == "semantic"
    expected = semantic.fingerprint(minilm_dir)
    assert doc["semantic"] == json.loads(json.dumps(expected.to_dict()))
    assert semantic.ModelFingerprint.from_dict(doc["semantic"]) == expected
    text = run(["fingerprint", minilm_dir, "--semantic"]).stdout
    assert f"  weights: {expected.to_dict()['weights']}" in text
    r = run(["fingerprint", garbage, "--semantic"])
    assert r.exit_code == 3 and r.stderr.startswith("error: ")
    r = run(["fingerprint", garbage.parent / "nothing-here", "--semantic", "--json"])
    assert r.exit_code == 3 and r.json()["kind"] == "semantic" and r.json()["error"]


@pytest.mark.slow
def test_minilm_release_pipeline(run, minilm_copy: Path, keys) -> None:
    """The real model: stamp and sign the directory, verify it, catch a changed byte."""
    private, public, kid = keys["alice"]
    r = run(["stamp", minilm_copy, "--ttl", "90d", "--sign-key", private, "--json"])
    assert r.exit_code == 0, r.stdout
    assert [Path(f["path"]).name for f in r.json()["files"]] == ["model.safetensors"]
    r = run(["verify", minilm_copy, "--key", public, "--require-signature", "--json"])
    assert r.exit_code == 0
    doc = r.json()
    assert doc["files"][0]["signer_key_id"] == kid
    assert doc["checkpoints"][0]["identity"] == cmh.directory_identity(minilm_copy).hex
    flip_tensor_byte(minilm_copy / "model.safetensors", "embeddings.word_embeddings.weight")
    r = run(["verify", minilm_copy, "--key", public, "--json"])
    assert r.exit_code == 1
    assert r.json()["files"][0]["mismatched_tensors"] == ["embeddings.word_embeddings.weight"]


# -- every file type, every name (issue 39) -------------------------------------------------


def _special_paths(folder: Path) -> list[Path]:
    """PATHs that are not regular files, and a directory whose index names a link loop."""
    import os
    import socket

    folder.mkdir()
    os.mkfifo(folder / "fifo.safetensors")
    parent = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX) as sock:  # bound through /proc: a short address
            sock.bind(f"/proc/self/fd/{parent}/socket.safetensors")
    finally:
        os.close(parent)
    (folder / "null.safetensors").symlink_to("/dev/null")
    (folder / "loop.safetensors").symlink_to("loop.safetensors")
    (folder / "dangling.safetensors").symlink_to("gone.safetensors")
    looped = make_sharded(folder / "looped", tensors(2), 2)
    (looped / "model-00002-of-00002.safetensors").unlink()
    (looped / "model-00002-of-00002.safetensors").symlink_to("model-00002-of-00002.safetensors")
    names = ["fifo", "socket", "null", "loop", "dangling", "missing"]
    return [*(folder / f"{n}.safetensors" for n in names), looped]


def test_no_format_command_blocks_or_crashes_on_any_file_type(tmp_path: Path, keys) -> None:
    """A FIFO, a socket, a device, link loops (also one the index names), a dangling link,
    a missing path: each command answers at once, exit 3, one JSON document, no traceback."""
    from cli_support import run_subprocess

    paths = _special_paths(tmp_path / "special")
    alice_key, alice_pub, _ = keys["alice"]
    many = [
        ["verify", "--json", *paths],
        ["verify", "--json", "--key", alice_pub, *paths],
        ["stamp", "--json", *paths],
        ["sign", "--json", "--key", alice_key, *paths],
    ]
    for args in many:
        r = run_subprocess(args)  # a 120 s timeout: a FIFO opened blocking would hang here
        assert r.exit_code == 3, (args, r.stderr)
        document = r.json()
        outcomes = [f["outcome"] for f in document["files"]]
        assert outcomes == ["invalid_file"] * 6, (args, outcomes)
        assert document["checkpoints"][0]["error"].endswith(
            "index names a missing shard 'model-00002-of-00002.safetensors'"
        )
    for command in ("inspect", "fingerprint"):
        for path in (paths[0], paths[1], paths[-1]):
            r = run_subprocess([command, "--json", path])
            assert r.exit_code == 3 and r.json()["ok"] is False, (command, path, r.stderr)
    fifo = run_subprocess(["verify", paths[0]])
    assert "is a FIFO (named pipe), not a regular file" in fifo.stdout
    # A key file that is a FIFO is a usage error, also reached without blocking.
    r = run_subprocess(["verify", "--key", paths[0], tmp_path / "special" / "null.safetensors"])
    assert r.exit_code == 2 and "FIFO" in r.stderr


def test_path_hex_in_every_format_command(tmp_path: Path) -> None:
    """Non-UTF-8 names keep their bytes in every command's --json: files, the checkpoint,
    its index and its files (spec section 6, "Names in reports")."""
    import os

    from cli_support import run_runner

    folder = tmp_path / os.fsdecode(b"ckpt-\xff")
    make_sharded(folder, tensors(3), 1)
    (folder / "model-00001-of-00001.safetensors").rename(folder / os.fsdecode(b"m\xfe.safetensors"))
    (folder / "model.safetensors.index.json").unlink()
    shard = str(folder / os.fsdecode(b"m\xfe.safetensors"))

    def exact(path: str) -> str:
        return os.fsencode(path).hex()

    for command in ("stamp", "verify"):
        document = run_runner([command, "--json", str(folder)]).json()
        (checkpoint,) = document["checkpoints"]
        assert checkpoint["path_hex"] == exact(str(folder))
        assert checkpoint["files_hex"] == [exact(shard)]
        assert checkpoint["index_hex"] is None
        (file,) = document["files"]
        shown = os.fsencode(shard).decode("utf-8", "replace")  # U+FFFD for each bad byte
        assert (file["path"], file["path_hex"]) == (shown, exact(shard))
    document = run_runner(["inspect", "--json", str(folder)]).json()
    assert document["path_hex"] == exact(str(folder))
    assert document["checkpoint"]["path_hex"] == exact(str(folder))
    assert document["files"][0]["path_hex"] == exact(shard)
    document = run_runner(["fingerprint", "--json", str(folder)]).json()
    assert document["path_hex"] == exact(str(folder))
    assert document["files_hex"] == [os.fsencode(os.fsdecode(b"m\xfe.safetensors")).hex()]
    document = run_runner(["fingerprint", "--json", shard]).json()
    assert document["path_hex"] == exact(shard)
    # A UTF-8 name has null there.
    save_file(tensors(1), str(tmp_path / "plain.safetensors"))
    assert (
        run_runner(["inspect", "--json", tmp_path / "plain.safetensors"]).json()["path_hex"] is None
    )


def test_verify_says_an_unchecked_signature_once(run, model: Path, keys) -> None:
    alice_key, _, alice_id = keys["alice"]
    cmh.stamp(model, "30d")
    assert run(["sign", model, "--key", alice_key]).exit_code == 0
    r = run(["verify", model])
    assert r.exit_code == 0
    assert r.stdout.count("NOT checked") == 1 and f"signed by key {alice_id}" in r.stdout
    assert "not checked" not in r.stderr.lower()
    # In JSON the note stays: a machine reads no line.
    notes = run(["verify", model, "--json"]).json()["files"][0]["notes"]
    assert any("signature not checked" in n for n in notes)


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        (b"hello, this is not a model\n", "looks like a text file"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\n", "git lfs pull"),
        (b"<!DOCTYPE html><html>login</html>", "HTML"),
        (b'{"architectures": ["BertModel"]}', "a JSON file"),
    ],
)
def test_a_text_file_gets_a_hint(text: bytes, hint: str, tmp_path: Path) -> None:
    from cli_support import run_runner

    path = tmp_path / "model.safetensors"
    path.write_bytes(text)
    r = run_runner(["verify", path])
    assert (
        r.exit_code == 3 and "this is not a safetensors file, it starts with the text" in r.stdout
    )
    assert hint in r.stdout
    r = run_runner(["inspect", path])
    assert r.exit_code == 3 and hint in r.stderr


# -- error lines -----------------------------------------------------------------------


def test_a_write_failure_names_its_path_once(run, model: Path, tmp_path: Path, keys) -> None:
    """``stamp`` and ``sign`` print ``FAILED   PATH: why`` and an ``error`` that is the why
    alone, as ``inspect`` does: the path is in the line (and in ``path``) once."""
    alice_key, _, _ = keys["alice"]
    missing = tmp_path / "missing.safetensors"
    for args, path in (
        (["stamp", missing], missing),
        (["sign", model, "--key", alice_key], model),  # not stamped
    ):
        r = run(args)
        assert r.exit_code in (1, 3) and r.stdout.startswith("FAILED"), r.stdout
        assert r.stdout.count(str(path)) == 1, r.stdout
        error = run([*args, "--json"]).json()["files"][0]["error"]
        assert error and str(path) not in error, error


# -- inspect's exit statuses -----------------------------------------------------------


def test_inspect_never_exits_1_and_its_help_says_so(run, model: Path, keys) -> None:
    """``inspect`` shows (a stamp expired, a signature by an untrusted key): 0; 3 for an
    unreadable file; its ``--help`` names those, not ``1 a check failed``."""
    alice_key, _, _ = keys["alice"]
    _, mallory_pub, _ = keys["mallory"]
    cmh.stamp(model, ttl="1s", now=1_700_000_000)
    assert run(["sign", model, "--key", alice_key]).exit_code == 0
    assert run(["inspect", model, "--key", mallory_pub]).exit_code == 0
    shown = " ".join(run(["inspect", "--help"]).stdout.split())
    assert "Exit status: 0 shown, 2 usage error, 3 unreadable or not a safetensors file" in shown
    assert "1 a check failed" not in shown


def test_ttl_zero_expires_at_once_while_never_stores_zero(tmp_path: Path) -> None:
    """--ttl 0s writes expires_at = now (expired at once); --ttl never writes 0 (never)."""
    import numpy as np
    from cli_support import run_runner

    model = tmp_path / "m.safetensors"
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(model))
    r = run_runner(["stamp", model, "--ttl", "0s", "--json"])
    record = r.json()["files"][0]["record"]
    assert r.exit_code == 0 and record["expires_at"] == record["stamped_at"] != 0
    assert record["expired"] is True
    assert run_runner(["verify", model]).exit_code == 1
    r = run_runner(["stamp", model, "--ttl", "never", "--json"])
    assert r.json()["files"][0]["record"]["expires_at"] is None
    help_text = run_runner(["stamp", "--help"]).stdout
    assert "0s expires the file at once" in " ".join(help_text.split())
