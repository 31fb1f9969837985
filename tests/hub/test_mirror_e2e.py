# ruff: noqa: E501  (the client scripts below are kept one call per line)
"""End to end: the stock huggingface_hub and transformers clients against ``cmh serve``.

Each client runs in a fresh interpreter with ``HF_ENDPOINT`` pointing at the
mirror on 127.0.0.1 (huggingface_hub reads it at import) and an empty cache.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from mirror_support import (
    DATA_REPO,
    MINILM_REPO,
    PRIVATE_REPO,
    PRIVATE_TOKEN,
    STOCK_PRELUDE,
    TINY_REPO,
    MirrorServer,
    MirrorStore,
    hf_env,
    run_python,
)

STOCK_CLIENT_SCRIPT = (
    STOCK_PRELUDE
    + r"""
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError,
)
api = HfApi()
out = {}

def attempt(name, fn):
    try:
        out[name] = {"ok": fn()}
    except Exception as exc:
        out[name] = {"error": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__]}

MINILM, TINY = os.environ["T_MINILM"], os.environ["T_TINY"]
attempt("download_config", lambda: hf_hub_download(MINILM, "config.json"))
attempt("download_weights", lambda: sha256(hf_hub_download(MINILM, "model.safetensors")))
attempt("download_nested", lambda: open(hf_hub_download(TINY, "sub/deeper/leaf.txt")).read())
attempt("download_v1", lambda: open(hf_hub_download(TINY, "sub/deeper/leaf.txt", revision="v1")).read())
attempt("download_empty", lambda: os.path.getsize(hf_hub_download(TINY, "empty.txt")))
attempt("snapshot", lambda: sorted(
    os.path.relpath(os.path.join(d, f), snap) for snap in [snapshot_download(MINILM)]
    for d, _, fs in os.walk(snap) for f in fs))
attempt("snapshot_tiny_v1", lambda: snapshot_download(TINY, revision="v1"))
def info():
    i = api.model_info(MINILM, files_metadata=True)
    return {"sha": i.sha, "id": i.id, "siblings": {s.rfilename: [s.size, s.blob_id,
            s.lfs.sha256 if s.lfs else None] for s in i.siblings}}
attempt("model_info", info)
attempt("model_info_rev", lambda: api.model_info(TINY, revision="v1").sha)
attempt("dataset_info", lambda: sorted(s.rfilename for s in api.dataset_info(os.environ["T_DATA"]).siblings))
attempt("dataset_download", lambda: open(hf_hub_download(os.environ["T_DATA"], "train/part-0.csv", repo_type="dataset")).read())
attempt("tree_recursive", lambda: [[type(e).__name__, e.path, getattr(e, "size", None),
        e.lfs.sha256 if getattr(e, "lfs", None) else None] for e in api.list_repo_tree(TINY, recursive=True)])
attempt("tree_top", lambda: [e.path for e in api.list_repo_tree(TINY)])
attempt("tree_sub", lambda: [e.path for e in api.list_repo_tree(TINY, path_in_repo="sub")])
attempt("paths_info", lambda: [[type(e).__name__, e.path] for e in api.get_paths_info(TINY, ["config.json", "sub", "nope"])])
attempt("missing_file", lambda: hf_hub_download(MINILM, "does-not-exist.json"))
attempt("missing_repo", lambda: hf_hub_download("nobody/nothing", "config.json"))
attempt("missing_revision", lambda: hf_hub_download(MINILM, "config.json", revision="no-such-branch"))
attempt("private_no_token", lambda: hf_hub_download(os.environ["T_PRIVATE"], "config.json", token=False))
attempt("private_bad_token", lambda: hf_hub_download(os.environ["T_PRIVATE"], "config.json", token="hf_wrong_token_000000"))
attempt("private_token", lambda: open(hf_hub_download(os.environ["T_PRIVATE"], "config.json", token=os.environ["T_TOKEN"])).read())
attempt("private_info_no_token", lambda: api.model_info(os.environ["T_PRIVATE"], token=False))
print(json.dumps(out))
"""
)


@pytest.fixture(scope="module")
def stock(mirror: MirrorServer, mirror_store: MirrorStore, tmp_path_factory) -> dict[str, Any]:
    """Run every stock-client call once against the mirror; tests check the results."""
    home = tmp_path_factory.mktemp("hf-home")
    env = hf_env(mirror.url, home)
    env.update(
        T_MINILM=MINILM_REPO,
        T_TINY=TINY_REPO,
        T_DATA=DATA_REPO,
        T_PRIVATE=PRIVATE_REPO,
        T_TOKEN=PRIVATE_TOKEN,
    )
    result: dict[str, Any] = run_python(STOCK_CLIENT_SCRIPT, env)
    result["_cache"] = {"ok": str(home / "hub")}
    return result


def _ok(stock: dict[str, Any], name: str) -> Any:
    assert "ok" in stock[name], stock[name]
    return stock[name]["ok"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_hf_hub_download_gets_the_imported_bytes(stock, minilm_dir: Path, mirror_store) -> None:
    commit = mirror_store.imports[f"{MINILM_REPO}@main"].commit
    path = Path(_ok(stock, "download_config"))
    assert path.read_bytes() == (minilm_dir / "config.json").read_bytes()
    assert path.parent.name == commit  # cached under the commit the mirror reported
    assert _ok(stock, "download_weights") == _sha256(minilm_dir / "model.safetensors")
    assert _ok(stock, "download_nested") == "leaf 2\n"
    assert _ok(stock, "download_v1") == "leaf 1\n"
    assert _ok(stock, "download_empty") == 0


def test_snapshot_download_fetches_every_file(stock, minilm_dir: Path, mirror_store) -> None:
    expected = sorted(
        p.relative_to(minilm_dir).as_posix() for p in minilm_dir.rglob("*") if p.is_file()
    )
    assert _ok(stock, "snapshot") == expected
    v1 = Path(_ok(stock, "snapshot_tiny_v1"))
    assert v1.name == mirror_store.imports[f"{TINY_REPO}@v1"].commit
    src = mirror_store.sources[f"{TINY_REPO}@v1"]
    for p in src.rglob("*"):
        if p.is_file():
            assert (v1 / p.relative_to(src)).read_bytes() == p.read_bytes()


def test_model_info_reports_commit_and_file_ids(stock, minilm_dir: Path, mirror_store) -> None:
    info = _ok(stock, "model_info")
    assert info["id"] == MINILM_REPO
    assert info["sha"] == mirror_store.imports[f"{MINILM_REPO}@main"].commit
    size, _, lfs_sha = info["siblings"]["model.safetensors"]
    assert size == (minilm_dir / "model.safetensors").stat().st_size
    assert lfs_sha == _sha256(minilm_dir / "model.safetensors")
    cfg = (minilm_dir / "config.json").read_bytes()
    git_oid = hashlib.sha1(b"blob %d\0" % len(cfg) + cfg).hexdigest()
    assert info["siblings"]["config.json"][1] == git_oid
    assert _ok(stock, "model_info_rev") == mirror_store.imports[f"{TINY_REPO}@v1"].commit


def test_list_repo_tree_and_paths_info(stock, mirror_store) -> None:
    tree = _ok(stock, "tree_recursive")
    paths = {path: (kind, size, lfs) for kind, path, size, lfs in tree}
    assert paths["sub"][0] == "RepoFolder" and paths["sub/deeper"][0] == "RepoFolder"
    assert paths["sub/deeper/leaf.txt"][:2] == ("RepoFile", len("leaf 2\n"))
    src = mirror_store.sources[f"{TINY_REPO}@main"]
    assert paths["weights.bin"][2] == _sha256(src / "weights.bin")  # LFS by name pattern
    assert paths["config.json"][2] is None
    assert sorted(_ok(stock, "tree_top")) == sorted(
        ["sub", "config.json", "README.md", "weights.bin", "empty.txt"]
    )
    assert sorted(_ok(stock, "tree_sub")) == ["sub/deeper", "sub/notes.txt"]
    assert sorted(_ok(stock, "paths_info")) == [["RepoFile", "config.json"], ["RepoFolder", "sub"]]


def test_datasets_are_served(stock) -> None:
    assert _ok(stock, "dataset_info") == ["README.md", "train/part-0.csv"]
    assert _ok(stock, "dataset_download") == "a,b\n1,2\n"


def test_stock_client_raises_typed_errors(stock) -> None:
    assert stock["missing_file"]["error"] == "RemoteEntryNotFoundError"
    assert "EntryNotFoundError" in stock["missing_file"]["mro"]
    assert stock["missing_repo"]["error"] == "RepositoryNotFoundError"
    assert stock["missing_revision"]["error"] == "RevisionNotFoundError"


def test_private_repo_needs_its_token_and_otherwise_looks_missing(stock) -> None:
    assert stock["private_no_token"]["error"] == "RepositoryNotFoundError"
    assert stock["private_bad_token"]["error"] == "RepositoryNotFoundError"
    assert stock["private_info_no_token"]["error"] == "RepositoryNotFoundError"
    assert json.loads(_ok(stock, "private_token")) == {"secret": True}


def test_requests_are_counted_and_logged(stock, mirror: MirrorServer) -> None:
    entries = mirror.log(route="resolve")
    assert entries and all({"status", "bytes", "duration_ms", "target"} <= set(e) for e in entries)
    assert mirror.count(route="resolve", method="HEAD", status="404") >= 1
    assert mirror.count(route="resolve", method="GET", status="200") >= 10
    assert not [e for e in mirror.log() if e["status"] >= 500]


def test_a_cache_filled_by_the_stock_client_is_served_as_is(
    stock, mirror_server_factory, minilm_dir: Path, tmp_path: Path
) -> None:
    cache = Path(_ok(stock, "_cache"))
    server = mirror_server_factory(cache)
    code = (
        "import json, os; from huggingface_hub import hf_hub_download, HfApi;"
        "p = hf_hub_download(os.environ['T_REPO'], 'model.safetensors');"
        "t = [e.path for e in HfApi().list_repo_tree(os.environ['T_REPO'], recursive=True)];"
        "print(json.dumps([p, sorted(t)]))"
    )
    env = hf_env(server.url, tmp_path / "second-home")
    env["T_REPO"] = MINILM_REPO
    path, tree = run_python(code, env)
    assert _sha256(Path(path)) == _sha256(minilm_dir / "model.safetensors")
    assert "1_Pooling/config.json" in tree and "model.safetensors" in tree


TRANSFORMERS_SCRIPT = r"""
import json, os, torch
from transformers import AutoModel, AutoTokenizer
repo = os.environ["T_MINILM"]
tok = AutoTokenizer.from_pretrained(repo)
model = AutoModel.from_pretrained(repo)
local = AutoModel.from_pretrained(os.environ["T_LOCAL"])
batch = tok(["a mirror served this model"], return_tensors="pt")
with torch.no_grad():
    a = model(**batch).last_hidden_state
    b = local(**batch).last_hidden_state
same = all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), local.state_dict().values()))
print(json.dumps({"model": type(model).__name__, "tokens": batch["input_ids"][0].tolist(),
                  "same_weights": same, "same_output": bool(torch.equal(a, b))}))
"""


@pytest.mark.slow
@pytest.mark.heavy
def test_transformers_from_pretrained_through_the_mirror(
    mirror: MirrorServer, minilm_dir: Path, tmp_path: Path
) -> None:
    before = mirror.count(route="resolve", method="GET")
    env = hf_env(mirror.url, tmp_path / "hf-home")
    env.update(T_MINILM=MINILM_REPO, T_LOCAL=str(minilm_dir))
    result = run_python(TRANSFORMERS_SCRIPT, env)
    assert result["model"] == "BertModel"
    assert result["tokens"][0] == 101 and result["tokens"][-1] == 102  # [CLS] ... [SEP]
    assert result["same_weights"] and result["same_output"]
    assert mirror.count(route="resolve", method="GET") > before  # it really came from the mirror
