"""A real moto S3 server on 127.0.0.1, and a proxy that breaks a storage on purpose.

:class:`MotoServer` runs ``moto_server`` (PyPI ``moto[server]``, of the dev extra; a
version with conditional writes) on a free 127.0.0.1 port, creates a bucket and stops
the process it started. :class:`FaultyS3Proxy` forwards every request to an
endpoint with ``If-None-Match`` and ``If-Match`` removed: a storage that ignores
conditional writes, as moto 5.0.0 and some S3 gateways do. moto checks no signature,
so the requests stay valid once the headers are gone. With no header dropped it can
lose the answers of chosen requests instead (the storage acted on them).

Fixtures (from ``tests/hub/conftest.py``, so one server serves the session):
``moto``, ``moto_bucket`` (a fresh prefix, with ``.url`` and ``.aws_env()`` like
``seaweed_bucket``), ``no_cas_bucket`` (the same behind the proxy). A test that kills
its storage starts a :class:`MotoServer` of its own. The server dies with the process
that started it, also when that one is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import importlib.util
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.request import Request, urlopen

import pytest
from deadline_support import TEST_DEADLINE
from processes import stop_process

BUCKET = "cmh-moto"
ACCESS_KEY = "moto-access"
SECRET_KEY = "moto-secret"
REGION = "us-east-1"
DROPPED = frozenset({"if-none-match", "if-match"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def have_moto() -> bool:
    return importlib.util.find_spec("moto") is not None


# moto's server checks ``If-Match``/``If-None-Match`` and then writes, with no lock between
# (moto/s3/responses.py ``put_object``): two racing conditional PUTs can both succeed, which
# real S3 and SeaweedFS never let happen (a loaded machine showed it: one lost commit in 20
# racing pairs). So that moto stands for the conditional-write storage it emulates, its PUTs
# and DELETEs of objects are decided one at a time; everything else runs as moto runs it.
LAUNCHER = """
import sys, threading
from moto.s3.responses import S3Response
from moto.server import main

_decide = threading.Lock()

def _one_at_a_time(method):
    def run(self, *args, **kwargs):
        with _decide:
            return method(self, *args, **kwargs)
    return run

S3Response.put_object = _one_at_a_time(S3Response.put_object)
S3Response.delete_object = _one_at_a_time(S3Response.delete_object)
sys.exit(main(sys.argv[1:]))
"""


class MotoServer:
    """moto's server (its PUTs decided atomically, see :data:`LAUNCHER`) on a free
    127.0.0.1 port with :data:`BUCKET` created."""

    def __init__(self, log: Path) -> None:
        self.port = _free_port()
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, "-H", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + TEST_DEADLINE
        while True:
            try:
                urlopen(Request(f"{self.endpoint}/{BUCKET}", method="PUT"), timeout=5).read()
                return
            except OSError as exc:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"moto_server did not start: {log.read_text()[-2000:]}"
                    ) from exc
                time.sleep(0.2)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.process, grace=5)


class FaultyS3Proxy:
    """A pass-through HTTP proxy on 127.0.0.1 that removes the ``dropped`` request headers
    (the conditional-write ones by default). ``lose_answers`` counts down requests whose
    answer is lost: a request that :attr:`loses` accepts is forwarded (the storage acts on
    it) and the connection is closed with no answer. ``holds`` is called before a request
    is forwarded (a test blocks in it to hold that request back); a request ``truncates``
    accepts is answered with its headers and half its body, then the connection closed (as
    a storage does when the object is deleted while it is read)."""

    def __init__(
        self,
        upstream: str,
        dropped: frozenset[str] = DROPPED,
        loses: Callable[[str, str, dict[str, str]], bool] | None = None,
        holds: Callable[[str, str], None] | None = None,
        truncates: Callable[[str, str], bool] | None = None,
    ) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        target = (host, int(port))
        self.lose_answers = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
                if holds is not None:
                    holds(self.command, self.path)
                conn = http.client.HTTPConnection(*target, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                lose = loses is not None and loses(self.command, self.path, headers)
                if lose and proxy.lose_answers > 0:
                    proxy.lose_answers -= 1
                    self.close_connection = True  # acted on, never answered
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if truncates is not None and truncates(self.command, self.path):
                    self.wfile.write(data[: len(data) // 2])
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class S3Bucket:
    """A bucket behind an endpoint and a prefix no other test uses."""

    endpoint: str
    name: str
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.name}/{self.prefix}"

    def aws_env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }


@pytest.fixture(scope="session", name="moto")
def moto_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One moto server for the session."""
    if not have_moto():
        pytest.skip("moto is not installed (dev extra: pip install -e '.[dev]')")
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="moto_bucket")
def moto_bucket_fixture(moto: MotoServer) -> S3Bucket:
    return S3Bucket(moto.endpoint, BUCKET, f"t-{uuid.uuid4().hex[:12]}/")


@pytest.fixture(name="no_cas_bucket")
def no_cas_bucket_fixture(moto: MotoServer) -> Iterator[S3Bucket]:
    """moto behind :class:`FaultyS3Proxy`: a storage without conditional writes."""
    proxy = FaultyS3Proxy(moto.endpoint)
    try:
        yield S3Bucket(proxy.endpoint, BUCKET, f"t-{uuid.uuid4().hex[:12]}/")
    finally:
        proxy.stop()
