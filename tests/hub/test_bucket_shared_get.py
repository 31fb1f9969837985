"""Issue 37: proxied bodies of one object version that a worker sends at once share one
storage GET (spec/hub-mirror.md 7.6, "Shared reads"), each body at its own pace, and a
storage cut reaches every body that shared it as a cut.

Real storages (the three S3 kinds) and ``cmh serve``; a pass-through proxy in front of the
storage counts the spliced GETs of blobs (``User-Agent: cmh``) and pauses their answers
midway, so that the clients of a test are all in flight at once, whatever the machine's
speed."""

from __future__ import annotations

import http.client
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from bucket_support import (
    S3_KINDS,
    Break,
    Fault,
    S3Proxy,
    S3Request,
    aws_env_applied,
    isolated_aws_env,
)
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from deadline_support import TEST_DEADLINE
from mirror_support import MirrorServer, wait_for
from seaweed import SeaweedBucket

REPO = "cmh-test/shared"
SIZE = 24 << 20  # well past the sockets' buffers and several punched holes


@dataclass
class Gate:
    """Counts the spliced GETs of blobs and gives each the next of ``faults`` (held until
    ``release``)."""

    faults: list[Fault] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    spliced: list[str] = field(default_factory=list)

    def hook(self, request: S3Request) -> Break | None:
        if request.method != "GET" or "/blobs/" not in request.key:
            return None
        if request.header("User-Agent") != "cmh":
            return None
        self.spliced.append(request.key)
        if not self.faults:
            return None
        return Break(self.faults.pop(0), before_cut=lambda: self.release.wait(TEST_DEADLINE))


@dataclass
class Shared:
    server: MirrorServer
    gate: Gate
    data: bytes
    storage: S3Proxy


@pytest.fixture
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shared]:
    kind = getattr(request, "param", "seaweed")
    bucket: SeaweedBucket = request.getfixturevalue(f"{kind}_bucket")
    env = isolated_aws_env(bucket, tmp_path)
    gate = Gate()
    storage = S3Proxy(bucket.endpoint, hook=gate.hook)  # type: ignore[arg-type]
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(SIZE)
    (src / "big.bin").write_bytes(data)
    with aws_env_applied(env):
        BucketStore.open(bucket.url).add_folder(src, REPO)
    served_env = {**os.environ, **env, "AWS_ENDPOINT_URL": storage.endpoint}
    server = MirrorServer(bucket.url, tmp_path / "logs", env=served_env)
    try:
        yield Shared(server, gate, data, storage)
    finally:
        gate.release.set()
        server.stop()
        storage.stop()


@dataclass
class Client:
    """One GET in a thread: ``headed`` once its answer's head came, then the body read
    (``pace`` waited on after its first ``pause_at`` bytes, when given; ``paused`` set
    then)."""

    shared: Shared
    rng: str | None = None
    pace: threading.Event | None = None
    pause_at: int = 64 << 10
    paused: threading.Event = field(default_factory=threading.Event)
    headed: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    status: int = 0
    body: bytes | str = b""

    def start(self) -> Client:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        server = self.shared.server
        kind = http.client.HTTPConnection if self.pace is None else _SmallWindow
        conn = kind(server.host, server.port, timeout=TEST_DEADLINE)
        try:
            headers = {"Range": self.rng} if self.rng else {}
            conn.request("GET", f"/{REPO}/resolve/main/big.bin", headers=headers)
            r = conn.getresponse()
            self.status = r.status
            self.headed.set()
            got = b""
            if self.pace is not None:
                got = r.read(self.pause_at)
                self.paused.set()
                self.pace.wait(TEST_DEADLINE)
            try:
                self.body = got + r.read()
            except http.client.IncompleteRead:
                self.body = "IncompleteRead"
        except Exception as exc:  # reported through ``body``
            self.body = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
            self.done.set()

    def result(self) -> tuple[int, bytes | str]:
        assert self.done.wait(TEST_DEADLINE), "the GET did not end"
        return self.status, self.body


class _SmallWindow(http.client.HTTPConnection):
    """A connection whose receive buffer is 256 KiB (no autotuning): a client that stops
    reading stops the server's sending within a few MiB (this machine's receive buffers
    may otherwise grow to 32 MiB, past a whole test blob)."""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)
        sock.settimeout(self.timeout)
        sock.connect((self.host, self.port))
        self.sock = sock


def _warm(shared: Shared) -> None:
    """One GET that learns the ref, the tree and the blob (and that its version is good)."""
    assert Client(shared).start().result() == (200, shared.data)


def _in_flight(shared: Shared, *clients: Client) -> None:
    """Start ``clients`` and wait until each has its answer's head."""
    for c in clients:
        c.start()
    for c in clients:
        assert c.headed.wait(TEST_DEADLINE), "no answer head"


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the server's workers are its children)."""
    found, todo = [], [pid]
    while todo:
        at = todo.pop()
        found.append(at)
        for task in Path(f"/proc/{at}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                continue
    return found


def _shared_file_bytes(server: MirrorServer) -> list[int]:
    """The bytes on disk of each unnamed temporary file the server's processes hold
    (``O_TMPFILE``: named ``#inode (deleted)``; a file open several times counts once)."""
    sizes: dict[tuple[int, int], int] = {}
    for pid in _tree(server.process.pid):
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                link = os.readlink(fd)
                if Path(link).name.startswith("#") and link.endswith("(deleted)"):
                    st = os.stat(fd)
                    sizes[(st.st_dev, st.st_ino)] = st.st_blocks * 512
            except OSError:
                continue
    return list(sizes.values())


def _no_shared_file_left(server: MirrorServer) -> bool:
    """The server holds no unnamed temporary file (every shared read was let go)."""
    return _shared_file_bytes(server) == []


@pytest.mark.parametrize("shared", S3_KINDS, indirect=True)
def test_bodies_of_one_version_at_once_share_one_storage_get(shared: Shared) -> None:
    """A body runs on its own GET; five more of the same blob (one a range) arrive while it
    runs: they share one GET, and every body is the stored bytes."""
    data = shared.data
    _warm(shared)
    before = len(shared.gate.spliced)
    # The lone GET pauses midway; the shared one is held before its first byte, so that
    # every body joins it however late it comes (a body arriving once a faster one has
    # sent, and so dropped, the read's first bytes starts a read of its own: by design,
    # and what a loaded machine once made of this test)
    shared.gate.faults[:] = [Fault.PAUSE, Fault.HOLD]
    first = Client(shared)
    _in_flight(shared, first)
    others = [Client(shared) for _ in range(4)] + [Client(shared, rng="bytes=1000-")]
    _in_flight(shared, *others)
    assert len(_shared_file_bytes(shared.server)) == 1  # the read's file, while it runs
    shared.gate.release.set()
    assert first.result() == (200, data)
    assert [c.result() for c in others] == [(200, data)] * 4 + [(206, data[1000:])]
    assert len(shared.gate.spliced) - before == 2
    wait_for(lambda: _no_shared_file_left(shared.server))
    # alone again: a GET of its own
    assert Client(shared).start().result() == (200, data)
    assert len(shared.gate.spliced) - before == 3


def test_a_storage_cut_in_a_shared_read_cuts_every_body_that_shared_it(shared: Shared) -> None:
    """The shared GET ends early: each of its bodies ends before its last byte (never a
    complete body of other bytes); the lone body beside it is whole, or cut too when it had
    moved onto the shared read; the next body is whole."""
    data = shared.data
    _warm(shared)
    shared.gate.faults[:] = [Fault.PAUSE, Fault.TRUNCATE]
    first = Client(shared)
    _in_flight(shared, first)
    others = [Client(shared) for _ in range(3)] + [Client(shared, rng="bytes=5-")]
    _in_flight(shared, *others)
    shared.gate.release.set()
    assert first.result() in ((200, data), (200, "IncompleteRead"))
    assert [c.result() for c in others] == [(200, "IncompleteRead")] * 3 + [(206, "IncompleteRead")]
    wait_for(lambda: _no_shared_file_left(shared.server))
    assert Client(shared).start().result() == (200, data)


def test_each_body_of_a_shared_read_goes_at_its_own_pace(shared: Shared) -> None:
    """A body whose client stops reading does not hold back the others of its read: one
    ends whole while the other still waits, then that one ends whole too."""
    data = shared.data
    _warm(shared)
    before = len(shared.gate.spliced)
    shared.gate.faults[:] = [Fault.PAUSE, Fault.HOLD]  # every body joins before a byte moves
    first = Client(shared)
    _in_flight(shared, first)
    fast_done = threading.Event()
    slow = Client(shared, pace=fast_done)
    fast = Client(shared)
    _in_flight(shared, slow, fast)
    shared.gate.release.set()
    assert fast.result() == (200, data)  # while ``slow`` has read 64 KiB
    assert not slow.done.is_set()
    fast_done.set()
    assert slow.result() == (200, data)
    assert first.result() == (200, data)
    assert len(shared.gate.spliced) - before == 2
    wait_for(lambda: _no_shared_file_left(shared.server))


def test_a_client_leaving_a_shared_read_leaves_the_others_whole(shared: Shared) -> None:
    """One client of a shared read closes its connection midway: the others of the read end
    whole, and once they have, the read's file is gone."""
    data = shared.data
    _warm(shared)
    shared.gate.faults[:] = [Fault.PAUSE, Fault.HOLD]  # every body joins before a byte moves
    first = Client(shared)
    _in_flight(shared, first)
    server = shared.server
    leaving = http.client.HTTPConnection(server.host, server.port, timeout=TEST_DEADLINE)
    leaving.request("GET", f"/{REPO}/resolve/main/big.bin")
    others = [Client(shared) for _ in range(2)]
    _in_flight(shared, *others)
    assert len(_shared_file_bytes(shared.server)) == 1  # they share a read
    answer = leaving.getresponse()
    assert answer.status == 200
    shared.gate.release.set()
    assert answer.read(1 << 20) == data[: 1 << 20]
    leaving.close()
    assert [c.result() for c in others] == [(200, data)] * 2
    assert first.result() == (200, data)
    wait_for(lambda: _no_shared_file_left(shared.server))


def test_a_body_on_its_own_get_moves_onto_a_shared_read_that_reached_it(shared: Shared) -> None:
    """The first body runs on its own GET, which the storage pauses halfway; a second body
    starts a shared read that runs ahead of it: the first moves onto that read, ends whole
    while its own GET is still paused, and closes that GET."""
    data = shared.data
    _warm(shared)
    before = len(shared.gate.spliced)
    shared.gate.faults[:] = [Fault.PAUSE]  # the lone GET only: the shared one runs free
    go_on, second_go_on = threading.Event(), threading.Event()
    first = Client(shared, pace=go_on)
    _in_flight(shared, first)
    second = Client(shared, pace=second_go_on)  # holds the read's bytes until told
    _in_flight(shared, second)
    go_on.set()
    assert first.result() == (200, data)  # its own GET never got past half the bytes
    shared.gate.release.set()

    def closed_early() -> list[S3Request]:
        return [r for r in shared.storage.left_early if "/blobs/" in r.key]

    wait_for(lambda: closed_early() != [])  # the paused GET's reader had gone
    assert len(closed_early()) == 1
    second_go_on.set()
    assert second.result() == (200, data)
    assert len(shared.gate.spliced) - before == 2
    wait_for(lambda: _no_shared_file_left(shared.server))


def test_a_shared_read_drops_the_bytes_every_body_sent(shared: Shared) -> None:
    """Two whole bodies of a shared read have each sent 16 of the blob's 24 MiB (a range
    from 16 MiB beside them; their clients stop reading there, with small windows, so
    neither body can end): the read's file keeps at most the last 8 MiB; then every body
    ends whole."""
    data = shared.data
    _warm(shared)
    go_on = threading.Event()
    beside = Client(shared, rng=f"bytes={16 << 20}-", pace=go_on)
    _in_flight(shared, beside)
    clients = [Client(shared, pace=go_on, pause_at=16 << 20) for _ in range(2)]
    _in_flight(shared, *clients)
    try:
        for c in clients:
            assert c.paused.wait(TEST_DEADLINE), "a client did not get 16 MiB"
        seen: list[list[int]] = [[]]

        def dropped() -> bool:
            seen[0] = _shared_file_bytes(shared.server)
            return [n <= 8 << 20 for n in seen[0]] == [True]

        try:
            wait_for(dropped)
        except AssertionError:
            raise AssertionError(f"the shared files' bytes on disk: {seen[0]}") from None
    finally:
        go_on.set()
    assert [c.result() for c in clients] == [(200, data)] * 2
    assert beside.result() == (206, data[16 << 20 :])
    wait_for(lambda: _no_shared_file_left(shared.server))
