"""Pruning caches and stores: scan (read-only), plan (pure), execute (under the stock locks)."""

from __future__ import annotations

from .execute import PruneReport, RepoOutcome, execute_plan
from .plan import ItemRemoval, PrunePlan, PrunePolicy, RepoPlan, RevisionRemoval, plan_prune
from .scan import CacheScan, RepoScan, scan_cache

__all__ = [
    "CacheScan",
    "ItemRemoval",
    "PrunePlan",
    "PrunePolicy",
    "PruneReport",
    "RepoOutcome",
    "RepoPlan",
    "RepoScan",
    "RevisionRemoval",
    "execute_plan",
    "plan_prune",
    "scan_cache",
]
