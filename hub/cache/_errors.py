"""Errors of putting content into a cache: the resolver raises them, and so does the
cache core when a blob fails its check or the disk is full (the resolver's face
re-exports them: ``cmh.hub.resolver.IntegrityError`` is this class)."""

from __future__ import annotations

from cmh import CMHError, InvalidFileError


class ResolveError(CMHError):
    """A snapshot could not be resolved; the cache is left as it was."""


class IntegrityError(ResolveError):
    """Content failed its check (ETag, size or CMH manifest) and was not installed."""


class DiskFullError(ResolveError):
    """The cache's filesystem is full (or a file size limit was hit); the partial was removed."""


class InvalidRemoteFileError(ResolveError, InvalidFileError):
    """A ``*.safetensors`` file the Hub serves has a header no reader accepts; not installed."""
