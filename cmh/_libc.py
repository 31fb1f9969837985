"""C library functions the ``os`` module does not offer, looked up once through ctypes."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any


@functools.cache
def libc_function(name: str, argtypes: tuple[Any, ...]) -> Callable[..., int] | None:
    """The C library's ``name`` taking ``argtypes`` and returning an ``int`` (``errno`` kept
    for ``ctypes.get_errno``); None where there is no such function (not Linux, no libc)."""
    with contextlib.suppress(OSError, AttributeError, ImportError):
        import ctypes

        function = getattr(ctypes.CDLL(None, use_errno=True), name)
        function.argtypes = list(argtypes)
        function.restype = ctypes.c_int
        return function  # type: ignore[no-any-return]
    return None
