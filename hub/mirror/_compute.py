"""CPU-heavy work of one worker, on its own bounded pool, a few at a time per client.

Fingerprints, tensor manifests and a page's "verify now" read and hash whole
files (model cards are rendered apart: :mod:`~cmh.hub.mirror.web._card_worker`).
They run on :class:`ComputePool`'s threads (:data:`COMPUTE_WORKERS`), never on
the threads that answer requests and read the store (the event loop's default
executor): however many are asked for, a
revision, a tree or a file is answered meanwhile. A client (its address, or the
one a trusted reverse proxy forwards for: :class:`TrustedProxies`) has at most
:data:`PER_CLIENT` computations running at once; its further requests wait
their turn without holding a thread.

Pure-Python work holds the GIL, so on threads it still slows every request (a
checkpoint of 12,000 tiny tensors: a stored tree took 75-106x its time alone).
Such work runs in the pool's processes (:meth:`ComputePool.in_process`): up to
:data:`COMPUTE_WORKERS` children, started on first use (``spawn``, never a fork
of the threaded server), ignoring Ctrl-C (the server's shutdown stops them). The
calling pool thread waits on the child, so the per-client limit holds as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, TypeVar

from cmh import usable_cpus

from ._connections import TrustedProxies
from ._errors import HubError

if TYPE_CHECKING:
    from aiohttp import web

T = TypeVar("T")

#: Threads computing at once in one worker: the cores but one (a core stays free for the
#: requests: with both of 2 cores computing, a stored tree took 2-5x, and up to 100x
#: for Python-bound work, its time alone), at least one, at most two.
COMPUTE_WORKERS = max(1, min(2, usable_cpus() - 1))
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
        self._processes: ProcessPoolExecutor | None = None  # started on first use
        self._processes_lock = threading.Lock()

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

    def in_process(self, func: Callable[..., T], *args: Any) -> T:
        """``func(*args)`` in one of the pool's processes, waited for by the calling thread
        (a pool thread: ``func`` and ``args`` must pickle). What ``func`` raises is raised
        here; a child that died is a 503, and the next call starts new processes."""
        processes = self._process_pool()
        try:
            return processes.submit(func, *args).result()
        except BrokenProcessPool:
            with self._processes_lock:
                if self._processes is processes:  # a later call starts new ones
                    self._processes = None
            _stop(processes)
            raise HubError(
                503, "ComputeUnavailable", "a compute process died mid-work; try again"
            ) from None

    def _process_pool(self) -> ProcessPoolExecutor:
        with self._processes_lock:
            if self._processes is None:
                self._processes = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_ignore_interrupts,
                )
            return self._processes

    def client_of(self, request: web.BaseRequest) -> str:
        """Who asks, for the per-client limit: the peer's address, or the client a
        trusted proxy forwards for (``--trusted-proxy``)."""
        return self.proxies.client_of(request)

    def clients(self) -> int:
        """Clients with a computation running or waiting (for tests and metrics)."""
        return len(self._clients)

    def close(self) -> None:
        """Stop taking work; a computation under way is not waited for (its children end)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._processes_lock:
            processes, self._processes = self._processes, None
        if processes is not None:
            _stop(processes)


def _stop(processes: ProcessPoolExecutor) -> None:
    """Shut ``processes`` down without waiting for work under way: its children are ended
    (the executor has no public way before Python 3.14's ``terminate_workers``)."""
    children = list((getattr(processes, "_processes", None) or {}).values())
    processes.shutdown(wait=False, cancel_futures=True)
    for child in children:
        with contextlib.suppress(OSError, ValueError):  # gone already, or closed
            child.terminate()


def _ignore_interrupts() -> None:
    """In each child: Ctrl-C reaches the whole terminal's process group; the server
    handles it (a graceful shutdown), the children print nothing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
