"""The mirror: a store in the stock cache layout, its import and scrub, and ``cmh serve``.

The modules are private (``_name.py``); these names are the surface, exported
lazily: the store side (import, listing, scrub) is plain file work, the server
side pulls in aiohttp and prometheus_client only when it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .auth import AccessPolicy, TokensFileError, load_tokens, repo_key, unserved_grants
    from .bucket import (
        SYSTEM_CLOCK,
        BucketError,
        BucketStore,
        Clock,
        ConditionalWritesUnsupported,
        TreeObject,
        open_bucket,
    )
    from .index import build_index
    from .objectstore import InvalidLocation, ObjectNotFound, ObjectStoreError, S3Location
    from .run import ServeConfig, ServeError, serve
    from .scrub import ScrubReport, scrub_store
    from .store import (
        InvalidNameError,
        RepoSummary,
        StoreError,
        add_folder,
        list_store,
        scan_folder,
    )
    from .stores import MirrorStore, StoreMissing, StoreUnavailable, open_store, parse_location
    from .upstream import UpstreamConfig
    from .xaccel import nginx_server

_EXPORTS = {
    "AccessPolicy": "auth",
    "TokensFileError": "auth",
    "load_tokens": "auth",
    "repo_key": "auth",
    "unserved_grants": "auth",
    "BucketError": "bucket",
    "BucketStore": "bucket",
    "ConditionalWritesUnsupported": "bucket",
    "open_bucket": "bucket",
    "Clock": "bucket",
    "SYSTEM_CLOCK": "bucket",
    "TreeObject": "bucket",
    "build_index": "index",
    "ObjectNotFound": "objectstore",
    "ObjectStoreError": "objectstore",
    "nginx_server": "xaccel",
    "InvalidLocation": "objectstore",
    "S3Location": "objectstore",
    "MirrorStore": "stores",
    "StoreMissing": "stores",
    "StoreUnavailable": "stores",
    "open_store": "stores",
    "parse_location": "stores",
    "UpstreamConfig": "upstream",
    "InvalidNameError": "store",
    "RepoSummary": "store",
    "StoreError": "store",
    "add_folder": "store",
    "list_store": "store",
    "scan_folder": "store",
    "ScrubReport": "scrub",
    "scrub_store": "scrub",
    "ServeConfig": "run",
    "ServeError": "run",
    "serve": "run",
}
__all__ = [
    "SYSTEM_CLOCK",
    "AccessPolicy",
    "BucketError",
    "BucketStore",
    "Clock",
    "ConditionalWritesUnsupported",
    "InvalidLocation",
    "InvalidNameError",
    "MirrorStore",
    "ObjectNotFound",
    "ObjectStoreError",
    "RepoSummary",
    "S3Location",
    "ScrubReport",
    "ServeConfig",
    "ServeError",
    "StoreError",
    "StoreMissing",
    "StoreUnavailable",
    "TokensFileError",
    "TreeObject",
    "UpstreamConfig",
    "add_folder",
    "build_index",
    "list_store",
    "load_tokens",
    "nginx_server",
    "open_bucket",
    "open_store",
    "parse_location",
    "repo_key",
    "scan_folder",
    "scrub_store",
    "serve",
    "unserved_grants",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
