"""HTTP transport to a Hub (the real one or a ``cmh serve`` mirror).

Only talks HTTP and decodes answers: which requests to make, and when, is the
resolver's business. Every request and every body byte received is counted so
that a :class:`~cmh.hub.Resolution` can report what it cost. Proxies come from
the environment (``HTTP(S)_PROXY``, ``NO_PROXY``), like the stock client.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import email.utils
import fcntl
import logging
import os
import re
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeGuard, TypeVar
from urllib.parse import quote

import httpcore2
import httpx2
from cmh.hub.cache import (
    COMMIT_RE,
    ETAG_RE,
    REPO_TYPE_PREFIX,
    SYSTEM_CLOCK,
    Clock,
    LayoutError,
    json_value,
    validate_relpath,
)

from cmh import __version__

from ._answers import MAX_KEPT_BODY, ApiAnswer
from ._credentials import credential_digest, default_endpoint
from ._multipart import MultipartParser
from ._origins import MAX_REDIRECTS, OriginRule, UnsafeRedirect
from ._retry import DEFAULT_RETRY, RetryPolicy
from ._types import (
    AccessError,
    AnswerTooLarge,
    HubProtocolError,
    HubUnreachableError,
    InvalidListing,
    NoSuchEndpoint,
    NotFoundError,
    RemoteFile,
    RemoteRevision,
    ResolveError,
)

T = TypeVar("T")

#: Bounds on what a Hub sends (issue 23): an API answer once decoded, the files of one
#: listing, a listed name (bytes: the whole path, and one segment, as filesystems allow).
MAX_API_BYTES = 32 << 20
#: Characters of a Hub's error message kept (a 30 MiB ``error`` field would be held by
#: every answer that passes it on).
MAX_MESSAGE = 1024
#: A body transfer may last its idle timeout plus one second per this many bytes received:
#: a sender dripping bytes (which never trips the idle timeout) is given up on, a slow but
#: real link is not (its transfer is resumed where it stopped).
MIN_TRANSFER_RATE = 16 << 10
#: API answers a client keeps for :mod:`~cmh.hub.resolver._answers` (the first ones).
MAX_ANSWERS_KEPT = 16
#: How early a metadata deadline on the network clock counts as passed (the last try's
#: socket timeout ends at it, give or take the scheduler).
DEADLINE_SLACK = 0.1
MAX_LISTED_FILES = 100_000
MAX_PATH_BYTES = 4096
MAX_SEGMENT_BYTES = 255
#: The largest size a listing may give a file: 1 PiB (no disk holds more, and a size past
#: 2**63 is no file offset: reading it raised OverflowError).
MAX_FILE_SIZE = 1 << 50
#: Control characters (C0, DEL, C1): never in a listed name.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

logger = logging.getLogger("cmh.hub")

_clients: dict[tuple[str | None, float, int], httpx2.Client] = {}
_clients_lock = threading.Lock()


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment, read now (else ``default``)."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def download_timeout() -> float:
    """``HF_HUB_DOWNLOAD_TIMEOUT`` (default 10 s): how long a transfer may stay silent."""
    return env_seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10.0)


def max_api_bytes() -> int:
    """``CMH_MAX_API_BYTES``: the largest API answer accepted once decoded (1 MiB to
    :data:`MAX_API_BYTES`; default and above it: :data:`MAX_API_BYTES`), read now."""
    value = env_seconds("CMH_MAX_API_BYTES", MAX_API_BYTES)
    return int(min(MAX_API_BYTES, max(1 << 20, value)))


def metadata_timeout() -> float:
    """``HF_HUB_ETAG_TIMEOUT`` (default 10 s): how long a metadata request may take."""
    return env_seconds("HF_HUB_ETAG_TIMEOUT", 10.0)


def process_age() -> float:
    """Seconds since this process started (interpreter start and imports included), from
    the kernel's record of its start (``/proc/self/stat``); 0 where that is not known."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        # Field 22 (starttime, clock ticks since boot); fields counted after the ")" that
        # ends the command name (which may hold spaces).
        started = int(stat.rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


@dataclass(frozen=True)
class ServedFile:
    """What ``resolve`` of one path at one commit says the file is (headers of a HEAD)."""

    etag: str | None  # X-Linked-Etag, else ETag (quotes and W/ removed); None if absent
    size: int | None  # X-Linked-Size, else Content-Length (not a redirect's nor compressed)
    commit: str | None  # X-Repo-Commit


#: The request extension holding a request's :class:`_Chain` (kept across its redirects).
_CHAIN = "cmh_chain"


class _Chain:
    """One request and the redirects it leads to: the rule, the token, the last URL."""

    def __init__(self, rule: OriginRule, token: str | None, file_request: bool) -> None:
        self.rule = rule
        self.token = token
        self.file_request = file_request
        self.last: str | None = None
        self.hops = 0


def _apply_rule(request: httpx2.Request) -> None:
    """The client's request hook, run for every request and every redirect it follows:
    refuse a hop the rule forbids; ``Authorization`` only to the endpoint's origin."""
    chain = request.extensions.get(_CHAIN)
    request.headers.pop("Authorization", None)
    if not isinstance(chain, _Chain):
        return
    url = str(request.url)
    if chain.last is not None:
        chain.hops += 1
        if chain.hops > MAX_REDIRECTS:
            raise UnsafeRedirect(f"{url}: more than {MAX_REDIRECTS} redirects")
        chain.rule.hop(chain.last, url, chain.file_request)
    chain.last = url
    if chain.token and chain.rule.carries_token(url):
        request.headers["Authorization"] = f"Bearer {chain.token}"


def user_agent() -> str:
    """``cmh/VERSION``, with ``; origin/...`` from ``HF_HUB_USER_AGENT_ORIGIN`` as the stock
    client adds it (so a mirror's log attributes the resolver's requests as the stock ones)."""
    origin = os.environ.get("HF_HUB_USER_AGENT_ORIGIN")
    return f"cmh/{__version__}" + (f"; origin/{origin}" if origin else "")


def _shared_client(token: str | None, timeout: float) -> httpx2.Client:
    """One pooled HTTP client per token and process (building one costs ~0.1 s of TLS setup).

    The token is not a default header: :func:`_apply_rule` adds it per request."""
    key = (token, timeout, os.getpid())
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            headers = {"User-Agent": user_agent()}
            limits = httpx2.Limits(max_connections=32, max_keepalive_connections=8)
            transport = httpx2.HTTPTransport(trust_env=True, limits=limits)
            pool = transport._pool
            if isinstance(pool, httpcore2.ConnectionPool):  # every read sees the deadline
                pool._network_backend = _DeadlineBackend(pool._network_backend)
            client = httpx2.Client(
                headers=headers,
                event_hooks={"request": [_apply_rule]},
                follow_redirects=True,
                trust_env=True,
                timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)),
                limits=limits,
                transport=transport,
            )
            if not _clients:
                atexit.register(_close_clients)
            _clients[key] = client
        return client


#: Network deadlines are kept on the real monotonic clock: a socket's timeout is the
#: kernel's, which no injected clock moves (the tries' budget is on the policy's clock).
_network_now = SYSTEM_CLOCK.monotonic

#: The ``_network_now()`` by which the request under way in this thread must be done
#: (``None``: only its idle timeouts): checked at every read from the network, so an
#: answer whose headers come a byte at a time ends at its deadline too.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "cmh_http_deadline", default=None
)


@contextlib.contextmanager
def total_deadline(deadline: float) -> Iterator[None]:
    """Every network read made inside ends by ``deadline`` (a ``_network_now()`` value)."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


#: Bytes asked of a connection per read, at least. httpcore2 asks 64 KiB, and every read
#: goes through h11 in Python: 1 GiB from a mirror on loopback took 16,384 reads over
#: eight connections taking turns at the GIL (2.7 s, 1.9 s of it in the kernel); with
#: 1 MiB, 1.6-1.9 s and half the system time. A read returns what the socket holds, up
#: to this; h11 keeps what it has not parsed yet, so a larger read changes no answer.
#: Plain connections only: a TLS read returns one record (16 KiB) whatever is asked, and
#: asking 1 MiB doubled the client's CPU there (a buffer that large allocated per record).
READ_BYTES = 1 << 20


class _DeadlineStream(httpcore2.NetworkStream):
    """A connection whose reads wait no later than the thread's :data:`_deadline` and ask
    for ``read_at_least`` bytes at least (:data:`READ_BYTES` on a plain connection)."""

    def __init__(self, inner: httpcore2.NetworkStream, read_at_least: int = 0) -> None:
        self._inner = inner
        self._read_at_least = read_at_least

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        deadline = _deadline.get()
        if deadline is not None:
            left = deadline - _network_now()
            if left <= 0:
                raise httpcore2.ReadTimeout("the request's total deadline has passed")
            timeout = left if timeout is None else min(timeout, left)
        return self._inner.read(max(max_bytes, self._read_at_least), timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.NetworkStream:
        tls = self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _DeadlineStream(tls)  # reads of what httpcore2 asks: a TLS record at a time

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore2.NetworkBackend):
    """The pool's network backend, its connections' reads bounded by :data:`_deadline`."""

    def __init__(self, inner: httpcore2.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore2.NetworkStream:
        return _DeadlineStream(self._inner.connect_tcp(*args, **kwargs), READ_BYTES)

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore2.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(*args, **kwargs), READ_BYTES)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _close_clients() -> None:
    with _clients_lock:
        for client in _clients.values():
            client.close()
        _clients.clear()


#: Compression where the body is not range-addressed (API answers, whole small files);
#: ``identity`` where offsets matter (ranges, resumes, multi-range).
COMPRESSED = {"Accept-Encoding": "gzip"}
IDENTITY = {"Accept-Encoding": "identity"}


def _wire(response: httpx2.Response) -> tuple[int, int]:
    """Requests sent and body bytes received for ``response``, redirects included.

    A redirect (a 302 to a CDN) and the request it leads to are two requests;
    bytes are counted as they came over the wire (compressed, if they were).
    """
    chain = [*response.history, response]
    return len(chain), sum(r.num_bytes_downloaded for r in chain)


def _origin(url: str | httpx2.URL) -> tuple[str, str, int | None]:
    parsed = httpx2.URL(url)
    return parsed.scheme, parsed.host, parsed.port


class Located:
    """A ``resolve`` URL and, once an answer to it came through a redirect, where it led.

    The chunks and ranges of one file are then asked from there (the Hub's
    signed CDN URL) instead of costing a redirect each. The Hub's token is
    never sent to that URL when it lies on another origin than the endpoint
    (as when the redirect is followed); a failure there (an expired
    signature) sends the next try through the ``resolve`` URL again.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._direct: str | None = None
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        """The URL the next request goes to."""
        with self._lock:
            return self._direct or self.url

    def landed(self, final: str) -> None:
        """An answer to :attr:`url` came from ``final`` after redirects."""
        with self._lock:
            if self._direct is None and final != self.url:
                self._direct = final

    def forget(self, used: str) -> None:
        """``used`` failed: go through :attr:`url` again."""
        with self._lock:
            if self._direct == used:
                self._direct = None


class RangeNotSatisfied(HubProtocolError):
    """The server did not answer a Range request with the range asked for."""


@contextlib.contextmanager
def _asking(url: str | Located) -> Iterator[tuple[Located | None, str]]:
    """(the :class:`Located`, the URL to ask now); a failure at a reused redirect target
    forgets it and becomes transient, so the retry goes through the ``resolve`` URL."""
    located = url if isinstance(url, Located) else None
    target = located.current if located is not None else str(url)
    try:
        yield located, target
    except (AccessError, NotFoundError, HubProtocolError, HubUnreachableError) as exc:
        if located is None or target == located.url or isinstance(exc, RangeNotSatisfied):
            raise
        located.forget(target)
        raise HubUnreachableError(f"{exc} (from the redirected URL; asking again)") from exc


class HubClient:
    """A counting HTTP client for one endpoint."""

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | None = None,
        *,
        timeout: float | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        clock: Clock | None = None,
        answer_by: float | None = None,
        done_by: float | None = None,
    ) -> None:
        """``answer_by``: a ``clock.monotonic()`` time by which the endpoint must have
        answered one metadata request (:attr:`Policy.started` plus
        ``HF_HUB_ETAG_TIMEOUT``: a Hub that never answers costs that budget from the
        process's start, not from the first request); none after its first answer.
        ``done_by``: a ``clock.monotonic()`` time by which every metadata request of this
        client is done, however many (a walk's total budget: a mirror's revalidation);
        each try ends by it and none starts past it (:class:`HubUnreachableError`)."""
        self.endpoint = (endpoint or default_endpoint()).rstrip("/")
        # A transfer silent this long fails (read timeout) and is resumed by its caller.
        self.timeout = timeout if timeout is not None else download_timeout()
        self.retry = retry if clock is None else replace(retry, clock=clock)  # its waits
        self.answer_by = answer_by  # until the endpoint's first answer
        self.done_by = done_by  # for all the metadata requests
        self.token = token or None
        self.rule = OriginRule(self.endpoint)  # where redirects may lead (origins.py)
        self._client = _shared_client(token, self.timeout)
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_received = 0
        #: The API answers received, for the stored answers of install()'s hook (answers.py).
        self.answers: list[ApiAnswer] = []
        #: The commit a revision answer named (``None`` until one did): a Hub answered.
        self.named: str | None = None

    # -- bookkeeping ---------------------------------------------------------------------

    def _chain(self, file_request: bool) -> dict[str, Any]:
        """The extensions of a request that carries the credential rule (origins.py)."""
        return {_CHAIN: _Chain(self.rule, self.token, file_request)}

    def _count(self, requests: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes_received += nbytes

    def _count_answer(self, response: httpx2.Response) -> None:
        """Count the request of a streamed answer and the redirects before it (with bodies)."""
        self._count(
            requests=len(response.history) + 1,
            nbytes=sum(r.num_bytes_downloaded for r in response.history),
        )

    def _answered(self, response: httpx2.Response) -> None:
        """Count a streamed answer; an error status is read, counted and raised."""
        self._count_answer(response)
        if response.status_code >= 400:
            response.read()
            self._count(nbytes=response.num_bytes_downloaded)
            raise_for_status(response)

    def _count_unread(self, response: httpx2.Response) -> None:
        """Count the body bytes of an answer given up unread that already reached this host.

        What the HTTP parser holds is read (only when the socket has bytes
        waiting, so this never blocks), then the socket's receive queue is
        added: the bytes the server sent that arrived before the close.
        """
        before = response.num_bytes_downloaded
        if _waiting(response):
            with contextlib.suppress(httpx2.HTTPError, httpx2.StreamError):
                next(response.iter_raw(), b"")
        self._count(nbytes=response.num_bytes_downloaded - before + _waiting(response))

    def close(self) -> None:
        """Nothing to release: connections are pooled per process (see ``_shared_client``)."""

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _open(self, url: str, headers: dict[str, str]) -> Iterator[httpx2.Response]:
        """A streamed GET of ``url``; the token goes to the endpoint's origin only."""
        request = self._client.build_request(
            "GET", url, headers=headers, extensions=self._chain(True)
        )
        # The answer's headers within the idle timeout in all (the body has its own bound).
        with total_deadline(_network_now() + self.timeout):
            response = self._client.send(request, stream=True)
        try:
            yield response
        finally:
            response.close()

    def _landed(self, located: Located | None, target: str, response: httpx2.Response) -> None:
        """Remember where a redirected answer of ``located`` came from (another origin only)."""
        if located is not None and target == located.url and response.history:
            final = str(response.url)
            if _origin(final) != _origin(self.endpoint):
                located.landed(final)

    # -- URLs ----------------------------------------------------------------------------

    def api_url(self, repo_id: str, repo_type: str, *parts: str) -> str:
        base = f"{self.endpoint}/api/{REPO_TYPE_PREFIX[repo_type]}/{repo_id}"
        return "/".join([base, *parts])

    def file_url(self, repo_id: str, repo_type: str, commit: str, path: str) -> str:
        """The ``resolve`` URL of ``path`` at ``commit``."""
        prefix = "" if repo_type == "model" else f"{REPO_TYPE_PREFIX[repo_type]}/"
        return (
            f"{self.endpoint}/{prefix}{repo_id}/resolve/{quote(commit, safe='')}/"
            f"{quote(validate_relpath(path))}"
        )

    # -- requests ------------------------------------------------------------------------

    def _metadata_budget(self) -> tuple[float, float, float]:
        """A metadata request's (budget, deadline on the retry clock, the same deadline on
        the network clock): ``HF_HUB_ETAG_TIMEOUT`` from now for all its tries, no later
        than :attr:`answer_by` while the endpoint has not answered yet, nor :attr:`done_by`
        (past it: :class:`HubUnreachableError`, no request made)."""
        budget = metadata_timeout()
        now = self.retry.clock.monotonic()
        deadline = now + budget
        if self.answer_by is not None:
            deadline = min(deadline, self.answer_by)
        if self.done_by is not None:
            if now >= self.done_by:
                raise HubUnreachableError(
                    f"{self.endpoint}: the total time given to these requests has passed",
                    transient=False,
                )
            deadline = min(deadline, self.done_by)
        return budget, deadline, _network_now() + (deadline - now)

    def _run_metadata(
        self, once: Callable[[], T], what: str, deadline: float, net_deadline: float
    ) -> T:
        """``once`` under the retry policy by ``deadline`` (``net_deadline`` on the network
        clock); a Hub that gives no answer by :attr:`answer_by` is told as such, and one
        that answers lifts it."""
        try:
            result = self.retry.run(once, what, deadline)
        except HubUnreachableError as exc:
            # The budget from the process's start ran out: not when no connection could
            # be made at all (refused, no such host), which is raised at once, untried again.
            # Said only when that deadline really passed: answers that kept failing before
            # it (5xx, truncated bodies) are named by the last error instead.
            if (
                exc.transient
                and self.answer_by is not None
                and deadline >= self.answer_by
                and (
                    self.retry.clock.monotonic() >= deadline
                    or _network_now() >= net_deadline - DEADLINE_SLACK
                )
            ):
                raise HubUnreachableError(
                    f"{self.endpoint}: no answer within HF_HUB_ETAG_TIMEOUT "
                    f"({metadata_timeout():g} s) of the process's start: {exc}",
                    exc.retry_after,
                    transient=exc.transient,
                ) from exc
            raise
        except ResolveError:
            self.answer_by = None  # the Hub answered (a refusal is an answer)
            raise
        self.answer_by = None
        return result

    def _get_json(
        self, url: str, params: dict[str, str] | None = None
    ) -> tuple[Any, httpx2.Response]:
        """GET an API answer, tried again under the retry policy (429, 5xx, network), all
        tries within one ``HF_HUB_ETAG_TIMEOUT`` (a blackholed Hub costs 10 s, not 60)."""
        budget, deadline, net_deadline = self._metadata_budget()  # for all the tries

        def once() -> tuple[Any, httpx2.Response]:
            request = self._client.build_request(
                "GET",
                url,
                params=params,
                headers=COMPRESSED,
                timeout=max(0.1, min(budget, deadline - self.retry.clock.monotonic())),
                extensions=self._chain(False),
            )
            try:
                with total_deadline(net_deadline):
                    response = self._client.send(request, stream=True)
            except httpx2.TransportError as exc:
                self._count(requests=1)
                raise _unreachable(self.endpoint, exc) from exc
            try:
                with total_deadline(net_deadline):
                    body = _read_capped(response, url, net_deadline)
            except httpx2.TransportError as exc:
                raise _unreachable(self.endpoint, exc) from exc
            finally:
                response.close()
                sent, received = _wire(response)
                self._count(requests=sent, nbytes=received)
            raise_for_status(response)
            try:
                obj = json_value(body)
            except ValueError as exc:
                raise HubProtocolError(f"{url} did not answer JSON: {exc}") from exc
            if len(self.answers) < MAX_ANSWERS_KEPT and len(body) <= MAX_KEPT_BODY:
                headers = tuple(response.headers.items())
                credential = credential_digest(response.request.headers.get("authorization"))
                self.answers.append(ApiAnswer(str(response.request.url), headers, body, credential))
            return obj, response

        return self._run_metadata(once, f"GET {url}", deadline, net_deadline)

    def served(self, url: str) -> ServedFile:
        """HEAD ``url`` (a ``resolve`` URL) and read what it says the file is, as the stock
        client's ``get_hf_file_metadata`` reads it.

        Asked with ``Accept-Encoding: identity`` (a compressed answer's ``Content-Length``
        is not the file's size). A redirect within the endpoint's origin is followed (a
        relative 307 of the Hub's resolve cache or of a renamed repo, whatever headers it
        carries); one to another origin that carries the file's ETag (the Hub's 302 to its
        CDN) is read, not followed; others are, up to 5 hops. A redirect's
        ``Content-Length`` is its own body's, never the file's size. Tried again under the
        retry policy.
        """

        budget, deadline, net_deadline = self._metadata_budget()  # for all the tries

        def once() -> ServedFile:
            target = url
            chain = self._chain(True)  # one chain across the hops followed here
            for _ in range(MAX_REDIRECTS + 1):
                self._count(requests=1)
                try:
                    with total_deadline(net_deadline):
                        response = self._client.head(
                            target,
                            headers=IDENTITY,
                            follow_redirects=False,
                            timeout=max(0.1, min(budget, deadline - self.retry.clock.monotonic())),
                            extensions=chain,
                        )
                except httpx2.TransportError as exc:
                    raise _unreachable(self.endpoint, exc) from exc
                headers = response.headers
                etag = headers.get("X-Linked-Etag") or headers.get("ETag")
                if response.is_redirect and "Location" in headers:
                    hop = str(response.url.join(headers["Location"]))
                    if not etag or _origin(hop) == _origin(self.endpoint):
                        target = hop
                        continue
                raise_for_status(response)
                return ServedFile(
                    etag=etag.strip().removeprefix("W/").strip('"') if etag else None,
                    size=_served_size(response),
                    commit=headers.get("X-Repo-Commit"),
                )
            raise HubProtocolError(f"{url}: too many redirects")

        return self._run_metadata(once, f"HEAD {url}", deadline, net_deadline)

    def revision(self, repo_id: str, repo_type: str, revision: str) -> RemoteRevision:
        """Resolve ``revision`` to a commit (one request); lists blobs if the Hub does."""
        url = self.api_url(repo_id, repo_type, "revision", quote(revision, safe=""))
        obj, _ = self._get_json(url, params={"blobs": "true"})
        if not isinstance(obj, dict) or not isinstance(obj.get("sha"), str):
            raise HubProtocolError(f"{url}: answer has no commit 'sha'")
        commit = obj["sha"]
        if not COMMIT_RE.match(commit):
            raise HubProtocolError(f"{url}: {commit!r} is not a commit")
        self.named = commit
        return RemoteRevision(
            commit,
            _files_from_siblings(obj.get("siblings")),
            private=obj.get("private") is True,
            gated=obj.get("gated") not in (None, False, "false", "False"),
            repo_id=obj["id"] if isinstance(obj.get("id"), str) else None,
        )

    def auth_check(self, repo_id: str, repo_type: str) -> None:
        """``GET .../auth-check``: returns when the token may read the repo's files, else
        raises the Hub's refusal (:class:`AccessError` with its status, code and message)."""
        self._get_json(self.api_url(repo_id, repo_type, "auth-check"))

    def tree(self, repo_id: str, repo_type: str, commit: str) -> dict[str, RemoteFile]:
        """Every file of ``commit`` (follows ``Link: rel="next"`` pages)."""
        url: str | None = self.api_url(repo_id, repo_type, "tree", commit)
        params: dict[str, str] | None = {"recursive": "true"}
        files: dict[str, RemoteFile] = {}
        pages = 0
        while url is not None:
            pages += 1
            if pages > 10_000:
                raise HubProtocolError("tree listing does not end")
            obj, response = self._get_json(url, params=params)
            if not isinstance(obj, list):
                raise HubProtocolError(f"{url}: tree answer is not a list")
            for entry in obj:
                remote = _file_from_tree_entry(entry)
                if remote is not None:
                    files[remote.path] = remote
            if len(files) > MAX_LISTED_FILES:
                raise InvalidListing(f"{url}: more than {MAX_LISTED_FILES} files listed")
            nxt = response.links.get("next", {}).get("url")
            url, params = (str(response.url.join(nxt)), None) if nxt else (None, None)
            if url is not None:
                self.rule.link(str(response.url), url)
        check_listing(files)
        return files

    def tensor_manifest(
        self, repo_id: str, repo_type: str, commit: str, path: str
    ) -> list[dict[str, Any]] | None:
        """A cmh mirror's tensor manifest of ``path`` at ``commit`` (spec/hub-mirror.md 2.9).

        One request, not retried: any failure (another Hub, no manifest yet)
        answers ``None``. The entries are ``{"name", "begin", "end", "sha256"}``.
        """
        prefix = "" if repo_type == "model" else f"{REPO_TYPE_PREFIX[repo_type]}/"
        url = (
            f"{self.endpoint}/api/cmh/manifest/{prefix}{repo_id}/resolve/"
            f"{quote(commit, safe='')}/{quote(validate_relpath(path))}"
        )
        self._count(requests=1)
        deadline = _network_now() + metadata_timeout()
        try:
            request = self._client.build_request(
                "GET", url, timeout=metadata_timeout(), extensions=self._chain(False)
            )
            with total_deadline(deadline):
                response = self._client.send(request, stream=True)
                try:
                    content = _read_capped(response, url, deadline)
                finally:
                    response.close()
        except (httpx2.TransportError, UnsafeRedirect, ResolveError):
            return None
        self._count(nbytes=len(content))
        if response.status_code != 200:
            return None
        try:
            doc = json_value(content)
            tensors = doc["tensors"]
            if doc.get("schema") != "cmh-tensor-manifest/1" or not isinstance(tensors, list):
                return None
            return [
                {"name": str(t["name"]), "begin": int(t["begin"]), "end": int(t["end"]),
                 "sha256": bytes.fromhex(t["sha256"])}
                for t in tensors
            ]  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None

    def stream(
        self,
        url: str | Located,
        start: int,
        sink: Callable[[bytes], None],
        *,
        end: int | None = None,
        on_restart: Callable[[], None] | None = None,
        limit: int | None = None,
    ) -> bool:
        """Send the body of ``url`` from ``start`` (to ``end``, exclusive) to ``sink``.

        ``limit`` is the file's listed size: a body that would pass it raises
        :class:`~cmh.hub.resolver._types.AnswerTooLarge` before the byte past it
        reaches ``sink`` (the transfer stops there).

        Returns ``True`` when the server honoured the range (206, or 200 for a
        request from 0 to the end), ``False`` when it answered a ranged request
        with the whole body (200): the sink then received the file from byte 0.
        ``on_restart`` is called before the first byte in that case. Only a
        request with ``end`` set raises :class:`RangeNotSatisfied` for that.
        Network failures mid-body raise :class:`HubUnreachableError`; what
        arrived before the failure has been given to ``sink``. A
        :class:`Located` URL is asked where an earlier answer led; a failure
        there is transient (the next try goes through the ``resolve`` URL).
        """
        with _asking(url) as (located, target), self._until_done():
            return self._stream(located, target, start, sink, end, on_restart, limit)

    @contextlib.contextmanager
    def _until_done(self) -> Iterator[None]:
        """No transfer starts past :attr:`done_by` when it is set (a pull-through fill's
        time for tries): :class:`HubUnreachableError` that is not ``transient`` (no further
        try), no request made. One under way goes on under its own limits (its idle
        timeout, :data:`MIN_TRANSFER_RATE`): a large blob arriving well is never cut."""
        if self.done_by is not None and self.retry.clock.monotonic() >= self.done_by:
            raise HubUnreachableError(
                f"{self.endpoint}: the time given to this transfer's tries has passed",
                transient=False,
            )
        yield

    def _stream(
        self,
        located: Located | None,
        url: str,
        start: int,
        sink: Callable[[bytes], None],
        end: int | None,
        on_restart: Callable[[], None] | None,
        limit: int | None = None,
    ) -> bool:
        headers: dict[str, str] = dict(COMPRESSED)
        ranged = bool(start or end is not None)
        if ranged:
            last = "" if end is None else str(end - 1)
            headers = {**IDENTITY, "Range": f"bytes={start}-{last}"}
        counted = 0
        answered = False
        try:
            with self._open(url, headers) as response:
                answered = True
                self._answered(response)
                self._landed(located, url, response)
                try:
                    honoured = _honoured(response, url, start, end)
                except HubProtocolError:
                    self._count_unread(response)  # its bytes crossed the wire all the same
                    raise
                if not honoured and on_restart is not None:
                    on_restart()
                expected = None if end is None else end - start
                allowed = None if limit is None else limit - (start if honoured else 0)
                got = 0
                began = _network_now()
                # A compressed answer (asked for only without Range) is decoded for the sink.
                encoded = response.headers.get("Content-Encoding", "identity") != "identity"
                for chunk in response.iter_bytes() if encoded else response.iter_raw():
                    if _network_now() - began > self.timeout + got / MIN_TRANSFER_RATE:
                        raise HubUnreachableError(f"{url}: {_too_slow(self.timeout, got)}")
                    if expected is not None and got + len(chunk) > expected:
                        raise HubProtocolError(f"{url}: more bytes than the range asked for")
                    if allowed is not None and got + len(chunk) > allowed:
                        raise AnswerTooLarge(f"{url}: body longer than the listed {limit} bytes")
                    got += len(chunk)
                    self._count(nbytes=response.num_bytes_downloaded - counted)
                    counted = response.num_bytes_downloaded
                    sink(chunk)
                if expected is not None and got != expected:
                    raise HubUnreachableError(f"{url}: range ended after {got} of {expected} bytes")
                return honoured
        except httpx2.TransportError as exc:
            if not answered:
                self._count(requests=1)
            raise HubUnreachableError(
                f"transfer from {self.endpoint} failed: {_said(exc)}"
            ) from exc
        except httpx2.DecodingError as exc:
            raise HubProtocolError(f"{url}: undecodable compressed answer: {exc}") from exc

    def stream_ranges(
        self,
        url: str | Located,
        ranges: list[tuple[int, int]],
        sink: Callable[[int, bytes], None],
    ) -> None:
        """Fetch several ``[begin, end)`` ranges in one request (``multipart/byteranges``).

        ``sink(offset, data)`` receives the bytes with their absolute offset, in
        the order the server sends them. :class:`RangeNotSatisfied` when the
        server does not answer with exactly these ranges (e.g. a 200, or one
        range only): nothing has been given to ``sink`` then, and the caller
        fetches range by range. A single range is sent as a plain Range request.
        A :class:`Located` URL is used as by :meth:`stream`.
        """
        if len(ranges) == 1:
            b, e = ranges[0]
            self.stream(url, b, _at(sink, b), end=e)
            return
        with _asking(url) as (located, target):
            self._stream_ranges(located, target, ranges, sink)

    def _stream_ranges(
        self,
        located: Located | None,
        url: str,
        ranges: list[tuple[int, int]],
        sink: Callable[[int, bytes], None],
    ) -> None:
        spec = ",".join(f"{b}-{e - 1}" for b, e in ranges)
        answered = False
        try:
            with self._open(url, {**IDENTITY, "Range": f"bytes={spec}"}) as response:
                answered = True
                self._answered(response)
                ctype = response.headers.get("Content-Type", "")
                match = re.search(r"boundary=\"?([^\";]+)\"?", ctype)
                if response.status_code != 206 or "multipart/byteranges" not in ctype or not match:
                    # A CDN answers several ranges with its whole body: what it sent before
                    # the close crossed the wire all the same.
                    self._count_unread(response)
                    raise RangeNotSatisfied(f"{url}: no multipart/byteranges answer")
                self._landed(located, url, response)
                parser = MultipartParser(match.group(1).encode(), set(ranges), sink)
                began, got = _network_now(), 0
                for chunk in response.iter_raw():
                    if _network_now() - began > self.timeout + got / MIN_TRANSFER_RATE:
                        raise HubUnreachableError(f"{url}: {_too_slow(self.timeout, got)}")
                    got += len(chunk)
                    self._count(nbytes=len(chunk))
                    parser.feed(chunk)
                parser.close()
        except httpx2.TransportError as exc:
            if not answered:
                self._count(requests=1)
            raise HubUnreachableError(f"transfer from {self.endpoint} failed: {exc}") from exc


def _served_size(response: httpx2.Response) -> int | None:
    """The file's size a ``resolve`` HEAD answer gives: ``X-Linked-Size``, else the
    answer's ``Content-Length`` unless it is a redirect (its own body's length) or
    compressed (the compressed body's); ``None`` when it gives none."""
    headers = response.headers
    size = headers.get("X-Linked-Size")
    encoded = headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity")
    if not size and not response.is_redirect and not encoded:
        size = headers.get("Content-Length")
    # ASCII digits only: str.isdigit() holds for "²" (int() then raises) and "١" (read as 1)
    return int(size) if size and size.isascii() and size.isdigit() else None


def _too_slow(timeout: float, got: int) -> str:
    return (
        f"transfer slower than {MIN_TRANSFER_RATE >> 10} KiB/s on average past its first"
        f" {timeout:.0f} s ({got} bytes): given up, to be resumed"
    )


def _unreachable(endpoint: str, exc: httpx2.TransportError) -> HubUnreachableError:
    """A failed metadata request: retried, unless no connection could be made at all.

    Like the stock client, a Hub that cannot be connected to (offline, refused,
    no such host) is not asked again: the caller falls back to the cache at once.
    """
    transient = not isinstance(exc, httpx2.ConnectError)
    if isinstance(exc, httpx2.RemoteProtocolError):  # reached: its answer was not HTTP
        return HubUnreachableError(f"{endpoint}: {_said(exc)}", transient=transient)
    return HubUnreachableError(f"cannot reach {endpoint}: {_said(exc)}", transient=transient)


#: A Python ``bytes``/``bytearray`` repr in an HTTP library's message: its text is said.
_BYTES_REPR_RE = re.compile(r"\b(?:bytearray\()?b(['\"])(.*?)\1\)?")


def _said(exc: httpx2.TransportError) -> str:
    """The HTTP library's message without Python's reprs; an answer that is not HTTP (a
    header line without a colon, two Content-Lengths) is said to be one."""
    said = _BYTES_REPR_RE.sub(lambda m: repr(m.group(2)), str(exc))
    if isinstance(exc, httpx2.RemoteProtocolError):
        return f"the answer broke the HTTP protocol: {said}"
    return said


def _at(sink: Callable[[int, bytes], None], start: int) -> Callable[[bytes], None]:
    pos = start

    def write(chunk: bytes) -> None:
        nonlocal pos
        sink(pos, chunk)
        pos += len(chunk)

    return write


def _honoured(response: httpx2.Response, url: str, start: int, end: int | None) -> bool:
    """Whether an answer from ``start`` (to ``end``) honoured the range; ``False``: a 200 with
    the whole body for an open range (the sink restarts). Raises :class:`HubProtocolError`
    for an answer that cannot be used (:class:`RangeNotSatisfied`: a 200 for a closed range)."""
    status = response.status_code
    if not (start or end is not None):
        if status != 200:
            raise HubProtocolError(f"{url}: unexpected status {status}")
        return True
    if status == 206:
        _check_content_range(response, start, end)
        return True
    if status != 200:
        raise HubProtocolError(f"{url}: unexpected status {status}")
    if end is not None:
        raise RangeNotSatisfied(f"{url}: Range ignored (200 instead of 206)")
    return start == 0


def _waiting(response: httpx2.Response) -> int:
    """Bytes waiting in the receive queue of the answer's socket (0 where unknown)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return max(0, int(struct.unpack("i", raw)[0]))


def _check_content_range(response: httpx2.Response, start: int, end: int | None) -> None:
    value = response.headers.get("Content-Range", "")
    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", value.strip())
    if not match:
        raise RangeNotSatisfied(f"206 without a valid Content-Range ({value!r})")
    first, last = int(match.group(1)), int(match.group(2))
    if first != start or (end is not None and last != end - 1):
        raise RangeNotSatisfied(
            f"asked bytes {start}-{'' if end is None else end - 1}, got {value}"
        )


def raise_for_status(response: httpx2.Response) -> None:
    """Map an error answer to a typed error (``X-Error-Code`` first, then the status)."""
    status = response.status_code
    if status < 400:
        return
    code = response.headers.get("X-Error-Code", "")
    url = str(response.request.url)
    if code == "RepoNotFound":
        said = hub_message(response)
        raise NotFoundError(f"repository not found: {url}", "repo", status=status, said=said)
    if code == "RevisionNotFound":
        raise NotFoundError(f"revision not found: {url}", "revision")
    if code == "EntryNotFound":
        raise NotFoundError(f"file not found: {url}", "entry")
    if code == "GatedRepo" or status in (401, 403):
        said = hub_message(response)
        raise AccessError(
            f"access refused ({status}): {url}" + (f": {said}" if said else ""),
            status if status in (401, 403) else 403,
            code or None,
            said,
        )
    if status == 429 or status >= 500:
        raise HubUnreachableError(
            f"{url}: server error {status}", retry_after=retry_after(response.headers)
        )
    if status in (404, 405):
        raise NoSuchEndpoint(f"{url}: {status} without X-Error-Code (not a Hub endpoint?)")
    if status == 416:
        raise RangeNotSatisfied(f"{url}: 416 range not satisfiable")
    raise HubProtocolError(f"{url}: unexpected status {status}")


def hub_message(response: httpx2.Response) -> str:
    """What the Hub says about an error: ``X-Error-Message``, else the JSON body's ``error``
    (at most :data:`MAX_MESSAGE` characters: it is passed on, and remembered)."""
    said = response.headers.get("X-Error-Message", "").strip()
    if said:
        return _cut(said)
    try:
        body = json_value(response.content)
    except (ValueError, httpx2.ResponseNotRead):
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return _cut(error.strip()) if isinstance(error, str) else ""


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def retry_after(headers: httpx2.Headers) -> float | None:
    """Seconds ``Retry-After`` asks to wait (delay-seconds or an HTTP date, taken relative
    to this machine's clock), else ``None``."""
    value = headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():  # "²".isdigit() holds; float("²") raises
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - SYSTEM_CLOCK.time())


def _etag_of(blob_id: Any, lfs: Any) -> tuple[str, bool] | None:
    if isinstance(lfs, dict):
        oid = lfs.get("sha256") or lfs.get("oid")
        if isinstance(oid, str) and len(oid) == 64 and ETAG_RE.match(oid):  # an LFS ETag: SHA-256
            return oid, True
        return None
    if isinstance(blob_id, str) and ETAG_RE.match(blob_id):
        return blob_id, False
    return None


def _read_capped(response: httpx2.Response, url: str, deadline: float) -> bytes:
    """The decoded body of a streamed API answer, refused past :func:`max_api_bytes` or
    once ``deadline`` (``_network_now()``) has passed: a body sent a byte at a time
    never trips the read timeout, so the total time is checked at every chunk."""
    parts: list[bytes] = []
    total = 0
    limit = max_api_bytes()
    try:
        for chunk in response.iter_bytes():
            if _network_now() > deadline:
                raise HubUnreachableError(
                    f"{url}: answer not complete within {metadata_timeout():.0f} s"
                    " (HF_HUB_ETAG_TIMEOUT)",
                    transient=False,
                )
            total += len(chunk)
            if total > limit:
                raise AnswerTooLarge(f"{url}: answer over {limit >> 20} MiB once decoded")
            parts.append(chunk)
    except httpx2.DecodingError as exc:
        raise HubProtocolError(f"{url}: undecodable compressed answer: {exc}") from exc
    return b"".join(parts)


def listed_path(path: str) -> str:
    """A listed file name checked as a cache path, else :class:`InvalidListing`."""
    try:
        checked = validate_relpath(path)
    except LayoutError as exc:
        raise InvalidListing(f"the Hub lists an unusable file name {path[:300]!r}: {exc}") from None
    if _CONTROL.search(checked):  # a CR/LF would end a header line or a log record
        raise InvalidListing(f"the Hub lists a file name with a control character: {path[:300]!r}")
    encoded = checked.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_PATH_BYTES or any(
        len(s) > MAX_SEGMENT_BYTES for s in encoded.split(b"/")
    ):
        raise InvalidListing(f"the Hub lists a file name too long for a cache: {path[:300]!r}")
    return checked


def listed_size(path: str, size: int) -> int:
    """A listed file size checked (0 to :data:`MAX_FILE_SIZE`), else :class:`InvalidListing`."""
    if size < 0:
        raise InvalidListing(f"{path[:300]!r}: listed with a negative size")
    if size > MAX_FILE_SIZE:
        raise InvalidListing(f"{path[:300]!r}: listed with a size over 1 PiB ({size} bytes)")
    return size


def check_listing(files: dict[str, RemoteFile]) -> None:
    """Refuse a listing too long or with a name that is a file and a folder at once."""
    if len(files) > MAX_LISTED_FILES:
        raise InvalidListing(f"the Hub lists more than {MAX_LISTED_FILES} files")
    for path in files:
        parts = path.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder in files:
                raise InvalidListing(f"the Hub lists {folder!r} as a file and as a folder")


def _file_from_tree_entry(entry: Any) -> RemoteFile | None:
    if not isinstance(entry, dict) or entry.get("type") != "file":
        return None
    path, size, oid = entry.get("path"), entry.get("size"), entry.get("oid")
    if not isinstance(path, str) or not _is_integer(size):
        raise InvalidListing(f"malformed tree entry {str(entry)[:300]}")
    # ``xetHash`` says the Hub also stores the file in Xet; its ``resolve`` URL still
    # serves the bytes over HTTP, which is what the resolver uses: the field is ignored.
    etag = _etag_of(oid, entry.get("lfs"))
    if etag is None:
        raise HubProtocolError(f"{path}: tree entry has no usable oid")
    lfs = entry.get("lfs")
    if isinstance(lfs, dict) and _is_integer(lfs.get("size")):
        size = lfs["size"]
    return RemoteFile(listed_path(path), listed_size(path, size), etag[0], etag[1], str(oid))


def _is_integer(value: Any) -> TypeGuard[int]:
    """Whether a listed ``size`` is a JSON integer (``true`` is not one, though Python's
    ``bool`` is an ``int``: taken as a size it listed a file as 1 byte)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _files_from_siblings(siblings: Any) -> dict[str, RemoteFile] | None:
    """Blob data from ``siblings`` when every entry carries it, else ``None``."""
    if not isinstance(siblings, list):
        return None
    files: dict[str, RemoteFile] = {}
    for s in siblings:
        if not isinstance(s, dict):
            return None
        path, size, blob_id = s.get("rfilename"), s.get("size"), s.get("blobId")
        if not isinstance(path, str) or not _is_integer(size) or not isinstance(blob_id, str):
            return None
        etag = _etag_of(blob_id, s.get("lfs"))
        if etag is None:
            return None
        lfs = s.get("lfs")
        if isinstance(lfs, dict) and _is_integer(lfs.get("size")):
            size = lfs["size"]
        files[listed_path(path)] = RemoteFile(
            path, listed_size(path, size), etag[0], etag[1], blob_id
        )
        if len(files) > MAX_LISTED_FILES:
            raise InvalidListing(f"the Hub lists more than {MAX_LISTED_FILES} files")
    check_listing(files)
    return files
