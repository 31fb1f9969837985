"""Whole downloads into a stock cache: resumable, checked, installed atomically.

A whole download in progress lives in ``blobs/{etag}.incomplete`` (always a
prefix of the blob, the name the stock client used to resume), so a rerun
after a crash, or another process, continues it with ``Range``. Nothing is
installed before :class:`~cmh.hub.cache.ContentCheck` accepts every byte.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from cmh.hub.cache import (
    ContentCheck,
    RepoLayout,
    disk_full_error,
    feed_file,
    install_blob,
    is_disk_full,
    partial_path,
)

from . import _chunked as chunked
from ._http import RangeNotSatisfied
from ._partial import assembly_path
from ._retry import no_answer_notice
from ._transfer import Job, discard
from ._types import AnswerTooLarge, HubUnreachableError, IntegrityError, InvalidRemoteFileError


def partial_files(repo: RepoLayout, etag: str) -> tuple[Path, ...]:
    """Every partial download of blob ``etag`` the resolver may leave: a whole download's
    prefix (``blobs/{etag}.incomplete``), a chunked download and a tensor-level assembly
    (``.cmh/partial/{etag}.chunks``, ``.assembly``), each with its log."""
    chunks, assembly = chunked.chunks_path(repo, etag), assembly_path(repo, etag)
    return (
        partial_path(repo, etag),
        chunks,
        chunks.with_name(chunks.name + ".log"),
        assembly,
        assembly.with_name(assembly.name + ".log"),
    )


def has_partials(repo: RepoLayout, etag: str) -> bool:
    """True when any partial download of blob ``etag`` is left (a few ``stat`` calls)."""
    return any(p.exists() for p in partial_files(repo, etag))


def discard_partials(repo: RepoLayout, etag: str) -> None:
    """Remove every partial download of blob ``etag``, once the blob is in and checked:
    nothing of it is left to resume (the caller holds the blob lock)."""
    discard(*partial_files(repo, etag))


def download_whole(job: Job) -> tuple[bool, list[str]]:
    """Fetch blob ``job.remote.etag`` whole into the cache, resuming any partial.

    The caller holds the blob lock. Returns (resumed, warnings); the bytes
    received are counted in ``job.tally``. A file of more than one chunk is
    fetched over ``job.connections`` parallel range connections
    (:mod:`cmh.hub.resolver._chunked`), unless the server ignores ``Range``;
    then, and for smaller files, over one connection. Transfer failures are
    retried under ``job.retry`` (backoff with jitter, ``Retry-After``
    honoured) with ``Range`` from where the partial ends; content that fails
    its check is discarded and fetched once more from byte 0, then refused
    with :class:`IntegrityError`. A ``*.safetensors`` file whose header cannot
    be read is refused with :class:`InvalidRemoteFileError`, and a write that
    finds no room raises :class:`DiskFullError`; both remove the partial.
    """
    remote = job.remote
    if chunked.applies(remote.size, job.connections, job.chunk_bytes):
        try:
            return chunked.download_chunked(job)
        except RangeNotSatisfied:
            chunked.discard_chunks(
                job.repo, remote.etag
            )  # the server ignores Range: one connection
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            chunked.discard_chunks(job.repo, remote.etag)
            raise disk_full_error(exc, f"{remote.path}: writing its chunks") from None
        except InvalidRemoteFileError:
            chunked.discard_chunks(job.repo, remote.etag)
            raise
    part = partial_path(job.repo, remote.etag)
    part.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _download_whole(job, part)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        discard(part)
        raise disk_full_error(exc, f"{remote.path}: writing {part.name}") from None
    except InvalidRemoteFileError:
        discard(part)
        raise
    finally:
        _discard_if_empty(part)


def _discard_if_empty(part: Path) -> None:
    """An empty partial left by a failed try (an unexpected ``206``, a redirect loop, a
    body that does not decode) holds nothing to resume: it is not kept."""
    with contextlib.suppress(OSError):
        if part.stat().st_size == 0:
            part.unlink()


def _download_whole(job: Job, part: Path) -> tuple[bool, list[str]]:
    """One connection into ``part`` (``{etag}.incomplete``), resumed from where it ends."""
    remote, retry, url = job.remote, job.retry, job.url
    weights = remote.path.endswith(".safetensors")
    check = ContentCheck(
        remote.etag,
        remote.size,
        safetensors=weights,
        strict=job.strict,
        name=remote.path if weights else None,
    )
    resumed = False
    integrity_failures = 0
    last_error: Exception | None = None
    tries = 0
    for attempt in retry.tries():
        tries = attempt + 1
        check.reset()
        try:
            existing = part.stat().st_size
        except FileNotFoundError:
            existing = 0
        if existing > remote.size:
            part.unlink()
            existing = 0
        try:
            if existing:
                feed_file(check, part, existing)
                if attempt == 0:
                    job.tally.held(existing)
                resumed = resumed or attempt == 0
        except IntegrityError:
            part.unlink()
            existing = 0
            check.reset()
        try:
            if remote.size == 0:
                part.touch()  # an empty file needs no request, but a partial to install
            if existing < remote.size:
                notice = no_answer_notice(f"GET {url}", attempt, retry.attempts)
                try:  # told on the terminal when no byte came within seconds
                    _fetch_into(job, part, existing, check, notice)
                finally:
                    notice.cancel()
                if part.stat().st_size < remote.size:
                    raise HubUnreachableError(
                        f"body ended after {part.stat().st_size} of {remote.size} bytes"
                    )
            check.finish()
        except HubUnreachableError as exc:
            last_error = exc
            pause = retry.delay(attempt, exc)
            done_by = job.client.done_by  # no try starts past it (the caller's own time)
            if not exc.transient or (
                done_by is not None and job.client.retry.clock.monotonic() + pause >= done_by
            ):
                break
            retry.wait(attempt, exc, f"GET {url}", pause)
            continue
        except AnswerTooLarge:
            discard(part)  # refused: nothing of a body longer than listed is kept
            raise
        except IntegrityError as exc:
            last_error = exc
            discard(part)
            integrity_failures += 1
            if integrity_failures >= 2:
                raise IntegrityError(f"{remote.path}: {exc}; refused, nothing installed") from None
            continue
        install_blob(job.repo, remote.etag, part, check)
        return resumed, check.warnings
    assert last_error is not None
    if isinstance(last_error, IntegrityError):
        raise IntegrityError(f"{remote.path}: {last_error}; refused, nothing installed")
    kept = part.exists() and part.stat().st_size > 0
    raise HubUnreachableError(
        f"{remote.path}: download failed after {tries} attempt{'s' * (tries != 1)} "
        f"({last_error}); " + (f"{part.name} kept for resuming" if kept else "nothing kept")
    )


def _fetch_into(
    job: Job, part: Path, existing: int, check: ContentCheck, notice: threading.Timer
) -> None:
    """The body from byte ``existing`` appended to ``part`` and checked; the first byte
    cancels ``notice``."""
    mode = "r+b" if part.exists() else "w+b"
    with open(part, mode) as f:
        f.seek(existing)
        f.truncate()

        def sink(chunk: bytes) -> None:
            notice.cancel()
            f.write(chunk)
            check.update(chunk)
            job.tally.add(len(chunk))

        def restart() -> None:
            f.seek(0)
            f.truncate()
            check.reset()

        try:
            job.client.stream(job.url, existing, sink, on_restart=restart, limit=check.size)
        finally:
            f.flush()
