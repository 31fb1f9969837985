"""The mirror's browser pages: repo list, repo and file pages, login, the operator page.

Served by ``cmh serve`` at ``/`` and under ``/-/`` next to the Hub API (see
:mod:`~cmh.hub.mirror.web._pages`). Exported lazily: ``pages`` pulls in aiohttp
and Jinja2, while ``options`` (read by ``cmh serve`` before the workers start,
and before prometheus_client may be imported) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

if TYPE_CHECKING:
    from ._options import WebOptions, web_options
    from ._pages import add_routes
    from ._session import AdminTokensError, load_admin_tokens
    from ._views import PrunePreview, PrunePreviewer, StampCache, StampState, stamp_state

_EXPORTS = {
    "AdminTokensError": "_session",
    "PrunePreview": "_views",
    "PrunePreviewer": "_views",
    "StampCache": "_views",
    "StampState": "_views",
    "stamp_state": "_views",
    "WebOptions": "_options",
    "add_routes": "_pages",
    "load_admin_tokens": "_session",
    "web_options": "_options",
}
__all__ = [
    "AdminTokensError",
    "PrunePreview",
    "PrunePreviewer",
    "StampCache",
    "StampState",
    "WebOptions",
    "add_routes",
    "load_admin_tokens",
    "stamp_state",
    "web_options",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
