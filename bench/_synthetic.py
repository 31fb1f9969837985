"""Synthetic benchmark checkpoints, written fast and reproducibly.

``make_checkpoint(path, total_bytes, tensors)`` writes one safetensors file of
about ``total_bytes`` split over ``tensors`` tensors of mixed sizes (a few
large, many small, as in real models). Bytes come from a seeded generator,
written in large blocks, so a 2 GiB file takes seconds. An existing file of
the same parameters is reused. ``make_versions(work, size, fraction)`` writes two
stamped revisions of a small repo whose checkpoints differ in a few whole tensors.
"""

from __future__ import annotations

import json
import os
import random
import shutil
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


def make_versions(work: Path, size: int, fraction: float) -> tuple[Path, Path, int, int]:
    """Folders ``work/v1`` and ``work/v2`` (stamped checkpoint, config, README).

    v2 changes whole tensors worth about ``fraction`` of the tensor bytes.
    Returns (v1, v2, changed tensor bytes, v2's header size).
    """
    import cmh
    from cmh import read_header

    v1, v2 = work / "v1", work / "v2"
    for d in (v1, v2):
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text('{"model_type": "bench"}\n')
    (v1 / "README.md").write_text("# bench v1\n")
    (v2 / "README.md").write_text("# bench v2\n")
    weights1 = v1 / "model.safetensors"
    marker = work / f"v1-{size}.stamped"
    if not marker.exists() or marker.read_text() != str(_size_of(weights1)):
        make_checkpoint(weights1, total_bytes=size, tensors=200, seed=7)
        cmh.stamp(weights1, ttl="30d")
        marker.write_text(str(_size_of(weights1)))
    header = read_header(weights1)
    rng = random.Random(11)
    order = list(header.tensors)
    rng.shuffle(order)
    chosen, total = [], 0
    goal = fraction * header.data_size
    for t in order:  # whole tensors, random ones, adding up to within 10% of the goal
        if total >= 0.9 * goal:
            break
        if total + t.nbytes > 1.1 * goal:
            continue
        chosen.append(t)
        total += t.nbytes
    weights2 = v2 / "model.safetensors"
    shutil.copyfile(weights1, weights2)
    with open(weights2, "r+b") as f:
        for t in chosen:
            f.seek(header.data_start + t.begin)
            data = bytearray(f.read(t.nbytes))
            for i in range(0, len(data), 4096):
                data[i] ^= 0x5A
            f.seek(header.data_start + t.begin)
            f.write(data)
    cmh.stamp(weights2, ttl="30d")
    header2 = read_header(weights2)
    return v1, v2, total, header2.data_start


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1
