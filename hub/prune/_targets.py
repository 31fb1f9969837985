"""What ``cmh prune`` prunes: a local cache or store folder, or a bucket store.

Both give the same :class:`~cmh.hub.prune._scan.CacheScan` for the one planner
(:func:`~cmh.hub.prune._plan.plan_prune`) and the same
:class:`~cmh.hub.prune._execute.PruneReport`; :func:`open_target` is the one place
that tells the kinds apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ._execute import PruneReport, execute_plan
from ._plan import PrunePlan
from ._scan import CacheScan, scan_cache

if TYPE_CHECKING:
    from cmh.hub.mirror import BucketStore, Clock


@dataclass(frozen=True)
class ExecuteOptions:
    """How a plan is carried out: ``lock_timeout`` for local repo locks, ``settle``
    (``None``: the default) for bucket leases."""

    lock_timeout: float = 10.0
    settle: float | None = None
    #: Told the bytes freed as each repo is done (the progress bar).
    progress: Callable[[int], None] | None = None


class PruneTarget(Protocol):
    """A cache or store to prune."""

    @property
    def location(self) -> str: ...

    #: True when carrying out a plan waits a settle period (``--settle`` applies).
    settles: bool

    def scan(self, *, read_expiry: bool, read_commit_times: bool) -> CacheScan: ...

    def execute(self, plan: PrunePlan, options: ExecuteOptions) -> PruneReport: ...


@dataclass
class LocalTarget:
    """A Hugging Face cache or a mirror store folder (pruned under the stock locks)."""

    root: Path
    settles = False

    @property
    def location(self) -> str:
        return str(self.root)

    def scan(self, *, read_expiry: bool, read_commit_times: bool) -> CacheScan:
        return scan_cache(self.root, read_expiry=read_expiry, read_commit_times=read_commit_times)

    def execute(self, plan: PrunePlan, options: ExecuteOptions) -> PruneReport:
        return execute_plan(plan, lock_timeout=options.lock_timeout, progress=options.progress)


@dataclass
class BucketTarget:
    """A bucket store (pruned under per-repo leases, one settle per run)."""

    store: BucketStore
    clock: Clock | None = None
    settles = True

    @property
    def location(self) -> str:
        return self.store.url

    def scan(self, *, read_expiry: bool, read_commit_times: bool) -> CacheScan:
        from ._bucket import scan_bucket

        return scan_bucket(self.store, read_expiry=read_expiry)

    def execute(self, plan: PrunePlan, options: ExecuteOptions) -> PruneReport:
        from cmh.hub.mirror import SYSTEM_CLOCK

        from ._bucket import execute_bucket_plan

        return execute_bucket_plan(self.store, plan, settle=options.settle,
                                   clock=self.clock or SYSTEM_CLOCK,
                                   progress=options.progress)  # fmt: skip


def open_target(
    location: Path | str, *, on_notice: Callable[[str], None] | None = None
) -> PruneTarget:
    """The target ``--cache-dir``/``--store`` names: a folder, or ``s3://...`` (opened
    with the standard AWS settings; ``on_notice`` hears about leases)."""
    if isinstance(location, Path):
        if not location.is_dir():
            raise NotADirectoryError(20, "No such directory", str(location))
        return LocalTarget(location)
    from cmh.hub.mirror import open_bucket

    return BucketTarget(open_bucket(location, on_notice=on_notice))
