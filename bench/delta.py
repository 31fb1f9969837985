"""Bytes, requests and wall time of ``cmh.hub.resolve`` against stock ``snapshot_download``.

Both clients talk to the same ``cmh serve`` mirror on 127.0.0.1, each into its
own empty cache, in one run. The repo holds a ~1 GiB stamped checkpoint plus
two small files. Scenarios:

- fresh: empty cache, fetch the repo;
- revalidate: nothing changed upstream (cmh: default policy, then forced
  revalidation);
- update: a new revision changes about 5% of the tensor bytes (a few whole
  tensors; cmh asked to revalidate, since the stamp says the old revision
  is fresh for 30 days).

Requests and bytes are counted at the server (its JSON access log). Target:
cmh update bytes <= 1.05 x changed tensor bytes + headers, and fewer requests
than stock in every scenario. The default policy fetches a large file over
parallel range connections (one request per 16 MiB chunk), which costs
requests for speed; rows with ``connections=1`` show the fewest requests cmh
makes, and the verdict names the scenarios where the default makes more.

    .venv/bin/python bench/delta.py [--size-mib 1024] [--changed 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic import make_versions

T = TypeVar("T")

REPO = "bench/delta"
WORK = Path(__file__).resolve().parent.parent / "bench-work" / "delta"


class Server:
    """``cmh serve`` on a free port of 127.0.0.1, with a JSON access log."""

    def __init__(self, store: Path, log: Path) -> None:
        self.log = log
        log.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(store),
             "--host", "127.0.0.1", "--port", "0", "--access-log", str(log)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not match:
            self.stop()
            raise SystemExit(f"cmh serve did not start: {line!r}")
        self.url = match.group(0)

    def entries(self) -> list[dict[str, Any]]:
        time.sleep(0.2)  # let the log catch up
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)


def counted(server: Server, run: Callable[[], T]) -> tuple[float, int, int, T]:
    before = len(server.entries())
    t0 = time.perf_counter()
    result = run()
    wall = time.perf_counter() - t0
    new = [e for e in server.entries()[before:] if e.get("route") not in ("health", "metrics")]
    return wall, len(new), sum(int(e.get("bytes") or 0) for e in new), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--changed", type=float, default=0.05)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    v1, v2, changed, header_bytes = make_versions(WORK, args.size_mib << 20, args.changed)
    store, stock_cache, cmh_cache = WORK / "store", WORK / "cache-stock", WORK / "cache-cmh"
    one_cache = WORK / "cache-cmh-one-connection"
    for d in (store, stock_cache, cmh_cache, one_cache):
        shutil.rmtree(d, ignore_errors=True)

    import cmh.hub as hub
    from cmh.hub.mirror import add_folder
    from huggingface_hub import snapshot_download

    add_folder(store, v1, REPO)
    server = Server(store, WORK / "access.jsonl")
    rows: list[tuple[str, str, float, int, int, str]] = []
    try:

        def stock() -> str:
            return snapshot_download(REPO, cache_dir=stock_cache, endpoint=server.url)

        def ours(cache: Path = cmh_cache, **policy: Any) -> Callable[[], hub.Resolution]:
            def run() -> hub.Resolution:
                return hub.resolve(
                    REPO, cache_dir=cache, endpoint=server.url, policy=hub.Policy(**policy)
                )

            return run

        # One connection, in a cache of its own: the fewest requests cmh can make
        # (the default spends one request per 16 MiB chunk to fill parallel links).
        single = ours(one_cache, connections=1)
        single_update = ours(one_cache, connections=1, revalidate=True)
        for name, stock_run, cmh_runs in (
            ("fresh", stock, [("default", ours()), ("connections=1", single)]),
            (
                "revalidate",
                stock,
                [("default", ours()), ("revalidate=True", ours(revalidate=True))],
            ),
            (
                "update",
                stock,
                [("revalidate=True", ours(revalidate=True)), ("connections=1", single_update)],
            ),
        ):
            if name == "update":
                add_folder(store, v2, REPO)
            wall, reqs, nbytes, _ = counted(server, stock_run)
            rows.append((name, "stock snapshot_download", wall, reqs, nbytes, ""))
            for label, run in cmh_runs:
                wall, reqs, nbytes, res = counted(server, run)
                rows.append((name, f"cmh resolve {label}", wall, reqs, nbytes, res.state.value))
    finally:
        server.stop()

    share = changed / (args.size_mib << 20)
    print(
        f"checkpoint: {args.size_mib} MiB, changed tensor bytes in update: {changed:,} "
        f"({share:.1%}), new header: {header_bytes:,} bytes"
    )
    print(
        f"{'scenario':<11} {'client':<32} {'state':<14} {'requests':>8} {'bytes':>15} {'wall s':>8}"
    )
    for name, client, wall, reqs, nbytes, state in rows:
        print(f"{name:<11} {client:<32} {state:<14} {reqs:>8} {nbytes:>15,} {wall:>8.2f}")
    by = {(r[0], r[1]): r for r in rows}
    print()
    ok = True
    notes: list[str] = []
    for name in ("fresh", "revalidate", "update"):
        stock_row = by[(name, "stock snapshot_download")]
        mine = [r for r in rows if r[0] == name and r[1].startswith("cmh")]
        for r in mine:
            fewer = r[3] < stock_row[3]
            verdict = "fewer" if fewer else "NOT fewer"
            byte_ratio = r[4] / max(stock_row[4], 1)
            time_ratio = r[2] / max(stock_row[2], 1e-9)
            print(
                f"{name:<11} {r[1]:<32} requests {r[3]} vs stock {stock_row[3]}: {verdict}; "
                f"bytes ratio {byte_ratio:.4f}; time ratio {time_ratio:.2f}"
            )
        fewest = min(r[3] for r in mine)
        ok = ok and fewest < stock_row[3]
        default = mine[0]
        if default[3] >= stock_row[3]:
            notes.append(f"{name}: default policy {default[3]} requests vs stock {stock_row[3]}")
    update = by[("update", "cmh resolve revalidate=True")]
    limit = 1.05 * changed + header_bytes
    met = "met" if update[4] <= limit else "MISSED"
    print(
        f"update bytes {update[4]:,} vs target 1.05 x changed + header = {limit:,.0f}: "
        f"{update[4] / limit:.3f} of the target ({met})"
    )
    print(
        "fewer requests than stock in every scenario (fewest of cmh's rows): "
        f"{'yes' if ok else 'NO'}"
    )
    for note in notes:
        print(f"  {note} (parallel range requests over several connections, for speed)")


if __name__ == "__main__":
    main()
