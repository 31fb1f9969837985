"""Issue 37: a folder store's body leaves by ``sendfile`` with no event-loop work per
socket buffer, every large body of a worker from one sender thread (nginx's loop:
non-blocking calls in turn, one wait for room), and every way a body ends stays exact:
ranges, a file that shrinks, a client that leaves, a handler cancelled mid-body.

A real aiohttp server (tests/hub/loop_server.py) sends a real file with
:func:`cmh.hub.mirror._send.send_body`; the clients are raw sockets on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import itertools
import os
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cmh.hub.mirror import _send
from cmh.hub.mirror._ranges import parse_range
from cmh.hub.mirror._send import BodyCut, ClientLeft, frame, open_blob, send_body
from loop_server import LoopServer

SIZE = 96 << 20  # 24 times what a loopback socket buffer holds at most (tcp_wmem 4 MiB)


class FileServer(LoopServer):
    """Sends one file, whole or by ranges; counts its loop's turns while each body goes."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.turns = 0
        self.outcomes: list[tuple[str, int, int]] = []  # (how it ended, bytes sent, turns)
        self.on_prepared: Any = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.socket_after: list[tuple[bool, bytes]] = []  # (blocking, SO_SNDTIMEO) after a body

    async def on_start(self) -> None:
        selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
        select = selector.select

        def counting(timeout: float | None = None) -> Any:
            self.turns += 1
            return select(timeout)

        selector.select = counting

    async def handler(self, request: web.Request) -> web.StreamResponse:
        size = self.path.stat().st_size
        response, pieces, tail = frame({}, parse_range(request.headers.get("Range"), size), size)
        f = open_blob(self.path, size)
        before = self.turns
        task = asyncio.current_task()
        assert task is not None
        self.tasks.append(task)
        try:
            sent = await send_body(request, response, f, pieces, tail)
            self.outcomes.append(("sent", sent, self.turns - before))
            transport = request.transport
            if transport is not None and not transport.is_closing():  # kept alive
                sock = transport.get_extra_info("socket")
                timeout = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16)
                self.socket_after.append((os.get_blocking(sock.fileno()), timeout))
        except (BodyCut, ClientLeft) as exc:
            self.outcomes.append((type(exc).__name__, exc.sent, self.turns - before))
        finally:
            f.close()
        return response


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("send") / "big.bin"
    with open(path, "wb") as f:
        for _ in range(SIZE >> 20):
            f.write(os.urandom(1 << 20))
    return path


def _get(server: FileServer, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/", headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def test_a_large_body_takes_no_loop_turn_per_socket_buffer(big: Path) -> None:
    with FileServer(big) as server:
        status, _, body = _get(server)
        assert status == 200 and hashlib.sha256(body).digest() == _digest(big)
        ((how, sent, turns),) = server.outcomes
        assert how == "sent" and sent == SIZE
        # loop.sendfile woke the loop once per socket buffer at least: >= 24 turns here
        assert turns < 12, turns


def _three_bodies_at_once(server: FileServer) -> None:
    """Three GETs of the file under way at once (each waits for room), then drained one
    after the other."""
    host, port = server.url.removeprefix("http://").split(":")
    conns = [socket.create_connection((host, int(port)), timeout=30) for _ in range(3)]
    try:
        for s in conns:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(1 << 16).startswith(b"HTTP/1.1 200")
        for s in conns:
            s.shutdown(socket.SHUT_WR)
            while s.recv(1 << 20):
                pass
    finally:
        for s in conns:
            s.close()


def test_concurrent_bodies_leave_from_one_sender_thread_in_turn(
    big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int, int]] = []  # (thread, socket, count)
    real = os.sendfile

    def counted(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        if threading.current_thread().name.startswith("cmh-sendfile"):
            calls.append((threading.get_ident(), out_fd, count))
        return real(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", counted)
    with FileServer(big) as server:
        _three_bodies_at_once(server)
        assert [how for how, _, _ in server.outcomes] == ["sent"] * 3, server.outcomes
    # a thread per body before; now one, whose calls (at most CALL_MAX) interleave
    assert len({thread for thread, _, _ in calls}) == 1
    assert max(count for _, _, count in calls) <= _send.CALL_MAX
    order = [sock for _, sock, _ in calls]
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert len(set(order)) == 3 and switches >= 3, switches


def test_spans_sharing_the_sender_thread_take_shorter_calls_than_a_span_alone(
    big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []  # (socket, count) of the sender thread's calls
    real = os.sendfile

    def counted(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        if threading.current_thread().name.startswith("cmh-sendfile"):
            calls.append((out_fd, count))
        return real(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", counted)
    with FileServer(big) as server:
        status, _, body = _get(server)  # the only body under way
        assert status == 200 and len(body) == SIZE
        alone, calls[:] = list(calls), []
        _three_bodies_at_once(server)
        assert [how for how, _, _ in server.outcomes] == ["sent"] * 4, server.outcomes
    assert max(count for _, count in alone) == _send.CALL_MAX
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (sock, _) in enumerate(calls):
        first.setdefault(sock, i)
        last[sock] = i
    # the calls made while all three spans were under way (the first body's whole drain)
    shared = calls[max(first.values()) : min(last.values()) + 1]
    assert len(first) == 3 and sum(count for _, count in shared) > SIZE // 2, len(shared)
    assert max(count for _, count in shared) <= _send.SHARED_CALL_MAX < _send.CALL_MAX


def test_a_sender_thread_that_fails_cuts_its_bodies_and_is_replaced(
    big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = _send._Mux._step
    failed: list[bool] = []

    def fails_once(self: Any, *args: Any) -> None:
        if not failed:
            failed.append(True)
            raise RuntimeError("a bug in the sender thread")
        step(self, *args)

    monkeypatch.setattr(_send._Mux, "_step", fails_once)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the failure is expected
    with FileServer(big) as server:
        with pytest.raises((http.client.IncompleteRead, ConnectionError)):
            _get(server)  # cut, not left waiting on a thread that is gone
        status, _, body = _get(server)  # a new sender thread took over
        assert status == 200 and len(body) == SIZE
        assert [how for how, _, _ in server.outcomes] == ["sent"], server.outcomes


def test_a_keep_alive_connection_is_the_loop_s_again_after_a_body(big: Path) -> None:
    with FileServer(big) as server:
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            for _ in range(2):  # one connection, two bodies from the sender thread
                conn.request("GET", "/")
                response = conn.getresponse()
                assert response.status == 200 and len(response.read()) == SIZE
        finally:
            conn.close()
        # the sender thread made the socket blocking with a send timeout: both undone
        assert server.socket_after == [(False, bytes(16))] * 2, server.socket_after
        assert [how for how, _, _ in server.outcomes] == ["sent", "sent"]


def test_a_handler_cancelled_mid_body_ends_its_sendfile_at_once(big: Path) -> None:
    with FileServer(big) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            received = len(s.recv(1 << 16))
            (task,) = server.tasks
            server._loop.call_soon_threadsafe(task.cancel)  # as a server that stops
            while chunk := s.recv(1 << 20):  # the client goes on reading: the body stops
                received += len(chunk)
        # what the socket buffers held, not the rest of a CALL_MAX call
        assert received < 32 << 20, received


def test_large_ranges_are_the_file_s_bytes(big: Path) -> None:
    data = big.read_bytes()
    spans = [(5, 10 << 20), (SIZE - (9 << 20) - 3, SIZE - 2)]
    with FileServer(big) as server:
        status, headers, body = _get(server, {"Range": f"bytes={spans[0][0]}-{spans[0][1]}"})
        assert status == 206 and body == data[spans[0][0] : spans[0][1] + 1]
        assert headers["Content-Range"] == f"bytes {spans[0][0]}-{spans[0][1]}/{SIZE}"
        ranges = ",".join(f"{a}-{b}" for a, b in spans)
        status, headers, body = _get(server, {"Range": f"bytes={ranges}"})
        assert status == 206 and headers["Content-Type"].startswith("multipart/byteranges")
        for a, b in spans:
            assert f"Content-Range: bytes {a}-{b}/{SIZE}\r\n\r\n".encode() + data[a : b + 1] in body
        assert [how for how, _, _ in server.outcomes] == ["sent", "sent"]


def test_a_file_that_shrinks_mid_body_cuts_the_connection(tmp_path: Path) -> None:
    path = tmp_path / "shrinks.bin"
    path.write_bytes(os.urandom(64 << 20))
    with FileServer(path) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            received = s.recv(1 << 16)  # the server is mid-body: the socket buffers are full
            os.truncate(path, 16 << 20)
            while chunk := s.recv(1 << 20):  # ends: the connection is cut, not left open
                received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and len(body) < 64 << 20
        ((how, sent, _),) = server.outcomes
        assert how == "BodyCut" and sent == len(body)


def test_a_client_that_leaves_frees_its_sender_thread(big: Path) -> None:
    with FileServer(big) as server:
        host, port = server.url.removeprefix("http://").split(":")
        for _ in range(_send.SENDER_SPANS + 1):  # one more than there are threads
            with socket.create_connection((host, int(port)), timeout=30) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(1 << 16).startswith(b"HTTP/1.1 200")
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
        status, _, body = _get(server)  # a body after them still leaves from a thread
        assert status == 200 and len(body) == SIZE
        left = [(sent, turns) for how, sent, turns in server.outcomes if how == "ClientLeft"]
        whole = [turns for how, sent, turns in server.outcomes if how == "sent" and sent == SIZE]
        assert len(left) == _send.SENDER_SPANS + 1 and len(whole) == 1, server.outcomes
        # Cut before the end. Not necessarily after some body bytes: the corked headers
        # leave alone once the cork's 200 ms pass before the sender's first call (a busy
        # machine), and that call then meets the reset with nothing sent.
        assert all(0 <= sent < SIZE for sent, _ in left)
        assert whole[0] < 12, whole  # not through the loop: every thread was given back


def test_with_every_sender_thread_busy_a_body_goes_through_the_loop(big: Path) -> None:
    taken = [_send._SENDERS.take() for _ in range(_send.SENDER_SPANS)]
    try:
        assert all(t is not None for t in taken) and _send._SENDERS.take() is None
        with FileServer(big) as server:
            status, _, body = _get(server)
            assert status == 200 and hashlib.sha256(body).digest() == _digest(big)
            assert server.outcomes[0][:2] == ("sent", SIZE)
    finally:
        for t in taken:
            if t is not None:
                t[1].release()


def _digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.digest()
