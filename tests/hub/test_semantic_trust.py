"""Issue 25 case 9: stamps are trusted when their bytes were checked, not by an mtime.

``cmh mirror add`` and ``cmh pull`` of a stamped model hash every tensor anyway (the
import's manifest, the download's check), so they leave check records: a semantic
fingerprint of the store's snapshot or of the pulled snapshot then reads headers only,
and the mirror's repo page shows the stamps as trusted. An edit followed by restoring
the mtime is caught (the change time moves, and os.utime cannot set it back).
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import run_runner
from deadline_support import TEST_DEADLINE
from mirror_support import MirrorServer
from test_semantic import tensors, write_model

import cmh
from cmh.semantic import fingerprint

REPO = "acme/stamped"


@pytest.fixture
def no_tensor_hashing(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make any tensor hashing by the semantic reader fail the test."""

    def forbid() -> None:
        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError("tensor bytes were hashed")

        monkeypatch.setattr("cmh.semantic._tensors.hash_tensors", refuse)

    return forbid


def _stamped_model(tmp_path: Path) -> Path:
    model = write_model(tmp_path / "src", tensors())
    cmh.stamp(model / "model.safetensors")
    return model


def _stamped_at(path: Path) -> int:
    from cmh._carrier import read_carrier

    header = cmh.read_header(path)
    carrier = read_carrier(header.metadata, len(header.tensors))
    assert carrier is not None
    return carrier.record.stamped_at


def _edit_keeping_mtime(path: Path) -> None:
    st = path.stat()
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


def test_mirror_add_and_pull_keep_stamps_trusted(
    tmp_path: Path,
    mirror_server_factory: Callable[..., MirrorServer],
    no_tensor_hashing: Callable[[], None],
) -> None:
    src = _stamped_model(tmp_path)
    reference = fingerprint(src)
    store = tmp_path / "store"
    added = run_runner(["mirror", "add", src, "--store", store, "--repo", REPO])
    assert added.exit_code == 0, added.stderr
    snapshot = next((store / "models--acme--stamped" / "snapshots").iterdir())
    server = mirror_server_factory(store)

    cache = tmp_path / "cache"
    pulled = run_runner(
        ["pull", REPO, "--endpoint", server.url, "--cache-dir", cache],
        env={"HF_HUB_OFFLINE": None},
    )
    assert pulled.exit_code == 0, pulled.stderr
    pulled_snapshot = next((cache / "models--acme--stamped" / "snapshots").iterdir())
    blob = (pulled_snapshot / "model.safetensors").resolve()
    assert blob.stat().st_mtime_ns > _stamped_at(blob) * 10**9  # mtime is later

    with urllib.request.urlopen(f"{server.url}/-/models/{REPO}", timeout=TEST_DEADLINE) as response:
        page = response.read().decode()
    assert reference.scope in page or reference.weights in page  # the fingerprint is shown
    assert "Stamps not trusted" not in page

    no_tensor_hashing()
    for where in (snapshot, pulled_snapshot):
        fp = fingerprint(where)
        assert fp.hashed_files == () and fp.untrusted_stamps == (), where
        assert fp == reference and fp.keys() == reference.keys()

    _edit_keeping_mtime(blob)
    with pytest.raises(AssertionError, match="tensor bytes were hashed"):
        fingerprint(pulled_snapshot)  # the stamp is no longer taken: the bytes must be read


def test_edit_with_restored_mtime_is_caught(tmp_path: Path) -> None:
    src = _stamped_model(tmp_path)
    path = src / "model.safetensors"
    trusted = fingerprint(src)
    assert trusted.hashed_files == ()
    _edit_keeping_mtime(path)
    edited = fingerprint(src)
    assert edited.hashed_files == ("model.safetensors",)
    assert "written since it was checked" in dict(edited.untrusted_stamps)["model.safetensors"]
    assert edited.weights != trusted.weights
    assert not edited.compatible(trusted, "kv")
    # cp -p copies the bytes and the mtime, not the check: the copy is hashed until checked
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.json", "model.safetensors"):
        (copy / name).write_bytes((src / name).read_bytes())
    assert fingerprint(copy).hashed_files == ("model.safetensors",)
    assert cmh.verify(copy / "model.safetensors").ok is False  # the edited bytes


def test_in_place_restamp_refuses_a_concurrent_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write while an in-place restamp hashes: nothing written, no trusted stale stamp."""
    import cmh._stamping as stamping

    src = _stamped_model(tmp_path)
    path = src / "model.safetensors"
    original = stamping.hash_tensors

    def hash_then_write(*args: object, **kwargs: object) -> object:
        result = original(*args, **kwargs)  # type: ignore[arg-type]
        with open(path, "r+b") as f:  # a concurrent writer, while the stamp is running
            f.seek(-1, os.SEEK_END)
            f.write(b"\x07")
        return result

    monkeypatch.setattr(stamping, "hash_tensors", hash_then_write)
    with pytest.raises(cmh.StampError, match="changed while it was stamped"):
        cmh.stamp(path, now=_stamped_at(path) + 1)
    monkeypatch.undo()
    fp = fingerprint(src)
    assert fp.hashed_files == ("model.safetensors",)  # the stale stamp is not trusted
