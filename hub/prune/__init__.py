"""Pruning caches and stores: scan (read-only), plan (pure), execute (under the stock locks).

The modules are private (``_name.py``); these names are the surface. A bucket's
prune (:func:`prune_bucket`, and the targets that open a folder or a bucket) is
exported lazily: it reaches the mirror's bucket code and the object-storage client. So is
the operator page's dry run (:class:`StorePreview`), which ``cmh serve`` passes to the
mirror's pages: prune imports the mirror, never the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._execute import PruneReport, RepoOutcome, execute_plan
from ._plan import (
    ITEM_REASONS,
    REVISION_REASONS,
    ItemRemoval,
    PrunePlan,
    PrunePolicy,
    RepoPlan,
    RevisionRemoval,
    plan_prune,
)
from ._scan import CacheScan, NotACacheError, RepoScan, scan_cache

if TYPE_CHECKING:
    from ._bucket import execute_bucket_plan, prune_bucket, scan_bucket
    from ._preview import StorePreview
    from ._targets import ExecuteOptions, PruneTarget, open_target

_EXPORTS = {
    "ExecuteOptions": "_targets",
    "PruneTarget": "_targets",
    "StorePreview": "_preview",
    "execute_bucket_plan": "_bucket",
    "open_target": "_targets",
    "prune_bucket": "_bucket",
    "scan_bucket": "_bucket",
}

__all__ = [
    "ITEM_REASONS",
    "REVISION_REASONS",
    "CacheScan",
    "ExecuteOptions",
    "ItemRemoval",
    "NotACacheError",
    "PrunePlan",
    "PrunePolicy",
    "PruneReport",
    "PruneTarget",
    "RepoOutcome",
    "RepoPlan",
    "RepoScan",
    "RevisionRemoval",
    "StorePreview",
    "execute_bucket_plan",
    "execute_plan",
    "open_target",
    "plan_prune",
    "prune_bucket",
    "scan_bucket",
    "scan_cache",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
