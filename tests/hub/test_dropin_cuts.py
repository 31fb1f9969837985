"""The cut memory and resumes through a pull-through mirror (issue 36, item 5).

A client that leaves during a fill holds a prefix of the fill's stream. If the fill then
verifies, that prefix is the blob's: the resume is answered 206. Only a fill that failed
its check makes resumes start again, in a way each huggingface_hub release survives:
``200`` with the whole body for those that truncate their partial file on a 200
(huggingface_hub 1.5 and later), ``416`` telling to start again for those that append it
(0.x, 1.0-1.4). Over a folder store and a bucket store (moto's S3 server).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from bucket_support import S3Proxy, S3Request, isolated_aws_env
from client_versions import client_env
from cmh.hub.mirror import add_folder
from deadline_support import TEST_DEADLINE
from hublike import running
from mirror_support import (
    InProcessMirror,
    MirrorServer,
    ProcessClock,
    ctrl_c_as_from_a_terminal,
    hf_env,
    wait_for,
)
from nginx_support import Nginx

REPO = "cut/mid"
SIZE = 24 << 20
FILE = f"/{REPO}/resolve/main/shard.bin"
OLD_AGENT = "huggingface_hub/0.26.5; python/3.11.9; torch/2.4.0"
NEW_AGENT = "huggingface_hub/2.4.0; python/3.11.9"


def _pattern(size: int) -> bytes:
    block = hashlib.sha256(b"cut-memory").digest() * (1 << 15)  # 1 MiB
    out = bytearray()
    i = 0
    while len(out) < size:
        out += bytes([i & 0xFF]) + block[1:]
        i += 1
    return bytes(out[:size])


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An origin ``cmh serve`` holding a 24 MiB blob, behind the Hub-like front (302 to a CDN)."""
    base = tmp_path_factory.mktemp("cut-origin")
    src = base / "src"
    src.mkdir()
    data = _pattern(SIZE)
    (src / "shard.bin").write_bytes(data)
    add_folder(base / "store", src, REPO)
    server = MirrorServer(base / "store", base / "logs")
    try:
        with running(server.url) as front:
            yield {"front": front, "data": data, "sha": hashlib.sha256(data).hexdigest()}
    finally:
        server.stop()


@contextlib.contextmanager
def _pull_through(
    request: pytest.FixtureRequest,
    kind: str,
    origin: dict[str, Any],
    tmp_path: Path,
    *extra: str,
    clock: ProcessClock | None = None,
) -> Iterator[tuple[MirrorServer, str]]:
    """A pull-through ``cmh serve`` (with ``extra`` arguments) in front of the origin, on a
    folder or a bucket store (``kind``), and the bucket's storage endpoint ("" for a
    folder); the origin's faults are cleared before and after."""
    front = origin["front"]
    front.clear_faults()
    args = ("--upstream", front.url, "--fresh-for", "1h", *extra)
    storage = ""
    if kind == "folder":
        (tmp_path / "store").mkdir()
        server = MirrorServer(tmp_path / "store", tmp_path / "logs", extra_args=args, clock=clock)
    else:
        bucket = request.getfixturevalue("moto_bucket")
        env = {**os.environ, **isolated_aws_env(bucket, tmp_path)}
        server = MirrorServer(bucket.url, tmp_path / "logs", extra_args=args, env=env,
                              clock=clock)  # fmt: skip
        storage = bucket.endpoint
    try:
        yield server, storage
    finally:
        server.stop()
        front.clear_faults()


@pytest.fixture(params=["folder", "bucket"])
def pull(
    request: pytest.FixtureRequest, origin: dict[str, Any], tmp_path: Path
) -> Iterator[MirrorServer]:
    """A pull-through ``cmh serve`` in front of the origin, on a folder or a bucket store."""
    with _pull_through(request, request.param, origin, tmp_path) as (server, _):
        yield server


def _request(
    server: MirrorServer | InProcessMirror | _Served,
    method: str,
    headers: dict[str, str],
    keep: int | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request; ``keep``: read that many body bytes, then leave (close the socket)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request(method, FILE, headers=headers)
        response = conn.getresponse()
        status, got = response.status, {k.lower(): v for k, v in response.getheaders()}
        if keep is not None:
            return status, got, response.read(keep)
        try:
            return status, got, response.read()
        except (OSError, http.client.HTTPException):
            return status, {**got, "x-test-cut": "1"}, b""
    finally:
        conn.close()


def _read_past(
    server: MirrorServer | _Served, headers: dict[str, str], past: int, then: threading.Event
) -> tuple[int, bytes]:
    """A GET whose first ``past`` body bytes are read before ``then`` is set; the status
    and every byte received (a cut body ends short)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request("GET", FILE, headers=headers)
        response = conn.getresponse()
        body = response.read(past)
        then.set()
        try:
            body += response.read()
        except http.client.IncompleteRead as exc:
            body += exc.partial
        except (OSError, http.client.HTTPException):
            pass
        return response.status, body
    finally:
        then.set()
        conn.close()


def _cuts(server: MirrorServer | _Served) -> list[str]:
    server.sync()
    return [str(e["cut"]) for e in server.log() if e.get("cut")]


def _stored(server: MirrorServer | _Served) -> bool:
    """The blob is in the store (a HEAD no longer starts or joins a fill)."""
    status, headers, _ = _request(server, "HEAD", {"User-Agent": NEW_AGENT})
    return status in (200, 302) and "x-cmh-filling" not in headers  # 302: sent to the storage


def test_a_client_that_left_a_fill_that_verified_resumes_with_206(
    pull: MirrorServer, origin: dict[str, Any]
) -> None:
    data = origin["data"]
    status, _, head = _request(pull, "GET", {"User-Agent": OLD_AGENT}, keep=1 << 20)
    assert status == 200 and head == data[: 1 << 20]
    wait_for(lambda: _cuts(pull) == ["client went away"], "the server to see the client leave")
    wait_for(lambda: _stored(pull), "the fill to end")
    for agent in (OLD_AGENT, NEW_AGENT):
        status, headers, body = _request(
            pull, "GET", {"User-Agent": agent, "Range": f"bytes={1 << 20}-"}
        )
        assert status == 206, (agent, status, headers)
        assert body == data[1 << 20 :]


def test_after_a_fill_that_failed_its_check_no_resume_splices(
    pull: MirrorServer, origin: dict[str, Any]
) -> None:
    _no_resume_splices(pull, origin)


class _Served:
    """A pull-through ``cmh serve`` on ``clock``, asked directly or through ``nginx`` in front
    of it (its log and sync are the server's)."""

    def __init__(self, server: MirrorServer, clock: ProcessClock, nginx: Nginx | None) -> None:
        self.server, self.nginx, self.clock = server, nginx, clock
        self.host, self.port = server.host, server.port
        if nginx is not None:
            self.host, self.port = "127.0.0.1", nginx.port

    def sync(self) -> None:
        self.server.sync()

    def log(self, **match: Any) -> list[dict[str, Any]]:
        return self.server.log(**match)


@pytest.fixture(params=["folder", "bucket"])
def pull_xaccel(
    request: pytest.FixtureRequest, origin: dict[str, Any], tmp_path: Path
) -> Iterator[_Served]:
    """A pull-through ``cmh serve --blob-delivery x-accel`` on a folder or a bucket store,
    behind nginx (for a bucket, its default location: through nginx's cache)."""
    clock = ProcessClock(tmp_path / "clock")
    args = ("--blob-delivery", "x-accel")
    with _pull_through(request, request.param, origin, tmp_path, *args, clock=clock) as (
        server,
        storage,
    ):
        folder = tmp_path / "store" if request.param == "folder" else None
        nginx = Nginx(folder, f"127.0.0.1:{server.port}", tmp_path / "nginx", storage=storage,
                      cache=bool(storage))  # fmt: skip
        try:
            yield _Served(server, clock, nginx)
        finally:
            nginx.stop()


def test_after_a_fill_that_failed_its_check_no_resume_splices_through_nginx(
    pull_xaccel: _Served, origin: dict[str, Any]
) -> None:
    """With nginx sending the stored blob, a resume that cmh answers whole comes whole:
    nginx never applies the client's Range to it (before, it did)."""
    _no_resume_splices(pull_xaccel, origin, pull_xaccel.clock)


@pytest.fixture
def pull_redirect(
    request: pytest.FixtureRequest, origin: dict[str, Any], tmp_path: Path
) -> Iterator[_Served]:
    """A pull-through ``cmh serve --blob-delivery redirect`` on a bucket store."""
    clock = ProcessClock(tmp_path / "clock")
    args = ("--blob-delivery", "redirect")
    with _pull_through(request, "bucket", origin, tmp_path, *args, clock=clock) as (server, _):
        yield _Served(server, clock, None)


def test_after_a_fill_that_failed_its_check_no_resume_splices_through_a_redirect(
    pull_redirect: _Served, origin: dict[str, Any]
) -> None:
    """With clients sent to the storage, a resume that cmh answers whole comes whole: cmh
    sends it itself (a client following a redirect sends its Range to the storage, which
    would answer a part of the stored blob: before, it did)."""
    _no_resume_splices(pull_redirect, origin, pull_redirect.clock)


def _no_resume_splices(
    pull: MirrorServer | _Served,
    origin: dict[str, Any],
    clock: ProcessClock | None = None,
) -> None:
    """A client cut by a fill that failed its check is never served a part of the blob.
    With the server's ``clock``, the failure is then let age, the blob stored by a good
    fill and the resume asked again: it must come whole."""
    front, data = origin["front"], origin["data"]
    front.flip_byte(origin["sha"], offset=4 << 20)  # the fill's bytes fail their check
    # The first download waits past the flipped byte (and past a bucket's first 8 MiB part)
    # until the client has read it: a folder's resolver then downloads once more (a clean
    # body), and a client that had not read the bad byte yet would be served the retry's
    # bytes whole (no cut to test).
    released = threading.Event()
    front.drip(9 << 20, released)
    status, body = _read_past(pull, {"User-Agent": OLD_AGENT}, 5 << 20, released)
    assert status == 200 and len(body) < SIZE  # cut before its last byte
    wait_for(lambda: any(c.startswith("fill failed") for c in _cuts(pull)), "the cut")
    # huggingface_hub before 1.5 appends a 200's body to its partial file: told to restart.
    status, headers, body = _request(pull, "GET", {"User-Agent": OLD_AGENT, "Range": "bytes=1000-"})
    assert status == 416, (status, headers)
    assert headers["content-range"] == f"bytes */{SIZE}"
    assert "force_download=True" in headers["x-error-message"]
    # Later releases (and other clients) start again from a 200 (or wait out the failure).
    asked = {"User-Agent": NEW_AGENT, "Range": "bytes=1000-"}
    status, headers, body = _request(pull, "GET", asked)
    if status in (301, 302, 303, 307, 308):  # a client follows it with its Range
        status, headers, body = _follow(headers["location"], asked)
    assert status != 206, (status, headers)
    if status == 200:
        assert body == data
    if clock is None:
        return
    # the failure ages out (the fleet's negative cache keeps it 10 s), and a whole GET
    # fills the blob again, right this time
    clock.advance(60)
    status, _, body = _request(pull, "GET", {"User-Agent": NEW_AGENT})
    assert (status, body == data) == (200, True)
    wait_for(lambda: _stored(pull), "the blob to be stored")
    status, headers, body = _request(pull, "GET", asked)
    if status in (301, 302, 303, 307, 308):
        status, headers, body = _follow(headers["location"], asked)
    assert (status, body == data) == (200, True), (status, headers)


def _follow(location: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """The answer to a GET of a redirect's ``location`` with the client's ``headers``."""
    from urllib.parse import urlsplit

    where = urlsplit(location)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    try:
        path = where.path + (f"?{where.query}" if where.query else "")
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


STOCK_0X = r"""
import hashlib, json, os, sys
from huggingface_hub import __version__, hf_hub_download
path = hf_hub_download("cut/mid", "shard.bin")
digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps({"version": __version__, "sha256": digest}))
"""


def _signal_state(pid: int) -> str:
    """The signal lines of a process's status (which signals it ignores and blocks)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return " ".join(line for line in status.splitlines() if line.startswith("Sig"))


def _incomplete(home: Path) -> int:
    sizes = [p.stat().st_size for p in home.rglob("blobs/*.incomplete") if p.is_file()]
    return max(sizes, default=0)


def test_stock_0x_client_interrupted_during_a_fill_resumes_after_it(
    pull: MirrorServer, origin: dict[str, Any], tmp_path: Path
) -> None:
    """huggingface_hub 0.26.5, Ctrl-C mid-download during the mirror's fill, then rerun:
    the file is the blob (it was "Consistency check failed" on the rerun)."""
    front = origin["front"]
    env = client_env(hf_env(pull.url, tmp_path / "home"), "0.26.5")
    if env is None:
        pytest.skip("huggingface_hub 0.26.5 cannot be installed here (no package index)")
    # The upstream trickles past 17 MiB until the client was stopped, so the fill is under
    # way when the client leaves whatever the load (a fixed 3 s pause let a slow client
    # get the whole body into its socket before its Ctrl-C).
    released = threading.Event()
    front.drip(17 << 20, released)  # 0.x writes 10 MiB at a time; a bucket sends 8 MiB parts
    first = subprocess.Popen(
        [sys.executable, "-c", STOCK_0X], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, preexec_fn=ctrl_c_as_from_a_terminal,
    )  # fmt: skip
    try:
        wait_for(lambda: _incomplete(tmp_path / "home") >= 1 << 20, "a partial download")
        signals = _signal_state(first.pid)
        first.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = first.communicate(timeout=60)
    finally:
        released.set()  # the rest at full speed: the server writes to the client that left
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode != 0, (signals, err[-2000:])  # it stopped at its Ctrl-C
    assert _incomplete(tmp_path / "home") > 0  # what it resumes from
    wait_for(lambda: "client went away" in _cuts(pull), "the server to see the client leave")
    wait_for(lambda: _stored(pull), "the fill to end")
    rerun = subprocess.run(
        [sys.executable, "-c", STOCK_0X], env=env, capture_output=True, text=True, timeout=120
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    import json

    got = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert got == {"version": "0.26.5", "sha256": origin["sha"]}


# -- a fill whose first download failed its check, turned good by the resolver's retry -------


def test_a_reader_joining_a_fill_whose_check_is_pending_gets_the_retry_whole(
    origin: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first download's bytes fail their check (one flipped byte) and the resolver
    downloads once more; a client that joins while that check is under way (on a loaded
    machine its digest lags the bytes on disk by seconds) is served the retry's bytes,
    whole: it was cut before its last byte, reading the discarded download (issue 40)."""
    from cmh.hub.cache import ContentCheck

    front, data = origin["front"], origin["data"]
    front.clear_faults()
    front.flip_byte(origin["sha"], offset=20 << 20)  # the first GET only
    pending, release = threading.Event(), threading.Event()
    finish = ContentCheck.finish

    def held(check: ContentCheck) -> Any:  # the first download's verdict waits for the test
        if check.size == SIZE and not pending.is_set():
            pending.set()
            release.wait(60)
        return finish(check)

    monkeypatch.setattr(ContentCheck, "finish", held)
    try:
        with (
            InProcessMirror(tmp_path / "store", front.url) as mirror,
            ThreadPoolExecutor(2) as pool,
        ):
            first = pool.submit(_request, mirror, "GET", {"User-Agent": OLD_AGENT})
            wait_for(pending.is_set, "the first download's bytes, complete, under their check")
            second = pool.submit(_request, mirror, "GET", {"User-Agent": NEW_AGENT})
            wait_for(
                lambda: (
                    len(mirror.tails) == 2 and (mirror.tails[1].fd is not None or second.done())
                ),
                "the second client reading the fill",
            )
            release.set()
            status, headers, body = second.result(120)
            assert status == 200 and "x-test-cut" not in headers, (status, headers)
            assert body == data, len(body)
            status, headers, body = first.result(120)
            assert status == 200
            assert body == data or len(body) < SIZE  # whole, or cut before its last byte
    finally:
        release.set()
        front.clear_faults()


def test_a_client_arriving_while_a_refused_fill_ends_waits_it_out(
    origin: dict[str, Any], moto_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket fill whose bytes failed their check ends by writing the fleet's ``failed``
    record and deleting its parts; a client cut for those bytes is told at once. A
    request arriving before that end joined the doomed fill and was cut in turn (a 200
    cut after 16 MiB: on a loaded machine the end takes long enough for it, issue 40).
    It now waits the fill out and hears its failure (502), as after its end."""
    front, data = origin["front"], origin["data"]
    front.clear_faults()
    front.flip_byte(origin["sha"], offset=4 << 20)
    released = threading.Event()
    front.drip(9 << 20, released)  # past the bad byte only once client 1 has read it
    ending, end = threading.Event(), threading.Event()

    def hold_the_end(request: S3Request) -> None:
        if request.method == "PUT" and request.key.endswith("/failed"):
            ending.set()
            end.wait(TEST_DEADLINE)  # the fill's end waits for the test

    env = isolated_aws_env(moto_bucket, tmp_path)
    proxy = S3Proxy(env["AWS_ENDPOINT_URL"], hold_the_end)
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in {**env, "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(name, value)
    try:
        with InProcessMirror(moto_bucket.url, front.url) as mirror, ThreadPoolExecutor(1) as pool:
            status, body = _read_past(mirror, {"User-Agent": OLD_AGENT}, 5 << 20, released)
            assert status == 200 and len(body) < SIZE  # cut: its bytes are not the blob's
            wait_for(ending.is_set, "the fill's end under way")
            late = pool.submit(_request, mirror, "GET", {"User-Agent": NEW_AGENT})
            with contextlib.suppress(AssertionError):  # joining takes no longer than this
                wait_for(lambda: len(mirror.tails) > 1, "a second reader", timeout=3)
            joined = len(mirror.tails) > 1
            end.set()
            status, headers, body = late.result(TEST_DEADLINE)
            assert not joined, "the late request joined the refused fill"
            assert status == 502 and "x-test-cut" not in headers, (status, headers)
            assert headers["x-error-code"] == "UpstreamProtocolError"
            assert body != data
    finally:
        end.set()
        released.set()
        front.clear_faults()
        proxy.stop()
