"""The error the mirror answers the way the Hub does, and the errors of its stores."""

from __future__ import annotations

import logging


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


#: What a client is told of a storage that failed: the storage's own error line names the
#: bucket, the prefix, keys and the endpoint, and goes to the log alone.
STORAGE_FAILED = "the storage failed"


def storage_failed(exc: BaseException, what: str) -> str:
    """Log a storage failure's whole line (``{what}: {line}``) and give what a client may be
    told of it, :data:`STORAGE_FAILED`."""
    logging.getLogger("cmh.hub.mirror").warning("%s: %s", what, printable(str(exc)))
    return STORAGE_FAILED


class StoreUnavailable(StoreError):
    """The storage behind a store failed (answered with an error, or not at all).

    The message names what failed (bucket, prefix, key, endpoint): it is for the log and
    the operator. A client is told only :attr:`kind`, what sort of failure it was.
    """

    def __init__(self, message: str, kind: str = STORAGE_FAILED) -> None:
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
