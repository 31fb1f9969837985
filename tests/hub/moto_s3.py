"""A real moto S3 server (``moto[server]``) on 127.0.0.1 for tests: a second S3
implementation beside SeaweedFS (tests/hub/seaweed.py), with conditional writes.

``moto_bucket`` (fixture): the session's server and bucket, a new empty prefix per
test, with the same interface as :class:`seaweed.SeaweedBucket` (``url``,
``endpoint``, ``aws_env()``). Skipped with a message only when moto is not installed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.error import URLError
from urllib.request import Request, urlopen

import pytest

BUCKET = "cmh-moto"
ACCESS_KEY = "cmh-moto-access"
SECRET_KEY = "cmh-moto-secret"
REGION = "us-east-1"
START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class MotoServer:
    """``python -m moto.server`` on a free 127.0.0.1 port, with :data:`BUCKET` created."""

    def __init__(self, log: Path) -> None:
        self.port = _free_port()
        self._log = open(log, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                urlopen(self.endpoint + "/", timeout=2).close()
                break
            except (URLError, OSError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not start: see {log}") from None
                time.sleep(0.2)
        urlopen(Request(f"{self.endpoint}/{BUCKET}", method="PUT"), timeout=10).close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


@dataclass
class MotoBucket:
    """The session bucket on a :class:`MotoServer` and a prefix no other test uses."""

    server: MotoServer
    name: str = BUCKET
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"s3://{self.name}/{self.prefix}"

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def aws_env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }


@pytest.fixture(scope="session", name="moto")
def moto_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One moto server for the test session, stopped at the end."""
    if importlib.util.find_spec("moto") is None:
        pytest.skip("moto is not installed (it comes with the dev extra: pip install -e '.[dev]')")
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="moto_bucket")
def moto_bucket_fixture(moto: MotoServer) -> MotoBucket:
    """The session's moto bucket and a new, empty prefix in it."""
    return MotoBucket(moto, BUCKET, f"t-{uuid.uuid4().hex[:12]}/")
