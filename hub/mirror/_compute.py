"""CPU-heavy work of one worker, on its own bounded pool, a few at a time per client.

Fingerprints, tensor manifests, card rendering and a page's "verify now" read
and hash whole files. They run on :class:`ComputePool`'s threads
(:data:`COMPUTE_WORKERS`), never on the threads that answer requests and read
the store (the event loop's default executor): however many are asked for, a
revision, a tree or a file is answered meanwhile. A client (its address, or the
one a trusted reverse proxy forwards for: :class:`TrustedProxies`) has at most
:data:`PER_CLIENT` computations running at once; its further requests wait
their turn without holding a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ._connections import TrustedProxies

if TYPE_CHECKING:
    from aiohttp import web

T = TypeVar("T")

#: Threads computing at once in one worker: the cores but one (a core stays free for the
#: requests: with both of 2 cores computing, a stored tree took 2-5x, and up to 100x
#: for Python-bound work, its time alone), at least one, at most two.
COMPUTE_WORKERS = max(1, min(2, (os.cpu_count() or 1) - 1))
#: Computations one client may have running at once in one worker (more wait their turn).
PER_CLIENT = 2


class ComputePool:
    """The worker's pool for CPU-heavy work, with a concurrency limit per client."""

    def __init__(
        self,
        workers: int = COMPUTE_WORKERS,
        per_client: int = PER_CLIENT,
        proxies: TrustedProxies | None = None,
    ) -> None:
        self.workers, self.per_client = workers, per_client
        self.proxies = proxies or TrustedProxies()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="cmh-compute")
        # client -> (its semaphore, requests using it): dropped when none does, so the
        # clients kept never outnumber the requests in flight.
        self._clients: dict[str, tuple[asyncio.Semaphore, int]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, client: str) -> AsyncIterator[None]:
        """Wait until ``client`` has fewer than ``per_client`` computations under way."""
        gate, users = self._clients.get(client, (None, 0))
        if gate is None:
            gate = asyncio.Semaphore(self.per_client)
        self._clients[client] = (gate, users + 1)
        try:
            async with gate:
                yield
        finally:
            gate, users = self._clients[client]
            if users == 1:
                del self._clients[client]
            else:
                self._clients[client] = (gate, users - 1)

    async def run(self, client: str, func: Callable[..., T], *args: Any) -> T:
        """``func(*args)`` on the pool, once ``client`` has fewer than ``per_client`` running."""
        async with self.turn(client):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, func, *args)

    def call(self, func: Callable[..., T], *args: Any) -> T:
        """``func(*args)`` on the pool, from a thread that may block (a page being built)."""
        return self._pool.submit(func, *args).result()

    def client_of(self, request: web.BaseRequest) -> str:
        """Who asks, for the per-client limit: the peer's address, or the client a
        trusted proxy forwards for (``--trusted-proxy``)."""
        return self.proxies.client_of(request)

    def clients(self) -> int:
        """Clients with a computation running or waiting (for tests and metrics)."""
        return len(self._clients)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
