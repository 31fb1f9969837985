"""The helpers that start the tests' servers on a port picked free: a port taken between
the pick and the server's bind (another process's ``bind(0)`` on a busy machine) is picked
again, and another server found on it is not taken for the one started."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.request import urlopen

import motoserver
import nginx_support
import processes
import pytest
from deadline_support import TEST_DEADLINE
from motoserver import MotoServer, have_moto


@pytest.fixture
def first_pick(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``first_pick(port)``: the next port picked free is ``port``; the picks after it are
    free ones."""
    picks: list[int] = []
    real = processes.free_port

    def pick() -> int:
        return picks.pop() if picks else real()

    monkeypatch.setattr(processes, "free_port", pick)
    for module in (motoserver, nginx_support):  # where a helper took it by name
        monkeypatch.setattr(module, "free_port", pick, raising=False)
    return picks.append


def test_moto_started_on_a_port_taken_meanwhile_starts_on_another(
    first_pick: Callable[[int], None], tmp_path: Path
) -> None:
    if not have_moto():
        pytest.skip("moto is not installed (dev extra: pip install -e '.[dev]')")
    with socket.socket() as holder:  # bound by someone else: moto's bind fails
        holder.bind(("127.0.0.1", 0))
        taken = int(holder.getsockname()[1])
        first_pick(taken)
        server = MotoServer(tmp_path / "moto.log")  # was: RuntimeError, moto did not start
    try:
        assert server.port != taken
        with urlopen(f"{server.endpoint}/{server.bucket}", timeout=TEST_DEADLINE) as answer:
            assert answer.status == 200
    finally:
        server.stop()


def test_nginx_is_not_taken_for_another_server_on_its_port(
    first_pick: Callable[[int], None], tmp_path: Path
) -> None:
    """The port picked for nginx serves something else by the time nginx binds (another
    test's server): the start waits for an answer from nginx, so it starts it on another
    port instead of returning with the other server taken for it."""
    if nginx_support.find_nginx() is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    store = tmp_path / "store"
    store.mkdir()
    other = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        first_pick(other.server_address[1])
        nginx = nginx_support.Nginx(store, "127.0.0.1:9", tmp_path / "nginx")
        try:
            assert nginx.port != other.server_address[1]
            with socket.create_connection(("127.0.0.1", nginx.port), TEST_DEADLINE) as s:
                s.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert b"Server: nginx" in s.recv(4096)
        finally:
            nginx.stop()
    finally:
        other.shutdown()
        other.server_close()
        thread.join(TEST_DEADLINE)
