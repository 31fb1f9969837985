"""The Hub endpoint and the token, found as the stock client finds them."""

from __future__ import annotations

import hashlib
import os
import re

#: A header value h11 (the HTTP/1.1 layer of ``httpx2``, the stock client's and the
#: resolver's HTTP client) sends: its ``field_value`` rule (no leading or trailing blank,
#: no NUL, CR, LF or other white space but inner spaces and tabs). ``Authorization:
#: Bearer `` (``token=""``) is not one.
SENDABLE_VALUE = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")

DEFAULT_ENDPOINT = "https://huggingface.co"


def default_endpoint() -> str:
    """``HF_ENDPOINT`` read now (not at import), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token_to_send(token: str | bool | None) -> str | None:
    """The token the stock client sends for its ``token`` argument, chosen by
    huggingface_hub's own ``get_token_to_send`` (every supported release has it): a string
    is sent, the empty one too (as ``Bearer ``, which no request can carry: see
    :func:`check_sendable`); ``False`` sends none; ``True`` sends ``HF_TOKEN`` or the
    token file, and raises the stock ``LocalTokenNotFoundError`` when there is neither;
    ``None`` sends them too unless ``HF_HUB_DISABLE_IMPLICIT_TOKEN`` is set."""
    if token is False:
        return None
    if isinstance(token, str):
        return token
    from huggingface_hub.utils._headers import get_token_to_send

    if token is True:
        return get_token_to_send(True) or None  # LocalTokenNotFoundError when none is found
    try:
        found = get_token_to_send(None)
    except Exception:  # an unreadable token file, OIDC not configured, ...: none sent
        return None
    return found or None


def check_sendable(token: str | None) -> None:
    """Raise what the stock client's request raises when ``Authorization: Bearer {token}``
    cannot be sent (``token=""``: ``httpx2.LocalProtocolError: Illegal header value
    b'Bearer '``, raised by h11 before a byte goes out); nothing for ``None``."""
    if token is None:
        return
    try:
        value = f"Bearer {token}".encode("ascii")
    except UnicodeEncodeError:
        return  # not a header value at all: the HTTP client says so itself
    if SENDABLE_VALUE.fullmatch(value) is None:
        import httpx2

        raise httpx2.LocalProtocolError(f"Illegal header value {value!r}")


#: What :func:`credential_digest` answers for a request sent without ``Authorization``.
NO_CREDENTIAL = ""


def credential_digest(authorization: str | bytes | None) -> str:
    """The credential an answer was obtained with, as the cache keeps it: ``""`` for a
    request sent without ``Authorization``, else the SHA-256 of the header value sent (the
    token itself is never kept, on disk or in memory). Answers remembered or stored by
    install()'s hook are given again only to a request whose digest is the same (or to
    any request, for an answer the Hub gave without a credential)."""
    if authorization is None:
        return NO_CREDENTIAL
    if isinstance(authorization, str):
        authorization = authorization.encode("utf-8", "surrogateescape")
    return "sha256:" + hashlib.sha256(authorization).hexdigest()


def token_credential(token: str | bool | None) -> str | None:
    """:func:`credential_digest` of the ``Authorization`` header the stock client sends for
    its ``token`` argument (:func:`token_to_send`); ``None`` when no header can be told
    (``token=True`` with no token to be found: the call raises before any request)."""
    try:
        sent = token_to_send(token)
    except Exception:
        return None
    return credential_digest(None if sent is None else f"Bearer {sent}")
