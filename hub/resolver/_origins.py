"""Where a Hub may send the HTTP client, and where its token may go: one rule, no I/O.

- ``Authorization`` goes only to the endpoint's origin (scheme, host, port).
- A redirect or a ``Link: rel="next"`` page is followed only to the endpoint's
  origin, or to an origin a redirect of a ``resolve`` request from the
  endpoint named (the Hub's CDN; remembered for the client's later requests).
- Never from HTTPS to HTTP, never to another scheme, never to a loopback,
  link-local or unspecified address other than the endpoint's own host (what
  the operator configured), and at most :data:`MAX_REDIRECTS` hops.

A refused hop raises :class:`UnsafeRedirect` (a typed protocol error).
"""

from __future__ import annotations

import ipaddress
import threading
from urllib.parse import urlsplit

from ._types import HubProtocolError

#: Redirects followed for one request.
MAX_REDIRECTS = 5

Origin = tuple[str, str, int]


class UnsafeRedirect(HubProtocolError):
    """A redirect or ``Link`` target the credential rule refuses."""


def origin(url: str) -> Origin:
    """``(scheme, host, port)`` of ``url``, the port made explicit."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    default = 443 if scheme == "https" else 80
    return scheme, (parts.hostname or "").lower(), port if port is not None else default


def _local_host(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_link_local or address.is_unspecified


class OriginRule:
    """The rule for one endpoint; :meth:`hop` also learns the CDN origins."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = origin(endpoint)
        self._cdn: set[Origin] = set()
        self._lock = threading.Lock()

    def carries_token(self, url: str) -> bool:
        """True when ``url`` lies on the endpoint's origin (the token may be sent)."""
        return origin(url) == self.endpoint

    def _known(self, target: Origin) -> bool:
        with self._lock:
            return target == self.endpoint or target in self._cdn

    def hop(self, source: str, target: str, file_request: bool) -> None:
        """Allow a redirect from ``source`` to ``target`` or raise :class:`UnsafeRedirect`.

        ``file_request``: the chain began at a ``resolve`` URL, whose redirect from the
        endpoint may name a CDN origin.
        """
        src, dst = origin(source), origin(target)
        if dst[0] not in ("http", "https"):
            raise UnsafeRedirect(f"redirect to a {dst[0] or 'relative'} URL refused: {target}")
        if src[0] == "https" and dst[0] == "http":
            raise UnsafeRedirect(f"redirect from HTTPS to HTTP refused: {source} -> {target}")
        if self._known(dst):
            return
        if file_request and src == self.endpoint:
            if _local_host(dst[1]) and dst[1] != self.endpoint[1]:
                raise UnsafeRedirect(f"redirect to a local address refused: {target}")
            with self._lock:
                self._cdn.add(dst)
            return
        raise UnsafeRedirect(
            f"redirect to another origin refused: {source} -> {target} "
            f"(only the endpoint or the CDN its file redirects name)"
        )

    def link(self, source: str, target: str) -> None:
        """Allow a ``Link: rel="next"`` page at ``target`` or raise :class:`UnsafeRedirect`."""
        if origin(target) != self.endpoint:
            raise UnsafeRedirect(f"next page on another origin refused: {source} -> {target}")
