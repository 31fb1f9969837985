"""One interface over the mirror's two store kinds: a local folder and a bucket.

Every caller (the HTTP app, the web pages' data, scrub, metrics, the CLI) reads
and writes a store through :class:`MirrorStore`; only :func:`open_store` looks at
what ``--store`` names. What differs between the kinds and is not hidden (how a
blob's bytes reach a client) is a capability the store reports
(:attr:`MirrorStore.deliveries`, :meth:`MirrorStore.remote_sender`).
"""

from __future__ import annotations

from .._errors import StoreError, StoreMissing, StoreUnavailable
from ._base import MirrorStore, ScrubView
from ._open import open_store, parse_location
from ._pull import FillFailed, FillReader, PullThrough, SentRanges
from ._sync import UNCHANGED, UPDATED, SyncRequest, SyncResult, default_sync_cache

__all__ = [
    "UNCHANGED",
    "UPDATED",
    "FillFailed",
    "FillReader",
    "MirrorStore",
    "PullThrough",
    "ScrubView",
    "SentRanges",
    "StoreError",
    "StoreMissing",
    "StoreUnavailable",
    "SyncRequest",
    "SyncResult",
    "default_sync_cache",
    "open_store",
    "parse_location",
]
