"""Bucket proxy delivery, spliced: bodies of a version known good (and ranges whose last
byte waits for a check) go from the storage's socket to the client's in the kernel.

Real SeaweedFS and ``cmh serve``; a pass-through proxy in front of the storage shows
which GETs were the spliced ones (their ``User-Agent`` is ``cmh``)."""

from __future__ import annotations

import http.client
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from bucket_support import S3Proxy, isolated_aws_env
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from mirror_support import MirrorServer
from seaweed import SeaweedBucket, SeaweedServer

REPO = "cmh-test/splice"
FOLDER = "models--cmh-test--splice"
SIZE = 3 << 20


def blob_get_agents(proxy: S3Proxy) -> list[str]:
    """The ``User-Agent`` of each GET of a blob object the storage answered through ``proxy``."""
    return [
        e.request.header("User-Agent") or ""
        for e in proxy.exchanges
        if e.request.method == "GET" and "/blobs/" in e.request.key
    ]


@dataclass
class Served:
    store: BucketStore
    server: MirrorServer
    storage: S3Proxy
    data: bytes
    bad_name: str


@pytest.fixture(scope="module")
def served(seaweed: SeaweedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    where = SeaweedBucket(seaweed, seaweed.bucket, f"splice-{uuid.uuid4().hex[:10]}/")
    tmp = tmp_path_factory.mktemp("splice")
    storage = S3Proxy(where.endpoint)
    env = isolated_aws_env(where, tmp)
    src = tmp / "src"
    src.mkdir()
    data = os.urandom(SIZE)
    (src / "big.bin").write_bytes(data)
    (src / "bad.bin").write_bytes(data[::-1])
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("AWS_"):
                mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        store = BucketStore.open(where.url)
        tree = store.read_tree(FOLDER, store.add_folder(src, REPO).commit)
        assert tree is not None
        bad = next(f for f in tree.files if f.path == "bad.bin")
        blob = store.blob_name(FOLDER, bad.etag)
        served_env = {**os.environ, **env, "AWS_ENDPOINT_URL": storage.endpoint}
        server = MirrorServer(where.url, tmp / "logs", env=served_env)
        try:
            yield Served(store, server, storage, data, blob)
        finally:
            server.stop()
            storage.stop()


def _get(
    served: Served, rng: str | None, stop_after: int | None = None, path: str = "big.bin"
) -> tuple[int, bytes | str]:
    conn = http.client.HTTPConnection(served.server.host, served.server.port, timeout=30)
    try:
        conn.request("GET", f"/{REPO}/resolve/main/{path}", headers={"Range": rng} if rng else {})
        r = conn.getresponse()
        if stop_after is not None:
            return r.status, r.read(stop_after)
        try:
            return r.status, r.read()
        except http.client.IncompleteRead:
            return r.status, "IncompleteRead"
    finally:
        conn.close()


def test_spliced_bodies_are_the_stored_bytes(served: Served) -> None:
    data = served.data
    before = len(blob_get_agents(served.storage))
    assert _get(served, None) == (200, data)
    assert _get(served, "bytes=1048576-") == (206, data[1 << 20 :])
    assert _get(served, "bytes=1000-2500000") == (206, data[1000:2500001])
    assert _get(served, f"bytes=-{(1 << 20) + 7}") == (206, data[-((1 << 20) + 7) :])
    assert blob_get_agents(served.storage)[before:] == ["cmh"] * 4  # each one spliced GET
    log = served.server.log(route="resolve", method="GET")
    assert [e["bytes"] for e in log[-4:]] == [SIZE, SIZE - (1 << 20), 2499001, (1 << 20) + 7]
    # a client that leaves mid-body leaves the replica serving the next one whole
    assert _get(served, None, stop_after=100_000)[1] == data[:100_000]
    assert _get(served, None) == (200, data)


def test_a_spliced_range_of_a_bad_blob_is_never_sent_complete(served: Served) -> None:
    """A range holding the last byte of a version not checked yet goes out spliced, but
    that byte waits for the check beside it: the body is cut, never complete."""
    bad = bytearray(served.data[::-1])
    bad[-1] ^= 0xFF  # same size, last byte differs: a new version, no check record
    served.store.objects.put(served.bad_name, bytes(bad))
    before = len(blob_get_agents(served.storage))
    status, body = _get(served, "bytes=1048576-", path="bad.bin")
    assert status == 206 and body == "IncompleteRead"
    # The range was spliced (the check's read is aiohttp's).
    assert "cmh" in blob_get_agents(served.storage)[before:]
    assert _get(served, None, path="bad.bin")[0] == 503  # known bad now
