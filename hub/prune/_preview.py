"""The operator page's dry runs of ``cmh prune`` on the store ``cmh serve`` serves.

``cmh serve`` passes a :class:`StorePreview` to the web pages
(:class:`~cmh.hub.mirror.web.WebOptions`), so the mirror imports nothing of prune:
prune knows the mirror (its stores' layouts), never the other way round.
"""

from __future__ import annotations

import threading
from pathlib import Path

from cmh.hub.cache import Clock
from cmh.hub.mirror.web import PrunePreview

from ._plan import PrunePolicy, plan_prune
from ._scan import NotACacheError
from ._targets import PruneTarget, open_target


class StorePreview:
    """What ``cmh prune --store LOCATION`` would free, at a time: with no option, with
    ``--expired``, and with ``--expired --include-referenced``.

    The store is opened on first use, in the process that asks (a server's worker, after
    it forked), then kept; a storage that fails is :class:`StoreUnavailable`."""

    def __init__(self, location: Path | str, clock: Clock | None = None) -> None:
        self.location = location
        self._clock = clock
        self._target: PruneTarget | None = None
        self._lock = threading.Lock()

    def __call__(self, now: float) -> PrunePreview:
        from cmh.hub.mirror import BucketError, ObjectStoreError, StoreUnavailable

        try:
            scan = self._open().scan_all()
        except (ObjectStoreError, BucketError, NotACacheError) as exc:
            raise StoreUnavailable(str(exc)) from None
        default, expired = PrunePolicy(), PrunePolicy(expired=True)
        referenced = PrunePolicy(expired=True, include_referenced=True)
        return PrunePreview(
            scan,
            plan_prune(scan, default, now),
            plan_prune(scan, expired, now),
            plan_prune(scan, referenced, now),
        )

    def _open(self) -> PruneTarget:
        with self._lock:
            if self._target is None:
                self._target = open_target(self.location, store=True, clock=self._clock)
            return self._target
