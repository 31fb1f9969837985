"""Web pages of ``cmh serve`` over 1,000 repos against one Hub API listing of them, in one run.

Builds (or reuses) a store in bench-work/ of ``--repos`` repos (default 1,000),
each one commit of a config.json, a README with front matter and a stamped
model.safetensors. Then, for each side on a freshly started ``cmh serve``
(cold: nothing indexed yet) and again on the same server (warm), over one
keep-alive connection:

- the first page of the repo list (what a person opening ``/`` waits for);
- pages: every page of the repo list (``/?page=1..10``: 100 rows each, with
  size, last update and stamp state), i.e. all 1,000 repos rendered;
- baseline, the Hub API: ``GET /api/models?limit=N`` when the server answers
  it, else the listing a client of this mirror can do today, one
  ``GET /api/models/{repo}`` (repo info) per repo.

Prints each time (best of ``--repeat``) and the ratio pages / API. The target
is a ratio below 1. Usage: ``python bench/web.py [--repos 1000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _timing import best_of
from cmh.hub.mirror import add_folder
from safetensors.numpy import save_file

import cmh

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench-work" / "web"


def build(store: Path, count: int) -> list[str]:
    """A store of ``count`` small stamped repos (reused when already built)."""
    names = [f"org{i % 10}/model-{i:04d}" for i in range(count)]
    marker = store / f".built-{count}"
    if marker.exists():
        return names
    src = WORK / "src"
    rng = np.random.default_rng(0)
    for i, name in enumerate(names):
        src.mkdir(parents=True, exist_ok=True)
        weights = src / "model.safetensors"
        save_file({"w": rng.standard_normal((32, 32)).astype(np.float32)}, str(weights))
        cmh.stamp(weights, ttl=f"{1 + i % 60}d")
        (src / "config.json").write_text(json.dumps({"model_type": "bench", "i": i}))
        (src / "README.md").write_text(f"---\nlicense: mit\ntags: [bench]\n---\n# {name}\n")
        add_folder(store, src, name)
    marker.touch()
    return names


class Server:
    def __init__(self, store: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(store), "--port", "0",
             "--access-log", "/dev/null"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not match:
            raise SystemExit(f"cmh serve did not start: {line!r}")
        self.port = int(match.group(1))
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)

    def get(self, path: str) -> tuple[int, bytes]:
        self.conn.request("GET", path)
        response = self.conn.getresponse()
        return response.status, response.read()

    def stop(self) -> None:
        self.conn.close()
        self.process.terminate()
        self.process.wait(10)


def pages(server: Server, count: int) -> None:
    for page in range(1, (count + 99) // 100 + 1):
        status, body = server.get(f"/?page={page}")
        assert status == 200 and body.count(b"<tr data-name=") > 0, status


def api_listing(server: Server, names: list[str]) -> str:
    """Which API listing this server offers (``/api/models`` or repo info per repo)."""
    status, _ = server.get(f"/api/models?limit={len(names)}")
    return "GET /api/models" if status == 200 else f"{len(names)} x GET /api/models/{{repo}}"


def api(server: Server, names: list[str], kind: str) -> None:
    if kind.startswith("GET /api/models"):
        status, body = server.get(f"/api/models?limit={len(names)}")
        assert status == 200 and len(json.loads(body)) >= len(names)
        return
    for name in names:
        status, _ = server.get(f"/api/models/{name}")
        assert status == 200


def measure(store: Path, run: object, repeat: int) -> tuple[float, float]:
    """``(cold, warm)`` seconds: first call on a fresh server, then best of ``repeat``."""
    server = Server(store)
    try:
        start = time.perf_counter()
        run(server)  # type: ignore[operator]
        cold = time.perf_counter() - start
        warm = best_of(repeat, lambda: run(server))  # type: ignore[operator]
    finally:
        server.stop()
    return cold, warm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repos", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    store = WORK / f"store-{args.repos}"
    started = time.perf_counter()
    names = build(store, args.repos)
    print(f"store: {args.repos} repos in {store} ({time.perf_counter() - started:.1f} s to build)")
    probe = Server(store)
    try:
        kind = api_listing(probe, names)
    finally:
        probe.stop()
    first_cold, first_warm = measure(store, lambda s: pages(s, 100), args.repeat)
    page_cold, page_warm = measure(store, lambda s: pages(s, args.repos), args.repeat)
    api_cold, api_warm = measure(store, lambda s: api(s, names, kind), args.repeat)
    print(f"baseline (Hub API listing): {kind}")
    print(f"{'':28} {'cold':>9} {'warm':>9}")
    print(f"{'first list page (100 rows)':28} {first_cold:8.3f}s {first_warm:8.3f}s")
    print(f"{'pages (all list pages)':28} {page_cold:8.3f}s {page_warm:8.3f}s")
    print(f"{'Hub API listing':28} {api_cold:8.3f}s {api_warm:8.3f}s")
    print(f"{'ratio pages / API':28} {page_cold / api_cold:8.2f}x {page_warm / api_warm:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
