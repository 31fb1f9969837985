"""Bucket proxy delivery, spliced: bodies of a version known good (and ranges whose last
byte waits for a check) go from the storage's socket to the client's in the kernel.

Real SeaweedFS and ``cmh serve``; a pass-through proxy in front of the storage shows
which GETs were the spliced ones (their ``User-Agent`` is ``cmh``)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from bucket_support import Fault, S3Proxy, S3Request, aws_env_applied, isolated_aws_env
from cmh.hub.mirror.stores.bucket import _send, _splice
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from cmh.hub.mirror.stores.bucket._objectstore import ObjectStoreError
from deadline_support import TEST_DEADLINE
from mirror_support import MirrorServer, wait_for
from seaweed import SeaweedBucket, SeaweedServer

REPO = "cmh-test/splice"
FOLDER = "models--cmh-test--splice"
SIZE = 3 << 20
HUGE = "cmh-test/splice-huge"
RESET = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close() sends a reset


def blob_get_agents(proxy: S3Proxy) -> list[str]:
    """The ``User-Agent`` of each GET of a blob object the storage answered through ``proxy``."""
    return [
        e.request.header("User-Agent") or ""
        for e in proxy.exchanges
        if e.request.method == "GET" and "/blobs/" in e.request.key
    ]


@dataclass
class Served:
    store: BucketStore
    server: MirrorServer
    storage: S3Proxy
    data: bytes
    bad_name: str
    env: dict[str, str] = field(default_factory=dict)  # the server's environment
    blobs: dict[str, str] = field(default_factory=dict)  # path -> its blob object
    cut: list[bool] = field(default_factory=lambda: [False])  # [True]: spliced GETs cut


def _cut_spliced(cut: list[bool]) -> object:
    """A hook of :class:`S3Proxy` that cuts the spliced GETs of blobs mid-body while
    ``cut[0]``: the storage sends half the body, then closes."""

    def hook(request: S3Request) -> Fault | None:
        spliced = request.method == "GET" and request.header("User-Agent") == "cmh"
        return Fault.TRUNCATE if cut[0] and spliced and "/blobs/" in request.key else None

    return hook


@pytest.fixture(scope="module")
def served(seaweed: SeaweedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    where = SeaweedBucket(seaweed, seaweed.bucket, f"splice-{uuid.uuid4().hex[:10]}/")
    tmp = tmp_path_factory.mktemp("splice")
    cut = [False]
    storage = S3Proxy(where.endpoint, hook=_cut_spliced(cut))  # type: ignore[arg-type]
    env = isolated_aws_env(where, tmp)
    src = tmp / "src"
    src.mkdir()
    data = os.urandom(SIZE)
    (src / "big.bin").write_bytes(data)
    (src / "bad.bin").write_bytes(data[::-1])
    (src / "warm.bin").write_bytes(data[1:] + data[:1])  # a blob no other test cuts
    with aws_env_applied(env):
        store = BucketStore.open(where.url)
        tree = store.read_tree(FOLDER, store.add_folder(src, REPO).commit)
        assert tree is not None
        bad = next(f for f in tree.files if f.path == "bad.bin")
        blob = store.blob_name(FOLDER, bad.etag)
        blobs = {f.path: store.blob_name(FOLDER, f.etag) for f in tree.files}
        served_env = {**os.environ, **env, "AWS_ENDPOINT_URL": storage.endpoint}
        server = MirrorServer(where.url, tmp / "logs", env=served_env)
        try:
            yield Served(store, server, storage, data, blob, served_env, blobs, cut)
        finally:
            server.stop()
            storage.stop()


def _get(
    served: Served,
    rng: str | None,
    stop_after: int | None = None,
    path: str = "big.bin",
    repo: str = REPO,
) -> tuple[int, bytes | str]:
    conn = http.client.HTTPConnection(served.server.host, served.server.port, timeout=30)
    try:
        conn.request("GET", f"/{repo}/resolve/main/{path}", headers={"Range": rng} if rng else {})
        r = conn.getresponse()
        if stop_after is not None:
            return r.status, r.read(stop_after)
        try:
            return r.status, r.read()
        except http.client.IncompleteRead:
            return r.status, "IncompleteRead"
    finally:
        conn.close()


def test_spliced_bodies_are_the_stored_bytes(served: Served) -> None:
    data = served.data
    before = len(blob_get_agents(served.storage))
    logged = len(served.server.log(route="resolve", method="GET"))
    assert _get(served, None) == (200, data)
    assert _get(served, "bytes=1048576-") == (206, data[1 << 20 :])
    assert _get(served, "bytes=1000-2500000") == (206, data[1000:2500001])
    assert _get(served, f"bytes=-{(1 << 20) + 7}") == (206, data[-((1 << 20) + 7) :])
    assert blob_get_agents(served.storage)[before:] == ["cmh"] * 4  # each one spliced GET
    # A request's log line is written once its answer ended: it may follow the body.
    wait_for(lambda: len(served.server.log(route="resolve", method="GET")) >= logged + 4)
    log = served.server.log(route="resolve", method="GET")
    assert [e["bytes"] for e in log[logged:]] == [SIZE, SIZE - (1 << 20), 2499001, (1 << 20) + 7]
    # a client that leaves mid-body leaves the replica serving the next one whole
    assert _get(served, None, stop_after=100_000)[1] == data[:100_000]
    assert _get(served, None) == (200, data)


def test_a_spliced_range_of_a_bad_blob_is_never_sent_complete(served: Served) -> None:
    """A range holding the last byte of a version not checked yet goes out spliced, but
    that byte waits for the check beside it: the body is cut, never complete."""
    bad = bytearray(served.data[::-1])
    bad[-1] ^= 0xFF  # same size, last byte differs: a new version, no check record
    served.store.objects.put(served.bad_name, bytes(bad))
    before = len(blob_get_agents(served.storage))
    status, body = _get(served, "bytes=1048576-", path="bad.bin")
    assert status == 206 and body == "IncompleteRead"
    # The range was spliced (the check's read is aiohttp's).
    assert "cmh" in blob_get_agents(served.storage)[before:]
    assert _get(served, None, path="bad.bin")[0] == 503  # known bad now


def test_a_storage_cut_mid_body_reaches_the_client_as_a_cut(served: Served) -> None:
    """The storage ends a spliced body early: the client's body ends before its last
    byte (never a complete body of other bytes), ranged or whole; then it is served again.

    The ranged GET goes first: the cut it ends with is recorded (cuts.py), and a ranged
    GET that came after that record landed would rightly be answered 200, the whole body
    (a loaded run saw it; the record is written once the cut body has ended, so a quick
    next request may or may not find it)."""
    served.cut[0] = True
    try:
        assert _get(served, "bytes=1048576-") == (206, "IncompleteRead")
        assert _get(served, None) == (200, "IncompleteRead")
    finally:
        served.cut[0] = False
    assert _get(served, None) == (200, served.data)


# -- the data plane alone, in this process: a local storage and a local client -----------


class _Storage:
    """A plain-HTTP storage on 127.0.0.1 answering one GET with ``body``, written in
    ``piece``-byte writes ``pause`` seconds apart, then (``stall``) silent until stopped."""

    def __init__(
        self, body: bytes, piece: int, pause: float, stall: bool = False, length: str = ""
    ) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/b/blobs/x?sig=1"
        self.done = threading.Event()

        def serve() -> None:
            conn, _ = self.listener.accept()
            with conn:
                while b"\r\n\r\n" not in conn.recv(65536):
                    pass
                size = length or len(body) + (1 if stall else 0)  # a stalled body never ends
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n"
                conn.sendall(head.encode("latin-1"))
                for at in range(0, len(body), piece):
                    conn.sendall(body[at : at + piece])
                    time.sleep(pause)
                self.done.wait(30)

        threading.Thread(target=serve, daemon=True).start()

    def stop(self) -> None:
        self.done.set()
        self.listener.close()


@dataclass
class _Spliced:
    got: bytes  # what the client received
    sent: int  # what the body counted as sent
    error: Exception | None  # what ``send_to`` raised


async def _splice_to_client(storage: _Storage, count: int) -> _Spliced:
    """Open the storage's body and splice ``count`` bytes of it to a local client."""
    body = await _splice.StorageBody.open(storage.url, 0, None, '"e"', "GET test", "b/blobs/x")
    receiver = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def receive() -> None:
        conn, _ = receiver.accept()
        with conn:
            while chunk := conn.recv(1 << 20):
                got.extend(chunk)

    reading = threading.Thread(target=receive, daemon=True)
    reading.start()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, *receiver.getsockname())
    error: Exception | None = None
    try:
        await body.send_to(transport, count)
    except Exception as exc:
        error = exc
    finally:
        transport.close()
        body.close()
        await asyncio.to_thread(reading.join, 10)
        receiver.close()
    return _Spliced(bytes(got), body.sent, error)


def test_a_silent_storage_fails_the_body_after_its_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """A storage that stops sending mid-body fails the body after ``STORAGE_STALL`` (a real
    deadline: 0.3 s here), the bytes it sent delivered and counted."""
    monkeypatch.setattr(_splice, "STORAGE_STALL", 0.3)
    data = os.urandom(300 << 10)
    storage = _Storage(data, 100 << 10, 0.0, stall=True)
    try:
        out = asyncio.run(_splice_to_client(storage, len(data) + 1))
    finally:
        storage.stop()
    assert isinstance(out.error, ObjectStoreError) and "nothing for" in str(out.error)
    assert out.got == data and out.sent == len(data)


@pytest.mark.parametrize("length", ["12a", "-1", "\u00b2"])
def test_a_malformed_content_length_of_the_storage_is_a_storage_error(length: str) -> None:
    """A storage (or a proxy before it) answering ``Content-Length: 12a`` made the splice
    data plane raise an untyped ValueError; it is a storage that failed, as any answer
    that is not HTTP."""
    storage = _Storage(b"x" * 12, 12, 0.0, length=length)
    try:
        with pytest.raises(ObjectStoreError, match="Content-Length"):
            _splice.StorageBody.connect(storage.url, None, '"e"', "GET test", "b/blobs/x")
    finally:
        storage.stop()


def test_a_warm_get_asks_the_storage_for_its_bytes_alone(served: Served, tmp_path: Path) -> None:
    """Within the ref TTL a replica that served a blob answers each further GET (whole or
    ranged) with one GET of the storage, its bytes: no HEAD, no check or cut record read,
    no ref or tree read per request (the warm fleet's floor is direct S3 GETs)."""
    server = MirrorServer(served.store.url, tmp_path / "logs", env=served.env,
                          extra_args=("--ref-ttl", "600"))  # fmt: skip
    try:
        warm = Served(served.store, server, served.storage, served.data, served.bad_name)
        data = served.data[1:] + served.data[:1]
        # learns the ref, tree, blob, check record, and (a range) the blob's cut record
        assert _get(warm, None, path="warm.bin") == (200, data)
        assert _get(warm, "bytes=1-", path="warm.bin") == (206, data[1:])
        before = len(served.storage.exchanges)
        assert _get(warm, None, path="warm.bin") == (200, data)
        assert _get(warm, "bytes=1048576-", path="warm.bin") == (206, data[1 << 20 :])
        assert _get(warm, None, path="warm.bin") == (200, data)
        asked = [(e.request.method, e.request.key) for e in served.storage.exchanges[before:]]
        where = served.store.objects.location
        assert asked == [("GET", f"/{where.bucket}/{where.key(served.blobs['warm.bin'])}")] * 3
    finally:
        server.stop()


def _stalled_reader(served: Served, path: str, start: int | str) -> socket.socket:
    """A client that asks for bytes ``start-`` of ``path`` (or the ranges ``start`` names),
    reads the answer's head, then reads nothing more (its receive buffer small, so the
    server's sends soon block)."""
    ranges = f"{start}-" if isinstance(start, int) else start
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TEST_DEADLINE)
    sock.connect((served.server.host, served.server.port))
    sock.sendall(
        f"GET /{HUGE}/resolve/main/{path} HTTP/1.1\r\nHost: x\r\nRange: bytes={ranges}\r\n\r\n"
        .encode()
    )  # fmt: skip
    return sock


def _head(sock: socket.socket) -> bytes:
    seen = b""
    while b"\r\n\r\n" not in seen:
        more = sock.recv(4096)
        assert more, "the server closed the connection before the head"
        seen += more
    return seen.split(b"\r\n", 1)[0]


@pytest.fixture(scope="module")
def huge(served: Served, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of ``huge.bin`` in the repo :data:`HUGE`: far more than the sockets'
    buffers and a pipe hold."""
    src = tmp_path_factory.mktemp("huge")
    data = os.urandom(24 << 20)
    (src / "huge.bin").write_bytes(data)
    served.store.add_folder(src, HUGE)
    return data


def test_clients_that_read_nothing_never_hold_back_another_answer(
    served: Served, huge: bytes, tmp_path: Path
) -> None:
    """More stalled readers of large spliced bodies than the splice pool has threads (two,
    here): each still gets its head, and another client then gets a large body whole. A
    client that reads nothing holds no thread (its body waits on the event loop for its
    socket), and a busy pool sends through Python rather than queue an answer's headers."""
    data = huge
    env = {**served.env, _splice.THREADS_ENV: "2"}
    server = MirrorServer(served.store.url, tmp_path / "logs", env=env)
    stalled: list[socket.socket] = []
    try:
        small = Served(served.store, server, served.storage, data, served.bad_name)
        assert _get(small, None, path="huge.bin", repo=HUGE) == (200, data)  # known good from now
        for i in range(6):
            stalled.append(_stalled_reader(small, "huge.bin", i * 150_000))
        assert [_head(s) for s in stalled] == [b"HTTP/1.1 206 Partial Content"] * 6
        assert _get(small, None, path="huge.bin", repo=HUGE) == (200, data)
        assert _get(small, "bytes=5000000-", path="huge.bin", repo=HUGE) == (206, data[5_000_000:])
    finally:
        for sock in stalled:
            sock.close()
        server.stop()
    assert "Traceback" not in server.stderr_path.read_text()


def test_multi_range_answers_at_once_are_bounded(served: Served, huge: bytes) -> None:
    """A multi-range body streams through Python: a worker sends at most
    ``MAX_MULTI_RANGE`` at once, and one more answers ``503 MultiRangeBusy`` with
    ``Retry-After`` until one of them ends."""
    most = _send.MAX_MULTI_RANGE
    ranges = "0-8388607,9000000-17388607"  # 16 MiB: the sends block on the full sockets
    stalled = [_stalled_reader(served, "huge.bin", ranges) for _ in range(most)]
    try:
        heads = [_head(s) for s in stalled]
        assert heads == [b"HTTP/1.1 206 Partial Content"] * most
        conn = http.client.HTTPConnection(served.server.host, served.server.port, timeout=30)
        conn.request("GET", f"/{HUGE}/resolve/main/huge.bin", headers={"Range": f"bytes={ranges}"})
        busy = conn.getresponse()
        assert busy.status == 503, busy.status
        assert busy.getheader("X-Error-Code") == "MultiRangeBusy"
        assert busy.getheader("Retry-After") == _send.MULTI_RANGE_RETRY
        conn.close()
        # a single range is no multi-range body: still answered
        assert _get(served, "bytes=0-99", path="huge.bin", repo=HUGE) == (206, huge[:100])
    finally:
        for sock in stalled:
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            sock.close()  # a reset: the server's next write fails
    two = [(0, 99), (1000, 1099)]
    asked = {"Range": "bytes=" + ",".join(f"{a}-{b}" for a, b in two)}

    def answered() -> bool:
        c = http.client.HTTPConnection(served.server.host, served.server.port, timeout=30)
        try:
            c.request("GET", f"/{HUGE}/resolve/main/huge.bin", headers=asked)
            r = c.getresponse()
            body = r.read()
        finally:
            c.close()
        return r.status == 206 and all(huge[a : b + 1] in body for a, b in two)

    wait_for(answered, "a multi-range answer once the stalled ones left")


def test_a_cancelled_body_keeps_its_client_descriptor_until_its_move_ends() -> None:
    """A body whose handler is cancelled while a thread moves its bytes: the duplicate of
    the client's descriptor that thread writes to stays open (the same socket) until the
    move returns, so it can never write into a descriptor reused meanwhile."""

    async def scenario() -> tuple[int, int | str]:
        receiver = socket.create_server(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(asyncio.Protocol, *receiver.getsockname())
        ours = os.fstat(transport.get_extra_info("socket").fileno()).st_ino
        started, release = threading.Event(), threading.Event()
        seen: list[int | str] = []

        def move(client: int, count: int) -> int:
            started.set()
            release.wait(TEST_DEADLINE)
            try:
                seen.append(os.fstat(client).st_ino)
            except OSError as exc:
                seen.append(f"{exc.strerror}")
            return count

        task = asyncio.ensure_future(_splice.to_client(transport, move, 10))
        await asyncio.to_thread(started.wait, TEST_DEADLINE)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for _ in range(4):  # descriptors closed and opened meanwhile may reuse its number
            os.close(os.open(os.devnull, os.O_RDONLY))
        release.set()
        await asyncio.to_thread(lambda: wait_for(lambda: seen, "the move to end"))
        transport.close()
        receiver.close()
        return ours, seen[0]

    ours, seen = asyncio.run(scenario())
    assert seen == ours


def test_a_busy_splice_pool_streams_a_body_rather_than_queue_it(
    served: Served, huge: bytes, tmp_path: Path
) -> None:
    """With every splice thread taken (one, here, waiting for a storage answer held back),
    a large body is streamed through Python at once instead of waiting for a thread; the
    held body is then sent whole too."""
    held, release = threading.Event(), threading.Event()

    def hook(request: S3Request) -> Fault | None:
        spliced = request.method == "GET" and request.header("User-Agent") == "cmh"
        if spliced and "/blobs/" in request.key and not release.is_set():
            held.set()
            release.wait(TEST_DEADLINE)
        return None

    storage = S3Proxy(served.storage.endpoint, hook=hook)
    env = {**served.env, "AWS_ENDPOINT_URL": storage.endpoint, _splice.THREADS_ENV: "1"}
    server = MirrorServer(served.store.url, tmp_path / "logs", env=env)
    try:
        busy = Served(served.store, server, storage, huge, served.bad_name)
        assert _get(busy, "bytes=0-99", path="huge.bin", repo=HUGE) == (206, huge[:100])
        first: list[tuple[int, bytes | str]] = []
        waiting = threading.Thread(
            target=lambda: first.append(_get(busy, None, path="huge.bin", repo=HUGE))
        )
        waiting.start()
        try:
            assert held.wait(TEST_DEADLINE)  # the pool's one thread waits for the storage
            got = _get(busy, "bytes=1048576-", path="huge.bin", repo=HUGE)
            assert got == (206, huge[1 << 20 :])
        finally:
            release.set()
            waiting.join(TEST_DEADLINE)
        assert first == [(200, huge)]
    finally:
        server.stop()
        storage.stop()
