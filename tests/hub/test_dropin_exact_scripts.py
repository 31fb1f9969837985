"""Drop-in exactness, part two (issue 26), whole scripts: what a stock client's
transformers and sentence-transformers scripts see under ``install()``: every cache
folder a caller names, and the answers a ``cmh pull`` had kept for the first process.
(The other items: ``test_dropin_exact.py``; the two files let ``--dist loadfile`` run
their interpreters of transformers on two workers.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mirror_support import MirrorServer, hf_env, run_python

# -- item 1: every cache folder a user can name -----------------------------------------------

MOVED_REPO = "org/moved"

CACHE_DIR_SCRIPT = r"""
import json, os, sys
import cmh.hub
assert cmh.hub.install()
from huggingface_hub import constants, hf_hub_download, snapshot_download
repo, base = os.environ["T_REPO"], os.environ["T_BASE"]
out = {}
def commits(folder):
    snaps = os.path.join(folder, "models--" + repo.replace("/", "--"), "snapshots")
    return sorted(os.listdir(snaps)) if os.path.isdir(snaps) else []
from transformers import AutoConfig, AutoModel
from sentence_transformers import SentenceTransformer
AutoConfig.from_pretrained(repo, cache_dir=base + "/config")
out["AutoConfig"] = commits(base + "/config")
AutoModel.from_pretrained(repo, cache_dir=base + "/model")
out["AutoModel"] = commits(base + "/model")
SentenceTransformer(repo, cache_folder=base + "/st", device="cpu")
out["SentenceTransformer"] = commits(base + "/st")
hf_hub_download(repo, "config.json", cache_dir=base + "/hf")
out["hf_hub_download"] = commits(base + "/hf")
snapshot_download(repo, cache_dir=base + "/snap")
out["snapshot_download"] = commits(base + "/snap")
# Set after import: the stock client keeps the folder it computed at import (constants).
os.environ["HF_HUB_CACHE"] = base + "/late"
path = hf_hub_download(repo, "config.json")
out["late_env"] = [path.startswith(constants.HF_HUB_CACHE + os.sep), commits(base + "/late")]
print(json.dumps(out))
"""


def _moved_repo(tmp_path: Path, minilm_dir: Path, factory: Callable[..., MirrorServer]) -> Any:
    """A stamped MiniLM at v1 fresh in the default cache, then ``main`` moved to v2."""
    import shutil

    from cmh.hub.mirror import add_folder

    import cmh

    versions = []
    for n in (1, 2):
        src = tmp_path / f"v{n}"
        shutil.copytree(minilm_dir, src)
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "cmh_version": n}, indent=2))
        cmh.stamp(src / "model.safetensors", ttl="30d")
        versions.append(src)
    store = tmp_path / "store"
    v1 = add_folder(store, versions[0], MOVED_REPO).commit
    server = factory(store)
    env = hf_env(server.url, tmp_path / "home")
    warm = "import cmh.hub, json; cmh.hub.install(); import huggingface_hub as h; "
    run_python(warm + f"h.snapshot_download({MOVED_REPO!r}); print(json.dumps(1))", env)
    v2 = add_folder(store, versions[1], MOVED_REPO).commit
    return server, env, v1, v2


@pytest.mark.slow
def test_a_named_cache_folder_has_its_own_freshness(
    tmp_path: Path, minilm_dir: Path, mirror_server_factory: Callable[..., MirrorServer]
) -> None:
    """v1 fresh in the default cache, ``main`` at v2: every other folder gets v2, as stock does."""
    _server, env, v1, v2 = _moved_repo(tmp_path, minilm_dir, mirror_server_factory)
    env = dict(env, T_REPO=MOVED_REPO, T_BASE=str(tmp_path / "named"))
    got = run_python(CACHE_DIR_SCRIPT, env)

    for row in ("AutoConfig", "AutoModel", "SentenceTransformer", "hf_hub_download"):
        assert got[row] == [v2], (row, got[row], v1, v2)
    assert got["snapshot_download"] == [v2]
    # The default cache is fresh at v1 and the folder named after import is not used.
    assert got["late_env"] == [True, []]


# -- item 5, second half: the answers a resolve had are kept for install() ---------------------

AFTER_PULL_SCRIPT = r"""
import json, os
import cmh.hub
assert cmh.hub.install()
from transformers import AutoConfig, AutoModel, AutoTokenizer
from sentence_transformers import SentenceTransformer
from huggingface_hub import snapshot_download
repo = os.environ["T_REPO"]
AutoConfig.from_pretrained(repo)
AutoTokenizer.from_pretrained(repo)
AutoModel.from_pretrained(repo)
SentenceTransformer(repo, device="cpu")
snapshot_download(repo)
print(json.dumps(1))
"""


@pytest.mark.slow
def test_the_first_install_use_after_cmh_pull_asks_nothing(
    tmp_path: Path, minilm_dir: Path, mirror_server_factory: Callable[..., MirrorServer]
) -> None:
    """A fresh stamped snapshot brought in by ``cmh pull``: the repo info answer the pull
    had is kept, so the first ``install()`` process of transformers, sentence-transformers
    and ``snapshot_download`` does not ask it again (it did before)."""
    import shutil
    import subprocess
    import sys

    from cmh.hub.mirror import add_folder

    import cmh

    src = tmp_path / "src"
    shutil.copytree(minilm_dir, src)
    cmh.stamp(src / "model.safetensors", ttl="30d")
    add_folder(tmp_path / "store", src, "org/minilm-stamped")
    server = mirror_server_factory(tmp_path / "store")
    env = dict(hf_env(server.url, tmp_path / "home"), AI_AGENT="1", T_REPO="org/minilm-stamped")
    # cmh pull counts HF_HUB_ETAG_TIMEOUT from its process's start, imports included: at a
    # load of 20 the imports alone took 10 s, and the pull gave up on an answering mirror
    pulled = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "pull", "org/minilm-stamped"],
        env={**env, "HF_HUB_ETAG_TIMEOUT": "60"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    server.sync()
    mark = len(server.log())
    run_python(AFTER_PULL_SCRIPT, env)
    server.sync()
    seen = [
        f"{e['method']} {e.get('target')}"
        for e in server.log()[mark:]
        if e["route"] not in ("health", "metrics", "agent_harnesses")
    ]
    # Left: transformers' tokenizer listings (a folder, then the whole tree) that the pull
    # never asked (cmh serve lists blobs in the repo info): kept once the hook asked them;
    # and one HEAD per optional file the repo lacks: only the Hub says a file is absent
    # (as for the stock client; its .no_exist marker is kept).
    listed = {p.relative_to(src).as_posix() for p in src.rglob("*")}
    probes = [s for s in seen if "/tree/" not in s]
    asked = [s.split("/resolve/", 1)[1].split("/", 1)[1] for s in probes]
    assert all(s.startswith("HEAD ") for s in probes) and not set(asked) & listed, seen
    assert len(probes) == len(set(probes)), seen
    assert len(seen) - len(probes) <= 2, seen
    mark = len(server.log())
    run_python(AFTER_PULL_SCRIPT, env)
    server.sync()
    again = [
        f"{e['method']} {e.get('target')}"
        for e in server.log()[mark:]
        if e["route"] not in ("health", "metrics", "agent_harnesses")
    ]
    assert again == [], again
