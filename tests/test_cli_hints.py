"""Errors that name what a person did and what to do instead (no internal jargon alone)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from cli_support import run_runner
from safetensors.numpy import save_file

import cmh


def test_a_pytorch_bin_is_named_with_a_conversion_hint(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(path, "w") as z:  # what torch.save writes since PyTorch 1.6
        z.writestr("archive/data.pkl", b"\x80\x02" + b"x" * 200)
    run = run_runner(["verify", path])
    assert run.exit_code == 3
    assert "looks like a zip archive: a PyTorch checkpoint" in run.stdout
    assert "safetensors.torch.save_file" in run.stdout


def test_an_expired_file_names_restamp_and_allow_expired(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones(4, dtype=np.float32)}, str(path))
    cmh.stamp(path, ttl="1s", now=1_700_000_000)
    run = run_runner(["verify", path])
    assert run.exit_code == 1 and "--allow-expired" in run.stdout
    assert f"cmh stamp {path} --ttl 30d" in run.stdout


@pytest.mark.parametrize(
    ("repo", "hint"),
    [
        ("https://huggingface.co/org/name", "give the repo id, not a URL: 'org/name'"),
        ("https://huggingface.co/datasets/org/x/tree/main", "'org/x' with --repo-type dataset"),
        ("datasets/org/x", "give 'org/x' with --repo-type dataset"),
        ("a b", "expected NAME or ORG/NAME"),
    ],
)
def test_a_repo_id_in_another_form_says_the_expected_one(
    tmp_path: Path, repo: str, hint: str
) -> None:
    run = run_runner(["pull", repo, "--offline", "--cache-dir", tmp_path])
    assert run.exit_code == 2 and hint in run.stderr, run.stderr


def test_a_store_path_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "store").write_text("not a folder")
    run = run_runner(["mirror", "ls", "--store", tmp_path / "store"])
    assert run.exit_code == 2 and "is a file, not a store folder" in run.stderr
    missing = run_runner(["mirror", "ls", "--store", tmp_path / "nowhere"])
    assert missing.exit_code == 2 and "made by the first import: cmh mirror add" in missing.stderr


def test_a_hub_cache_snapshot_given_to_mirror_add_is_explained(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/abc")
    run = run_runner(["mirror", "add", snapshot, "--store", tmp_path / "store", "--repo", "org/x"])
    assert run.exit_code == 2 and "snapshot folder of a Hugging Face cache" in run.stderr
    assert "cp -rL" in run.stderr


@pytest.mark.parametrize(
    "text",
    [b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n", b"hello world\n"],
)
def test_a_text_file_is_named_before_its_header_length(tmp_path: Path, text: bytes) -> None:
    """The diagnosis leads; the header length its first bytes give comes after, as detail."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(text)
    with pytest.raises(cmh.InvalidFileError) as info:
        cmh.inspect(path)
    assert info.value.reason.startswith("this is not a safetensors file"), info.value.reason
    assert "header length" in info.value.reason


def test_a_too_large_small_file_says_so_plainly(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_bytes(b"x" * ((1 << 20) + 1))
    with pytest.raises(OSError) as info:
        cmh.read_small_file(path)
    assert "the most read" not in str(info.value.strerror)
    assert "larger than 1 MiB" in str(info.value.strerror)
