"""The cache's lock waits are measured and slept on the caller's clock (issue 34)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cmh.hub.cache import LockBusy, flock
from mirror_support import ManualClock


def test_lock_wait_is_measured_and_slept_on_the_callers_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    path = tmp_path / "locks" / "x.lock"
    walls: list[float] = []
    monkeypatch.setattr(time, "sleep", walls.append)  # a sleep on the wall's clock is seen
    held = flock(path)  # held: a second open file of it waits
    waiting = flock(path, timeout=30.0, clock=clock)
    with held, pytest.raises(LockBusy), waiting:
        pass
    assert 30.0 <= clock.slept < 31.0  # the whole wait, slept on the given clock
    assert walls == []  # and none of it on the wall's
