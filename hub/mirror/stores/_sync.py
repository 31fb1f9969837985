"""What ``cmh mirror sync`` did to a store, and where a bucket store's sync keeps its cache."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: What a sync did to the store: it held the commit at the revision already (nothing
#: written), or it was written (a new commit, a moved ref, new or repaired files).
UNCHANGED = "unchanged"
UPDATED = "updated"


@dataclass(frozen=True)
class SyncRequest:
    """One repo to sync: ``fetch(cache)`` resolves ``repo_id`` at ``revision`` into the
    local Hugging Face cache folder ``cache``; ``cache_dir`` is where a bucket store keeps
    that cache (None: :func:`default_sync_cache`; a folder store is its own)."""

    fetch: Callable[[Path], Any]
    repo_id: str
    revision: str
    repo_type: str
    cache_dir: Path | None = None


@dataclass(frozen=True)
class SyncResult:
    """One repo synced: the resolver's :class:`~cmh.hub.Resolution` (its requests and
    bytes are what the Hub was asked) and what the store was given.

    ``new_blobs`` / ``new_bytes``: blobs uploaded by an import into a bucket (``None``
    for a folder store, which the resolver fills in place). ``cache_dir``: the local
    cache the repo was resolved into (the store's folder itself, or a bucket's cache).
    """

    resolution: Any
    store: str
    cache_dir: Path
    new_blobs: int | None = None
    new_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        """``Resolution.to_json()`` with ``"store"``: what the store was given."""
        return {
            **self.resolution.to_json(),
            "store": {
                "state": self.store,
                "new_blobs": self.new_blobs,
                "new_bytes": self.new_bytes,
                "cache_dir": str(self.cache_dir),
            },
        }


def default_sync_cache(location: str) -> Path:
    """The cache a sync into the bucket ``location`` keeps between runs:
    ``$XDG_CACHE_HOME/cmh/sync/{digest}`` (``~/.cache`` when unset), one per bucket URL."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(location.encode("utf-8")).hexdigest()[:16]
    return Path(base) / "cmh" / "sync" / digest
