"""The smaller findings of issue 35: fill failures, control characters in names, the raw
parser's 400s, ``serve --upstream`` on storage without conditional writes.

Each test failed on the code before its fix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from bucket_support import use_bucket
from click.testing import CliRunner
from cmh.cli.main import cli
from deadline_support import TEST_DEADLINE
from hostile_upstream import BODY, HostileHub, Recorder
from mirror_support import MirrorServer


def _pull_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Path | str:
    if kind == "folder":
        (tmp_path / "pull").mkdir()
        return tmp_path / "pull"
    bucket = request.getfixturevalue("moto_bucket")
    use_bucket(bucket, tmp_path, request.getfixturevalue("monkeypatch"))
    return str(bucket.url)


# -- a failed fill with nothing sent -----------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "bucket"])
def test_a_fill_that_fails_before_its_first_byte_answers_502_in_the_hubs_shape(
    kind: str,
    mirror_server_factory: Callable[..., MirrorServer],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The upstream's file redirect is refused (a local address): no byte ever arrives.
    The answer is a 502 with ``X-Error-Code`` and a JSON ``error`` (the old code sent 200
    headers, then cut the empty body)."""
    store = _pull_store(kind, tmp_path, request)
    with Recorder("127.0.0.3") as local, HostileHub() as hub:
        hub.resolve_redirect = lambda method, path: f"{local.url}/cdn/{path}"
        pull = mirror_server_factory(store, extra_args=("--upstream", hub.url))
        url = f"{pull.url}/{hub.repo_id}/resolve/main/config.json"
        for headers in ({}, {"Range": "bytes=1-2"}):
            answer = httpx2.get(url, headers=headers, timeout=TEST_DEADLINE)
            assert answer.status_code == 502, (answer.status_code, answer.headers)
            assert answer.headers["X-Error-Code"] == "UpstreamProtocolError"
            assert "local address refused" in answer.json()["error"]
            assert "X-Cmh-Filling" not in answer.headers
        assert local.seen == []


# -- control characters in an upstream's names -------------------------------------------


NAMES = [
    "evil\r\nX-Injected: 1.txt",
    "line\nbreak.txt",
    "bell\x07.txt",
    "esc\x1b[31m.txt",
    "c1\x85.txt",
]


@pytest.mark.parametrize("name", NAMES)
def test_a_listed_name_with_a_control_character_never_reaches_a_cache(
    name: str, tmp_path: Path
) -> None:
    files = {"config.json": BODY, name: b"x"}
    with HostileHub(files=files) as hub:
        args = ["pull", hub.repo_id, "--endpoint", hub.url, "--cache-dir", str(tmp_path / "c")]
        result = CliRunner().invoke(cli, args, env={"HF_HOME": str(tmp_path / "hf")})
        assert result.exit_code == 3, result.output
        assert "control character" in result.output and "Traceback" not in result.output
    names = [p.name for p in tmp_path.rglob("*")]
    assert not any(any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in n) for n in names)


@pytest.mark.parametrize("kind", ["folder", "bucket"])
def test_the_mirror_refuses_a_listing_with_a_control_character(
    kind: str,
    mirror_server_factory: Callable[..., MirrorServer],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    store = _pull_store(kind, tmp_path, request)
    with HostileHub(files={"config.json": BODY, NAMES[0]: b"x"}) as hub:
        pull = mirror_server_factory(store, extra_args=("--upstream", hub.url))
        answer = httpx2.get(f"{pull.url}/api/models/{hub.repo_id}/tree/main", timeout=TEST_DEADLINE)
        assert answer.status_code == 502 and "control character" in answer.json()["error"]
        answer = httpx2.get(
            f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=TEST_DEADLINE
        )
        assert answer.status_code == 502
    if kind == "folder":
        assert not any("\r" in p.name or "\n" in p.name for p in Path(store).rglob("*"))


# -- the raw parser's 400s ---------------------------------------------------------------

SECRET = "hf_secret_in_a_broken_request_0001"
BROKEN = [
    f"GET /x HTTP/1.1\r\nAuthorization: Bearer {SECRET}\r\nBad Header<script>\r\n\r\n",
    f"GET /x<script>{SECRET} HTTP/9.9\r\nHost: a\r\n\r\n",
    f"GET /x HTTP/1.1\r\nAuthorization: Bearer {SECRET}\r\nContent-Length: {SECRET}\r\n\r\n",
    f"GET /x HTTP/1.1\r\nAuthorization : Bearer {SECRET}<script>\r\n\r\n",
]


def _raw(server: MirrorServer, data: bytes) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=TEST_DEADLINE) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_raw_parsers_400s_echo_nothing_and_log_no_request_bytes(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    (tmp_path / "store").mkdir()
    server = mirror_server_factory(tmp_path / "store")
    for request in BROKEN:
        answer = _raw(server, request.encode())
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        assert lines[0].split()[1] == "400", answer
        assert headers["x-content-type-options"] == "nosniff"
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-error-code"] == "BadRequest"
        assert SECRET.encode() not in answer and b"<script>" not in answer
        assert json.loads(body)["error"].startswith("Bad Request")
    assert (
        httpx2.get(f"{server.url}/api/models", timeout=TEST_DEADLINE).status_code == 200
    )  # still serving
    server.stop()
    logged = server.stderr_text() + server.access_log.read_text()
    assert SECRET not in logged and "Traceback" not in logged


# -- serve --upstream on storage without conditional writes ------------------------------


def test_serve_upstream_probes_the_storage_before_it_listens(
    no_cas_bucket: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``mirror add`` does: refused up front, exit 2, nothing listening (the old code
    started, reported healthy, and every fill answered 503)."""
    env = {**os.environ, **use_bucket(no_cas_bucket, tmp_path, monkeypatch)}  # type: ignore[arg-type]
    url = str(no_cas_bucket.url)  # type: ignore[attr-defined]
    args = [sys.executable, "-m", "cmh.cli.main", "serve", "--store", url, "--port", "0",
            "--host", "127.0.0.1", "--upstream", "http://127.0.0.1:9"]  # fmt: skip
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"serve started: {exc.stderr!r}") from None
    assert done.returncode == 2, done.stderr
    assert "does not honour conditional writes" in done.stderr
    assert "listening" not in done.stderr.lower()


# -- a forged fill record in the bucket ---------------------------------------------------


#: Records cmh would not write, each on a blob of TINY_REPO (main: version 2).
FORGED = {
    "config.json": (
        {"at": 1e12, "error": "failed for good"},
        b'{"model_type": "tiny", "version": 2}\n',
    ),
    "README.md": ({"at": "NOW", "error": "x", "extra": "a field cmh never writes"}, b"# tiny v2\n"),
    "sub/deeper/leaf.txt": (
        {"at": "NOW", "error": "\x1b[2J visit http://evil.example to fix this"},
        b"leaf 2\n",
    ),
}


def test_a_forged_failed_record_neither_fails_the_blob_nor_speaks_to_clients(
    mirror: MirrorServer,
    mirror_server_factory: Callable[..., MirrorServer],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Anyone with write access to the bucket can write ``.cmh/fills/{etag}/failed``: a
    record cmh would not write (from far ahead, with a field it never writes, with words
    it would not write) is ignored and the fill runs (the old code answered 502, with the
    record's words, to every request after its ``at``)."""
    import hashlib
    import time

    from cmh.hub.mirror import BucketStore
    from hublike import running
    from mirror_support import TINY_REPO

    location = _pull_store("bucket", tmp_path, request)
    store = BucketStore.open(str(location))
    for forged, data in FORGED.values():
        etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        fills = store.fill_name(BucketStore.folder(TINY_REPO, "model"), etag)
        doc = {k: (time.time() + 30 if v == "NOW" else v) for k, v in forged.items()}
        store.objects.put(f"{fills}/failed", json.dumps(doc).encode())
    with running(mirror.url, xet_listing=False) as hub:
        pull = mirror_server_factory(location, extra_args=("--upstream", hub.url))
        for path, (_, data) in FORGED.items():
            answer = httpx2.get(
                f"{pull.url}/{TINY_REPO}/resolve/main/{path}", timeout=TEST_DEADLINE
            )
            assert (answer.status_code, answer.content) == (200, data), (path, answer.text)
