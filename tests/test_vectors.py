"""The CMH v1 test vectors: checked by the library and by an independent spec reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import spec_reader
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

import cmh
from cmh.signing import TrustedKeys

VECTORS = Path(__file__).parent / "fixtures" / "vectors"
CASES = sorted(p for p in VECTORS.glob("*.json") if p.name != "sharded.json")


def public_key() -> Ed25519PublicKey:
    key = serialization.load_pem_public_key((VECTORS / "signing-key.pub").read_bytes())
    assert isinstance(key, Ed25519PublicKey)
    return key


def test_there_are_vectors_for_every_listed_edge_case() -> None:
    names = {p.stem for p in CASES}
    assert names >= {
        "basic", "no-metadata", "empty-and-scalar", "non-ascii-names", "one-tensor",
        "many-tensors", "bool-and-f8", "signed", "expired", "no-tensors",
    }  # fmt: skip
    assert json.loads((VECTORS / "many-tensors.json").read_text())["tensor_count"] == 10_000


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_spec_reader_agrees_with_the_vector(case: Path) -> None:
    expected = json.loads(case.read_text())
    found = spec_reader.check_file(VECTORS / expected["file"], public_key())
    assert found["root"] == expected["root"] == expected["record"]["fingerprint"]
    assert found["record_hex"] == expected["record_hex"]
    assert found["expires_at"] == expected["expires_at"]
    assert found["flags"] == expected["record"]["flags"]
    assert found["key_id"] == expected["signed_by_key_id"]
    by_name = {t["name"]: t for t in expected["tensors"]}
    parsed = spec_reader.parse((VECTORS / expected["file"]).read_bytes())
    for (name, *_), sha, fast in zip(
        parsed.tensors, found["sha256"], found["xxh3_128"], strict=True
    ):  # type: ignore[call-overload]
        if name in by_name:
            assert by_name[name]["sha256"] == sha
            assert by_name[name]["xxh3_128"] == fast


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_library_agrees_with_the_vector(case: Path) -> None:
    expected = json.loads(case.read_text())
    path = VECTORS / expected["file"]
    info = cmh.inspect(path)
    assert info.record is not None
    assert info.record.to_hex() == expected["record_hex"]
    assert cmh.fingerprint(path).hex == expected["root"]
    keys = TrustedKeys.load([VECTORS / "signing-key.pub"])
    verdict = cmh.verify(
        path, at=expected["stamped_at"], trusted_keys=keys, require_signature=False
    )
    assert verdict.ok, verdict.message
    assert verdict.signer_key_id == expected["signed_by_key_id"]
    if expected["expires_at"]:
        late = cmh.verify(path, at=expected["expires_at"])
        assert late.outcome is cmh.Outcome.EXPIRED
    digests = {d.name: d for d in cmh.hash_tensors(path, cmh.read_header(path), xxh3=True)}
    for t in expected["tensors"]:
        assert digests[t["name"]].sha256.hex() == t["sha256"]  # type: ignore[union-attr]
        assert digests[t["name"]].xxh3.hex() == t["xxh3_128"]  # type: ignore[union-attr]


def test_sharded_identity_matches_single_file_and_spec_reader() -> None:
    expected = json.loads((VECTORS / "sharded.json").read_text())
    sharded = VECTORS / expected["directory"]
    assert cmh.directory_identity(sharded).hex == expected["identity"]
    assert (
        cmh.directory_identity(VECTORS / expected["same_identity_as"]).hex == expected["identity"]
    )
    shards = [spec_reader.parse(p.read_bytes()) for p in sorted(sharded.glob("*.safetensors"))]
    assert spec_reader.directory_identity(shards).hex() == expected["identity"]


def test_vectors_are_reproducible(tmp_path: Path) -> None:
    """tools/make_vectors.py writes the same vectors again.

    The stock writer does not keep metadata key order across processes, so
    file bytes may differ; records, roots and every expectation may not.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_vectors", Path(__file__).parent.parent / "tools" / "make_vectors.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_vectors(tmp_path / "v")
    for committed in sorted(VECTORS.glob("*.json")):
        rebuilt = tmp_path / "v" / committed.name
        assert json.loads(rebuilt.read_text()) == json.loads(committed.read_text()), committed.name
    for committed in sorted(VECTORS.rglob("*.safetensors")):
        rebuilt = tmp_path / "v" / committed.relative_to(VECTORS)
        assert cmh.inspect(rebuilt).record == cmh.inspect(committed).record, committed.name
