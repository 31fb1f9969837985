"""Latency of a revision and a tree while fingerprints compute, as a ratio, in one run (issue 35).

Imports ``--repos`` repos, each one synthetic checkpoint of ``--size-mib`` MiB
(different bytes, so no fingerprint is shared), into a store in bench-work/,
starts ``cmh serve`` on it, and measures:

- alone: the median latency of ``GET /api/models/{repo}/revision/main`` and of
  ``GET /api/models/{repo}/tree/main`` (``--samples`` each);
- loaded: the same while one fingerprint request per repo is in flight (the
  worker's fingerprint cache is cold: each computes).

Prints both and their ratio (issue 35's target: within 3x; before the compute
pool, 6.0 s against 0.009 s). The suite asserts the bound on a smaller store,
with drip-fed revalidations too, in ``tests/hub/test_mirror_latency.py``. Usage:
``python bench/bounds.py [--repos 8] [--size-mib 128] [--samples 20]``.

``--blackholed-pull``: instead, the wall time of ``cmh pull`` against a Hub that
accepts connections and never answers (a loopback listener), from the process's
spawn to its exit, against ``HF_HUB_ETAG_TIMEOUT`` (``--etag-timeout``, 10 s): the
budget runs from the process's start, imports included (issue 35; before, 14-30 s
on a loaded machine for a 10 s budget).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import make_checkpoint
from cmh.hub.mirror import add_folder

WORK = Path(__file__).resolve().parent.parent / "bench-work" / "bounds"


def build(repos: int, size_mib: int) -> Path:
    store = WORK / f"store-{repos}-{size_mib}"
    if store.exists():
        return store
    for i in range(repos):
        src = WORK / f"src-{i}"
        make_checkpoint(src / "model.safetensors", size_mib << 20, 32, seed=i)
        (src / "config.json").write_text('{"model_type": "bert"}\n')
        add_folder(store, src, f"bench/m{i}")
    return store


def get(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        r.read()
    return time.perf_counter() - start


def latencies(base: str, samples: int) -> tuple[float, float]:
    revision = [get(f"{base}/api/models/bench/m0/revision/main") for _ in range(samples)]
    tree = [get(f"{base}/api/models/bench/m0/tree/main") for _ in range(samples)]
    return statistics.median(revision), statistics.median(tree)


def blackholed_pull(etag_timeout: float, runs: int) -> None:
    """Time ``cmh pull`` against a listener that never answers, ``runs`` times."""
    cmh = Path(sys.executable).parent / "cmh"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(
            HF_ENDPOINT=f"http://127.0.0.1:{sock.getsockname()[1]}",
            HF_HUB_ETAG_TIMEOUT=str(etag_timeout),
            HF_HOME=str(WORK / "blackholed-home"),
        )
        walls = []
        for _ in range(runs):
            start = time.perf_counter()
            done = subprocess.run(
                [str(cmh), "pull", "bench/never", "--cache-dir", str(WORK / "blackholed")],
                env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            walls.append(time.perf_counter() - start)
            assert done.returncode == 3, done.stderr
    print(f"cmh pull, blackholed Hub: wall {min(walls):.2f} to {max(walls):.2f} s over {runs} "
          f"runs (target <= HF_HUB_ETAG_TIMEOUT {etag_timeout:g} s + 1 s)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repos", type=int, default=8)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--blackholed-pull", action="store_true")
    parser.add_argument("--etag-timeout", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.blackholed_pull:
        blackholed_pull(args.etag_timeout, args.runs)
        return
    store = build(args.repos, args.size_mib)
    server = subprocess.Popen(
        [sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(store),
         "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        match = re.search(r"http://127\.0\.0\.1:\d+", server.stdout.readline())
        assert match, "cmh serve did not start"
        base = match.group(0)
        alone = latencies(base, args.samples)
        done: list[float] = []
        threads = [
            threading.Thread(
                target=lambda i=i: done.append(get(f"{base}/api/cmh/fingerprint/bench/m{i}/main"))
            )
            for i in range(args.repos)
        ]
        for t in threads:
            t.start()
        time.sleep(0.2)  # the fingerprint requests are in
        loaded = latencies(base, args.samples)
        in_flight = args.repos - len(done)
        for t in threads:
            t.join()
    finally:
        server.terminate()
        server.wait(30)
    for name, a, b in (("revision", alone[0], loaded[0]), ("tree", alone[1], loaded[1])):
        print(f"{name:8s} alone {a * 1000:7.1f} ms  with fingerprints {b * 1000:7.1f} ms  "
              f"ratio {b / a:5.2f}x (target <= 3x)")  # fmt: skip
    print(f"fingerprints still in flight when the loaded samples began: {in_flight}")
    print(f"slowest fingerprint: {max(done):.2f} s")


if __name__ == "__main__":
    main()
