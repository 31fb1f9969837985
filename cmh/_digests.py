"""Per-tensor digests and the v1 fingerprint root (spec section "Fingerprint").

Digests are computed over read-only ``mmap`` slices in parallel threads,
largest tensors first; ``hashlib`` and ``xxhash`` release the GIL on large
buffers, so two cores hash two tensors at once.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import xxhash

from ._header import Header, TensorEntry, TensorSpec
from ._regular import open_regular

FILE_DOMAIN = b"CMH-FP-v1\n"
DIRECTORY_DOMAIN = b"CMH-DIR-v1\n"
CHUNK_SIZE = 8 << 20

#: Called with a number of bytes just hashed; may be called from worker threads.
ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class Hashing:
    """How tensor bytes are hashed: how many threads (``None``: one per core, at most 8) and
    who hears of the bytes hashed. Never changes what is written or judged."""

    threads: int | None = None
    progress: ProgressCallback | None = None


#: One thread per core (at most 8), no progress callback.
DEFAULT_HASHING = Hashing()


@dataclass(frozen=True)
class TensorDigest:
    """Digests of one tensor's bytes; a digest is ``None`` when not computed."""

    name: str
    sha256: bytes | None
    xxh3: bytes | None


@dataclass(frozen=True)
class RootEntry(TensorSpec):
    """What the root covers of one tensor: name, dtype, shape and SHA-256 of its bytes."""

    sha256: bytes


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity, as ``taskset`` or a container's
    cpuset sets it, not the machine's count (that where there is no affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def default_threads() -> int:
    """Hashing threads by default: the CPUs this process may run on, at most 8."""
    return min(8, usable_cpus())


def hash_tensors(
    path: str | os.PathLike[str],
    header: Header,
    *,
    sha256: bool = True,
    xxh3: bool = False,
    threads: int | None = None,
    progress: ProgressCallback | None = None,
    wait_until: Callable[[int], None] | None = None,
) -> list[TensorDigest]:
    """Hash every tensor of the file at ``path``; results follow ``header.tensors``.

    ``wait_until(offset)``, when given, is called before each chunk with the
    absolute file offset the chunk ends at and returns once those bytes are in
    place: hashing then follows a writer (tensors in offset order).
    """
    if not header.tensors:
        return []
    with open_regular(path) as f:
        if header.data_size == 0:
            empty = _digest_bytes(b"", sha256, xxh3)
            return [TensorDigest(t.name, *empty) for t in header.tensors]
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                base = header.data_start

                def work(t: TensorEntry) -> tuple[bytes | None, bytes | None]:
                    return _digest_view(
                        view, base + t.begin, base + t.end, sha256, xxh3, progress, wait_until
                    )

                order = list(range(len(header.tensors)))
                if wait_until is None:
                    order.sort(key=lambda i: -header.tensors[i].nbytes)
                results: dict[int, tuple[bytes | None, bytes | None]] = {}
                workers = threads or default_threads()
                if workers == 1:
                    for i in order:
                        results[i] = work(header.tensors[i])
                else:
                    with ThreadPoolExecutor(max_workers=workers) as pool:
                        futures = {i: pool.submit(work, header.tensors[i]) for i in order}
                        results = {i: fut.result() for i, fut in futures.items()}
            finally:
                view.release()
    return [TensorDigest(t.name, *results[i]) for i, t in enumerate(header.tensors)]


def _digest_bytes(data: bytes, sha256: bool, xxh3: bool) -> tuple[bytes | None, bytes | None]:
    return (
        hashlib.sha256(data).digest() if sha256 else None,
        xxhash.xxh3_128_digest(data) if xxh3 else None,
    )


def _digest_view(
    view: memoryview,
    begin: int,
    end: int,
    sha256: bool,
    xxh3: bool,
    progress: ProgressCallback | None,
    wait_until: Callable[[int], None] | None,
) -> tuple[bytes | None, bytes | None]:
    sha = hashlib.sha256() if sha256 else None
    fast = xxhash.xxh3_128() if xxh3 else None
    for start in range(begin, end, CHUNK_SIZE):
        stop = min(start + CHUNK_SIZE, end)
        if wait_until is not None:
            wait_until(stop)
        chunk = view[start:stop]
        if sha is not None:
            sha.update(chunk)
        if fast is not None:
            fast.update(chunk)
        if progress is not None:
            progress(len(chunk))
        chunk.release()
    return (
        sha.digest() if sha is not None else None,
        fast.digest() if fast is not None else None,
    )


def root_entries(tensors: Sequence[TensorEntry], sha256: Sequence[bytes]) -> list[RootEntry]:
    """Pair header entries with their SHA-256 digests (same order)."""
    if len(tensors) != len(sha256):
        raise ValueError("one digest per tensor is required")
    return [RootEntry(t.name, t.dtype, t.shape, d) for t, d in zip(tensors, sha256, strict=True)]


def file_root(entries: Iterable[RootEntry], metadata: Mapping[str, str]) -> bytes:
    """The v1 fingerprint root of one file; ``metadata`` excludes reserved keys."""
    h = hashlib.sha256(FILE_DOMAIN)
    _feed_tensors(h, entries)
    items = sorted(((k.encode(), v.encode()) for k, v in metadata.items()), key=lambda kv: kv[0])
    h.update(_u64(len(items)))
    for key, value in items:
        h.update(_u32(len(key)) + key + _u32(len(value)) + value)
    return h.digest()


def directory_root(entries: Iterable[RootEntry]) -> bytes:
    """The v1 directory identity over the union of all shards' tensors (no metadata)."""
    h = hashlib.sha256(DIRECTORY_DOMAIN)
    _feed_tensors(h, entries)
    return h.digest()


def _feed_tensors(h: hashlib._Hash, entries: Iterable[RootEntry]) -> None:
    encoded = sorted(((e.name.encode(), e) for e in entries), key=lambda pair: pair[0])
    h.update(_u64(len(encoded)))
    for name, e in encoded:
        dtype = e.dtype.encode()
        h.update(_u32(len(name)) + name + _u32(len(dtype)) + dtype + _u32(len(e.shape)))
        h.update(b"".join(_u64(d) for d in e.shape))
        h.update(e.sha256)


def _u32(n: int) -> bytes:
    return struct.pack("<I", n)


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)
