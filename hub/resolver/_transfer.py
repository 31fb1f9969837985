"""The resolver's one transfer engine: a file filled in place from byte ranges, checked as it fills.

Whole downloads over parallel connections (:mod:`cmh.hub.resolver._chunked`)
and tensor-level updates (:mod:`cmh.hub.resolver._partial`) are the same job
with other pieces: a file of known size is written in place (holes allowed)
from ranges that arrive in any order over several connections, and checked
in order while they arrive. This module does that job once:

- :class:`Filling` owns the open file, the :class:`OrderedFeed` that gives
  its bytes in order to the :class:`~cmh.hub.cache.ContentCheck`, the
  :class:`BackgroundSync` that writes it back while it fills, and the one
  teardown of the three;
- :meth:`Filling.fetch_range` streams one range into place, resumed from the
  byte where a dropped transfer stopped; :meth:`Filling.fetch_ranges` sends
  several as ``multipart/byteranges`` requests, else one request per range;
- :meth:`Filling.run` runs pieces over parallel connections; the first
  failure stops the others, and the error raised is the cause (the check's
  refusal rather than the pieces it stopped);
- :class:`SegmentLog` records finished pieces beside the file, so a rerun (in
  this process or another one, under the blob lock) fetches only the rest;
- :class:`Tally` counts every byte received for a file, over every attempt
  and both engines' fallbacks, as it crossed the wire.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from cmh.hub.cache import READ_CHUNK, ContentCheck, Progress, RepoLayout

from cmh import start_writeback

from ._http import HubClient, Located, RangeNotSatisfied
from ._retry import DEFAULT_RETRY, RetryPolicy
from ._types import IntegrityError, RemoteFile

#: The smallest chunk a file is cut into (unless the policy asks for smaller ones).
MIN_CHUNK = 4 << 20
#: A file is cut into about this many chunks when they would be smaller than the policy's size.
PIECES = 8
#: Bytes of a range in flight handed to the check at once.
FEED_STEP = 1 << 20
#: Bytes of one read of a copy source, and the buffers such reads fill in turn.
SOURCE_PIECE = 128 << 10
SOURCE_BUFFERS = 4
#: Bytes written between two background syncs.
SYNC_EVERY = 128 << 20
#: The fewest bytes one extra parallel connection is opened for (multi-range batches).
MIN_GROUP_BYTES = 1 << 20
#: Ranges per multi-range request (the mirror accepts 64).
MAX_RANGES_PER_REQUEST = 32

Span = tuple[int, int]  # [begin, end)


def chunk_size(size: int, chunk_bytes: int) -> int:
    """The piece size for ``size`` bytes: ``chunk_bytes`` at most.

    Less is cut into about :data:`PIECES` pieces (whole MiB, at least
    :data:`MIN_CHUNK`). Depends on the size and the policy only, not on the
    number of connections, so a rerun with other settings still resumes.
    """
    piece = -(-size // PIECES)
    piece = -(-piece // (1 << 20)) * (1 << 20)
    return max(1, min(chunk_bytes, max(MIN_CHUNK, piece)))


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd``."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def discard(*paths: Path) -> None:
    """Remove files that may not exist."""
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


class Stopped(Exception):
    """Another piece of the transfer failed, or the check refused the file: stop this one."""


class Tally:
    """Bytes received for one file, over every attempt: what crossed the wire for it.

    ``progress`` is told of each count that is shown (a prefix fetched to
    plan an update is counted, and shown once the plan is made).
    """

    def __init__(self, progress: Progress | None = None) -> None:
        self.total = 0
        self.progress = progress
        self._lock = threading.Lock()

    def held(self, nbytes: int) -> None:
        """Bytes an earlier, interrupted download already holds: shown (a resumed bar
        starts where it stopped), not counted as received."""
        if nbytes > 0 and self.progress is not None:
            self.progress(nbytes)

    def add(self, nbytes: int, *, shown: bool = True) -> None:
        with self._lock:
            self.total += nbytes
        if shown and self.progress is not None:
            self.progress(nbytes)


@dataclass(frozen=True)
class Job:
    """One file to bring into the cache: where from (``url`` through ``client``), into
    which cache, checked how strictly, over how many connections, counted where."""

    client: HubClient
    repo: RepoLayout
    remote: RemoteFile
    url: str
    strict: bool = False
    connections: int = 1
    chunk_bytes: int = MIN_CHUNK
    retry: RetryPolicy = DEFAULT_RETRY
    tally: Tally = field(default_factory=Tally)


@dataclass(frozen=True)
class Source:
    """Where the bytes come from: ``url`` (redirects remembered) through ``client``."""

    client: HubClient
    url: Located
    retry: RetryPolicy = DEFAULT_RETRY


class SegmentLog:
    """``{file}.log``: a key line naming what is filled, then one line per finished piece."""

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self.key = key
        self.done: set[str] = set()
        self._lock = threading.Lock()

    def load(self) -> set[str] | None:
        """The pieces an earlier run of the same key finished, ``None`` without such a log."""
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            return None
        if not lines or lines[0] != self.key:
            return None
        return set(lines[1:])

    def start(self, done: Iterable[str] = ()) -> None:
        """Begin the log afresh, listing ``done`` as finished."""
        self.done = set(done)
        self.path.write_text(self.key + "\n" + "".join(f"{e}\n" for e in sorted(self.done)))

    def add(self, entry: str) -> None:
        with self._lock:
            with open(self.path, "a") as f:
                f.write(entry + "\n")
            self.done.add(entry)


class OrderedFeed:
    """Feeds a file's bytes to a sink in order, as ranges of it become ready in any order.

    A worker thread gives each ready span to ``sink`` as a view:
    :meth:`mark_ready` says which bytes of ``fd`` are in place (read from the
    page cache into bytes of their own: they were just written),
    :meth:`map_source` which are copies of another file's bytes, read from
    that file (so the check need not wait for the copy) into
    :data:`SOURCE_BUFFERS` buffers of :data:`SOURCE_PIECE` bytes used in turn:
    before a buffer is used again, ``settle`` waits until the sink holds no
    view given before (``ContentCheck.drain``: its digest thread hashed
    them), so an update's unchanged bytes cost no memory beyond those
    buffers. No file is mapped: another process truncating a mapped file
    kills this one with ``SIGBUS`` at the next read past the new end, where
    a read returns fewer bytes and the feed refuses the file
    (:class:`IntegrityError`). Views stay as given once the feed ends. An
    exception from the sink (a tensor that does not match its manifest)
    stops the feed and is raised by :meth:`join`; :attr:`failed` lets
    writers stop early.
    """

    def __init__(
        self,
        sink: Callable[[memoryview], None],
        fd: int,
        size: int,
        settle: Callable[[], None] = lambda: None,
    ) -> None:
        self._sink = sink
        self._settle = settle  # default: the sink keeps no view once it returned
        self._buffers: list[bytearray] = []
        self._turn = 0  # source reads so far: the next uses buffer turn % SOURCE_BUFFERS
        self._fd = fd
        self._size = size
        self._ready: list[Span] = []  # merged [begin, end) spans
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
            merged: list[Span] = []
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
                    data = self._view(fd, at, min(READ_CHUNK, limit - pos))
                    if not data:
                        raise IntegrityError(f"file ends at byte {pos} of {self._size}")
                    self._sink(data)
                    pos += len(data)
                    self.fed = pos
        except BaseException as exc:  # raised again by join()
            self._error = exc

    def _view(self, fd: int, at: int, n: int) -> memoryview:
        """Bytes ``[at, at + n)`` of ``fd`` (fewer where the file ends): of their own
        for the file being filled, in the next of the reused buffers for a source."""
        if fd == self._fd:
            return memoryview(os.pread(fd, n, at))
        if not self._buffers:
            self._buffers = [bytearray(SOURCE_PIECE) for _ in range(SOURCE_BUFFERS)]
        turn = self._turn % SOURCE_BUFFERS
        if turn == 0 and self._turn:
            self._settle()  # every buffer was handed out: none is held any more after this
        self._turn += 1
        view = memoryview(self._buffers[turn])[: min(n, SOURCE_PIECE)]
        return view[: os.preadv(fd, [view], at)]

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
    :data:`SYNC_EVERY` bytes (:func:`cmh.start_writeback`, no flush), so the
    install's ``fsync`` finds little left to do; :meth:`flush` starts the rest
    at once."""

    def __init__(self, fd: int, every: int = SYNC_EVERY) -> None:
        self._fd = fd
        self._every = every
        self._written = 0
        self._synced = 0
        self._closed = False
        self._flushing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="cmh-sync", daemon=True)
        self._thread.start()

    def wrote(self, nbytes: int) -> None:
        with self._cond:
            self._written += nbytes
            if self._due():
                self._cond.notify_all()

    def flush(self) -> None:
        """Every byte is written: start writing back what is left now (while the check
        reads the last bytes), not at the next threshold or the install's ``fsync``."""
        with self._cond:
            self._flushing = True
            self._cond.notify_all()

    def _due(self) -> bool:
        left = self._written - self._synced
        return left >= self._every or (self._flushing and left > 0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._due():
                    self._cond.wait()
                if self._closed and not (self._flushing and self._written > self._synced):
                    return  # closed: only a flush asked for is still done
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


class Filling:
    """A file of ``size`` bytes at ``path`` filled in place, fed in order to ``check``.

    Use as a context manager: leaving it stops the feed and the sync and
    closes the file, whatever happened. Bytes received are counted in
    ``tally``; :meth:`finish` waits for the check to read every byte.
    """

    def __init__(self, path: Path, size: int, check: ContentCheck, tally: Tally) -> None:
        self.size = size
        self.tally = tally
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.feed = OrderedFeed(check.update_stable, self.fd, size, check.drain).start()
        self.sync = BackgroundSync(self.fd)
        self._halt = threading.Event()

    def __enter__(self) -> Filling:
        return self

    def __exit__(self, *exc: object) -> None:
        self.feed.stop()
        with contextlib.suppress(Exception):
            self.feed.join()
        self.sync.close()
        os.close(self.fd)

    @property
    def refused(self) -> bool:
        """True once the check refused the bytes it read."""
        return self.feed.failed

    def ready(self, begin: int, end: int) -> None:
        """Bytes ``[begin, end)`` are in place: the check may read them, the sync write them."""
        self.feed.mark_ready(begin, end)
        self.sync.wrote(end - begin)

    def write(self, offset: int, data: bytes) -> None:
        """Put received bytes in place (counted); :class:`Stopped` once the transfer stops."""
        if self._halt.is_set() or self.feed.failed:
            raise Stopped
        pwrite_all(self.fd, data, offset)
        self.tally.add(len(data))

    def fetch_range(self, source: Source, span: Span, what: str) -> None:
        """Stream ``[begin, end)`` into place, resumed after drops under ``source.retry``.

        The check follows the range as it arrives (every :data:`FEED_STEP` bytes).
        """
        begin, end = span
        pos = shown = begin

        def sink(data: bytes) -> None:
            nonlocal pos, shown
            self.write(pos, data)
            pos += len(data)
            if pos - shown >= FEED_STEP:
                self.feed.mark_ready(shown, pos)
                shown = pos

        def step() -> None:
            source.client.stream(source.url, pos, sink, end=end)

        source.retry.run(step, what, notice=False)

    def fetch_ranges(
        self, source: Source, spans: list[Span], finished: Callable[[Span], None], connections: int
    ) -> None:
        """Fetch ``spans`` as multi-range requests over up to ``connections`` connections.

        ``finished(span)`` is told of every span once it is in place. A server
        that does not do multi-range gets one request per (rest of a) span.
        """
        if not spans:
            return
        lock = threading.Lock()
        got: dict[Span, int] = dict.fromkeys(spans, 0)
        begins = sorted(spans)

        def sink(offset: int, data: bytes) -> None:
            self.write(offset, data)
            # A coalesced part (adjacent ranges answered as one) runs across ranges.
            end = offset + len(data)
            while offset < end:
                span = begins[bisect.bisect_right(begins, (offset, float("inf"))) - 1]
                upto = min(end, span[1])
                with lock:
                    got[span] = upto - span[0]
                    done = got[span] == span[1] - span[0]
                if done:
                    finished(span)
                offset = upto

        def left(batch: list[Span]) -> list[Span]:
            return [(b + got[(b, e)], e) for b, e in batch if got[(b, e)] < e - b]

        def batch_job(batch: list[Span]) -> Callable[[], None]:
            def step() -> None:
                todo = left(batch)
                if todo:  # resumed parts start mid-range: the sink maps them back
                    source.client.stream_ranges(source.url, todo, sink)

            return lambda: source.retry.run(step, "ranges", notice=False)

        batches = _batches(spans, connections)
        try:
            self.run([batch_job(b) for b in batches], connections)
        except RangeNotSatisfied:
            # The server does not do multi-range: one request per range, in parallel.
            rest = {
                part: whole
                for part, whole in zip(left(spans), _unfinished(spans, got), strict=True)
            }

            def one_job(part: Span) -> Callable[[], None]:
                def job() -> None:
                    self.fetch_range(source, part, f"range {part[0]}-{part[1]}")
                    finished(rest[part])

                return job

            self.run([one_job(p) for p in rest], connections)

    def run(self, jobs: list[Callable[[], None]], connections: int) -> None:
        """Run ``jobs`` over up to ``connections`` threads; the first failure stops the rest.

        Raises the failure that is the cause: a job's own error, else (every
        job was stopped) the check's refusal.
        """
        if not jobs:
            return
        self._halt.clear()
        with ThreadPoolExecutor(max_workers=max(1, min(connections, len(jobs)))) as pool:
            futures = [pool.submit(self._guarded, job) for job in jobs]
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            if not any(f.exception() for f in finished):
                return
            self._halt.set()
            wait(futures)
        errors = [e for f in futures if (e := f.exception()) is not None]
        real = [e for e in errors if not isinstance(e, Stopped)]
        if not real and self.feed.failed:
            self.feed.join()  # the check refused the bytes: its error is the cause
        raise (real or errors)[0]

    def _guarded(self, job: Callable[[], None]) -> None:
        if self._halt.is_set():
            raise Stopped
        job()

    def finish(self) -> None:
        """Every byte is in place: start writing the rest back, wait until the check
        read every byte; raise its refusal."""
        self.sync.flush()
        self.feed.join()


def _unfinished(spans: list[Span], got: dict[Span, int]) -> list[Span]:
    return [(b, e) for b, e in spans if got[(b, e)] < e - b]


def _batches(ranges: list[Span], connections: int) -> list[list[Span]]:
    """Spread ranges over up to ``connections`` groups of similar byte counts.

    Largest range first, each to the group with the fewest bytes so far (so no
    connection is left idle while another fetches two ranges); each group in file
    order, sent as multi-range requests of at most :data:`MAX_RANGES_PER_REQUEST`
    ranges, the groups in the order of their first range.
    """
    total = sum(e - b for b, e in ranges)
    groups = max(1, min(connections, len(ranges), total // MIN_GROUP_BYTES or 1))
    heap = [(0, g) for g in range(groups)]
    members: list[list[Span]] = [[] for _ in range(groups)]
    for span in sorted(ranges, key=lambda r: (r[0] - r[1], r[0])):
        filled, g = heapq.heappop(heap)
        members[g].append(span)
        heapq.heappush(heap, (filled + span[1] - span[0], g))
    out = sorted((sorted(m) for m in members if m), key=lambda m: m[0])
    return [
        g[i : i + MAX_RANGES_PER_REQUEST]
        for g in out
        for i in range(0, len(g), MAX_RANGES_PER_REQUEST)
    ]
