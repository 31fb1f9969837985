"""The error the mirror answers the way the Hub does, and the errors of its stores."""

from __future__ import annotations


class HubError(Exception):
    """An error answered the way the Hub does: status, ``X-Error-Code``, JSON body."""

    def __init__(
        self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


class StoreError(Exception):
    """An import or listing that cannot be done (bad source, bad name, failed check)."""


class StoreUnavailable(StoreError):
    """The storage behind a store failed (answered with an error, or not at all).

    The message names what failed (bucket, prefix, key, endpoint): it is for the log and
    the operator. A client is told only :attr:`kind`, what sort of failure it was.
    """

    def __init__(self, message: str, kind: str = "the storage failed") -> None:
        super().__init__(message)
        self.kind = kind


#: What :class:`StoreUnavailable` tells a client for a store holding an object cmh cannot
#: use (an invalid tree or record).
INVALID_OBJECT = "the store holds an object that cannot be used"


class StoreMissing(StoreError):
    """The store does not exist (no such folder, no such bucket)."""


#: Why a body ended early when its client left: logged as its ``cut``, never a cut record.
CLIENT_LEFT = "client went away"


class BlobUnavailable(OSError):
    """The blob is missing, not a regular file, or not the size the index says."""


def printable(text: str, limit: int = 500) -> str:
    """``text`` cut to ``limit`` characters, each one that is not printable (a newline, an
    escape sequence) replaced by a space: safe in one log line or record."""
    return "".join(c if c.isprintable() else " " for c in text[:limit])
