"""A real moto S3 server on 127.0.0.1, and a proxy that breaks a storage on purpose.

:class:`MotoServer` runs ``moto_server`` (PyPI ``moto[server]``, of the dev extra; a
version with conditional writes) on a free 127.0.0.1 port, creates a bucket and stops
the process it started. ``no_cas_bucket`` puts a :class:`bucket_support.S3Proxy` in
front of it that removes ``If-None-Match`` and ``If-Match``: a storage that ignores
conditional writes, as moto 5.0.0 and some S3 gateways do. moto checks no signature,
so the requests stay valid once the headers are gone.

Fixtures (from ``tests/hub/conftest.py``, so one server serves the session):
``moto``, ``moto_bucket`` (a fresh prefix, with ``.url`` and ``.aws_env()`` like
``seaweed_bucket``), ``no_cas_bucket`` (the same behind the proxy). A test that kills
its storage starts a :class:`MotoServer` of its own. The server dies with the process
that started it, also when that one is SIGKILLed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.request import Request, urlopen

import pytest
from bucket_support import S3Proxy
from deadline_support import TEST_DEADLINE
from processes import on_a_free_port, start_server, stop_process

BUCKET = "cmh-moto"
ACCESS_KEY = "moto-access"
SECRET_KEY = "moto-secret"
REGION = "us-east-1"
DROPPED = frozenset({"if-none-match", "if-match"})


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


class LocalS3Server:
    """An S3 server this process started on 127.0.0.1 (:attr:`port`) with its
    :attr:`bucket`, which :meth:`create_bucket` creates."""

    bucket: str
    port: int
    process: subprocess.Popen[bytes]

    def create_bucket(self) -> None:
        """Create :attr:`bucket` (``OSError`` while the server does not answer)."""
        urlopen(Request(f"{self.endpoint}/{self.bucket}", method="PUT"), timeout=5).read()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.process, grace=5)


class MotoServer(LocalS3Server):
    """moto's server (its PUTs decided atomically, see :data:`LAUNCHER`) on a free
    127.0.0.1 port with :data:`BUCKET` created."""

    bucket = BUCKET

    def __init__(self, log: Path) -> None:
        self.log = log
        self.process = on_a_free_port(self._start)

    def _start(self, port: int) -> subprocess.Popen[bytes]:
        self.port = port
        return start_server(
            [sys.executable, "-c", LAUNCHER, "-H", "127.0.0.1", "-p", str(port)],
            self.log, self.create_bucket, TEST_DEADLINE,
        )  # fmt: skip


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
    """moto behind an :class:`S3Proxy` dropping the conditional headers: a storage
    without conditional writes."""
    proxy = S3Proxy(moto.endpoint, dropped=DROPPED)
    try:
        yield S3Bucket(proxy.endpoint, BUCKET, f"t-{uuid.uuid4().hex[:12]}/")
    finally:
        proxy.stop()
