"""The resolver: negotiate the local cache with a Hub (resolve, hold), download, install the hook.

The modules are private (``_name.py``); these names are the surface. The data
model (``RemoteFile``, ``Resolution``, ``Policy``, the errors) is imported here
directly; the rest is exported lazily, so ``import cmh.hub.resolver`` stays free
of the HTTP stack until :func:`resolve`, :func:`hold`, :func:`install` or the
:class:`HubClient` (which the mirror's pull-through uses) is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .types import *  # noqa: F403  (the data model is light: no I/O)
from .types import __all__ as _types

if TYPE_CHECKING:
    from .http import HubClient
    from .local import (
        linked_etag,
        read_tree,
        read_validation,
        remote_files_from_tree,
        snapshot_expiry,
        write_tree,
        write_validation,
    )
    from .negotiate import hold, resolve
    from .origins import OriginRule, UnsafeRedirect
    from .patch import install, installed, uninstall
    from .retry import add_wait_listener

_EXPORTS = {
    "HubClient": "http",
    "OriginRule": "origins",
    "UnsafeRedirect": "origins",
    "add_wait_listener": "retry",
    "hold": "negotiate",
    "install": "patch",
    "installed": "patch",
    "linked_etag": "local",
    "read_tree": "local",
    "read_validation": "local",
    "remote_files_from_tree": "local",
    "resolve": "negotiate",
    "snapshot_expiry": "local",
    "uninstall": "patch",
    "write_tree": "local",
    "write_validation": "local",
}

__all__ = ["hold", "install", "installed", "resolve", "uninstall"]
# For the mirror's pull-through (the client and the local records it shares with the
# resolver) and the CLI's progress notices:
__all__ += [
    "HubClient",
    "OriginRule",
    "UnsafeRedirect",
    "add_wait_listener",
    "linked_etag",
    "read_tree",
    "read_validation",
    "remote_files_from_tree",
    "snapshot_expiry",
    "write_tree",
    "write_validation",
]
__all__ += _types

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
