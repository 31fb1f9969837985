"""Demo step: resolve a model through the mirror, update one tensor, resolve again.

Called by ``tools/demo.py`` after the mirror step::

    from demo_resolver import run
    run(work_dir, endpoint, store_dir, repo_id)

``store_dir`` is the store the running mirror at ``endpoint`` serves; the new
revision is imported into it with the mirror's import API
(:func:`cmh.hub.mirror.add_folder`), as a publisher would.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np


def _human(n: int) -> str:
    """Decimal, as the CLI and the pages count (cmh.format_size)."""
    import cmh

    return cmh.format_size(n)


def run(work_dir: Path, endpoint: str, store_dir: Path, repo_id: str) -> None:
    """Resolve, publish a one-tensor update, resolve again; print the bytes saved."""
    import cmh.hub as hub
    from cmh.hub.mirror import add_folder
    from safetensors.numpy import load_file, save_file

    import cmh

    work_dir = Path(work_dir)
    cache = work_dir / "resolver-cache"
    first = hub.resolve(repo_id, cache_dir=cache, endpoint=endpoint)
    print(
        f"resolve #1 {repo_id}: {first.state.value}, {first.requests} requests, "
        f"{_human(first.bytes_transferred)} transferred -> {first.path}"
    )
    again = hub.resolve(repo_id, cache_dir=cache, endpoint=endpoint)
    print(f"resolve #2 (nothing changed): {again.state.value}, {again.requests} request(s)")

    # Publish a new revision in which exactly one tensor changed.
    v2 = work_dir / "resolver-v2"
    shutil.rmtree(v2, ignore_errors=True)
    shutil.copytree(first.path, v2, symlinks=False)
    weights = v2 / "model.safetensors"
    header = cmh.read_header(weights)
    tensors = load_file(str(weights))
    name = min((t for t in header.tensors if t.nbytes >= 64 << 10), key=lambda t: t.nbytes).name
    changed = tensors[name].copy()
    flat = changed.reshape(-1)
    flat[: max(1, flat.size // 10)] += np.asarray(0.01, dtype=flat.dtype)
    tensors[name] = changed
    metadata = {k: v for k, v in (header.metadata or {}).items() if not k.startswith("cmh")}
    weights.unlink()
    save_file(tensors, str(weights), metadata or None)
    cmh.stamp(weights, ttl="30d")
    commit = add_folder(Path(store_dir), v2, repo_id).commit
    print(f"published {repo_id}@{commit[:12]}: tensor {name!r} changed")

    update = hub.resolve(
        repo_id, cache_dir=cache, endpoint=endpoint, policy=hub.Policy(revalidate=True)
    )
    fetched = [f for f in update.files if f.action.value not in ("kept", "linked")]
    size = sum(f.size for f in fetched)
    by_action = ", ".join(f"{f.path}: {f.action.value}" for f in fetched)
    sent = update.bytes_transferred
    print(f"resolve #3 (after the update): {update.state.value}, {update.requests} requests")
    print(f"  {by_action}")
    print(
        f"bytes transferred {_human(sent)} for {_human(size)} of changed files: "
        f"{_human(max(0, size - sent))} saved ({1 - sent / max(size, 1):.1%}); "
        f"{_human(update.bytes_reused)} reused locally"
    )
    loaded = load_file(str(update.path / "model.safetensors"))
    assert np.array_equal(loaded[name], changed), "the updated tensor did not arrive"


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: demo_resolver.py WORK_DIR ENDPOINT STORE_DIR REPO_ID")
    run(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4])
