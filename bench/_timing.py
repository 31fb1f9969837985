"""Timing helpers shared by the benchmark scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


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


def durable_write(source: Path, target: Path) -> None:
    """Copy ``source`` with ``dd conv=fsync`` (the durable-write floor), or its Python twin."""
    if shutil.which("dd"):
        subprocess.run(
            ["dd", f"if={source}", f"of={target}", "bs=64M", "conv=fsync", "status=none"],
            check=True,
        )
        return
    with open(source, "rb", buffering=0) as src, open(target, "wb", buffering=0) as dst:
        while data := src.read(64 << 20):
            dst.write(data)
        os.fsync(dst.fileno())


def warm(*paths: Path) -> None:
    """Read ``paths`` once, so that a timed read finds them in the page cache."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


def durable_kernel_copy(source: Path, target: Path) -> None:
    """Copy ``source`` in the kernel (``copy_file_range``) and ``fsync`` the copy.

    What a tensor-level update must at least do on a filesystem without reflink:
    write the whole new file durably, its unchanged bytes by a kernel copy.
    """
    size = source.stat().st_size
    src = os.open(source, os.O_RDONLY)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            done = 0
            while done < size:
                n = os.copy_file_range(src, dst, min(64 << 20, size - done), done, done)
                if n == 0:
                    raise OSError(f"{source} shrank while it was copied")
                done += n
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process tree (Linux ``/proc``): the process (all its
    threads), the children it reaped and, recursively, its live children (0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    own = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # u, s, cu, cs
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children.update(int(c) for c in task.read_text().split())
        except OSError:  # the thread ended meanwhile
            continue
    return own + sum(cpu_seconds(c) for c in children)


def softirq_seconds() -> float:
    """CPU seconds of the kernel's ``ksoftirqd`` threads (Linux): loopback packets the
    sending process did not process itself, deferred to them."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(ksoftirqd/" in text:
            fields = text.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (Linux ``/proc/stat``: every state
    but idle and iowait, summed over the cores): what every process and the kernel took,
    the bench's clients included."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
