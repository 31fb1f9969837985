"""Whole downloads into a stock cache: resumable, checked, installed atomically.

A whole download in progress lives in ``blobs/{etag}.incomplete`` (always a
prefix of the blob, the name the stock client used to resume), so a rerun
after a crash, or another process, continues it with ``Range``. Nothing is
installed before :class:`~cmh.hub.cache.blobs.ContentCheck` accepts every byte.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from ..cache.blobs import (
    ContentCheck,
    Progress,
    disk_full_error,
    feed_file,
    install_blob,
    is_disk_full,
    partial_path,
)
from ..cache.layout import RepoLayout
from . import chunked
from .http import HubClient, RangeNotSatisfied
from .retry import DEFAULT_RETRY, RetryPolicy, no_answer_notice
from .types import (
    AnswerTooLarge,
    HubUnreachableError,
    IntegrityError,
    InvalidRemoteFileError,
    RemoteFile,
)


def download_whole(
    client: HubClient,
    repo: RepoLayout,
    remote: RemoteFile,
    url: str,
    *,
    strict: bool = False,
    retry: RetryPolicy = DEFAULT_RETRY,
    progress: Progress | None = None,
    connections: int = 1,
    chunk_bytes: int = chunked.MIN_CHUNK,
) -> tuple[int, bool, list[str]]:
    """Fetch blob ``remote.etag`` whole into the cache, resuming any partial.

    The caller holds the blob lock. Returns (bytes received, resumed, warnings).
    A file of more than one chunk is fetched over ``connections`` parallel
    range connections (:mod:`cmh.hub.resolver.chunked`), unless the server
    ignores ``Range``; then, and for smaller files, over one connection.
    Transfer failures are retried under ``retry`` (backoff with jitter,
    ``Retry-After`` honoured) with ``Range`` from where the partial ends;
    content that fails its check is discarded and fetched once more from
    byte 0, then refused with :class:`IntegrityError`. A ``*.safetensors``
    file whose header cannot be read is refused with
    :class:`InvalidRemoteFileError`, and a write that finds no room raises
    :class:`DiskFullError`; both remove the partial.
    """
    if chunked.applies(remote.size, connections, chunk_bytes):
        try:
            return chunked.download_chunked(
                client, repo, remote, url, connections=connections, chunk_bytes=chunk_bytes,
                strict=strict, retry=retry, progress=progress,
            )  # fmt: skip
        except RangeNotSatisfied:
            chunked.discard(repo, remote.etag)  # the server ignores Range: one connection
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            chunked.discard(repo, remote.etag)
            raise disk_full_error(exc, f"{remote.path}: writing its chunks") from None
        except InvalidRemoteFileError:
            chunked.discard(repo, remote.etag)
            raise
    part = partial_path(repo, remote.etag)
    part.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _download_whole(client, repo, remote, url, part, strict, retry, progress)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        _remove(part)
        raise disk_full_error(exc, f"{remote.path}: writing {part.name}") from None
    except InvalidRemoteFileError:
        _remove(part)
        raise


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _download_whole(
    client: HubClient,
    repo: RepoLayout,
    remote: RemoteFile,
    url: str,
    part: Path,
    strict: bool,
    retry: RetryPolicy,
    progress: Progress | None,
) -> tuple[int, bool, list[str]]:
    weights = remote.path.endswith(".safetensors")
    check = ContentCheck(
        remote.etag,
        remote.size,
        safetensors=weights,
        strict=strict,
        name=remote.path if weights else None,
    )
    received = 0
    resumed = False
    integrity_failures = 0
    last_error: Exception | None = None
    for attempt in retry.tries():
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
                    received += _fetch_into(
                        client, url, part, existing, check, _cancelling(notice, progress)
                    )
                finally:
                    notice.cancel()
                if part.stat().st_size < remote.size:
                    raise HubUnreachableError(
                        f"body ended after {part.stat().st_size} of {remote.size} bytes"
                    )
            check.finish()
        except HubUnreachableError as exc:
            last_error = exc
            retry.wait(attempt, exc, f"GET {url}")
            continue
        except AnswerTooLarge:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()  # refused: nothing of a body longer than listed is kept
            raise
        except IntegrityError as exc:
            last_error = exc
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
            integrity_failures += 1
            if integrity_failures >= 2:
                raise IntegrityError(f"{remote.path}: {exc}; refused, nothing installed") from None
            continue
        install_blob(repo, remote.etag, part, check)
        return received, resumed, check.warnings
    assert last_error is not None
    if isinstance(last_error, IntegrityError):
        raise IntegrityError(f"{remote.path}: {last_error}; refused, nothing installed")
    raise HubUnreachableError(
        f"{remote.path}: download failed after {retry.attempts} attempts ({last_error}); "
        f"{part.name} kept for resuming"
    )


def _cancelling(notice: threading.Timer, progress: Progress | None) -> Progress:
    """``progress`` that first cancels ``notice`` (an answer came)."""

    def told(nbytes: int) -> None:
        notice.cancel()
        if progress is not None:
            progress(nbytes)

    return told


def _fetch_into(
    client: HubClient,
    url: str,
    part: Path,
    existing: int,
    check: ContentCheck,
    progress: Progress | None,
) -> int:
    received = 0
    mode = "r+b" if part.exists() else "w+b"
    with open(part, mode) as f:
        f.seek(existing)
        f.truncate()

        def sink(chunk: bytes) -> None:
            nonlocal received
            f.write(chunk)
            check.update(chunk)
            received += len(chunk)
            if progress is not None:
                progress(len(chunk))

        def restart() -> None:
            f.seek(0)
            f.truncate()
            check.reset()

        try:
            client.stream(url, existing, sink, on_restart=restart, limit=check.size)
        finally:
            f.flush()
    return received
