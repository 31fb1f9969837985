"""Who is looking: the token cookie, admin tokens, and the login form's cross-site checks.

The page answers to the same tokens as the API (the ``--tokens`` file, read by
:mod:`cmh.hub.mirror._auth`): a token given in the login form is kept in the
``cmh_token`` cookie (HttpOnly, SameSite=Strict, Secure over https) and every
page asks :meth:`~cmh.hub.mirror._auth.AccessPolicy.can_read` with it, exactly
as the API does with ``Authorization: Bearer``. Admin tokens (one per line in
the ``--admin-tokens`` file) also open the operator page.

A login or logout is a POST that must carry the form token set by the page
that showed the form (a random value in the ``cmh_csrf`` cookie, also
SameSite=Strict, and in a hidden field: another site can read neither), and,
when the browser sends ``Origin``, an origin naming this server's host (``http``
or ``https``: behind a TLS-terminating proxy the server itself sees plain http).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cmh import read_small_file

from .._auth import AccessPolicy, bearer_token

TOKEN_COOKIE = "cmh_token"
CSRF_COOKIE = "cmh_csrf"
CSRF_FIELD = "csrf"
#: How long a login lasts in the browser (the token itself never expires here).
COOKIE_MAX_AGE = 8 * 3600


class AdminTokensError(ValueError):
    """The admin tokens file cannot be read or has a malformed line."""


def valid_token(text: str) -> str | None:
    """``text`` if it has the shape of a token (the API's rule), else ``None``."""
    return bearer_token(f"Bearer {text}")


def load_admin_tokens(path: Path) -> frozenset[str]:
    """Admin tokens: one per line, ``#`` starts a comment, at least one token."""
    try:
        text = read_small_file(path).decode("utf-8")
    except OSError as exc:
        raise AdminTokensError(
            f"{path}: cannot read the admin tokens file: {exc.strerror}"
        ) from None
    except UnicodeDecodeError as exc:
        raise AdminTokensError(f"{path}: cannot read the admin tokens file: {exc}") from None
    tokens: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if valid_token(line) is None:
            raise AdminTokensError(f"{path}:{number}: a token is 8-512 printable characters")
        tokens.add(line)
    if not tokens:
        raise AdminTokensError(f"{path}: no admin token in the file")
    return frozenset(tokens)


def _member(token: str, known: Iterable[str]) -> bool:
    found = False
    for item in known:  # compare with every token: timing does not tell which one matched
        if hmac.compare_digest(item.encode(), token.encode()):
            found = True
    return found


@dataclass(frozen=True)
class Viewer:
    """The person behind a request: their token (if any) and what it opens."""

    token: str | None
    known: bool  # the token is in the tokens file or the admin file
    admin: bool

    def can_read(self, policy: AccessPolicy, repo_type: str, repo_id: str) -> bool:
        """The API's rule, with this viewer's token."""
        return policy.can_read(repo_type, repo_id, self.token)


def viewer(
    policy: AccessPolicy,
    admin_tokens: frozenset[str],
    cookie: str | None,
    authorization: str | None,
) -> Viewer:
    """The viewer of a request: the cookie's token, else an ``Authorization: Bearer`` one."""
    token = valid_token(cookie) if cookie else None
    if token is None:
        token = bearer_token(authorization)
    if token is None:
        return Viewer(None, False, False)
    admin = _member(token, admin_tokens)
    return Viewer(token, admin or _member(token, policy.grants), admin)


def new_csrf_token() -> str:
    """A fresh random form token."""
    return secrets.token_urlsafe(24)


def csrf_ok(cookie: str | None, field: str | None, origin: str | None, own_host: str) -> bool:
    """True when a form post comes from this site (see the module docstring)."""
    if not cookie or not field or not hmac.compare_digest(cookie.encode(), field.encode()):
        return False
    if origin is None:
        return True
    return bool(own_host) and origin in (f"http://{own_host}", f"https://{own_host}")
