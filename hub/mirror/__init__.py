"""The mirror: a store in the stock cache layout, its import and scrub, and ``cmh serve``.

Exported lazily: the store side (import, listing, scrub) is plain file work,
the server side pulls in aiohttp and prometheus_client only when it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
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

_EXPORTS = {
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
    "InvalidNameError",
    "RepoSummary",
    "ScrubReport",
    "ServeConfig",
    "ServeError",
    "StoreError",
    "add_folder",
    "list_store",
    "scan_folder",
    "scrub_store",
    "serve",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
