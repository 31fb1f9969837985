"""How much the resolver's connections ask of a socket per read (``_http.READ_BYTES``).

A plain connection asks 1 MiB (httpcore2 asks 64 KiB, each read going through h11 in
Python: a fresh 1 GiB download on loopback took 2.7 s instead of 1.6 s); a TLS one asks
what httpcore2 asks, since a TLS read returns one record whatever is asked and a larger
ask only costs a larger buffer per record. Real sockets on 127.0.0.1, real TLS (a
self-signed certificate made here); the backend under the resolver's records each ask.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore2
import pytest
from cmh.hub.resolver._http import READ_BYTES, _DeadlineBackend

PAYLOAD = b"x" * (4 << 20)


class _Recorded(httpcore2.NetworkStream):
    """A real stream whose reads' asks are written down (its TLS stream's too)."""

    def __init__(self, inner: httpcore2.NetworkStream, asks: list[tuple[str, int]], kind: str):
        self._inner, self.asks, self.kind = inner, asks, kind

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.asks.append((self.kind, max_bytes))
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore2.NetworkStream:
        return _Recorded(self._inner.start_tls(*args, **kwargs), self.asks, "tls")

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _RecordingBackend(httpcore2.NetworkBackend):
    def __init__(self) -> None:
        self.inner = httpcore2.SyncBackend()
        self.asks: list[tuple[str, int]] = []

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore2.NetworkStream:
        return _Recorded(self.inner.connect_tcp(*args, **kwargs), self.asks, "plain")


def _certificate(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def sender(tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext]]:
    """A loopback listener sending :data:`PAYLOAD` to each connection once it sent a byte,
    over TLS when that byte begins a TLS handshake; and a client context trusting it."""
    cert, key = _certificate(tmp_path)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    if conn.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS ClientHello
                        with server_context.wrap_socket(conn, server_side=True) as tls:
                            tls.sendall(PAYLOAD)
                    else:
                        conn.recv(1)  # taken: a close over unread bytes would be a reset
                        conn.sendall(PAYLOAD)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], ssl.create_default_context(cafile=str(cert))
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        listener.close()
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_plain_reads_ask_a_mebibyte_and_tls_reads_what_httpcore_asks(
    sender: tuple[int, ssl.SSLContext],
) -> None:
    port, client_context = sender
    recording = _RecordingBackend()
    backend = _DeadlineBackend(recording)

    plain = backend.connect_tcp("127.0.0.1", port, timeout=30)
    plain.write(b"p", timeout=30)  # the listener looks at a connection's first byte
    got = b""
    while len(got) < len(PAYLOAD):
        got += plain.read(64 << 10, timeout=30)
    plain.close()
    assert got == PAYLOAD
    assert recording.asks and all(ask == ("plain", READ_BYTES) for ask in recording.asks)
    assert READ_BYTES == 1 << 20

    recording.asks.clear()
    tls = backend.connect_tcp("127.0.0.1", port, timeout=30).start_tls(
        client_context, server_hostname="127.0.0.1", timeout=30
    )
    recording.asks.clear()  # the handshake's own reads are the ssl module's
    got = b""
    while len(got) < len(PAYLOAD):
        got += tls.read(64 << 10, timeout=30)
    tls.close()
    assert got == PAYLOAD
    assert recording.asks and all(ask == ("tls", 64 << 10) for ask in recording.asks)
