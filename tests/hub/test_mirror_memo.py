"""The mirror's one bounded cache (cmh.hub.mirror._memo.Memo): LRU order, TTL, compute once."""

from __future__ import annotations

import threading

import pytest
from cmh.hub.mirror._memo import Memo
from deadline_support import TEST_DEADLINE


def test_least_recently_used_goes_first() -> None:
    memo: Memo[str, int] = Memo(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # a is now the most recently used
    memo.put("c", 3)
    assert memo.get("b") is None and memo.get("a") == 1 and memo.get("c") == 3
    assert len(memo) == 2
    memo.drop("a")
    assert memo.get("a") is None and len(memo) == 1


def test_entries_expire_ttl_after_they_were_put_on_the_given_clock() -> None:
    now = [100.0]
    memo: Memo[str, str] = Memo(8, ttl=2.0, timer=lambda: now[0])
    loads: list[str] = []

    def load() -> str:
        loads.append("x")
        return f"v{len(loads)}"

    assert memo.get_or_compute("k", load) == "v1"
    now[0] = 101.9
    assert memo.get_or_compute("k", load) == "v1"
    now[0] = 102.0
    assert memo.get_or_compute("k", load) == "v2" and len(loads) == 2


def test_a_zero_ttl_keeps_nothing() -> None:
    memo: Memo[str, int] = Memo(8, ttl=0.0, timer=lambda: 5.0)
    calls = iter(range(10))
    assert memo.get_or_compute("k", lambda: next(calls)) == 0
    assert memo.get_or_compute("k", lambda: next(calls)) == 1


def test_an_exception_keeps_nothing_and_none_is_a_value() -> None:
    memo: Memo[str, int | None] = Memo(8)

    def fail() -> int:
        raise OSError("unreadable")

    with pytest.raises(OSError):
        memo.get_or_compute("k", fail)
    assert len(memo) == 0
    assert memo.get_or_compute("k", lambda: None) is None
    assert memo.get_or_compute("k", fail) is None  # kept: not computed again


def test_exclusive_computes_a_key_once_for_concurrent_callers() -> None:
    memo: Memo[str, int] = Memo(8)
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow() -> int:
        calls.append(1)
        started.set()
        release.wait(10)
        return 7

    results: list[int] = []
    first = threading.Thread(
        target=lambda: results.append(memo.get_or_compute("k", slow, exclusive=True))
    )
    first.start()
    assert started.wait(TEST_DEADLINE)
    second = threading.Thread(
        target=lambda: results.append(memo.get_or_compute("k", slow, exclusive=True))
    )
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert results == [7, 7] and len(calls) == 1
