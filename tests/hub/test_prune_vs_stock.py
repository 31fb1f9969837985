"""``cmh prune`` against the stock ``hf cache prune`` on the same cache (docs/prune.md).

The cache is filled by the stock client from a real ``cmh serve`` on 127.0.0.1:
revision v1, then ``main`` before and after the mirror moved it (so the first
``main`` commit becomes unreferenced), then the leftovers a cache collects: a
killed download, a fresh download in flight, an orphan blob, a repo whose only
ref dangles. Each pruner runs on its own copy; the test states what each removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cmh.hub.cache import RepoLayout
from cmh.hub.mirror import add_folder
from mirror_support import write_tiny_repo
from prune_support import (
    DAY,
    NOW,
    CacheBuilder,
    fake_commit,
    stock_revisions,
    stock_warnings,
    tree_state,
)

REPO = "org/tiny"
HF = Path(sys.executable).parent / "hf"


def fill_cache(tmp_path: Path, start_server) -> tuple[Path, dict[str, str]]:
    from huggingface_hub import snapshot_download

    store = tmp_path / "store"
    v1 = add_folder(store, write_tiny_repo(tmp_path / "v1", 1), REPO, revision="v1").commit
    main1 = add_folder(store, write_tiny_repo(tmp_path / "m1", 2), REPO).commit
    server = start_server(store)
    cache = tmp_path / "cache"
    for revision in ("v1", "main"):
        snapshot_download(REPO, revision=revision, cache_dir=cache, endpoint=server.url)
    main2 = add_folder(store, write_tiny_repo(tmp_path / "m2", 3), REPO).commit
    snapshot_download(REPO, revision="main", cache_dir=cache, endpoint=server.url)
    server.stop()

    b = CacheBuilder(cache)
    folder = "models--org--tiny"
    b.file(f"{folder}/blobs/{'a' * 64}", b"orphan: no snapshot links here", mtime=NOW - 2 * DAY)
    b.file(f"{folder}/blobs/{'b' * 64}.1f2e.incomplete", b"killed download", mtime=NOW - 2 * DAY)
    b.file(f"{folder}/blobs/{'c' * 64}.3d4c.incomplete", b"download in flight", mtime=NOW - 5)
    b.ref("org/gone", "main", fake_commit("never fetched"), mtime=NOW - 2 * DAY)
    os.utime(cache / "models--org--gone", (NOW - 2 * DAY, NOW - 2 * DAY))
    return cache, {"v1": v1, "main1": main1, "main2": main2}


def removed(before: dict, root: Path) -> set[str]:
    return {p for p in before if not (root / p).exists() and not (root / p).is_symlink()}


def top(paths: set[str]) -> set[str]:
    """Paths shortened to what was removed as a whole (a removed folder hides its content)."""
    return {p for p in paths if not any(p.startswith(q + "/") for q in paths)}


def test_what_each_pruner_removes(tmp_path: Path, mirror_server_factory) -> None:
    cache, commits = fill_cache(tmp_path, mirror_server_factory)
    assert stock_revisions(cache) == {REPO: set(commits.values())}
    warnings = stock_warnings(cache)
    assert len(warnings) == 1 and "models--org--gone" in warnings[0]
    before = tree_state(cache)
    stock, ours = tmp_path / "stock", tmp_path / "ours"
    shutil.copytree(cache, stock, symlinks=True)
    shutil.copytree(cache, ours, symlinks=True)

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1"}
    run = subprocess.run(
        [str(HF), "cache", "prune", "--cache-dir", str(stock), "--yes", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "prune", "--cache-dir", str(ours),
         "--unreferenced", "--yes", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)

    folder = "models--org--tiny"
    main1 = commits["main1"]
    gone_stock = top(removed(before, stock))
    gone_ours = top(removed(before, ours))
    # Both: the revision no ref names any more, its blobs, and the killed download.
    common = {
        f"{folder}/snapshots/{main1}",
        f"{folder}/blobs/{'b' * 64}.1f2e.incomplete",
    }
    assert common <= gone_stock and common <= gone_ours
    # Only the stock command: a download still in flight (it removes every *.incomplete).
    assert f"{folder}/blobs/{'c' * 64}.3d4c.incomplete" in gone_stock - gone_ours
    # Only cmh: the orphan blob, the cached tree listing of the removed commit, the
    # repo whose ref dangles (the stock scanner skips it), and the lock files.
    only_ours = gone_ours - gone_stock
    assert f"{folder}/blobs/{'a' * 64}" in only_ours
    assert f"{folder}/trees/{main1}.json" in before  # written by snapshot_download
    assert f"{folder}/trees/{main1}.json" in only_ours
    stale_locks = {p for p in only_ours if p.startswith(f".locks/{folder}/")}
    assert stale_locks and all(p.endswith(".lock") for p in stale_locks)
    assert "models--org--gone" in only_ours
    # The half-broken repo is still there for the stock command.
    assert stock_warnings(stock) == [w.replace(str(cache), str(stock)) for w in warnings]
    assert stock_warnings(ours) == []
    assert (
        stock_revisions(stock) == stock_revisions(ours) == {REPO: {commits["v1"], commits["main2"]}}
    )
    by_repo = {r["repo_id"]: r for r in doc["repos"]}
    assert [r["commit"] for r in by_repo[REPO]["revisions"]] == [main1]
    assert by_repo["org/gone"]["remove_repo"] is True
    # Blobs main1 shared with the kept revisions stay in both.
    layout = RepoLayout(ours, REPO)
    for commit in (commits["v1"], commits["main2"]):
        for f in layout.snapshot_files(commit).values():
            assert f.resolve().is_file()
    print("stock removed:", sorted(gone_stock))
    print("cmh removed:", sorted(gone_ours))
