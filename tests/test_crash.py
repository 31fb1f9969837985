"""SIGKILL at random moments during a first stamp never damages the original path."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import cmh

CHILD = """
import sys, cmh
print("ready", flush=True)
sys.stdin.readline()
cmh.stamp(sys.argv[1], ttl="30d")
print("done", flush=True)
"""


def start_stamp(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.slow
def test_sigkill_during_first_stamp_leaves_a_loadable_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    tensors = {f"w{i}": rng.standard_normal((256, 1024 + i)).astype(np.float32) for i in range(40)}
    original = tmp_path / "original.safetensors"
    save_file(tensors, str(original), {"format": "pt"})  # ~42 MB

    # Measure one full stamp to spread the kills across its duration.
    work = tmp_path / "model.safetensors"
    shutil.copyfile(original, work)
    proc = start_stamp(work)
    started = time.perf_counter()
    proc.communicate("go\n", timeout=120)
    duration = time.perf_counter() - started
    assert cmh.verify(work).ok

    chooser = random.Random(11)
    outcomes = {"stamped": 0, "original": 0}
    for _ in range(20):
        shutil.copyfile(original, work)
        proc = start_stamp(work)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(chooser.uniform(0, duration * 1.1))  # a kill point inside the real stamping
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        loaded = load_file(str(work))
        assert loaded.keys() == tensors.keys()
        for name, value in tensors.items():
            assert np.array_equal(loaded[name], value)
        verdict = cmh.verify(work)
        assert verdict.outcome in (cmh.Outcome.OK, cmh.Outcome.UNSTAMPED), verdict.message
        outcomes["stamped" if verdict.ok else "original"] += 1
        # A later stamp removes what the killed one left behind and succeeds.
        cmh.stamp(work)
        assert cmh.verify(work).ok
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "model.safetensors",
            "original.safetensors",
        ]
    assert outcomes["original"] > 0, outcomes  # some kills landed mid-stamp
