"""Timing helpers shared by the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Callable


def runs(repeat: int, fn: Callable[[], object]) -> list[float]:
    """Wall times of ``repeat`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    """The shortest wall time of ``repeat`` calls of ``fn``, in seconds."""
    return min(runs(repeat, fn))
