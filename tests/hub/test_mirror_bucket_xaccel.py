# ruff: noqa: E501  (the client script below is kept one call per line)
"""``cmh serve --store s3://... --blob-delivery x-accel`` behind a real nginx: cmh decides
(auth, refs, checks), nginx moves the bytes from a real SeaweedFS to the client."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import http.server
import os
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from bucket_support import S3Proxy, S3Request, aws_env_applied, isolated_aws_env
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from cmh.hub.mirror.stores.bucket._xaccel import (
    CACHE_ZONE,
    DEFAULT_CACHE,
    nginx_bucket_location,
    nginx_bucket_server,
)
from mirror_support import (
    PRIVATE_REPO,
    PRIVATE_TOKEN,
    MirrorServer,
    ProcessClock,
    hf_env,
    run_python,
    write_tiny_repo,
)
from nginx_support import Nginx
from seaweed import SeaweedBucket, SeaweedServer

TINY = "cmh-test/xaccel-tiny"
REF_TTL = 60.0  # the replica's clock is moved past it to see a replaced object


@dataclass
class Front:
    store: BucketStore
    nginx: Nginx
    server: MirrorServer
    src: Path
    env: dict[str, str]
    clock: ProcessClock


@pytest.fixture(scope="module", params=["unbuffered", "cached"])
def front(
    request: pytest.FixtureRequest,
    seaweed: SeaweedServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Front]:
    """A bucket store with a tiny repo and a private one, one x-accel replica, nginx (its
    location unbuffered, or through its cache)."""
    where = SeaweedBucket(seaweed, seaweed.bucket, f"xaccel-{uuid.uuid4().hex[:10]}/")
    tmp = tmp_path_factory.mktemp("bucket-xaccel")
    env = isolated_aws_env(where, tmp)
    private = tmp / "private"
    private.mkdir()
    (private / "config.json").write_text('{"secret": true}\n')
    tokens = tmp / "tokens.txt"
    tokens.write_text(f"{PRIVATE_TOKEN}  {PRIVATE_REPO}\n")
    with aws_env_applied(env):
        store = BucketStore.open(where.url)
        src = write_tiny_repo(tmp / "tiny", 1)
        (src / "empty.txt").write_bytes(b"")  # a repo may hold an empty file
        store.add_folder(src, TINY)
        store.add_folder(private, PRIVATE_REPO)
        clock = ProcessClock(tmp / "clock")
        server = MirrorServer(where.url, tmp / "logs", tokens=tokens, env={**os.environ, **env},
                              clock=clock, extra_args=("--blob-delivery", "x-accel",
                                                       "--ref-ttl", str(REF_TTL)))  # fmt: skip
        try:
            nginx = Nginx(None, f"127.0.0.1:{server.port}", tmp / "nginx", storage=where.endpoint,
                          cache=request.param == "cached")  # fmt: skip
            try:
                yield Front(store, nginx, server, src, env, clock)
            finally:
                nginx.stop()
        finally:
            server.stop()


def _request(
    front: Front, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes | str]:
    """Status, headers and body; the body is the exception's name when it came incomplete."""
    conn = http.client.HTTPConnection("127.0.0.1", front.nginx.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        status, got = r.status, {k.lower(): v for k, v in r.getheaders()}
        try:
            return status, got, r.read()
        except http.client.IncompleteRead:
            return status, got, "IncompleteRead"
    finally:
        conn.close()


STOCK_SCRIPT = r"""
import json, os, hashlib
from huggingface_hub import hf_hub_download, snapshot_download
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
snap = snapshot_download(os.environ["T_TINY"])
print(json.dumps({"weights": sha(os.path.join(snap, "weights.bin")), "leaf": open(os.path.join(snap, "sub/deeper/leaf.txt")).read()}))
"""


def test_stock_client_loads_from_the_bucket_through_nginx(front: Front, tmp_path: Path) -> None:
    env = hf_env(front.nginx.url, tmp_path / "home")
    env["T_TINY"] = TINY
    out = run_python(STOCK_SCRIPT, env)
    assert out["weights"] == hashlib.sha256((front.src / "weights.bin").read_bytes()).hexdigest()
    assert out["leaf"] == "leaf 1\n"
    gets = front.server.log(route="resolve", method="GET")
    assert gets and all(e["bytes"] == 0 for e in gets if e["status"] == 200)  # nginx sent them


def test_an_empty_file_comes_whole_through_nginx(front: Front) -> None:
    """An empty blob is a 200 with no body, with the cache too (a slice's Range on an
    empty object is one the storage cannot satisfy)."""
    path = f"/{TINY}/resolve/main/empty.txt"
    for _ in range(2):
        status, headers, body = _request(front, path)
        assert (status, body) == (200, b""), (status, headers, body)
        assert headers["x-linked-size"] == "0" or "x-linked-size" not in headers


def test_a_range_cmh_answers_whole_comes_whole_through_nginx(front: Front) -> None:
    """A Range whose If-Range names another version is answered with the whole blob (RFC
    9110 13.1.5): cmh decides it, and nginx never sends a part of that blob (before, the
    unbuffered location passed the client's Range to the storage: a resume after the file
    changed got a part of the new version)."""
    weights = (front.src / "weights.bin").read_bytes()
    sha = hashlib.sha256(weights).hexdigest()
    path = f"/{TINY}/resolve/main/weights.bin"
    for stale in ('"0123"', 'W/"0123"', "Tue, 01 Jan 2030 00:00:00 GMT"):
        status, headers, body = _request(front, path, {"Range": "bytes=0-9", "If-Range": stale})
        assert (status, body) == (200, weights), (stale, status)
        assert "content-range" not in headers
    status, _, body = _request(front, path, {"Range": "bytes=0-9", "If-Range": f'"{sha}"'})
    assert (status, body) in ((206, weights[:10]), (200, weights))


def test_ranges_headers_and_access_are_cmhs(front: Front) -> None:
    weights = (front.src / "weights.bin").read_bytes()
    path = f"/{TINY}/resolve/main/weights.bin"
    status, headers, body = _request(front, path, {"Range": "bytes=100-199"})
    assert status == 206 and body == weights[100:200]
    assert headers["content-range"] == f"bytes 100-199/{len(weights)}"
    sha = hashlib.sha256(weights).hexdigest()
    assert headers["etag"] == headers["x-linked-etag"] == f'"{sha}"'  # cmh's, not the storage's
    assert headers["x-linked-size"] == str(len(weights)) and len(headers["x-repo-commit"]) == 40
    assert not any(h.startswith(("x-cmh-storage", "x-amz")) for h in headers)
    status, headers, body = _request(front, path)
    assert status == 200 and body == weights
    assert _request(front, path, {"If-None-Match": f'"{sha}"'})[0] == 304
    assert _request(front, path, {"Range": f"bytes={len(weights)}-"})[0] == 416


def test_a_private_blob_is_not_reachable_through_nginx_without_its_token(front: Front) -> None:
    private = f"/{PRIVATE_REPO}/resolve/main/config.json"
    secret = b'{"secret": true}\n'
    status, _, body = _request(front, private)
    assert status in (401, 404) and secret not in body  # type: ignore[operator]
    assert _request(front, private, {"Authorization": "Bearer hf_wrong"})[0] in (401, 404)
    status, _, body = _request(front, private, {"Authorization": f"Bearer {PRIVATE_TOKEN}"})
    assert (status, body) == (200, secret)
    # nginx's internal location cannot be asked for directly, with or without a token
    folder = "models--" + PRIVATE_REPO.replace("/", "--")
    sha = hashlib.sha256(secret).hexdigest()
    name = front.store.blob_name(folder, sha)
    target = front.store.objects.presigned_get_url(name)
    path = target.split("/", 3)[3]
    for asked in ("/_cmh_bucket/", f"/_cmh_bucket/{path}", f"/_cmh_bucket_whole/{path}"):
        for headers in ({}, {"Authorization": f"Bearer {PRIVATE_TOKEN}"},
                        {"X-Cmh-Storage-Target": "/" + path}):  # fmt: skip
            status, _, body = _request(front, asked, headers)
            assert status == 404 and secret not in body  # type: ignore[operator]


def _blob(front: Front, repo: str, folder: str, path: str, version: int) -> tuple[str, bytes]:
    src = write_tiny_repo(front.src.parent / f"{folder}-{version}", version)
    commit = front.store.add_folder(src, repo).commit
    tree = front.store.read_tree(folder, commit)
    assert tree is not None
    entry = next(f for f in tree.files if f.path == path)
    return front.store.blob_name(folder, entry.etag), (src / path).read_bytes()


@pytest.mark.parametrize("asked", [None, "bytes=299000-"], ids=["whole", "end-range"])
def test_wrong_bytes_are_never_sent_complete(front: Front, asked: str | None) -> None:
    """An object that does not hash to its name is refused before nginx is involved; an
    object replaced after its check is refused by the storage (nginx's GET is pinned to
    the checked version with ``If-Match``): a 503, never the other bytes. Through nginx's
    cache, the checked version's bytes may still be sent from the cache (its key is the
    object and its checked version) until cmh sees the new version."""
    repo = f"cmh-test/xaccel-bad-{'whole' if asked is None else 'range'}"
    folder = "models--" + repo.replace("/", "--")
    name, good = _blob(front, repo, folder, "weights.bin", 7)
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # same size, last byte differs
    path = f"/{repo}/resolve/main/weights.bin"
    headers = {"Range": asked} if asked else {}
    want = good if asked is None else good[299000:]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in front.env.items():
            mp.setenv(key, value)
        front.store.objects.put(name, bytes(bad))  # wrong before the first request
        status, _, body = _request(front, path, headers)
        assert status == 503 and body != bytes(bad)[-len(want) :], (status, body)
        front.store.objects.put(name, good)  # put right: a new version, checked and sent
        front.clock.advance(REF_TTL + 0.5)  # once the replica looks at the object again
        status, _, body = _request(front, path, headers)
        assert status in (200, 206) and body == want
        front.store.objects.put(name, bytes(bad))  # replaced after the check
        for step in range(2):  # cmh still knows the checked version, then sees the new one
            status, _, body = _request(front, path, headers)
            assert body != bytes(bad)[-len(want) :], (status, body)
            from_cache = step == 0 and front.nginx.cached and body == want
            assert status == 503 or (from_cache and status in (200, 206)), (status, body)
            if step == 0:
                front.clock.advance(REF_TTL + 0.5)


def test_nginx_location_streams_the_storage_answer_unbuffered() -> None:
    """nginx reads the storage no further ahead of the client than one 1 MiB buffer, never
    into a temp file: buffering 4 MiB ahead cost the storage more CPU per GiB
    (bench/scaleout.py, issue 37); the version stays pinned with If-Match."""
    storage = "http://127.0.0.1:8333"
    lines = [line.strip() for line in nginx_bucket_location(storage, cached=False).splitlines()]
    assert "proxy_buffering off;" in lines
    assert "proxy_buffer_size 1m;" in lines
    assert "proxy_max_temp_file_size 0;" in lines
    assert "proxy_set_header If-Match $cmh_version;" in lines


def test_nginx_cache_keys_a_slice_by_the_object_and_its_checked_version() -> None:
    """The cached location keys each slice by the object's path and the storage ETag cmh
    checked (never by the ETag alone: two objects may share an MD5), and keeps only the
    storage's 206 answers (an error is never cached)."""
    lines = [
        line.strip()
        for line in nginx_bucket_location("http://127.0.0.1:8333", cached=True).splitlines()
    ]
    assert 'proxy_cache_key "$cmh_object $cmh_version $slice_range";' in lines
    assert "proxy_set_header If-Match $cmh_version;" in lines
    kept = [line for line in lines if line.startswith("proxy_cache_valid")]
    assert kept == ["proxy_cache_valid 206 60m;"] * 2  # the location and its whole twin


def test_nginx_bucket_server_reads_through_the_cache_unless_told_not_to() -> None:
    """The block users get by default reads the storage through nginx's cache (in
    DEFAULT_CACHE, its ``http``-level lines first); ``cache=None`` is the unbuffered
    location with nothing on disk."""
    args = ("0.0.0.0:80", "127.0.0.1:8080", "http://127.0.0.1:8333")
    default = nginx_bucket_server(*args)
    assert default.startswith(f"proxy_cache_path {DEFAULT_CACHE} ")
    assert f"proxy_cache {CACHE_ZONE};" in default
    assert "proxy_buffering off;" not in default.split("location /_cmh_bucket/", 1)[1]
    unbuffered = nginx_bucket_server(*args, cache=None)
    assert "proxy_cache" not in unbuffered
    assert "proxy_max_temp_file_size 0;" in unbuffered
    folder = nginx_bucket_server(*args, cache="/srv/nginx-cache")
    assert folder.startswith("proxy_cache_path /srv/nginx-cache ")


class _Answers(http.server.BaseHTTPRequestHandler):
    """A one-route HTTP server: ``routes[path] = (headers, body)``; 404 otherwise (a
    ``Status`` header sets the status)."""

    routes: ClassVar[dict[str, tuple[dict[str, str], bytes]]] = {}

    def do_GET(self) -> None:
        headers, body = self.routes.get(self.path.split("?")[0], ({}, b""))
        headers = dict(headers)
        self.send_response(int(headers.pop("Status", 200 if body else 404)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _answering(routes: dict[str, tuple[dict[str, str], bytes]]) -> http.server.ThreadingHTTPServer:
    handler = type("Handler", (_Answers,), {"routes": routes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


#: What a stand-in for cmh answers for ``/model/resolve/main/w.bin``: the storage's
#: ``/bucket/blob``, handed to nginx.
_HANDED = {
    "/model/resolve/main/w.bin": (
        {"X-Accel-Redirect": "/_cmh_bucket/", "X-Cmh-Storage-Target": "/bucket/blob",
         "X-Cmh-Storage-Etag": '"v1"', "ETag": '"hub"'}, b"cmh never sends this body"),
}  # fmt: skip


@contextlib.contextmanager
def _nginx_before(
    tmp_path: Path,
    storage_routes: dict[str, tuple[dict[str, str], bytes]],
    front_routes: dict[str, tuple[dict[str, str], bytes]],
    cached: bool = False,
) -> Iterator[Nginx]:
    """nginx with the bucket location, in front of a stand-in for cmh answering
    ``front_routes`` (and :data:`_HANDED`), before a storage answering ``storage_routes``."""
    storage = _answering(storage_routes)
    upstream = _answering({**_HANDED, **front_routes})
    try:
        nginx = Nginx(None, f"127.0.0.1:{upstream.server_address[1]}", tmp_path / "nginx",
                      storage=f"http://127.0.0.1:{storage.server_address[1]}",
                      cache=cached)  # fmt: skip
        try:
            yield nginx
        finally:
            nginx.stop()
    finally:
        storage.shutdown()
        upstream.shutdown()


def _get_handed(nginx: Nginx) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of a GET of the handed file."""
    conn = http.client.HTTPConnection("127.0.0.1", nginx.port, timeout=60)
    try:
        conn.request("GET", "/model/resolve/main/w.bin")
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_a_storage_answering_x_accel_headers_is_not_followed(tmp_path: Path) -> None:
    """The storage's answer is bytes, never an instruction to nginx: an ``X-Accel-Redirect``
    from a hostile (or co-tenant-controlled) storage does not make nginx fetch another
    path through cmh's front (where a token-less request would be answered as nginx's)."""
    storage = {"/bucket/blob": ({"X-Accel-Redirect": "/elsewhere"}, b"the blob\n")}
    front = {"/elsewhere": ({}, b"what only the front answers\n")}
    with _nginx_before(tmp_path, storage, front) as nginx:
        status, headers, body = _get_handed(nginx)
        assert (status, body) == (200, b"the blob\n")
        assert headers["etag"] == '"hub"'


# what a storage may answer besides the bytes: each must reach the client as cmh's 503
REFUSALS = [
    ("416", {}, b"<Error><Code>InvalidRange</Code><Key>bucket/blob</Key></Error>"),
    ("400", {}, b"<Error><Code>BadRequest</Code><Key>bucket/blob</Key></Error>"),
    ("302", {"Location": "http://127.0.0.1:9/elsewhere"}, b"<a>moved</a>"),
    ("429", {"Retry-After": "1"}, b"<Error><Code>SlowDown</Code></Error>"),
    ("501", {}, b"<Error><Code>NotImplemented</Code></Error>"),
]


@pytest.mark.parametrize("cached", [False, True], ids=["unbuffered", "cached"])
def test_a_storage_refusal_reaches_the_client_as_a_503_without_its_body(
    tmp_path: Path, cached: bool
) -> None:
    """Whatever the storage answers instead of the bytes (an error, a redirect), the client
    gets cmh's 503 with Retry-After: never the storage's body (it names the bucket's keys),
    its Location, or its status."""
    routes: dict[str, tuple[dict[str, str], bytes]] = {}
    with _nginx_before(tmp_path, routes, {}, cached) as nginx:
        for status, headers, body in REFUSALS:
            routes["/bucket/blob"] = ({"Status": status, **headers}, body)
            got, answered, text = _get_handed(nginx)
            assert got == 503, (status, got, text)
            assert b"Error" not in text and b"moved" not in text, (status, text)
            assert "location" not in answered, status
            assert answered.get("retry-after") == "60", status


def test_a_cached_nginx_reads_each_slice_of_a_blob_once_for_clients_at_once(
    seaweed: SeaweedServer, tmp_path: Path
) -> None:
    """Through nginx's cache, eight whole GETs and two ranges of one blob at once make the
    storage answer each 8 MiB slice once, and every body is the stored bytes; the same
    requests again read the storage no more."""
    where = SeaweedBucket(seaweed, seaweed.bucket, f"xcache-{uuid.uuid4().hex[:10]}/")
    env = isolated_aws_env(where, tmp_path)
    ranges: list[str] = []

    def count(request: S3Request) -> None:
        if request.method == "GET" and "/blobs/" in request.key:
            ranges.append(request.header("Range") or "whole")

    storage = S3Proxy(where.endpoint, hook=count)
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom((20 << 20) + 12345)  # three slices, the last one short
    (src / "big.bin").write_bytes(data)
    with aws_env_applied(env):
        store = BucketStore.open(where.url)
        store.add_folder(src, TINY)
    served_env = {**os.environ, **env, "AWS_ENDPOINT_URL": storage.endpoint}
    server = MirrorServer(where.url, tmp_path / "logs", env=served_env,
                          extra_args=("--blob-delivery", "x-accel"))  # fmt: skip
    nginx = Nginx(None, f"127.0.0.1:{server.port}", tmp_path / "nginx",
                  storage=storage.endpoint, cache=True)  # fmt: skip
    front = Front(store, nginx, server, src, env, ProcessClock(tmp_path / "clock"))
    asked = [None] * 8 + ["bytes=100-9000000", "bytes=17000000-"]
    wanted = [data] * 8 + [data[100:9000001], data[17000000:]]
    try:
        for _ in range(2):
            with ThreadPoolExecutor(len(asked)) as pool:
                got = list(pool.map(lambda r: _request(front, f"/{TINY}/resolve/main/big.bin",
                                                       {"Range": r} if r else {}), asked))  # fmt: skip
            assert [g[2] == w for g, w in zip(got, wanted, strict=True)] == [True] * len(asked)
            assert [g[0] for g in got] == [200] * 8 + [206, 206]
            slice_ = 8 << 20
            assert sorted(ranges) == sorted(
                f"bytes={n}-{n + slice_ - 1}" for n in range(0, len(data), slice_)
            )
    finally:
        nginx.stop()
        server.stop()
        storage.stop()
