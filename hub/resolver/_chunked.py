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
- the check (the SHA-256 or git SHA-1 that names the blob, and the CMH
  manifest's per-tensor SHA-256) reads the file in order as soon as every
  byte before is in, beside the transfer; each byte is hashed once.

The transfer itself (the in-place file, the in-order check, the background
sync, the log, the parallel pieces, the teardown) is the resolver's one
engine, :mod:`cmh.hub.resolver._transfer`, which tensor-level updates use too.

A server that ignores ``Range`` (a ``200`` for a chunk) makes the caller fall
back to one connection (:class:`~cmh.hub.resolver._http.RangeNotSatisfied`).
Nothing is installed before the check accepts every byte.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

from cmh.hub.cache import ContentCheck, RepoLayout, install_blob, partial_path

from ._http import Located
from ._transfer import Filling, Job, SegmentLog, Source, chunk_size, discard
from ._types import HubUnreachableError, IntegrityError, InvalidRemoteFileError

LOG_VERSION = "cmh-chunks v1"


def applies(size: int, connections: int, chunk_bytes: int) -> bool:
    """True when a file of ``size`` bytes is fetched over parallel connections."""
    return connections > 1 and size > chunk_size(size, chunk_bytes)


def chunks_path(repo: RepoLayout, etag: str) -> Path:
    """Where a chunked download of ``etag`` accumulates (holes allowed)."""
    repo.blob_path(etag)  # validates the name
    return repo.cmh_dir / "partial" / f"{etag}.chunks"


def _log_path(path: Path) -> Path:
    return path.with_name(path.name + ".log")


def has_partial(repo: RepoLayout, etag: str) -> bool:
    """True when a chunked download of ``etag`` was left to resume."""
    return _log_path(chunks_path(repo, etag)).exists()


def discard_chunks(repo: RepoLayout, etag: str) -> None:
    """Remove a chunked download of ``etag`` and its log."""
    path = chunks_path(repo, etag)
    discard(path, _log_path(path))


class _Chunks:
    """The chunks of one file: their size, count, log, and the spans they cover."""

    def __init__(self, job: Job) -> None:
        size = job.remote.size
        self.size = size
        self.chunk = chunk_size(size, job.chunk_bytes)
        self.count = -(-size // self.chunk)
        self.path = chunks_path(job.repo, job.remote.etag)
        key = f"{LOG_VERSION} {job.remote.etag} {size} {self.chunk}"
        self.log = SegmentLog(_log_path(self.path), key)

    def span(self, index: int) -> tuple[int, int]:
        return index * self.chunk, min(self.size, (index + 1) * self.chunk)

    def logged(self) -> set[int]:
        """The chunks the log lists as finished."""
        entries = self.log.load() or set()
        done = set()
        for entry in entries:
            word, _, number = entry.partition(" ")
            if (
                word == "chunk"
                and number.isascii()
                and number.isdigit()
                and int(number) < self.count
            ):
                done.add(int(number))
        return done


def download_chunked(job: Job) -> tuple[bool, list[str]]:
    """Fetch blob ``job.remote.etag`` over ``job.connections`` range connections, resuming
    logged chunks.

    The caller holds the blob lock. Returns (resumed, warnings); the bytes
    received are counted in ``job.tally``. A chunk whose transfer keeps failing
    ends the download with :class:`HubUnreachableError` (finished chunks are
    kept for a rerun); content that fails its check is discarded and fetched
    once more from byte 0, then refused with :class:`IntegrityError`.
    """
    remote = job.remote
    chunks = _Chunks(job)
    chunks.path.parent.mkdir(parents=True, exist_ok=True)
    resumed = False
    integrity_failures = 0
    weights = remote.path.endswith(".safetensors")
    check = ContentCheck(
        remote.etag, remote.size, safetensors=weights, strict=job.strict,
        name=remote.path if weights else None,
    )  # fmt: skip
    source = Source(job.client, Located(job.url), job.retry)  # after a redirect, go where it led
    while True:
        done = _prepare(job, chunks)
        if not resumed and done and integrity_failures == 0:
            job.tally.held(sum(end - start for start, end in map(chunks.span, done)))
        resumed = resumed or (bool(done) and integrity_failures == 0)
        if integrity_failures:
            check.reset()
        try:
            try:
                _transfer(job, chunks, done, check, source)
            except BaseException:
                if not chunks.logged():  # no chunk finished: nothing to resume
                    discard_chunks(job.repo, remote.etag)
                raise
            check.finish()
        except InvalidRemoteFileError:
            discard_chunks(job.repo, remote.etag)
            raise
        except IntegrityError as exc:
            discard_chunks(job.repo, remote.etag)
            integrity_failures += 1
            if integrity_failures >= 2:
                raise IntegrityError(f"{remote.path}: {exc}; refused, nothing installed") from None
            continue
        except HubUnreachableError as exc:
            kept = len(chunks.logged())
            raise HubUnreachableError(
                f"{remote.path}: download failed ({exc}); {kept} of {chunks.count} chunks kept "
                "for resuming",
                retry_after=exc.retry_after,
            ) from exc
        install_blob(job.repo, remote.etag, chunks.path, check)
        discard(chunks.log.path, partial_path(job.repo, remote.etag))
        return resumed, check.warnings


def _prepare(job: Job, chunks: _Chunks) -> set[int]:
    """Open or start the chunk file; the chunks already in it."""
    size, path = chunks.size, chunks.path
    done: set[int] = set()
    if path.exists() and path.stat().st_size == size:
        done = chunks.logged()
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        prefix = partial_path(job.repo, job.remote.etag)
        try:
            have = prefix.stat().st_size
        except FileNotFoundError:
            have = 0
        if 0 < have <= size:
            # A whole download's prefix (ours, or a stock client's): its full chunks count.
            os.replace(prefix, path)
            done = set(range(chunks.count)) if have == size else set(range(have // chunks.chunk))
    with open(path, "ab") as f:
        f.truncate(size)
    chunks.log.start(f"chunk {i}" for i in done)
    return done


def _transfer(
    job: Job, chunks: _Chunks, done: set[int], check: ContentCheck, source: Source
) -> None:
    """Fetch the chunks not in ``done`` while the check reads the file in order."""
    todo = [i for i in range(chunks.count) if i not in done]
    with Filling(chunks.path, chunks.size, check, job.tally) as filling:
        for i in sorted(done):
            filling.feed.mark_ready(*chunks.span(i))

        def fetch(index: int) -> None:
            filling.fetch_range(source, chunks.span(index), f"chunk {index}")
            chunks.log.add(f"chunk {index}")
            filling.ready(*chunks.span(index))

        filling.run([functools.partial(fetch, i) for i in todo], job.connections)
        filling.finish()
