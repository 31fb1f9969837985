"""Mirror throughput against nginx serving the same blob folder statically, in one run.

Writes (or reuses) one large random file in bench-work/mirror/, imports it into
a store with ``cmh mirror add``, then serves it twice on 127.0.0.1:

- ``cmh serve --workers N`` at ``/{repo}/resolve/main/big.bin``;
- nginx (Debian package; installed with apt-get if missing) with a generated
  config in a temp folder, ``N`` worker processes, ``sendfile on``, serving the
  store folder, at ``/models--bench--big/blobs/{sha256}``.

Both keep an access log (a file). The clients are ``curl`` processes writing
to /dev/null: the first GET of a fresh server right after ``cmh mirror add``
(which records the check it made of the blob, so the server does not hash it
again; target >= 0.9x), then one GET of the whole file, then 16 parallel GETs of
the whole file (targets >= 1.0x); best of ``--repeat`` runs, alternating between
the two servers so that other load on the machine hits both alike. nginx keeps its
own ``sendfile_max_chunk`` (2 MiB since 1.21.4) unless ``--nginx-chunk`` sets one (cmh's
sender makes calls of 2 MiB for a body alone, 512 KiB while bodies share it). Prints
throughputs, the cmh/nginx ratios, each server's CPU seconds per GiB sent (its
processes and threads), the CPU the kernel's ``ksoftirqd`` threads spent meanwhile
(loopback packets a sender left to them) and the load average.
Usage: ``python bench/mirror.py [--size-mib 1024] [--workers 2] [--parallel 16]
[--repeat 5] [--nginx-chunk 512k]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import free_port, nginx_config
from _timing import cpu_seconds, softirq_seconds, warm

WORK = Path(__file__).resolve().parent.parent / "bench-work" / "mirror"
REPO = "bench/big"
TARGET = 1.0  # one GET and parallel GETs, as before per-blob checks
FIRST_TARGET = 0.9  # the first GET after `cmh mirror add`


def ensure_nginx() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )
    if found:
        return found
    print("nginx not found: installing the Debian package (apt-get install nginx-light)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for pkg in ("nginx-light", "nginx"):
        if subprocess.run(["apt-get", "install", "-y", "-q", pkg], env=env).returncode == 0:
            break
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(found):
        sys.exit("nginx could not be installed; the comparison needs it")
    return found


def wait_ready(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-I", url], capture_output=True)
        if r.returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def make_source(size_mib: int) -> Path:
    src = WORK / f"src-{size_mib}"
    big = src / "big.bin"
    if not big.exists() or big.stat().st_size != size_mib << 20:
        src.mkdir(parents=True, exist_ok=True)
        with open(big, "wb") as f:
            for _ in range(size_mib):
                f.write(os.urandom(1 << 20))
    return src


def timed_gets(url: str, parallel: int, size: int) -> float:
    """Bytes/s of ``parallel`` concurrent whole-file GETs (each checked complete)."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", url],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(parallel)
    ]
    outs = [p.communicate()[0].split() for p in procs]
    elapsed = time.perf_counter() - start
    if any(o[0] != "200" or int(o[1]) != size for o in outs):
        raise RuntimeError(f"GET {url}: incomplete answers {outs}")
    return parallel * size / elapsed


@dataclass
class Figures:
    """One server's figures over a row's runs."""

    best: float = 0.0  # bytes/s
    cpu: float = 0.0  # CPU seconds of the server's processes
    softirq: float = 0.0  # CPU seconds of ksoftirqd meanwhile
    sent: int = 0  # bytes
    loads: list[float] = field(default_factory=list)

    def cpu_per_gib(self) -> float:
        return self.cpu / (self.sent / (1 << 30))


def compare(
    servers: dict[str, tuple[str, int]], parallel: int, repeat: int, size: int
) -> dict[str, Figures]:
    """Each server's (url, pid) figures; runs alternate so machine load hits both alike."""
    figures = {name: Figures() for name in servers}
    for _ in range(repeat):
        for name, (url, pid) in servers.items():
            got = figures[name]
            got.loads.append(os.getloadavg()[0])
            cpu, softirq = cpu_seconds(pid), softirq_seconds()
            got.best = max(got.best, timed_gets(url, parallel, size))
            got.cpu += cpu_seconds(pid) - cpu
            got.softirq += softirq_seconds() - softirq
            got.sent += parallel * size
    return figures


def start_cmh(store: Path, workers: int, log: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(store), "--port", "0",
         "--workers", str(workers), "--access-log", str(log)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    match = re.search(r"http://127\.0\.0\.1:\d+", proc.stdout.readline())
    if not match:
        proc.terminate()
        sys.exit("cmh serve did not start")
    return proc, match.group(0)


def start_nginx(
    nginx: str, root: Path, workers: int, tmp: Path, chunk: str | None = None
) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    conf = tmp / "nginx.conf"
    server = f"  server {{\n    listen 127.0.0.1:{port};\n    root {root};\n"
    if chunk is not None:
        server += f"    sendfile_max_chunk {chunk};\n"
    server += "    location / { }\n  }\n"
    conf.write_text(nginx_config(tmp, workers, True, server))
    proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(tmp)], text=True)
    return proc, f"http://127.0.0.1:{port}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--nginx-chunk", help="nginx's sendfile_max_chunk, e.g. 512k (default: nginx's own)"
    )
    args = parser.parse_args()
    if shutil.which("curl") is None:
        sys.exit("curl is needed as the HTTP client")
    nginx = ensure_nginx()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from cmh.hub.cache import CHECK_RECORDS, RepoLayout
    from cmh.hub.mirror import add_folder, build_index

    src = make_source(args.size_mib)
    store = WORK / "store"
    # Forget a check an earlier run recorded: the record the first GET uses must be the
    # one this `mirror add` writes (it re-hashes a blob it finds already stored).
    shutil.rmtree(RepoLayout(store, REPO).path / CHECK_RECORDS, ignore_errors=True)
    result = add_folder(store, src, REPO)
    entry = build_index(RepoLayout(store, REPO), result.commit).files["big.bin"]
    size = entry.size
    warm(entry.source)
    tmp = Path(tempfile.mkdtemp(prefix="cmh-bench-mirror-"))
    os.chmod(tmp, 0o755)
    cmh_proc, cmh_url = start_cmh(store, args.workers, tmp / "cmh-access.log")
    ngx_proc, ngx_base = start_nginx(nginx, store, args.workers, tmp, args.nginx_chunk)
    try:
        cmh_file = f"{cmh_url}/{REPO}/resolve/main/big.bin"
        ngx_file = f"{ngx_base}/{RepoLayout(store, REPO).folder_name}/blobs/{entry.etag}"
        wait_ready(ngx_file)
        # the first GET of a fresh cmh serve, right after the import
        first_load = os.getloadavg()[0]
        first = {"cmh": timed_gets(cmh_file, 1, size), "nginx": timed_gets(ngx_file, 1, size)}
        wait_ready(cmh_file)
        chunk = args.nginx_chunk or "nginx's default"
        print(
            f"file: {size / (1 << 20):.0f} MiB, {args.workers} workers each, curl clients;"
            f" nginx sendfile_max_chunk: {chunk}"
        )
        ratio = first["cmh"] / first["nginx"]
        verdict = "ok" if ratio >= FIRST_TARGET else "BELOW TARGET"
        print(
            f"{'first GET':<18} cmh serve {first['cmh'] / 1e9:6.2f} GB/s   "
            f"nginx {first['nginx'] / 1e9:6.2f} GB/s   ratio {ratio:4.2f}x "
            f"(target >= {FIRST_TARGET}x: {verdict}; after mirror add, from its check record;"
            f" load average {first_load:.1f})"
        )
        servers = {"cmh": (cmh_file, cmh_proc.pid), "nginx": (ngx_file, ngx_proc.pid)}
        rows = []
        for label, parallel in (("1 GET", 1), (f"{args.parallel} parallel GETs", args.parallel)):
            rows.append((label, compare(servers, parallel, args.repeat, size)))
        for label, got in rows:
            ours, ngx = got["cmh"], got["nginx"]
            ratio = ours.best / ngx.best
            verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
            loads = ours.loads + ngx.loads
            print(
                f"{label:<18} cmh serve {ours.best / 1e9:6.2f} GB/s   nginx {ngx.best / 1e9:6.2f}"
                f" GB/s   ratio {ratio:4.2f}x (target >= {TARGET}x: {verdict})\n"
                f"{'':<18} CPU s/GiB cmh {ours.cpu_per_gib():.3f} nginx {ngx.cpu_per_gib():.3f}"
                f"; ksoftirqd s cmh {ours.softirq:.2f} nginx {ngx.softirq:.2f}"
                f"; load average {min(loads):.1f}-{max(loads):.1f}"
            )
    finally:
        for proc in (cmh_proc, ngx_proc):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
