"""Run the mirror: listening sockets, worker processes, signals.

One worker serves in the calling process. ``workers > 1`` forks that many
processes, each with its own listening socket on the same address
(``SO_REUSEPORT``: the kernel spreads connections across them); the parent
only reserves the port, forwards SIGTERM/SIGINT and reaps the workers. The
URL is printed once every worker listens.

Each worker caps its connections and times out slow headers and idle
connections (:mod:`cmh.hub.mirror._connections`); the cap defaults to what the
open-file limit allows. Links the mirror sends (tree pagination) use the
configured public URL, else the bound address, never a request's ``Host``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cmh.hub.cache import Clock, process_clock

if TYPE_CHECKING:
    from ._connections import TrustedProxies
    from .stores import MirrorStore
    from .web import PrunePreviewer
from ._upstream import UpstreamConfig

SHUTDOWN_TIMEOUT = 2.0
#: Threads of a worker's default executor, where the store is read (see ``main``).
STORE_THREADS = 32
#: Seconds past ``--graceful-timeout`` that aiohttp's own wait for a handler lasts: the
#: guard shuts every connection down at the timeout, and the handlers it ends must end
#: inside aiohttp's wait. (Had that wait timed out in the same instant, aiohttp would
#: cancel its waiter, and a handler ending just then would set the cancelled waiter's
#: result, logging an ``InvalidStateError`` traceback from aiohttp's ``web_protocol``.
#: A loaded run hit this.)
HANDLERS_END_WITHIN = 1.0
#: Seconds a worker gets to end on its own once its server has stopped (and past
#: ``--graceful-timeout`` + :data:`HANDLERS_END_WITHIN` after the signal in any case); then
#: it ends at once with status 0 (:func:`_end_by`), whatever its background threads (a
#: revalidation or a fill waiting on the upstream, which the interpreter would join) do.
#: Nothing is lost: what they write is written atomically, a partial download is resumed.
#: The parent of workers kills one still running :data:`EXIT_WITHIN` s later (:func:`_reap`).
EXIT_WITHIN = 1.0


class ServeError(Exception):
    """The server cannot start (bad address, store or tokens file)."""


@dataclass(frozen=True)
class ServeConfig:
    """How to run the mirror."""

    store: Path | str  # a folder, or a bucket store's s3:// URL
    host: str = "127.0.0.1"
    port: int = 8080
    tokens: Path | None = None
    workers: int = 1
    access_log: Path | None = None
    page_size: int = 1000
    public_url: str | None = None  # e.g. https://mirror.example.org/hf
    max_connections: int | None = None  # per worker; None: derived from RLIMIT_NOFILE
    header_timeout: float = 20.0
    idle_timeout: float = 30.0
    #: KiB/s a client must take a body at on average (past a grace): its total deadline
    min_send_rate: int = 128  # _connections.MIN_SEND_RATE
    upstream: UpstreamConfig | None = None  # pull-through: fill from this Hub (upstream.py)
    admin_tokens: Path | None = None  # the web pages' operator tokens
    keys: tuple[Path, ...] = ()  # trusted public keys for the web pages' stamp details
    announce: Callable[[str], None] = field(default=print)
    warn: Callable[[str], None] = field(default=lambda message: print(message, file=sys.stderr))
    blob_delivery: str = "proxy"  # proxy | redirect (bucket) | x-accel
    ref_ttl: float = 2.0  # bucket stores: how long a replica trusts a ref it read
    graceful_timeout: float = SHUTDOWN_TIMEOUT  # after SIGTERM/SIGINT: requests in flight
    public_storage_url: str | None = None  # redirect: the storage endpoint clients reach
    #: reverse proxies whose X-Forwarded-For names the client (addresses or networks)
    trusted_proxies: tuple[str, ...] = ()
    #: The operator page's dry runs of prune (the CLI passes prune's; the mirror imports no prune).
    prune_preview: PrunePreviewer | None = None


def public_url(text: str) -> str:
    """A ``--public-url`` checked and without its trailing ``/`` (``ServeError`` if unusable)."""
    url = text.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        usable = (
            parts.scheme in ("http", "https")
            and bool(parts.hostname)
            and parts.port != 0  # reading .port raises ValueError for a malformed one
            and not (parts.query or parts.fragment or parts.username is not None)
            and not any(c.isspace() for c in url)
        )
    except ValueError:
        usable = False
    if not usable:
        raise ServeError(
            f"invalid public URL {text!r}: give http(s)://host[:port][/path], "
            "without query, fragment or credentials"
        )
    return url


def _socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:  # '', 'not a host', 999.1.1.1
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ServeError(
            f"--host {host!r} is no address to listen on ({reason}): give an IP address "
            "(127.0.0.1, 0.0.0.0 for every interface, :: for every IPv6 one) or a host name "
            "that resolves"
        ) from None
    if not infos:
        raise ServeError(f"cannot resolve {host!r}")
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(config: ServeConfig) -> int:
    """Serve until SIGTERM or SIGINT; return the exit status."""
    from ._connections import DEFAULT_MAX_CONNECTIONS, connection_cap_limit

    store = _check_store(config)
    if config.public_url is not None:
        config = replace(config, public_url=public_url(config.public_url))
    if config.upstream is not None:
        try:
            url = public_url(config.upstream.url)
        except ServeError as exc:
            raise ServeError(str(exc).replace("public URL", "upstream URL")) from None
        config = replace(config, upstream=replace(config.upstream, url=url))
    if config.tokens is not None:
        from ._auth import TokensFileError, load_tokens, unserved_grants

        try:
            policy = load_tokens(config.tokens)  # fail before any worker starts
        except TokensFileError as exc:
            raise ServeError(str(exc)) from None
        policy = replace(policy, fold=config.upstream is not None)  # as each worker's
        from .stores import StoreUnavailable

        try:
            grants = unserved_grants(policy, store.repos())
        except StoreUnavailable as exc:
            raise ServeError(str(exc)) from None
        for grant in grants:
            config.warn(grant.message)
    limit = connection_cap_limit()
    cap = config.max_connections or min(DEFAULT_MAX_CONNECTIONS, limit)
    if cap > limit:
        config.warn(
            f"--max-connections {cap} does not fit the open-file limit "
            f"(ulimit -n); using {limit} per worker"
        )
        cap = limit
    config = replace(config, max_connections=cap)
    _pages(config)  # fail on a bad admin tokens or key file before any worker starts
    _proxies(config)
    if config.workers <= 1:
        sock = _socket(config.host, config.port, reuse_port=False)
        sock.listen(1024)
        return _run_worker(config, sock, lambda: config.announce(_url(sock)))
    return _run_workers(config)


def _check_store(config: ServeConfig) -> MirrorStore:
    """The store, checked servable, and the delivery checked one it can do, before listening.

    Each worker opens its own afterwards (:func:`_open_store`): an S3 client is not safe
    to use across ``fork()``.
    """
    if config.public_storage_url is not None:
        try:
            url = public_url(config.public_storage_url)
        except ServeError as exc:
            raise ServeError(str(exc).replace("public URL", "public storage URL")) from None
        config = replace(config, public_storage_url=url)
    store = _open_store(config)
    if config.upstream is not None:  # fills need what the store's pull-through needs
        from .stores import StoreError

        try:
            pull = store.pull_through(
                config.upstream.fresh_for, fill_lease_ttl=config.upstream.fill_lease_ttl
            )
            pull.check()
        except StoreError as exc:
            raise ServeError(str(exc)) from None
    if config.blob_delivery not in store.deliveries:
        raise ServeError(
            f"--blob-delivery {config.blob_delivery} does not apply to the store "
            f"{store.location} (use {' or '.join(store.deliveries)})"
        )
    return store


def _open_store(config: ServeConfig, clock: Clock | None = None) -> MirrorStore:
    """A worker's store, checked reachable (the folder or the bucket exists)."""
    from .stores import StoreError, open_store

    try:
        store = open_store(
            config.store,
            ref_ttl=config.ref_ttl,
            public_storage_url=config.public_storage_url,
            clock=clock,
        )
        store.check()
    except StoreError as exc:
        raise ServeError(str(exc)) from None
    return store


def _pages(config: ServeConfig) -> object:
    from cmh import CMHError

    from .web._options import web_options
    from .web._session import AdminTokensError

    try:
        return web_options(
            config.admin_tokens, config.keys, config.access_log, config.prune_preview
        )
    except (AdminTokensError, CMHError, OSError) as exc:
        raise ServeError(str(exc)) from None


def _proxies(config: ServeConfig) -> TrustedProxies:
    """``--trusted-proxy`` read (``ServeError`` for one that is no address or network)."""
    from ._connections import TrustedProxies

    try:
        return TrustedProxies.parse(config.trusted_proxies)
    except ValueError as exc:
        raise ServeError(f"--trusted-proxy: {exc}") from None


def _log_stream(config: ServeConfig) -> IO[str]:
    if config.access_log is None:
        return sys.stderr
    return open(config.access_log, "a", buffering=1, encoding="utf-8")


def _run_worker(config: ServeConfig, sock: socket.socket, on_ready: Callable[[], None]) -> int:
    from aiohttp import web

    from ._app import make_app
    from ._auth import AccessPolicy, load_tokens
    from ._compute import ComputePool
    from ._connections import ConnectionGuard, plain_errors
    from ._observe import AccessLogger, Metrics, configure
    from ._state import RECORDS_FRESH_FOR, MirrorState

    policy = load_tokens(config.tokens) if config.tokens else AccessPolicy()
    # With an upstream every case of a name is one repo (AccessPolicy.fold).
    policy = replace(policy, fold=config.upstream is not None)
    clock = process_clock()  # the worker's one clock, passed to all that measures time
    store = _open_store(config, clock)  # each worker has its own client and caches
    pull = None
    if config.upstream is not None:
        pull = store.pull_through(
            config.upstream.fresh_for, fill_lease_ttl=config.upstream.fill_lease_ttl
        )
    # the store's records (access, cuts): its pull-through side, also without --upstream
    records = pull if pull is not None else store.pull_through(RECORDS_FRESH_FOR)
    if config.upstream is None or not config.upstream.public_repos:
        # deny by default (upstream.py, "Access"): the access records of pull-through and
        # of `cmh mirror sync` keep what the upstream reads only with a token private
        policy = replace(policy, restricted=records.restricted)
    metrics = Metrics(store, private=policy.private, restricted=policy.is_private, clock=clock)
    stream = _log_stream(config)
    configure(metrics, stream)
    assert config.max_connections is not None
    guard = ConnectionGuard(
        config.max_connections,
        config.header_timeout,
        config.idle_timeout,
        on_drop=metrics.connection_dropped,
        clock=clock,
        min_send_rate=config.min_send_rate << 10,
    )
    state = MirrorState(
        store,
        policy,
        metrics,
        page_size=config.page_size,
        public_url=config.public_url or _bound_url(sock),
        guard=guard,
        body_timeout=config.header_timeout,
        clock=clock,
        records=records,
        compute=ComputePool(proxies=_proxies(config)),
    )
    state.delivery = config.blob_delivery
    if config.upstream is not None:
        from ._filling import Fills
        from ._upstream import Upstream

        state.upstream = Upstream(pull, config.upstream, clock)
        state.upstream.on_traffic = metrics.upstream_traffic
        state.fills = Fills(state.upstream)

    async def main() -> None:
        handler_args: dict[str, Any] = {
            "access_log_class": AccessLogger,
            "keepalive_timeout": 2 * config.idle_timeout,  # a backstop: the guard closes first
            "lingering_time": config.header_timeout,  # unread body after an answer: bounded alike
        }
        runner = web.AppRunner(
            make_app(state, _pages(config)),
            shutdown_timeout=config.graceful_timeout + HANDLERS_END_WITHIN,
            **handler_args,
        )
        await runner.setup()
        assert runner.server is not None
        loop = asyncio.get_running_loop()
        # The store's reads (a bucket's are requests to the storage) run on the default
        # executor: sized for waits, not for the cores (Python's default, the cores + 4,
        # let a storage stalling one key's reads hold every thread on a small machine).
        loop.set_default_executor(ThreadPoolExecutor(STORE_THREADS, "cmh-store"))
        protocol = guard.wrap(plain_errors(runner.server, handler_args))
        server = await loop.create_server(protocol, sock=sock, backlog=1024)
        sweeper = asyncio.create_task(guard.run())
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        on_ready()
        try:
            await stop.wait()
            _end_by(config.graceful_timeout + HANDLERS_END_WITHIN + EXIT_WITHIN, stream)
            if config.workers <= 1:  # with workers, the parent says it (_reap)
                _say_stopping(config.graceful_timeout)
        finally:
            sweeper.cancel()
            server.close()
            # aiohttp waits the shutdown timeout for requests in flight, then again as long
            # for the handlers it cancels (one stuck in a send to a client that does not
            # read waited both: 2 x --graceful-timeout). At the timeout, every connection
            # still open is shut down instead: the handlers end, the wait is the timeout
            # (aiohttp's own wait, HANDLERS_END_WITHIN longer, is only a backstop).
            cut = loop.call_later(config.graceful_timeout, guard.shut_all)
            try:
                await runner.cleanup()
            finally:
                cut.cancel()
            if stop.is_set():
                _end_by(EXIT_WITHIN, stream)

    try:
        asyncio.run(main())
    finally:
        sock.close()
        if stream is not sys.stderr:
            stream.close()
    return 0


def _end_by(seconds: float, stream: IO[str]) -> None:
    """End the process with status 0 in ``seconds`` unless it has ended by then: a stopped
    server's threads still waiting on the upstream do not hold it (see :data:`EXIT_WITHIN`)."""

    def end() -> None:
        from cmh import remove_temporaries

        remove_temporaries()  # os._exit runs no finally block
        for out in (stream, sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                out.flush()
        os._exit(0)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()


def _bound_url(sock: socket.socket) -> str | None:
    """``http://host:port`` of a socket bound to one address; None for a wildcard bind."""
    host = sock.getsockname()[0]
    if host in ("0.0.0.0", "::"):
        return None  # each connection's own local address is used instead
    return _url(sock)


def _run_workers(config: ServeConfig) -> int:
    metrics_dir = Path(tempfile.mkdtemp(prefix="cmh-mirror-metrics-"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    reserve = _socket(config.host, config.port, reuse_port=True)  # bound, never listening
    port = reserve.getsockname()[1]
    ready_r, ready_w = os.pipe()
    children: list[int] = []
    try:
        for _ in range(config.workers):
            pid = os.fork()
            if pid == 0:  # worker
                code = 1
                try:
                    os.close(ready_r)
                    reserve.close()
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    sock = _socket(config.host, port, reuse_port=True)
                    sock.listen(1024)
                    code = _run_worker(config, sock, lambda: _signal_ready(ready_w))
                except ServeError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                finally:
                    os._exit(code)
            children.append(pid)
        os.close(ready_w)
        ready = 0
        while ready < config.workers:
            chunk = os.read(ready_r, config.workers)
            if not chunk:
                raise ServeError("a worker failed to start")
            ready += len(chunk)
        config.announce(_url(reserve))
        return _reap(children, config.graceful_timeout)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.close(ready_r)
        reserve.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _signal_ready(fd: int) -> None:
    os.write(fd, b"1")
    os.close(fd)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _say_stopping(graceful_timeout: float) -> None:
    """The line a person sees when SIGTERM or Ctrl-C stops the server."""
    with contextlib.suppress(OSError, ValueError):
        print(
            f"stopping: no new connections; requests in flight get up to "
            f"{graceful_timeout:g} s (--graceful-timeout)",
            file=sys.stderr,
            flush=True,
        )


def _reap(children: list[int], graceful_timeout: float) -> int:
    """Wait for SIGTERM/SIGINT (forwarded to the workers) or a worker's death.

    A worker still running ``graceful_timeout`` + :data:`HANDLERS_END_WITHIN` + twice
    :data:`EXIT_WITHIN` s after the signal is killed (it ends itself before: :func:`_end_by`).
    """
    stopping = False

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping
        if not stopping:
            _say_stopping(graceful_timeout)
            deadline = threading.Timer(
                graceful_timeout + HANDLERS_END_WITHIN + 2 * EXIT_WITHIN, _kill, (list(children),)
            )
            deadline.daemon = True
            deadline.start()
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    alive = set(children)
    status = 0
    while alive:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            break
        alive.discard(pid)
        if not stopping:
            print(f"error: mirror worker {pid} exited; stopping", file=sys.stderr)
            status = 1
            forward(signal.SIGTERM, None)
        elif os.waitstatus_to_exitcode(code) not in (0, -signal.SIGTERM):
            status = 1
    children.clear()
    return status
