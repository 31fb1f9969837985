"""A mirror's good blob checks are recorded and reused, never for another file version.

spec/hub-mirror.md 2.1: a good check of a version not changed within the racy
window is written to ``{repo}/.cmh/checked/{etag}``; any worker (or a later run)
that opens the same version takes it without hashing; any change to the file
(in place, renamed over, hard-linked) is a new version that is hashed again;
``cmh mirror scrub`` removes the record of a blob it finds bad, ``cmh prune``
the record of a blob it removes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import urlopen

import pytest
from cmh.hub.mirror.stores.local import _verify as verify
from cmh.hub.mirror.stores.local._verify import BlobVerifier, FileVersion, read_record, record_path
from deadline_support import TEST_DEADLINE
from mirror_support import MirrorServer

REPO = "org/records"


def _add(store: Path, src: Path, data: bytes) -> None:
    """``cmh mirror add`` of ``data`` as ``weights.bin`` of REPO (a new revision)."""
    src.mkdir()
    (src / "weights.bin").write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "mirror", "add", str(src), "--store", str(store),
         "--repo", REPO],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _store_with_blob(tmp_path: Path, data: bytes) -> tuple[Path, Path]:
    """A store holding ``data`` as ``weights.bin`` of REPO; (store, blob path)."""
    store = tmp_path / "store"
    _add(store, tmp_path / "src", data)
    blob = store / "models--org--records" / "blobs" / hashlib.sha256(data).hexdigest()
    assert blob.is_file()
    return store, blob


def _checked_store(tmp_path: Path, data: bytes) -> tuple[Path, Path, Path]:
    """A store whose blob of ``data`` had a good, recorded check; (store, blob, record)."""
    store, blob = _store_with_blob(tmp_path, data)
    time.sleep(0.25)  # past the racy window
    assert _check(BlobVerifier(), blob) is True
    record = record_path(blob, blob.name)
    assert record is not None and record.exists()
    return store, blob, record


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urlopen(url, timeout=30) as answer:
            return answer.status, answer.read()
    except HTTPError as exc:
        return exc.code, exc.read()


def _check(verifier: BlobVerifier, blob: Path) -> bool:
    """Run one check the way the server does (known first, then a check)."""

    async def run() -> bool:
        fd = os.open(blob, os.O_RDONLY)
        try:
            version = FileVersion.of(fd)
            record = record_path(blob, blob.name)
            known = verifier.known(version, blob.name, record)
            if known is not None:
                return known
            return await verifier.check(fd, blob.name, version, record)
        finally:
            os.close(fd)

    return asyncio.run(run())


def test_a_good_check_is_recorded_and_another_worker_takes_it_without_hashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, blob = _store_with_blob(tmp_path, os.urandom(1 << 20))
    fd = os.open(blob, os.O_RDONLY)
    version = FileVersion.of(fd)
    os.close(fd)
    # 0.15 s here: a check is remembered only once the kernel's file times lie this far
    # behind; those are the file system's, which no injected clock moves.
    time.sleep(verify.racy_seconds(version) + 0.05)
    record = record_path(blob, blob.name)
    assert record is not None and read_record(record) == version  # mirror add recorded it
    record.unlink()
    assert _check(BlobVerifier(), blob) is True  # a server's own check is recorded too
    assert read_record(record) == version

    hashed: list[str] = []
    real = verify.hash_matches

    def counting(fd: int, etag: str, version: FileVersion) -> bool:
        hashed.append(etag)
        return real(fd, etag, version)

    monkeypatch.setattr(verify, "hash_matches", counting)
    assert _check(BlobVerifier(), blob) is True  # a new worker: the record answers
    assert hashed == []


@pytest.mark.parametrize("how", ["in-place", "rename", "hardlink"])
def test_a_changed_blob_is_hashed_again_whatever_its_record_says(tmp_path: Path, how: str) -> None:
    data = os.urandom(1 << 20)
    _, blob, _ = _checked_store(tmp_path, data)
    other = bytes(reversed(data))  # same size, other bytes
    if how == "in-place":
        st = os.stat(blob)
        os.chmod(blob, 0o644)
        with open(blob, "r+b") as f:
            f.write(other)
        os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # hide the change from mtime
    elif how == "rename":
        tmp = blob.with_name("tmp")
        tmp.write_bytes(other)
        os.replace(tmp, blob)
    else:
        twin = tmp_path / "twin"
        twin.write_bytes(other)
        blob.unlink()
        os.link(twin, blob)
    assert _check(BlobVerifier(), blob) is False


def test_a_version_changed_within_the_racy_window_is_not_recorded(tmp_path: Path) -> None:
    _, blob = _store_with_blob(tmp_path, os.urandom(1 << 16))
    record = record_path(blob, blob.name)
    assert record is not None
    record.unlink()  # the import's record: this test is about the server's own check
    os.utime(blob)  # changed just now
    assert _check(BlobVerifier(), blob) is True
    assert not record.exists()


def test_scrub_removes_the_record_of_a_rotten_blob(tmp_path: Path) -> None:
    store, blob, record = _checked_store(tmp_path, os.urandom(1 << 20))
    # Bit rot keeps the file's version: make the record match the rotten file.
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 16)
    fd = os.open(blob, os.O_RDONLY)
    verify.write_record(record, FileVersion.of(fd))
    os.close(fd)
    done = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "mirror", "scrub", "--store", str(store),
         "--no-quarantine", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert not record.exists()
    assert _check(BlobVerifier(), blob) is False


def test_a_restarted_server_serves_a_recorded_blob_at_once_and_refuses_a_changed_one(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    data = os.urandom(4 << 20)
    store, blob = _store_with_blob(tmp_path, data)
    time.sleep(0.25)
    path = f"/{REPO}/resolve/main/weights.bin"
    first = mirror_server_factory(store)
    assert _get(first.url + path) == (200, data)
    record = record_path(blob, blob.name)
    assert record is not None and read_record(record) is not None
    first.stop()
    second = mirror_server_factory(store)
    assert _get(second.url + path) == (200, data)
    tmp = blob.with_name("tmp")
    tmp.write_bytes(bytes(reversed(data)))
    os.replace(tmp, blob)
    status, _ = _get(second.url + path)
    assert status == 503


def test_prune_removes_the_record_with_the_blob(tmp_path: Path) -> None:
    from cmh.hub.prune import PrunePolicy, execute_plan, plan_prune, scan_cache

    store, blob, record = _checked_store(tmp_path, os.urandom(1 << 20))
    _add(store, tmp_path / "newer", os.urandom(1 << 20))  # the blob is now unreferenced
    later = time.time() + 86400  # past the 10 minutes in which prune leaves things alone
    policy = PrunePolicy(unreferenced=True)
    outcome = execute_plan(plan_prune(scan_cache(store, read_commit_times=True), policy, later))
    assert not outcome.all_errors
    assert not blob.exists()
    assert not record.exists()


def test_mirror_add_records_the_check_it_made_and_the_first_get_does_not_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, blob = _store_with_blob(tmp_path, os.urandom(1 << 20))
    hashed: list[str] = []
    real = verify.hash_matches

    def counting(fd: int, etag: str, version: FileVersion) -> bool:
        hashed.append(etag)
        return real(fd, etag, version)

    monkeypatch.setattr(verify, "hash_matches", counting)
    assert _check(BlobVerifier(), blob) is True  # at once after the import: no racy window
    assert hashed == []
    st = os.stat(blob)
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # a write after the import: a new version, hashed again
        f.write(b"\0")
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with its mtime put back
    assert _check(BlobVerifier(), blob) is False


class _HeldVerifier(BlobVerifier):
    """The real verifier, whose hashing waits until :attr:`release` is set: a request
    that waited on a whole-blob check cannot be answered while it is held."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.started = 0

    def _run(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        self.started += 1
        self.release.wait(30)
        super()._run(*args, **kwargs)  # type: ignore[arg-type]


def test_a_range_short_of_the_end_and_a_head_never_wait_on_the_check(tmp_path: Path) -> None:
    """spec/hub-mirror.md 2.1 on a folder: for a blob without a check record, a range
    short of its end and a HEAD are answered while the check (started beside them) is
    held; a range holding the last byte waits at that byte until the check passes."""
    from aiohttp.test_utils import TestClient, TestServer
    from cmh.hub.mirror._app import make_app
    from cmh.hub.mirror._auth import AccessPolicy
    from cmh.hub.mirror._observe import Metrics
    from cmh.hub.mirror._state import MirrorState
    from cmh.hub.mirror.stores.local._store import LocalStore

    data = os.urandom(4 << 20)
    store, blob = _store_with_blob(tmp_path, data)
    record = record_path(blob, blob.name)
    assert record is not None
    record.unlink()  # as a store written by another tool leaves it
    verifier = _HeldVerifier()
    backend = LocalStore(store)
    backend.verifier = verifier  # the folder's deliveries share the store's verifier
    state = MirrorState(backend, AccessPolicy({}), Metrics(None))
    path = f"/{REPO}/resolve/main/weights.bin"

    async def run() -> None:
        async with TestClient(TestServer(make_app(state), host="127.0.0.1")) as client:
            head = await asyncio.wait_for(client.head(path), TEST_DEADLINE)
            assert head.status == 200 and head.headers["Content-Length"] == str(len(data))
            short = await asyncio.wait_for(
                client.get(path, headers={"Range": "bytes=1024-2047"}), TEST_DEADLINE
            )
            assert short.status == 206
            assert await asyncio.wait_for(short.read(), TEST_DEADLINE) == data[1024:2048]
            assert verifier.started == 1 and not record.exists()  # the check runs, held
            tail = await asyncio.wait_for(
                client.get(path, headers={"Range": "bytes=-1024"}), TEST_DEADLINE
            )
            assert tail.status == 206
            sent = await asyncio.wait_for(tail.content.readexactly(1023), TEST_DEADLINE)
            assert sent == data[-1024:-1]  # every byte but the last arrives at once
            last = asyncio.ensure_future(tail.content.read())
            # A held byte is a negative, seen only over a window: no clock can show it.
            await asyncio.sleep(0.5)
            assert not last.done()  # its last byte waits for the check
            verifier.release.set()
            assert await asyncio.wait_for(last, TEST_DEADLINE) == data[-1:]

    asyncio.run(run())
    time.sleep(0.1)
    assert read_record(record) is not None  # the check beside them was recorded


def test_scrub_never_quarantines_a_blob_a_re_import_repaired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a folder scrub hashed every blob, then moved each bad one away by its name. A
    re-import that replaced the bad file in between (under the blob lock) lost its good
    blob to the quarantine (503 for a served file) and its check record. Only the version
    hashed goes, as in a bucket store."""
    from cmh.hub.mirror import add_folder
    from cmh.hub.mirror.stores.local import _scrub as scrub

    data = os.urandom(1 << 20)
    store, blob = _store_with_blob(tmp_path, data)
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # it goes bad, same size
        f.seek(4096)
        f.write(b"\xff" * 16)
    hashed = scrub._check

    def hashed_then_re_imported(*args: Any) -> Any:
        out = hashed(*args)
        add_folder(store, tmp_path / "src", REPO)  # the re-import repairs the blob
        return out

    monkeypatch.setattr(scrub, "_check", hashed_then_re_imported)
    report = scrub.scrub_store(store, threads=1)
    [bad] = report.bad
    assert bad.quarantined_to is None and "not quarantined: replaced since" in bad.message
    assert blob.read_bytes() == data  # the repaired blob is served
    record = record_path(blob, blob.name)
    assert record is not None and read_record(record) == FileVersion.of(os.lstat(blob))
