"""Typed errors raised by the cmh format library.

Every failure a caller can act on has its own class, and every class carries a
message in plain words. All derive from :class:`CMHError`.
"""

from __future__ import annotations


class CMHError(Exception):
    """Base class of every error raised by cmh."""


class _AboutInput(CMHError):
    """An input that cannot be read as what it should be: ``reason``, about ``path``."""

    def __init__(self, reason: str, path: str | None = None) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}" if path else reason)


class InvalidFileError(_AboutInput):
    """The input is not a valid safetensors file (the message says why)."""


class IndexInconsistentError(CMHError):
    """A checkpoint directory's index and shards disagree (outcome ``index_inconsistent``)."""

    def __init__(self, directory: str, problems: tuple[str, ...]) -> None:
        self.directory = directory
        self.problems = problems
        shown = "; ".join(problems[:5]) + (
            f" and {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        super().__init__(f"{directory}: index and shards disagree: {shown}")


class RecordError(CMHError):
    """The 64-byte CMH record cannot be used."""


class NotARecordError(RecordError):
    """The bytes do not start with the CMH magic."""


class CorruptRecordError(RecordError):
    """The record's check failed or its reserved bytes are not zero."""


class UnsupportedVersionError(RecordError):
    """The record has a version this library does not implement."""

    def __init__(self, version: int) -> None:
        self.version = version
        super().__init__(f"unsupported CMH record version {version} (this library reads 1)")


class CarrierError(CMHError):
    """The reserved ``cmh*`` metadata values are malformed."""


class NotStampedError(CMHError):
    """The file carries no CMH record."""


class InputValueError(CMHError, ValueError):
    """A value a user typed (a duration, a size) could not be parsed."""


class DurationError(InputValueError):
    """A TTL or duration string could not be parsed."""


class SizeError(InputValueError):
    """A size string (``500M``, ``20GB``, ``1.5GiB``) could not be parsed."""


class SigningKeyError(CMHError):
    """A signing or verification key could not be loaded."""


class VerificationError(CMHError):
    """Verified loading refused a file; ``result`` holds the full verdict."""

    def __init__(self, message: str, result: object | None = None) -> None:
        self.result = result
        super().__init__(message)


class StampError(CMHError):
    """A stamp could not be written; the original file is unchanged."""
