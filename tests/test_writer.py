"""cmh.save_file: a stamped file written in one pass, loadable by stock readers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from format_support import synthetic_tensors

import cmh


def test_numpy_tensors_round_trip_and_verify(tmp_path: Path) -> None:
    tensors = synthetic_tensors(5)
    tensors["big_endian"] = np.arange(6, dtype=">i4").reshape(2, 3)
    tensors["strided"] = np.arange(12, dtype=np.int64).reshape(3, 4).T
    tensors["flags"] = np.array([True, False, True])
    path = tmp_path / "m.safetensors"
    result = cmh.save_file(tensors, path, {"format": "np"}, ttl="1d", now=1_000)
    assert result.record.expires_at == 1_000 + 86400
    assert cmh.verify(path, at=1_001).ok
    loaded = safetensors.numpy.load_file(str(path))
    assert loaded.keys() == tensors.keys()
    for name, value in tensors.items():
        assert np.array_equal(loaded[name], value) and loaded[name].shape == value.shape
    assert cmh.inspect(path).metadata == {"format": "np"}


def test_hashing_threads_and_progress_and_both_manifests(tmp_path: Path) -> None:
    tensors = synthetic_tensors(4)
    seen: list[int] = []
    path = tmp_path / "m.safetensors"
    cmh.save_file(tensors, path, hashing=cmh.Hashing(threads=1, progress=seen.append))
    assert sum(seen) == cmh.inspect(path).tensor_bytes and len(seen) == len(tensors)
    info = cmh.inspect(path)
    assert info.has_sha256_manifest and info.has_xxh3_manifest
    assert cmh.verify(path, fast=True).ok


def test_same_fingerprint_as_a_stock_save_then_stamp(tmp_path: Path) -> None:
    tensors = synthetic_tensors(6)
    ours, stock = tmp_path / "ours.safetensors", tmp_path / "stock.safetensors"
    cmh.save_file(tensors, ours, {"format": "pt"})
    safetensors.numpy.save_file(tensors, str(stock), {"format": "pt"})
    cmh.stamp(stock)
    assert cmh.inspect(ours).record.fingerprint == cmh.inspect(stock).record.fingerprint  # type: ignore[union-attr]


def test_torch_tensors_with_bf16_and_f8(tmp_path: Path) -> None:
    from cmh._signing import TrustedKeys, generate_keypair, load_private_key

    private_pem, public_pem, kid = generate_keypair()
    (tmp_path / "k.key").write_bytes(private_pem)
    (tmp_path / "k.pub").write_bytes(public_pem)
    tensors = {
        "w": torch.randn(4, 4).to(torch.bfloat16),
        "f8": torch.randn(8).to(torch.float8_e4m3fn),
        "t": torch.randn(3, 5).t(),
        "i": torch.arange(7),
    }
    path = tmp_path / "t.safetensors"
    result = cmh.save_file(tensors, path, sign_key=load_private_key(tmp_path / "k.key"))
    assert result.signer_key_id == kid
    keys = TrustedKeys.load([tmp_path / "k.pub"])
    assert cmh.verify(path, trusted_keys=keys, require_signature=True).ok
    loaded = safetensors.torch.load_file(str(path))
    for name, value in tensors.items():
        assert torch.equal(loaded[name].view(torch.uint8), value.contiguous().view(torch.uint8))


def test_bad_input_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    with pytest.raises(cmh.CMHError, match="reserved"):
        cmh.save_file({"a": np.zeros(2)}, path, {"cmh": "mine"})
    with pytest.raises(cmh.CMHError, match="unsupported type"):
        cmh.save_file({"a": [1, 2, 3]}, path)
    with pytest.raises(cmh.CMHError, match="unsupported type"):
        cmh.save_file({"a": np.array(["x"])}, path)
    with pytest.raises(cmh.CMHError, match="strings"):
        cmh.save_file({"a": np.zeros(2)}, path, {"n": 1})  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []
