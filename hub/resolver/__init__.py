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
from ._types import *  # noqa: F403  (the data model is light: no I/O)
from ._types import __all__ as _types

if TYPE_CHECKING:
    from ._http import HubClient, process_age
    from ._local import (
        linked_etag,
        read_tree,
        read_validation,
        remote_files_from_tree,
        snapshot_expiry,
        write_tree,
        write_validation,
    )
    from ._negotiate import hold, resolve
    from ._origins import TRUSTED_ORIGINS_ENV, OriginRule, UnsafeRedirect
    from ._patch import install, installed, uninstall
    from ._retry import add_wait_listener

_EXPORTS = {
    "HubClient": "_http",
    "process_age": "_http",
    "OriginRule": "_origins",
    "TRUSTED_ORIGINS_ENV": "_origins",
    "UnsafeRedirect": "_origins",
    "add_wait_listener": "_retry",
    "hold": "_negotiate",
    "install": "_patch",
    "installed": "_patch",
    "linked_etag": "_local",
    "read_tree": "_local",
    "read_validation": "_local",
    "remote_files_from_tree": "_local",
    "resolve": "_negotiate",
    "snapshot_expiry": "_local",
    "uninstall": "_patch",
    "write_tree": "_local",
    "write_validation": "_local",
}

__all__ = ["hold", "install", "installed", "resolve", "uninstall"]
# For the mirror's pull-through (the client and the local records it shares with the
# resolver) and the CLI's progress notices:
__all__ += [
    "TRUSTED_ORIGINS_ENV",
    "HubClient",
    "OriginRule",
    "UnsafeRedirect",
    "add_wait_listener",
    "linked_etag",
    "process_age",
    "read_tree",
    "read_validation",
    "remote_files_from_tree",
    "snapshot_expiry",
    "write_tree",
    "write_validation",
]
__all__ += _types

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
