"""A real ministack S3 server on 127.0.0.1: the third S3 implementation of the suites.

ministack (PyPI, pure Python, MIT) pins its own ``botocore``, older than the one cmh's
venv needs, so it is installed apart, as old ``huggingface_hub`` releases are
(``client_versions``): ``pip install --target .s3-servers/ministack-{VERSION}`` at the
repository root (gitignored) the first time a test asks for it, under a file lock (the
suite's workers may ask at once), and run as ``python -m ministack`` with that folder
first on ``PYTHONPATH``. ``None`` when it cannot be installed (no package index): the
caller skips.

:class:`MiniStackServer` runs it on a free 127.0.0.1 port with the S3 service alone
(its IoT and SFTP listeners, on by default and bound to every interface, are turned
off), objects in memory and the tests' identity as its root key (plain requests are
not checked; presigned URLs' signatures are), creates :data:`BUCKET` and stops the
process it started, which also dies with the process that started it.

Fixtures (from ``tests/hub/conftest.py``, so one server serves the session):
``ministack``, ``ministack_bucket`` (a fresh prefix, with ``.url`` and ``.aws_env()``
like ``moto_bucket``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.request import Request, urlopen

import pytest
from deadline_support import TEST_DEADLINE
from motoserver import ACCESS_KEY, SECRET_KEY, S3Bucket
from processes import stop_process

VERSION = "1.5.33"
BUCKET = "cmh-ministack"
ROOT = Path(__file__).resolve().parents[2] / ".s3-servers"


def ministack_path() -> Path | None:
    """The folder holding ``ministack==VERSION`` and its dependencies (installed now if
    missing; ``None`` when it cannot be)."""
    target = ROOT / f"ministack-{VERSION}"
    marker = target / ".installed"
    if marker.is_file():
        return target
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer; the others find its marker
        if marker.is_file():
            return target
        done = subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--no-warn-conflicts", "--target", str(target), f"ministack=={VERSION}",
            ],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            return None
        marker.write_text(VERSION + "\n")
    return target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class MiniStackServer:
    """ministack's S3 on a free 127.0.0.1 port with :data:`BUCKET` created."""

    def __init__(self, installed: Path, log: Path) -> None:
        self.port = _free_port()
        self.log = log
        scratch = log.parent / f"ministack-{self.port}"  # its PID file and temporary files
        scratch.mkdir(parents=True, exist_ok=True)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON"))},
            "PYTHONPATH": str(installed),
            # Its root identity: the one the tests sign with (:class:`S3Bucket`, as
            # moto's). Plain requests are not checked (no ``AUTH``); presigned URLs are.
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "GATEWAY_PORT": str(self.port),
            "BIND_HOST": "127.0.0.1",
            "MINISTACK_HOST": "127.0.0.1",
            "SERVICES": "s3",
            "IOT_MTLS_ENABLED": "0",  # else an MQTT listener on 0.0.0.0:8883
            "SFTP_ENABLED": "0",
            "S3_PERSIST": "0",
            "TMPDIR": str(scratch),
            "LOG_LEVEL": "WARNING",
        }
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ministack"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=scratch, preexec_fn=_die_with_parent,
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
                        f"ministack did not start: {log.read_text(errors='replace')[-2000:]}"
                    ) from exc
                time.sleep(0.2)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.process, grace=5)


@pytest.fixture(scope="session", name="ministack")
def ministack_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniStackServer]:
    """One ministack server for the session."""
    installed = ministack_path()
    if installed is None:
        pytest.skip(f"ministack=={VERSION} could not be installed (no package index?)")
    server = MiniStackServer(installed, tmp_path_factory.mktemp("ministack") / "ministack.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="ministack_bucket")
def ministack_bucket_fixture(ministack: MiniStackServer) -> S3Bucket:
    return S3Bucket(ministack.endpoint, BUCKET, f"t-{uuid.uuid4().hex[:12]}/")
