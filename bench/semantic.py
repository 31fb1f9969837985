"""Semantic fingerprint of stamped sharded checkpoints: milliseconds, flat in tensor bytes.

For each size (GiB-class, default 1, 2, 4, 10) this writes a sharded
checkpoint in bench-work/semantic/: 291 BF16 tensors laid out like a 7B
Llama (scaled to the size) over 4 shards plus an index and a config. Tensor
bytes are a sparse file (holes read as zeros, so nothing is written to disk).
Two twins per size:

- stamped: each shard is stamped with ``cmh.stamp`` (it hashes every tensor
  byte once: setup time, printed separately). The shards are written with
  the ``cmh*`` values already laid out at their final widths, so the stamp
  fills them in place instead of copying the file;
- unstamped: the same tensors, not stamped (the fingerprint must hash them).

Measured, in this run: ``cmh.semantic.fingerprint`` on both twins (best of
``--repeat``, sizes interleaved), the bytes that process read through read() (``rchar`` of
/proc/self/io), and the bytes it mapped with ``mmap`` (the only way the
format library reads tensor bytes). Printed: fingerprint time in ms, its
ratio to the unstamped twin's (the baseline: hashing the same tensors), and
the ratio of each size's time to the smallest size's (flat = ~1 while tensor
bytes grow 10x). Usage: ``python bench/semantic.py [--sizes 1,2,4,10] [--repeat 20] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any

import cmh
from cmh import Record, carrier_values
from cmh.semantic import ModelFingerprint, fingerprint

GIB = 1 << 30
WORK = Path(__file__).resolve().parent.parent / "bench-work" / "semantic"
SHARDS = 4
LAYERS = 32
HIDDEN, INTERMEDIATE, VOCAB, KV = 4096, 11008, 32000, 4096

# -- what the process read --------------------------------------------------------------


class Counter:
    """Bytes mapped through ``mmap.mmap`` while installed (wraps the constructor)."""

    def __init__(self) -> None:
        self.mapped = 0
        self.maps = 0
        self._original = mmap.mmap

    def __enter__(self) -> Counter:
        counter = self
        original = self._original

        class CountingMmap(original):  # type: ignore[misc, valid-type]
            def __new__(cls, fileno: int, length: int, *args: Any, **kwargs: Any) -> Any:
                obj = super().__new__(cls, fileno, length, *args, **kwargs)
                counter.maps += 1
                counter.mapped += len(obj)
                return obj

        mmap.mmap = CountingMmap  # type: ignore[misc]
        return self

    def __exit__(self, *exc: object) -> None:
        mmap.mmap = self._original  # type: ignore[misc]


def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


# -- the synthetic checkpoint --------------------------------------------------------------


def layout(total_bytes: int) -> list[tuple[str, list[int]]]:
    """291 tensor names and BF16 shapes of a 7B Llama, rows scaled so the sum is ~total."""
    shapes: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", [HIDDEN, HIDDEN]),
            (p + "self_attn.k_proj.weight", [KV, HIDDEN]),
            (p + "self_attn.v_proj.weight", [KV, HIDDEN]),
            (p + "self_attn.o_proj.weight", [HIDDEN, HIDDEN]),
            (p + "mlp.gate_proj.weight", [INTERMEDIATE, HIDDEN]),
            (p + "mlp.up_proj.weight", [INTERMEDIATE, HIDDEN]),
            (p + "mlp.down_proj.weight", [HIDDEN, INTERMEDIATE]),
            (p + "input_layernorm.weight", [HIDDEN]),
            (p + "post_attention_layernorm.weight", [HIDDEN]),
        ]
    shapes += [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]
    full = sum(2 * _numel(s) for _, s in shapes)
    scale = total_bytes / full
    return [(n, [max(1, round(s[0] * scale)), *s[1:]] if len(s) == 2 else s) for n, s in shapes]


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def write_shard(path: Path, tensors: list[tuple[str, list[int]]], reserve: bool) -> None:
    """A sparse shard; with ``reserve``, ``cmh*`` values laid out for an in-place stamp."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in tensors:
        size = 2 * _numel(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    metadata = {"format": "pt"}
    if reserve:
        placeholder = Record(expires_at=0, fingerprint=bytes(32), flags=0, stamped_at=0)
        n = len(tensors)
        metadata.update(carrier_values(placeholder, [bytes(32)] * n, [bytes(16)] * n))
    raw = json.dumps({"__metadata__": metadata, **header}, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def write_checkpoint(directory: Path, total_bytes: int, reserve: bool) -> int:
    """Four shards, an index and a config; returns the tensor bytes."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    tensors = layout(total_bytes)
    per_shard = sum(2 * _numel(s) for _, s in tensors) / SHARDS
    groups: list[list[tuple[str, list[int]]]] = [[] for _ in range(SHARDS)]
    filled = 0
    for name, shape in tensors:
        groups[min(SHARDS - 1, int(filled // per_shard))].append((name, shape))
        filled += 2 * _numel(shape)
    weight_map = {}
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        write_shard(directory / file, group, reserve)
        weight_map.update({name: file for name, _ in group})
    index = {"metadata": {"total_size": filled}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return filled


# -- measuring -------------------------------------------------------------------------------


def measured(directory: Path) -> tuple[ModelFingerprint, float, int, int]:
    """One fingerprint: its time, bytes read via read() and bytes mapped via mmap meanwhile."""
    with Counter() as counter:
        before = rchar()
        start = time.perf_counter()
        fp = fingerprint(directory)
        elapsed = time.perf_counter() - start
        read = rchar() - before
    return fp, elapsed, read, counter.mapped


def drop_cache(directory: Path) -> None:
    """Let the kernel drop the pages hashing left cached (best effort)."""
    for path in directory.glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,2,4,10", help="GiB-class sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep bench-work/semantic/")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    # stamp check records (cmh._checks) of the bench's files stay in its work folder
    os.environ.setdefault("CMH_CHECKS_DIR", str(WORK / "stamp-checks"))
    print(f"cores: {os.cpu_count()}, {SHARDS} shards, 291 BF16 tensors, sparse tensor bytes")

    # 1. setup: write both twins, stamp one (hashes every byte once).
    dirs: dict[float, tuple[Path, Path, int]] = {}
    for size in sizes:
        stamped_dir, plain_dir = WORK / f"{size:g}g-stamped", WORK / f"{size:g}g-unstamped"
        start = time.perf_counter()
        tensor_bytes = write_checkpoint(stamped_dir, int(size * GIB), reserve=True)
        write_checkpoint(plain_dir, int(size * GIB), reserve=False)
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        for shard in sorted(stamped_dir.glob("*.safetensors")):
            assert cmh.stamp(shard).in_place, "shards were laid out for an in-place stamp"
        stamp_s = time.perf_counter() - start
        drop_cache(stamped_dir)
        dirs[size] = (stamped_dir, plain_dir, tensor_bytes)
        print(
            f"setup {human(tensor_bytes):>9}: write {write_s:5.2f} s, "
            f"stamp {stamp_s:6.2f} s ({tensor_bytes / stamp_s / 1e9:.2f} GB/s hashed once)"
        )

    # 2. stamped fingerprints, sizes interleaved so machine load hits all alike.
    best = dict.fromkeys(sizes, float("inf"))
    reads: dict[float, tuple[int, int]] = {}
    reference: dict[float, ModelFingerprint] = {}
    for _ in range(args.repeat):
        for size in sizes:
            fp, elapsed, read, mapped = measured(dirs[size][0])
            assert fp.hashed_files == (), fp.hashed_files
            best[size] = min(best[size], elapsed)
            reads[size] = (
                max(read, reads.get(size, (0, 0))[0]),
                max(mapped, reads.get(size, (0, 0))[1]),
            )
            reference[size] = fp

    # 3. baseline: the unstamped twin, which must be hashed.
    print(
        f"{'tensor bytes':>12} | {'stamped':>10} {'read()':>10} {'mmap':>6} | "
        f"{'unstamped':>10} {'mmap':>10} | {'speedup':>8} {'vs first':>8}"
    )
    first = best[sizes[0]]
    for size in sizes:
        stamped_dir, plain_dir, tensor_bytes = dirs[size]
        base, base_s, _, base_mapped = measured(plain_dir)
        drop_cache(plain_dir)
        assert (base.weights, base.graph) == (reference[size].weights, reference[size].graph)
        assert len(base.hashed_files) == SHARDS
        read, mapped = reads[size]
        print(
            f"{human(tensor_bytes):>12} | {best[size] * 1000:7.2f} ms {human(read):>10} "
            f"{human(mapped):>6} | {base_s:8.2f} s {human(base_mapped):>10} | "
            f"{base_s / best[size]:7.0f}x {best[size] / first:7.2f}x"
        )
    b0, b1 = dirs[sizes[0]][2], dirs[sizes[-1]][2]
    last = best[sizes[-1]]
    print(
        f"tensor bytes grew {b1 / b0:.1f}x; stamped fingerprint time changed "
        f"{last / first:.2f}x ({first * 1000:.2f} ms -> {last * 1000:.2f} ms); "
        f"at most {human(max(r for r, _ in reads.values()))} read() and "
        f"{human(max(m for _, m in reads.values()))} mapped per stamped fingerprint"
    )
    if not args.keep:
        shutil.rmtree(WORK, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
