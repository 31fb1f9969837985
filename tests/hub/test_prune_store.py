"""``cmh prune --store`` on a mirror store built by ``cmh.hub.mirror.add_folder``: commits
are ordered by the store's own creation records, and the store still serves what is
left (the mirror's listing and the stock client through ``cmh serve``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli_support import run_runner
from cmh.hub.cache import RepoLayout
from cmh.hub.mirror import add_folder, list_store
from mirror_support import write_tiny_repo
from prune_support import stock_warnings

REPO = "org/tiny"


def test_keep_latest_on_a_store_uses_commit_records(tmp_path: Path, mirror_server_factory) -> None:
    from huggingface_hub import hf_hub_download

    store = tmp_path / "store"
    commits = []
    for version in (1, 2, 3):
        src = write_tiny_repo(tmp_path / f"v{version}", version)
        commits.append(add_folder(store, src, REPO).commit)
    layout = RepoLayout(store, REPO)
    # File times say the opposite of the commit records: the first commit looks newest.
    now = os.stat(layout.snapshot_dir(commits[0])).st_mtime
    for hours, commit in enumerate(commits):
        t = now - 3600 * hours
        os.utime(layout.snapshot_dir(commit), (t, t))
    os.utime(layout.ref_path("main"), (now - 7200, now - 7200))

    doc = run_runner(["prune", "--store", store, "--keep-latest", "1", "--yes", "--json"]).json()
    [repo] = doc["repos"]
    assert sorted(r["commit"] for r in repo["revisions"]) == sorted(commits[:2])
    assert {r["commit"]: r["reasons"] for r in repo["revisions"]} == {
        c: ["beyond-keep-latest"] for c in commits[:2]
    }
    assert layout.commits() == [commits[2]]
    assert not (layout.cmh_dir / "commits" / f"{commits[0]}.json").exists()
    assert not (layout.trees / f"{commits[0]}.json").exists()
    meta = json.loads((layout.cmh_dir / "commits" / f"{commits[2]}.json").read_text())
    assert meta["parents"] == [commits[1]]  # history kept as written; the parent is gone

    [summary] = list_store(store)
    assert [(r.name, r.commit) for r in summary.refs] == [("main", commits[2])]
    assert stock_warnings(store) == []
    server = mirror_server_factory(store)
    path = hf_hub_download(REPO, "weights.bin", cache_dir=tmp_path / "cache", endpoint=server.url)
    assert Path(path).read_bytes() == (tmp_path / "v3" / "weights.bin").read_bytes()


def test_a_revision_the_mirror_just_read_is_kept(tmp_path: Path, mirror_server_factory) -> None:
    """Was: pruning a blob while ``cmh serve`` sent it cut the body short ("blob changed"):
    the mirror takes no lock while it sends. It records every read (``.cmh/used/``), and
    a store's prune keeps a revision read within the in-flight grace, with a note."""
    import urllib.request

    store = tmp_path / "store"
    old = add_folder(store, write_tiny_repo(tmp_path / "v1", 1), REPO).commit
    add_folder(store, write_tiny_repo(tmp_path / "v2", 2), REPO)  # main moves: v1 unreferenced
    server = mirror_server_factory(store)
    with urllib.request.urlopen(f"{server.url}/{REPO}/resolve/{old}/weights.bin") as answer:
        answer.read()
    assert (RepoLayout(store, REPO).cmh_dir / "used" / old).exists()
    run = run_runner(["prune", "--store", store, "--unreferenced", "--yes"])
    assert run.exit_code == 0, run.stderr
    assert f"revision {old[:12]} was read within the last 10 minutes" in run.stdout
    assert old in RepoLayout(store, REPO).commits()
