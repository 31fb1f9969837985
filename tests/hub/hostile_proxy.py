"""A hostile Hub for the resolver hardening tests: a loopback proxy in front of ``cmh serve``.

``HostileProxy(upstream)`` forwards every request to a real mirror and records
what it saw (time, method, path, Range, Authorization, User-Agent, status).
Knobs, each off by default and changeable while it runs:

- ``rewrite_revision``: a function applied to the JSON of every
  ``/api/.../revision/...`` answer (a lying listing);
- ``ignore_range``: ``Range`` and ``If-Range`` are dropped from ``resolve``
  requests, so the mirror answers 200 with the whole file (``honour_ranges``:
  except the first N ranged requests);
- ``fail(contains, status, times, headers)``: the next ``times`` requests whose
  path contains ``contains`` get ``status`` with ``headers`` (429 with
  ``Retry-After``, a transient 500) instead of being forwarded;
- ``stall(contains, after, seconds)``: the next ``GET`` of a matching
  ``resolve`` path sends ``after`` body bytes, then nothing for ``seconds``
  (or until ``stop()``), then the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientSession, web
from loop_server import LoopServer

HOP = ("host", "content-length", "transfer-encoding", "connection")


@dataclass
class Seen:
    """One request as the proxy received it, and the status it answered."""

    at: float  # time.monotonic() when it arrived
    method: str
    path: str
    range: str | None
    authorization: str | None
    user_agent: str | None
    status: int = 0


@dataclass
class _Failure:
    contains: str
    status: int
    times: int
    headers: dict[str, str]


@dataclass
class _Stall:
    contains: str
    after: int
    seconds: float
    started: float | None = None  # time.monotonic() when the body stopped


class HostileProxy(LoopServer):
    """A loopback HTTP proxy in its own thread (``url``; ``stop()``)."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.rewrite_revision: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.ignore_range = False
        self.honour_ranges = 0
        self._ranged = 0
        self.seen: list[Seen] = []
        self._failures: list[_Failure] = []
        self._stalls: list[_Stall] = []
        self.stalls_done: list[_Stall] = []
        self._lock = threading.Lock()
        self.start()

    # -- knobs ---------------------------------------------------------------------------

    def fail(
        self, contains: str, status: int, times: int = 1, headers: dict[str, str] | None = None
    ) -> None:
        with self._lock:
            self._failures.append(_Failure(contains, status, times, dict(headers or {})))

    def stall(self, contains: str, after: int, seconds: float) -> None:
        with self._lock:
            self._stalls.append(_Stall(contains, after, seconds))

    def requests(self, contains: str = "", method: str | None = None) -> list[Seen]:
        with self._lock:
            return [
                s
                for s in self.seen
                if contains in s.path and (method is None or s.method == method)
            ]

    # -- server --------------------------------------------------------------------------

    async def on_start(self) -> None:
        self._stopping = asyncio.Event()
        self._session = ClientSession(auto_decompress=False)

    async def on_stop(self) -> None:
        self._stopping.set()
        await self._session.close()

    def _take_failure(self, path: str) -> _Failure | None:
        with self._lock:
            for f in self._failures:
                if f.contains in path and f.times > 0:
                    f.times -= 1
                    return f
        return None

    def _take_stall(self, method: str, path: str) -> _Stall | None:
        if method != "GET" or "/resolve/" not in path:
            return None
        with self._lock:
            for s in self._stalls:
                if s.contains in path:
                    self._stalls.remove(s)
                    self.stalls_done.append(s)
                    return s
        return None

    async def handler(self, request: web.Request) -> web.StreamResponse:
        seen = Seen(
            time.monotonic(),
            request.method,
            request.path,
            request.headers.get("Range"),
            request.headers.get("Authorization"),
            request.headers.get("User-Agent"),
        )
        with self._lock:
            self.seen.append(seen)
        failure = self._take_failure(request.path)
        if failure is not None:
            seen.status = failure.status
            return web.Response(status=failure.status, headers=failure.headers, text="injected")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        if self.ignore_range and "/resolve/" in request.path and "Range" in request.headers:
            with self._lock:
                self._ranged += 1
                ignore = self._ranged > self.honour_ranges
            if ignore:
                dropped = ("range", "if-range")
                headers = {k: v for k, v in headers.items() if k.lower() not in dropped}
        body = await request.read()
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers,
            data=body or None, allow_redirects=False,
        ) as up:  # fmt: skip
            payload = await up.read()
            out = {k: v for k, v in up.headers.items() if k.lower() not in HOP}
            status = up.status
        seen.status = status
        rewrite = self.rewrite_revision
        if rewrite is not None and "/revision/" in request.path and status == 200:
            payload = json.dumps(rewrite(json.loads(payload))).encode()
            out.pop("Content-Encoding", None)
        stall = self._take_stall(request.method, request.path) if status < 300 else None
        if stall is None or len(payload) <= stall.after:
            return web.Response(status=status, headers=out, body=payload)
        response = web.StreamResponse(status=status, headers=out)
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: stall.after])
        stall.started = time.monotonic()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), stall.seconds)
        try:
            await response.write(payload[stall.after :])
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client gave up on the stalled body, as it should
        return response
