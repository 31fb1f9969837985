"""The one error type the mirror answers the way the Hub does."""

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
