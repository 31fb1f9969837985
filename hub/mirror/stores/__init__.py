"""One interface over the mirror's two store kinds: a local folder and a bucket.

Every caller (the HTTP app, the web pages' data, scrub, metrics, the CLI) reads
and writes a store through :class:`MirrorStore`; only :func:`open_store` looks at
what ``--store`` names. How a blob's bytes reach a client differs between the kinds
and modes (:attr:`MirrorStore.deliveries`), behind one :class:`BlobDelivery` that
:meth:`MirrorStore.delivery` gives for every mode.
"""

from __future__ import annotations

from .._errors import StoreError, StoreMissing, StoreUnavailable
from ._base import MirrorStore, ScrubView
from ._delivery import DELIVERIES, BlobDelivery, BlobMismatch, BlobMissing, Sent
from ._open import open_store, parse_location
from ._pull import FillFailed, FillReader, PullThrough, SentRanges
from ._sync import UNCHANGED, UPDATED, SyncRequest, SyncResult, default_sync_cache

__all__ = [
    "DELIVERIES",
    "UNCHANGED",
    "UPDATED",
    "BlobDelivery",
    "BlobMismatch",
    "BlobMissing",
    "FillFailed",
    "FillReader",
    "MirrorStore",
    "PullThrough",
    "ScrubView",
    "Sent",
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
