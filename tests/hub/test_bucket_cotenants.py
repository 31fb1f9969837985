"""A bucket store shares its bucket with others: keys another tool writes under the prefix,
names cmh never makes, a storage that fails while a client asks.

Each test starts its own storage through the fixtures (moto, ministack, SeaweedFS).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import pytest
from bucket_support import Bucket, use_bucket
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from cmh.hub.mirror.stores.bucket._objectstore import ObjectInfo
from mirror_support import TINY_REPO, write_tiny_repo

FOLDER = "models--cmh-test--tiny"
#: Keys cmh never makes (an empty, ``.`` or ``..`` segment), relative to the prefix; moto
#: and ministack take them as they are (SeaweedFS normalises ``//`` and refuses ``..``).
JUNK = (f"{FOLDER}/blobs//x", f"{FOLDER}/trees/./x.json", "/x", "../up", f"{FOLDER}/..")


@pytest.fixture(params=["moto", "ministack"])
def junk_bucket(request: pytest.FixtureRequest) -> Bucket:
    bucket: Bucket = request.getfixturevalue(f"{request.param}_bucket")
    return bucket


def _put_raw(store: BucketStore, key: str, data: bytes) -> None:
    """Write ``key`` (relative to the prefix) as another tool would: no name check."""
    objects = store.objects
    objects._s3_client().put_object(
        Bucket=objects.location.bucket, Key=objects.location.prefix + key, Body=data
    )


def _sorted(infos: Iterable[ObjectInfo]) -> list[ObjectInfo]:
    return sorted(infos, key=lambda i: i.name)


def _raw_keys(store: BucketStore) -> list[str]:
    objects = store.objects
    pages = objects._s3_client().get_paginator("list_objects_v2")
    prefix = objects.location.prefix
    return sorted(
        str(o["Key"])[len(prefix) :]
        for page in pages.paginate(Bucket=objects.location.bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    )


def test_keys_cmh_never_makes_are_skipped_not_fatal(
    junk_bucket: Bucket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Was: one such key under the prefix made obstore refuse the whole listing ("invalid
    path"): ls, scrub and prune failed, ``cmh serve`` would not start, a running one
    answered 503. Such a key is left out of every listing and said once; it is never read
    or deleted."""
    from cmh.hub.mirror.stores.bucket._scrub import scrub_bucket
    from cmh.hub.prune import PrunePolicy, execute_bucket_plan, plan_prune, scan_bucket

    use_bucket(junk_bucket, tmp_path, monkeypatch)
    store = BucketStore.open(junk_bucket.url)
    store.add_folder(write_tiny_repo(tmp_path / "tiny", 1), TINY_REPO)
    listed = _sorted(store.objects.list(""))
    folders = store.objects.list_folders("")
    blobs = store.blob_infos(FOLDER)
    for key in JUNK:
        _put_raw(store, key, b"junk")
    assert set(JUNK) <= set(_raw_keys(store))  # the storage keeps them as they are
    with caplog.at_level(logging.WARNING, "cmh.hub.mirror"):
        assert _sorted(store.objects.list("")) == listed
        in_folder = [i for i in listed if i.name.startswith(FOLDER)]
        assert _sorted(store.objects.list(FOLDER)) == in_folder
        assert store.objects.list_folders("") == folders
        assert store.blob_infos(FOLDER) == blobs
        assert [r[1] for r in store.repos()] == [TINY_REPO]
        report = scrub_bucket(store)
        assert not report.bad and not report.errors and not report.broken_links
        plan = plan_prune(scan_bucket(store), PrunePolicy(unreferenced=True))
        execute_bucket_plan(store, plan, settle=0)
        store.objects.list("")  # again: said once
        assert _sorted(store.objects.list("")) == listed
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    for key in JUNK[:2]:
        assert sum(f"/{store.objects.location.prefix}{key}: object skipped" in s for s in said) == 1
    assert set(JUNK) <= set(_raw_keys(store))  # never deleted


def test_a_failing_storage_is_named_to_no_client(
    moto_bucket: Bucket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Was: ``503 StoreUnavailable`` and ``503 BlobUnavailable`` carried cmh's whole
    storage error line (bucket, prefix, key, the storage's internal address) in their body
    and ``X-Error-Message`` to any client. A client is told what kind of failure it was;
    the log keeps the line."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer
    from bucket_support import Fault, S3Proxy, S3Request
    from cmh.hub.mirror._app import make_app
    from cmh.hub.mirror._auth import AccessPolicy
    from cmh.hub.mirror._observe import Metrics
    from cmh.hub.mirror._state import MirrorState
    from cmh.hub.mirror.stores.bucket._store import BucketBackedStore
    from deadline_support import TEST_DEADLINE

    use_bucket(moto_bucket, tmp_path, monkeypatch)
    BucketStore.open(moto_bucket.url).add_folder(write_tiny_repo(tmp_path / "tiny", 1), TINY_REPO)
    down: list[str] = []  # "" (every request fails) or the part of the keys that fail

    def failing(request: S3Request) -> Fault | None:
        return Fault.LOSE if down and down[-1] in request.key else None

    proxy = S3Proxy(moto_bucket.endpoint, failing)  # type: ignore[attr-defined]
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    backend = BucketBackedStore.open(moto_bucket.url, ref_ttl=0.0)
    state = MirrorState(backend, AccessPolicy({}), Metrics(None))
    bucket, prefix = backend.bucket.objects.location.bucket, backend.bucket.objects.location.prefix
    secret = (bucket, prefix.strip("/"), proxy.endpoint, proxy.endpoint.split("//")[1])
    resolve = f"/{TINY_REPO}/resolve/main"
    asked = [
        (None, "/api/models"),
        (None, f"{resolve}/config.json"),
        ("/blobs/", f"{resolve}/weights.bin"),  # the blobs alone fail
        ("", "/api/models"),  # nothing answers
        ("", f"{resolve}/README.md"),
    ]

    async def run() -> list[tuple[int, str, str | None]]:
        out = []
        async with TestClient(TestServer(make_app(state), host="127.0.0.1")) as client:
            for failing_keys, path in asked:
                if failing_keys is not None:
                    down.append(failing_keys)
                answer = await asyncio.wait_for(client.get(path), TEST_DEADLINE)
                out.append((answer.status, await answer.text(),
                            answer.headers.get("X-Error-Message")))  # fmt: skip
        return out

    with caplog.at_level(logging.WARNING, "cmh.hub.mirror"):
        try:
            answers = asyncio.run(run())
        finally:
            proxy.stop()
    assert [a[0] for a in answers] == [200, 200, 503, 503, 503], answers
    told = ["blob unavailable", "store unavailable", "store unavailable"]
    for (_, body, message), what in zip(answers[2:], told, strict=True):
        assert message == f"{what}: the storage failed"
        assert body == f'{{"error": "{what}: the storage failed"}}'
        assert not any(s in body or s in (message or "") for s in secret)
    logged = [r.getMessage() for r in caplog.records]
    logged = [line for line in logged if line.startswith(("store unavailable", "blob unavail"))]
    assert len(logged) >= 3 and all(proxy.endpoint in line and bucket in line for line in logged)


#: Where the scrub is held while a re-import repairs the blob: its copy of the bad
#: version to the quarantine, or the note it writes beside that copy.
HOLDS = ("copy", "note")


@pytest.mark.parametrize("hold", HOLDS)
def test_scrub_never_quarantines_a_blob_a_re_import_repaired(
    junk_bucket: Bucket, hold: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: scrub copied and deleted ``blobs/{etag}`` unpinned, after hashing every blob
    of the repo. A re-import that uploaded the blob again meanwhile (a wrong-size object:
    spec/hub-mirror.md 7.2 step 1) lost the good blob and its check record to the
    quarantine (503 BlobUnavailable for a served file). Only the version hashed goes."""
    import hashlib
    import threading

    from bucket_support import S3Proxy, S3Request
    from cmh.hub.mirror.stores.bucket._scrub import scrub_bucket
    from deadline_support import TEST_DEADLINE

    use_bucket(junk_bucket, tmp_path, monkeypatch)
    direct = BucketStore.open(junk_bucket.url)
    src = write_tiny_repo(tmp_path / "tiny", 1)
    direct.add_folder(src, TINY_REPO)
    good = (src / "weights.bin").read_bytes()
    etag = hashlib.sha256(good).hexdigest()
    blob = direct.blob_name(FOLDER, etag)
    direct.objects.put(blob, good[: len(good) // 2])  # it goes bad (short: the wrong size)
    held, release = threading.Event(), threading.Event()

    def holding(request: S3Request) -> None:
        copy = request.header("x-amz-copy-source") or ""
        if request.method != "PUT" or "/.quarantine/" not in request.key:
            return None
        if (hold == "copy" and etag in copy) or (hold == "note" and request.key.endswith(".json")):
            held.set()
            release.wait(TEST_DEADLINE)
        return None

    proxy = S3Proxy(junk_bucket.endpoint, holding)  # type: ignore[attr-defined]
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        scrubbing = BucketStore.open(junk_bucket.url)
        out: list[object] = []
        thread = threading.Thread(target=lambda: out.append(scrub_bucket(scrubbing, threads=2)))
        thread.start()
        assert held.wait(TEST_DEADLINE)  # the bad version was hashed; its quarantine is held
        direct.add_folder(src, TINY_REPO)  # the re-import uploads the blob again
        repaired = direct.objects.head(blob).etag
        assert direct.objects.get(blob) == good and direct.read_check(FOLDER, etag) == repaired
        release.set()
        thread.join(TEST_DEADLINE)
    finally:
        release.set()
        proxy.stop()
    [report] = out
    [bad] = report.bad  # type: ignore[attr-defined]
    assert bad.blob == etag and bad.quarantined_to is None
    assert "not quarantined: replaced since it was hashed" in bad.message
    assert direct.objects.get(blob) == good  # the repaired blob is served
    assert direct.read_check(FOLDER, etag) == repaired  # and its check record kept


@pytest.mark.parametrize("kind", ["folder", "moto"])
def test_the_operator_page_reads_a_bounded_quarantine(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the operator page read every quarantine note whole (a bucket: up to 1000 of up
    to 64 MiB each; a folder: any number, any size), whoever wrote them. It reads notes of
    at most MAX_NOTE_BYTES, MAX_NOTES_BYTES in all, MAX_QUARANTINE_NOTES at most."""
    import json

    from cmh.hub.mirror.stores._base import MAX_NOTE_BYTES, MAX_NOTES_BYTES

    def note(i: int, size: int) -> bytes:
        head = json.dumps({"quarantined_at": i, "pad": ""}).encode()
        return head[:-2] + b"x" * (size - len(head)) + head[-2:]

    fits = MAX_NOTES_BYTES // MAX_NOTE_BYTES  # notes just under the per-note bound
    notes = {
        f"models--o--m/{i:064x}.{i}.json": note(i, MAX_NOTE_BYTES - 64) for i in range(fits + 4)
    }
    notes["models--o--m/big.json"] = note(10_000, MAX_NOTE_BYTES + 1)  # never read
    if kind == "folder":
        from cmh.hub.mirror.stores.local._store import LocalStore

        for name, data in notes.items():
            path = tmp_path / "store" / ".quarantine" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        view = LocalStore(tmp_path / "store").scrub_history()
    else:
        from cmh.hub.mirror.stores.bucket._store import BucketBackedStore

        bucket = request.getfixturevalue(f"{kind}_bucket")
        use_bucket(bucket, tmp_path, monkeypatch)
        backend = BucketBackedStore.open(bucket.url)
        for name, data in notes.items():
            backend.bucket.objects.put(f".quarantine/{name}", data)
        view = backend.scrub_history()
    times = [n["quarantined_at"] for n in view.quarantined]
    assert times == sorted(range(fits), reverse=True)  # the big one and those past the bound left


def test_scrub_without_quarantine_forgets_the_check_of_the_bad_version_alone(
    junk_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: with ``--no-quarantine`` a bucket scrub left a check record naming the bad
    version (replicas then sent it unchecked), where a folder scrub forgets it. The record
    goes when it names the version found bad, and only then."""
    import hashlib

    from cmh.hub.mirror.stores.bucket._scrub import scrub_bucket

    use_bucket(junk_bucket, tmp_path, monkeypatch)
    store = BucketStore.open(junk_bucket.url)
    src = write_tiny_repo(tmp_path / "tiny", 1)
    store.add_folder(src, TINY_REPO)
    etag = hashlib.sha256((src / "weights.bin").read_bytes()).hexdigest()
    bad = store.objects.put(store.blob_name(FOLDER, etag), b"rotten")
    store.record_check(FOLDER, etag, '"another-version"')
    [check] = scrub_bucket(store, do_quarantine=False).bad
    assert check.blob == etag and store.read_check(FOLDER, etag) == '"another-version"'
    store.record_check(FOLDER, etag, bad)  # as a record of the bad version would
    [check] = scrub_bucket(store, do_quarantine=False).bad
    assert check.blob == etag and store.read_check(FOLDER, etag) is None
    assert store.objects.get(store.blob_name(FOLDER, etag)) == b"rotten"  # left in place


def test_a_listed_name_is_skipped_exactly_when_the_name_check_refuses_it() -> None:
    """The listing's cheap check (every listed name goes through it) and the name check
    every read and write goes through agree, on every name of up to six of ``a . / \\x01``."""
    import itertools

    from cmh.hub.mirror.stores.bucket._objectstore import (
        InvalidObjectName,
        _check_relpath,
        _unusable,
    )

    def refused(name: str) -> bool:
        try:
            _check_relpath(name, "object name", InvalidObjectName)
        except InvalidObjectName:
            return True
        return False

    names = ["", "a\x7f", "a\nb", "trees/x.json", ".cmh/lease"]
    names += ["".join(p) for k in range(1, 7) for p in itertools.product("a./\x01", repeat=k)]
    assert [n for n in names if _unusable(n) != refused(n)] == []
