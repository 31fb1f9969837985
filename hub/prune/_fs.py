"""Removals below a folder that never follow a link out of it.

Every folder on the way to an entry is opened relative to the one above it with
``O_NOFOLLOW | O_DIRECTORY`` (a link or a file where a folder is expected is refused,
never followed), every entry is judged by ``lstat`` and removed relative to its opened
folder (``unlink``/``rmdir``/``rename`` with ``dir_fd``; folders by the fd-based
``shutil.rmtree``). Only the root itself is opened by its path: a cache reached
through a link (``~/.cache/huggingface -> /data/hf``) is pruned where it lives.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC
_DIR_FLAGS = _ROOT_FLAGS | os.O_NOFOLLOW


def _parts(rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{rel!r} leaves the folder")
    return parts


@dataclass(frozen=True)
class Below:
    """The entries below ``root``, reached without following any link."""

    root: Path

    @contextlib.contextmanager
    def folder(self, rel: str, *, create: bool = False) -> Iterator[int]:
        """An fd of the folder ``rel`` (``""``: the root); ``create`` makes missing ones.

        Raises :class:`NotADirectoryError` when a link or a file stands on the way."""
        fd = os.open(self.root, _ROOT_FLAGS)
        try:
            walked = self.root
            for part in _parts(rel):
                walked = walked / part
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fd)
                try:
                    inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise NotADirectoryError(
                            errno.ENOTDIR, "not a folder (a link is never followed)", str(walked)
                        ) from None
                    raise
                os.close(fd)
                fd = inner
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def parent(self, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """An fd of the folder holding ``rel``, and ``rel``'s name in it."""
        head, _, name = rel.rstrip("/").rpartition("/")
        if not name or name in (".", ".."):
            raise ValueError(f"{rel!r} names no entry")
        with self.folder(head, create=create) as fd:
            yield fd, name

    def lstat(self, rel: str) -> os.stat_result:
        with self.parent(rel) as (fd, name):
            return os.lstat(name, dir_fd=fd)

    def unlink(self, rel: str) -> None:
        """Remove a file or a link (never what a link points to, never a folder)."""
        with self.parent(rel) as (fd, name):
            if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", str(self.root / rel))
            os.unlink(name, dir_fd=fd)

    def remove_tree(self, rel: str) -> None:
        """Remove a folder and what is in it, or a file or link."""
        with self.parent(rel) as (fd, name):
            if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)

    def rmdir(self, rel: str) -> None:
        with self.parent(rel) as (fd, name):
            os.rmdir(name, dir_fd=fd)

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (whose folders are made as needed), both below the root."""
        with (
            self.parent(src) as (src_fd, src_name),
            self.parent(dst, create=True) as (
                dst_fd,
                dst_name,
            ),
        ):
            os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)

    def listdir(self, rel: str) -> list[str]:
        with self.folder(rel) as fd:
            return os.listdir(fd)

    def remove_empty_folders(self, rel: str) -> None:
        """Remove the empty folders below ``rel`` (not ``rel`` itself), deepest first."""
        with self.folder(rel) as fd:
            for _, folders, _, inner in os.fwalk(
                ".", dir_fd=fd, topdown=False, follow_symlinks=False
            ):
                for name in folders:
                    with contextlib.suppress(OSError):  # not empty, or a link
                        os.rmdir(name, dir_fd=inner)
