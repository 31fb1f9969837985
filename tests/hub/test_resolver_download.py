"""Downloads at link speed: parallel range connections, checks while receiving, kernel copies.

The Hub is ``cmh serve`` behind the Hub-like front (``hublike.py``: 302 to a CDN
origin that serves one range per request); small chunk sizes make a few-MB
checkpoint span many chunks.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import cmh.hub as hub
import pytest
from cmh.hub.cache import THREADED_DIGEST_BYTES, ContentCheck, IntegrityError, RepoLayout
from cmh.hub.mirror import add_folder
from cmh.hub.resolver import _transfer
from cmh.hub.resolver._chunked import chunks_path
from cmh.hub.resolver._transfer import (
    BackgroundSync,
    Filling,
    OrderedFeed,
    Tally,
    _batches,
    chunk_size,
)
from hublike import running
from mirror_support import MirrorServer
from resolver_support import write_checkpoint_repo

CHUNK = 256 << 10
WEIGHTS = "model.safetensors"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def fast_server(tmp_path_factory):
    """One ``cmh serve`` for the module (the subject is the resolver's download, not the
    server): each test adds a repo of its own to its store."""
    base = tmp_path_factory.mktemp("fast-hub")
    store = base / "store"
    add_folder(store, write_checkpoint_repo(base / "seed", 1), "org/seed")
    with MirrorServer(store, base / "logs") as server:
        yield server


@pytest.fixture
def repo(tmp_path, fast_server):
    """A repo of its own, org/fast-* v1 (a 6.4 MB stamped checkpoint), in the module's
    store and server."""
    repo_id = f"org/fast-{uuid.uuid4().hex[:8]}"
    store = Path(fast_server.store)
    src = write_checkpoint_repo(tmp_path / "v1", 1, count=8, elems=200_000)
    add_folder(store, src, repo_id)

    class Repo:
        pass

    r = Repo()
    r.id, r.store, r.server, r.src, r.tmp = repo_id, store, fast_server, src, tmp_path
    r.cache = tmp_path / "cache"
    r.layout = RepoLayout(r.cache, repo_id)
    r.weights = src / WEIGHTS
    r.etag = sha256(r.weights)
    r.size = r.weights.stat().st_size
    return r


def policy(**kw) -> hub.Policy:
    kw.setdefault("connections", 4)
    kw.setdefault("chunk_bytes", CHUNK)
    return hub.Policy(**kw)


def weight_gets(front) -> list:
    return [r for r in front.records(origin="cdn", method="GET") if r.status in (200, 206)]


def range_start(record) -> int:
    value = record.headers["range"]
    return int(value.removeprefix("bytes=").split("-")[0])


def test_large_file_comes_over_parallel_ranges(repo):
    with running(repo.server.url) as front:
        res = hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
        gets = weight_gets(front)
    by_path = {f.path: f for f in res.files}
    assert by_path[WEIGHTS].action is hub.Action.DOWNLOADED
    assert by_path[WEIGHTS].bytes_transferred == repo.size
    assert sha256(res.path / WEIGHTS) == repo.etag
    count = -(-repo.size // CHUNK)
    assert sorted(range_start(r) for r in gets) == [i * CHUNK for i in range(count)]
    assert all(r.status == 206 for r in gets)
    assert not chunks_path(repo.layout, repo.etag).exists()
    assert not list(chunks_path(repo.layout, repo.etag).parent.glob("*.log"))


def test_same_blob_as_one_connection(repo):
    one = repo.tmp / "cache-one"
    with running(repo.server.url) as front:
        a = hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
        b = hub.resolve(repo.id, cache_dir=one, endpoint=front.url, policy=policy(connections=1))
        single = weight_gets(front)[-1]
    assert "range" not in single.headers  # one plain GET
    assert (a.path / WEIGHTS).read_bytes() == (b.path / WEIGHTS).read_bytes()
    assert os.path.realpath(a.path / WEIGHTS).endswith(repo.etag)


def test_chunks_resume_one_by_one_after_a_cut(repo):
    """Connections cut mid-download: finished chunks are kept; the rerun fetches only the rest."""
    with running(repo.server.url) as front:
        seen = 0
        armed = threading.Event()

        def progress(n: int) -> None:
            nonlocal seen
            seen += n
            if seen >= 3 * CHUNK and not armed.is_set():
                armed.set()  # from now on every CDN answer is cut after 1000 bytes
                front.cut(1000, times=100_000, origin="cdn")

        with pytest.raises(hub.HubUnreachableError, match="chunks kept for resuming"):
            hub.resolve(
                repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy(connections=2),
                progress=progress,
            )  # fmt: skip
        front.wait_idle()
    log = chunks_path(repo.layout, repo.etag).with_name(f"{repo.etag}.chunks.log")
    kept = {int(line.split()[1]) for line in log.read_text().splitlines()[1:]}
    count = -(-repo.size // CHUNK)
    assert 3 <= len(kept) < count
    assert repo.layout.read_ref("main") is None  # nothing half-done is visible

    with running(repo.server.url) as front:
        res = hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
        starts = sorted(range_start(r) for r in weight_gets(front))
    missing = sorted(set(range(count)) - kept)
    assert starts == [i * CHUNK for i in missing]
    by_path = {f.path: f for f in res.files}
    assert by_path[WEIGHTS].action is hub.Action.RESUMED
    kept_bytes = sum(min(repo.size, (i + 1) * CHUNK) - i * CHUNK for i in kept)
    assert by_path[WEIGHTS].bytes_transferred == repo.size - kept_bytes
    assert sha256(res.path / WEIGHTS) == repo.etag
    assert not log.exists()


def test_cut_mid_chunk_resumes_within_the_chunk(repo):
    with running(repo.server.url) as front:
        front.cut(CHUNK // 2, times=3, origin="cdn")
        res = hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
        gets = weight_gets(front)
    assert sha256(res.path / WEIGHTS) == repo.etag
    resumed = [r for r in gets if range_start(r) % CHUNK == CHUNK // 2]
    assert len(resumed) == 3  # each cut chunk continued from its byte, not from its start


def test_wrong_bytes_are_refused_and_nothing_is_installed(repo):
    with running(repo.server.url) as front:
        front.corrupt(repo.etag)
        with pytest.raises(hub.IntegrityError, match="refused, nothing installed"):
            hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
    assert not repo.layout.blob_path(repo.etag).exists()
    assert not chunks_path(repo.layout, repo.etag).exists()
    assert repo.layout.read_ref("main") is None


def test_a_server_that_ignores_range_gets_one_connection(repo):
    with running(repo.server.url) as front:
        front.ignore_range = True
        res = hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
    assert sha256(res.path / WEIGHTS) == repo.etag
    assert not chunks_path(repo.layout, repo.etag).exists()


def test_stock_partial_is_adopted_as_whole_chunks(repo):
    """A whole download's prefix (``blobs/{etag}.incomplete``) counts for the chunks it covers."""
    data = repo.weights.read_bytes()
    repo.layout.blobs.mkdir(parents=True)
    have = 5 * CHUNK + 1000
    (repo.layout.blobs / f"{repo.etag}.incomplete").write_bytes(data[:have])
    with running(repo.server.url) as front:
        res = hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
        starts = sorted(range_start(r) for r in weight_gets(front))
    assert starts[0] == 5 * CHUNK
    assert {f.path: f for f in res.files}[WEIGHTS].action is hub.Action.RESUMED
    assert sha256(res.path / WEIGHTS) == repo.etag
    assert not list(repo.layout.blobs.glob("*.incomplete"))


def test_update_copies_unchanged_tensors_and_fetches_ranges_in_parallel(repo):
    with running(repo.server.url) as front:
        hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
        # v1 wrote tensor 3 from its version too: four tensors change.
        v2 = write_checkpoint_repo(repo.tmp / "v2", 2, count=8, elems=200_000, changed=(1, 3, 4, 6))
        add_folder(repo.store, v2, repo.id)
        front.clear_records()
        res = hub.resolve(
            repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy(revalidate=True)
        )
        gets = weight_gets(front)
    f = {x.path: x for x in res.files}[WEIGHTS]
    assert f.action is hub.Action.PATCHED
    assert sha256(res.path / WEIGHTS) == sha256(v2 / WEIGHTS)
    tensor = 200_000 * 4
    assert f.bytes_reused >= 4 * tensor  # four unchanged tensors copied from the old blob
    assert f.bytes_transferred < 4 * tensor + (256 << 10)
    # Four changed tensors of 800 kB in 256 KiB pieces, one range per request (the CDN
    # does not answer multi-range requests with multipart).
    assert len([r for r in gets if "range" in r.headers]) >= 4 * (tensor // CHUNK)


@pytest.mark.parametrize("connections", [1, 2, 4])
def test_update_takes_adjacent_ranges_a_server_coalesced(repo, connections):
    """``cmh serve`` answers adjacent asked ranges as one multipart part (RFC 9110 14.2);
    the update takes it, whatever the number of connections, instead of a whole download."""
    hub.resolve(repo.id, cache_dir=repo.cache, endpoint=repo.server.url, policy=policy())
    v2 = write_checkpoint_repo(repo.tmp / "v2", 2, count=8, elems=200_000, changed=(1, 3, 4, 6))
    add_folder(repo.store, v2, repo.id)
    res = hub.resolve(
        repo.id,
        cache_dir=repo.cache,
        endpoint=repo.server.url,
        policy=policy(revalidate=True, connections=connections),
    )
    f = {x.path: x for x in res.files}[WEIGHTS]
    assert f.action is hub.Action.PATCHED
    assert sha256(res.path / WEIGHTS) == sha256(v2 / WEIGHTS)
    # Each changed tensor (800 kB) is asked for as adjacent 256 KiB pieces, which the
    # server answers as one part; before the fix that made the whole file come again.
    assert f.bytes_transferred < 4 * 200_000 * 4 + (256 << 10)


def test_update_refuses_a_fetched_tensor_with_wrong_bytes(repo):
    """Kernel copies and in-order checking keep every check: wrong fetched bytes never install."""
    with running(repo.server.url) as front:
        first = hub.resolve(repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy())
        v2 = write_checkpoint_repo(repo.tmp / "v2", 2, count=8, elems=200_000, changed=(2,))
        add_folder(repo.store, v2, repo.id)
        new_etag = sha256(v2 / WEIGHTS)
        front.corrupt(new_etag)
        with pytest.raises(hub.IntegrityError):
            hub.resolve(
                repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy(revalidate=True)
            )
    assert not repo.layout.blob_path(new_etag).exists()
    assert repo.layout.read_ref("main") == first.commit


def test_ordered_feed_gives_bytes_in_order_whatever_order_they_land(tmp_path):
    data = random.Random(3).randbytes(3 << 20)
    path = tmp_path / "f"
    path.write_bytes(bytes(len(data)))
    fd = os.open(path, os.O_RDWR)
    got = hashlib.sha256()
    try:
        feed = OrderedFeed(got.update, fd, len(data)).start()
        spans = [(b, min(len(data), b + 100_000)) for b in range(0, len(data), 100_000)]
        random.Random(4).shuffle(spans)
        for b, e in spans:
            os.pwrite(fd, data[b:e], b)
            feed.mark_ready(b, e)
        feed.join()
    finally:
        os.close(fd)
    assert got.hexdigest() == hashlib.sha256(data).hexdigest()


UPDATE_SIZE = 40 << 20
#: Changed spans of the update below: fetched bytes, the rest comes from the old file.
FETCHED = [(5 << 20, (5 << 20) + 65_536), (23 << 20, (23 << 20) + 131_072)]


def _fill_like_an_update(
    new: Path, old: Path, data: bytes, etag: str
) -> tuple[int, Exception | None]:
    """Fill ``new`` as an update does: the unchanged spans copied from ``old`` (the check
    reads them there), the changed ones written; returns the peak of Python allocations
    while the file filled and was checked, and what the check raised."""
    check = ContentCheck(etag, len(data), safetensors=False)
    fetched = [data[b:e] for b, e in FETCHED]
    old_fd = os.open(old, os.O_RDONLY)
    tracemalloc.start()
    try:
        with Filling(new, len(data), check, Tally()) as filling:
            os.ftruncate(filling.fd, len(data))
            pos = 0
            for b, e in FETCHED:
                filling.feed.map_source(pos, b, old_fd, pos)
                pos = e
            filling.feed.map_source(pos, len(data), old_fd, pos)
            for (b, e), chunk in zip(FETCHED, fetched, strict=True):
                filling.write(b, chunk)
                filling.ready(b, e)
            filling.finish()
        check.finish()
        error = None
    except IntegrityError as exc:
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        os.close(old_fd)
    return peak, error


@pytest.mark.parametrize("old_matches", [True, False])
def test_an_update_checks_copied_bytes_in_place_without_a_copy(tmp_path, old_matches):
    """The check of an update reads the unchanged bytes from a mapping of the old blob and
    hashes them there, the whole-file digest on its own thread included: no 8 MiB
    buffer per read (the old feed read every byte into fresh buffers, up to 64 queued).
    Every byte is still checked: an old file that differs is refused."""
    assert UPDATE_SIZE >= THREADED_DIGEST_BYTES  # the digest runs on its own thread
    data = random.Random(5).randbytes(UPDATE_SIZE)
    etag = hashlib.sha256(data).hexdigest()
    old = tmp_path / "old"
    old_bytes = bytearray(data)
    for b, e in FETCHED:  # the old version's changed tensors
        old_bytes[b:e] = bytes(e - b)
    if not old_matches:
        old_bytes[30 << 20] ^= 1
    old.write_bytes(old_bytes)
    del old_bytes
    peak, error = _fill_like_an_update(tmp_path / "new", old, data, etag)
    assert peak < 1 << 20, f"{peak:,} bytes allocated while checking"
    if old_matches:
        assert error is None
        assert (tmp_path / "new").read_bytes()[FETCHED[1][0] : FETCHED[1][1]] == data[
            FETCHED[1][0] : FETCHED[1][1]
        ]
    else:
        assert isinstance(error, IntegrityError)


def test_a_copy_source_shorter_than_planned_is_refused_not_a_crash(tmp_path):
    """Bytes mapped from a file that ends early: a typed refusal (a mapping read past
    the end of a file would kill the process)."""
    data = random.Random(6).randbytes(1 << 20)
    short = tmp_path / "old"
    short.write_bytes(data[:600_000])
    path = tmp_path / "new"
    path.write_bytes(bytes(len(data)))
    fd, old_fd = os.open(path, os.O_RDWR), os.open(short, os.O_RDONLY)
    got = hashlib.sha256()
    try:
        feed = OrderedFeed(got.update, fd, len(data)).start()
        feed.map_source(0, len(data), old_fd, 0)
        with pytest.raises(IntegrityError, match="file ends at byte 600000"):
            feed.join()
    finally:
        os.close(fd)
        os.close(old_fd)


_TRUNCATED_UNDER_THE_FEED = """
import hashlib, os, sys
from cmh.hub.cache import IntegrityError
from cmh.hub.resolver._transfer import OrderedFeed

old, new = sys.argv[1], sys.argv[2]
size = os.path.getsize(old)
fd, old_fd = os.open(new, os.O_RDWR), os.open(old, os.O_RDONLY)
got, truncated = hashlib.sha256(), []

def sink(view):
    got.update(view)
    if not truncated:  # another process truncates the old blob mid-update
        truncated.append(os.truncate(old, 1 << 20))

feed = OrderedFeed(sink, fd, size).start()
feed.map_source(0, size, old_fd, 0)
try:
    feed.join()
except IntegrityError as exc:
    print("refused:", exc)
"""


def test_a_copy_source_truncated_while_it_is_read_is_refused_not_a_crash(tmp_path):
    """The old blob an update copies from, truncated by another process after the check
    began reading it: a typed refusal. It was read through a mapping, and the next read
    past the new end killed the process with SIGBUS (so this runs in a child process)."""
    import subprocess
    import sys

    old, new = tmp_path / "old", tmp_path / "new"
    size = 32 << 20
    old.write_bytes(random.Random(7).randbytes(size))
    new.write_bytes(bytes(size))
    done = subprocess.run(
        [sys.executable, "-c", _TRUNCATED_UNDER_THE_FEED, str(old), str(new)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert f"refused: file ends at byte {1 << 20} of {size}" in done.stdout, done.stdout


def test_the_tail_of_a_filled_file_goes_to_disk_while_the_check_finishes(tmp_path, monkeypatch):
    """Writeback starts every SYNC_EVERY bytes while a file fills, and for the rest once
    every byte is in (the check may still be hashing), not only at the install's fsync."""
    started: list[int] = []

    def start_writeback(fd: int) -> None:  # the real call, recorded
        started.append(fd)
        os.fsync(fd)

    monkeypatch.setattr(_transfer, "start_writeback", start_writeback)
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    fd = os.open(path, os.O_RDWR)
    try:
        sync = BackgroundSync(fd, every=1 << 30)
        sync.wrote(4096)  # far below the threshold: nothing yet
        sync.flush()
        sync.close()
    finally:
        os.close(fd)
    assert started == [fd]


def test_chunk_size_depends_on_size_and_policy_only():
    assert chunk_size(1 << 30, 16 << 20) == 16 << 20
    assert chunk_size(64 << 20, 16 << 20) == 8 << 20  # about eight pieces
    assert chunk_size(10 << 20, 16 << 20) == 4 << 20  # never below 4 MiB by default
    assert chunk_size(10 << 20, CHUNK) == CHUNK


def test_update_ranges_are_spread_evenly_over_every_connection():
    # Eight 5 MiB ranges, then eight of 1 MiB, over 8 connections: one 5 and one 1 each.
    # Filling groups in file order up to an even share gave four groups of 10 MiB (and
    # two connections idle): the update's fetch took the time of the heaviest group.
    mib = 1 << 20
    sizes = [5] * 8 + [1] * 8
    ranges, at = [], 0
    for n in sizes:
        ranges.append((at, at + n * mib))
        at += n * mib + mib  # a gap: ranges are never adjacent
    batches = _batches(ranges, 8)
    assert sorted(s for b in batches for s in b) == ranges  # each range once
    assert all(b == sorted(b) for b in batches)  # each request in file order
    assert len(batches) == 8
    assert max(sum(e - s for s, e in b) for b in batches) == 6 * mib


def test_connections_setting(monkeypatch):
    monkeypatch.setenv("CMH_DOWNLOAD_CONNECTIONS", "3")
    assert hub.Policy().connections == 3
    monkeypatch.setenv("CMH_DOWNLOAD_CONNECTIONS", "many")
    with pytest.raises(ValueError, match="CMH_DOWNLOAD_CONNECTIONS"):
        hub.Policy()
    monkeypatch.delenv("CMH_DOWNLOAD_CONNECTIONS")
    assert hub.Policy().connections == 8
    with pytest.raises(ValueError):
        hub.Policy(connections=0)


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_pull_shows_bytes_and_rate_on_a_terminal(repo):
    import select
    import subprocess
    import sys
    import time

    master, slave = os.openpty()
    env = {**os.environ, "COLUMNS": "120", "HF_HUB_CACHE": str(repo.cache)}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cmh.cli.main", "pull", repo.id, "--endpoint", repo.server.url,
             "--connections", "4"],
            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        os.close(slave)
        terminal = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                terminal += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(master)
    text = terminal.decode(errors="replace")
    assert f"pull {repo.id} (4 conn)" in text and "B/s" in text
    assert sha256(repo.layout.blob_path(repo.etag)) == repo.etag


def test_a_file_size_limit_is_a_typed_error_and_leaves_no_chunks(repo):
    """RLIMIT_FSIZE (EFBIG) on a chunked download: DiskFullError, chunk file and log removed."""
    import json
    import resource
    import signal
    import subprocess
    import sys

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))

    env = {**os.environ, "CMH_DOWNLOAD_CONNECTIONS": "4"}
    env.pop("HF_HUB_OFFLINE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "pull", repo.id, "--cache-dir", str(repo.cache),
         "--endpoint", repo.server.url, "--json"],
        capture_output=True, text=True, env=env, timeout=120, preexec_fn=limit,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["error_kind"] == "disk_full", doc
    partial = chunks_path(repo.layout, repo.etag)
    assert not partial.exists() and not partial.with_name(partial.name + ".log").exists()
    assert not repo.layout.blob_path(repo.etag).exists()


def test_chunks_follow_one_redirect_and_the_token_never_reaches_the_cdn(repo):
    """One ``resolve`` request per file: the chunks go straight to the signed CDN URL it led
    to, without the Hub token (which only the Hub origin receives)."""
    with running(repo.server.url) as front:
        res = hub.resolve(
            repo.id, cache_dir=repo.cache, endpoint=front.url, token="hf_secret", policy=policy()
        )
        hub_gets = front.records(origin="hub", method="GET", path=f"/resolve/.*/{WEIGHTS}$")
        gets = weight_gets(front)
        saw_token = front.cdn_saw_authorization
    assert sha256(res.path / WEIGHTS) == repo.etag
    count = -(-repo.size // CHUNK)
    assert len(gets) == count  # every chunk once
    # One redirect per connection at most (the first requests race), not one per chunk.
    assert 1 <= len(hub_gets) <= 4 < count
    assert not saw_token
    assert res.requests <= count + 4 + 8  # chunks, redirects, metadata and the small files


def test_an_expired_cdn_url_sends_the_chunk_back_through_the_hub(repo):
    """The signed URL expires mid-download: the next chunk asks the Hub again, and lands right."""
    with running(repo.server.url, url_lifetime=2) as front:  # the first URLs last 1 to 2 s
        deadline: list[float] = []
        lock = threading.Lock()

        def progress(n: int) -> None:
            with lock:
                if not deadline:
                    deadline.append(time.monotonic() + 2.2)
            # Every connection waits until the URLs issued so far have expired ... (a real
            # wait: moving the front's clock instead also expires a URL between its issue and
            # its first use, which the resolver rightly takes for a refusal, not an expiry)
            time.sleep(max(0.0, deadline[0] - time.monotonic()))
            front.url_lifetime = 3600  # ... and those issued from now on last.

        res = hub.resolve(
            repo.id, cache_dir=repo.cache, endpoint=front.url, policy=policy(connections=2),
            progress=progress,
        )  # fmt: skip
        refused = [r for r in front.records(origin="cdn") if r.status == 403]
        hub_gets = front.records(origin="hub", method="GET", path=f"/resolve/.*/{WEIGHTS}$")
    assert sha256(res.path / WEIGHTS) == repo.etag
    assert {f.path: f for f in res.files}[WEIGHTS].action is hub.Action.DOWNLOADED
    assert refused  # the reused URL was refused once it expired ...
    assert len(hub_gets) > 2  # ... and the next chunks asked the Hub again
