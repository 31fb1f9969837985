"""Connection limits of one mirror worker: a cap, a header-read timeout, an idle timeout,
and a total deadline for each response body.

aiohttp has an idle (keep-alive) timeout but no header-read timeout and no
cap on connections, so a few hundred clients that never finish their headers
hold every file descriptor. :class:`ConnectionGuard` wraps the protocol of
each accepted connection (a thin proxy in front of aiohttp's own) and knows,
per connection, whether a request is being answered (*busy*), headers are
arriving (*reading*, since the first byte of a request) or nothing happens
(*idle*, since the last answer or the connection). A sweep every fraction of a
second aborts connections reading for longer than the header timeout and
closes those idle for longer than the idle timeout. At the cap, a new
connection evicts the oldest connection that is not busy, so a normal request
still gets in while slow clients hold the cap; when every connection is busy,
the new one is refused (closed at once).

A response body has a total deadline from its headers on (:func:`send_allowance`: a
grace plus its length at a minimum rate, :data:`MIN_SEND_RATE` unless the operator sets
one, as Apache's ``mod_reqtimeout`` ``MinRate``), whoever moves its bytes (the loop,
the folder store's sender thread, a bucket store's splice thread): a client that stops
reading, or reads a byte a second, would otherwise hold its connection (and a sender
slot) for ever, and enough of them fill the cap with busy connections no newcomer may
evict. A connection still answering past the deadline is cut (its socket shut down,
then reset): the client holds an incomplete body, never a complete wrong one. The time
a filling body waits for bytes the upstream has not sent yet is not its client's: its
deadline stands still meanwhile (:meth:`ConnectionGuard.waiting_for_bytes`). Every
time here is read on the worker's one clock (:func:`cmh.hub.cache.process_clock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import resource
import socket
import struct
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from cmh.hub.cache import SYSTEM_CLOCK, Clock

#: File descriptors kept free for blobs being sent, logs and the runtime.
FD_RESERVE = 32
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_HEADER_TIMEOUT = 20.0
DEFAULT_IDLE_TIMEOUT = 30.0
#: Seconds every response body may take on top of its length's share: a slow start, a
#: client's pause, a check the body's last byte waits for.
SEND_GRACE = 60.0
#: Bytes per second a body's client must take on average (128 KiB/s, about 1 Mbit/s):
#: a 10 GB file over a 10 Mbit/s link (about 2.2 h) passes with ten times the margin,
#: also as 8 parallel downloads sharing that link; its deadline is about 21 h.
MIN_SEND_RATE = 128 << 10
#: Set on a request whose body the guard cut at its deadline.
STALLED_KEY = web.RequestKey("cmh_stalled", bool)
#: What the access log says of such a cut (not that the client went away).
STALLED_CUT = "stalled: the body's deadline passed"


def connection_cap_limit() -> int:
    """The most connections the open-file limit allows (each busy one may hold a blob too)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, (soft - FD_RESERVE) // 2)


def send_allowance(nbytes: int | None, min_rate: int = MIN_SEND_RATE) -> float:
    """Seconds a response body of ``nbytes`` may take to send at ``min_rate`` bytes per
    second (``None``: a length not known up front gets the grace alone)."""
    return SEND_GRACE + (nbytes or 0) / min_rate


class _Connection:
    __slots__ = ("answer", "busy", "reading_since", "send_until", "since", "transport", "waiting")

    def __init__(self, transport: asyncio.Transport, now: float) -> None:
        self.transport = transport
        self.busy = 0  # requests being answered (aiohttp answers one at a time)
        self.reading_since: float | None = None
        self.since = now
        self.send_until: float | None = None  # the deadline of the body being sent
        self.waiting = 0  # the body waits for bytes that do not exist yet (a fill's)
        self.answer: weakref.ref[web.BaseRequest] | None = None  # whose body is sent


class ConnectionGuard:
    """Tracks the connections of one worker and enforces the limits."""

    def __init__(
        self,
        max_connections: int,
        header_timeout: float,
        idle_timeout: float,
        on_drop: Callable[[str], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        min_send_rate: int = MIN_SEND_RATE,
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        #: told each drop's reason: refused|evicted|header_timeout|idle|stalled
        self.on_drop = on_drop
        self.clock = clock
        self.min_send_rate = min_send_rate  # bytes per second (send_allowance)
        self._conns: dict[asyncio.BaseTransport, _Connection] = {}  # oldest first

    def __len__(self) -> int:
        return len(self._conns)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` around aiohttp's."""
        return lambda: _GuardedProtocol(self, factory)

    def _now(self) -> float:
        return self.clock.monotonic()

    def admit(self, transport: asyncio.Transport) -> bool:
        """Register a new connection; False when it must be refused."""
        if len(self._conns) >= self.max_connections:
            victim = next((c for c in self._conns.values() if not c.busy), None)
            if victim is None:
                self._tell("refused")
                return False
            self._tell("evicted")
            self._drop(victim.transport)
        self._conns[transport] = _Connection(transport, self._now())
        return True

    def _tell(self, reason: str) -> None:
        if self.on_drop is not None:
            self.on_drop(reason)

    def _drop(self, transport: asyncio.BaseTransport) -> None:
        self._conns.pop(transport, None)
        transport.abort()  # type: ignore[attr-defined]

    def shut_all(self) -> int:
        """Shut every connection's socket down (the graceful timeout is over): a send in
        progress fails at once and its handler ends; how many were open. (Not
        ``transport.abort()``: during ``loop.sendfile`` it makes asyncio log an
        ``InvalidStateError`` from its empty-waiter.)"""
        transports = list(self._conns)
        for transport in transports:
            _shut(transport, reset=False)
        return len(transports)

    def closed(self, transport: asyncio.BaseTransport) -> None:
        self._conns.pop(transport, None)

    def received(self, transport: asyncio.BaseTransport) -> None:
        conn = self._conns.get(transport)
        if conn is not None and not conn.busy and conn.reading_since is None:
            conn.reading_since = self._now()

    async def body_starts(self, request: web.BaseRequest, response: web.StreamResponse) -> None:
        """Start the deadline of ``response``'s body (an ``on_response_prepare`` signal).
        A whole answer (``web.Response``) is written after its handler returned, when its
        connection is no longer busy: it is cut only while the kernel has not taken all
        its bytes (:meth:`sweep`)."""
        conn = self._conns.get(request.transport) if request.transport is not None else None
        if conn is None:
            return
        nbytes = 0 if request.method == "HEAD" else response.content_length
        conn.send_until = self._now() + send_allowance(nbytes, self.min_send_rate)
        conn.answer = weakref.ref(request)

    @contextlib.contextmanager
    def waiting_for_bytes(self, transport: asyncio.BaseTransport | None) -> Iterator[None]:
        """The body being sent on ``transport`` waits for bytes its store does not hold
        yet (a pull-through fill's, which arrive at the upstream's pace): that time is not
        its client's, so the body's deadline stands still meanwhile. The fill bounds the
        wait (an upstream slower than ``MIN_TRANSFER_RATE`` is given up on)."""
        conn = self._conns.get(transport) if transport is not None else None
        if conn is None:
            yield
            return
        start = self._now()
        conn.waiting += 1
        try:
            yield
        finally:
            conn.waiting -= 1
            if conn.send_until is not None:
                conn.send_until += self._now() - start

    @contextlib.contextmanager
    def answering(self, transport: asyncio.BaseTransport | None) -> Iterator[None]:
        """Mark the connection busy while a request is answered."""
        conn = self._conns.get(transport) if transport is not None else None
        if conn is None:
            yield
            return
        conn.busy += 1
        conn.send_until = None  # the last answer's body is out: a new one starts its own
        try:
            yield
        finally:
            conn.busy -= 1
            conn.reading_since = None
            conn.since = self._now()

    def sweep(self) -> None:
        """Cut connections whose body is past its deadline; abort connections slow with
        their headers; close idle ones."""
        now = self._now()
        for conn in list(self._conns.values()):
            # A whole answer is written after its handler returned: its bytes the kernel
            # did not take yet keep the connection answering (closing it would wait for
            # them for ever, outside the cap's count).
            unsent = _unsent(conn.transport)
            if unsent and not conn.busy and conn.send_until is None:
                conn.send_until = now + send_allowance(unsent, self.min_send_rate)
            if conn.send_until is not None and now > conn.send_until and not conn.waiting:
                conn.send_until = None
                if conn.busy or unsent:
                    self._tell("stalled")
                    request = conn.answer() if conn.answer is not None else None
                    if request is not None:  # its access log says who cut it
                        request[STALLED_KEY] = True
                    _cut(conn.transport)
                    continue
            if conn.busy or unsent:
                continue
            if conn.reading_since is not None:
                if now - conn.reading_since > self.header_timeout:
                    self._tell("header_timeout")
                    self._drop(conn.transport)
            elif now - conn.since > self.idle_timeout:
                self._tell("idle")
                self._conns.pop(conn.transport, None)
                conn.transport.close()

    async def run(self) -> None:
        """Sweep until cancelled."""
        interval = max(0.05, min(1.0, self.header_timeout / 4, self.idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            self.sweep()


def _unsent(transport: asyncio.BaseTransport) -> int:
    """Bytes written to ``transport`` that the kernel has not taken yet."""
    try:
        return int(transport.get_write_buffer_size())  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return 0


def _cut(transport: asyncio.BaseTransport) -> None:
    """Cut a connection in the middle of a body: its socket shut down, so the send under
    way fails wherever it waits (the loop, a sender or splice thread's duplicate of the
    socket) and its handler ends; reset at its last close (``SO_LINGER`` 0), so the kernel
    drops the bytes the client did not take. The guard forgets it once it is lost."""
    _shut(transport, reset=True)


def _shut(transport: asyncio.BaseTransport, reset: bool) -> None:
    """Shut ``transport``'s socket down (reset at its last close when ``reset``), or
    abort a transport without one."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        transport.abort()  # type: ignore[attr-defined]
        return
    if reset:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _GuardedProtocol(asyncio.Protocol):
    """Forwards every event to aiohttp's protocol, telling the guard what happens."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._factory = factory
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if not self._guard.admit(transport):  # type: ignore[arg-type]
            transport.abort()  # type: ignore[attr-defined]
            return
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._guard.closed(self._transport)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            if self._transport is not None:
                self._guard.received(self._transport)
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str | None) -> IPAddress | None:
    """``text`` as an IP address (an IPv4-mapped IPv6 one as IPv4), else None."""
    try:
        address = ipaddress.ip_address((text or "").strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


@dataclass(frozen=True)
class TrustedProxies:
    """The reverse proxies (``--trusted-proxy``) whose ``X-Forwarded-For`` names the client.

    Deny by default: without any, and for a peer that is not one of them, the header is
    ignored and the client is the peer's address. Behind a trusted peer, the client is
    the last hop of ``X-Forwarded-For`` (read right to left) that is not a trusted proxy:
    the hops left of it are what the client itself claims. A hop that is not an address
    ends the walk (the trusted hop right of it is the client).
    """

    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, specs: Iterable[str]) -> TrustedProxies:
        """From addresses or networks (``127.0.0.1``, ``10.0.0.0/8``); ``ValueError`` names
        the one that is neither."""
        networks = []
        for spec in specs:
            try:
                networks.append(ipaddress.ip_network(spec.strip(), strict=False))
            except ValueError:
                raise ValueError(
                    f"{spec!r} is not an IP address or network: give one "
                    "such as 127.0.0.1 or 10.0.0.0/8 (a host name is not resolved)"
                ) from None
        return cls(tuple(networks))

    def trusts(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)

    def client(self, peer: str | None, forwarded: Iterable[str]) -> str:
        """The client behind ``peer`` given its ``X-Forwarded-For`` values."""
        address = _address(peer)
        if address is None or not self.trusts(address):
            return peer or "-"
        hops = [hop for value in forwarded for hop in value.split(",")]
        for hop in reversed(hops):
            hop_address = _address(hop)
            if hop_address is None:
                break
            address = hop_address
            if not self.trusts(address):
                break
        return str(address)

    def client_of(self, request: web.BaseRequest) -> str:
        """Who asks ``request``: its peer, or the client a trusted proxy forwards for."""
        if not self.networks:
            return request.remote or "-"
        return self.client(request.remote, request.headers.getall("X-Forwarded-For", ()))


#: Headers of an answer made before any route ran (a request the HTTP parser refused).
PLAIN_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'; base-uri 'none'",
    "X-Error-Code": "BadRequest",
}

logger = logging.getLogger("cmh.hub.mirror")


class _PlainErrors(RequestHandler):
    """aiohttp's protocol, its answer to a request its parser refuses made plain: the
    Hub's error shape with ``nosniff`` and a CSP, no echo of the request's bytes (its
    words quote them), and one log line without them or a traceback (the bytes may
    hold an ``Authorization`` value)."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:  # a route's failure: aiohttp's own answer and log
            return super().handle_error(request, status, exc, message)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was started: cannot send another")
        what = type(exc).__name__ if exc is not None else "refused"
        logger.info("malformed request from %s refused (%d, %s)", request.remote, status, what)
        body = json.dumps({"error": "Bad Request: the request is not valid HTTP/1.1"})
        headers = {**PLAIN_HEADERS, "X-Error-Message": "Bad Request"}
        response = web.Response(
            status=status, text=body, content_type="application/json", headers=headers
        )
        response.force_close()
        return response


def plain_errors(server: web.Server, kwargs: dict[str, Any]) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for ``server`` (aiohttp's, made with the handler arguments
    ``kwargs``) whose parser refusals are plain."""
    return lambda: _PlainErrors(server, loop=asyncio.get_running_loop(), **kwargs)
