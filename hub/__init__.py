"""cmh.hub: mirror store and server, resolver, pruning (imported as ``cmh.hub``).

The resolver's public API is exported lazily, so ``import cmh.hub`` stays
light (no HTTP stack, no torch, no transformers):

>>> import cmh.hub
>>> res = cmh.hub.resolve("org/model")                    # doctest: +SKIP
>>> model = AutoModel.from_pretrained(res.path)           # doctest: +SKIP
>>> cmh.hub.install()   # route transformers' downloads through the resolver  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .patch import install, installed, uninstall
    from .resolution import (
        AccessError,
        Action,
        FileResult,
        HubProtocolError,
        HubUnreachableError,
        IntegrityError,
        NotFoundError,
        OfflineError,
        Policy,
        PolicyError,
        Resolution,
        ResolveError,
        State,
    )
    from .resolver import hold, resolve

_EXPORTS = {
    "resolve": "resolver",
    "hold": "resolver",
    "install": "patch",
    "uninstall": "patch",
    "installed": "patch",
    "AccessError": "resolution",
    "Action": "resolution",
    "FileResult": "resolution",
    "HubProtocolError": "resolution",
    "HubUnreachableError": "resolution",
    "IntegrityError": "resolution",
    "NotFoundError": "resolution",
    "OfflineError": "resolution",
    "Policy": "resolution",
    "PolicyError": "resolution",
    "Resolution": "resolution",
    "ResolveError": "resolution",
    "State": "resolution",
}

__all__ = [
    "AccessError",
    "Action",
    "FileResult",
    "HubProtocolError",
    "HubUnreachableError",
    "IntegrityError",
    "NotFoundError",
    "OfflineError",
    "Policy",
    "PolicyError",
    "Resolution",
    "ResolveError",
    "State",
    "hold",
    "install",
    "installed",
    "resolve",
    "uninstall",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cmh.hub' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
