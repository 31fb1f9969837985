"""Mirror hardening (issue 11, items 10 and 14-20): lying blobs, hostile files and clients.

Every test drives public interfaces only: the ``cmh`` CLI in a subprocess, a
real ``cmh serve`` on 127.0.0.1 started by the test, raw sockets, and the stock
``huggingface_hub`` client in a subprocess. Stores are built with
``cmh mirror add`` and read through their stock cache layout (spec 1).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import numpy as np
import pytest
from cmh.hub.mirror.stores.local._verify import FileVersion, racy_seconds
from deadline_support import TEST_DEADLINE
from mirror_support import MirrorServer, hf_env
from safetensors.numpy import save_file

CMH = [sys.executable, "-m", "cmh.cli.main"]
REPO = "org/hard"
PRIVATE = "org/private"
TOKEN = "hf_hardening_token_0001"


# -- helpers -------------------------------------------------------------------------------


def cmh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the ``cmh`` CLI."""
    return subprocess.run([*CMH, *args], capture_output=True, text=True, timeout=timeout)


def add(store: Path, src: Path, repo: str = REPO, *extra: str) -> str:
    """``cmh mirror add``; the commit id."""
    done = cmh("mirror", "add", str(src), "--store", str(store), "--repo", repo, "--json", *extra)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["commit"])


def repo_dir(store: Path, repo: str = REPO) -> Path:
    return store / ("models--" + repo.replace("/", "--"))


def blob_of(store: Path, commit: str, path: str, repo: str = REPO) -> Path:
    """The blob a snapshot entry links to (stock cache layout)."""
    link = repo_dir(store, repo) / "snapshots" / commit / path
    return repo_dir(store, repo) / "blobs" / Path(os.readlink(link)).name


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def get(
    url: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    req = Request(url, headers=headers or {}, method=method)
    try:
        with urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except HTTPError as e:
        return e.code, dict(e.headers), e.read()


def crafted_safetensors(path: Path, kind: str, tensor: str) -> Path:
    """A stamped safetensors file whose header was then made hostile (issue item 10).

    ``surrogate``: a tensor name becomes the escaped lone surrogate ``"\\ud800"``;
    ``dimension``: a zero-sized tensor gets the dimension 2**64 (product still 0).
    The header length is kept, so the file still parses as JSON of the same size.
    """
    import cmh as cmh_format

    name = tensor.ljust(6, "x")[:6]  # as long as the escape sequence that replaces it
    save_file({name: np.arange(16, dtype=np.float32), "z": np.zeros((0, 4), np.float32)}, path)
    cmh_format.stamp(path, ttl="30d")
    data = bytearray(path.read_bytes())
    (size,) = struct.unpack("<Q", data[:8])
    head = bytes(data[8 : 8 + size])
    if kind == "surrogate":
        new = head.replace(f'"{name}"'.encode(), b'"\\ud800"')
    else:
        doc = json.loads(head)
        doc["z"]["shape"] = [0, 2**64]
        new = json.dumps(doc, separators=(",", ":")).encode()
        new += b" " * (size - len(new))
    assert len(new) == size and new != head
    data[8 : 8 + size] = new
    path.write_bytes(bytes(data))
    return path


def stamped_file(path: Path, seed: int) -> Path:
    import cmh as cmh_format

    rng = np.random.default_rng(seed)
    save_file({"w": rng.standard_normal((64, 32)).astype(np.float32)}, path)
    cmh_format.stamp(path, ttl="30d")
    return path


def overwrite(path: Path, data: bytes) -> None:
    """Change a blob's bytes in place (same inode)."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.write(data)


def scrub(store: Path, *extra: str) -> tuple[int, dict[str, object], str]:
    done = cmh("mirror", "scrub", "--store", str(store), "--json", *extra)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


# -- item 10 and 14: scrub -----------------------------------------------------------------


def test_scrub_reports_crafted_headers_per_blob_and_goes_on(tmp_path: Path) -> None:
    src = tmp_path / "crafted"
    src.mkdir()
    crafted_safetensors(src / "a.safetensors", "surrogate", "alpha")
    crafted_safetensors(src / "b.safetensors", "dimension", "beta")
    (src / "config.json").write_text('{"model_type": "bert"}\n')
    store = tmp_path / "store"
    commit = add(store, src)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "weights.bin").write_bytes(os.urandom(50_000))
    (plain / "notes.txt").write_text("notes\n")
    plain_commit = add(store, plain, "org/zzz-after")  # scrubbed after the crafted repo
    corrupt = blob_of(store, plain_commit, "weights.bin", "org/zzz-after")
    overwrite(corrupt, b"\0" * 100)
    crafted = {blob_of(store, commit, f).name for f in ("a.safetensors", "b.safetensors")}

    code, doc, _ = scrub(store)
    assert doc["blobs"] == 5  # every blob was checked, the ones after the crafted too
    errors = {e["blob"]: e for e in doc["errors"]}  # type: ignore[attr-defined]
    assert set(errors) == crafted
    assert {e["error"] for e in errors.values()} == {"invalid_file"}
    assert all(e["message"] for e in errors.values())
    assert [b["blob"] for b in doc["bad"]] == [corrupt.name]  # type: ignore[attr-defined]
    assert not corrupt.exists()  # quarantined: the scrub went on after the crafted blobs
    assert all((repo_dir(store) / "blobs" / name).exists() for name in crafted)
    assert code == 1 and doc["ok"] is False

    code, doc, _ = scrub(store)  # the crafted blobs alone: invalid files, exit 3
    assert code == 3 and not doc["bad"] and len(doc["errors"]) == 2  # type: ignore[arg-type]
    human = cmh("mirror", "scrub", "--store", str(store))
    assert human.returncode == 3 and "Traceback" not in human.stderr
    assert all(name in human.stdout for name in crafted)
    assert human.stdout.count("invalid_file") == 2


def test_scrub_compares_a_restamped_blob_with_its_name(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    stamped_file(src / "model.safetensors", seed=1)
    store = tmp_path / "store"
    commit = add(store, src)
    blob = blob_of(store, commit, "model.safetensors")
    code, doc, _ = scrub(store)
    assert code == 0 and doc["ok"] is True
    forged = stamped_file(tmp_path / "forged.safetensors", seed=2)  # valid, stamped, other bytes
    assert forged.stat().st_size == blob.stat().st_size
    overwrite(blob, forged.read_bytes())
    code, doc, _ = scrub(store, "--no-quarantine")
    assert code == 1, doc
    assert [b["blob"] for b in doc["bad"]] == [blob.name]  # type: ignore[attr-defined]
    assert "sha256" in str(doc["bad"][0]["message"])  # type: ignore[index]


# -- item 10: fingerprint endpoint ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["surrogate", "dimension"])
def test_fingerprint_of_a_crafted_header_is_a_typed_4xx(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path, kind: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    crafted_safetensors(src / "model.safetensors", kind, "alpha")
    (src / "config.json").write_text('{"model_type": "bert"}\n')
    store = tmp_path / "store"
    add(store, src)
    server = mirror_server_factory(store)
    status, headers, body = get(f"{server.url}/api/cmh/fingerprint/{REPO}/main")
    assert status == 422, body
    assert headers["X-Error-Code"] == "InvalidFile"
    assert "error" in json.loads(body)
    assert get(f"{server.url}/health")[0] == 200


# -- item 15: never a complete body that differs from its ETag -----------------------------


def _cached_blobs_match_their_names(home: Path) -> list[str]:
    """Blobs of the stock client's cache whose SHA-256 name disagrees with their bytes."""
    wrong = []
    for blob in (home / "hub").rglob("blobs/*"):
        if len(blob.name) == 64 and blob.is_file() and sha256_of(blob.read_bytes()) != blob.name:
            wrong.append(blob.name)
    return wrong


_STOCK_DOWNLOADS = """
import hashlib, json, os, sys, threading
from huggingface_hub import hf_hub_download

lock = threading.Lock()

def fetch(name):
    try:
        path = hf_hub_download(os.environ["T_REPO"], name)
        out = {"file": name, "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}
    except Exception as exc:
        out = {"file": name, "error": type(exc).__name__}
    with lock:
        print(json.dumps(out), flush=True)

threads = [threading.Thread(target=fetch, args=(n,)) for n in sys.argv[1:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""

SWAPS = ("in-place", "rename", "symlink", "hardlink")


def _swap(blob: Path, twin: Path, how: str) -> None:
    """Replace ``blob`` by other bytes of the same size, the way ``how`` says."""
    if how == "in-place":
        overwrite(blob, twin.read_bytes())
    elif how == "rename":
        tmp = blob.with_name("swap.tmp")
        tmp.write_bytes(twin.read_bytes())
        os.replace(tmp, blob)
    elif how == "symlink":
        blob.unlink()
        os.symlink(twin.name, blob)
    else:
        blob.unlink()
        os.link(twin, blob)


def _wait_past_racy_window(blobs: Iterable[Path]) -> None:
    for blob in blobs:
        fd = os.open(blob, os.O_RDONLY)
        try:
            version = FileVersion.of(fd)
        finally:
            os.close(fd)
        changed = max(version.mtime_ns, version.ctime_ns) / 1e9
        while time.time() - changed <= racy_seconds(version):
            time.sleep(0.05)


def test_a_blob_changed_after_indexing_is_never_served_under_its_name(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for how in SWAPS:
        (src / f"{how}.bin").write_bytes(os.urandom(300_000))
    (src / "twin.bin").write_bytes(os.urandom(300_000))  # same size, other bytes, in the store
    store = tmp_path / "store"
    commit = add(store, src)
    twin = blob_of(store, commit, "twin.bin")
    server = mirror_server_factory(store)
    blobs = {how: blob_of(store, commit, f"{how}.bin") for how in SWAPS}
    # older than the "racy" window of spec 2.1: the good outcomes are remembered, so what
    # follows exercises a remembered blob that changes afterwards. The kernel sets ctime
    # (no test can move it): wait until the window after the last change has passed.
    _wait_past_racy_window(blobs.values())
    for how, blob in blobs.items():  # indexed, checked and served once while still right
        status, _, body = get(f"{server.url}/{REPO}/resolve/main/{how}.bin")
        assert status == 200 and sha256_of(body) == blob.name
    for how, blob in blobs.items():
        _swap(blob, twin, how)
    # the stock client: run until it gives up or for 15 s (it honours Retry-After)
    home = tmp_path / "hf-home"
    env = hf_env(server.url, home)
    env["T_REPO"] = REPO
    stock = subprocess.Popen(
        [sys.executable, "-c", _STOCK_DOWNLOADS, *(f"{how}.bin" for how in SWAPS)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        out, _ = stock.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        stock.kill()
        out, _ = stock.communicate()
    for line in out.splitlines():
        result = json.loads(line)
        how = result["file"].removesuffix(".bin")
        assert "sha256" not in result or result["sha256"] == blobs[how].name, result
    assert _cached_blobs_match_their_names(home) == []
    for how in SWAPS:
        url = f"{server.url}/{REPO}/resolve/main/{how}.bin"
        for headers in ({}, {"Range": "bytes=0-"}, {"Range": "bytes=0-99,200-299"}):
            status, got, body = get(url, headers)
            assert status not in (200, 206), (how, headers, status)
            assert got.get("X-Error-Code") == "BlobUnavailable", (how, headers)


def test_a_blob_that_is_a_link_is_listed_and_answers_503_before_any_indexing(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """A blob swapped for a symlink before a worker first indexes its commit is treated
    as after (spec 1.3): listed by its recorded size, answered 503 BlobUnavailable (never
    the 404 a client caches as an absence), never followed, inside the store or out, and
    never waited on (a FIFO)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "inside.bin").write_bytes(os.urandom(3000))
    (src / "outside.bin").write_bytes(os.urandom(3000))
    (src / "fifo.bin").write_bytes(os.urandom(3000))
    (src / "twin.bin").write_bytes(os.urandom(3000))  # same size, in the store
    store = tmp_path / "store"
    commit = add(store, src)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"S" * 3000)
    inside, outside = blob_of(store, commit, "inside.bin"), blob_of(store, commit, "outside.bin")
    inside.unlink()
    os.symlink(blob_of(store, commit, "twin.bin").name, inside)
    outside.unlink()
    os.symlink(secret, outside)
    fifo = blob_of(store, commit, "fifo.bin")
    fifo.unlink()
    os.mkfifo(fifo)  # never opened in a way that waits for a writer
    server = mirror_server_factory(store)
    status, _, body = get(f"{server.url}/api/models/{REPO}/tree/main")
    assert status == 200
    assert {e["path"]: e["size"] for e in json.loads(body)} == {
        "fifo.bin": 3000,
        "inside.bin": 3000,
        "outside.bin": 3000,
        "twin.bin": 3000,
    }
    for name in ("inside.bin", "outside.bin", "fifo.bin"):
        for method in ("GET", "HEAD"):
            for headers in ({}, {"Range": "bytes=0-9"}):
                url = f"{server.url}/{REPO}/resolve/main/{name}"
                status, got, body = get(url, headers, method)
                assert (status, got.get("X-Error-Code")) == (503, "BlobUnavailable"), name
                assert got.get("Retry-After") == "60" and b"SSSS" not in body


def test_a_blob_changed_while_it_is_sent_is_cut_before_the_last_byte(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    size = 48 << 20  # far more than the loopback socket buffers hold
    (src / "big.bin").write_bytes(os.urandom(size))
    store = tmp_path / "store"
    commit = add(store, src)
    blob = blob_of(store, commit, "big.bin")
    server = mirror_server_factory(store)
    status, _, body = get(f"{server.url}/{REPO}/resolve/main/big.bin")
    assert status == 200 and sha256_of(body) == blob.name  # verified and served once
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("GET", f"/{REPO}/resolve/main/big.bin")
    response = conn.getresponse()
    assert response.status == 200
    received = bytearray(response.read(1 << 20))  # the server is mid-body: 47 MB to go
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:
        f.seek(size - 1)
        last = f.read(1)
        f.seek(size - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    complete = True
    try:
        while chunk := response.read(1 << 20):
            received += chunk
    except (http.client.IncompleteRead, ConnectionError):
        complete = False
    finally:
        conn.close()
    if complete and len(received) == size:
        assert sha256_of(bytes(received)) == blob.name, "a complete body that is not its ETag"
    else:
        assert len(received) < size


# -- item 16: slow and idle clients --------------------------------------------------------


def _serve(
    store: Path, log_dir: Path, *args: str, nofile: int | None = None
) -> tuple[subprocess.Popen[str], str]:
    """``cmh serve`` in a subprocess, optionally with its own ``RLIMIT_NOFILE``."""

    def limit() -> None:
        if nofile is not None:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    log_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    proc = subprocess.Popen(
        [*CMH, "serve", "--store", str(store), "--port", "0",
         "--access-log", str(log_dir / "access.jsonl"), *args],
        stdout=subprocess.PIPE, stderr=open(log_dir / "stderr", "wb"),  # noqa: SIM115
        text=True, env=env, preexec_fn=limit,
    )  # fmt: skip
    assert proc.stdout is not None
    match = re.search(r"http://127\.0\.0\.1:\d+", proc.stdout.readline())
    if not match:
        proc.kill()
        proc.wait()
        raise AssertionError((log_dir / "stderr").read_text())
    return proc, match.group(0)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., tuple[str, Path]]]:
    """Start ``cmh serve`` processes (stopped at teardown); returns ``(url, log dir)``."""
    procs: list[subprocess.Popen[str]] = []

    def start(store: Path, *args: str, nofile: int | None = None) -> tuple[str, Path]:
        log_dir = tmp_path / f"serve-{len(procs)}"
        proc, url = _serve(store, log_dir, *args, nofile=nofile)
        procs.append(proc)
        return url, log_dir

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _small_store(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}\n")
    store = tmp_path / "store"
    add(store, src)
    return store


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _open_slow(addr: tuple[str, int], n: int, first: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(addr, timeout=10)
        if first:
            s.sendall(first)
        socks.append(s)
    return socks


def _closed_by_peer(s: socket.socket) -> bool:
    """True once the server has closed ``s`` (reads EOF or a reset; never blocks)."""
    s.setblocking(False)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _wait_all_closed(socks: list[socket.socket], within: float, poke: bool = False) -> list[int]:
    """Indexes of sockets the server has not closed ``within`` seconds (dribbling if ``poke``)."""
    deadline = time.monotonic() + within
    open_ = set(range(len(socks)))
    while open_ and time.monotonic() < deadline:
        for i in list(open_):
            if poke:
                try:
                    socks[i].send(b"X")
                except OSError:
                    open_.discard(i)
                    continue
            if _closed_by_peer(socks[i]):
                open_.discard(i)
        time.sleep(0.2)
    return sorted(open_)


def test_slow_and_idle_clients_cannot_starve_the_server(
    served: Callable[..., tuple[str, Path]], tmp_path: Path
) -> None:
    store = _small_store(tmp_path)
    url, _ = served(
        store, "--max-connections", "40", "--header-timeout", "1", "--idle-timeout", "2",
        nofile=256,
    )  # fmt: skip
    addr = _host_port(url)
    slow = _open_slow(addr, 120, b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never end
    silent = _open_slow(addr, 40, b"")  # connect and say nothing
    dribble = _open_slow(addr, 10, b"GET /health HTTP/1.1\r\nX-Slow: ")
    try:
        for _ in range(3):  # a normal request still gets through, repeatedly
            status, _, body = get(f"{url}/health")
            assert status == 200 and json.loads(body)["status"] == "ok"
        keep = socket.create_connection(addr, timeout=TEST_DEADLINE)
        keep.sendall(f"GET /{REPO}/resolve/main/config.json HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"{}\n"):
            answer += keep.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200")
        # every slow, silent, dribbling and idle keep-alive connection is closed by the server
        assert _wait_all_closed([*slow, *silent, keep], within=TEST_DEADLINE) == []
        assert _wait_all_closed(dribble, within=TEST_DEADLINE, poke=True) == []
        assert get(f"{url}/health")[0] == 200
        metrics = get(f"{url}/metrics")[2].decode()
        for reason in ("evicted", "header_timeout", "idle"):
            match = re.search(
                rf'cmh_mirror_connections_dropped_total{{reason="{reason}"}} ([0-9.e+]+)', metrics
            )
            assert match and float(match.group(1)) > 0, reason
    finally:
        for s in [*slow, *silent, *dribble]:
            s.close()


def test_a_request_body_that_never_arrives_gets_408(
    served: Callable[..., tuple[str, Path]], tmp_path: Path
) -> None:
    store = _small_store(tmp_path)
    url, _ = served(store, "--header-timeout", "1")
    with socket.create_connection(_host_port(url), timeout=30) as s:
        s.sendall(
            f"POST /api/models/{REPO}/paths-info/main HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            "Content-Length: 100\r\n\r\npaths=con".encode()
        )  # and never the rest of the body
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_default_connection_cap_fits_the_open_file_limit(
    served: Callable[..., tuple[str, Path]], tmp_path: Path
) -> None:
    store = _small_store(tmp_path)
    url, _ = served(store, nofile=128)  # defaults only, under a small RLIMIT_NOFILE
    addr = _host_port(url)
    slow = _open_slow(addr, 200, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    try:
        status, _, body = get(f"{url}/health")
        assert status == 200 and json.loads(body)["status"] == "ok"
    finally:
        for s in slow:
            s.close()


@pytest.mark.parametrize("flag", ["--max-connections", "--header-timeout", "--idle-timeout"])
def test_connection_limits_refuse_nonsense(tmp_path: Path, flag: str) -> None:
    done = cmh("serve", "--store", str(tmp_path), "--port", "0", flag, "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr


# -- item 17: metrics ----------------------------------------------------------------------


def _blob_bytes(store: Path, repo: str) -> int:
    return sum(p.stat().st_size for p in (repo_dir(store, repo) / "blobs").iterdir())


def test_metrics_do_not_count_private_repos(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    store = _small_store(tmp_path)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "weights.bin").write_bytes(os.urandom(123_457))
    add(store, secret, PRIVATE)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} {PRIVATE}\n")
    server = mirror_server_factory(store, tokens=tokens)
    samples = server.metrics()
    assert samples[("cmh_mirror_store_repos", ())] == 1
    assert samples[("cmh_mirror_store_bytes", ())] == _blob_bytes(store, REPO)


# -- item 18: the pagination Link ----------------------------------------------------------


def _link(url: str, host: str | None) -> str:
    host_port = _host_port(url)
    conn = http.client.HTTPConnection(*host_port, timeout=TEST_DEADLINE)
    conn.putrequest("GET", f"/api/models/{REPO}/tree/main", skip_host=True)
    conn.putheader("Host", host or f"{host_port[0]}:{host_port[1]}")
    conn.endheaders()
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 200
    return str(response.getheader("Link"))


def test_pagination_link_uses_the_public_url_never_the_host_header(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}.txt").write_text(f"{i}\n")
    store = tmp_path / "store"
    add(store, src)
    server = mirror_server_factory(store, extra_args=("--tree-page-size", "2"))
    for host in ("evil.example:8080", "evil.example", None):
        link = _link(server.url, host)
        assert link.startswith(f"<{server.url}/api/models/{REPO}/tree/"), (host, link)
    public = mirror_server_factory(
        store,
        extra_args=("--tree-page-size", "2", "--public-url", "https://mirror.example.org/hf/"),
    )
    link = _link(public.url, "evil.example:8080")
    assert link.startswith(f"<https://mirror.example.org/hf/api/models/{REPO}/tree/"), link
    for bad in ("ftp://x", "not a url", "https://h/x?q=1"):
        done = cmh("serve", "--store", str(store), "--port", "0", "--public-url", bad)
        assert done.returncode == 2 and "public" in done.stderr.lower(), (bad, done.stderr)


# -- item 19: a tokens file naming a repo the store lacks ----------------------------------


def test_tokens_naming_a_repo_the_store_lacks_are_warned_about(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    store = _small_store(tmp_path)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "config.json").write_text('{"secret": 1}\n')
    add(store, secret, PRIVATE)
    tokens = tmp_path / "tokens"
    typo = "org/Private"  # another case: the real repo stays public
    tokens.write_text(f"{TOKEN} {typo} datasets/org/nowhere\n")
    server = mirror_server_factory(store, tokens=tokens)
    assert get(f"{server.url}/{PRIVATE}/resolve/main/config.json")[0] == 200  # still public
    stderr = server.stderr_text()
    assert "warning" in stderr and typo in stderr and "datasets/org/nowhere" in stderr
    assert PRIVATE in stderr  # the near miss is named
    listed = cmh("mirror", "ls", "--store", str(store), "--tokens", str(tokens))
    assert listed.returncode == 0, listed.stderr
    assert "warning" in listed.stderr and typo in listed.stderr
    assert "datasets/org/nowhere" in listed.stderr
    doc = json.loads(
        cmh("mirror", "ls", "--store", str(store), "--tokens", str(tokens), "--json").stdout
    )
    assert {r["repo_id"]: r["private"] for r in doc["repos"]} == {REPO: False, PRIVATE: False}
    assert sorted(w["repo"] for w in doc["warnings"]) == ["datasets/org/nowhere", typo]
    tokens.write_text(f"{TOKEN} {PRIVATE}\n")
    doc = json.loads(
        cmh("mirror", "ls", "--store", str(store), "--tokens", str(tokens), "--json").stdout
    )
    assert {r["repo_id"]: r["private"] for r in doc["repos"]} == {REPO: False, PRIVATE: True}
    assert doc["warnings"] == []


def test_access_log_and_metrics_count_body_bytes_of_documents_and_errors(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """``bytes`` and ``cmh_mirror_response_bytes_total`` are body bytes (spec 2.8), for an
    error and a document as for a file: the status line and headers are not counted."""
    server = mirror_server_factory(_small_store(tmp_path))
    url = f"{server.url}/{REPO}/resolve/main/config.json"
    status, _, refused = get(url, {"If-Match": '"nope"'})
    assert status == 412 and refused
    status, _, info = get(f"{server.url}/api/models/{REPO}")
    assert status == 200 and info
    assert get(f"{server.url}/api/models/{REPO}", method="HEAD")[0] == 200
    assert [e["bytes"] for e in server.log(route="resolve")] == [len(refused)]
    assert [(e["method"], e["bytes"]) for e in server.log(route="repo_info")] == [
        ("GET", len(info)),
        ("HEAD", 0),
    ]
    samples = server.metrics()
    assert samples[("cmh_mirror_response_bytes_total", (("route", "resolve"),))] == len(refused)
    assert samples[("cmh_mirror_response_bytes_total", (("route", "repo_info"),))] == len(info)


# -- item 20: secrets in the access log ----------------------------------------------------


def test_access_log_redacts_secrets_in_query_strings(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    store = _small_store(tmp_path)
    server = mirror_server_factory(store)
    secrets = ["s3cr3t-one", "s3cr3t-two", "s3cr3t-three", "s3cr3t-four"]
    targets = [
        f"/{REPO}/resolve/main/config.json?token={secrets[0]}",
        f"/api/models/{REPO}?blobs=true&access_token={secrets[1]}",
        f"/health?%74oken={secrets[2]}",
        f"/api/models/{REPO}/tree/main?recursive=true&X-Amz-Signature={secrets[3]}",
    ]
    for target in targets:
        get(f"{server.url}{target}")
    log = server.log()
    text = server.access_log.read_text()
    for secret in secrets:
        assert secret not in text
    logged = [e["target"] for e in log]
    assert any("token=" in t and "REDACTED" in t for t in logged)
    assert any("blobs=true" in t for t in logged)  # harmless parameters are kept
    assert any("recursive=true" in t for t in logged)


# -- a spec-only reader's third round: a repeated query parameter (spec 2) ----------------


def test_the_last_value_of_a_repeated_parameter_counts_and_name_brackets_is_name(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Spec 2: "`name[]` is the same parameter as `name`; where one value is read, the
    last one counts". ``download`` was read first-wins from the raw query, and
    ``blobs[]``/``recursive[]`` were ignored."""
    server = mirror_server_factory(_small_store(tmp_path))
    file = f"{server.url}/{REPO}/resolve/main/config.json"
    for query, disposition in (
        ("download=true&download=0", "inline"),
        ("download=0&download=1", "attachment"),
        ("download%5B%5D=true", "attachment"),
        ("download=1&download%5B%5D=no", "inline"),
    ):
        status, headers, _ = get(f"{file}?{query}", method="HEAD")
        assert status == 200
        assert headers["Content-Disposition"].split(";")[0] == disposition, query
    info = f"{server.url}/api/models/{REPO}/revision/main"
    for query, listed in (("blobs%5B%5D=true", True), ("blobs=true&blobs%5B%5D=false", False)):
        _, _, body = get(f"{info}?{query}")
        assert ("blobId" in json.loads(body)["siblings"][0]) is listed, query
