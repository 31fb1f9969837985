"""Lazy exports for a package ``__init__``: a name's module is imported on first use.

``cmh.hub``, ``cmh.hub.resolver`` and ``cmh.hub.mirror`` export names whose
modules pull in the HTTP stack (httpx2, aiohttp, prometheus_client); importing
the package itself must stay light, so each ``__init__`` declares which module
holds which name and this module resolves them on attribute access (PEP 562).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a name to its module."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
