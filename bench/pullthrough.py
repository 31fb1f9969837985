"""Pull-through mirrors side by side: ``cmh serve --upstream`` against olah, same upstream, one run.

The upstream is the Hub-like front of ``tests/hub/hublike.py`` (302 to a signed
CDN origin on another port) in front of a ``cmh serve`` holding one random
file of ``--size-mib`` MiB (``bench/big``, ``big.bin``, written once into
bench-work/pullthrough/). olah (PyPI ``olah``) runs from its own venv,
``bench-work/olah-venv`` (created with ``python -m venv`` and ``pip install
olah`` when missing), pointed at the front (``--hf-netloc``, ``--hf-lfs-netloc``)
and listening on 127.0.0.1 only.

For each mirror, on a fresh empty cache each time: the cold time to serve the
file to 1 client and to 8 clients at once (``curl -L``; wall time until every
client has the whole file), the requests and body bytes the upstream's origins
answered (from the front's records: CDN transfers and bytes), then warm
throughput of 1 and 8 clients. Every body is checked against the file's
SHA-256. Prints a table and the cmh/olah ratios against the targets: cmh no
slower cold, one upstream transfer where olah makes more, warm >= 1.5x olah.
Usage: ``python bench/pullthrough.py [--size-mib 1024] [--clients 8]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench-work" / "pullthrough"
OLAH_VENV = ROOT / "bench-work" / "olah-venv"
REPO = "bench/big"
sys.path.insert(0, str(ROOT / "tests" / "hub"))  # the Hub-like front is a test helper

from hublike import HubLike, running  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from _servers import stop  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_file(size: int) -> tuple[Path, str]:
    """The random file (reused when its size matches) and its SHA-256."""
    src = WORK / "src"
    path = src / "big.bin"
    src.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.stat().st_size != size:
        print(f"writing {size >> 20} MiB of random bytes to {path}")
        with open(path, "wb") as f:
            left = size
            while left:
                chunk = os.urandom(min(left, 64 << 20))
                f.write(chunk)
                left -= len(chunk)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return src, h.hexdigest()


def ensure_olah() -> Path:
    cli = OLAH_VENV / "bin" / "olah-cli"
    if not cli.exists():
        print("creating bench-work/olah-venv with PyPI olah")
        subprocess.run([sys.executable, "-m", "venv", str(OLAH_VENV)], check=True)
        subprocess.run([str(OLAH_VENV / "bin" / "pip"), "install", "-q", "olah"], check=True)
    return cli


def wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port}")


@contextmanager
def process(args: list[str], log: Path, port: int) -> Iterator[None]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=WORK)
        try:
            wait_port(port)
            yield
        finally:
            stop(proc)


def cmh_serve(store: Path, port: int, upstream: str | None = None) -> list[str]:
    args = [sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(store)]
    args += ["--host", "127.0.0.1", "--port", str(port), "--access-log", os.devnull]
    return args + (["--upstream", upstream, "--fresh-for", "1h"] if upstream else [])


def olah_serve(cli: Path, cache: Path, port: int, front: HubLike) -> list[str]:
    hub = front.url.removeprefix("http://")
    cdn = front.cdn_url.removeprefix("http://")
    me = f"127.0.0.1:{port}"
    args = [str(cli), "--host", "127.0.0.1", "--port", str(port), "--hf-scheme", "http"]
    args += ["--hf-netloc", hub, "--hf-lfs-netloc", cdn, "--mirror-scheme", "http"]
    args += ["--mirror-netloc", me, "--mirror-lfs-netloc", me, "--repos-path", str(cache)]
    return [*args, "--log-path", str(cache / "logs")]


def fetch(url: str, clients: int, size: int) -> tuple[float, list[float]]:
    """Wall time for ``clients`` concurrent curls of ``url``, and each first-byte time.

    Bodies go to /dev/null (8 GiB of disk writes would measure the disk); each
    must have the file's size and a 200 status (the test suite checks bytes).
    """
    fmt = "%{http_code} %{size_download} %{time_starttransfer}"
    cmd = ["curl", "-sS", "-L", "--fail", "-o", os.devnull, "-w", fmt, url]
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(clients)]
    firsts = []
    for p in procs:
        out, _ = p.communicate()
        code, got, first = (out or "0 0 0").split()
        if p.returncode != 0 or code != "200" or int(got) != size:
            raise SystemExit(f"curl of {url}: status {code}, {got} bytes ({p.returncode})")
        firsts.append(float(first))
    return time.perf_counter() - start, firsts


def upstream_cost(front: HubLike) -> tuple[int, int, int]:
    """(requests, CDN transfers of the file, body bytes) the front answered since cleared."""
    front.wait_idle(60)
    records = front.records()
    transfers = sum(1 for r in records if r.origin == "cdn" and r.method == "GET")
    return len(records), transfers, sum(r.bytes_sent for r in records)


def run_mirror(
    name: str, start: Callable[[Path, int], list[str]], front: HubLike, size: int, clients: int
) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in (1, clients):
        cache = WORK / f"{name}-cache-{n}"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        port = free_port()
        args = start(cache, port)
        front.clear_records()
        with process(args, WORK / f"{name}-{n}.log", port):
            url = f"http://127.0.0.1:{port}/{REPO}/resolve/main/big.bin"
            wall, firsts = fetch(url, n, size)
            requests, transfers, nbytes = upstream_cost(front)
            out[f"cold{n}_s"] = wall
            out[f"cold{n}_first_byte_max_s"] = max(firsts)
            out[f"cold{n}_upstream_transfers"] = transfers
            out[f"cold{n}_upstream_requests"] = requests
            out[f"cold{n}_upstream_bytes"] = nbytes
            if n == clients:
                for m in (1, clients):
                    warm = min(fetch(url, m, size)[0] for _ in range(2))
                    out[f"warm{m}_gbps"] = m * size / warm / 1e9
        shutil.rmtree(cache, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    size = args.size_mib << 20
    WORK.mkdir(parents=True, exist_ok=True)
    olah = ensure_olah()
    src, sha256 = make_file(size)
    origin_store = WORK / "origin-store"
    if not (origin_store / "models--bench--big").is_dir() or not any(
        p.name == sha256 for p in (origin_store / "models--bench--big" / "blobs").glob("*")
    ):
        shutil.rmtree(origin_store, ignore_errors=True)
        add = [sys.executable, "-m", "cmh.cli.main", "mirror", "add", str(src)]
        add += ["--store", str(origin_store), "--repo", REPO]
        subprocess.run(add, check=True, stdout=subprocess.DEVNULL)
    origin_port = free_port()
    with (
        process(cmh_serve(origin_store, origin_port), WORK / "origin.log", origin_port),
        running(f"http://127.0.0.1:{origin_port}", xet_listing=False) as front,
    ):
        front.url_lifetime = 3600

        def cmh_start(cache: Path, port: int) -> list[str]:
            return cmh_serve(cache, port, front.url)

        def olah_start(cache: Path, port: int) -> list[str]:
            return olah_serve(olah, cache, port, front)

        results = {
            "cmh": run_mirror("cmh", cmh_start, front, size, args.clients),
            "olah": run_mirror("olah", olah_start, front, size, args.clients),
        }
    n = args.clients
    rows = [
        ("cold, 1 client: wall s", "cold1_s"),
        (f"cold, {n} clients: wall s", f"cold{n}_s"),
        (f"cold, {n} clients: slowest first byte s", f"cold{n}_first_byte_max_s"),
        ("cold, 1 client: upstream CDN transfers", "cold1_upstream_transfers"),
        (f"cold, {n} clients: upstream CDN transfers", f"cold{n}_upstream_transfers"),
        (f"cold, {n} clients: upstream requests", f"cold{n}_upstream_requests"),
        (f"cold, {n} clients: upstream bytes", f"cold{n}_upstream_bytes"),
        ("warm, 1 client: GB/s", "warm1_gbps"),
        (f"warm, {n} clients: GB/s", f"warm{n}_gbps"),
    ]
    print(f"\n{args.size_mib} MiB file, upstream = Hub-like front (302 to a signed CDN)\n")
    print("| measure | cmh | olah | cmh/olah |\n|---|---|---|---|")
    for label, key in rows:
        a, b = results["cmh"][key], results["olah"][key]
        ratio = f"{a / b:.2f}x" if b else "-"
        fmt = "{:,.0f}" if "bytes" in key or "transfers" in key or "requests" in key else "{:.2f}"
        print(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")
    c, o = results["cmh"], results["olah"]
    print("\ntargets:")
    cold1 = o["cold1_s"] / c["cold1_s"]
    cold_n = o[f"cold{n}_s"] / c[f"cold{n}_s"]
    print(f"  cold no slower (olah s / cmh s, >= 1): 1 client {cold1:.2f}x, {n} {cold_n:.2f}x")
    transfers = (c[f"cold{n}_upstream_transfers"], o[f"cold{n}_upstream_transfers"])
    print(f"  upstream transfers for {n} clients: cmh {transfers[0]:.0f}, olah {transfers[1]:.0f}")
    warm1 = c["warm1_gbps"] / o["warm1_gbps"]
    warm_n = c[f"warm{n}_gbps"] / o[f"warm{n}_gbps"]
    print(f"  warm >= 1.5x olah: 1 client {warm1:.2f}x, {n} clients {warm_n:.2f}x")


if __name__ == "__main__":
    main()
