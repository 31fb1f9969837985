"""Where a Hub may send the HTTP client, and where its token may go: one rule.

- ``Authorization`` goes only to the endpoint's origin (scheme, host, port).
- A redirect or a ``Link: rel="next"`` page is followed only to the endpoint's
  origin, or to an origin a redirect of a ``resolve`` request from the
  endpoint named (the Hub's CDN; remembered for the client's later requests).
- Never from HTTPS to HTTP, never to another scheme, and at most
  :data:`MAX_REDIRECTS` hops.
- Never to a host that resolves to a local address (loopback, private,
  link-local, unspecified: anything not globally routable, in any spelling,
  ``127.3``, ``2130706435`` or ``0x7f000003`` alike) other than an address of
  the endpoint's own host (what the operator configured), unless the origin
  is one the deployment trusts: ``CMH_TRUSTED_ORIGINS`` (``--trust-origin`` of
  ``cmh pull``, ``cmh serve`` and ``cmh mirror sync``), such as a local CDN or
  the storage a mirror presigns for. Addresses are compared, never names, so
  a mirror reached as ``localhost`` may redirect to its storage on 127.0.0.1.

A refused hop raises :class:`UnsafeRedirect` (a typed protocol error).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from urllib.parse import urlsplit

from ._types import HubProtocolError

#: Redirects followed for one request.
MAX_REDIRECTS = 5
#: The environment variable naming the extra origins a deployment trusts (space or comma
#: separated URLs); ``--trust-origin`` sets it.
TRUSTED_ORIGINS_ENV = "CMH_TRUSTED_ORIGINS"

Origin = tuple[str, str, int]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


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


def trusted_origins() -> frozenset[Origin]:
    """The origins ``CMH_TRUSTED_ORIGINS`` names (read now)."""
    raw = os.environ.get(TRUSTED_ORIGINS_ENV, "")
    return frozenset(origin(u) for u in raw.replace(",", " ").split() if "://" in u)


def addresses(host: str) -> frozenset[Address]:
    """Every address ``host`` stands for, as the system resolver reads it (so each
    spelling of one address is that address); empty when it does not resolve."""
    name = host.strip("[]")
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return frozenset()
    out: set[Address] = set()
    for info in infos:
        try:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        out.add(address)
    return frozenset(out)


def _local(address: Address) -> bool:
    """Not an address of the Internet at large: loopback, private, link-local, unspecified..."""
    return not address.is_global or address.is_multicast


class OriginRule:
    """The rule for one endpoint; :meth:`hop` also learns the CDN origins."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = origin(endpoint)
        self.trusted = trusted_origins()
        self._cdn: set[Origin] = set()
        self._own: frozenset[Address] | None = None  # the endpoint's addresses, resolved once
        self._lock = threading.Lock()

    def carries_token(self, url: str) -> bool:
        """True when ``url`` lies on the endpoint's origin (the token may be sent)."""
        return origin(url) == self.endpoint

    def _known(self, target: Origin) -> bool:
        with self._lock:
            return target == self.endpoint or target in self._cdn or target in self.trusted

    def _own_addresses(self) -> frozenset[Address]:
        with self._lock:
            own = self._own
        if own is None:
            own = addresses(self.endpoint[1])
            with self._lock:
                self._own = own
        return own

    def local_target(self, host: str) -> bool:
        """True when ``host`` resolves to a local address that is not the endpoint's."""
        own = self._own_addresses()
        return any(_local(a) and a not in own for a in addresses(host))

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
            if self.local_target(dst[1]):
                host = f"[{dst[1]}]" if ":" in dst[1] else dst[1]  # an IPv6 address
                where = f"{dst[0]}://{host}:{dst[2]}"
                raise UnsafeRedirect(
                    f"redirect to a local address refused: {target} (a local CDN or storage "
                    f"this deployment trusts: --trust-origin {where}, or {TRUSTED_ORIGINS_ENV})"
                )
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
