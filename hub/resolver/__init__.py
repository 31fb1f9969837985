"""The resolver: negotiate the local cache with a Hub (resolve, hold), download, install the hook.

The data model (:mod:`cmh.hub.resolver.types`) is imported here directly; the
functions are exported lazily, so ``import cmh.hub.resolver`` stays free of
the HTTP stack until :func:`resolve`, :func:`hold` or :func:`install` is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from . import types
from .types import *  # noqa: F403  (the data model is light: no I/O)

if TYPE_CHECKING:
    from .negotiate import hold, resolve
    from .patch import install, installed, uninstall

_FUNCTIONS = {
    "hold": "negotiate",
    "install": "patch",
    "installed": "patch",
    "resolve": "negotiate",
    "uninstall": "patch",
}

__all__ = ["hold", "install", "installed", "resolve", "uninstall"]
__all__ += types.__all__

__getattr__, __dir__ = lazy_exports(__name__, _FUNCTIONS, globals())
