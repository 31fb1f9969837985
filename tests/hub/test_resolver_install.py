"""install(): unchanged transformers code downloads through the resolver (real MiniLM)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from mirror_support import MINILM_REPO, hf_env, run_python

LOADS = """
import json, os, urllib.request
{prelude}
from transformers import AutoModel, AutoTokenizer
import torch

def load():
    tok = AutoTokenizer.from_pretrained({repo!r})
    model = AutoModel.from_pretrained({repo!r})
    with torch.no_grad():
        out = model(**tok(["cheap fresh weights"], return_tensors="pt")).last_hidden_state
    return float(out.sum())

def mark(name):
    urllib.request.urlopen(os.environ["HF_ENDPOINT"] + "/health?sync=" + name).read()

results = []
for i in range({loads}):
    mark("load-" + str(i))
    {between}
    results.append(load())
mark("done")
print(json.dumps(results))
"""

INSTALL = "import cmh.hub as hub, cmh.hub.resolver._patch as patch; assert hub.install()"
NEW_PROCESS = "patch._recent.clear()  # as in a new process: no revalidation window"


def _phases(server, count: int, targets: bool = False) -> list[list[str]]:
    """Requests between the ``load-i`` markers of the last run (with their targets)."""
    entries = [e for e in server.log() if e["route"] != "metrics"]
    start = max(i for i, e in enumerate(entries) if "sync=load-0" in (e.get("target") or ""))
    phases: list[list[str]] = [[] for _ in range(count)]
    current = -1
    chunked: set[tuple[int, str]] = set()  # (phase, target) fetched as ranged chunks
    for e in entries[start:]:
        target = e.get("target") or ""
        if "sync=load-" in target:
            current = int(target.rsplit("-", 1)[1])
        elif "sync=done" in target:
            break
        elif e["route"] != "health":
            if e.get("range") and e["method"] == "GET":
                # A large file comes as parallel chunks: one logical GET of the file.
                if (current, target) in chunked:
                    continue
                chunked.add((current, target))
            what = f"{e['method']} {e['route']}"
            phases[current].append(f"{what} {target}" if targets else what)
    return phases


@pytest.mark.slow
@pytest.mark.heavy
def test_from_pretrained_through_install(mirror, tmp_path):
    stock_env = hf_env(mirror.url, tmp_path / "stock-home")
    ours_env = hf_env(mirror.url, tmp_path / "ours-home")
    stock = run_python(LOADS.format(prelude="", repo=MINILM_REPO, loads=2, between=""), stock_env)
    stock_cold, stock_warm = _phases(mirror, 2)
    ours = run_python(
        LOADS.format(prelude=INSTALL, repo=MINILM_REPO, loads=2, between=NEW_PROCESS), ours_env
    )
    ours_cold, ours_warm = _phases(mirror, 2)
    cold_targets = _phases(mirror, 2, targets=True)[0]
    assert ours == stock and stock[0] == stock[1]
    # The resolver made the downloads: no HEAD of a file the repo holds, each file fetched
    # by one GET. A file the listing lacks is the Hub's to declare missing (issue 36): one
    # HEAD each, as stock asks, answered 404.

    def file_of(request: str) -> str:  # the path after /resolve/{revision}/
        return request.split(" ", 2)[2].split("?")[0].split("/resolve/", 1)[1].split("/", 1)[1]

    got = {file_of(r) for r in cold_targets if r.startswith("GET resolve")}
    heads = [file_of(r) for r in cold_targets if r.startswith("HEAD resolve")]
    assert len(heads) == len(set(heads)) and not set(heads) & got, (heads, got)
    assert ours_cold.count("HEAD resolve") < stock_cold.count("HEAD resolve")
    assert ours_cold.count("GET resolve") <= stock_cold.count("GET resolve")
    # Warm: transformers 5 resolves the branch itself (repo_info) and lists chat
    # templates (tree); no file is asked for again, and never more than stock.
    assert [r for r in ours_warm if r.endswith(" resolve")] == []
    assert len(ours_warm) <= len(stock_warm), (ours_warm, stock_warm)
    # Cold: one GET per file, no HEAD per file.
    assert len(ours_cold) < len(stock_cold), (ours_cold, stock_cold)
    # Drop-in: the stock client, offline, loads the same model from our cache.
    offline = run_python(
        LOADS.format(prelude="", repo=MINILM_REPO, loads=1, between=""),
        dict(ours_env, HF_HUB_OFFLINE="1"),
    )
    assert offline == stock[:1]


def test_install_uninstall_and_fail_safe(monkeypatch):
    import cmh.hub as hub
    import huggingface_hub
    from huggingface_hub import _snapshot_download, file_download

    original = file_download.hf_hub_download
    assert hub.install()
    try:
        assert file_download.hf_hub_download is not original
        assert huggingface_hub.hf_hub_download is file_download.hf_hub_download
        assert _snapshot_download.hf_hub_download is file_download.hf_hub_download
    finally:
        hub.uninstall()
    assert file_download.hf_hub_download is original
    assert huggingface_hub.hf_hub_download is original

    def changed(repo_id, filename):  # a future signature without the arguments we read
        return None

    monkeypatch.setattr(file_download, "hf_hub_download", changed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hub.install()
    try:
        assert file_download.hf_hub_download is changed  # left alone
        assert any("left unpatched" in str(w.message) for w in caught)
    finally:
        hub.uninstall()


def test_branch_revalidation_is_one_request_per_repo(tmp_path, mirror_server_factory):
    """Stock ``hf_hub_download(revision="main")`` HEADs every file; installed, one request."""
    import cmh.hub as hub
    import cmh.hub.resolver._patch as hub_patch
    from cmh.hub.mirror import add_folder
    from huggingface_hub import file_download
    from resolver_support import write_checkpoint_repo

    store = tmp_path / "store"
    add_folder(store, write_checkpoint_repo(tmp_path / "v1", 1, stamp=False), "org/toy")
    server = mirror_server_factory(store)
    names = ["config.json", "README.md", "model.safetensors"]

    def fetch_all(cache):
        mark = len(server.log())
        paths = [
            file_download.hf_hub_download("org/toy", n, cache_dir=cache, endpoint=server.url)
            for n in names
        ]
        return paths, [
            f"{e['method']} {e['route']}"
            for e in server.log()[mark:]
            if e["route"] not in ("health", "metrics")
        ]

    fetch_all(tmp_path / "stock")
    _, stock_warm = fetch_all(tmp_path / "stock")
    assert stock_warm.count("HEAD resolve") == len(names)
    hub.install()
    try:
        fetch_all(tmp_path / "ours")
        hub_patch._recent.clear()  # a new process: nothing remembered
        paths, ours_warm = fetch_all(tmp_path / "ours")
    finally:
        hub.uninstall()
    assert ours_warm == ["GET repo_info"]
    assert [Path(p).read_bytes() for p in paths] == [
        (tmp_path / "v1" / n).read_bytes() for n in names
    ]
