# ruff: noqa: E501  (the client script below is kept one call per line)
"""``cmh serve --blob-delivery x-accel`` behind a real nginx: cmh decides, nginx sends."""

from __future__ import annotations

import hashlib
import http.client
from collections.abc import Iterator
from pathlib import Path

import pytest
from mirror_support import (
    MINILM_REPO,
    PRIVATE_REPO,
    PRIVATE_TOKEN,
    TINY_REPO,
    MirrorServer,
    MirrorStore,
    hf_env,
    run_python,
)
from nginx_support import Nginx


@pytest.fixture(scope="module")
def front(
    mirror_store: MirrorStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Nginx, MirrorServer]]:
    logs = tmp_path_factory.mktemp("xaccel")
    server = MirrorServer(mirror_store.path, logs, tokens=mirror_store.tokens,
                          extra_args=("--blob-delivery", "x-accel"))  # fmt: skip
    try:
        nginx = Nginx(mirror_store.path, f"127.0.0.1:{server.port}", logs / "nginx")
        try:
            yield nginx, server
        finally:
            nginx.stop()
    finally:
        server.stop()


def _request(
    nginx: Nginx, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", nginx.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


STOCK_SCRIPT = r"""
import json, os, hashlib
from huggingface_hub import hf_hub_download, snapshot_download
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
snap = snapshot_download(os.environ["T_TINY"])
print(json.dumps({"weights": sha(hf_hub_download(os.environ["T_MINILM"], "model.safetensors")),
                  "tiny": sorted(os.path.relpath(os.path.join(d, f), snap) for d, _, fs in os.walk(snap) for f in fs)}))
"""


def test_stock_client_loads_through_nginx(
    front: tuple[Nginx, MirrorServer], minilm_dir: Path, tmp_path: Path
) -> None:
    nginx, server = front
    env = hf_env(nginx.url, tmp_path / "home")
    env.update(T_MINILM=MINILM_REPO, T_TINY=TINY_REPO)
    out = run_python(STOCK_SCRIPT, env)
    assert (
        out["weights"]
        == hashlib.sha256((minilm_dir / "model.safetensors").read_bytes()).hexdigest()
    )
    assert "sub/deeper/leaf.txt" in out["tiny"]
    gets = server.log(route="resolve", method="GET")
    assert gets and all(e["bytes"] == 0 for e in gets if e["status"] == 200)  # nginx sent them


def test_ranges_headers_and_access_are_cmhs(
    front: tuple[Nginx, MirrorServer], minilm_dir: Path
) -> None:
    nginx, _ = front
    weights = (minilm_dir / "model.safetensors").read_bytes()
    path = f"/{MINILM_REPO}/resolve/main/model.safetensors"
    status, headers, body = _request(nginx, path, {"Range": "bytes=100-199"})
    assert status == 206 and body == weights[100:200]
    assert headers["content-range"] == f"bytes 100-199/{len(weights)}"
    sha = hashlib.sha256(weights).hexdigest()
    assert headers["etag"] == headers["x-linked-etag"] == f'"{sha}"'
    assert headers["x-linked-size"] == str(len(weights)) and len(headers["x-repo-commit"]) == 40
    assert _request(nginx, path, {"If-None-Match": f'"{sha}"'})[0] == 304
    assert _request(nginx, path, {"Range": f"bytes={len(weights)}-"})[0] == 416
    # the internal location cannot be asked for directly
    folder = "models--sentence-transformers--all-MiniLM-L6-v2"
    assert _request(nginx, f"/_cmh_blobs/{folder}/blobs/{sha}")[0] == 404
    assert _request(nginx, f"/_cmh_blobs_whole/{folder}/blobs/{sha}")[0] == 404
    # a private repo: cmh refuses without its token, nginx sends with it
    private = f"/{PRIVATE_REPO}/resolve/main/config.json"
    assert _request(nginx, private)[0] == 404
    status, _, body = _request(nginx, private, {"Authorization": f"Bearer {PRIVATE_TOKEN}"})
    assert status == 200 and body


def test_a_range_cmh_answers_whole_comes_whole_through_nginx(
    front: tuple[Nginx, MirrorServer], minilm_dir: Path
) -> None:
    """A Range whose If-Range names another version is answered with the whole file (RFC
    9110 13.1.5): cmh decides it, and nginx never sends a part of that file."""
    nginx, _ = front
    weights = (minilm_dir / "model.safetensors").read_bytes()
    sha = hashlib.sha256(weights).hexdigest()
    path = f"/{MINILM_REPO}/resolve/main/model.safetensors"
    for stale in ('"0123"', 'W/"0123"', "Tue, 01 Jan 2030 00:00:00 GMT"):
        status, headers, body = _request(nginx, path, {"Range": "bytes=0-9", "If-Range": stale})
        assert (status, len(body)) == (200, len(weights)) and body == weights, stale
        assert "content-range" not in headers
    status, _, body = _request(nginx, path, {"Range": "bytes=0-9", "If-Range": f'"{sha}"'})
    assert (status, body) in ((206, weights[:10]), (200, weights))
