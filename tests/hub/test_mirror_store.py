"""Store import (ids as git and the Hub compute them), listing, and scrub with quarantine."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cmh.hub.cache import RepoLayout
from cmh.hub.mirror._gitobjects import lfs_pointer_oid
from cmh.hub.mirror._index import build_index
from cmh.hub.mirror.stores.local._folder import StoreError, add_folder, list_store, scan_folder
from cmh.hub.mirror.stores.local._scrub import QUARANTINE, scrub_store
from mirror_support import ManualClock, write_tiny_repo

REPO = "org/tiny"


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_ids_match_git_and_the_hub_conventions(tmp_path: Path, tiny_src: Path) -> None:
    store = tmp_path / "store"
    result = add_folder(store, tiny_src, REPO)
    index = build_index(RepoLayout(store, REPO), result.commit)
    # small files: git blob id; LFS files: SHA-256 name, pointer's git id in listings
    cfg = (tiny_src / "config.json").read_bytes()
    assert index.files["config.json"].etag == _git(tiny_src, "hash-object", "config.json")
    weights = (tiny_src / "weights.bin").read_bytes()
    sha = hashlib.sha256(weights).hexdigest()
    assert index.files["weights.bin"].etag == sha
    assert index.files["weights.bin"].oid == lfs_pointer_oid(sha, len(weights))
    # the root tree id equals git's for the same tree (LFS file stored as its pointer)
    repo = tmp_path / "git"
    subprocess.run(["cp", "-r", str(tiny_src), str(repo)], check=True)
    (repo / "weights.bin").write_text(
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(weights)}\n"
    )
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    assert index.tree == _git(repo, "write-tree")
    assert index.dir_oids["sub"] == _git(repo, "rev-parse", f"{index.tree}:sub")
    assert len(cfg) == index.files["config.json"].size


def test_reimport_unchanged_creates_nothing_and_change_makes_a_child(
    tmp_path: Path, tiny_src: Path
) -> None:
    store = tmp_path / "store"
    first = add_folder(store, tiny_src, REPO)
    assert first.created and first.parent is None and first.new_blobs == 6
    snapshot_count = len(list((store / "models--org--tiny" / "snapshots").iterdir()))
    again = add_folder(store, tiny_src, REPO)
    assert (again.commit, again.created, again.new_blobs) == (first.commit, False, 0)
    assert len(list((store / "models--org--tiny" / "snapshots").iterdir())) == snapshot_count
    (tiny_src / "config.json").write_text('{"changed": true}\n')
    second = add_folder(store, tiny_src, REPO)
    assert second.created and second.parent == first.commit and second.new_blobs == 1
    assert RepoLayout(store, REPO).read_ref("main") == second.commit
    # same content, another repo: same commit id (derived from tree and parent only)
    (tiny_src / "config.json").write_text('{"model_type": "tiny", "version": 1}\n')
    other = add_folder(tmp_path / "store2", tiny_src, REPO)
    assert other.commit == first.commit


def test_a_commit_another_revision_wrote_keeps_its_record(tmp_path: Path) -> None:
    """Two refs reaching the same tree on the same parent share one commit: the second
    import moves its ref only, and the commit's record (its created_at) stays the first."""
    store, clock = tmp_path / "store", ManualClock()
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, text in ((a, "a"), (b, "b")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    add_folder(store, a, REPO, clock=clock)
    add_folder(store, b, REPO, clock=clock)
    tag = add_folder(store, a, REPO, revision="tag1", clock=clock)
    assert tag.created
    record = RepoLayout(store, REPO).path / ".cmh" / "commits" / f"{tag.commit}.json"
    written = record.read_bytes()
    clock.advance(3600)
    again = add_folder(store, a, REPO, clock=clock)
    assert again.commit == tag.commit and again.ref_moved
    assert not again.created and again.parent == tag.parent
    assert record.read_bytes() == written
    assert RepoLayout(store, REPO).read_ref("main") == tag.commit


def test_store_is_a_stock_cache(tmp_path: Path, tiny_src: Path) -> None:
    store = tmp_path / "store"
    result = add_folder(store, tiny_src, REPO)
    code = (
        "import json, sys; from huggingface_hub import scan_cache_dir, hf_hub_download;"
        "info = scan_cache_dir(sys.argv[1]); r = list(info.repos)[0];"
        "p = hf_hub_download('org/tiny', 'sub/deeper/leaf.txt', cache_dir=sys.argv[1]);"
        "print(json.dumps([r.repo_id, sorted(x.commit_hash for x in r.revisions), open(p).read()]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(store)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [REPO, [result.commit], "leaf 1\n"]


def test_bad_sources_are_refused(tmp_path: Path, tiny_src: Path) -> None:
    store = tmp_path / "store"
    with pytest.raises(StoreError, match="invalid repo id"):
        add_folder(store, tiny_src, "../evil")
    with pytest.raises(StoreError, match="is a commit id"):
        add_folder(store, tiny_src, REPO, revision="a" * 40)
    with pytest.raises(StoreError, match="no file"):
        (tmp_path / "empty").mkdir()
        add_folder(store, tmp_path / "empty", REPO)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.symlink(outside, tiny_src / "leak.txt")
    with pytest.raises(StoreError, match="outside the folder"):
        add_folder(store, tiny_src, REPO)
    assert not (store / "models--org--tiny").exists()  # nothing partial was written


def test_a_cache_snapshot_is_read_through_its_links_within_the_repo_folder(
    tmp_path: Path,
) -> None:
    """What a bucket sync imports: a snapshot whose files link into ``../../blobs``; a
    link may leave the snapshot for the repo folder named, never the repo folder."""
    repo = tmp_path / "cache" / "models--org--tiny"
    snap = repo / "snapshots" / ("c" * 40)
    (repo / "blobs").mkdir(parents=True)
    (snap / "sub").mkdir(parents=True)
    (repo / "blobs" / "b1").write_text("one")
    (repo / "blobs" / "b2").write_text("two")
    (snap / "a.txt").symlink_to("../../blobs/b1")
    (snap / "sub" / "b.txt").symlink_to("../../../blobs/b2")
    with pytest.raises(StoreError, match="outside the folder"):
        scan_folder(snap)  # the default: links stay within the folder imported
    found = scan_folder(snap, links_within=repo)
    blobs = repo.resolve() / "blobs"
    assert found == [("a.txt", blobs / "b1"), ("sub/b.txt", blobs / "b2")]
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    (snap / "leak.txt").symlink_to(outside)
    with pytest.raises(StoreError, match="outside the folder"):
        scan_folder(snap, links_within=repo)


def test_list_store(tmp_path: Path, tiny_src: Path) -> None:
    store = tmp_path / "store"
    add_folder(store, tiny_src, REPO, revision="v1")
    add_folder(store, tiny_src, "org/data", repo_type="dataset")
    repos = {(r.repo_type, r.repo_id): r for r in list_store(store)}
    assert set(repos) == {("model", REPO), ("dataset", "org/data")}
    assert [ref.name for ref in repos["model", REPO].refs] == ["v1"]
    assert repos["model", REPO].refs[0].files == 6


def test_scrub_reports_entries_whose_blob_is_gone_as_a_bucket_scrub_does(
    tmp_path: Path, tiny_src: Path
) -> None:
    """A snapshot entry whose blob is absent, a symlink, or of another size than recorded
    is reported (``(blob E missing)``, the bucket scrub's words); a clean store has none."""
    store = tmp_path / "store"
    result = add_folder(store, tiny_src, REPO)
    assert scrub_store(store).broken_links == []
    index = build_index(RepoLayout(store, REPO), result.commit)
    gone, linked = index.files["config.json"], index.files["weights.bin"]
    gone.source.unlink()
    linked.source.unlink()
    linked.source.symlink_to(gone.etag)
    report = scrub_store(store, do_quarantine=False)
    label = f"{REPO}@{result.commit}"
    assert report.broken_links == [
        f"{label}:config.json (blob {gone.etag} missing)",
        f"{label}:weights.bin (blob {linked.etag} missing)",
    ]
    assert report.to_dict()["ok"]  # nothing bad was read: the blobs are not there


def test_scrub_quarantines_a_corrupt_stamped_blob_and_names_the_tensor(
    tmp_path: Path, make_file
) -> None:
    import cmh

    src = tmp_path / "src"
    src.mkdir()
    weights = make_file("src/model.safetensors", seed=3)
    cmh.stamp(weights, ttl="30d")
    (src / "config.json").write_text("{}\n")
    store = tmp_path / "store"
    result = add_folder(store, src, REPO)
    repo = RepoLayout(store, REPO)
    clean = scrub_store(store)
    assert not clean.bad and {c.method for c in clean.checks} == {"tensors", "sha1"}
    index = build_index(repo, result.commit)
    blob = repo.blobs / index.files["model.safetensors"].etag
    header = cmh.read_header(blob)
    victim = max(header.tensors, key=lambda t: t.nbytes)
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:
        f.seek(header.data_start + victim.begin)
        byte = f.read(1)
        f.seek(header.data_start + victim.begin)
        f.write(bytes([byte[0] ^ 0xFF]))
    small = repo.blobs / index.files["config.json"].etag
    os.chmod(small, 0o644)
    small.write_text("{}\n ")  # same name, other bytes
    report = scrub_store(store)
    bad = {c.blob: c for c in report.bad}
    assert set(bad) == {blob.name, small.name}
    assert bad[blob.name].bad_tensors == (victim.name,)
    assert not blob.exists() and not small.exists()
    assert len(list((store / QUARANTINE).rglob("*.json"))) == 2
    assert not scrub_store(store).bad
    # a re-import puts good bytes back under the same names
    add_folder(store, src, REPO, revision="fixed")
    assert blob.exists() and small.exists() and not scrub_store(store, full=True).bad


def test_import_replaces_a_corrupt_existing_blob(tmp_path: Path) -> None:
    src = write_tiny_repo(tmp_path / "src", 1)
    store = tmp_path / "store"
    result = add_folder(store, src, REPO)
    repo = RepoLayout(store, REPO)
    entry = build_index(repo, result.commit).files["weights.bin"]
    os.chmod(entry.source, 0o644)
    entry.source.write_bytes(b"\0" * entry.size)  # right size, wrong bytes
    (src / "README.md").write_text("changed\n")
    second = add_folder(store, src, REPO)
    assert second.new_blobs == 2  # the new README and the repaired weights
    assert hashlib.sha256(entry.source.read_bytes()).hexdigest() == entry.etag


def test_a_ref_is_read_only_from_a_small_regular_file_inside_refs(
    tmp_path: Path, tiny_src: Path
) -> None:
    """A ref that is a symlink (or lies below a linked folder), a FIFO, or a file over the
    bound is unreadable: the revision does not resolve. Nothing blocks, nothing is read
    past the bound (a ref linked to a large file outside the store was read whole)."""
    import threading

    from mirror_support import MirrorServer

    store = tmp_path / "store"
    commit = add_folder(store, tiny_src, REPO).commit
    repo = RepoLayout(store, REPO)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "ref").write_text(commit)
    (repo.refs / "linked").symlink_to(outside / "ref")
    (repo.refs / "big").write_text(commit + " " * 8192)
    os.mkfifo(repo.refs / "fifo")
    (outside / "pr").mkdir()
    (outside / "pr" / "1").write_text(commit)
    (repo.refs / "refs").mkdir()
    (repo.refs / "refs" / "pr").symlink_to(outside / "pr")
    (repo.refs / "plain").write_text(commit + "\n")
    got: dict[str, str | None] = {}

    def read_all() -> None:
        for name in ("linked", "big", "fifo", "refs/pr/1", "plain"):
            got[name] = repo.read_ref(name)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    reader.join(30)  # a FIFO opened for reading blocked here for ever
    assert not reader.is_alive(), f"read_ref blocked after {sorted(got)}"
    assert got == {"linked": None, "big": None, "fifo": None, "refs/pr/1": None, "plain": commit}
    assert repo.refs_by_name() == {"main": commit, "plain": commit}
    with MirrorServer(store, tmp_path / "logs") as server:
        for name, status in (("linked", 404), ("fifo", 404), ("plain", 200)):
            conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
            try:
                conn.request("GET", f"/api/models/{REPO}/revision/{name}")
                assert conn.getresponse().status == status, name
            finally:
                conn.close()


@pytest.mark.parametrize("name", ["a\tb.txt", "sub/x\x7f.bin", "new\nline", "\x1f", "nul\x00"])
def test_a_repo_path_holds_no_control_character(name: str) -> None:
    from cmh.hub.cache import LayoutError, validate_relpath

    with pytest.raises(LayoutError, match=r"control character \(U\+00[0-7][0-9A-F]\)"):
        validate_relpath(name)
    assert validate_relpath("sub/é ü.txt") == "sub/é ü.txt"
