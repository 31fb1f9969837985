"""What the pages need beyond the API's state, read from ``cmh serve``'s files.

Light on purpose (no aiohttp, no prometheus_client): ``cmh serve`` reads these
files in the parent process, before it sets up the workers' shared metrics,
so that a bad file stops it before it listens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._card_worker import CardRenderer
from ._session import load_admin_tokens
from ._views import PrunePreviewer, StampCache


@dataclass(frozen=True)
class WebOptions:
    """Admin tokens, trusted keys, the access log (busiest repos), the stamp cache, the
    operator page's dry runs of prune (``None``: that page answers 503) and the card
    renderer (its child processes start on first use, in each worker)."""

    admin_tokens: frozenset[str] = frozenset()
    trusted_keys: Any = None  # cmh.TrustedKeys or None
    access_log: Path | None = None
    stamps: StampCache = field(default_factory=StampCache)
    prune_preview: PrunePreviewer | None = None
    cards: CardRenderer = field(default_factory=CardRenderer)


def web_options(
    admin_tokens: Path | None,
    keys: tuple[Path, ...] = (),
    access_log: Path | None = None,
    prune_preview: PrunePreviewer | None = None,
) -> WebOptions:
    """The pages' options (raises ``AdminTokensError`` or ``cmh.CMHError`` on a bad file)."""
    from cmh import TrustedKeys

    trusted = TrustedKeys.load(keys) if keys else None
    return WebOptions(
        admin_tokens=load_admin_tokens(admin_tokens) if admin_tokens else frozenset(),
        trusted_keys=trusted,
        access_log=access_log,
        stamps=StampCache(trusted),
        prune_preview=prune_preview,
    )
