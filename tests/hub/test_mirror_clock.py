"""A cut recorded at a time in the reader's future counts as recent (issue 34): a writer's
clock running ahead never hides a cut, so a resume is answered whole."""

from __future__ import annotations

from pathlib import Path

from cmh.hub.cache import CUT_MEMORY
from cmh.hub.mirror._cuts import CutLedger
from mirror_support import ManualClock


def test_cut_recorded_in_the_readers_future_counts_as_recent(tmp_path: Path) -> None:
    behind = ManualClock()
    ahead = ManualClock(behind.now + 60)  # the writer's clock runs a minute ahead
    repo = tmp_path / "models--org--toy"
    CutLedger(ahead).record(repo, "e" * 64)
    reader = CutLedger(behind)
    assert reader.recent(repo, "e" * 64)  # not "never cut": a resume is answered whole
    behind.advance(60 + CUT_MEMORY - 1)
    assert reader.recent(repo, "e" * 64)
    behind.advance(2)
    assert not reader.recent(repo, "e" * 64)
