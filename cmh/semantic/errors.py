"""Typed errors of semantic fingerprints."""

from __future__ import annotations

from ..errors import CMHError


class SemanticError(CMHError):
    """Base class of the errors raised by :mod:`cmh.semantic`."""


class NotAModelError(SemanticError):
    """The input is not a model or adapter directory this module can read (message says why)."""

    def __init__(self, reason: str, path: str | None = None) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}" if path else reason)


class CacheKindError(SemanticError, ValueError):
    """A cache kind is unknown, or does not apply to this fingerprint."""


class FingerprintFormatError(SemanticError, ValueError):
    """A fingerprint dictionary (``to_dict`` output) is malformed or inconsistent."""
