"""Checkpoint directories: shards, the index, and the directory identity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import cmh
from cmh._checkpoint import find_checkpoint, index_problems, read_headers


def shard_dir(tmp_path: Path, tensors: dict[str, np.ndarray], splits: list[list[str]]) -> Path:
    folder = tmp_path / f"ckpt-{len(splits)}"
    folder.mkdir()
    weight_map = {}
    for i, names in enumerate(splits, 1):
        file = f"model-{i:05d}-of-{len(splits):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(folder / file), {"format": "pt"})
        weight_map.update({n: file for n in names})
    if len(splits) > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        (folder / "model-00001-of-00001.safetensors").rename(folder / "model.safetensors")
    return folder


@pytest.fixture
def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {f"h.{i}.w": rng.standard_normal((8, 8)).astype(np.float32) for i in range(6)}


def test_resharding_keeps_the_identity(tmp_path: Path, tensors: dict[str, np.ndarray]) -> None:
    names = sorted(tensors)
    one = shard_dir(tmp_path, tensors, [names])
    two = shard_dir(tmp_path, tensors, [names[:3], names[3:]])
    three = shard_dir(tmp_path, tensors, [names[::3], names[1::3], names[2::3]])
    ids = {cmh.directory_identity(d).hex for d in (one, two, three)}
    assert len(ids) == 1
    assert cmh.fingerprint(two).kind == "directory"
    assert cmh.fingerprint(two).hex in ids


def test_changed_tensor_changes_the_identity(
    tmp_path: Path, tensors: dict[str, np.ndarray]
) -> None:
    names = sorted(tensors)
    before = cmh.directory_identity(shard_dir(tmp_path, tensors, [names[:3], names[3:]])).hex
    tensors["h.4.w"] = tensors["h.4.w"].copy()
    tensors["h.4.w"][0, 0] += 1
    other = tmp_path / "other"
    other.mkdir()
    after = cmh.directory_identity(shard_dir(other, tensors, [names[:3], names[3:]])).hex
    assert before != after


def test_manifests_give_the_same_identity_without_reading_bytes(
    tmp_path: Path, tensors: dict[str, np.ndarray]
) -> None:
    names = sorted(tensors)
    folder = shard_dir(tmp_path, tensors, [names[:3], names[3:]])
    hashed = cmh.directory_identity(folder)
    for shard in folder.glob("*.safetensors"):
        cmh.stamp(shard)
    claimed = cmh.directory_identity(folder, use_manifests=True)
    assert claimed.identity == hashed.identity
    assert claimed.hashed_files == ()
    assert len(hashed.hashed_files) == 2


def test_index_disagreements_are_reported(tmp_path: Path, tensors: dict[str, np.ndarray]) -> None:
    names = sorted(tensors)
    folder = shard_dir(tmp_path, tensors, [names[:3], names[3:]])
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    data["weight_map"][names[0]] = "model-00002-of-00002.safetensors"
    del data["weight_map"][names[5]]
    index.write_text(json.dumps(data))
    checkpoint = find_checkpoint(folder)
    problems = index_problems(checkpoint, read_headers(checkpoint))
    text = "\n".join(problems)
    assert "'ghost'" in text and "no shard holds it" in text
    assert f"{names[0]!r} in model-00002" in text
    assert f"{names[5]!r}" in text and "missing from the index" in text
    with pytest.raises(cmh.IndexInconsistentError, match="index and shards disagree"):
        cmh.directory_identity(folder)


def test_index_naming_a_missing_or_outside_shard(
    tmp_path: Path, tensors: dict[str, np.ndarray]
) -> None:
    folder = shard_dir(tmp_path, tensors, [sorted(tensors)[:3], sorted(tensors)[3:]])
    index = folder / "model.safetensors.index.json"
    (tmp_path / "x.safetensors").write_bytes(b"")
    (folder / "link.safetensors").symlink_to(tmp_path / "x.safetensors")
    for target, message in (
        ("gone.safetensors", "missing shard"),
        ("link.safetensors", "outside"),
        ("../x.safetensors", "without a slash"),
        ("./gone.safetensors", "without a slash"),
        ("gone.safetensors/", "must end in .safetensors"),
        ("a\0.safetensors", "NUL"),
    ):
        index.write_text(json.dumps({"weight_map": {"a": target}}))
        with pytest.raises(cmh.InvalidFileError, match=message):
            find_checkpoint(folder)
    index.write_text("{not json")
    with pytest.raises(cmh.InvalidFileError, match="not valid JSON"):
        find_checkpoint(folder)


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(cmh.InvalidFileError, match=r"no \*\.safetensors"):
        cmh.directory_identity(tmp_path)


@pytest.mark.heavy
def test_transformers_sharded_and_unsharded_saves_share_the_identity(tmp_path: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    model = BertModel(config)
    model.save_pretrained(tmp_path / "single")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    assert (
        cmh.directory_identity(tmp_path / "single").identity
        == cmh.directory_identity(tmp_path / "sharded").identity
    )
