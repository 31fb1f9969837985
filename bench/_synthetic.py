"""Synthetic benchmark checkpoints, written fast and reproducibly.

``make_checkpoint(path, total_bytes, tensors)`` writes one safetensors file of
about ``total_bytes`` split over ``tensors`` tensors of mixed sizes (a few
large, many small, as in real models). Bytes come from a seeded generator,
written in large blocks, so a 2 GiB file takes seconds. An existing file of
the same parameters is reused.
"""

from __future__ import annotations

import json
import os
import random
import struct
from pathlib import Path

GIB = 1 << 30


def tensor_sizes(total_bytes: int, tensors: int, seed: int = 0) -> list[int]:
    """Mixed sizes summing to about ``total_bytes``, each a multiple of 4 bytes."""
    rng = random.Random(seed)
    weights = [rng.lognormvariate(0, 1.5) for _ in range(tensors)]
    scale = total_bytes / sum(weights)
    return [max(4, int(w * scale) // 4 * 4) for w in weights]


def make_checkpoint(
    path: str | os.PathLike[str], total_bytes: int = 2 * GIB, tensors: int = 200, seed: int = 0
) -> Path:
    """Write (or reuse) an unstamped F32 safetensors file; return its path."""
    target = Path(path)
    sizes = tensor_sizes(total_bytes, tensors, seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt", "bench": f"{seed}"}}
    offset = 0
    for i, size in enumerate(sizes):
        header[f"model.layers.{i}.weight"] = {
            "dtype": "F32",
            "shape": [size // 4],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    expected_size = 8 + len(raw) + offset
    if target.exists() and target.stat().st_size == expected_size:
        with open(target, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if f.read(n) == raw:
                return target
    target.parent.mkdir(parents=True, exist_ok=True)
    block = random.Random(seed).randbytes(64 << 20)
    tmp = target.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        remaining = offset
        shift = 0
        while remaining:
            n = min(remaining, len(block))
            # Rotate the block so no two blocks are equal (no accidental dedup).
            f.write(block[shift % n :][:n] if shift % n == 0 else (block[shift % n :] + block)[:n])
            remaining -= n
            shift += 4099
    os.replace(tmp, target)
    return target


def drop_page_cache_hint(path: str | os.PathLike[str]) -> None:
    """Ask the kernel to drop cached pages of ``path`` (best effort, no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
