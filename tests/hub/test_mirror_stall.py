"""A client that stops reading a body is cut at the body's total deadline: it cannot hold
its connection, nor a sender slot, for ever.

A real ``cmh serve`` on a folder store, or on a bucket store on SeaweedFS (proxy: spliced
or streamed bodies); raw sockets with a small receive buffer ask for a
file far larger than the socket buffers and then never read. More of them than the
worker's sender thread has slots (``SENDER_SPANS``), so a folder store's bodies stall
both in that thread and on the loop (the spans that found no free slot). The deadline is
crossed by moving the server's clock (``CMH_TEST_CLOCK_FILE``), not by waiting for it.
"""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from bucket_support import aws_env_applied, isolated_aws_env
from cmh.hub.mirror._connections import STALLED_CUT, send_allowance
from cmh.hub.mirror._send import SENDER_SPANS, THREADED_MIN
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from deadline_support import TEST_DEADLINE
from mirror_support import MirrorServer, ProcessClock, wait_for
from seaweed import SeaweedBucket

REPO = "org/stall"
SIZE = 6 * THREADED_MIN  # far more than a loopback socket's buffers hold
STALLED = SENDER_SPANS + 4  # every sender slot taken, and a few bodies on the loop
TARGET = f"/{REPO}/resolve/main/big.bin"


@dataclass(frozen=True)
class Served:
    """A store holding the big file: where ``cmh serve`` finds it, in what environment."""

    store: Path | str
    env: dict[str, str]
    min_rate: int | None = None  # --min-send-rate (KiB/s); None: the default
    ranges: str | None = None  # the stalled requests' Range (several: a multipart body)


def _source(tmp_path: Path) -> tuple[Path, bytes]:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(SIZE)
    (src / "big.bin").write_bytes(data)
    return src, data


def _folder(tmp_path: Path, src: Path) -> Served:
    store = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "mirror", "add", str(src),
         "--store", str(store), "--repo", REPO, "--json"],
        capture_output=True, text=True, timeout=TEST_DEADLINE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Served(store, dict(os.environ))


def _bucket(request: pytest.FixtureRequest, tmp_path: Path, src: Path) -> Served:
    where: SeaweedBucket = request.getfixturevalue("seaweed_bucket")
    env = isolated_aws_env(where, tmp_path)
    with aws_env_applied(env):
        BucketStore.open(where.url).add_folder(src, REPO)
    keep = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return Served(where.url, {**keep, **env}, min_rate=1024)


@pytest.fixture(params=["folder", "bucket-spliced", "bucket-multipart"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Served, bytes]:
    """The big file in a folder store (served at the default rate), or a bucket store on
    SeaweedFS (proxied, at ``--min-send-rate 1024``: its deadline, then, comes before the
    default one): a whole body is spliced in the kernel, a multipart one streams through
    Python."""
    src, data = _source(tmp_path)
    if request.param == "folder":
        return _folder(tmp_path, src), data
    bucket = _bucket(request, tmp_path, src)
    if request.param == "bucket-multipart":
        bucket = replace(bucket, ranges="bytes=0-0,2-")
    return bucket, data


def _stalled(addr: tuple[str, int], ranges: str | None) -> tuple[socket.socket, int]:
    """A connection that asks for the big file, reads the answer's headers, then nothing;
    and how many body bytes came with the headers."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.settimeout(TEST_DEADLINE)
    s.connect(addr)
    asked = f"Range: {ranges}\r\n" if ranges else ""
    s.sendall(f"GET {TARGET} HTTP/1.1\r\nHost: x\r\n{asked}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1024)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 206" if ranges else b"HTTP/1.1 200"), head[:200]
    return s, len(head.split(b"\r\n\r\n", 1)[1])


def _cut(s: socket.socket) -> bool:
    """The server has reset ``s`` (looked at without reading: a read would take the body)."""
    poller = select.poll()
    poller.register(s, select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poller.poll(0))


def _drain(s: socket.socket) -> int:
    """The body bytes a reset ``s`` still holds (read until the reset)."""
    got = 0
    try:
        while data := s.recv(1 << 20):
            got += len(data)
    except OSError:  # the reset, once its bytes are read
        pass
    return got


def _refused(addr: tuple[str, int]) -> bool:
    """A new connection gets no answer to a plain request (the worker is at its cap)."""
    with socket.create_connection(addr, timeout=TEST_DEADLINE) as s:
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            return s.recv(1024) == b""
        except OSError:
            return True


def _get(addr: tuple[str, int], target: str) -> bytes:
    """A healthy client's whole answer to ``GET target`` (the server closes after it)."""
    with socket.create_connection(addr, timeout=TEST_DEADLINE) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(1 << 20):
            answer += chunk
    return answer


def test_stalled_bodies_are_cut_at_their_deadline_and_free_the_cap(
    served: tuple[Served, bytes], tmp_path: Path, process_clock: ProcessClock
) -> None:
    where, data = served
    args = ("--max-connections", str(STALLED))
    allowance = send_allowance(SIZE)
    if where.min_rate is not None:
        args += ("--min-send-rate", str(where.min_rate))
        allowance = send_allowance(SIZE, where.min_rate << 10)
        assert allowance + 5 < send_allowance(SIZE)  # only the option's rate cuts
    with MirrorServer(
        where.store,
        tmp_path / "logs",
        extra_args=args,
        clock=process_clock,
        env=where.env,
    ) as server:
        addr = (server.host, server.port)
        asked = time.monotonic()  # no body started before: none has an earlier deadline
        stalled, early = zip(*(_stalled(addr, where.ranges) for _ in range(STALLED)), strict=True)
        try:
            # every connection is busy sending a body: a newcomer cannot get in
            assert _refused(addr)
            # The server's clock is real time plus the offset: the seconds the connections
            # took (tens on a busy machine) already count towards the first deadlines.
            took = time.monotonic() - asked
            # 5 s before the first deadline nothing is cut: the guard's sweep runs every
            # second of real time (its timer is the loop's), so two go by, sleeping
            process_clock.advance(allowance - 5 - took)
            time.sleep(2.0)
            assert not any(_cut(s) for s in stalled)
            process_clock.advance(10 + took)  # past every body's deadline, the last one's too
            wait_for(lambda: all(_cut(s) for s in stalled), "the stalled bodies to be cut")
            # each was cut, never given a whole body; the handlers ended (sender slots free)
            received = [body + _drain(s) for body, s in zip(early, stalled, strict=True)]
            assert all(n < SIZE for n in received), received
            answer = _get(addr, TARGET)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            assert answer.split(b"\r\n\r\n", 1)[1] == data
            ended = server.log(target=TARGET, status=206 if where.ranges else 200)
            cut = [e for e in ended if e["bytes"] < SIZE]
            assert len(cut) == STALLED, ended
            # the access log says the mirror cut them, not that their clients went away
            assert {e.get("cut") for e in cut} == {STALLED_CUT}, cut
            metrics = _get(addr, "/metrics").decode()
            match = re.search(
                r'cmh_mirror_connections_dropped_total\{reason="stalled"\} ([0-9.e+]+)', metrics
            )
            assert match and float(match.group(1)) == STALLED, metrics[-2000:]
        finally:
            for s in stalled:
                s.close()


def test_a_min_send_rate_of_nothing_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(tmp_path),
         "--port", "0", "--min-send-rate", "0"],
        capture_output=True, text=True, timeout=TEST_DEADLINE,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--min-send-rate" in done.stderr


def test_a_whole_answer_left_unread_stays_counted_and_is_cut_at_its_deadline() -> None:
    """A whole answer is written after its handler returned (the connection is no longer
    busy). Left unread past the idle timeout it is not closed as idle (a close would wait
    for its bytes for ever, outside the cap's count): it stays counted, and is cut once
    past its body's deadline. A real loopback connection; the guard's clock is moved."""
    import asyncio

    from cmh.hub.cache import Clock
    from cmh.hub.mirror._connections import ConnectionGuard

    class Moved(Clock):
        shift = 0.0

        def monotonic(self) -> float:
            return time.monotonic() + self.shift

    clock = Moved()
    answer = 8 << 20  # far more than the small socket buffers below hold

    async def scenario() -> tuple[list[str], int, bool, list[str], int, bool]:
        loop = asyncio.get_running_loop()
        drops: list[str] = []
        guard = ConnectionGuard(8, 20.0, 30.0, drops.append, clock=clock)
        lost = asyncio.Event()

        class Answering(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                with guard.answering(transport):
                    pass  # a request answered; its whole answer is written after
                transport.write(b"x" * answer)  # type: ignore[attr-defined]

            def connection_lost(self, exc: Exception | None) -> None:
                lost.set()

        server = await loop.create_server(guard.wrap(Answering), "127.0.0.1", 0)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setblocking(False)
        try:
            await loop.sock_connect(client, server.sockets[0].getsockname())
            for _ in range(int(TEST_DEADLINE / 0.01)):
                if len(guard) == 1:
                    break
                await asyncio.sleep(0.01)
            clock.shift = 31.0  # past the idle timeout, far before the deadline
            guard.sweep()
            early = (list(drops), len(guard), lost.is_set())
            if early != ([], 1, False):
                return (*early, [], -1, False)  # closed or cut early: the test fails now
            # no deadline was started for it (no Content-Length seen): the sweep that found
            # it unsent started one, for the bytes left
            clock.shift = 31.0 + send_allowance(answer) + 1
            guard.sweep()
            await asyncio.wait_for(lost.wait(), TEST_DEADLINE)
            return (*early, list(drops), len(guard), lost.is_set())
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    early_drops, early_count, early_lost, drops, count, lost = asyncio.run(scenario())
    assert (early_drops, early_count, early_lost) == ([], 1, False)
    assert (drops, count, lost) == (["stalled"], 0, True)
