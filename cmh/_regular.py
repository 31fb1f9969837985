"""Opening a file that must be a regular file, without ever blocking on one that is not.

A FIFO opened for reading blocks until a writer appears, a device may do anything:
a path is looked at with ``stat`` first, then opened with ``O_NONBLOCK`` (so a path
swapped for a FIFO meanwhile still cannot block) and looked at again on the open
descriptor. What is not a regular file raises :class:`NotARegularFileError`, an
``OSError`` whose ``strerror`` names what it is.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import BinaryIO

_KINDS = (
    (stat.S_ISLNK, "is a symbolic link"),
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO (named pipe)"),
    (stat.S_ISSOCK, "is a socket"),
    (stat.S_ISCHR, "is a character device"),
    (stat.S_ISBLK, "is a block device"),
)


#: Most bytes :func:`read_small_file` reads: a key, token or secret file is far smaller.
SMALL_FILE_LIMIT = 1 << 20


class NotARegularFileError(OSError):
    """The path exists but is not a regular file (``strerror`` says what it is)."""


def file_kind(mode: int) -> str:
    """``is a FIFO (named pipe)`` and the like, for a mode that is not a regular file's."""
    return next((what for test, what in _KINDS if test(mode)), "is not a regular file")


def _check(mode: int, path: str) -> None:
    if not stat.S_ISREG(mode):
        raise NotARegularFileError(0, f"{file_kind(mode)}, not a regular file", path)


def open_regular(
    path: str | os.PathLike[str], writable: bool = False, *, follow_links: bool = True
) -> BinaryIO:
    """Open the regular file at ``path`` for reading, or reading and writing; links are
    followed unless ``follow_links`` is false (then a link is not a regular file).

    Raises :class:`NotARegularFileError` for anything else, and ``OSError`` when the
    path cannot be looked at or opened; never blocks on a FIFO or a device.
    """
    name = os.fspath(path)
    _check((os.stat if follow_links else os.lstat)(name).st_mode, name)
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        if not follow_links and exc.errno == errno.ELOOP:  # swapped for a link meanwhile
            raise NotARegularFileError(0, "is a symbolic link, not a regular file", name) from None
        raise
    try:
        _check(os.fstat(fd).st_mode, name)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "r+b" if writable else "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small_file(
    path: str | os.PathLike[str], limit: int = SMALL_FILE_LIMIT, *, follow_links: bool = True
) -> bytes:
    """The bytes of a small regular file (a key, a tokens file): at most ``limit`` are read.

    Opened as :func:`open_regular` does (never blocks on a FIFO or a device; a link is
    refused unless ``follow_links``); a larger file raises ``OSError`` (``EFBIG``) whose
    ``strerror`` names the bound.
    """
    with open_regular(path, follow_links=follow_links) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        bound = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"
        raise OSError(
            errno.EFBIG,
            f"is larger than {bound}, too large for a key, token or secret file (the wrong file?)",
            os.fspath(path),
        )
    return data
