"""The resolver: negotiate the local cache with a Hub (resolve, hold), download, install the hook.

Exported lazily: ``import cmh.hub.resolver`` (and :mod:`cmh.hub.resolver.types`)
stays free of the HTTP stack until :func:`resolve` or :func:`hold` is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .negotiate import hold, resolve
    from .patch import install, installed, uninstall
    from .types import (
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
        RemoteFile,
        Resolution,
        ResolveError,
        State,
    )

_TYPES = (
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
    "RemoteFile",
    "Resolution",
    "ResolveError",
    "State",
)
_EXPORTS = {
    "resolve": "negotiate",
    "hold": "negotiate",
    "install": "patch",
    "uninstall": "patch",
    "installed": "patch",
    **dict.fromkeys(_TYPES, "types"),
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
    "RemoteFile",
    "Resolution",
    "ResolveError",
    "State",
    "hold",
    "install",
    "installed",
    "resolve",
    "uninstall",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
