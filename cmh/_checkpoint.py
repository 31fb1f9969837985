"""Checkpoint directories: shards, the index file, and the directory identity."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._carrier import read_carrier, user_metadata
from ._digests import (
    ProgressCallback,
    RootEntry,
    directory_root,
    file_root,
    hash_tensors,
    root_entries,
)
from ._errors import CMHError, IndexInconsistentError, InvalidFileError
from ._header import Header, parse_strict_json, read_header, strict_utf8
from ._regular import NotARegularFileError, open_regular

SHARD_SUFFIX = ".safetensors"
INDEX_SUFFIX = SHARD_SUFFIX + ".index.json"
DEFAULT_INDEX = "model" + INDEX_SUFFIX
MAX_INDEX_SIZE = 100_000_000


@dataclass(frozen=True)
class Checkpoint:
    """The safetensors files that make up one checkpoint directory.

    ``other_indexes`` are further index files beside ``index``, and
    ``unindexed`` the top-level ``*.safetensors`` files the index does not
    name: both make the checkpoint ambiguous (see :func:`index_problems`).
    """

    directory: str
    files: tuple[str, ...]
    index: str | None
    weight_map: dict[str, str] | None
    other_indexes: tuple[str, ...] = ()
    unindexed: tuple[str, ...] = ()


def find_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    """The shards named by the index file, else every top-level ``*.safetensors``.

    Raises :class:`InvalidFileError` when the directory is not a usable
    checkpoint (spec section 6): it cannot be listed, an index that breaks the
    index rules, a shard name that is not a plain file name or names no regular
    file of the listing, a file judged (the index, a shard, a stray) whose real
    path leaves the directory (see :class:`_Bounds`), or no index and no
    ``*.safetensors`` file. With several index files,
    ``model.safetensors.index.json`` (else the first by name bytes) is read and
    the others are listed in ``other_indexes``. Nothing is opened but the index,
    and it only once it is known to be a regular file.
    """
    root = str(Path(directory))
    try:
        entries = _regular_files(root)
    except OSError as exc:
        why = "not a directory" if isinstance(exc, NotADirectoryError) else exc.strerror or exc
        raise InvalidFileError(f"cannot list the directory: {why}", root) from exc
    bounds = _Bounds.of(root)
    listed = set(entries)
    indexes = [n for n in entries if n.endswith(INDEX_SUFFIX)]
    index = DEFAULT_INDEX if DEFAULT_INDEX in indexes else (indexes[0] if indexes else None)
    top_level = [n for n in entries if n.endswith(SHARD_SUFFIX)]
    if index is None:
        if not top_level:
            raise InvalidFileError("directory holds no *.safetensors file", root)
        bounds.check(top_level)
        return Checkpoint(root, tuple(top_level), None, None)
    bounds.check([index])
    index_path = os.path.join(root, index)
    weight_map = read_index(index_path)
    files = tuple(sorted(set(weight_map.values()), key=name_bytes))
    for name in files:
        # The listing decides, never an open: a case-insensitive or normalising file
        # system would open M.safetensors for m.safetensors (spec section 6, rule h).
        if name not in listed:
            raise InvalidFileError(f"index names a missing shard {name!r}", index_path)
    unindexed = tuple(f for f in top_level if f not in files)
    bounds.check([*files, *unindexed])
    return Checkpoint(
        root,
        files,
        index,
        weight_map,
        other_indexes=tuple(i for i in indexes if i != index),
        unindexed=unindexed,
    )


def name_bytes(name: str) -> bytes:
    """A directory entry's name as the file system's bytes (the spec's sort key)."""
    return os.fsencode(name)


def _regular_files(root: str) -> list[str]:
    """Names of the regular files (after following links) directly in ``root``, by bytes.

    Types come from ``stat``, nothing is opened: a FIFO, a device, a dangling link, a
    link loop or an entry whose type cannot be learnt is not a regular file.
    """
    names = []
    with os.scandir(root) as it:
        for entry in it:
            try:
                if entry.is_file():
                    names.append(entry.name)
            except OSError:  # a link loop, a permission denied, an entry gone meanwhile
                continue
    return sorted(names, key=name_bytes)


#: Last-component prefixes of a repository folder of the Hugging Face cache.
_CACHE_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


@dataclass(frozen=True)
class _Bounds:
    """Where a checkpoint directory's files may really be (spec section 6, "Links").

    A file judged stays inside when its real path is below the directory's real
    path (at any depth, compared by components), or, for a snapshot of the Hugging
    Face cache (real path ``R/snapshots/S``, ``R`` named ``models--...``,
    ``datasets--...`` or ``spaces--...``), below its repository folder ``R``,
    whose ``blobs/`` its links point into.
    """

    directory: str
    allowed: str

    @classmethod
    def of(cls, directory: str) -> _Bounds:
        real = os.path.realpath(directory)
        snapshots, _ = os.path.split(real)
        repo, folder = os.path.split(snapshots)
        in_cache = folder == "snapshots" and os.path.basename(repo).startswith(_CACHE_REPO_PREFIXES)
        return cls(directory, repo if in_cache else real)

    def check(self, names: list[str] | tuple[str, ...]) -> None:
        """Raise :class:`InvalidFileError` for the first name whose real path is outside."""
        for name in names:
            real = os.path.realpath(os.path.join(self.directory, name))
            if os.path.commonpath([self.allowed, real]) != self.allowed or real == self.allowed:
                raise InvalidFileError(
                    f"{name!r} is a link that resolves outside the directory (to {real})",
                    self.directory,
                )


def read_index(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``weight_map`` of an index file, judged by the index rules of spec section 6.

    Rule a is judged on the size ``fstat`` gives before anything is read, and no more
    than the limit is ever read (a file growing meanwhile is judged by what was read).
    """
    name = os.fspath(path)
    try:
        with open_regular(name) as f:
            if os.fstat(f.fileno()).st_size > MAX_INDEX_SIZE:
                raise InvalidFileError("index file is over 100,000,000 bytes", name)
            raw = f.read(MAX_INDEX_SIZE + 1)
    except NotARegularFileError as exc:
        raise InvalidFileError(f"index {exc.strerror}", name) from exc
    except OSError as exc:
        raise InvalidFileError(f"cannot read the index: {exc.strerror or exc}", name) from exc
    if len(raw) > MAX_INDEX_SIZE:
        raise InvalidFileError("index file is over 100,000,000 bytes", name)
    weight_map = parse_index(raw, name)
    for shard in weight_map.values():
        why = shard_name_problem(shard)
        if why is not None:
            raise InvalidFileError(f"index names the shard {shard!r}: {why}", name)
    return weight_map


def parse_index(raw: bytes, path: str | None = None) -> dict[str, str]:
    """Section 6 rules a-f: strict UTF-8 JSON, one object, a non-empty ``weight_map`` of strings."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise InvalidFileError("index starts with a byte-order mark (not JSON)", path)
    text = strict_utf8(raw, "index", path)
    try:
        obj = parse_strict_json(text)
    except ValueError as exc:
        raise InvalidFileError(f"index is not valid JSON: {exc}", path) from exc
    weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InvalidFileError("index has no weight_map of tensor name to file name", path)
    if not weight_map:
        raise InvalidFileError("index has an empty weight_map: it names no shard", path)
    return dict(weight_map)


def shard_name_problem(name: str) -> str | None:
    """Why ``name`` is not a plain shard file name (section 6 rule g), or ``None``."""
    if not name.endswith(SHARD_SUFFIX):
        return "a shard name must end in .safetensors"
    for char, what in (("/", "a slash"), ("\\", "a backslash"), ("\0", "a NUL character")):
        if char in name:
            return (
                f"a shard name must be a plain file name, without {what} (names are not normalised)"
            )
    return None


def read_headers(checkpoint: Checkpoint) -> dict[str, Header]:
    """Headers of every shard, by file name."""
    return {f: read_header(os.path.join(checkpoint.directory, f)) for f in checkpoint.files}


def index_problems(checkpoint: Checkpoint, headers: dict[str, Header]) -> list[str]:
    """Where the index and the shards disagree, and tensors named twice across shards.

    Several index files, and a top-level ``*.safetensors`` the index does not
    name, are disagreements too: which files make the checkpoint is ambiguous.
    """
    problems: list[str] = []
    if checkpoint.other_indexes:
        names = ", ".join((checkpoint.index or "", *checkpoint.other_indexes))
        problems.append(f"several index files ({names}): which one describes the checkpoint")
    for name in checkpoint.unindexed:
        problems.append(f"{name} is not named by the index {checkpoint.index}")
    seen: dict[str, str] = {}
    for file, header in headers.items():
        for t in header.tensors:
            if t.name in seen:
                problems.append(f"tensor {t.name!r} is in both {seen[t.name]} and {file}")
            seen[t.name] = file
    if checkpoint.weight_map is not None:
        for name, file in sorted(checkpoint.weight_map.items()):
            actual = seen.get(name)
            if actual is None:
                problems.append(f"index names tensor {name!r} in {file}, but no shard holds it")
            elif actual != file:
                problems.append(f"index puts tensor {name!r} in {file}, but it is in {actual}")
        for name in sorted(seen.keys() - checkpoint.weight_map.keys()):
            problems.append(f"tensor {name!r} in {seen[name]} is missing from the index")
    return problems


@dataclass(frozen=True)
class DirectoryIdentity:
    """The v1 directory identity of a checkpoint and what it covered."""

    identity: bytes
    files: tuple[str, ...]
    tensor_count: int
    tensor_bytes: int
    hashed_files: tuple[str, ...]

    @property
    def hex(self) -> str:
        return self.identity.hex()


def claimed_digests(header: Header) -> list[bytes] | None:
    """SHA-256 digests from a stamped header's manifest, if it agrees with its record.

    No tensor byte is read: the manifest is trusted to describe the bytes, which
    only a verification (hashing) confirms.
    """
    try:
        carrier = read_carrier(header.metadata, len(header.tensors))
    except CMHError:
        return None
    if carrier is None or carrier.sha256 is None:
        return None
    digests = list(carrier.sha256)
    root = file_root(root_entries(header.tensors, digests), user_metadata(header.metadata))
    return digests if root == carrier.record.fingerprint else None


def directory_identity(
    directory: str | os.PathLike[str],
    *,
    use_manifests: bool = False,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    on_file: Callable[[str], None] | None = None,
) -> DirectoryIdentity:
    """The directory identity over the union of all shards' tensors.

    Raises :class:`InvalidFileError` for a directory that is not a usable
    checkpoint (a stray or shard that is not a valid file included), then
    :class:`IndexInconsistentError` when the index and the shards disagree:
    the outcomes ``invalid_file`` and ``index_inconsistent`` of ``cmh verify``.
    With ``use_manifests``, stamped shards whose manifest agrees with their
    record contribute their manifest digests without reading tensor bytes.
    """
    checkpoint = find_checkpoint(directory)
    headers = read_headers(checkpoint)
    for stray in checkpoint.unindexed:  # an invalid stray makes the directory invalid_file
        read_header(os.path.join(checkpoint.directory, stray))
    problems = index_problems(checkpoint, headers)
    if problems:
        raise IndexInconsistentError(checkpoint.directory, tuple(problems))
    entries: list[RootEntry] = []
    hashed: list[str] = []
    for file, header in headers.items():
        if on_file is not None:
            on_file(file)
        digests = claimed_digests(header) if use_manifests else None
        if digests is None:
            hashed.append(file)
            computed = hash_tensors(
                os.path.join(checkpoint.directory, file),
                header,
                threads=threads,
                progress=progress,
            )
            digests = [d.sha256 for d in computed if d.sha256 is not None]
        entries.extend(root_entries(header.tensors, digests))
    return DirectoryIdentity(
        identity=directory_root(entries),
        files=checkpoint.files,
        tensor_count=len(entries),
        tensor_bytes=sum(t.nbytes for h in headers.values() for t in h.tensors),
        hashed_files=tuple(hashed),
    )
