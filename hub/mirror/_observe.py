"""Mirror observability: Prometheus metrics and one JSON access-log line per request.

With several worker processes, metrics use ``prometheus_client``'s
multiprocess mode: :mod:`cmh.hub.mirror._run` sets ``PROMETHEUS_MULTIPROC_DIR``
before the workers start, and ``/metrics`` then aggregates every worker's
values.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import unquote_plus

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, RequestKey, Response, StreamResponse
from cmh.hub.cache import SYSTEM_CLOCK, Clock
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ._auth import repo_key

if TYPE_CHECKING:
    from .stores import MirrorStore

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Keys a handler sets on the request for the access log and metrics.
ROUTE_KEY = RequestKey("cmh_route", str)
BYTES_KEY = RequestKey("cmh_bytes", int)
RANGE_KEY = RequestKey("cmh_range", str)
INFO_KEY = RequestKey("cmh_info", dict[str, Any])


class StoreSizeCollector(Collector):
    """``cmh_mirror_store_bytes`` and ``cmh_mirror_store_repos``, measured at most every 10 s.

    Only public repos are counted: ``/metrics`` answers anyone, and a private
    repo must not show even by its size.
    """

    def __init__(
        self,
        store: MirrorStore,
        max_age: float = 10.0,
        private: frozenset[str] = frozenset(),
        restricted: Callable[[str, str], bool] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.max_age = max_age
        self.clock = clock
        self.private = private
        self.restricted = restricted  # also private (AccessPolicy.restricted)
        self._lock = threading.Lock()
        self._at = 0.0
        self._value = (0, 0)

    def _measure(self) -> tuple[int, int]:
        from .stores import StoreUnavailable

        def left_out(kind: str, repo_id: str) -> bool:
            if repo_key(kind, repo_id) in self.private:
                return True
            return self.restricted is not None and self.restricted(kind, repo_id)

        try:
            return self.store.size(left_out)
        except StoreUnavailable:
            return self._value  # the last measure stands until the storage answers again

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self.clock.monotonic() - self._at > self.max_age:
                self._value = self._measure()
                self._at = self.clock.monotonic()
            size, repos = self._value
        yield GaugeMetricFamily(
            "cmh_mirror_store_bytes", "Bytes of blobs of the public repos in the store", size
        )
        yield GaugeMetricFamily("cmh_mirror_store_repos", "Public repos in the store", repos)


class Metrics:
    """The mirror's request metrics."""

    def __init__(
        self,
        store: MirrorStore | None,
        private: frozenset[str] = frozenset(),
        restricted: Callable[[str, str], bool] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``store``: the store whose size is reported (``None``: none reported);
        ``private`` and ``restricted`` say which repos it leaves out
        (:class:`~cmh.hub.mirror._auth.AccessPolicy`); ``clock``: the server's, for the
        size's age and the access log's times."""
        self.clock = clock
        self.registry = CollectorRegistry()
        self.multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        count = self._counter
        self.requests = count(
            "cmh_mirror_requests",
            "Requests by route, method and status",
            "route",
            "method",
            "status",
        )
        self.bytes_sent = count(
            "cmh_mirror_response_bytes", "Response body bytes sent, by route", "route"
        )
        self.ranges = count(
            "cmh_mirror_range_requests",
            "Requests carrying a Range header, by outcome (single, multi, full, unsatisfiable)",
            "kind",
        )
        self.dropped = count(
            "cmh_mirror_connections_dropped",
            "Connections closed by the limits, by reason "
            "(refused, evicted, header_timeout, idle, stalled)",
            "reason",
        )
        self.latency = Histogram(
            "cmh_mirror_request_duration_seconds",
            "Time from request to last byte handed to the kernel, by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upstream_requests = count(
            "cmh_mirror_upstream_requests", "Requests a pull-through mirror made to its upstream"
        )
        self.upstream_bytes = count(
            "cmh_mirror_upstream_bytes",
            "Body bytes a pull-through mirror received from its upstream",
        )
        self.store_collector = (
            StoreSizeCollector(store, private=private, restricted=restricted, clock=clock)
            if store is not None
            else None
        )
        if not self.multiprocess and self.store_collector is not None:
            self.registry.register(self.store_collector)

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, list(labels), registry=self.registry)

    def observe(
        self, route: str, method: str, status: int, nbytes: int, seconds: float, range_kind: str
    ) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.bytes_sent.labels(route).inc(nbytes)
        self.latency.labels(route).observe(seconds)
        if range_kind:
            self.ranges.labels(range_kind).inc()

    def connection_dropped(self, reason: str) -> None:
        self.dropped.labels(reason).inc()

    def upstream_traffic(self, requests: int, nbytes: int) -> None:
        """Count what a pull-through fill or revalidation cost the upstream."""
        self.upstream_requests.inc(requests)
        self.upstream_bytes.inc(nbytes)

    def exposition(self) -> bytes:
        """The Prometheus text of every worker's metrics and the store size."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        if self.store_collector is not None:
            registry.register(self.store_collector)
        return generate_latest(registry)


_metrics: Metrics | None = None
_log_stream: IO[str] = sys.stderr


def configure(metrics: Metrics, log_stream: IO[str]) -> None:
    """Set the metrics and log stream the access logger of this process writes to."""
    global _metrics, _log_stream
    _metrics, _log_stream = metrics, log_stream


#: Query parameters whose values never reach the access log: any whose decoded name
#: holds one of these words (credentials, signed-URL signatures, sessions).
_SECRET_PARAM_RE = re.compile(r"token|key|secret|passw|auth|sig|credential|session|cookie", re.I)
REDACTED = "REDACTED"


def redact_target(target: str) -> str:
    """``target`` with the value of every secret-looking query parameter replaced."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    items = []
    for item in query.split("&"):
        name, eq, _ = item.partition("=")
        if eq and _SECRET_PARAM_RE.search(unquote_plus(name, errors="replace")):
            item = f"{name}={REDACTED}"
        items.append(item)
    return f"{path}?{'&'.join(items)}"


def _body_bytes(request: BaseRequest, response: StreamResponse) -> int:
    """The body bytes of an answer no file delivery counted (documents, errors, pages):
    aiohttp's ``body_length`` counts the status line and headers too (spec 2.8: body bytes).
    """
    if request.method == "HEAD" or response.status in (204, 304) or response.status < 200:
        return 0
    sent = max(response.body_length, 0)
    if isinstance(response, Response) and isinstance(response.body, (bytes, bytearray)):
        return min(len(response.body), sent)  # at most what went out (a client that left)
    length = response.content_length
    return min(length, sent) if length is not None else sent


def _clip(value: str | None, limit: int = 512) -> str | None:
    return None if value is None else value[:limit]


class AccessLogger(AbstractAccessLogger):
    """aiohttp access logger: records metrics and writes one JSON line per request."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        try:
            route = str(request.get(ROUTE_KEY, "invalid"))
            nbytes = request.get(BYTES_KEY)
            if not isinstance(nbytes, int):
                nbytes = _body_bytes(request, response)
            range_kind = str(request.get(RANGE_KEY, ""))
            info: dict[str, Any] = dict(request.get(INFO_KEY) or {})
        except Exception:
            route, nbytes, range_kind, info = "invalid", 0, "", {}
        if _metrics is not None:
            _metrics.observe(route, request.method, response.status, nbytes, time, range_kind)
        line = {
            "ts": round(_now(), 3),
            "pid": os.getpid(),
            "remote": request.remote,
            "method": request.method,
            "target": _clip(redact_target(request.raw_path), 2048),
            "route": route,
            "status": response.status,
            "bytes": nbytes,
            "duration_ms": round(time * 1000, 3),
            "range": _clip(request.headers.get("Range"), 256),
            "user_agent": _clip(request.headers.get("User-Agent"), 256),
            **info,
        }
        try:
            _log_stream.write(json.dumps(line, ensure_ascii=True) + "\n")
            _log_stream.flush()
        except (OSError, ValueError):
            pass


def _now() -> float:
    return (_metrics.clock if _metrics is not None else SYSTEM_CLOCK).time()
