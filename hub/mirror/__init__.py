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
    from .stores import MirrorStore, StoreMissing, StoreUnavailable, open_store, parse_location
    from .stores.bucket._bucket import (
        SYSTEM_CLOCK,
        BucketError,
        BucketStore,
        Clock,
        ConditionalWritesUnsupported,
        TreeObject,
        open_bucket,
    )
    from .stores.bucket._objectstore import (
        InvalidLocation,
        ObjectNotFound,
        ObjectStoreError,
        S3Location,
    )
    from .stores.bucket._xaccel import nginx_bucket_server
    from .stores.local._folder import (
        InvalidNameError,
        RepoSummary,
        add_folder,
        list_store,
        scan_folder,
    )
    from .stores.local._scrub import ScrubReport, scrub_store
    from .stores.local._xaccel import nginx_server

_EXPORTS = {
    "AccessPolicy": "_auth",
    "TokensFileError": "_auth",
    "load_tokens": "_auth",
    "repo_key": "_auth",
    "unserved_grants": "_auth",
    "BucketError": "stores.bucket._bucket",
    "BucketStore": "stores.bucket._bucket",
    "ConditionalWritesUnsupported": "stores.bucket._bucket",
    "open_bucket": "stores.bucket._bucket",
    "Clock": "stores.bucket._bucket",
    "SYSTEM_CLOCK": "stores.bucket._bucket",
    "TreeObject": "stores.bucket._bucket",
    "build_index": "_index",
    "ObjectNotFound": "stores.bucket._objectstore",
    "ObjectStoreError": "stores.bucket._objectstore",
    "nginx_server": "stores.local._xaccel",
    "nginx_bucket_server": "stores.bucket._xaccel",
    "InvalidLocation": "stores.bucket._objectstore",
    "S3Location": "stores.bucket._objectstore",
    "MirrorStore": "stores",
    "StoreMissing": "stores",
    "StoreUnavailable": "stores",
    "open_store": "stores",
    "parse_location": "stores",
    "UpstreamConfig": "_upstream",
    "needs_upstream_token": "_upstream",
    "record_upstream_access": "_upstream",
    "InvalidNameError": "stores.local._folder",
    "RepoSummary": "stores.local._folder",
    "StoreError": "_errors",
    "add_folder": "stores.local._folder",
    "list_store": "stores.local._folder",
    "scan_folder": "stores.local._folder",
    "ScrubReport": "stores.local._scrub",
    "scrub_store": "stores.local._scrub",
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
    "needs_upstream_token",
    "nginx_bucket_server",
    "nginx_server",
    "open_bucket",
    "open_store",
    "parse_location",
    "record_upstream_access",
    "repo_key",
    "scan_folder",
    "scrub_store",
    "serve",
    "unserved_grants",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
