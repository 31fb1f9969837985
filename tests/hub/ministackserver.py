"""A real ministack S3 server on 127.0.0.1: the third S3 implementation of the suites.

ministack (PyPI, pure Python, MIT) pins its own ``botocore``, older than the one cmh's
venv needs, so it is installed apart, as old ``huggingface_hub`` releases are
(``client_versions.install_apart``): ``pip install --target
.s3-servers/ministack-{VERSION}`` at the repository root (gitignored) the first time a
test asks for it, and run as ``python -m ministack`` with that folder
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

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_versions import install_apart
from deadline_support import TEST_DEADLINE
from motoserver import ACCESS_KEY, SECRET_KEY, LocalS3Server, S3Bucket
from processes import on_a_free_port, start_server

VERSION = "1.5.33"
BUCKET = "cmh-ministack"
ROOT = Path(__file__).resolve().parents[2] / ".s3-servers"


def ministack_path() -> Path | None:
    """The folder holding ``ministack==VERSION`` and its dependencies (installed now if
    missing; ``None`` when it cannot be)."""
    return install_apart(f"ministack=={VERSION}", ROOT / f"ministack-{VERSION}")


class MiniStackServer(LocalS3Server):
    """ministack's S3 on a free 127.0.0.1 port with :data:`BUCKET` created."""

    bucket = BUCKET

    def __init__(self, installed: Path, log: Path) -> None:
        self.installed = installed
        self.log = log
        self.process = on_a_free_port(self._start)

    def _start(self, port: int) -> subprocess.Popen[bytes]:
        self.port = port
        installed, log = self.installed, self.log
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
        argv = [sys.executable, "-m", "ministack"]
        return start_server(argv, log, self.create_bucket, TEST_DEADLINE, env=env, cwd=scratch)


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
    return S3Bucket(ministack.endpoint, ministack.bucket, f"t-{uuid.uuid4().hex[:12]}/")
