"""What ``cmh prune`` prunes: a local cache or store folder, or a bucket store.

Both give the same :class:`~cmh.hub.prune._scan.CacheScan` for the one planner
(:func:`~cmh.hub.prune._plan.plan_prune`) and the same
:class:`~cmh.hub.prune._execute.PruneReport`; :func:`open_target` is the one place
that tells the kinds apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cmh.hub.cache import Clock, process_clock

from ._execute import PruneReport, execute_plan
from ._plan import PrunePlan, PrunePolicy
from ._scan import CacheScan, scan_cache

if TYPE_CHECKING:
    from cmh.hub.mirror import BucketStore

#: What a notice (a wait about to start) is told to.
Notice = Callable[[str], None]


@dataclass(frozen=True)
class ExecuteOptions:
    """How a plan is carried out: ``lock_timeout`` for a folder's repo locks, ``settle``
    (``None``: the kind's default) the one wait per run before deleting, on both kinds:
    writes in flight when the plan was made show in the executor's second scan."""

    lock_timeout: float = 10.0
    settle: float | None = None
    #: Told the bytes freed as each repo is done (the progress bar).
    progress: Callable[[int], None] | None = None


class PruneTarget(Protocol):
    """A cache or store to prune."""

    @property
    def location(self) -> str: ...

    #: The clock the plan's time and every wait are taken on.
    clock: Clock

    def scan(self, policy: PrunePolicy) -> CacheScan:
        """The read-only scan ``policy`` is planned from."""
        ...

    def scan_all(self) -> CacheScan:
        """The scan with everything read (expiries, commit times): the operator page's
        dry runs (:class:`~cmh.hub.prune._preview.StorePreview`)."""
        ...

    def execute(self, plan: PrunePlan, options: ExecuteOptions) -> PruneReport: ...


@dataclass
class LocalTarget:
    """A Hugging Face cache or a mirror store folder (pruned under the stock locks).

    A store's refs name what it serves (``served``); a cache's do not."""

    root: Path
    served: bool = False
    clock: Clock = field(default_factory=process_clock)
    on_notice: Notice | None = None

    @property
    def location(self) -> str:
        return str(self.root)

    def scan(self, policy: PrunePolicy) -> CacheScan:
        return scan_cache(self.root, read_expiry=policy.expired, read_commit_times=policy.ranks,
                          served=self.served, clock=self.clock)  # fmt: skip

    def scan_all(self) -> CacheScan:
        return scan_cache(self.root, read_expiry=True, read_commit_times=True,
                          served=self.served, clock=self.clock)  # fmt: skip

    def execute(self, plan: PrunePlan, options: ExecuteOptions) -> PruneReport:
        """Wait ``settle`` (default 0: a folder's writers hold the repo lock, so what
        they wrote shows at once), then delete under the locks."""
        settle = options.settle or 0.0
        if settle > 0 and not plan.empty:
            if self.on_notice is not None:
                self.on_notice(f"{self.root}: waiting {settle:.0f} s (--settle, once for the "
                               "run) for writes in flight before deleting")  # fmt: skip
            self.clock.sleep(settle)
        return execute_plan(plan, lock_timeout=options.lock_timeout, progress=options.progress)


@dataclass
class BucketTarget:
    """A bucket store (pruned under per-repo leases, one settle per run)."""

    store: BucketStore
    clock: Clock = field(default_factory=process_clock)

    @property
    def location(self) -> str:
        return self.store.url

    def scan(self, policy: PrunePolicy) -> CacheScan:
        from ._bucket import scan_bucket

        return scan_bucket(self.store, read_expiry=policy.expired)

    def scan_all(self) -> CacheScan:
        from ._bucket import scan_bucket

        return scan_bucket(self.store, read_expiry=True)

    def execute(self, plan: PrunePlan, options: ExecuteOptions) -> PruneReport:
        from ._bucket import execute_bucket_plan

        return execute_bucket_plan(self.store, plan, settle=options.settle, clock=self.clock,
                                   progress=options.progress)  # fmt: skip


def open_target(
    location: Path | str,
    *,
    store: bool = False,
    on_notice: Notice | None = None,
    clock: Clock | None = None,
) -> PruneTarget:
    """The target ``--cache-dir``/``--store`` names: a folder (a mirror store when
    ``store``), or ``s3://...`` (opened with the standard AWS settings); ``on_notice``
    hears about waits and leases; ``clock`` (default: this process's) times them."""
    clock = clock or process_clock()
    if isinstance(location, Path):
        if not location.is_dir():
            raise NotADirectoryError(20, "No such directory", str(location))
        return LocalTarget(location, store, clock, on_notice)
    from cmh.hub.mirror import open_bucket

    return BucketTarget(open_bucket(location, on_notice=on_notice), clock)
