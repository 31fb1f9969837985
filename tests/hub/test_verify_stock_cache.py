"""``cmh verify`` of a model pulled into the stock Hugging Face cache, as users have it.

A sharded, stamped checkpoint is served by a real ``cmh serve`` started here;
``huggingface_hub.snapshot_download`` (the stock client, in a process of its own)
pulls it into a fresh cache, where every snapshot file is a link into
``../../blobs``. Spec section 6 ("Links") lets a cache snapshot's files resolve
into its repository folder, with or without an index, and nowhere else: the
snapshot verifies ``ok`` (and fingerprints to the identity of the source), while a
link into another repository's folder is ``invalid_file``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from cmh.hub.mirror import add_folder
from mirror_support import MirrorServer, hf_env, run_python
from safetensors.numpy import save_file

import cmh

REPO = "acme/sharded"
CMH = str(Path(sys.executable).parent / "cmh")


def sharded_checkpoint(folder: Path) -> str:
    """Two stamped shards and an index; the directory identity."""
    folder.mkdir()
    tensors = {f"layer.{i}.weight": np.full((8, 8), i, np.float32) for i in range(4)}
    weight_map = {}
    for part, names in enumerate((list(tensors)[:2], list(tensors)[2:]), start=1):
        file = f"model-0000{part}-of-00002.safetensors"
        save_file({n: tensors[n] for n in names}, folder / file, metadata={"format": "pt"})
        cmh.stamp(folder / file, ttl="30d")
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": 4 * 256}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text("{}\n")
    return cmh.directory_identity(folder).hex


def cmh_json(*args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run([CMH, *args, "--json"], capture_output=True, timeout=120, check=False)
    assert b"Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_a_snapshot_of_the_stock_cache_verifies_as_a_directory(
    tmp_path: Path, mirror_server_factory: Callable[..., MirrorServer]
) -> None:
    identity = sharded_checkpoint(tmp_path / "src")
    store = tmp_path / "store"
    add_folder(store, tmp_path / "src", REPO)
    server = mirror_server_factory(store)
    home = tmp_path / "home"
    code = (
        "import json\nfrom huggingface_hub import snapshot_download\n"
        f"print(json.dumps(snapshot_download({REPO!r})))\n"
    )
    snapshot = Path(run_python(code, hf_env(server.url, home)))
    shard = snapshot / "model-00001-of-00002.safetensors"
    assert (
        snapshot.parent.name == "snapshots"
        and snapshot.parent.parent.name == "models--acme--sharded"
    )
    assert shard.is_symlink() and os.readlink(shard).startswith("../../blobs/")

    status, document = cmh_json("verify", str(snapshot))
    assert status == 0, document
    (checkpoint,) = document["checkpoints"]
    assert (document["outcome"], checkpoint["outcome"], checkpoint["identity"]) == (
        "ok",
        "ok",
        identity,
    )
    assert [f["outcome"] for f in document["files"]] == ["ok", "ok"]
    status, document = cmh_json("fingerprint", str(snapshot))
    assert (status, document["fingerprint"]) == (0, identity)

    # Without the index the same rule holds: the shards alone, links into blobs, are ok.
    (snapshot / "model.safetensors.index.json").unlink()
    status, document = cmh_json("verify", str(snapshot))
    assert (status, document["outcome"]) == (0, "ok")

    # A way out stays shut: a shard linked into another repository's folder.
    other = home / "hub" / "models--acme--other" / "blobs"
    other.mkdir(parents=True)
    (other / "x").write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to("../../../models--acme--other/blobs/x")
    status, document = cmh_json("verify", str(snapshot))
    assert (status, document["outcome"]) == (3, "invalid_file")
    assert "resolves outside the directory" in document["checkpoints"][0]["error"]
