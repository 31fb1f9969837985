"""A Hub-faithful front for tests: huggingface.co's HTTP behaviour in front of ``cmh serve``.

:class:`HubLike` runs two aiohttp servers on 127.0.0.1 (free ports) in a background
thread with its own event loop, and talks to a running ``cmh serve`` only over HTTP:

- the *hub* origin (``.url``, the ``HF_ENDPOINT``) forwards the Hub API. A ``resolve``
  of an LFS file (its ETag is a 64-hex SHA-256) is answered, GET and HEAD alike, with a
  302 to the *cdn* origin carrying ``X-Repo-Commit``, ``X-Linked-Etag``,
  ``X-Linked-Size`` and ``Location``; the location holds a signed query string
  (``Expires`` + ``Signature`` = HMAC-SHA256 over path and expiry) valid
  ``url_lifetime`` seconds. Small files are served directly (``ETag`` = git blob id,
  gzip-encoded when the client accepts it and asks for no range). Tree listings are
  re-paginated ``page_size`` entries a page with ``Link: <...>; rel="next"``. LFS entries
  of tree and paths-info answers carry ``xetHash`` (as Xet-backed repos do) while the
  bytes stay on plain HTTP; no ``X-Xet-Hash`` header or ``xet-auth`` link is ever sent.
  Two knobs give small files other shapes huggingface.co has answered with:
  ``resolve_cache`` (a relative 307 to ``/api/resolve-cache/...`` carrying ``ETag`` and
  ``X-Repo-Commit`` but no ``X-Linked-Size``, its ``Content-Length`` its own body's: the
  shape of huggingface_hub issue 4698) and ``compress_head`` (a HEAD answered as its GET
  would be, gzip-encoded when the client accepts gzip, with the compressed
  ``Content-Length``: why the stock client asks ``identity``, huggingface_hub PR 1449).
- the *cdn* origin checks signature and expiry (403 otherwise), serves one range with
  206, answers a multi-range request with 200 and the whole body (never multipart).

Every request at either origin is recorded (:class:`Record`). Faults are small knobs,
each consumed per matching request (see :meth:`HubLike.fail`, :meth:`HubLike.stall`,
:meth:`HubLike.cut`, :meth:`HubLike.corrupt`, ``ignore_range``, ``edit_json``,
``url_lifetime`` = 0 to expire signed URLs at once).

Written by hand rather than with a proxy library: the faults must act inside the
body stream (stall, cut, wrong bytes) and on the decoded JSON, which generic proxies
do not expose.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import hmac
import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from deadline_support import TEST_DEADLINE

Origin = str  # "hub" | "cdn"
JsonHook = Callable[[str, str, Any], Any]  # (kind, request path, document) -> document

DEFAULT_PAGE_SIZE = 3
DEFAULT_URL_LIFETIME = 3600.0
STOP_TIMEOUT = 5.0
_CHUNK = 1 << 16
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_RESOLVE_RE = re.compile(
    r"^(?P<prefix>/(?:datasets/|spaces/)?(?:[^/]+/[^/]+|[^/]+))/resolve/"
    r"(?P<rev>refs/pr/\d+|[^/]+)/(?P<path>.+)$"
)
_RESOLVE_CACHE_RE = re.compile(
    r"^/api/resolve-cache/(?P<kind>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)/"
    r"(?P<commit>[0-9a-f]{40})/(?P<path>.+)$"
)
_TREE_RE = re.compile(r"^/api/(?:models|datasets|spaces)/.+/tree/")
_PATHS_INFO_RE = re.compile(r"^/api/(?:models|datasets|spaces)/.+/paths-info/[^/]+$")
_REPO_INFO_RE = re.compile(r"^/api/(?:models|datasets|spaces)/[^/]+(?:/[^/]+)?(?:/revision/.+)?$")
_CDN_RE = re.compile(r"^/repos/[0-9a-f]{2}/[0-9a-f]{2}/(?P<sha>[0-9a-f]{64})$")
_FLIP = bytes(255 - i for i in range(256))
_FORWARDED = ("Authorization", "Range", "If-Range", "If-None-Match", "Content-Type")
_DROPPED = {
    "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding",
    "date", "server",
}  # fmt: skip


@dataclass(frozen=True)
class Record:
    """One request as an origin saw it."""

    origin: Origin
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # request headers, names lower-cased
    status: int
    bytes_sent: int  # body bytes written (compressed bytes for a gzip answer)
    response_headers: dict[str, str]  # names lower-cased
    aborted: bool = False  # the connection was cut (on purpose, or by the client)
    seq: int = 0  # arrival order across both origins


@dataclass
class _Fault:
    kind: str  # status | stall | cut
    origin: Origin
    times: int
    path: re.Pattern[str] | None
    method: str | None
    status: int = 0
    retry_after: int | None = None
    after_bytes: int = 0
    seconds: float = 0.0

    def matches(self, origin: Origin, method: str, path: str) -> bool:
        return (
            self.times > 0
            and self.origin == origin
            and (self.method is None or self.method == method)
            and (self.path is None or self.path.search(path) is not None)
        )


@dataclass
class _BodyPlan:
    flip: bool = False
    flip_at: int | None = None  # one byte of the body inverted at this offset
    stall_at: int | None = None
    stall_seconds: float = 0.0
    cut_at: int | None = None
    drip: _Drip | None = None


@dataclass
class _Drip:
    """Past ``after_bytes``, a body trickles (64 KiB each 0.25 s: never silent long enough
    for a client to give up) until ``until`` is set or ``seconds`` have passed."""

    after_bytes: int
    until: threading.Event
    seconds: float


@dataclass
class _CdnEntry:
    prefix: str  # "/org/name" or "/datasets/org/name"
    commit: str
    path: str  # percent-encoded file path
    authorization: str | None


@dataclass
class _Exchange:
    """What the recording middleware reads back from a handler."""

    bytes_sent: int = 0
    aborted: bool = False


_EXCHANGE_KEY = web.RequestKey("hublike_exchange", _Exchange)


@dataclass
class HubLike:
    """The front; use :func:`running` (or ``start``/``stop``) around a test.

    ``backend`` is the base URL of a running ``cmh serve``. Knobs (attributes) may be
    changed at any time from the test thread: ``page_size``, ``url_lifetime`` (seconds;
    0 or less expires every signed URL at once), ``ignore_range`` (both origins answer
    200 with the whole body), ``xet_listing`` (add ``xetHash`` to LFS entries),
    ``edit_json`` (a hook ``(kind, path, doc) -> doc`` applied to ``tree``,
    ``paths_info`` and ``repo_info`` answers before pagination), ``resolve_cache`` and
    ``compress_head`` (small files' other answer shapes, see the module's text).
    """

    backend: str
    page_size: int = DEFAULT_PAGE_SIZE
    url_lifetime: float = DEFAULT_URL_LIFETIME
    ignore_range: bool = False
    xet_listing: bool = True
    edit_json: JsonHook | None = None
    resolve_cache: bool = False
    compress_head: bool = False
    url: str = ""
    cdn_url: str = ""
    _secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _records: list[Record] = field(default_factory=list)
    _faults: list[_Fault] = field(default_factory=list)
    _corrupt: set[str] = field(default_factory=set)
    _flip_once: dict[str, list[int]] = field(default_factory=dict)  # etag -> [times, offset]
    _drip: _Drip | None = None  # every CDN GET trickles past a point until an event
    _gated: dict[str, frozenset[str]] = field(default_factory=dict)  # repo id -> readers
    _hidden: dict[str, frozenset[str]] = field(default_factory=dict)  # repo id -> readers
    _cdn: dict[str, _CdnEntry] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runners: list[web.AppRunner] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None
    _in_flight: int = 0
    _arrivals: int = 0

    # -- knobs -----------------------------------------------------------------------------

    def fail(
        self,
        status: int,
        times: int = 1,
        *,
        origin: Origin = "hub",
        path: str | None = None,
        method: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Answer the next ``times`` matching requests with ``status`` (e.g. 429, 500).

        ``path`` is a regex searched in the request path; ``retry_after`` adds
        ``Retry-After: S``. Requests after that pass as usual.
        """
        self._add(_Fault("status", origin, times, _re(path), method, status, retry_after))

    def stall(
        self,
        after_bytes: int,
        seconds: float,
        times: int = 1,
        *,
        origin: Origin = "cdn",
        path: str | None = None,
    ) -> None:
        """Send ``after_bytes`` body bytes, then nothing for ``seconds`` (connection open)."""
        self._add(
            _Fault(
                "stall", origin, times, _re(path), "GET", after_bytes=after_bytes, seconds=seconds
            )
        )

    def drip(
        self, after_bytes: int, until: threading.Event, seconds: float = 120.0, *,
        origin: Origin = "cdn",
    ) -> None:  # fmt: skip
        """Every next GET of ``origin``: ``after_bytes`` body bytes, then a trickle until
        ``until`` is set (or ``seconds`` passed), then the rest at full speed. A test holds
        a transfer unfinished until it has seen what it waits for, whatever the load."""
        with self._lock:
            self._drip = _Drip(after_bytes, until, seconds)

    def cut(
        self, after_bytes: int, times: int = 1, *, origin: Origin = "cdn", path: str | None = None
    ) -> None:
        """Send ``after_bytes`` body bytes, then close the connection."""
        self._add(_Fault("cut", origin, times, _re(path), "GET", after_bytes=after_bytes))

    def corrupt(self, etag: str) -> None:
        """Serve the blob whose ETag is ``etag`` with every byte inverted (same length)."""
        with self._lock:
            self._corrupt.add(etag)

    def gate(self, repo_id: str, readers: frozenset[str] = frozenset()) -> None:
        """Make model ``repo_id`` gated as the Hub does: its info is public and says
        ``"gated": "manual"``; its files and ``auth-check`` answer ``GatedRepo``, 401
        without ``Authorization`` and 403 with one not in ``readers`` (full header values),
        in huggingface.co's words."""
        with self._lock:
            self._gated[repo_id] = readers

    def hide(self, repo_id: str, readers: frozenset[str] = frozenset()) -> None:
        """Make model ``repo_id`` private as the Hub does: every request of it (files and
        API) answers ``RepoNotFound``, 401 without ``Authorization`` and 404 with one not
        in ``readers``, as huggingface.co answers for a repo it does not show that client."""
        with self._lock:
            self._hidden[repo_id] = readers

    def _gate_refusal(self, request: web.Request) -> web.Response | None:
        with self._lock:
            gated = dict(self._gated)
            hidden = dict(self._hidden)
        path = request.path
        for repo_id, readers in hidden.items():
            mine = path.startswith((f"/{repo_id}/", f"/api/models/{repo_id}/"))
            authorization = request.headers.get("Authorization")
            if (mine or path == f"/api/models/{repo_id}") and authorization not in readers:
                message = "Repository not found"
                return web.json_response(
                    {"error": message},
                    status=401 if authorization is None else 404,
                    headers={"X-Error-Code": "RepoNotFound", "X-Error-Message": message},
                )
        for repo_id, readers in gated.items():
            files = path.startswith(f"/{repo_id}/resolve/")
            check = path == f"/api/models/{repo_id}/auth-check"
            authorization = request.headers.get("Authorization")
            if (files or check) and authorization not in readers:
                status, message = (
                    403,
                    (
                        f"Access to model {repo_id} is restricted and you are not in the "
                        f"authorized list. Visit {self.url}/{repo_id} to ask for access."
                    ),
                )
                if authorization is None:
                    status, message = (
                        401,
                        (
                            f"Access to model {repo_id} is restricted. You must have access to "
                            "it and be authenticated to access it. Please log in."
                        ),
                    )
                return web.json_response(
                    {"error": message},
                    status=status,
                    headers={"X-Error-Code": "GatedRepo", "X-Error-Message": message},
                )
        return None

    def flip_byte(self, etag: str, offset: int, times: int = 1) -> None:
        """Invert the byte at ``offset`` of the next ``times`` GET bodies of ``etag``."""
        with self._lock:
            self._flip_once[etag] = [times, offset]

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take(self, kind: str, origin: Origin, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind == kind and fault.matches(origin, method, path):
                    fault.times -= 1
                    return fault
        return None

    # -- observation -----------------------------------------------------------------------

    def records(
        self, origin: Origin | None = None, method: str | None = None, path: str | None = None
    ) -> list[Record]:
        """Answered requests in arrival order; ``path`` is a regex searched in the path."""
        pattern = _re(path)
        with self._lock:
            answered = sorted(self._records, key=lambda r: r.seq)
            return [
                r
                for r in answered
                if (origin is None or r.origin == origin)
                and (method is None or r.method == method)
                and (pattern is None or pattern.search(r.path))
            ]

    def clear_faults(self) -> None:
        """Forget every fault not consumed yet (a front shared by several tests)."""
        with self._lock:
            self._faults.clear()
            self._corrupt.clear()
            self._flip_once.clear()
            self._drip = None

    def clear_records(self) -> None:
        with self._lock:
            self._records.clear()

    def wait_idle(self, timeout: float = TEST_DEADLINE) -> None:
        """Return once no request is being answered (a stalled one may outlive its client)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._in_flight == 0:
                    return
            time.sleep(0.02)
        raise TimeoutError("hublike front still answering requests")

    @property
    def cdn_saw_authorization(self) -> bool:
        """Whether any request at the CDN origin carried an ``Authorization`` header."""
        return any("authorization" in r.headers for r in self.records(origin="cdn"))

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> HubLike:
        """Start both origins; returns once they accept connections."""
        started = threading.Event()
        errors: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_servers())
            except BaseException as exc:  # reported to the starting thread
                errors.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="hublike", daemon=True)
        self._thread.start()
        if not started.wait(TEST_DEADLINE) or errors:
            raise RuntimeError(f"hublike front did not start: {errors}")
        return self

    async def _start_servers(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )
        for origin, handler in (("hub", self._hub), ("cdn", self._cdn_handler)):
            app = web.Application(middlewares=[self._recorder(origin)], client_max_size=1 << 20)
            app.router.add_route("*", "/{tail:.*}", handler)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self._runners.append(runner)
            port = int(runner.addresses[0][1])
            if origin == "hub":
                self.url = f"http://127.0.0.1:{port}"
            else:
                self.cdn_url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        """Stop both origins and the thread, bounded in time."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        async def shutdown() -> None:
            for runner in self._runners:
                with suppress(Exception):
                    await asyncio.wait_for(runner.cleanup(), STOP_TIMEOUT)
            if self._session is not None:
                await self._session.close()

        future = asyncio.run_coroutine_threadsafe(shutdown(), loop)
        with suppress(Exception):
            future.result(STOP_TIMEOUT * 2)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_TIMEOUT)

    # -- recording -------------------------------------------------------------------------

    def _recorder(self, origin: Origin) -> Any:
        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            exchange = _Exchange()
            request[_EXCHANGE_KEY] = exchange
            with self._lock:
                self._in_flight += 1
                self._arrivals += 1
                seq = self._arrivals
            response: web.StreamResponse | None = None
            try:
                try:
                    response = await handler(request)
                except aiohttp.ClientError as exc:  # cmh serve unreachable or gone
                    response = web.Response(status=502, text=f"backend: {exc}")
                return response
            finally:
                entry = Record(
                    origin=origin,
                    method=request.method,
                    path=request.path,
                    query=dict(request.query),
                    headers={k.lower(): v for k, v in request.headers.items()},
                    status=response.status if response is not None else 0,
                    bytes_sent=exchange.bytes_sent,
                    response_headers={k.lower(): v for k, v in response.headers.items()}
                    if response is not None
                    else {},
                    aborted=exchange.aborted,
                    seq=seq,
                )
                with self._lock:
                    self._records.append(entry)
                    self._in_flight -= 1

        return record

    # -- hub origin ------------------------------------------------------------------------

    async def _hub(self, request: web.Request) -> web.StreamResponse:
        early = self._status_fault("hub", request) or self._gate_refusal(request)
        if early is not None:
            return early
        resolve = _RESOLVE_RE.match(request.raw_path.partition("?")[0])
        if resolve is not None and request.method in ("GET", "HEAD"):
            return await self._resolve(request, resolve)
        cached = _RESOLVE_CACHE_RE.match(request.raw_path.partition("?")[0])
        if cached is not None and request.method in ("GET", "HEAD"):
            kind, repo = cached.group("kind"), cached.group("repo")
            prefix = f"/{repo}" if kind == "models" else f"/{kind}/{repo}"
            target = f"{prefix}/resolve/{cached.group('commit')}/{cached.group('path')}"
            match = _RESOLVE_RE.match(target)
            assert match is not None
            return await self._resolve(request, match, target)
        path = request.path
        if _TREE_RE.match(path) and request.method == "GET":
            return await self._tree(request)
        if _PATHS_INFO_RE.match(path) and request.method == "POST":
            return await self._json(request, "paths_info")
        if _REPO_INFO_RE.match(path) and request.method == "GET":
            return await self._json(request, "repo_info")
        return await self._forward(request)

    def _status_fault(self, origin: Origin, request: web.Request) -> web.Response | None:
        fault = self._take("status", origin, request.method, request.path)
        if fault is None:
            return None
        headers = {"X-Error-Message": f"injected {fault.status}"}
        if fault.retry_after is not None:
            headers["Retry-After"] = str(fault.retry_after)
        body = json.dumps({"error": f"injected {fault.status}"}).encode()
        return web.Response(
            status=fault.status, body=body, headers=headers, content_type="application/json"
        )

    def _backend_headers(self, request: web.Request, *, keep_range: bool = True) -> dict[str, str]:
        headers = {"Accept-Encoding": "identity"}
        for name in _FORWARDED:
            if name in request.headers and (keep_range or name not in ("Range", "If-Range")):
                headers[name] = request.headers[name]
        return headers

    async def _backend(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None = None
    ) -> aiohttp.ClientResponse:
        assert self._session is not None
        return await self._session.request(
            method, self.backend + target, headers=headers, data=body, allow_redirects=False
        )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else None
        upstream = await self._backend(
            request.method, request.raw_path, self._backend_headers(request), body
        )
        async with upstream:
            data = await upstream.read()
            return web.Response(
                status=upstream.status,
                body=data if request.method != "HEAD" else None,
                headers=_copy(upstream),
            )

    async def _resolve(
        self, request: web.Request, match: re.Match[str], cached: str | None = None
    ) -> web.StreamResponse:
        """A ``resolve`` request (``cached``: the resolve path a resolve-cache URL names)."""
        raw = cached if cached is not None else request.raw_path
        head = await self._backend("HEAD", raw, self._backend_headers(request, keep_range=False))
        async with head:
            headers = _copy(head)
            size = head.headers.get("Content-Length")
        linked = headers.get("X-Linked-Etag", "").strip('"')
        if head.status != 200:  # errors keep the backend's typed answer (and JSON body)
            if request.method == "GET":
                return await self._forward(request)
            return web.Response(status=head.status, headers=headers)
        if _SHA256_RE.match(linked):
            return self._redirect(request, match, headers, linked)
        headers.pop("X-Linked-Etag", None)
        headers.pop("X-Linked-Size", None)
        if self.resolve_cache and cached is None:
            etag = headers.get("ETag") or (f'"{linked}"' if linked else "")
            return self._resolve_cache_redirect(request, match, headers, etag)
        if request.method == "HEAD" and self.compress_head:
            return await self._compressed_head(request, raw, headers)
        if request.method == "HEAD":
            response = web.StreamResponse(status=200, headers=headers)
            if size is not None:
                response.headers["Content-Length"] = size
            await response.prepare(request)
            await response.write_eof()
            return response
        keep_range = not self.ignore_range
        upstream = await self._backend(
            "GET", raw, self._backend_headers(request, keep_range=keep_range)
        )
        async with upstream:
            etag = upstream.headers.get("ETag", "").strip('"')
            gzip_it = (
                upstream.status == 200
                and "gzip" in request.headers.get("Accept-Encoding", "")
                and "Range" not in request.headers
            )
            return await self._relay(request, upstream, "hub", etag, gzip_it)

    def _redirect(
        self, request: web.Request, match: re.Match[str], headers: dict[str, str], sha: str
    ) -> web.Response:
        commit = headers.get("X-Repo-Commit", "")
        path = match.group("path")
        filename = path.rsplit("/", 1)[-1]
        with self._lock:
            self._cdn[sha] = _CdnEntry(
                match.group("prefix"), commit, path, request.headers.get("Authorization")
            )
        cdn_path = f"/repos/{sha[:2]}/{sha[2:4]}/{sha}"
        expires = math.floor(time.time() + self.url_lifetime)
        query = urlencode(
            {
                "response-content-disposition": f"inline; filename*=UTF-8''{filename}",
                "Expires": str(expires),
                "Signature": self._sign(cdn_path, expires),
            }
        )
        location = f"{self.cdn_url}{cdn_path}?{query}"
        out = {
            "X-Repo-Commit": commit,
            "X-Linked-Etag": f'"{sha}"',
            "X-Linked-Size": headers.get("X-Linked-Size", ""),
            "Location": location,
            "Content-Type": "text/plain; charset=utf-8",
        }
        body = None if request.method == "HEAD" else f"Found. Redirecting to {location}".encode()
        return web.Response(status=302, headers=out, body=body)

    def _resolve_cache_redirect(
        self, request: web.Request, match: re.Match[str], headers: dict[str, str], etag: str
    ) -> web.Response:
        """A small file's relative 307 to the resolve cache: ``ETag`` and ``X-Repo-Commit``,
        no ``X-Linked-Size``; its ``Content-Length`` (HEAD too) is its own body's."""
        prefix, commit = match.group("prefix"), headers.get("X-Repo-Commit", "")
        kind, _, repo = prefix.lstrip("/").partition("/")
        if kind not in ("datasets", "spaces"):
            kind, repo = "models", prefix.lstrip("/")
        location = f"/api/resolve-cache/{kind}/{repo}/{commit}/{match.group('path')}"
        body = f"Temporary Redirect. Redirecting to {location}".encode()
        out = {
            "Location": location,
            "ETag": etag,
            "X-Repo-Commit": commit,
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Length": str(len(body)),
        }
        if request.method == "HEAD":
            return web.Response(status=307, headers=out)
        return web.Response(status=307, headers=out, body=body)

    async def _compressed_head(
        self, request: web.Request, raw: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        """A small file's HEAD answered as its GET: gzip (a weak ETag, the compressed
        ``Content-Length``) when the client accepts gzip, else as it is."""
        upstream = await self._backend("GET", raw, self._backend_headers(request, keep_range=False))
        async with upstream:
            data = await upstream.read()
        response = web.StreamResponse(status=200, headers=headers)
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            data = gzip.compress(data)
            response.headers["Content-Encoding"] = "gzip"
            response.headers["ETag"] = "W/" + headers.get("ETag", "").removeprefix("W/")
        response.headers["Content-Length"] = str(len(data))
        await response.prepare(request)
        await response.write_eof()
        return response

    def _sign(self, path: str, expires: int) -> str:
        return hmac.new(self._secret, f"{path}\n{expires}".encode(), hashlib.sha256).hexdigest()

    async def _json(self, request: web.Request, kind: str) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else None
        upstream = await self._backend(
            request.method, request.raw_path, self._backend_headers(request), body
        )
        async with upstream:
            data = await upstream.read()
            headers = _copy(upstream)
            status = upstream.status
        if status != 200:
            return web.Response(status=status, body=data, headers=headers)
        doc = json.loads(data)
        if kind == "paths_info" and self.xet_listing:
            doc = [_with_xet(e) for e in doc]
        if self.edit_json is not None:
            doc = self.edit_json(kind, request.path, doc)
        with self._lock:
            gated = set(self._gated)
        if kind == "repo_info" and isinstance(doc, dict) and doc.get("id") in gated:
            doc["gated"] = "manual"
        headers["Content-Type"] = "application/json"
        return web.Response(status=200, body=json.dumps(doc).encode(), headers=headers)

    async def _tree(self, request: web.Request) -> web.StreamResponse:
        """The whole listing from the backend (its own pages followed), re-paginated here."""
        query = {k: v for k, v in request.query.items() if k != "cursor"}
        base = request.raw_path.partition("?")[0]
        target: str | None = f"{base}?{urlencode(query)}" if query else base
        entries: list[Any] = []
        headers: dict[str, str] = {}
        while target is not None:
            upstream = await self._backend("GET", target, self._backend_headers(request))
            async with upstream:
                data = await upstream.read()
                if upstream.status != 200:
                    return web.Response(status=upstream.status, body=data, headers=_copy(upstream))
                headers = _copy(upstream)
                entries.extend(json.loads(data))
                nxt = upstream.links.get("next")
                url = None if nxt is None else nxt.get("url")
                target = None if url is None else str(url).removeprefix(self.backend)
        headers.pop("Link", None)
        if self.xet_listing:
            entries = [_with_xet(e) for e in entries]
        if self.edit_json is not None:
            entries = self.edit_json("tree", request.path, entries)
        start = _decode_cursor(request.query.get("cursor", ""))
        if start is None:
            return web.json_response(
                {"error": "invalid cursor"}, status=400, headers={"X-Error-Code": "BadRequest"}
            )
        size = max(1, self.page_size)
        page = entries[start : start + size]
        if start + size < len(entries):
            link = (
                f"{self.url}{base}?{urlencode({**query, 'cursor': _encode_cursor(start + size)})}"
            )
            headers["Link"] = f'<{link}>; rel="next"'
        headers["Content-Type"] = "application/json"
        return web.Response(status=200, body=json.dumps(page).encode(), headers=headers)

    # -- cdn origin ------------------------------------------------------------------------

    async def _cdn_handler(self, request: web.Request) -> web.StreamResponse:
        early = self._status_fault("cdn", request)
        if early is not None:
            return early
        if request.method not in ("GET", "HEAD"):
            return _denied(405, "MethodNotAllowed")
        match = _CDN_RE.match(request.path)
        expires_text = request.query.get("Expires", "")
        signature = request.query.get("Signature", "")
        if match is None or not expires_text.isdigit():
            return _denied(403, "AccessDenied")
        expires = int(expires_text)
        if not hmac.compare_digest(signature, self._sign(request.path, expires)):
            return _denied(403, "SignatureDoesNotMatch")
        if time.time() >= expires:
            return _denied(403, "Request has expired")
        sha = match.group("sha")
        with self._lock:
            entry = self._cdn.get(sha)
        if entry is None:
            return _denied(404, "NoSuchKey")
        headers = {"Accept-Encoding": "identity"}
        if entry.authorization is not None:  # the CDN's own access to the store
            headers["Authorization"] = entry.authorization
        range_header = request.headers.get("Range")
        if range_header is not None and not self.ignore_range and "," not in range_header:
            headers["Range"] = range_header
        target = f"{entry.prefix}/resolve/{entry.commit}/{entry.path}"
        upstream = await self._backend(request.method, target, headers)
        async with upstream:
            return await self._relay(request, upstream, "cdn", sha, False)

    # -- bytes -----------------------------------------------------------------------------

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        origin: Origin,
        etag: str,
        gzip_it: bool,
    ) -> web.StreamResponse:
        """Stream the backend's answer to the client, applying the body faults."""
        exchange: _Exchange = request[_EXCHANGE_KEY]
        headers = _copy(upstream)
        if origin == "hub":  # a small file: the Hub sends its ETag only
            headers.pop("X-Linked-Etag", None)
            headers.pop("X-Linked-Size", None)
        if origin == "cdn":
            for name in list(headers):
                if name.lower().startswith("x-") or name.lower() == "content-disposition":
                    del headers[name]
            disposition = request.query.get("response-content-disposition")
            if disposition:
                headers["Content-Disposition"] = disposition
            headers["ETag"] = f'"{etag}"'
        response = web.StreamResponse(status=upstream.status, headers=headers)
        if request.method == "HEAD" or upstream.status not in (200, 206):
            data = await upstream.read()
            if request.method == "HEAD":
                length = upstream.headers.get("Content-Length")
                if length is not None:
                    response.headers["Content-Length"] = length
                await response.prepare(request)
                await response.write_eof()
                return response
            return web.Response(status=upstream.status, body=data, headers=headers)
        plan = self._body_plan(origin, request, etag)
        if gzip_it:
            data = await upstream.read()
            if plan.flip:
                data = data.translate(_FLIP)
            packed = gzip.compress(data)
            response.headers["Content-Encoding"] = "gzip"
            response.enable_chunked_encoding()
            await response.prepare(request)
            await self._send(request, response, [packed], plan, exchange)
            return response
        length = upstream.headers.get("Content-Length")
        if length is not None:
            response.content_length = int(length)
        await response.prepare(request)
        chunks = upstream.content.iter_chunked(_CHUNK)
        await self._send(request, response, chunks, plan, exchange)
        return response

    def _body_plan(self, origin: Origin, request: web.Request, etag: str) -> _BodyPlan:
        plan = _BodyPlan()
        with self._lock:
            plan.flip = etag in self._corrupt
            once = self._flip_once.get(etag)
            if once is not None and once[0] > 0 and request.method == "GET":
                once[0] -= 1
                plan.flip_at = once[1]
        stall = self._take("stall", origin, request.method, request.path)
        if stall is not None:
            plan.stall_at, plan.stall_seconds = stall.after_bytes, stall.seconds
        cut = self._take("cut", origin, request.method, request.path)
        if cut is not None:
            plan.cut_at = cut.after_bytes
        if origin == "cdn" and request.method == "GET":
            with self._lock:
                plan.drip = self._drip
        return plan

    async def _send(
        self,
        request: web.Request,
        response: web.StreamResponse,
        chunks: Any,
        plan: _BodyPlan,
        exchange: _Exchange,
    ) -> None:
        try:
            if isinstance(chunks, list):
                for chunk in chunks:
                    if await self._send_chunk(request, response, chunk, plan, exchange):
                        return
            else:
                async for chunk in chunks:
                    if await self._send_chunk(request, response, chunk, plan, exchange):
                        return
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError, asyncio.CancelledError):
            exchange.aborted = True

    async def _send_chunk(
        self,
        request: web.Request,
        response: web.StreamResponse,
        chunk: bytes,
        plan: _BodyPlan,
        exchange: _Exchange,
    ) -> bool:
        """Write one chunk; True when the connection was cut on purpose."""
        drip = plan.drip
        if drip is not None and exchange.bytes_sent + len(chunk) > drip.after_bytes:
            loop = asyncio.get_running_loop()
            end = loop.time() + drip.seconds
            head = max(0, drip.after_bytes - exchange.bytes_sent)
            await response.write(chunk[:head])
            exchange.bytes_sent += head
            chunk = chunk[head:]
            while chunk and not drip.until.is_set() and loop.time() < end:
                await response.write(chunk[: 64 << 10])
                exchange.bytes_sent += len(chunk[: 64 << 10])
                chunk = chunk[64 << 10 :]
                await asyncio.sleep(0.25)
            if drip.until.is_set() or loop.time() >= end:
                plan.drip = None
            if not chunk:
                return False
        if plan.flip:
            chunk = chunk.translate(_FLIP)
        at = plan.flip_at
        if at is not None and exchange.bytes_sent <= at < exchange.bytes_sent + len(chunk):
            i = at - exchange.bytes_sent
            chunk = chunk[:i] + chunk[i : i + 1].translate(_FLIP) + chunk[i + 1 :]
        if plan.stall_at is not None and exchange.bytes_sent + len(chunk) > plan.stall_at:
            head = max(0, plan.stall_at - exchange.bytes_sent)
            await response.write(chunk[:head])
            exchange.bytes_sent += head
            chunk = chunk[head:]
            # A stalled body is a fault of real seconds: the client's read timeout sees it.
            await asyncio.sleep(plan.stall_seconds)
            plan.stall_at = None
            if request.transport is None or request.transport.is_closing():
                exchange.aborted = True  # the client gave up meanwhile
                return True
        if plan.cut_at is not None and exchange.bytes_sent + len(chunk) >= plan.cut_at:
            head = max(0, plan.cut_at - exchange.bytes_sent)
            await response.write(chunk[:head])
            exchange.bytes_sent += head
            exchange.aborted = True
            if request.transport is not None:
                request.transport.close()
            return True
        await response.write(chunk)
        exchange.bytes_sent += len(chunk)
        return False


@contextmanager
def running(backend: str, **knobs: Any) -> Iterator[HubLike]:
    """A started :class:`HubLike` in front of ``backend``, stopped on exit."""
    front = HubLike(backend.rstrip("/"), **knobs)
    front.start()
    try:
        yield front
    finally:
        front.stop()


def xet_stand_in(sha256: str) -> str:
    """The ``xetHash`` listed for an LFS file: 64 hex derived from its SHA-256.

    A stand-in: the front implements no Xet protocol, so the value only marks the
    entry as Xet-backed, the way the real Hub lists such files.
    """
    return hashlib.sha256(f"xet:{sha256}".encode()).hexdigest()


def _with_xet(entry: Any) -> Any:
    if isinstance(entry, dict) and isinstance(entry.get("lfs"), dict) and "oid" in entry["lfs"]:
        return {**entry, "xetHash": xet_stand_in(str(entry["lfs"]["oid"]))}
    return entry


def _copy(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED}


def _denied(status: int, code: str) -> web.Response:
    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code></Error>"
    return web.Response(status=status, text=body, content_type="application/xml")


def _re(pattern: str | None) -> re.Pattern[str] | None:
    return None if pattern is None else re.compile(pattern)


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"hublike:{offset}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int | None:
    if not cursor:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        tag, _, offset = raw.partition(":")
        value = int(offset)
    except ValueError:
        return None
    return value if tag == "hublike" and value >= 0 else None
