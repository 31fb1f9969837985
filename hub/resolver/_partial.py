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

import contextlib
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmh.hub.cache import (
    UNREADABLE_HEADER,
    ContentCheck,
    RepoLayout,
    disk_full_error,
    install_blob,
    is_disk_full,
    partial_path,
)

from cmh import (
    PREFIX_SIZE,
    Header,
    atomic_write,
    claimed_digests,
    hash_tensors,
    parse_header,
    read_header,
)

from ._http import HubClient, Located
from ._retry import DEFAULT_RETRY
from ._transfer import Filling, Job, SegmentLog, Source, chunk_size, discard, pwrite_all
from ._types import HubProtocolError, IntegrityError, InvalidRemoteFileError

PREFETCH = 128 << 10
GAP_FRACTION = 0.03
GAP_FLOOR = 64 << 10


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
    """What an update took from the old blob, and the check's warnings (the bytes it
    received are counted in the job's tally)."""

    bytes_reused: int
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
            pwrite_all(dst_fd, chunk, c.dst + done)
            n = len(chunk)
        done += n


@dataclass(frozen=True)
class _Update:
    """One update under way: the old blob it copies from, the plan, where it is assembled."""

    job: Job
    old_etag: str
    plan: PatchPlan
    source: Source
    target: Path

    @property
    def old_blob(self) -> Path:
        return self.job.repo.blob_path(self.old_etag)

    @property
    def log(self) -> SegmentLog:
        return SegmentLog(
            self.target.with_name(self.target.name + ".log"),
            f"cmh-assembly v1 {self.old_etag} {self.job.remote.size}",
        )


def patch_blob(
    job: Job,
    old_etag: str,
    manifest: Callable[[], list[dict[str, Any]] | None] | None = None,
) -> PatchResult:
    """Assemble blob ``job.remote.etag`` from blob ``old_etag`` plus fetched ranges.

    The caller holds the blob lock of ``job.remote.etag``. The unchanged tensors
    are copied in the kernel while the changed ranges arrive over up to
    ``job.connections`` connections, and the assembled file is checked in order
    as its bytes fall into place (the one engine, :mod:`cmh.hub.resolver._transfer`):
    the whole-file digest covers every byte, the manifest digests only the
    fetched tensors (the copied ones match digests of a checked blob).
    Every byte received is counted in ``job.tally``, also when this raises.
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
    client, remote = job.client, job.remote
    source = Source(client, Located(job.url))  # after the first redirect, go where it led
    header, prefix = fetch_header(client, source.url, remote.size)
    job.tally.add(len(prefix), shown=False)
    try:
        try:
            old_header, old_sha = old_digests(job.repo.blob_path(old_etag))
            served = None
            if manifest is not None and claimed_digests(header) is None:
                served = served_digests(header, manifest())  # unstamped: ask the mirror
            plan = plan_patch(header, prefix, old_header, old_sha, served)
        except UNREADABLE_HEADER as exc:
            raise PatchNotPossible(str(exc) or type(exc).__name__) from exc
    except PatchNotPossible:
        _keep_prefix(job.repo, remote.etag, prefix)
        raise
    if job.tally.progress is not None:
        job.tally.progress(len(prefix))

    update = _Update(job, old_etag, plan, source, assembly_path(job.repo, remote.etag))
    check = ContentCheck(
        remote.etag, remote.size, safetensors=True, strict=job.strict, name=remote.path
    )
    check.trusted = plan.trusted
    log_path = update.log.path
    try:
        _assemble(update, check)
        check.finish()
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        discard(update.target, log_path)
        raise disk_full_error(exc, f"{remote.path}: assembling {update.target.name}") from None
    except HubProtocolError:
        # The server does not answer ranges as asked: the caller fetches the file whole,
        # so the (mostly copied, full-size) assembly would only take room.
        discard(update.target, log_path)
        raise
    except (IntegrityError, InvalidRemoteFileError):
        discard(update.target, log_path)
        raise
    install_blob(job.repo, remote.etag, update.target, check)
    discard(log_path)
    return PatchResult(bytes_reused=plan.copied_bytes, warnings=tuple(check.warnings))


def _assemble(update: _Update, check: ContentCheck) -> None:
    """Write the prefix, the copies and the fetched ranges into the assembly.

    ``check`` is fed the file in order as its bytes fall into place; its error
    (the first tensor that does not match) is raised once the transfer stopped.
    """
    job, plan, target = update.job, update.plan, update.target
    size = job.remote.size
    target.parent.mkdir(parents=True, exist_ok=True)
    log = update.log
    done = log.load() if target.exists() and target.stat().st_size == size else None
    log.start(done or ())
    pieces = split_ranges(plan.ranges, chunk_size(plan.fetch_bytes, job.chunk_bytes))
    old_fd = os.open(update.old_blob, os.O_RDONLY)
    try:
        with Filling(target, size, check, job.tally) as filling:
            if done is None:
                os.ftruncate(filling.fd, size)
            pwrite_all(filling.fd, plan.header_bytes, 0)
            filling.feed.mark_ready(0, len(plan.header_bytes))
            # The check reads the copied tensors from the checked old blob, beside the copy.
            for c in plan.copies:
                filling.feed.map_source(c.dst, c.dst + c.length, old_fd, c.src)
            copier = _Copier(update.old_blob, filling.fd, plan.copies, log, filling.sync.wrote)
            copier.start()
            for b, e in pieces:
                if f"range {b} {e}" in log.done:
                    filling.feed.mark_ready(b, e)
            todo = [(b, e) for b, e in pieces if f"range {b} {e}" not in log.done]

            def finished(span: tuple[int, int]) -> None:
                log.add(f"range {span[0]} {span[1]}")
                filling.ready(*span)

            try:
                filling.fetch_ranges(update.source, todo, finished, job.connections)
            finally:
                copier.join()
            filling.finish()
    finally:
        os.close(old_fd)


class _Copier:
    """Copies the unchanged tensors from the old blob in the kernel, on a thread of its own."""

    def __init__(
        self,
        old_blob: Path,
        fd: int,
        copies: list[Copy],
        log: SegmentLog,
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


def _keep_prefix(repo: RepoLayout, etag: str, prefix: bytes) -> None:
    """Leave the fetched prefix as the start of a whole download."""
    part = partial_path(repo, etag)
    with contextlib.suppress(OSError):
        if not part.exists() or part.stat().st_size < len(prefix):
            part.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(part, prefix)


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
