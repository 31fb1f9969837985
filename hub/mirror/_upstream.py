"""The pull-through side of ``cmh serve --upstream URL``: fill the store from another Hub.

A request for a repo, revision or file the store lacks, or for a branch whose
freshness has passed, is answered after asking the upstream Hub (the real
one, or another cmh mirror). This module is the policy, the same for every
store kind; where the state lives and how a blob is filled is the store's
:class:`~cmh.hub.mirror.stores.PullThrough` side (a folder: the resolver's
download into the stock cache layout; a bucket: one fill per blob for the whole
fleet under a lease, ``spec/hub-mirror.md`` 8.6):

- :meth:`Upstream.prepare` resolves a revision to a commit (one request,
  :class:`~cmh.hub.resolver.HubClient`), has the store keep the commit's
  listing (every listed file answerable at once, blobs filled on demand), and
  only then has it move the ref and record the validation; on a bucket a
  replica first claims the revalidation, so the fleet asks once;
- :meth:`Upstream.fill` brings one file's blob in (checked against its SHA-256
  or git blob id before it is visible under its name), or waits for the fill
  another worker, process or replica runs.

Freshness is the resolver's: a branch is fresh until the smallest CMH
``expires_at`` of its stamped safetensors files, otherwise ``fresh_for``
seconds after its last validation. A commit id never revalidates. When the
upstream cannot be asked, a revision that was fresh less than ``stale_for``
seconds ago is served with a stale warning; otherwise the answer is a typed
503. The upstream's refusals map to the Hub's typed errors.

Access: a repo the upstream answers as ``private`` or ``gated`` is recorded
(``.cmh/upstream/access.json``) and is private at the mirror
(``PullThrough.restricted``, used by the server's access policy) unless
the operator chose ``--public-upstream-repos``. For such a repo the upstream
is also asked ``auth-check`` with the mirror's token; a refusal is answered
with the upstream's own status, ``X-Error-Code`` and message (``401``/``403
GatedRepo``, ``401``/``404 RepoNotFound``), to every client, and no listing
is kept (so ``HEAD`` and ``GET`` are refused alike). What the mirror's token
does read is refused to a reader the tokens file does not grant as the Hub
refuses one (``GatedRepo`` for a gated repo, see ``app._closed``; a private
one looks missing).

The client's ``Authorization`` is never used here: only the mirror's own
upstream token is sent, and the HTTP client drops it on a redirect to
another origin (the Hub's CDN).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from cmh.hub.cache import COMMIT_RE, Clock, process_clock

from ._errors import HubError

#: Seconds the outcome of a failed revalidation (an upstream error, or "served stale") or a
#: failed fill is remembered: requests meanwhile share it instead of asking again.
NEGATIVE_FOR = 10.0

#: The ``Warning`` header of an answer served stale because the upstream failed (RFC 7234).
STALE_WARNING = '110 cmh "Response is stale"'
REVALIDATION_FAILED = '111 cmh "Revalidation failed"'


@dataclass(frozen=True)
class UpstreamConfig:
    """Where a pull-through mirror fills from, and how long what it holds stays fresh."""

    url: str
    token: str | None = None  # the mirror's own token for the upstream (never a client's)
    fresh_for: float = 300.0  # seconds an unstamped branch stays fresh after a validation
    stale_for: float = 86400.0  # seconds past freshness stale content may be served on error
    #: Serve repos the upstream marks private or gated to anyone (``--public-upstream-repos``).
    public_repos: bool = False
    #: Seconds a bucket fill's lease lives without renewal (``--fill-lease-ttl``; ``None``:
    #: ``CMH_FILL_LEASE_TTL``, else 30 s).
    fill_lease_ttl: float | None = None


class UpstreamError(HubError):
    """An answer the upstream decided: status, Hub ``X-Error-Code``, message, headers."""


def unavailable(message: str) -> UpstreamError:
    """The typed 503 of an upstream that cannot be asked while nothing usable is cached."""
    return UpstreamError(503, "UpstreamUnavailable", message, {"Retry-After": "30"})


def failed(exc: Exception, doing: str) -> UpstreamError:
    """The answer for an upstream that could not be used: ``502 UpstreamProtocolError``
    when it broke the protocol or a limit (a refused redirect, a listing too long...) or
    sent bytes that fail their check,
    else the typed 503."""
    from cmh.hub.resolver import HubProtocolError, IntegrityError

    if isinstance(exc, (HubProtocolError, IntegrityError)):
        return UpstreamError(502, "UpstreamProtocolError", f"upstream {doing}: {exc}")
    return unavailable(f"upstream {doing}: {exc}")


def typed(exc: Exception) -> UpstreamError:
    """The Hub's typed error for a resolver error raised by asking the upstream."""
    from cmh.hub.resolver import AccessError, NotFoundError

    if isinstance(exc, NotFoundError):
        if exc.kind == "repo":  # the upstream's status (401 or 404) and words
            return UpstreamError(exc.status, "RepoNotFound", exc.said or "Repository not found")
        if exc.kind == "revision":
            return UpstreamError(404, "RevisionNotFound", "Invalid rev id (upstream)")
        return UpstreamError(404, "EntryNotFound", "Entry not found (upstream)")
    if isinstance(exc, AccessError):
        said = exc.said or "the upstream refuses this repo to the mirror's upstream token"
        return UpstreamError(exc.status, exc.code, said)  # the upstream's own words
    return failed(exc, "unavailable")


class Upstream:
    """The upstream of one worker: revalidates revisions and fills blobs through the
    store's pull-through side (:class:`~cmh.hub.mirror.stores.PullThrough`: a folder's
    or a bucket's; the policy here is the same for both)."""

    def __init__(self, pull: Any, config: UpstreamConfig) -> None:
        self.pull = pull
        self.config = config
        self.url = config.url.rstrip("/")
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, str, str], threading.Lock] = {}
        self._counter_lock = threading.Lock()
        self.requests = 0  # requests made to the upstream by this worker
        self.bytes = 0  # body bytes received from the upstream by this worker
        self.on_traffic: Any = None  # callable(requests, nbytes), set by the server for metrics
        self.clock: Clock = process_clock()  # freshness and the negative cache (tests move it)
        self._failed: dict[tuple[str, str, str], tuple[float, UpstreamError | str]] = {}

    # -- bookkeeping ---------------------------------------------------------------------

    def count(self, requests: int, nbytes: int) -> None:
        """Count requests and body bytes sent to / received from the upstream."""
        with self._counter_lock:
            self.requests += requests
            self.bytes += nbytes
        if self.on_traffic is not None and (requests or nbytes):
            self.on_traffic(requests, nbytes)

    _count = count

    def _key_lock(self, key: tuple[str, str, str]) -> threading.Lock:
        with self._lock:
            lock = self._keys.get(key)
            if lock is None:
                lock = self._keys[key] = threading.Lock()
            return lock

    def client(self) -> Any:
        """A client of the upstream with the mirror's own token (never a client's)."""
        from cmh.hub.resolver import HubClient

        return HubClient(self.url, self.config.token)

    _client = client

    # -- revisions -----------------------------------------------------------------------

    def _known_expiry(self, repo_type: str, repo_id: str, revision: str) -> float:
        """When the held copy of ``revision`` goes stale (``-inf``: none usable held)."""
        commit = self.pull.held(repo_type, repo_id, revision)
        if commit is None:
            return float("-inf")
        return float(self.pull.expiry(repo_type, repo_id, revision, commit))

    def prepare(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        """Make ``revision`` answerable from the store; a ``Warning`` value when served stale.

        Raises :class:`UpstreamError` for what the upstream refused, or when it
        cannot be asked and nothing usable is cached.
        """
        if COMMIT_RE.match(revision):
            if self.pull.held(repo_type, repo_id, revision) is not None:
                return None  # a commit never changes: never revalidated
        elif self.clock.time() < self._known_expiry(repo_type, repo_id, revision):
            return None
        key = (repo_type, repo_id, revision)
        with self._key_lock(key):
            # One retry cycle per revision: who waited for a failed one shares its outcome.
            failed = self._failed.get(key)
            if failed is not None and self.clock.monotonic() - failed[0] < NEGATIVE_FOR:
                if isinstance(failed[1], UpstreamError):
                    raise failed[1]
                return failed[1]
            try:
                note = self._prepare_locked(repo_type, repo_id, revision)
            except UpstreamError as exc:
                self._failed[key] = (self.clock.monotonic(), exc)
                raise
            if note is None:
                self._failed.pop(key, None)
            else:
                self._failed[key] = (self.clock.monotonic(), note)
            return note

    def stale_note(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        """The ``Warning`` for answering ``revision`` from the store while its revalidation
        is still under way (a stalled upstream), or ``None`` when no usable copy is held."""
        expiry = self._known_expiry(repo_type, repo_id, revision)
        if expiry == float("-inf") or self.clock.time() >= expiry + self.config.stale_for:
            return None
        return STALE_WARNING

    def _prepare_locked(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        from cmh.hub.resolver import AccessError, NotFoundError, ResolveError

        pinned = bool(COMMIT_RE.match(revision))
        # another thread (or replica) may have revalidated while we waited
        expiry = self._known_expiry(repo_type, repo_id, revision)
        if pinned and expiry != float("-inf"):
            return None
        if not pinned and self.clock.time() < expiry:
            return None
        if (
            not pinned
            and expiry != float("-inf")
            and not self.pull.claim(repo_type, repo_id, revision)
            and self.clock.time() < self._known_expiry(repo_type, repo_id, revision)
        ):
            return None  # another replica revalidated it meanwhile (its record says so)
        client = self.client()
        try:
            commit, files = self._listing(client, repo_type, repo_id, revision)
        except (NotFoundError, AccessError) as exc:
            raise typed(exc) from None
        except ResolveError as exc:
            usable = expiry != float("-inf")
            if usable and self.clock.time() < expiry + self.config.stale_for:
                return f"{STALE_WARNING}, {REVALIDATION_FAILED}"
            raise failed(exc, "unusable and nothing usable cached") from None
        finally:
            self.count(client.requests, client.bytes_received)
        self.pull.install(self, repo_type, repo_id, commit, files)
        self.pull.validated(repo_type, repo_id, revision, commit, pinned=pinned)
        return None

    def _listing(
        self, client: Any, repo_type: str, repo_id: str, revision: str
    ) -> tuple[str, dict[str, Any]]:
        """The commit and listing of ``revision``, after the upstream's word on access.

        Unlike the resolver, a pinned commit is asked too: its answer says whether the
        repo is private or gated, which decides who reads it here.
        """
        from cmh.hub.resolver import NoSuchEndpoint

        remote = client.revision(repo_id, repo_type, revision)
        self.pull.record_access(repo_type, repo_id, remote.private, remote.gated)
        files = self.pull.listing(repo_type, repo_id, remote.commit)
        if remote.private or remote.gated:
            try:
                client.auth_check(repo_id, repo_type)  # refused: the upstream's answer
            except NoSuchEndpoint:
                # An upstream without auth-check (another mirror, an older Hub): what a
                # HEAD of one listed file says decides, refusal and words its own.
                files = files or remote.files or client.tree(repo_id, repo_type, remote.commit)
                if files:
                    path = min(files)
                    client.served(client.file_url(repo_id, repo_type, remote.commit, path))
        if files is not None:
            return remote.commit, files
        if remote.files is not None:
            return remote.commit, remote.files
        return remote.commit, client.tree(repo_id, repo_type, remote.commit)

    # -- files ---------------------------------------------------------------------------

    def fill(self, repo_type: str, repo_id: str, commit: str, path: str) -> None:
        """Bring the blob of ``path`` at ``commit`` into the store (blocking), or wait for
        the fill another process or replica runs."""
        self.pull.fill(self, repo_type, repo_id, commit, path)
