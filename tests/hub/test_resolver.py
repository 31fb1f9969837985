"""cmh.hub.resolve against a real ``cmh serve`` on 127.0.0.1: every state, counted at the server."""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

import cmh.hub as hub
import numpy as np
import pytest
from cmh.hub.cache import RepoLayout
from cmh.hub.mirror import add_folder
from mirror_support import MirrorServer
from resolver_support import FaultProxy, tensors_for, write_checkpoint_repo
from safetensors.numpy import load_file

import cmh

REPO = "org/toy"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def requests_at(server) -> int:
    """Requests the mirror answered, minus its own /health and /metrics probes."""
    return sum(1 for e in server.log() if e["route"] not in ("health", "metrics"))


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory):
    """One ``cmh serve`` for the module (the subject is the resolver, not the server): each
    test adds a repo of its own to its store. Tests run one at a time in a module, so a
    test's before/after counts at the server are its own."""
    base = tmp_path_factory.mktemp("toy-hub")
    store = base / "store"
    add_folder(store, write_checkpoint_repo(base / "seed", 1), "org/seed")
    with MirrorServer(store, base / "logs") as server:
        yield server


@pytest.fixture
def toy(tmp_path, toy_server):
    """A repo of its own (v1, stamped, 30 days) in the module's store and server, and an
    empty cache."""
    repo = f"org/toy-{uuid.uuid4().hex[:12]}"
    store = Path(toy_server.store)
    src1 = write_checkpoint_repo(tmp_path / "v1", 1)
    add_folder(store, src1, repo)

    class Toy:
        pass

    t = Toy()
    t.repo, t.store, t.server = repo, store, toy_server
    t.cache, t.tmp = tmp_path / "cache", tmp_path
    t.layout = RepoLayout(t.cache, repo)
    return t


def resolve(t, **kw):
    kw.setdefault("endpoint", t.server.url)
    return hub.resolve(t.repo, cache_dir=t.cache, **kw)


def test_missing_then_local_only_makes_zero_requests(toy):
    first = resolve(toy)
    assert first.state is hub.State.MISSING
    assert {f.path: f.action for f in first.files} == {
        "README.md": hub.Action.DOWNLOADED,
        "config.json": hub.Action.DOWNLOADED,
        "model.safetensors": hub.Action.DOWNLOADED,
    }
    before = requests_at(toy.server)
    assert first.requests == before  # the resolver counts what the server saw
    second = resolve(toy)
    assert second.state is hub.State.LOCAL_ONLY
    assert second.requests == 0 and second.bytes_transferred == 0
    assert requests_at(toy.server) == before
    assert second.path == first.path and second.expires_at is not None
    loaded = load_file(str(second.path / "model.safetensors"))
    assert np.array_equal(loaded["layer.3.weight"], tensors_for(1)["layer.3.weight"])


def test_fresh_costs_one_request_per_repo(toy):
    resolve(toy)
    before = requests_at(toy.server)
    res = resolve(toy, policy=hub.Policy(revalidate=True))
    assert res.state is hub.State.FRESH
    assert res.requests == 1 and requests_at(toy.server) == before + 1
    assert all(f.action is hub.Action.KEPT for f in res.files)


def test_unstamped_default_lifetime(tmp_path, mirror_server_factory):
    store = tmp_path / "store"
    add_folder(store, write_checkpoint_repo(tmp_path / "v1", 1, stamp=False), REPO)
    server = mirror_server_factory(store)
    cache = tmp_path / "cache"
    hub.resolve(REPO, cache_dir=cache, endpoint=server.url)
    again = hub.resolve(REPO, cache_dir=cache, endpoint=server.url)
    assert again.state is hub.State.FRESH and again.requests == 1  # lifetime 0: revalidate
    lazy = hub.resolve(
        REPO, cache_dir=cache, endpoint=server.url, policy=hub.Policy(default_lifetime=3600)
    )
    assert lazy.state is hub.State.LOCAL_ONLY and lazy.requests == 0


def test_etag_mismatch_fetches_only_changed_tensor_ranges(toy):
    old = resolve(toy)
    add_folder(toy.store, write_checkpoint_repo(toy.tmp / "v2", 2), toy.repo)
    before = toy.server.log(route="resolve")
    res = resolve(toy, policy=hub.Policy(revalidate=True))
    assert res.state is hub.State.ETAG_MISMATCH
    assert res.commit != old.commit and res.previous_commit == old.commit
    by_path = {f.path: f for f in res.files}
    weights = by_path["model.safetensors"]
    assert weights.action is hub.Action.PATCHED
    changed_bytes = tensors_for(2)["layer.3.weight"].nbytes
    header_room = 128 << 10
    assert weights.bytes_transferred <= 1.05 * changed_bytes + header_room
    assert weights.bytes_reused >= weights.size - weights.bytes_transferred - header_room
    assert by_path["config.json"].action is hub.Action.LINKED  # same blob, new commit
    # The assembled blob is the published file, byte for byte.
    published = toy.tmp / "v2" / "model.safetensors"
    assert sha256(res.path / "model.safetensors") == sha256(published)
    ranged = [e for e in toy.server.log(route="resolve") if e not in before and e.get("range")]
    assert ranged, "the weights were fetched by Range requests"
    # The old snapshot is untouched and still loadable.
    assert sha256(old.path / "model.safetensors") == sha256(toy.tmp / "v1" / "model.safetensors")
    assert toy.layout.read_ref("main") == res.commit


def test_stale_offline_and_strict(tmp_path, mirror_server_factory):
    store = tmp_path / "store"
    add_folder(store, write_checkpoint_repo(tmp_path / "v1", 1, stamp=False), REPO)
    server = mirror_server_factory(store)
    cache = tmp_path / "cache"
    good = hub.resolve(REPO, cache_dir=cache, endpoint=server.url)
    server.stop()
    stale = hub.resolve(REPO, cache_dir=cache, endpoint=server.url)
    assert stale.state is hub.State.STALE_OFFLINE and stale.warnings
    assert stale.path == good.path
    with pytest.raises(hub.PolicyError):
        hub.resolve(REPO, cache_dir=cache, endpoint=server.url, policy=hub.Policy(strict=True))
    with pytest.raises(hub.HubUnreachableError):
        hub.resolve(
            REPO, cache_dir=cache, endpoint=server.url, policy=hub.Policy(stale_if_error=False)
        )


def test_expired_stamp_is_stale_offline(tmp_path):
    """A stamped snapshot past its expiry, offline: served with a warning, strict refuses."""
    from cmh.hub.mirror import add_folder as add

    store = tmp_path / "cache"  # a store is a stock cache: use it as the client cache
    src = write_checkpoint_repo(tmp_path / "v1", 1, stamp=False)
    cmh.stamp(src / "model.safetensors", ttl="1s", now=time.time() - 60)  # expired 59 s ago
    add(store, src, REPO)
    offline = hub.Policy(offline=True)
    res = hub.resolve(REPO, cache_dir=store, policy=offline)
    assert res.state is hub.State.STALE_OFFLINE and res.requests == 0
    with pytest.raises(hub.PolicyError):
        hub.resolve(REPO, cache_dir=store, policy=hub.Policy(offline=True, strict=True))


def test_corrupt_blob_is_detected_and_fetched_again(toy):
    res = resolve(toy)
    blob = (res.path / "model.safetensors").resolve()
    good = sha256(blob)
    with open(blob, "r+b") as f:  # same size, wrong bytes
        f.seek(4000)
        f.write(b"\x00" * 64)
    with pytest.raises(hub.IntegrityError):
        resolve(toy, policy=hub.Policy(offline=True))
    again = resolve(toy)
    assert again.state is hub.State.CORRUPT
    assert {f.path: f.action for f in again.files}["model.safetensors"] is hub.Action.REFETCHED
    assert sha256(blob) == good


def test_offline_without_cache_and_env(toy, monkeypatch):
    with pytest.raises(hub.OfflineError):
        resolve(toy, policy=hub.Policy(offline=True))
    resolve(toy)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = requests_at(toy.server)
    res = resolve(toy, policy=None)
    assert res.state is hub.State.LOCAL_ONLY and requests_at(toy.server) == before


def test_env_endpoint_and_cache(toy, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", toy.server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(toy.cache))
    res = hub.resolve(toy.repo)
    assert res.state is hub.State.MISSING and str(res.path).startswith(str(toy.cache))
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(toy.tmp / "home"))
    res = hub.resolve(toy.repo)
    assert str(res.path).startswith(str(toy.tmp / "home" / "hub"))


def test_errors_are_typed(toy):
    with pytest.raises(hub.NotFoundError) as exc:
        hub.resolve("org/nope", cache_dir=toy.cache, endpoint=toy.server.url)
    assert exc.value.kind == "repo"
    with pytest.raises(hub.NotFoundError) as exc:
        resolve(toy, revision="no-such-branch")
    assert exc.value.kind == "revision"
    with pytest.raises(hub.NotFoundError) as exc:
        resolve(toy, allow_patterns=["nothing-*.bin"])
    assert exc.value.kind == "entry"


def test_allow_patterns_and_pinned_commit(toy):
    res = resolve(toy, allow_patterns=["*.json"])
    assert [f.path for f in res.files] == ["config.json"]
    before = requests_at(toy.server)
    pinned = resolve(toy, revision=res.commit, allow_patterns=["*.json"])
    assert pinned.state is hub.State.LOCAL_ONLY and requests_at(toy.server) == before


def test_stock_cache_round_trip(toy):
    """A snapshot_download cache is read and revalidated; ours is read by the stock client."""
    from huggingface_hub import scan_cache_dir, snapshot_download

    stock_path = snapshot_download(toy.repo, cache_dir=toy.cache, endpoint=toy.server.url)
    res = resolve(toy, policy=hub.Policy(revalidate=True))
    assert res.state is hub.State.FRESH and str(res.path) == stock_path and res.requests == 1
    add_folder(toy.store, write_checkpoint_repo(toy.tmp / "v2", 2), toy.repo)
    new = resolve(toy, policy=hub.Policy(revalidate=True))
    assert new.state is hub.State.ETAG_MISMATCH
    offline = snapshot_download(toy.repo, cache_dir=toy.cache, local_files_only=True)
    assert offline == str(new.path)
    report = scan_cache_dir(toy.cache)
    assert report.warnings == []
    assert {r.commit_hash for r in next(iter(report.repos)).revisions} == {res.commit, new.commit}


def test_orphan_incomplete_is_adopted_and_resumed(toy):
    """A killed stock download's ``{etag}.{id}.incomplete`` becomes our resumable partial."""
    published = (toy.tmp / "v1" / "model.safetensors").read_bytes()
    etag = hashlib.sha256(published).hexdigest()
    toy.layout.blobs.mkdir(parents=True)
    (toy.layout.blobs / f"{etag}.1a2b3c4d.incomplete").write_bytes(published[: len(published) // 2])
    res = resolve(toy)
    by_path = {f.path: f for f in res.files}
    assert by_path["model.safetensors"].action is hub.Action.RESUMED
    assert by_path["model.safetensors"].bytes_transferred == len(published) - len(published) // 2
    assert not list(toy.layout.blobs.glob("*.incomplete"))
    ranges = [e["range"] for e in toy.server.log(route="resolve", repo=toy.repo) if e.get("range")]
    assert ranges == [f"bytes={len(published) // 2}-"]


def test_stale_no_exist_is_cleaned(toy):
    res = resolve(toy)
    stale = toy.layout.no_exist / res.commit / "config.json"
    stale.parent.mkdir(parents=True)
    stale.touch()
    dead = toy.layout.no_exist / ("f" * 40) / "x.json"
    dead.parent.mkdir(parents=True)
    dead.touch()
    resolve(toy, policy=hub.Policy(revalidate=True))
    assert not stale.exists() and not dead.parent.exists()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dropped_connections_are_resumed(toy, seed):
    proxy = FaultProxy(toy.server.url)
    try:
        from resolver_support import Fault

        proxy.faults.append(Fault("drop", times=3, seed=seed))
        res = resolve(toy, endpoint=proxy.url)
        blob = res.path / "model.safetensors"
        assert sha256(blob) == sha256(toy.tmp / "v1" / "model.safetensors")
        ranged = [r for m, p, r in proxy.stats.requests if "model.safetensors" in p and r]
        assert len(ranged) >= 1  # resumed, not restarted
    finally:
        proxy.stop()


def test_truncated_and_wrong_bytes(toy):
    from resolver_support import Fault

    proxy = FaultProxy(toy.server.url)
    try:
        proxy.faults.append(Fault("truncate", times=1, seed=5))
        proxy.faults.append(Fault("corrupt", times=1, seed=6))
        res = resolve(toy, endpoint=proxy.url)
        assert sha256(res.path / "model.safetensors") == sha256(
            toy.tmp / "v1" / "model.safetensors"
        )
    finally:
        proxy.stop()


def test_persistent_wrong_bytes_are_refused(toy):
    from resolver_support import Fault

    resolve(toy)
    old_commit = toy.layout.read_ref("main")
    add_folder(toy.store, write_checkpoint_repo(toy.tmp / "v2", 2), toy.repo)
    proxy = FaultProxy(toy.server.url)
    try:
        proxy.faults.append(Fault("corrupt", times=1000, at=200))
        with pytest.raises(hub.IntegrityError):
            resolve(toy, endpoint=proxy.url, policy=hub.Policy(revalidate=True))
    finally:
        proxy.stop()
    new_etag = sha256(toy.tmp / "v2" / "model.safetensors")
    assert not toy.layout.blob_path(new_etag).exists()
    assert toy.layout.read_ref("main") == old_commit  # readers still see the old snapshot
    old = toy.layout.snapshot_dir(old_commit) / "model.safetensors"
    assert sha256(old) == sha256(toy.tmp / "v1" / "model.safetensors")


def test_patch_survives_faults_on_ranges(toy):
    from resolver_support import Fault

    resolve(toy)
    add_folder(toy.store, write_checkpoint_repo(toy.tmp / "v2", 2), toy.repo)
    proxy = FaultProxy(toy.server.url)
    try:
        proxy.faults.append(Fault("drop", times=2, seed=9))
        res = resolve(toy, endpoint=proxy.url, policy=hub.Policy(revalidate=True))
    finally:
        proxy.stop()
    assert {f.path: f.action for f in res.files}["model.safetensors"] is hub.Action.PATCHED
    assert sha256(res.path / "model.safetensors") == sha256(toy.tmp / "v2" / "model.safetensors")


def test_corrupt_range_falls_back_to_whole_download(toy):
    from resolver_support import Fault

    resolve(toy)
    add_folder(toy.store, write_checkpoint_repo(toy.tmp / "v2", 2), toy.repo)
    proxy = FaultProxy(toy.server.url)
    try:
        # first answer = header prefetch (left intact by at=None? no: damage the 2nd answer)
        proxy.faults.append(Fault("corrupt", times=2, at=10))
        res = resolve(toy, endpoint=proxy.url, policy=hub.Policy(revalidate=True))
    finally:
        proxy.stop()
    assert sha256(res.path / "model.safetensors") == sha256(toy.tmp / "v2" / "model.safetensors")
    assert res.state is hub.State.ETAG_MISMATCH


def test_import_is_light():
    import subprocess
    import sys

    heavy = "('torch', 'transformers', 'httpx2')"
    code = f"import sys, cmh.hub; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_empty_files_are_resolved(tmp_path, mirror_server_factory):
    """A zero-byte file (an empty __init__.py, say) installs without a body request."""
    store = tmp_path / "store"
    src = write_checkpoint_repo(tmp_path / "v1", 1)
    (src / "empty.txt").write_bytes(b"")
    add_folder(store, src, REPO)
    server = mirror_server_factory(store)
    res = hub.resolve(REPO, cache_dir=tmp_path / "cache", endpoint=server.url)
    assert res.state is hub.State.MISSING
    empty = res.path / "empty.txt"
    assert empty.is_symlink() and empty.read_bytes() == b""
    assert {f.path for f in res.files} >= {"empty.txt", "model.safetensors"}


def test_hold_keeps_a_snapshot_from_being_pruned(toy):
    from cmh.hub.prune import PrunePolicy, execute_plan, plan_prune, scan_cache

    def prune_everything() -> None:
        plan = plan_prune(scan_cache(toy.cache), PrunePolicy(max_size=0, include_referenced=True))
        execute_plan(plan, lock_timeout=1)

    with hub.hold(toy.repo, cache_dir=toy.cache, endpoint=toy.server.url) as res:
        prune_everything()
        assert (res.path / "model.safetensors").read_bytes()  # still there, whole
    prune_everything()
    assert not res.path.exists()
