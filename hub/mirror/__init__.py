"""The mirror: a store in the stock cache layout, its import and scrub, and ``cmh serve``.

The modules are private (``_name.py``); these names are the surface, exported
lazily: the store side (import, listing, scrub) is plain file work, the server
side pulls in aiohttp and prometheus_client only when it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._auth import AccessPolicy, TokensFileError, load_tokens, repo_key, unserved_grants
    from ._errors import StoreError
    from ._index import build_index
    from ._run import ServeConfig, ServeError, serve
    from ._upstream import UpstreamConfig, needs_upstream_token, record_upstream_access
    from .stores import (
        FLEET_KEY_ENV,
        SYSTEM_CLOCK,
        BucketError,
        BucketStore,
        Clock,
        ConditionalWritesUnsupported,
        FleetKey,
        FleetKeyError,
        InvalidLocation,
        InvalidNameError,
        MirrorStore,
        ObjectNotFound,
        ObjectStoreError,
        RepoSummary,
        S3Location,
        ScrubReport,
        StoreMissing,
        StoreUnavailable,
        TreeObject,
        add_folder,
        list_store,
        nginx_bucket_server,
        nginx_server,
        open_bucket,
        open_store,
        parse_location,
        read_fleet_key,
        scan_folder,
        scrub_store,
    )

_EXPORTS = {
    "AccessPolicy": "_auth",
    "TokensFileError": "_auth",
    "load_tokens": "_auth",
    "repo_key": "_auth",
    "unserved_grants": "_auth",
    "BucketError": "stores",
    "BucketStore": "stores",
    "ConditionalWritesUnsupported": "stores",
    "open_bucket": "stores",
    "Clock": "stores",
    "SYSTEM_CLOCK": "stores",
    "TreeObject": "stores",
    "build_index": "_index",
    "ObjectNotFound": "stores",
    "ObjectStoreError": "stores",
    "nginx_server": "stores",
    "InvalidLocation": "stores",
    "S3Location": "stores",
    "FLEET_KEY_ENV": "stores",
    "FleetKey": "stores",
    "FleetKeyError": "stores",
    "read_fleet_key": "stores",
    "nginx_bucket_server": "stores",
    "MirrorStore": "stores",
    "StoreMissing": "stores",
    "StoreUnavailable": "stores",
    "open_store": "stores",
    "parse_location": "stores",
    "UpstreamConfig": "_upstream",
    "needs_upstream_token": "_upstream",
    "record_upstream_access": "_upstream",
    "InvalidNameError": "stores",
    "RepoSummary": "stores",
    "StoreError": "_errors",
    "add_folder": "stores",
    "list_store": "stores",
    "scan_folder": "stores",
    "ScrubReport": "stores",
    "scrub_store": "stores",
    "ServeConfig": "_run",
    "ServeError": "_run",
    "serve": "_run",
}
__all__ = [
    "FLEET_KEY_ENV",
    "SYSTEM_CLOCK",
    "AccessPolicy",
    "BucketError",
    "BucketStore",
    "Clock",
    "ConditionalWritesUnsupported",
    "FleetKey",
    "FleetKeyError",
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
    "needs_upstream_token",
    "nginx_bucket_server",
    "nginx_server",
    "open_bucket",
    "open_store",
    "parse_location",
    "read_fleet_key",
    "record_upstream_access",
    "repo_key",
    "scan_folder",
    "scrub_store",
    "serve",
    "unserved_grants",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
