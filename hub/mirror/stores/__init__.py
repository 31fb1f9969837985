"""One interface over the mirror's store kinds: a local folder, a bucket, and memory.

Every caller (the HTTP app, the web pages' data, scrub, metrics, the CLI) reads
and writes a store through :class:`MirrorStore` (or the one role of it it needs:
:class:`StoreReader`, :class:`StoreWriter`, :class:`StoreDelivery`,
:class:`StorePullThrough`, :class:`StoreHousekeeping`); only :func:`open_store` looks
at what ``--store`` names. The few names of a kind that its tools use (a bucket's
layout and errors, a folder's import and scrub, nginx's server block) are exported
here, lazily, so no module outside ``stores/`` imports a kind's module.

How a blob's bytes reach a client differs between the kinds and modes
(:attr:`MirrorStore.deliveries`), behind one :class:`BlobDelivery` that
:meth:`MirrorStore.delivery` gives for every mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports
from .._errors import StoreError, StoreMissing, StoreUnavailable
from ._base import (
    Document,
    MirrorStore,
    ScrubView,
    StoreDelivery,
    StoreHousekeeping,
    StorePullThrough,
    StoreReader,
    StoreWriter,
)
from ._delivery import DELIVERIES, BlobDelivery, BlobMismatch, BlobMissing, Sent
from ._open import open_store, parse_location
from ._pull import BodyHash, FillFailed, FillReader, PullThrough, SentRanges
from ._sync import UNCHANGED, UPDATED, SyncRequest, SyncResult, default_sync_cache

if TYPE_CHECKING:
    from .bucket._bucket import (
        SYSTEM_CLOCK,
        BucketError,
        BucketStore,
        Clock,
        ConditionalWritesUnsupported,
        TreeObject,
        open_bucket,
    )
    from .bucket._objectstore import (
        InvalidLocation,
        InvalidObjectName,
        InvalidRange,
        NoSuchBucket,
        ObjectNotFound,
        ObjectStore,
        ObjectStoreError,
        PreconditionFailed,
        S3Location,
        SettingsError,
    )
    from .bucket._records import FLEET_KEY_ENV, FleetKey, FleetKeyError, read_fleet_key
    from .bucket._xaccel import nginx_bucket_server
    from .local._folder import InvalidNameError, RepoSummary, add_folder, list_store, scan_folder
    from .local._scrub import ScrubReport, scrub_store
    from .local._xaccel import nginx_server

#: What the kinds export for their tools, imported on first use (PEP 562).
_KIND_EXPORTS = {
    **dict.fromkeys(
        ("SYSTEM_CLOCK", "BucketError", "BucketStore", "Clock", "ConditionalWritesUnsupported",
         "TreeObject", "open_bucket"),
        "bucket._bucket",
    ),
    **dict.fromkeys(
        ("FLEET_KEY_ENV", "FleetKey", "FleetKeyError", "read_fleet_key"), "bucket._records"
    ),
    **dict.fromkeys(
        ("InvalidLocation", "InvalidObjectName", "InvalidRange", "NoSuchBucket", "ObjectNotFound",
         "ObjectStore", "ObjectStoreError", "PreconditionFailed", "S3Location", "SettingsError"),
        "bucket._objectstore",
    ),
    **dict.fromkeys(
        ("InvalidNameError", "RepoSummary", "add_folder", "list_store", "scan_folder"),
        "local._folder",
    ),
    **dict.fromkeys(("ScrubReport", "scrub_store"), "local._scrub"),
    "nginx_server": "local._xaccel",
    "nginx_bucket_server": "bucket._xaccel",
}  # fmt: skip

__all__ = [
    "DELIVERIES",
    "FLEET_KEY_ENV",
    "SYSTEM_CLOCK",
    "UNCHANGED",
    "UPDATED",
    "BlobDelivery",
    "BlobMismatch",
    "BlobMissing",
    "BodyHash",
    "BucketError",
    "BucketStore",
    "Clock",
    "ConditionalWritesUnsupported",
    "Document",
    "FillFailed",
    "FillReader",
    "FleetKey",
    "FleetKeyError",
    "InvalidLocation",
    "InvalidNameError",
    "InvalidObjectName",
    "InvalidRange",
    "MirrorStore",
    "NoSuchBucket",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "PreconditionFailed",
    "PullThrough",
    "RepoSummary",
    "S3Location",
    "ScrubReport",
    "ScrubView",
    "Sent",
    "SentRanges",
    "SettingsError",
    "StoreDelivery",
    "StoreError",
    "StoreHousekeeping",
    "StoreMissing",
    "StorePullThrough",
    "StoreReader",
    "StoreUnavailable",
    "StoreWriter",
    "SyncRequest",
    "SyncResult",
    "TreeObject",
    "add_folder",
    "default_sync_cache",
    "list_store",
    "nginx_bucket_server",
    "nginx_server",
    "open_bucket",
    "open_store",
    "parse_location",
    "read_fleet_key",
    "scan_folder",
    "scrub_store",
]

__getattr__, __dir__ = lazy_exports(__name__, _KIND_EXPORTS, globals())
