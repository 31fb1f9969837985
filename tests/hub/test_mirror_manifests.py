"""Tensor manifests of unstamped safetensors files: the mirror's endpoint and the resolver's use.

A mirror computes per-tensor SHA-256 digests and the v1 root of every
safetensors blob it stores (import or pull-through fill) and serves them on
``/api/cmh/manifest/{repo}/resolve/{rev}/{path}``; ``cmh.hub.resolve`` uses
them to update an unstamped file tensor by tensor.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import cmh.hub as hub
import httpx2
import numpy as np
from cmh.hub.mirror.stores.local._folder import add_folder
from deadline_support import TEST_DEADLINE
from hublike import running
from mirror_support import MirrorServer, ProcessClock
from safetensors.numpy import save_file

from cmh import read_header, stamp

REPO = "cmh-test/unstamped"
TENSORS = 16
TENSOR_BYTES = 2 << 20


def _write(folder: Path, changed: int | None) -> Path:
    """An unstamped file of 16 float32 tensors of 2 MiB; ``changed`` names one tensor altered."""
    rng = np.random.default_rng(7)
    tensors = {f"layer.{i:02d}": rng.standard_normal(TENSOR_BYTES // 4).astype(np.float32)
               for i in range(TENSORS)}  # fmt: skip
    if changed is not None:
        tensors[f"layer.{changed:02d}"] = tensors[f"layer.{changed:02d}"] + 1.0
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), {"format": "pt"})
    (folder / "config.json").write_text('{"model_type": "unstamped"}\n')
    return folder


def test_manifest_endpoint_digests_and_root(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    src = _write(tmp_path / "v1", None)
    store = tmp_path / "store"
    add_folder(store, src, REPO)
    etag = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    kept = store / "models--cmh-test--unstamped" / ".cmh" / "manifests" / f"{etag}.json"
    assert kept.is_file()  # computed at import
    server = mirror_server_factory(store)
    url = f"{server.url}/api/cmh/manifest/{REPO}/resolve/main/model.safetensors"
    doc = httpx2.get(url, timeout=TEST_DEADLINE).json()
    assert doc["schema"] == "cmh-tensor-manifest/1" and doc["etag"] == etag
    data = (src / "model.safetensors").read_bytes()
    header = read_header(src / "model.safetensors")
    for t, entry in zip(header.tensors, doc["tensors"], strict=True):
        assert entry["name"] == t.name
        piece = data[header.data_start + t.begin : header.data_start + t.end]
        assert entry["sha256"] == hashlib.sha256(piece).hexdigest()
    stamped = tmp_path / "stamped.safetensors"
    shutil.copy(src / "model.safetensors", stamped)
    assert doc["root"] == stamp(stamped).record.fingerprint.hex()  # the root a stamp records
    other = httpx2.get(
        f"{server.url}/api/cmh/manifest/{REPO}/resolve/main/config.json", timeout=TEST_DEADLINE
    )
    assert other.status_code == 422 and other.headers["X-Error-Code"] == "NotSafetensors"
    absent = httpx2.get(
        f"{server.url}/api/cmh/manifest/{REPO}/resolve/main/nope.safetensors", timeout=TEST_DEADLINE
    )
    assert absent.status_code == 404 and absent.headers["X-Error-Code"] == "EntryNotFound"


def _changed_bytes() -> int:
    return TENSOR_BYTES


def test_resolver_updates_an_unstamped_file_tensor_by_tensor(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    add_folder(store, _write(tmp_path / "v1", None), REPO)
    server = mirror_server_factory(store)
    cache = tmp_path / "cache"
    first = hub.resolve(REPO, cache_dir=cache, endpoint=server.url, token=False)
    assert first.state is hub.State.MISSING
    new_src = _write(tmp_path / "v2", changed=5)
    add_folder(store, new_src, REPO)
    policy = hub.Policy(revalidate=True)
    update = hub.resolve(REPO, cache_dir=cache, endpoint=server.url, token=False, policy=policy)
    weights = next(f for f in update.files if f.path == "model.safetensors")
    assert weights.action is hub.Action.PATCHED
    header_bytes = read_header(new_src / "model.safetensors").data_start
    assert weights.bytes_transferred <= 1.05 * _changed_bytes() + header_bytes + (128 << 10)
    got = (update.path / "model.safetensors").read_bytes()
    assert got == (new_src / "model.safetensors").read_bytes()


def test_pullthrough_fill_and_downstream_update_use_manifests(
    mirror_server_factory: Callable[..., MirrorServer], process_clock: ProcessClock, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    add_folder(store, _write(tmp_path / "v1", None), REPO)
    origin = mirror_server_factory(store)
    with running(origin.url, xet_listing=False) as front:
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(
            tmp_path / "pull",
            extra_args=("--upstream", front.url, "--fresh-for", "1h"),
            clock=process_clock,
        )
        cache = tmp_path / "cache"
        hub.resolve(REPO, cache_dir=cache, endpoint=pull.url, token=False)
        new_src = _write(tmp_path / "v2", changed=3)
        add_folder(store, new_src, REPO)
        process_clock.advance(3601)  # past --fresh-for: the mirror revalidates
        front.wait_idle()
        cdn_before = sum(r.bytes_sent for r in front.records(origin="cdn"))
        policy = hub.Policy(revalidate=True)
        update = hub.resolve(REPO, cache_dir=cache, endpoint=pull.url, token=False, policy=policy)
        front.wait_idle()
        weights = next(f for f in update.files if f.path == "model.safetensors")
        assert weights.action is hub.Action.PATCHED
        header_bytes = read_header(new_src / "model.safetensors").data_start
        limit = 1.05 * _changed_bytes() + header_bytes + (128 << 10)
        assert weights.bytes_transferred <= limit  # the client, from the pull-through mirror
        upstream = sum(r.bytes_sent for r in front.records(origin="cdn")) - cdn_before
        assert upstream <= limit  # the pull-through mirror, from its upstream
        assert (update.path / "model.safetensors").read_bytes() == (
            new_src / "model.safetensors"
        ).read_bytes()


def test_a_streamed_manifest_equals_the_one_computed_from_a_file(tmp_path: Path) -> None:
    """Issue 34: a bucket computed a manifest from a whole copy of the blob in TMPDIR; it is
    computed from the storage's stream now, in one pass, whatever the chunks' sizes."""
    import struct

    import pytest
    from cmh.hub.mirror._manifests import ManifestError, compute, compute_streamed

    rng = np.random.default_rng(3)
    tensors = {
        "a": rng.standard_normal(1000).astype(np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "b": rng.integers(0, 255, 333).astype(np.uint8),
        "c": rng.standard_normal((7, 9)).astype(np.float64),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), {"format": "pt"})
    data = path.read_bytes()
    etag = hashlib.sha256(data).hexdigest()
    want = compute(path, etag)
    for size in (1, 7, 4096, len(data)):
        chunks = (data[i : i + size] for i in range(0, len(data), size))
        assert compute_streamed(chunks, etag, len(data)) == want, size
    with pytest.raises(ManifestError, match="does not hash to its name"):
        compute_streamed([data[:-1]], etag, len(data))
    with pytest.raises(ManifestError, match="does not hash to its name"):
        compute_streamed([data], "0" * 64, len(data))
    huge = struct.pack("<Q", 1 << 40) + b"{" * 64
    with pytest.raises(ManifestError, match="exceeds"):
        compute_streamed(iter([huge] * 4), "0" * 64, 1 << 41)
