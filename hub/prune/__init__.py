"""Pruning caches and stores: scan (read-only), plan (pure), execute (under the stock locks).

The modules are private (``_name.py``); these names are the surface. A bucket's
prune (:func:`prune_bucket`, and the targets that open a folder or a bucket) is
exported lazily: it reaches the mirror's bucket code and the object-storage client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .execute import PruneReport, RepoOutcome, execute_plan
from .plan import ItemRemoval, PrunePlan, PrunePolicy, RepoPlan, RevisionRemoval, plan_prune
from .scan import CacheScan, RepoScan, scan_cache

if TYPE_CHECKING:
    from .bucket import execute_bucket_plan, prune_bucket, scan_bucket
    from .targets import ExecuteOptions, PruneTarget, open_target

_EXPORTS = {
    "ExecuteOptions": "targets",
    "PruneTarget": "targets",
    "execute_bucket_plan": "bucket",
    "open_target": "targets",
    "prune_bucket": "bucket",
    "scan_bucket": "bucket",
}

__all__ = [
    "CacheScan",
    "ExecuteOptions",
    "ItemRemoval",
    "PrunePlan",
    "PrunePolicy",
    "PruneReport",
    "PruneTarget",
    "RepoOutcome",
    "RepoPlan",
    "RepoScan",
    "RevisionRemoval",
    "execute_bucket_plan",
    "execute_plan",
    "open_target",
    "plan_prune",
    "prune_bucket",
    "scan_bucket",
    "scan_cache",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
