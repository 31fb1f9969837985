"""Helpers for the format-library tests: reproducible synthetic state dicts."""

from __future__ import annotations

import numpy as np


def synthetic_tensors(seed: int = 0, count: int = 6) -> dict[str, np.ndarray]:
    """A small state dict of mixed dtypes and shapes, reproducible by seed."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    dtypes = [np.float32, np.float16, np.int64, np.int8, np.uint8, np.float64]
    for i in range(count):
        dtype = dtypes[i % len(dtypes)]
        shape = (int(rng.integers(1, 9)), int(rng.integers(1, 17)))
        tensors[f"layer.{i}.weight"] = (rng.standard_normal(shape) * 10).astype(dtype)
    tensors["scalar"] = np.array(3.5, dtype=np.float32)
    tensors["empty"] = np.zeros((0, 4), dtype=np.float32)
    return tensors
