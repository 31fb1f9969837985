"""Tensor-level partial download of a changed stamped safetensors file.

When a new version of a stamped file is published and an older version is in
the cache, only the tensors whose SHA-256 changed are fetched:

1. fetch the new header with a Range request (one speculative read of
   :data:`PREFETCH` bytes, a second one only if the header is longer);
2. take the per-tensor digests from both manifests (the old file's are
   computed locally if it is unstamped; the old blob is a checked blob);
3. every new tensor whose digest exists in the old file is copied from the
   old blob (kernel copy); the others are byte ranges to fetch, merged when
   adjacent and across small gaps (total gap bytes under 3% of the changed
   bytes plus 64 KiB), fetched with multi-range requests (``multipart/byteranges``;
   one range per request, in parallel, if the server does not do multi-range)
   and written in place;
4. the assembled file is hashed whole against the ETag (and the fetched
   tensors against the new manifest) before it is installed.

The assembly lives in ``.cmh/partial/{etag}.assembly`` with a log of finished
segments beside it, so a rerun resumes it. Any failure leaves the cache as
it was; the caller falls back to a whole download.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmh._atomic import atomic_write
from cmh.checkpoint import claimed_digests
from cmh.digests import hash_tensors
from cmh.header import PREFIX_SIZE, Header, parse_header, read_header

from ..cache.blobs import (
    UNREADABLE_HEADER,
    ContentCheck,
    Progress,
    disk_full_error,
    install_blob,
    is_disk_full,
    partial_path,
)
from ..cache.layout import RepoLayout
from .chunked import BackgroundSync, OrderedFeed, chunk_size
from .http import HubClient, Located, RangeNotSatisfied
from .retry import DEFAULT_RETRY
from .types import HubProtocolError, IntegrityError, InvalidRemoteFileError, RemoteFile

PREFETCH = 128 << 10
GAP_FRACTION = 0.03
GAP_FLOOR = 64 << 10
#: The fewest changed bytes one extra parallel connection is opened for.
MIN_GROUP_BYTES = 1 << 20
#: Ranges per multi-range request (the mirror accepts 64).
MAX_RANGES_PER_REQUEST = 32


class PatchNotPossible(Exception):
    """The file cannot be patched (unstamped, no usable old version); fetch it whole."""


@dataclass(frozen=True)
class Copy:
    """``length`` bytes from offset ``src`` of the old blob to ``dst`` of the new file."""

    src: int
    dst: int
    length: int


@dataclass
class PatchPlan:
    """Where every byte of the new file comes from."""

    size: int
    header_bytes: bytes  # the first bytes of the new file, as fetched
    copies: list[Copy]
    ranges: list[tuple[int, int]]  # [begin, end) to fetch
    trusted: frozenset[int]  # tensor indexes whose bytes come from the checked old blob
    copied_bytes: int = 0
    fetch_bytes: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PatchResult:
    bytes_received: int
    bytes_reused: int
    requests: int
    warnings: tuple[str, ...]


def assembly_path(repo: RepoLayout, etag: str) -> Path:
    """Where the new file is assembled (holes allowed, unlike ``{etag}.incomplete``)."""
    repo.blob_path(etag)  # validates the name
    return repo.cmh_dir / "partial" / f"{etag}.assembly"


def fetch_header(client: HubClient, url: str | Located, size: int) -> tuple[Header, bytes]:
    """The new file's header, from one or two Range requests; also the bytes read."""
    first = fetch_bytes(client, url, 0, min(size, PREFETCH))
    if len(first) < PREFIX_SIZE:
        raise PatchNotPossible("file too short for a safetensors header")
    (n,) = struct.unpack("<Q", first[:PREFIX_SIZE])
    if n > 100_000_000 or PREFIX_SIZE + n > size:
        raise PatchNotPossible("not a safetensors file")
    data = first
    if len(data) < PREFIX_SIZE + n:
        data += fetch_bytes(client, url, len(data), PREFIX_SIZE + n)
    try:
        header = parse_header(data[PREFIX_SIZE : PREFIX_SIZE + n], size)
    except UNREADABLE_HEADER as exc:
        raise PatchNotPossible(f"new header invalid: {exc}") from exc
    return header, data


def fetch_bytes(client: HubClient, url: str | Located, begin: int, end: int) -> bytes:
    """Bytes ``[begin, end)`` in memory, resuming after dropped connections."""
    buf = bytearray()

    def step() -> bytes:
        client.stream(url, begin + len(buf), buf.extend, end=end)
        return bytes(buf)

    return DEFAULT_RETRY.run(step, f"range {begin}-{end}", notice=False)


def served_digests(header: Header, manifest: list[dict[str, Any]] | None) -> list[bytes] | None:
    """The SHA-256 list of a mirror's tensor manifest if it describes exactly ``header``."""
    if manifest is None or len(manifest) != len(header.tensors):
        return None
    for t, m in zip(header.tensors, manifest, strict=True):
        if (m["name"], m["begin"], m["end"]) != (t.name, t.begin, t.end) or len(m["sha256"]) != 32:
            return None
    return [m["sha256"] for m in manifest]


def old_digests(old_blob: Path) -> tuple[Header, list[bytes]]:
    """Per-tensor SHA-256 of a checked local blob: its manifest, else hashed here."""
    header = read_header(old_blob)
    digests = claimed_digests(header)
    if digests is None:
        digests = [d.sha256 for d in hash_tensors(old_blob, header) if d.sha256 is not None]
    return header, digests


def plan_patch(
    new: Header,
    prefix: bytes,
    old: Header,
    old_sha: list[bytes],
    served: list[bytes] | None = None,
) -> PatchPlan:
    """Decide which bytes to copy from the old blob and which to fetch.

    The new file's per-tensor digests come from its CMH manifest, else from
    ``served`` (a cmh mirror's tensor manifest, :func:`served_digests`): either
    only decides what to fetch, the assembled file is checked whole.
    """
    new_sha = claimed_digests(new) or served
    if new_sha is None:
        raise PatchNotPossible("new version is not stamped with a consistent SHA-256 manifest")
    where: dict[bytes, int] = {}
    for t, d in zip(old.tensors, old_sha, strict=True):
        if t.nbytes:
            where.setdefault(d, old.data_start + t.begin)
    base = new.data_start
    items: list[tuple[int, int, int | None, int]] = []  # (dst, len, src or None, index)
    for i, (t, d) in enumerate(zip(new.tensors, new_sha, strict=True)):
        if t.nbytes == 0:
            continue
        items.append((base + t.begin, t.nbytes, where.get(d), i))
    ranges = _merge([(dst, dst + n) for dst, n, src, _ in items if src is None])
    changed = sum(e - b for b, e in ranges)
    ranges = _join_across_gaps(ranges, int(changed * GAP_FRACTION) + GAP_FLOOR)
    # Bytes already in the prefix need no fetch.
    have = len(prefix)
    ranges = [(max(b, have), e) for b, e in ranges if e > have]
    covered = _Cover(ranges)
    copies: list[Copy] = []
    trusted = {i for i, t in enumerate(new.tensors) if t.nbytes == 0}
    for dst, n, src, i in items:
        if src is not None and not covered.overlaps(dst, dst + n):
            copies.append(Copy(src, dst, n))
            trusted.add(i)
    plan = PatchPlan(
        size=new.file_size,
        header_bytes=prefix,
        copies=copies,
        ranges=ranges,
        trusted=frozenset(trusted),
    )
    plan.copied_bytes = sum(c.length for c in copies)
    plan.fetch_bytes = sum(e - b for b, e in ranges)
    # Every byte of the new file is in the prefix, copied, or fetched.
    spans = _merge([(0, have), *((c.dst, c.dst + c.length) for c in copies), *ranges])
    if spans != [(0, new.file_size)]:
        raise PatchNotPossible("plan does not cover the file")
    return plan


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for b, e in sorted(ranges):
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return out


def _join_across_gaps(ranges: list[tuple[int, int]], allowance: int) -> list[tuple[int, int]]:
    """Join neighbouring ranges across the smallest gaps while the gaps fit ``allowance``."""
    if len(ranges) < 2:
        return ranges
    gaps = sorted((ranges[i + 1][0] - ranges[i][1], i) for i in range(len(ranges) - 1))
    join: set[int] = set()
    spent = 0
    for gap, i in gaps:
        if spent + gap > allowance:
            break
        spent += gap
        join.add(i)
    out = [ranges[0]]
    for i in range(1, len(ranges)):
        if i - 1 in join:
            out[-1] = (out[-1][0], ranges[i][1])
        else:
            out.append(ranges[i])
    return out


class _Cover:
    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges = ranges

    def overlaps(self, b: int, e: int) -> bool:
        return any(rb < e and b < re for rb, re in self.ranges)


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _copy(src_fd: int, dst_fd: int, c: Copy) -> None:
    done = 0
    while done < c.length:
        try:
            n = os.copy_file_range(src_fd, dst_fd, c.length - done, c.src + done, c.dst + done)
        except OSError:
            n = 0
        if n <= 0:
            chunk = os.pread(src_fd, min(8 << 20, c.length - done), c.src + done)
            if not chunk:
                raise OSError("old blob is shorter than its header says")
            _pwrite_all(dst_fd, chunk, c.dst + done)
            n = len(chunk)
        done += n


class _Log:
    """Append-only record of finished segments, so a rerun skips them."""

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self.key = key
        self._lock = threading.Lock()
        self.done: set[str] = set()

    def load(self) -> bool:
        """True when an earlier log for the same plan was found (entries loaded)."""
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            return False
        if not lines or lines[0] != self.key:
            return False
        self.done = set(lines[1:])
        return True

    def start(self) -> None:
        self.path.write_text(self.key + "\n")
        self.done = set()

    def add(self, entry: str) -> None:
        with self._lock:
            with open(self.path, "a") as f:
                f.write(entry + "\n")
            self.done.add(entry)


def patch_blob(
    client: HubClient,
    repo: RepoLayout,
    remote: RemoteFile,
    url: str,
    old_etag: str,
    *,
    strict: bool = False,
    connections: int = 8,
    chunk_bytes: int = 16 << 20,
    progress: Progress | None = None,
    manifest: Callable[[], list[dict[str, Any]] | None] | None = None,
) -> PatchResult:
    """Assemble blob ``remote.etag`` from blob ``old_etag`` plus fetched ranges.

    The caller holds the blob lock of ``remote.etag``. The unchanged tensors
    are copied in the kernel while the changed ranges arrive over up to
    ``connections`` connections, and the assembled file is checked in order
    as its bytes fall into place (:class:`~cmh.hub.resolver.chunked.OrderedFeed`):
    the whole-file digest covers every byte, the manifest digests only the
    fetched tensors (the copied ones match digests of a checked blob).
    Raises :class:`PatchNotPossible` when the file must be fetched whole
    instead (the prefix already fetched is then left as ``{etag}.incomplete``),
    :class:`HubProtocolError` when the server does not answer ranges as asked,
    :class:`IntegrityError` when the assembled file fails its check,
    :class:`InvalidRemoteFileError` when its header cannot be read, and
    :class:`DiskFullError` when it does not fit (in these four cases the
    assembly is discarded; after a dropped transfer it is kept for resuming).
    ``manifest`` fetches a cmh mirror's tensor manifest, used when the new
    version is unstamped.
    """
    requests_before = client.requests
    old_blob = repo.blob_path(old_etag)
    located = Located(url)  # after the first redirect, ranges go straight where it led
    header, prefix = fetch_header(client, located, remote.size)
    received = len(prefix)
    try:
        try:
            old_header, old_sha = old_digests(old_blob)
            served = None
            if manifest is not None and claimed_digests(header) is None:
                served = served_digests(header, manifest())  # unstamped: ask the mirror
            plan = plan_patch(header, prefix, old_header, old_sha, served)
        except UNREADABLE_HEADER as exc:
            raise PatchNotPossible(str(exc) or type(exc).__name__) from exc
    except PatchNotPossible:
        _keep_prefix(repo, remote.etag, prefix)
        raise
    if progress is not None:
        progress(len(prefix))

    target = assembly_path(repo, remote.etag)
    log_path = target.with_name(target.name + ".log")
    check = ContentCheck(
        remote.etag, remote.size, safetensors=True, strict=strict, name=remote.path
    )
    check.trusted = plan.trusted
    try:
        received += _assemble(
            client, located, remote, old_etag, old_blob, target, log_path, plan, check,
            connections, chunk_bytes, progress,
        )  # fmt: skip
        check.finish()
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        _discard(target, log_path)
        raise disk_full_error(exc, f"{remote.path}: assembling {target.name}") from None
    except HubProtocolError:
        # The server does not answer ranges as asked: the caller fetches the file whole,
        # so the (mostly copied, full-size) assembly would only take room.
        _discard(target, log_path)
        raise
    except (IntegrityError, InvalidRemoteFileError):
        _discard(target, log_path)
        raise
    install_blob(repo, remote.etag, target, check)
    with contextlib.suppress(FileNotFoundError):
        log_path.unlink()
    return PatchResult(
        bytes_received=received,
        bytes_reused=plan.copied_bytes,
        requests=client.requests - requests_before,
        warnings=tuple(check.warnings),
    )


def _assemble(
    client: HubClient,
    url: Located,
    remote: RemoteFile,
    old_etag: str,
    old_blob: Path,
    target: Path,
    log_path: Path,
    plan: PatchPlan,
    check: ContentCheck,
    connections: int,
    chunk_bytes: int,
    progress: Progress | None,
) -> int:
    """Write the prefix, the copies and the fetched ranges into ``target``; bytes fetched.

    ``check`` is fed the file in order as its bytes fall into place; its error
    (the first tensor that does not match) is raised once the transfer stopped.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    log = _Log(log_path, f"cmh-assembly v1 {old_etag} {remote.size}")
    resuming = target.exists() and target.stat().st_size == remote.size and log.load()
    if not resuming:
        log.start()
    pieces = split_ranges(plan.ranges, chunk_size(plan.fetch_bytes, chunk_bytes))
    received = 0
    fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
    old_fd = os.open(old_blob, os.O_RDONLY)
    feed = OrderedFeed(check.update, fd, remote.size).start()
    sync = BackgroundSync(fd)

    def ready(begin: int, end: int) -> None:
        feed.mark_ready(begin, end)
        sync.wrote(end - begin)

    try:
        if not resuming:
            os.ftruncate(fd, remote.size)
        _pwrite_all(fd, plan.header_bytes, 0)
        feed.mark_ready(0, len(plan.header_bytes))
        # The check reads the copied tensors from the checked old blob, beside the copy.
        for c in plan.copies:
            feed.map_source(c.dst, c.dst + c.length, old_fd, c.src)
        copier = _Copier(old_blob, fd, plan.copies, log, sync.wrote).start()
        for b, e in pieces:
            if f"range {b} {e}" in log.done:
                feed.mark_ready(b, e)
        todo = [(b, e) for b, e in pieces if f"range {b} {e}" not in log.done]
        try:
            received += _fetch_ranges(
                client, url, fd, todo, log, connections, progress, ready, lambda: feed.failed
            )
        except _Stop:
            feed.join()  # the check refused fetched bytes: its error is the cause
            raise
        finally:
            copier.join()
        feed.join()
    finally:
        feed.stop()
        with contextlib.suppress(Exception):
            feed.join()
        sync.close()
        os.close(fd)
        os.close(old_fd)
    return received


class _Stop(Exception):
    """The check already refused the file: stop fetching."""


class _Copier:
    """Copies the unchanged tensors from the old blob in the kernel, on a thread of its own."""

    def __init__(
        self,
        old_blob: Path,
        fd: int,
        copies: list[Copy],
        log: _Log,
        wrote: Callable[[int], None],
    ) -> None:
        self._old_blob, self._fd, self._copies = old_blob, fd, copies
        self._log, self._wrote = log, wrote
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cmh-copy", daemon=True)

    def start(self) -> _Copier:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            if "copies" in self._log.done:
                return
            src_fd = os.open(self._old_blob, os.O_RDONLY)
            try:
                for c in self._copies:
                    _copy(src_fd, self._fd, c)
                    self._wrote(c.length)
            finally:
                os.close(src_fd)
            self._log.add("copies")
        except BaseException as exc:  # raised again by join()
            self._error = exc

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def split_ranges(ranges: list[tuple[int, int]], piece: int) -> list[tuple[int, int]]:
    """``ranges`` cut into pieces of at most ``piece`` bytes (each resumable on its own)."""
    out: list[tuple[int, int]] = []
    for b, e in ranges:
        out.extend((p, min(e, p + piece)) for p in range(b, e, piece))
    return out


def _batches(ranges: list[tuple[int, int]], connections: int) -> list[list[tuple[int, int]]]:
    """Spread ranges over up to ``connections`` groups of similar byte counts, in file order.

    A group is sent as multi-range requests of at most :data:`MAX_RANGES_PER_REQUEST` ranges.
    """
    total = sum(e - b for b, e in ranges)
    groups = max(1, min(connections, len(ranges), total // MIN_GROUP_BYTES or 1))
    share = -(-total // groups)
    out: list[list[tuple[int, int]]] = [[]]
    filled = 0
    for span in ranges:
        if filled >= share and len(out) < groups:
            out.append([])
            filled = 0
        out[-1].append(span)
        filled += span[1] - span[0]
    return [
        g[i : i + MAX_RANGES_PER_REQUEST]
        for g in out
        for i in range(0, len(g), MAX_RANGES_PER_REQUEST)
    ]


def _fetch_ranges(
    client: HubClient,
    url: Located,
    fd: int,
    ranges: list[tuple[int, int]],
    log: _Log,
    connections: int,
    progress: Progress | None,
    ready: Callable[[int, int], None],
    refused: Callable[[], bool],
) -> int:
    """Fetch ``ranges`` into ``fd``: multi-range requests, else one request per range.

    ``ready(begin, end)`` is told of every range once it is in place;
    ``refused()`` true stops the transfer (the check already failed).
    """
    if not ranges:
        return 0
    lock = threading.Lock()
    got: dict[tuple[int, int], int] = dict.fromkeys(ranges, 0)
    begins = sorted(ranges)
    received = 0

    def sink(offset: int, data: bytes) -> None:
        nonlocal received
        if refused():
            raise _Stop
        _pwrite_all(fd, data, offset)
        if progress is not None:
            progress(len(data))
        # A coalesced part (adjacent ranges answered as one) runs across ranges.
        end = offset + len(data)
        while offset < end:
            i = bisect.bisect_right(begins, (offset, float("inf"))) - 1
            span = begins[i]
            upto = min(end, span[1])
            with lock:
                got[span] = upto - span[0]
                received += upto - offset
                finished = got[span] == span[1] - span[0]
            if finished:
                log.add(f"range {span[0]} {span[1]}")
                ready(*span)
            offset = upto

    def remaining(batch: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [(b + got[(b, e)], e) for b, e in batch if got[(b, e)] < e - b]

    def run_batch(batch: list[tuple[int, int]]) -> None:
        def step() -> None:
            todo = remaining(batch)
            if todo:
                # Resumed parts start mid-range: map them back to their range.
                client.stream_ranges(url, todo, sink)

        DEFAULT_RETRY.run(step, "ranges", notice=False)

    batches = _batches(ranges, connections)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(connections, len(batches)))) as pool:
            list(pool.map(run_batch, batches))
    except RangeNotSatisfied:
        # The server does not do multi-range: one request per range, in parallel.
        todo = [(b + got[(b, e)], e) for b, e in ranges if got[(b, e)] < e - b]
        spans = {(b + got[(b, e)], e): (b, e) for b, e in ranges if got[(b, e)] < e - b}

        def one(part: tuple[int, int]) -> int:
            n = _fetch_range_into(client, url, fd, part, progress, refused)
            whole = spans[part]
            log.add(f"range {whole[0]} {whole[1]}")
            ready(*whole)
            return n

        with ThreadPoolExecutor(max_workers=max(1, min(connections, len(todo)))) as pool:
            received += sum(pool.map(one, todo))
    return received


def _fetch_range_into(
    client: HubClient,
    url: Located,
    fd: int,
    span: tuple[int, int],
    progress: Progress | None,
    refused: Callable[[], bool],
) -> int:
    """Fetch ``[begin, end)`` into ``fd`` at the same offsets, resuming after drops."""
    begin, end = span
    pos = begin
    received = 0

    def sink(chunk: bytes) -> None:
        nonlocal pos, received
        if refused():
            raise _Stop
        _pwrite_all(fd, chunk, pos)
        pos += len(chunk)
        received += len(chunk)
        if progress is not None:
            progress(len(chunk))

    def step() -> int:
        client.stream(url, pos, sink, end=end)
        return received

    return DEFAULT_RETRY.run(step, f"range {begin}-{end}", notice=False)


def _keep_prefix(repo: RepoLayout, etag: str, prefix: bytes) -> None:
    """Leave the fetched prefix as the start of a whole download."""
    part = partial_path(repo, etag)
    with contextlib.suppress(OSError):
        if not part.exists() or part.stat().st_size < len(prefix):
            part.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(part, prefix)


def _discard(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


__all__ = [
    "HubProtocolError",
    "PatchNotPossible",
    "PatchPlan",
    "PatchResult",
    "assembly_path",
    "fetch_header",
    "patch_blob",
    "plan_patch",
]
