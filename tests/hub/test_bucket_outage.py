"""The storage dies in the middle of a ``cmh mirror add`` upload: a typed storage error
naming the endpoint and the operation, exit status 3, never a traceback; and no ref
names anything the storage does not hold.

A private SeaweedFS is killed (SIGKILL) once a given number of bytes of the upload went
through a byte-level TCP relay in front of it (so signatures stay valid and the moment
is exact); the relay then refuses connections, as a dead storage does.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from seaweed import start_or_skip


class Relay:
    """A TCP relay on 127.0.0.1 that calls ``on_bytes(total)`` as client bytes pass."""

    def __init__(self, port: int, trip_at: int, on_trip: object) -> None:
        self.upstream = port
        self.trip_at = trip_at
        self.on_trip = on_trip
        self.sent = 0
        self.tripped = threading.Event()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.tripped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if counted:
                    with self.lock:
                        self.sent += len(data)
                        trip = self.sent >= self.trip_at and not self.tripped.is_set()
                        if trip:
                            self.tripped.set()
                    if trip:
                        self.on_trip()  # type: ignore[operator]
                        self.close()
                        return
        except OSError:
            pass

    def close(self) -> None:
        self.tripped.set()
        for s in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


@pytest.mark.parametrize("trip_mib", [3, 13])
def test_storage_killed_mid_upload_is_a_typed_error(tmp_path: Path, trip_mib: int) -> None:
    server = start_or_skip(tmp_path / "weed")
    try:
        src = tmp_path / "src"
        src.mkdir()
        (src / "model.safetensors").write_bytes(os.urandom(24 << 20))  # multipart: 3 parts
        (src / "config.json").write_text("{}")
        s3_port = int(server.endpoint.rsplit(":", 1)[1])
        relay = Relay(s3_port, trip_mib << 20, lambda: server.process and server.process.kill())
        endpoint = f"http://127.0.0.1:{relay.port}"
        env = {**os.environ, **server.aws_env(tmp_path, endpoint)}
        proc = subprocess.run(
            [sys.executable, "-m", "cmh.cli.main", "mirror", "add", str(src), "--store",
             f"s3://{server.bucket}/outage/", "--repo", "o/n"],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
        assert relay.tripped.is_set()
        assert "Traceback" not in proc.stderr and "GeneratorExit" not in proc.stderr, proc.stderr
        assert proc.returncode == 3, proc.stderr
        assert proc.stderr.count("\n") <= 2, proc.stderr  # one line, not a dump
        assert "PUT" in proc.stderr and f"s3://{server.bucket}/outage/" in proc.stderr
        assert endpoint in proc.stderr  # which storage failed
        relay.close()
    finally:
        server.stop()


def test_an_upload_the_client_abandons_is_a_typed_error_not_generator_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fault injection at the one point the real kill above cannot reach on demand: the
    S3 client drops (closes) the chunk iterator before it reports the failed upload, as
    obstore does when the connection dies between parts. This used to re-raise the
    iterator's GeneratorExit as the error (a traceback ending in GeneratorExit)."""
    import obstore
    from cmh.hub.mirror.stores.bucket._objectstore import (
        Credentials,
        ObjectStore,
        ObjectStoreError,
        S3Location,
        S3Settings,
    )
    from obstore.exceptions import GenericError

    def dying_put(store: object, key: str, chunks: object, **options: object) -> None:
        it = iter(chunks)  # type: ignore[call-overload]
        next(it)
        it.close()  # type: ignore[attr-defined]
        raise GenericError("Generic S3 error: Error performing PUT http://127.0.0.1:9/x "
                           "in 1s - connection closed before message completed")  # fmt: skip

    monkeypatch.setattr(obstore, "put", dying_put)
    store = ObjectStore(
        S3Location("bucket-x", "p/"),
        S3Settings("http://127.0.0.1:9", "us-east-1", lambda: Credentials("key-id", "secret")),
    )
    with pytest.raises(ObjectStoreError) as info:
        store.put_stream("blob", iter([b"a" * 10, b"b" * 10]))
    assert "PUT s3://bucket-x/p/blob" in str(info.value)
    assert "connection closed" in str(info.value)
    assert (info.value.operation, info.value.endpoint) == ("PUT", "http://127.0.0.1:9")
    assert "http://127.0.0.1:9" in str(info.value)
