"""Checked local copies of a commit's files, for readers that need paths (the one
shape of ``local_files`` of every kind that is not a folder)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._index import CommitIndex, FileEntry

#: ``copy(entry, path, dest, vouch)`` writes ``entry``'s checked bytes (or, with ``vouch``,
#: may write its header alone with its stamp's check record) to ``dest``; True when it
#: recorded a check for ``dest``.
CopyOne = Callable[["FileEntry", str, Path, bool], bool]


@contextlib.contextmanager
def checked_copies(
    index: CommitIndex, paths: list[str], stamped_headers: bool, copy: CopyOne
) -> Iterator[dict[str, Path]]:
    """``paths`` of ``index`` copied by ``copy`` into a temporary folder, removed on exit
    with the check records made for its files. A commit with code (``*.py``) never gets a
    header copy: its code may read the tensor bytes a stamp would stand for."""
    from cmh import forget_check

    vouch = stamped_headers and not any(p.endswith(".py") for p in index.files)
    with tempfile.TemporaryDirectory(prefix="cmh-store-") as tmp:
        out: dict[str, Path] = {}
        recorded: list[Path] = []
        try:
            for i, path in enumerate(paths):
                dest = Path(tmp) / f"{i}-{os.path.basename(path)}"
                if copy(index.files[path], path, dest, vouch):
                    recorded.append(dest)
                out[path] = dest
            yield out
        finally:
            for dest in recorded:  # the records name files that go with the folder
                forget_check(dest)
