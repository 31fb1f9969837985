"""Typed errors of semantic fingerprints."""

from __future__ import annotations

from .._errors import CMHError, _AboutInput


class SemanticError(CMHError):
    """Base class of the errors raised by :mod:`cmh.semantic`."""


class NotAModelError(SemanticError, _AboutInput):
    """The input is not a model or adapter directory this module can read (message says why)."""


class CacheKindError(SemanticError, ValueError):
    """A cache kind is unknown, or does not apply to this fingerprint."""


class FingerprintFormatError(SemanticError, ValueError):
    """A fingerprint dictionary (``to_dict`` output) is malformed or inconsistent."""
