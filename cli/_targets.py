"""PATH arguments of the format commands, expanded into safetensors files.

A file argument is itself. A directory argument is a checkpoint: every
top-level ``*.safetensors`` plus every shard its index names, with the index
(``model.safetensors.index.json`` or another ``*.safetensors.index.json``)
checked against the shards' headers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cmh import (
    Checkpoint,
    Header,
    InvalidFileError,
    find_checkpoint,
    index_problems,
    name_bytes,
    read_header,
)


@dataclass(frozen=True)
class Target:
    """One PATH argument: the files it stands for and what is wrong with it as a whole.

    ``error`` says why a directory cannot be used at all (unreadable index,
    missing shard, no safetensors file); ``problems`` lists where the index and
    the shards disagree.
    """

    argument: str
    kind: str  # "file" or "directory"
    files: tuple[str, ...]
    index: str | None = None
    problems: tuple[str, ...] = ()
    error: str | None = None

    @property
    def consistent(self) -> bool:
        return self.error is None and not self.problems


def expand(arguments: Iterable[str]) -> list[Target]:
    """One :class:`Target` per argument, in order."""
    return [_expand_one(a) for a in arguments]


def _expand_one(argument: str) -> Target:
    if not os.path.isdir(argument):
        return Target(argument, "file", (argument,))
    try:
        checkpoint = find_checkpoint(argument)
    except InvalidFileError as exc:
        return Target(argument, "directory", (), error=str(exc))
    except OSError as exc:
        return Target(argument, "directory", (), error=f"{argument}: {exc.strerror or exc}")
    root = Path(argument)
    names = sorted({*checkpoint.files, *checkpoint.unindexed}, key=name_bytes)
    files = tuple(str(root / n) for n in names)
    index = str(root / checkpoint.index) if checkpoint.index else None
    return Target(argument, "directory", files, index, tuple(_index_problems(checkpoint)))


def _index_problems(checkpoint: Checkpoint) -> list[str]:
    """Index disagreements and tensors in two shards; empty when a shard is unreadable.

    An unreadable shard is reported by the command that reads it, as an invalid file.
    """
    headers: dict[str, Header] = {}
    for name in checkpoint.files:
        try:
            headers[name] = read_header(os.path.join(checkpoint.directory, name))
        except InvalidFileError:
            return []
    return index_problems(checkpoint, headers)


def data_size(path: str) -> int:
    """Tensor bytes of ``path`` (for a progress bar), or 0 when unreadable."""
    try:
        return read_header(path).data_size
    except InvalidFileError:
        return 0
