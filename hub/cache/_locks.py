"""Inter-process locks on a cache or store, shared by the resolver, mirror and pruner.

All lock files live in ``{root}/.locks/{repo_folder}/``, the folder the stock
client already uses, so the stock scanner ignores them. Locks are
``fcntl.flock`` locks: released by the kernel when a process dies.

- ``blob_lock``: exclusive, the stock client's own ``{etag}.lock``: one
  downloader per blob, whether stock or cmh.
- ``repo_lock``: shared by resolvers while they fill or swap a snapshot and by
  the mirror while it reads; exclusive for a pruner while it deletes.
- ``revision_lock``: shared by anyone using one commit's snapshot; exclusive
  for a pruner deleting that commit.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from ._clock import SYSTEM_CLOCK, Clock
from ._layout import RepoLayout

#: Lock files are group-writable, like the stock client's (``FileLock(mode=0o664)``),
#: so a cache shared by a group can be locked by every member.
LOCK_FILE_MODE = 0o664
#: Times a lock folder is made again after it vanished between our looks (a pruner's
#: race); a folder that cannot be made at all (``/proc/x``) fails after these, not never.
FOLDER_RETRIES = 20
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class LockBusy(TimeoutError):
    """The lock could not be taken within the time allowed."""


class LockFileRefused(OSError):
    """The lock file is a link or not a regular file: it is never opened through."""


@contextlib.contextmanager
def flock(
    path: Path,
    *,
    shared: bool = False,
    timeout: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
    discard: Callable[[], bool] | None = None,
) -> Iterator[None]:
    """Hold an ``flock`` on ``path`` (created if needed).

    ``timeout=None`` waits forever, ``0`` tries once; :class:`LockBusy` otherwise. The
    wait is measured (and slept) on ``clock``, the caller's (:mod:`cmh.hub.cache._clock`).
    A holder may delete the lock file (:func:`unlink_held`): a process that was
    waiting on the old file then locks the new one instead, so mutual exclusion
    survives lock-file cleanup.

    ``discard``: asked when the block ends; when it says ``True`` and no other holder
    has the lock (taken exclusive without waiting), the lock file is deleted while held
    (:func:`unlink_held`), so a call that wrote nothing leaves no lock file behind.
    """
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    deadline = None if timeout is None else clock.monotonic() + timeout
    vanished = 0
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _open_lock_file(path)
        except (FileNotFoundError, FileExistsError):
            # A pruner removed the lock folder (or the file) between our looks at it: again.
            vanished += 1
            if vanished > FOLDER_RETRIES:
                raise
            continue
        try:
            _acquire(fd, mode, deadline, path, clock)
        except BaseException:
            os.close(fd)
            raise
        if _still_linked(fd, path):
            break
        # A pruner removed (or replaced) the lock file while we waited: lock the new one.
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    try:
        yield
    finally:
        try:
            if discard is not None and discard():
                _discard_held(fd, path)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _discard_held(fd: int, path: Path) -> None:
    """Delete the lock file ``fd`` holds when nobody else holds or waits on it: taken
    exclusive without waiting (a shared lock held elsewhere refuses that; a waiter that
    gets the old file afterwards sees it unlinked and locks a new one)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return
    if _still_linked(fd, path):
        unlink_held(path)


def _open_lock_file(path: Path) -> int:
    """A descriptor of the lock file at ``path``, made if missing; never through a link.

    A lock folder may be writable by a whole group, so anyone in it can plant a link
    there: a link (or anything but a regular file) is refused, never followed, and only
    a file this call made is given :data:`LOCK_FILE_MODE` (not narrowed by the umask, as
    the stock client does); an existing file keeps its mode. ``O_NONBLOCK`` so a FIFO
    planted there cannot block the open."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, LOCK_FILE_MODE)
        created = True
    except FileExistsError:
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise LockFileRefused(
                    errno.ELOOP, "the lock file is a link, never followed", str(path)
                ) from None
            raise
        created = False
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LockFileRefused(
                errno.EINVAL, "the lock file is not a regular file, never used", str(path)
            )
        if created:
            with contextlib.suppress(PermissionError):
                os.fchmod(fd, LOCK_FILE_MODE)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _acquire(fd: int, mode: int, deadline: float | None, path: Path, clock: Clock) -> None:
    if deadline is None:
        fcntl.flock(fd, mode)
        return
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if clock.monotonic() >= deadline:
                raise LockBusy(f"lock {path} is held by another process") from None
            clock.sleep(delay)
            delay = min(delay * 2, 0.1)


def _still_linked(fd: int, path: Path) -> bool:
    """True when ``fd`` is still the file at ``path`` (not unlinked or replaced since opened)."""
    try:
        current = os.lstat(path)  # a link put in its place is not the file we hold
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return held.st_nlink > 0 and (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino)


def unlink_held(path: Path) -> None:
    """Remove a lock file while holding it; waiters notice and lock a fresh file."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def blob_lock(
    repo: RepoLayout, etag: str, timeout: float | None = None, *, clock: Clock = SYSTEM_CLOCK
) -> contextlib.AbstractContextManager[None]:
    """The stock client's per-blob download lock."""
    return flock(repo.locks / f"{etag}.lock", timeout=timeout, clock=clock)


def repo_lock(
    repo: RepoLayout,
    *,
    shared: bool,
    timeout: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
    discard: Callable[[], bool] | None = None,
) -> contextlib.AbstractContextManager[None]:
    """Shared while filling or reading, exclusive while deleting (``discard``: see
    :func:`flock`)."""
    return flock(
        repo.locks / "cmh.repo.lock", shared=shared, timeout=timeout, clock=clock, discard=discard
    )


def revision_lock(
    repo: RepoLayout,
    commit: str,
    *,
    shared: bool,
    timeout: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> contextlib.AbstractContextManager[None]:
    """Shared while a commit's snapshot is in use, exclusive while it is deleted."""
    repo.snapshot_dir(commit)  # validates the commit
    path = repo.locks / f"cmh.rev.{commit}.lock"
    return flock(path, shared=shared, timeout=timeout, clock=clock)


@contextlib.contextmanager
def snapshot_in_use(
    repo: RepoLayout, commit: str, *, timeout: float | None = None, clock: Clock = SYSTEM_CLOCK
) -> Iterator[Path]:
    """Hold ``commit``'s snapshot against pruning while it is read; yield its folder.

    Raises :class:`FileNotFoundError` when the snapshot is already gone (pruned
    before the lock was taken): resolve again. To leave no such window, take it
    while the shared repo lock that covered the resolve is still held.
    """
    with revision_lock(repo, commit, shared=True, timeout=timeout, clock=clock):
        folder = repo.snapshot_dir(commit)
        if not folder.is_dir():
            raise FileNotFoundError(2, "snapshot was pruned", str(folder))
        yield folder
