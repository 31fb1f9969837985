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
seconds after its last validation. A commit id never revalidates its content; who
may read it is asked again once per ``fresh_for`` (:meth:`Upstream.access_known`), and
no blob is filled on older word on access (``app._access_checked``). When the
upstream cannot be asked, a revision that was fresh less than ``stale_for``
seconds ago is served with a stale warning; otherwise the answer is a typed
503. The upstream's refusals map to the Hub's typed errors.

Access: a repo the upstream answers as ``private`` or ``gated``, or one it
serves only with the mirror's upstream token (asked ``auth-check`` without it;
an answer that cannot be had counts as a refusal), is recorded
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
from dataclasses import dataclass, field
from typing import Any

from cmh.hub.cache import COMMIT_RE, Clock, process_clock

from ._errors import HubError
from ._memo import KeyedLocks, Memo

#: Seconds the outcome of a failed revalidation (an upstream error, or "served stale") or a
#: failed fill is remembered: requests meanwhile share it instead of asking again.
NEGATIVE_FOR = 10.0
#: Outcomes of failed revalidations kept per worker (the least recently used go first): a
#: client asking for 20,000 unknown names holds this many, not 20,000.
MAX_NEGATIVE = 4096
#: Characters of a failure's message kept with its outcome.
MAX_OUTCOME_MESSAGE = 2048
#: Seconds a fill goes on retrying an upstream that cannot be reached (refused, reset, 5xx)
#: before its clients hear an error: an upstream restart does not fail the fills under way.
FILL_RETRY_BUDGET = 30.0
#: The pauses between those retries, doubling from the first up to the last.
FILL_RETRY_FIRST, FILL_RETRY_MAX = 0.5, 5.0
#: Seconds one revalidation may spend asking the upstream in all (the revision, every tree
#: page, the access checks): an upstream sending an endless paged tree slowly fails it then,
#: as any upstream failure (shared by the negative cache), instead of holding its thread for
#: hours. A listing of 100,000 files in 100 pages takes well under this from the Hub.
REVALIDATION_BUDGET = 180.0

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


class UpstreamRenamed(UpstreamError):
    """The upstream names the repo asked for otherwise: another case of its id (the Hub
    matches repo ids without case) or a renamed repo's old name. Nothing is kept or served
    under the asked name, so every spelling of a repo is one repo at the mirror, with one
    access record and one copy of its bytes: the server sends a reader the repo opens to
    the upstream's name (``app._moved``), as the Hub answers a renamed repo."""

    def __init__(self, asked: str, canonical: str) -> None:
        super().__init__(307, None, f"the upstream names {asked} {canonical}")
        self.canonical = canonical


@dataclass(frozen=True)
class Outcome:
    """A failure as kept for the requests that share it: its answer and when it happened.

    Never the exception itself: an exception holds its traceback (and through it the
    frames that read the upstream's answer, up to a 32 MiB buffer), and one re-raised
    grows its traceback at every raise.
    """

    status: int
    code: str | None
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    at: float = 0.0
    #: The upstream's name of the repo (:class:`UpstreamRenamed`), else ``None``.
    canonical: str | None = None

    @classmethod
    def of(cls, exc: HubError, at: float) -> Outcome:
        message = exc.message[:MAX_OUTCOME_MESSAGE]  # what is kept is bounded, too
        canonical = exc.canonical if isinstance(exc, UpstreamRenamed) else None
        return cls(exc.status, exc.code, message, dict(exc.headers), at, canonical)

    def error(self) -> UpstreamError:
        """A new error for this outcome (no traceback, no cause)."""
        if self.canonical is not None:
            renamed = UpstreamRenamed("", self.canonical)
            renamed.message = self.message
            return renamed
        return UpstreamError(self.status, self.code, self.message, dict(self.headers))


class UpstreamUnreachable(UpstreamError):
    """The typed 503 of an upstream that could not be reached (refused, reset, timed out,
    429/5xx after the resolver's retries): the one failure a fill tries again."""


def unavailable(message: str) -> UpstreamError:
    """The typed 503 of an upstream that cannot be asked while nothing usable is cached."""
    return UpstreamError(503, "UpstreamUnavailable", message, {"Retry-After": "30"})


def failed(exc: Exception, doing: str) -> UpstreamError:
    """The answer for an upstream that could not be used: ``502 UpstreamProtocolError``
    when it broke the protocol or a limit (a refused redirect, a listing too long...) or
    sent bytes that fail their check,
    else the typed 503."""
    from cmh.hub.resolver import HubProtocolError, HubUnreachableError, IntegrityError

    if isinstance(exc, (HubProtocolError, IntegrityError)):
        return UpstreamError(502, "UpstreamProtocolError", f"upstream {doing}: {exc}")
    if isinstance(exc, HubUnreachableError):
        message = f"upstream {doing}: {exc}"
        return UpstreamUnreachable(503, "UpstreamUnavailable", message, {"Retry-After": "30"})
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


def needs_upstream_token(url: str, repo_type: str, repo_id: str, count: Any = None) -> bool:
    """True unless the Hub at ``url`` serves the repo to anyone (one anonymous request).

    A Hub's JSON may say nothing of access (no ``private`` key, or ``false``) for a
    repo only a token reads: the repo is asked ``auth-check`` without a token, and
    whatever is not a plain yes (a refusal, an error, an unreachable Hub) counts as
    needing the token, so the repo stays private. ``count(requests, nbytes)`` hears the
    traffic.
    """
    from cmh.hub.resolver import HubClient, ResolveError

    anonymous = HubClient(url, None)
    try:
        anonymous.auth_check(repo_id, repo_type)
    except ResolveError:
        return True
    finally:
        if count is not None:
            count(anonymous.requests, anonymous.bytes_received)
    return False


def record_upstream_access(store: Any, repo_type: str, repo_id: str, *, private: bool) -> None:
    """Keep (``private``) or lift the access record of a repo ``cmh mirror sync`` filled
    (``.cmh/upstream/access.json``): a recorded repo is private at every ``cmh serve`` of
    the store, opened only by a ``--tokens`` grant. Raises the store's
    :class:`~cmh.hub.mirror.StoreError`."""
    from ._errors import StoreUnavailable

    try:
        store.pull_through(300.0).record_access(repo_type, repo_id, private, False)
    except OSError as exc:
        raise StoreUnavailable(f"cannot write the access record of {repo_id}: {exc}") from None


class Upstream:
    """The upstream of one worker: revalidates revisions and fills blobs through the
    store's pull-through side (:class:`~cmh.hub.mirror.stores.PullThrough`: a folder's
    or a bucket's; the policy here is the same for both)."""

    def __init__(self, pull: Any, config: UpstreamConfig, clock: Clock | None = None) -> None:
        self.pull = pull
        self.config = config
        self.url = config.url.rstrip("/")
        self._keys: KeyedLocks[tuple[str, str, str]] = KeyedLocks()
        self._counter_lock = threading.Lock()
        self.requests = 0  # requests made to the upstream by this worker
        self.bytes = 0  # body bytes received from the upstream by this worker
        self.on_traffic: Any = None  # callable(requests, nbytes), set by the server for metrics
        #: freshness and the negative cache: the process's (a test's ProcessClock moves it)
        self.clock: Clock = clock if clock is not None else process_clock()
        #: The outcome of each recently failed revalidation (or its stale note), for
        #: :data:`NEGATIVE_FOR` s and at most :data:`MAX_NEGATIVE` of them.
        self._failed: Memo[tuple[str, str, str], Outcome | str] = Memo(
            MAX_NEGATIVE, ttl=NEGATIVE_FOR, timer=lambda: self.clock.monotonic()
        )
        #: The repos whose access this worker had the upstream's word on within
        #: ``fresh_for`` (a revalidation of any of their revisions): a commit held of any
        #: other is asked again before it is answered, and no file of it is filled before.
        self._access_known: Memo[tuple[str, str], bool] = Memo(
            MAX_NEGATIVE, ttl=max(config.fresh_for, 0.001), timer=lambda: self.clock.monotonic()
        )

    # -- bookkeeping ---------------------------------------------------------------------

    def count(self, requests: int, nbytes: int) -> None:
        """Count requests and body bytes sent to / received from the upstream."""
        with self._counter_lock:
            self.requests += requests
            self.bytes += nbytes
        if self.on_traffic is not None and (requests or nbytes):
            self.on_traffic(requests, nbytes)

    _count = count

    def client(self, done_by: float | None = None) -> Any:
        """A client of the upstream with the mirror's own token (never a client's);
        ``done_by``: when its requests must all be done (``HubClient``'s, on :attr:`clock`)."""
        from cmh.hub.resolver import HubClient

        return HubClient(self.url, self.config.token, clock=self.clock, done_by=done_by)

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
        if self.fresh(repo_type, repo_id, revision):
            return None
        key = (repo_type, repo_id, revision)
        with self._keys.hold(key):
            outcome = self._prepare_once(key)
        if isinstance(outcome, Outcome):
            raise outcome.error()  # raised here, out of every handler: nothing chained
        return outcome

    def _prepare_once(self, key: tuple[str, str, str]) -> Outcome | str | None:
        """The outcome of one revalidation of ``key``, or the one that just failed."""
        # One retry cycle per revision: who waited for a failed one shares its outcome.
        failed = self._failed.get(key)
        if failed is not None:
            return failed
        try:
            note = self._prepare_locked(*key)
        except UpstreamError as exc:
            outcome = Outcome.of(exc, self.clock.monotonic())
            self._failed.put(key, outcome)
            return outcome
        if note is None:
            self._failed.drop(key)
        else:
            self._failed.put(key, note)
        return note

    def fresh(self, repo_type: str, repo_id: str, revision: str) -> bool:
        """Whether the store answers ``revision`` without asking the upstream (a held
        commit whose repo's access was checked within ``fresh_for``, or a branch within
        its freshness): read from the store and this worker's memory only."""
        if COMMIT_RE.match(revision):  # its content never changes; who may read it may
            held = self.pull.held(repo_type, repo_id, revision) is not None
            return held and self.access_known(repo_type, repo_id)
        return self.clock.time() < self._known_expiry(repo_type, repo_id, revision)

    def access_known(self, repo_type: str, repo_id: str) -> bool:
        """Whether this worker had the upstream's word on who reads the repo (a revision
        answer and, with an upstream token, the anonymous ``auth-check``) within
        ``fresh_for``: nothing is filled for a reader, nor a held commit answered, on
        older word."""
        return self._access_known.get((repo_type, repo_id)) is not None

    def stale_note(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        """The ``Warning`` for answering ``revision`` from the store while its revalidation
        is still under way (a stalled upstream), or ``None`` when no usable copy is held
        (a held commit always is: only its access was being asked)."""
        if COMMIT_RE.match(revision) and self.pull.held(repo_type, repo_id, revision):
            return STALE_WARNING
        expiry = self._known_expiry(repo_type, repo_id, revision)
        if expiry == float("-inf") or self.clock.time() >= expiry + self.config.stale_for:
            return None
        return STALE_WARNING

    def _prepare_locked(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        from cmh.hub.resolver import AccessError, NotFoundError, ResolveError

        pinned = bool(COMMIT_RE.match(revision))
        # another thread (or replica) may have revalidated while we waited
        expiry = self._known_expiry(repo_type, repo_id, revision)
        held = pinned and self.pull.held(repo_type, repo_id, revision) is not None
        if held and self.access_known(repo_type, repo_id):
            return None  # a held commit: only who may read it is asked, once per fresh_for
        if not pinned and self.clock.time() < expiry:
            return None
        if (
            not pinned
            and expiry != float("-inf")
            and not self.pull.claim(repo_type, repo_id, revision)
        ):
            return None  # another replica revalidated it meanwhile (its record says so)
        client = self.client(done_by=self.clock.monotonic() + REVALIDATION_BUDGET)
        try:
            commit, files = self._listing(client, repo_type, repo_id, revision)
        except (NotFoundError, AccessError) as exc:
            kept = held or expiry != float("-inf")
            if kept and (isinstance(exc, AccessError) or exc.kind == "repo"):
                # A held repo the upstream no longer serves (made private, gated or deleted):
                # private here too, every revision held of it, until it serves it again.
                self.pull.record_access(repo_type, repo_id, True, False)
            raise typed(exc) from None
        except ResolveError as exc:
            if held:  # a held commit's bytes never change: served as the access last known
                return f"{STALE_WARNING}, {REVALIDATION_FAILED}"  # (and no file filled)
            usable = expiry != float("-inf")
            if usable and self.clock.time() < expiry + self.config.stale_for:
                return f"{STALE_WARNING}, {REVALIDATION_FAILED}"
            doing = "unusable and nothing usable cached"
            if self.clock.monotonic() >= client.done_by:
                doing = f"not done within {REVALIDATION_BUDGET:g} s, nothing usable cached"
            raise failed(exc, doing) from None
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
        self._same_repo(repo_id, remote.repo_id)
        private = remote.private or (
            not remote.gated
            and not self.config.public_repos
            and self._needs_token(repo_type, repo_id)
        )
        self.pull.record_access(repo_type, repo_id, private, remote.gated)
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
        self._access_known.put((repo_type, repo_id), True)  # the upstream's word, just had
        if files is not None:
            return remote.commit, files
        if remote.files is not None:
            return remote.commit, remote.files
        return remote.commit, client.tree(repo_id, repo_type, remote.commit)

    @staticmethod
    def _same_repo(asked: str, named: str | None) -> None:
        """Nothing is kept under a name the upstream does not call the repo's own:
        :class:`UpstreamRenamed` when its answer names another (another case, an old
        name), a typed 502 for a name no Hub gives. An answer naming none is taken as
        the asked name's (the access policy compares names without case all the same)."""
        from cmh.hub.cache import LayoutError, validate_repo_id

        from ._errors import printable

        if named is None or named == asked:
            return
        try:
            validate_repo_id(named)
        except LayoutError:
            what = f"the upstream names {asked} {printable(named, 200)!r}, not a repo id"
            raise UpstreamError(502, "UpstreamProtocolError", what) from None
        raise UpstreamRenamed(asked, named)

    def _needs_token(self, repo_type: str, repo_id: str) -> bool:
        """True unless the upstream serves the repo without the mirror's token
        (:func:`needs_upstream_token`)."""
        if not self.config.token:
            return False  # every answer was anonymous already
        return needs_upstream_token(self.url, repo_type, repo_id, self.count)

    # -- files ---------------------------------------------------------------------------

    def fill(self, repo_type: str, repo_id: str, commit: str, path: str) -> None:
        """Bring the blob of ``path`` at ``commit`` into the store (blocking), or wait for
        the fill another process or replica runs.

        An upstream that cannot be reached (:class:`UpstreamUnreachable`: refused, reset,
        timed out, 5xx, a transfer too slow) is tried again, with pauses doubling from
        :data:`FILL_RETRY_FIRST` s, while less than :data:`FILL_RETRY_BUDGET` s of
        :attr:`clock` have passed; each try resumes what the last one stored. No try
        starts after that, the resolver's own included (``done_by``); one under way ends
        by its own limits (a blob arriving well is never cut). Refusals (4xx), bad bytes
        (502) and a failing store are final at once.
        """
        start = self.clock.monotonic()
        done_by = start + FILL_RETRY_BUDGET  # no try, nor the resolver's own, starts later
        pause = FILL_RETRY_FIRST
        while True:
            try:
                self.pull.fill(self, repo_type, repo_id, commit, path, done_by=done_by)
                return
            except UpstreamUnreachable as exc:
                spent = self.clock.monotonic() - start
                if spent + pause > FILL_RETRY_BUDGET:
                    raise UpstreamError(
                        exc.status,
                        exc.code,
                        f"{exc.message} (tried for {spent:.0f} s)",
                        dict(exc.headers),
                    ) from None
            self.clock.sleep(pause)
            pause = min(FILL_RETRY_MAX, pause * 2)
