"""Processes: 8 concurrent resolvers share downloads; SIGKILL never breaks the snapshot."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cmh.hub.cache import RepoLayout
from cmh.hub.mirror import add_folder
from resolver_support import FaultProxy, write_checkpoint_repo
from safetensors.numpy import load_file

REPO = "org/toy"

RESOLVE_CODE = """
import json, sys
import cmh.hub as hub
res = hub.resolve({repo!r}, cache_dir={cache!r}, endpoint={endpoint!r},
                  policy=hub.Policy(revalidate=True))
print(json.dumps({{"commit": res.commit, "state": res.state.value, "path": str(res.path)}}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    return env


def _code(cache: Path, endpoint: str) -> str:
    return RESOLVE_CODE.format(repo=REPO, cache=str(cache), endpoint=endpoint)


def test_eight_processes_download_each_blob_once(tmp_path, mirror_server_factory):
    store = tmp_path / "store"
    src = write_checkpoint_repo(tmp_path / "v1", 1, count=8, elems=400_000)
    add_folder(store, src, REPO)
    server = mirror_server_factory(store)
    cache = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _code(cache, server.url)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for _ in range(8)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert len({o["commit"] for o in outs}) == 1 and len({o["path"] for o in outs}) == 1
    gets = [e for e in server.log(route="resolve") if e["method"] == "GET"]
    per_file: dict[str, list[dict]] = {}
    for e in gets:
        per_file.setdefault(e["target"].rsplit("/", 1)[-1], []).append(e)
    for name in ("model.safetensors", "config.json", "README.md"):
        # Once: one GET, or (a file of several chunks) one GET per chunk, each chunk once.
        ranges = [e.get("range") for e in per_file[name]]
        assert len(set(ranges)) == len(ranges), (name, ranges)
        assert sum(e["bytes"] for e in per_file[name]) == (src / name).stat().st_size
    snapshot = Path(outs[0]["path"])
    weights = (snapshot / "model.safetensors").read_bytes()
    assert weights == (src / "model.safetensors").read_bytes()


def _snapshot_ok(layout: RepoLayout, commit: str, src: Path) -> None:
    """Every file the commit lists is linked to a blob holding the published bytes."""
    tree = json.loads((layout.trees / f"{commit}.json").read_text())["files"]
    folder = layout.snapshot_dir(commit)
    for path in tree:
        data = (folder / path).read_bytes()
        assert data == (src / path).read_bytes(), path
    load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path, mirror_server_factory):
    store = tmp_path / "store"
    v1 = write_checkpoint_repo(tmp_path / "v1", 1, count=8, elems=200_000)
    v2 = write_checkpoint_repo(tmp_path / "v2", 2, count=8, elems=200_000, changed=(1, 3, 6))
    add_folder(store, v1, REPO)
    server = mirror_server_factory(store)
    base_cache = tmp_path / "base-cache"
    subprocess.run(
        [sys.executable, "-c", _code(base_cache, server.url)], check=True, env=_env(), timeout=120
    )
    c1 = RepoLayout(base_cache, REPO).read_ref("main")
    assert c1 is not None
    (v2 / "README.md").write_text("# toy v2, longer readme\n" * 20)
    add_folder(store, v2, REPO)
    proxy = FaultProxy(server.url)
    proxy.delay = 0.01  # ~0.5 s of transfer per run: kills land inside it too
    rng = random.Random(20240601)
    try:
        # How long an uninterrupted update takes, start to end, in this environment.
        probe = tmp_path / "probe-cache"
        shutil.copytree(base_cache, probe, symlinks=True)
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-c", _code(probe, proxy.url)], check=True, env=_env(), timeout=120
        )
        full = time.monotonic() - t0
        c2 = RepoLayout(probe, REPO).read_ref("main")
        assert c2 not in (None, c1)
        outcomes = {"old": 0, "new": 0}
        for trial in range(20):
            cache = tmp_path / f"cache-{trial}"
            shutil.copytree(base_cache, cache, symlinks=True)
            layout = RepoLayout(cache, REPO)
            proc = subprocess.Popen(
                [sys.executable, "-c", _code(cache, proxy.url)],
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(rng.uniform(0.05, 1.0) * full)  # a kill point inside the real transfer
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            ref = layout.read_ref("main")
            assert ref in (c1, c2), trial
            outcomes["old" if ref == c1 else "new"] += 1
            _snapshot_ok(layout, ref, v1 if ref == c1 else v2)
            # The stock client, offline, sees a complete snapshot too.
            from huggingface_hub import snapshot_download

            assert snapshot_download(REPO, cache_dir=cache, local_files_only=True) == str(
                layout.snapshot_dir(ref)
            )
            # A rerun finishes the update.
            subprocess.run(
                [sys.executable, "-c", _code(cache, proxy.url)],
                check=True,
                env=_env(),
                timeout=120,
                capture_output=True,
            )
            assert layout.read_ref("main") == c2
            _snapshot_ok(layout, c2, v2)
            shutil.rmtree(cache)
        assert outcomes["old"] >= 1  # some kills landed before the swap
    finally:
        proxy.stop()
    digest = hashlib.sha256((v2 / "model.safetensors").read_bytes()).hexdigest()
    assert digest
