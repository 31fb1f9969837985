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
    from ._bucket import (
        SYSTEM_CLOCK,
        BucketError,
        BucketStore,
        Clock,
        ConditionalWritesUnsupported,
        TreeObject,
        open_bucket,
    )
    from ._index import build_index
    from ._objectstore import InvalidLocation, ObjectNotFound, ObjectStoreError, S3Location
    from ._run import ServeConfig, ServeError, serve
    from ._scrub import ScrubReport, scrub_store
    from ._store import (
        InvalidNameError,
        RepoSummary,
        StoreError,
        add_folder,
        list_store,
        scan_folder,
    )
    from ._upstream import UpstreamConfig
    from ._xaccel import nginx_server
    from .stores import MirrorStore, StoreMissing, StoreUnavailable, open_store, parse_location

_EXPORTS = {
    "AccessPolicy": "_auth",
    "TokensFileError": "_auth",
    "load_tokens": "_auth",
    "repo_key": "_auth",
    "unserved_grants": "_auth",
    "BucketError": "_bucket",
    "BucketStore": "_bucket",
    "ConditionalWritesUnsupported": "_bucket",
    "open_bucket": "_bucket",
    "Clock": "_bucket",
    "SYSTEM_CLOCK": "_bucket",
    "TreeObject": "_bucket",
    "build_index": "_index",
    "ObjectNotFound": "_objectstore",
    "ObjectStoreError": "_objectstore",
    "nginx_server": "_xaccel",
    "InvalidLocation": "_objectstore",
    "S3Location": "_objectstore",
    "MirrorStore": "stores",
    "StoreMissing": "stores",
    "StoreUnavailable": "stores",
    "open_store": "stores",
    "parse_location": "stores",
    "UpstreamConfig": "_upstream",
    "InvalidNameError": "_store",
    "RepoSummary": "_store",
    "StoreError": "_store",
    "add_folder": "_store",
    "list_store": "_store",
    "scan_folder": "_store",
    "ScrubReport": "_scrub",
    "scrub_store": "_scrub",
    "ServeConfig": "_run",
    "ServeError": "_run",
    "serve": "_run",
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
