"""Helpers for tests over real object storages (SeaweedFS, moto and ministack, all
started by the tests): which there are (:data:`S3_KINDS`), the AWS settings of one, a
store opened on it, a ref's whole history, and
:class:`S3Proxy`, a pass-through proxy in front of a storage that shows a test each
request and can break its answer."""

from __future__ import annotations

import contextlib
import http.client
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import pytest
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from deadline_support import TEST_DEADLINE

#: The S3 implementations a suite over buckets runs on, each ``{kind}_bucket`` a fixture
#: (a fresh prefix of the session's server).
S3_KINDS = ("seaweed", "moto", "ministack")


class Bucket(Protocol):
    """What ``seaweed_bucket``, ``moto_bucket``, ``ministack_bucket`` and
    ``no_cas_bucket`` have in common."""

    @property
    def url(self) -> str: ...

    def aws_env(self) -> dict[str, str]: ...


def isolated_aws_env(bucket: Bucket, folder: Path) -> dict[str, str]:
    """The AWS settings that reach ``bucket`` and nothing else: no profile files (named
    in ``folder``, never made), no instance role."""
    return {
        **bucket.aws_env(),
        "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def _set_aws_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def use_bucket(bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point this process's standard AWS settings at ``bucket`` (no profile files); the
    settings, for subprocesses."""
    env = isolated_aws_env(bucket, tmp_path)
    _set_aws_env(monkeypatch, env)
    return env


@contextlib.contextmanager
def aws_env_applied(env: dict[str, str]) -> Iterator[None]:
    """This process's AWS settings are ``env`` alone inside the block (``use_bucket``
    for a fixture without ``monkeypatch``, e.g. a module-scoped one)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _set_aws_env(monkeypatch, env)
        yield


def open_store(bucket: Bucket, **options: Any) -> BucketStore:
    return BucketStore.open(bucket.url, **options)


def history(
    store: BucketStore, folder: str, revision: str = "main", *, pruned: bool = False
) -> list[str]:
    """Every commit from the ref back to the root, newest first (with ``pruned``, back to
    the first whose parent's tree object a prune removed)."""
    ref = store.read_ref(folder, revision)
    out: list[str] = []
    commit = ref.commit if ref is not None else ""
    while commit:
        tree = store.read_tree(folder, commit)
        if tree is None and pruned and out:
            break
        out.append(commit)
        assert tree is not None, f"{commit} in the history of {revision} has no tree object"
        commit = tree.parents[0] if tree.parents else ""
    return out


@dataclass(frozen=True)
class S3Request:
    """One request :class:`S3Proxy` received, as it forwards it (the ``dropped`` headers
    already removed)."""

    method: str
    path: str
    headers: dict[str, str]

    @property
    def key(self) -> str:
        """The path without its query: ``/bucket/key``."""
        return self.path.partition("?")[0]

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), or None."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), None)


@dataclass(frozen=True)
class S3Exchange:
    """A request the storage answered, with its status and the body's length."""

    request: S3Request
    status: int
    body_bytes: int


class Fault(Enum):
    """What :class:`S3Proxy` does to an answer instead of passing it on."""

    #: The request is forwarded (the storage acts on it) and the connection closed with
    #: no answer, as when an answer is lost on the way.
    LOSE = "lose"
    #: The headers and half the body are sent, then the connection closed (as a storage
    #: does when the object is deleted while it is read).
    TRUNCATE = "truncate"
    #: The request is forwarded (the storage acts on it) and its answer passed on whole,
    #: late: once ``before_cut`` returned (an answer slow on its way back).
    LATE = "late"
    #: The headers and half the body are sent, then ``before_cut`` runs (it may block: a
    #: body paused midway), then the rest of the body.
    PAUSE = "pause"
    #: The headers are sent, then ``before_cut`` runs (it may block: a body held before its
    #: first byte), then the whole body.
    HOLD = "hold"
    #: The request's body reaches the storage with its middle byte inverted (a byte changed
    #: on the way, which a plain ``http://`` link does not catch), and the storage's answer
    #: is passed on.
    CORRUPT_SENT = "corrupt-sent"
    #: The answer's body reaches the client with its middle byte inverted (a byte changed
    #: on the way back).
    CORRUPT_ANSWER = "corrupt-answer"


@dataclass(frozen=True)
class Break:
    """A :class:`Fault` with what happens before it: ``before_cut`` runs once the
    storage answered and, for :attr:`Fault.TRUNCATE`, the headers were sent.
    ``applies`` sees the storage's status first: the answer is passed on untouched
    when it returns False (a fault decided by what the storage answered, not by what a
    test saw before the request went on)."""

    fault: Fault
    before_cut: Callable[[], object] = field(default=lambda: None)
    applies: Callable[[int], bool] = field(default=lambda status: True)


#: Sees each request before it is forwarded (it may block to hold it back); returns
#: a fault to inject in its answer, or None to pass the answer on.
S3Hook = Callable[[S3Request], Fault | Break | None]


class S3Proxy:
    """A pass-through HTTP proxy on 127.0.0.1 in front of the storage at ``upstream``.

    ``hook`` sees each request (method, path, headers) before it is forwarded: it may
    count or hold it, and return a :class:`Fault` (or a :class:`Break`) to inject in the
    answer (or to hold it back). ``dropped`` names request headers removed on the way
    (e.g. the conditional ones: a storage that ignores conditional writes; moto checks no
    signature, so the request stays valid). :attr:`exchanges` lists every request the
    storage answered."""

    def __init__(
        self, upstream: str, hook: S3Hook | None = None, dropped: frozenset[str] = frozenset()
    ) -> None:
        target = urlsplit(upstream)
        host, port = target.hostname or "127.0.0.1", int(target.port or 80)
        skipped = {"connection", *dropped}
        exchanges: list[S3Exchange] = []
        self.exchanges = exchanges
        left_early: list[S3Request] = []
        #: Requests whose reader closed the connection before the answer's body ended.
        self.left_early = left_early

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skipped}
                request = S3Request(self.command, self.path, headers)
                fault = hook(request) if hook is not None else None
                if isinstance(fault, Fault):
                    fault = Break(fault)
                if fault is not None and fault.fault is Fault.CORRUPT_SENT:
                    if body:
                        changed = bytearray(body)
                        changed[len(body) // 2] ^= 0xFF
                        body = bytes(changed)
                    fault = None
                conn = http.client.HTTPConnection(host, port, timeout=TEST_DEADLINE)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                exchanges.append(S3Exchange(request, resp.status, len(data)))
                if fault is not None and not fault.applies(resp.status):
                    fault = None
                if fault is not None and fault.fault is Fault.LOSE:
                    fault.before_cut()
                    self.close_connection = True  # acted on, never answered
                    return
                if fault is not None and fault.fault is Fault.LATE:
                    fault.before_cut()
                    fault = None
                if fault is not None and fault.fault is Fault.CORRUPT_ANSWER:
                    if data:
                        changed = bytearray(data)
                        changed[len(data) // 2] ^= 0xFF
                        data = bytes(changed)
                    fault = None
                head = self.command == "HEAD"
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                size = resp.getheader("Content-Length") if head else None
                self.send_header("Content-Length", size or str(len(data)))
                self.end_headers()
                try:
                    if fault is not None and fault.fault in (Fault.PAUSE, Fault.HOLD) and not head:
                        half = len(data) // 2 if fault.fault is Fault.PAUSE else 0
                        self.wfile.write(data[:half])
                        fault.before_cut()
                        self.wfile.write(data[half:])
                    elif fault is not None:  # Fault.TRUNCATE
                        fault.before_cut()
                        self.wfile.write(data[: len(data) // 2])
                        self.close_connection = True
                    elif not head:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    left_early.append(request)
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
