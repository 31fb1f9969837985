"""Bytes changed on the way to the storage: a PUT's object is proven to hold what was sent.

The link between a replica and an ``http://`` storage (SeaweedFS, MinIO on a LAN) checks
nothing but TCP's checksum, and none of the S3 implementations the tests run checks the
signed ``x-amz-content-sha256`` against the body (AWS does). A fault-injecting proxy on
that hop (:data:`bucket_support.Fault.CORRUPT_SENT`) inverts one byte of a PUT's body: the
storage then holds other bytes than those sent, under an ETag that is their MD5.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from urllib.request import urlopen

import pytest
from bucket_support import S3_KINDS, Fault, S3Hook, S3Proxy, S3Request, open_store, use_bucket
from cmh.hub.mirror._upstream import Upstream, UpstreamConfig
from cmh.hub.mirror.stores import open_store as open_mirror_store
from cmh.hub.mirror.stores.bucket import _objectstore, _pull
from cmh.hub.mirror.stores.bucket._objectstore import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
)
from deadline_support import TEST_DEADLINE
from hostile_upstream import COMMIT, HostileHub
from mirror_support import MirrorServer, write_tiny_repo
from seaweed import SeaweedBucket


class Corrupting:
    """A hook for :class:`S3Proxy`: PUTs whose key contains ``part`` reach the storage with
    a byte changed: the first of each body to each key (told by the body's signed SHA-256),
    so a write sent again arrives whole; ``every``: all of them."""

    def __init__(self, part: str, every: bool = False) -> None:
        self.part, self.every = part, every
        self.writes: list[tuple[str, str | None]] = []  # one per PUT corrupted

    @property
    def corrupted(self) -> int:
        return len(self.writes)

    def __call__(self, request: S3Request) -> Fault | None:
        if request.method != "PUT" or self.part not in request.key:
            return None
        write = (request.key, request.header("x-amz-content-sha256"))
        if not self.every and write in self.writes:
            return None
        self.writes.append(write)
        return Fault.CORRUPT_SENT


@pytest.fixture(params=S3_KINDS)
def bucket(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SeaweedBucket]:
    found: SeaweedBucket = request.getfixturevalue(f"{request.param}_bucket")
    use_bucket(found, tmp_path, monkeypatch)
    yield found


@contextlib.contextmanager
def _through(
    bucket: SeaweedBucket, hook: S3Hook, monkeypatch: pytest.MonkeyPatch
) -> Iterator[S3Proxy]:
    """A proxy on the storage hop, named as the endpoint while it runs."""
    proxy = S3Proxy(bucket.endpoint, hook)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        yield proxy
    finally:
        proxy.stop()
        monkeypatch.setenv("AWS_ENDPOINT_URL", bucket.endpoint)


def test_a_put_whose_bytes_changed_on_the_way_is_written_again(
    bucket: SeaweedBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain, create-only and compare-and-swap PUTs alike: the first reaches the storage
    changed, the object ends holding the bytes sent, and the ETag returned is theirs."""
    hook = Corrupting("/wire-")
    data = os.urandom(70_000)
    with _through(bucket, hook, monkeypatch):
        objects = ObjectStore.open(bucket.url)
        plain = objects.put("wire-plain", data)
        created = objects.put_if_absent("wire-created", data)
        swapped = objects.put_if_match("wire-created", data[::-1], created)
    assert hook.corrupted == 3
    direct = open_store(bucket).objects
    assert direct.get("wire-plain") == data
    assert direct.get("wire-created") == data[::-1]
    md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
    assert plain.strip('"') == md5 and created.strip('"') == md5
    assert swapped == direct.head("wire-created").etag


def test_a_storage_that_keeps_changing_the_bytes_fails_the_put(
    bucket: SeaweedBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write of the object changed on the way: the PUT fails, typed, after its
    rewrites, and a create-only PUT leaves no object behind."""
    hook = Corrupting("/wire-bad", every=True)
    with _through(bucket, hook, monkeypatch):
        objects = ObjectStore.open(bucket.url)
        objects.put("wire-good", b"a first PUT that arrives whole")  # the ETags are MD5s
        with pytest.raises(ObjectStoreError, match="other bytes than those sent"):
            objects.put_if_absent("wire-bad", os.urandom(5000))
    assert hook.corrupted == 3
    with pytest.raises(ObjectNotFound):
        open_store(bucket).objects.head("wire-bad")


def test_a_fill_whose_part_changed_on_the_way_makes_the_right_blob(
    bucket: SeaweedBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pull-through fill into the bucket whose first part reached the storage with a
    byte changed made the blob of that part and wrote its check record: every replica
    then served complete bodies that do not hash to their ETag. The part is written
    again, and the blob holds the upstream's bytes."""
    hook = Corrupting("/part-000000")
    data = os.urandom(_pull.PART + 5000)
    with _through(bucket, hook, monkeypatch):
        backend = open_mirror_store(bucket.url)
        with HostileHub(files={"model.bin": data}) as hub:
            upstream = Upstream(backend.pull_through(300.0), UpstreamConfig(hub.url))
            upstream.prepare("model", "evil/repo", "main")
            upstream.fill("model", "evil/repo", COMMIT, "model.bin")
    assert hook.corrupted == 1
    fresh = open_mirror_store(bucket.url)  # another replica: nothing in memory
    index = fresh.resolve("model", "evil/repo", COMMIT)
    assert index is not None
    with fresh.opener(index.files["model.bin"]) as f:
        assert hashlib.sha256(f.read()).hexdigest() == hashlib.sha256(data).hexdigest()


def test_an_unusable_tree_object_is_replaced_from_the_upstream(
    bucket: SeaweedBucket,
) -> None:
    """A commit's tree object that is not a valid tree (written wrong, by a flip on the
    way before PUTs were checked, or by a co-tenant) is written once and never again:
    the pull-through repo then raised an untyped ``BucketError`` at every request (500
    with a traceback), on every replica, for good. A revalidation now replaces it with
    the upstream's listing, and the branch is served again."""
    data = os.urandom(3000)
    with HostileHub(files={"model.bin": data}) as hub:
        first = open_mirror_store(bucket.url)
        Upstream(first.pull_through(300.0), UpstreamConfig(hub.url)).prepare(
            "model", "evil/repo", "main"
        )
        objects = open_store(bucket).objects
        name = f"models--evil--repo/trees/{COMMIT}.json"
        good = objects.get(name)
        objects.put(name, good[:40] + b"\xff" + good[41:])  # not UTF-8: not a tree object
        replica = open_mirror_store(bucket.url)  # nothing in memory
        upstream = Upstream(replica.pull_through(300.0), UpstreamConfig(hub.url))
        upstream.prepare("model", "evil/repo", "main")
        upstream.fill("model", "evil/repo", COMMIT, "model.bin")
    index = replica.resolve("model", "evil/repo", "main")
    assert index is not None and index.commit == COMMIT
    assert open_store(bucket).objects.get(name) != good[:40] + b"\xff" + good[41:]
    with replica.opener(index.files["model.bin"]) as f:
        assert f.read() == data


def test_a_small_read_the_storage_stalls_fails_within_its_quick_deadline(
    bucket: SeaweedBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storage that takes a GET of a ref and answers nothing held the request for 4
    minutes (60 s a try, 3 retries) and, as the store's reads run on the event loop's few
    executor threads, every other request of the mirror with it. A small read (a HEAD, a
    ref, a record: at most QUICK_BYTES) has its own deadline a try (10 s; 1 s here) and 2
    retries: it fails, typed, while the storage still holds it (20 s)."""
    monkeypatch.setattr(_objectstore, "QUICK_TIMEOUT", timedelta(seconds=1), raising=False)
    open_store(bucket).objects.put("stalled-ref", b"c" * 40 + b"\n")
    released = threading.Event()

    def hold(request: S3Request) -> None:
        if request.method == "GET" and request.key.endswith("/stalled-ref"):
            released.wait(20)  # no byte, the connection open
        return None

    with _through(bucket, hold, monkeypatch):
        objects = ObjectStore.open(bucket.url)
        try:
            assert objects.head("stalled-ref").size == 41  # a HEAD is not held
            with pytest.raises(ObjectStoreError, match="stalled-ref"):
                objects.get("stalled-ref", limit=4096)  # a ref's bound
            failed_while_held = not released.is_set()
        finally:
            released.set()
    assert failed_while_held


def test_a_fill_whose_upstream_body_ends_short_resumes_it(bucket: SeaweedBucket) -> None:
    """An upstream answering ``200`` with a Content-Length 100 bytes short of the listed
    size: a folder's fill resumes with ``Range`` (the resolver), a bucket's took the short
    body as the whole, failed it as "bytes whose hash is not the listed" and wrote
    ``failed``, every replica answering 502 for 10 s. It is resumed as a broken transfer."""
    data = os.urandom(_pull.PART + 5000)
    backend = open_mirror_store(bucket.url)
    with HostileHub(files={"model.bin": data}, short_bodies=1) as hub:
        upstream = Upstream(backend.pull_through(300.0), UpstreamConfig(hub.url))
        upstream.prepare("model", "evil/repo", "main")
        upstream.fill("model", "evil/repo", COMMIT, "model.bin")
        gets = [s for s in hub.seen if s.method == "GET" and "/resolve/" in s.path]
    assert hub.short_bodies == 0 and len(gets) == 2
    index = backend.resolve("model", "evil/repo", COMMIT)
    assert index is not None
    with backend.opener(index.files["model.bin"]) as f:
        assert f.read() == data


class HoldingReads:
    """A hook for :class:`S3Proxy`: GETs of keys ending in ``suffix`` get no answer (the
    connection open) until :attr:`release` is set."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.release = threading.Event()
        self.held = 0
        self._lock = threading.Lock()

    def __call__(self, request: S3Request) -> None:
        if request.method == "GET" and request.key.endswith(self.suffix):
            with self._lock:
                self.held += 1
            self.release.wait(TEST_DEADLINE)
        return None


def test_a_stalled_key_does_not_hold_the_mirrors_other_requests(
    moto_bucket: SeaweedBucket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mirror_server_factory: Callable[..., MirrorServer],
) -> None:
    """Twelve clients of a repo whose ref the storage takes and never answers: the store's
    reads ran on the event loop's default executor (the cores + 4 threads: 6 on 2 cores),
    so another repo's request waited until they failed (236 s in the prober's run). It is
    answered while they are still held."""
    use_bucket(moto_bucket, tmp_path, monkeypatch)
    store = open_store(moto_bucket)
    store.add_folder(write_tiny_repo(tmp_path / "a", 1), "org/a")
    store.add_folder(write_tiny_repo(tmp_path / "b", 2), "org/b")
    holding = HoldingReads("/models--org--a/refs/main")
    done: list[int] = []
    try:
        with _through(moto_bucket, holding, monkeypatch):
            server = mirror_server_factory(moto_bucket.url)

            def client_of_a() -> None:
                with contextlib.suppress(OSError):
                    urlopen(f"{server.url}/org/a/resolve/main/config.json", timeout=120)
                done.append(1)

            threads = [threading.Thread(target=client_of_a, daemon=True) for _ in range(12)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + TEST_DEADLINE
            while holding.held < 6 and time.monotonic() < deadline:  # every default thread
                time.sleep(0.05)
            assert holding.held >= 6
            with urlopen(f"{server.url}/org/b/resolve/main/config.json", timeout=120) as answer:
                assert answer.status == 200
            answered_while_held = not done and not holding.release.is_set()
    finally:
        holding.release.set()
    assert answered_while_held, f"{len(done)} of the stalled requests ended first"


def test_scrub_takes_out_no_blob_for_a_byte_changed_on_the_way(
    bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrub's read of a good blob that lost one byte to the link (a flaky ``http://``
    hop) quarantined the blob: it was deleted from ``blobs/`` and its files answered 503
    until a re-import. A bad read is read again, and only a second takes the blob out."""
    from cmh.hub.mirror.stores.bucket._scrub import scrub_bucket

    store = open_store(bucket)
    src = write_tiny_repo(tmp_path / "src", 1)
    result = store.add_folder(src, "org/flaky")
    tree = store.read_tree("models--org--flaky", result.commit)
    assert tree is not None
    weights = next(f for f in tree.files if f.path == "weights.bin")
    name = store.blob_name("models--org--flaky", weights.etag)
    flipped: list[str] = []

    def flip_once(request: S3Request) -> Fault | None:
        if request.method == "GET" and request.key.endswith(name) and not flipped:
            flipped.append(request.key)
            return Fault.CORRUPT_ANSWER
        return None

    with _through(bucket, flip_once, monkeypatch):
        report = scrub_bucket(open_store(bucket))
    assert flipped and not report.bad, [c.__dict__ for c in report.bad]
    assert open_store(bucket).objects.get(name) == (src / "weights.bin").read_bytes()
