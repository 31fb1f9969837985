"""What the mirror's handlers and web pages share in one worker process.

The application module (:mod:`~cmh.hub.mirror._app`) builds a :class:`MirrorState` and
puts it under :data:`STORE_KEY`; the handlers and the web pages read it from there, so
the pages never import the application module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from cmh.hub.cache import Clock, process_clock

from ._auth import AccessPolicy, LoginThrottle
from ._compute import ComputePool
from ._connections import ConnectionGuard
from ._derived import DerivedCache
from ._fingerprints import FingerprintCache
from ._observe import Metrics

if TYPE_CHECKING:
    from ._filling import Fills
    from ._routes import Route
    from ._upstream import Upstream
    from .stores import BlobDelivery, MirrorStore, PullThrough

DEFAULT_PAGE_SIZE = 1000
#: The freshness lifetime of a store's pull-through side made only for its records (access,
#: cuts) when the server does not pull through (unused by them).
RECORDS_FRESH_FOR = 300.0
#: Revalidations (pull-through) running at once in one worker; more wait their turn.
REVALIDATION_THREADS = 8


@dataclass
class MirrorState:
    """Everything the handlers share in one worker process."""

    backend: MirrorStore
    policy: AccessPolicy
    metrics: Metrics
    page_size: int = DEFAULT_PAGE_SIZE
    public_url: str | None = None  # base of links sent; None: each connection's local address
    guard: ConnectionGuard | None = None
    body_timeout: float = 20.0  # seconds to receive a request body (paths-info)
    fingerprints: FingerprintCache = field(default_factory=FingerprintCache)
    derived: DerivedCache = field(default_factory=DerivedCache)
    delivery: str = "proxy"  # one of ``backend.deliveries``: see :attr:`blobs`
    upstream: Upstream | None = None  # pull-through: fill what the store lacks (upstream.py)
    fills: Fills | None = None  # pull-through: blobs being filled in this worker (filling.py)
    #: the worker's one clock (cuts, pages); the server passes it, a test may move it
    clock: Clock = field(default_factory=process_clock)
    #: CPU-heavy work (fingerprints, manifests, verify now), apart (compute.py); cards are
    #: rendered apart from it (web/_card_worker.py).
    compute: ComputePool = field(default_factory=ComputePool)
    #: Seconds a request waits for its revision's revalidation in all (pull-through).
    upstream_wait: float = 60.0
    #: The threads revalidations run on (pull-through), apart from the request threads.
    revalidations: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(REVALIDATION_THREADS, "cmh-revalidate")
    )

    #: The store's pull-through side for its records (access, cuts) when the server does
    #: not pull through: the server passes the one it reads access from; else made on
    #: first use (see :attr:`cut_records`).
    records: PullThrough | None = None
    #: Failed logins by client address, on :attr:`clock` (made with the state).
    logins: LoginThrottle = field(init=False)

    def __post_init__(self) -> None:
        self.logins = LoginThrottle(self.clock)

    @property
    def blobs(self) -> BlobDelivery:
        """How this worker sends a blob: the store's delivery in :attr:`delivery` mode
        (one object for every kind and mode: the store makes it once)."""
        return self.backend.delivery(self.delivery)

    @property
    def cut_records(self) -> PullThrough:
        """Where the store keeps its cut records (``spec/hub-mirror.md`` 8.3), for every
        worker and replica of it to see: its pull-through side, whether or not the server
        pulls through (a folder's ``{repo}/.cmh/cuts``, a bucket's objects)."""
        if self.upstream is not None:
            pull: PullThrough = self.upstream.pull
            return pull
        if self.records is None:
            self.records = self.backend.pull_through(RECORDS_FRESH_FOR)
        return self.records


STORE_KEY = web.AppKey("cmh_mirror_state", MirrorState)
STALE_KEY = web.RequestKey("cmh_stale_warning", str)  # the Warning of an answer served stale
#: A stalled revalidation still under way (the request was answered stale after 3 s): a
#: file whose blob the store lacks waits for it rather than being refused (spec 8.2).
PENDING_KEY = web.RequestKey("cmh_pending_revalidation", asyncio.Future)
#: The Content-Type a file answer gives (the pages' ``/raw/``); unset: bytes.
FILE_TYPE_KEY = web.RequestKey("cmh_file_type", str)


#: ``serve_file(request, route, token)``: a resolve route answered exactly as the API
#: answers it; the application puts it here so the web pages never import it.
class ServeFile(Protocol):
    def __call__(
        self, request: web.Request, route: Route, token: str | None
    ) -> Awaitable[web.StreamResponse]: ...


SERVE_FILE_KEY = web.AppKey("cmh_serve_file", ServeFile)


def base_url(request: web.Request, state: MirrorState) -> str:
    """The configured public URL, else the address this connection reached (never ``Host``)."""
    if state.public_url is not None:
        return state.public_url
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if not sock:
        return "http://127.0.0.1"
    host = f"[{sock[0]}]" if ":" in sock[0] else sock[0]
    return f"http://{host}:{sock[1]}"
