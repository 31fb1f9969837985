"""The mirror's browser pages: repo list, repo and file pages, login, the operator page.

Served by ``cmh serve`` at ``/`` and under ``/-/`` next to the Hub API (see
:mod:`~cmh.hub.mirror.web.pages`). Imported only by the server (it pulls in
aiohttp, Jinja2 and, when a card is shown, markdown-it-py and PyYAML).
"""

from __future__ import annotations

from pathlib import Path

from .pages import WebOptions, add_routes
from .session import AdminTokensError, load_admin_tokens


def web_options(
    admin_tokens: Path | None, keys: tuple[Path, ...] = (), access_log: Path | None = None
) -> WebOptions:
    """The pages' options from ``cmh serve``'s files (raises on a bad file)."""
    from cmh.signing import TrustedKeys

    from .views import StampCache

    trusted = TrustedKeys.load(keys) if keys else None
    return WebOptions(
        admin_tokens=load_admin_tokens(admin_tokens) if admin_tokens else frozenset(),
        trusted_keys=trusted,
        access_log=access_log,
        stamps=StampCache(trusted),
    )


__all__ = ["AdminTokensError", "WebOptions", "add_routes", "load_admin_tokens", "web_options"]
