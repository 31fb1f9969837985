"""A hostile upstream behind ``cmh serve --upstream`` and ``cmh pull`` (issue 23).

Each test names the finding it covers; each failed on the code before its fix.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from cmh.hub.mirror.store import add_folder
from hublike import running
from mirror_support import MirrorServer, hf_env, run_python

FLIP_RESUME_SCRIPT = r"""
import hashlib, json, os
from huggingface_hub import hf_hub_download
path = hf_hub_download("cmh-test/big", "big.bin")
h = hashlib.sha256()
with open(path, "rb") as f:
    h.update(f.read())
print(json.dumps({"sha256": h.hexdigest(), "size": os.path.getsize(path)}))
"""


def _big_store(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    src = tmp_path / "big-src"
    src.mkdir()
    data = os.urandom(size)
    (src / "big.bin").write_bytes(data)
    (src / "config.json").write_text("{}\n")
    store = tmp_path / "upstream-store"
    add_folder(store, src, "cmh-test/big")
    return store, data


def test_flip_and_resume_stock_client_ends_with_the_etags_bytes(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """High 1: one byte flipped mid-fill; the stock client's ``Range`` resume must not
    splice the wrong head to the next fill's right tail."""
    store, data = _big_store(tmp_path, 24 << 20)  # over two of the client's 10 MB chunks
    etag = hashlib.sha256(data).hexdigest()
    backend = mirror_server_factory(store)
    with running(backend.url, xet_listing=False) as hub:
        hub.flip_byte(etag, offset=1000, times=1)  # the first transfer only
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", hub.url))
        out = run_python(FLIP_RESUME_SCRIPT, hf_env(pull.url, tmp_path / "home"), timeout=120)
        hub.wait_idle()
    assert out == {"sha256": etag, "size": len(data)}
    pull.sync()
    gets = [r for r in pull.log() if r.get("method") == "GET" and "big.bin" in r.get("target", "")]
    assert gets[0].get("cut") == "fill failed"  # the first body was cut...
    assert gets[1]["range"] == f"bytes={20 << 20}-"  # the stock client resumed...
    assert gets[1]["status"] == 200  # ...and was told to start again
