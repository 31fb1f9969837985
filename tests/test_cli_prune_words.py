"""``cmh prune`` says every reason a plan can give in words (the names stay in --json)."""

from __future__ import annotations

from cmh.cli import _prune_report as report
from cmh.hub.prune import ITEM_REASONS, REVISION_REASONS


def test_every_reason_a_plan_gives_has_words() -> None:
    assert set(report.REASON_WORDS) == set(REVISION_REASONS)
    assert set(report.ITEM_WORDS) == set(ITEM_REASONS)
    words = [*report.REASON_WORDS.values(), *report.ITEM_WORDS.values()]
    assert all(w and w not in REVISION_REASONS + ITEM_REASONS for w in words)


def test_counts_take_the_right_number() -> None:
    assert [report.counted(n, "revision") for n in (0, 1, 2)] == [
        "0 revisions",
        "1 revision",
        "2 revisions",
    ]
