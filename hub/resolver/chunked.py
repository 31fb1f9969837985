"""Whole downloads over parallel range connections, checked while the bytes arrive.

Real links cap each connection (CDNs commonly give 20-100 MB/s to one), so a
large file is fetched as fixed-size chunks over ``connections`` HTTP
connections at once (HTTP ``Range``, one chunk per request):

- chunks are written in place into ``.cmh/partial/{etag}.chunks`` (the file
  has its final size from the start; holes are chunks not yet fetched), and
  every finished chunk is appended to ``{etag}.chunks.log``; a rerun, in this
  process or another one (the caller holds the blob lock, the stock client's
  per-blob lock), fetches only the chunks the log does not list;
- a transfer that fails mid-chunk is resumed from the byte where it stopped,
  under the resolver's retry policy;
- :class:`OrderedFeed` feeds the file's bytes in order to the
  :class:`~cmh.hub.cache.blobs.ContentCheck` (the SHA-256 or git SHA-1 that
  names the blob, and the CMH manifest's per-tensor SHA-256) as soon as every
  byte before them is in, so the check runs beside the transfer instead of
  after it; each byte is hashed once;
- :class:`BackgroundSync` writes the file back to disk as it fills, so the
  ``fsync`` before the install finds little left to do.

A server that ignores ``Range`` (a ``200`` for a chunk) makes the caller fall
back to one connection (:class:`~cmh.hub.resolver.http.RangeNotSatisfied`).
Nothing is installed before the check accepts every byte.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from cmh._atomic import start_writeback

from ..cache.blobs import READ_CHUNK, ContentCheck, Progress, install_blob, partial_path
from ..cache.layout import RepoLayout
from .http import HubClient, Located
from .retry import DEFAULT_RETRY, RetryPolicy
from .types import HubUnreachableError, IntegrityError, InvalidRemoteFileError, RemoteFile

LOG_VERSION = "cmh-chunks v1"
#: The smallest chunk a file is cut into (unless the policy asks for smaller ones).
MIN_CHUNK = 4 << 20
#: A file is cut into about this many chunks when they would be smaller than the policy's size.
PIECES = 8
#: Bytes of a chunk in flight handed to the check at once.
FEED_STEP = 1 << 20
#: Bytes written between two background syncs.
SYNC_EVERY = 128 << 20


def chunk_size(size: int, chunk_bytes: int) -> int:
    """The chunk size for a file of ``size`` bytes: ``chunk_bytes`` at most.

    A smaller file is cut into about :data:`PIECES` chunks (whole MiB, at
    least :data:`MIN_CHUNK`). Depends on the size and the policy only, not on
    the number of connections, so a rerun with other settings still resumes.
    """
    piece = -(-size // PIECES)
    piece = -(-piece // (1 << 20)) * (1 << 20)
    return max(1, min(chunk_bytes, max(MIN_CHUNK, piece)))


def applies(size: int, connections: int, chunk_bytes: int) -> bool:
    """True when a file of ``size`` bytes is fetched over parallel connections."""
    return connections > 1 and size > chunk_size(size, chunk_bytes)


def chunks_path(repo: RepoLayout, etag: str) -> Path:
    """Where a chunked download of ``etag`` accumulates (holes allowed)."""
    repo.blob_path(etag)  # validates the name
    return repo.cmh_dir / "partial" / f"{etag}.chunks"


def has_partial(repo: RepoLayout, etag: str) -> bool:
    """True when a chunked download of ``etag`` was left to resume."""
    return chunks_path(repo, etag).with_name(f"{etag}.chunks.log").exists()


def discard(repo: RepoLayout, etag: str) -> None:
    """Remove a chunked download of ``etag`` and its log."""
    path = chunks_path(repo, etag)
    for p in (path, path.with_name(path.name + ".log")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


class OrderedFeed:
    """Feeds a file's bytes to a sink in order, as ranges of it become ready in any order.

    A worker thread reads each ready span from ``fd`` (the page cache: the
    bytes were just written) and gives it to ``sink``; :meth:`mark_ready`
    says which bytes are in place, :meth:`map_source` which are copies of
    another file's bytes (read from there, so the check need not wait for
    the copy). An exception from the sink (a tensor that
    does not match its manifest) stops the feed and is raised by :meth:`join`;
    :attr:`failed` lets writers stop early.
    """

    def __init__(self, sink: Callable[[bytes], None], fd: int, size: int) -> None:
        self._sink = sink
        self._fd = fd
        self._size = size
        self._ready: list[tuple[int, int]] = []  # merged [begin, end) spans
        self._sources: list[tuple[int, int, int, int]] = []  # (begin, end, fd, src begin)
        self._cond = threading.Condition()
        self._stopped = False
        self._error: BaseException | None = None
        self.fed = 0
        self._thread = threading.Thread(target=self._run, name="cmh-feed", daemon=True)

    def start(self) -> OrderedFeed:
        self._thread.start()
        return self

    @property
    def failed(self) -> bool:
        return self._error is not None

    def mark_ready(self, begin: int, end: int) -> None:
        """Bytes ``[begin, end)`` of the file are in place."""
        if end <= begin:
            return
        with self._cond:
            i = bisect.bisect_left(self._ready, (begin, begin))
            spans = self._ready
            spans.insert(i, (begin, end))
            merged: list[tuple[int, int]] = []
            for b, e in spans:
                if merged and b <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], e))
                else:
                    merged.append((b, e))
            self._ready = merged
            self._cond.notify_all()

    def map_source(self, begin: int, end: int, fd: int, src_begin: int) -> None:
        """Bytes ``[begin, end)`` are those at ``src_begin`` of ``fd`` (a checked blob
        they are being copied from): ready now, read from there."""
        if end <= begin:
            return
        with self._cond:
            i = bisect.bisect_left(self._sources, (begin,))
            self._sources.insert(i, (begin, end, fd, src_begin))
        self.mark_ready(begin, end)

    def _source(self, pos: int, end: int) -> tuple[int, int, int]:
        """Where to read byte ``pos``: (fd, offset in it, end of that stretch)."""
        with self._cond:
            i = bisect.bisect_right(self._sources, (pos, float("inf"))) - 1
            if i >= 0:
                begin, stop, fd, src = self._sources[i]
                if begin <= pos < stop:
                    return fd, src + pos - begin, min(end, stop)
            nxt = self._sources[i + 1][0] if i + 1 < len(self._sources) else end
            return self._fd, pos, min(end, max(nxt, pos + 1))

    def _ready_until(self, pos: int) -> int | None:
        i = bisect.bisect_right(self._ready, (pos, float("inf"))) - 1
        if i >= 0:
            b, e = self._ready[i]
            if b <= pos < e:
                return e
        return None

    def _run(self) -> None:
        pos = 0
        try:
            while pos < self._size:
                with self._cond:
                    while (end := self._ready_until(pos)) is None and not self._stopped:
                        self._cond.wait()
                    if end is None:
                        return
                while pos < end:
                    fd, at, limit = self._source(pos, end)
                    data = os.pread(fd, min(READ_CHUNK, limit - pos), at)
                    if not data:
                        raise IntegrityError(f"file ends at byte {pos} of {self._size}")
                    self._sink(data)
                    pos += len(data)
                    self.fed = pos
        except BaseException as exc:  # raised again by join()
            self._error = exc

    def stop(self) -> None:
        """Stop waiting for bytes that will not come."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def join(self) -> None:
        """Wait until every byte was fed (or the feed was stopped); raise what the sink raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error


class BackgroundSync:
    """Writes a file back to disk while it fills: writeback is started every
    :data:`SYNC_EVERY` bytes (:func:`cmh._atomic.start_writeback`, no flush), so the
    install's ``fsync`` finds little left to do."""

    def __init__(self, fd: int, every: int = SYNC_EVERY) -> None:
        self._fd = fd
        self._every = every
        self._written = 0
        self._synced = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="cmh-sync", daemon=True)
        self._thread.start()

    def wrote(self, nbytes: int) -> None:
        with self._cond:
            self._written += nbytes
            if self._written - self._synced >= self._every:
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._written - self._synced < self._every:
                    self._cond.wait()
                if self._closed:
                    return
                target = self._written
            with contextlib.suppress(OSError):  # the install's fsync reports real failures
                start_writeback(self._fd)
            with self._cond:
                self._synced = target

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()


class _Log:
    """``{etag}.chunks.log``: a key line, then one ``chunk {i}`` line per finished chunk."""

    def __init__(self, path: Path, key: str, count: int) -> None:
        self.path = path
        self.key = key
        self.count = count
        self._lock = threading.Lock()

    def load(self) -> set[int]:
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            return set()
        if not lines or lines[0] != self.key:
            return set()
        done = set()
        for line in lines[1:]:
            word, _, number = line.partition(" ")
            if word == "chunk" and number.isdigit() and int(number) < self.count:
                done.add(int(number))
        return done

    def start(self, done: set[int]) -> None:
        self.path.write_text(self.key + "\n" + "".join(f"chunk {i}\n" for i in sorted(done)))

    def add(self, index: int) -> None:
        with self._lock, open(self.path, "a") as f:
            f.write(f"chunk {index}\n")


class _Stop(Exception):
    """Another part of the download failed: stop this transfer."""


def download_chunked(
    client: HubClient,
    repo: RepoLayout,
    remote: RemoteFile,
    url: str,
    *,
    connections: int,
    chunk_bytes: int,
    strict: bool = False,
    retry: RetryPolicy = DEFAULT_RETRY,
    progress: Progress | None = None,
) -> tuple[int, bool, list[str]]:
    """Fetch blob ``remote.etag`` over ``connections`` range connections, resuming logged chunks.

    The caller holds the blob lock. Returns (bytes received, resumed,
    warnings). A chunk whose transfer keeps failing ends the download with
    :class:`HubUnreachableError` (finished chunks are kept for a rerun);
    content that fails its check is discarded and fetched once more from
    byte 0, then refused with :class:`IntegrityError`.
    """
    size = remote.size
    chunk = chunk_size(size, chunk_bytes)
    count = -(-size // chunk)
    path = chunks_path(repo, remote.etag)
    path.parent.mkdir(parents=True, exist_ok=True)
    log = _Log(
        path.with_name(path.name + ".log"), f"{LOG_VERSION} {remote.etag} {size} {chunk}", count
    )
    received = 0
    resumed = False
    integrity_failures = 0
    weights = remote.path.endswith(".safetensors")
    check = ContentCheck(
        remote.etag, size, safetensors=weights, strict=strict, name=remote.path if weights else None
    )
    located = Located(url)  # after the first redirect, chunks go straight where it led
    while True:
        done = _prepare(repo, remote, path, log, chunk)
        resumed = resumed or (bool(done) and integrity_failures == 0)
        if integrity_failures:
            check.reset()
        try:
            received += _transfer(
                client, located, path, log, size, chunk, done, check, connections, retry, progress
            )
            check.finish()
        except InvalidRemoteFileError:
            discard(repo, remote.etag)
            raise
        except IntegrityError as exc:
            discard(repo, remote.etag)
            integrity_failures += 1
            if integrity_failures >= 2:
                raise IntegrityError(f"{remote.path}: {exc}; refused, nothing installed") from None
            continue
        except HubUnreachableError as exc:
            kept = len(log.load())
            raise HubUnreachableError(
                f"{remote.path}: download failed ({exc}); {kept} of {count} chunks kept for "
                "resuming",
                retry_after=exc.retry_after,
            ) from exc
        install_blob(repo, remote.etag, path, check)
        for leftover in (log.path, partial_path(repo, remote.etag)):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        return received, resumed, check.warnings


def _prepare(repo: RepoLayout, remote: RemoteFile, path: Path, log: _Log, chunk: int) -> set[int]:
    """Open or start the chunk file; the chunks already in it."""
    size = remote.size
    done: set[int] = set()
    if path.exists() and path.stat().st_size == size:
        done = log.load()
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        prefix = partial_path(repo, remote.etag)
        try:
            have = prefix.stat().st_size
        except FileNotFoundError:
            have = 0
        if 0 < have <= size:
            # A whole download's prefix (ours, or a stock client's): its full chunks count.
            os.replace(prefix, path)
            count = -(-size // chunk)
            done = set(range(count)) if have == size else set(range(have // chunk))
    with open(path, "ab") as f:
        f.truncate(size)
    log.start(done)
    return done


def _transfer(
    client: HubClient,
    url: Located,
    path: Path,
    log: _Log,
    size: int,
    chunk: int,
    done: set[int],
    check: ContentCheck,
    connections: int,
    retry: RetryPolicy,
    progress: Progress | None,
) -> int:
    """Fetch the chunks not in ``done`` while the feed checks the file in order."""
    count = -(-size // chunk)
    todo = [i for i in range(count) if i not in done]
    fd = os.open(path, os.O_RDWR)
    feed = OrderedFeed(check.update, fd, size).start()
    sync = BackgroundSync(fd)
    lock = threading.Lock()
    received = 0
    stop = threading.Event()

    def fetch(index: int) -> None:
        nonlocal received
        if stop.is_set():
            raise _Stop
        begin, end = index * chunk, min(size, (index + 1) * chunk)
        pos = shown = begin

        def sink(data: bytes) -> None:
            nonlocal pos, shown, received
            if stop.is_set() or feed.failed:
                raise _Stop
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, pos)
                view = view[n:]
                pos += n
            if pos - shown >= FEED_STEP:  # the check follows the chunk as it arrives
                feed.mark_ready(shown, pos)
                shown = pos
            with lock:
                received += len(data)
            if progress is not None:
                progress(len(data))

        retry.run(lambda: client.stream(url, pos, sink, end=end), f"chunk {index}", notice=False)
        log.add(index)
        feed.mark_ready(begin, end)
        sync.wrote(end - begin)

    try:
        for i in sorted(done):
            feed.mark_ready(i * chunk, min(size, (i + 1) * chunk))
        if todo:
            with ThreadPoolExecutor(max_workers=min(connections, len(todo))) as pool:
                futures = [pool.submit(fetch, i) for i in todo]
                finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failure = next((f.exception() for f in finished if f.exception()), None)
                if failure is not None:
                    stop.set()
                    feed.stop()
                    wait(futures)
                    errors = [f.exception() for f in futures if f.exception()]
                    real = [e for e in errors if not isinstance(e, _Stop)]
                    if not real and feed.failed:
                        feed.join()  # the check refused the bytes: its error is the cause
                    raise (real or errors)[0]  # type: ignore[misc]
        feed.join()
    finally:
        feed.stop()
        with contextlib.suppress(Exception):
            feed.join()
        sync.close()
        os.close(fd)
    return received
