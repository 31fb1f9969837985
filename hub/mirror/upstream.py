"""The pull-through side of ``cmh serve --upstream URL``: fill the store from another Hub.

A request for a repo, revision or file the store lacks, or for a branch whose
freshness has passed, is answered after asking the upstream Hub (the real
one, or another cmh mirror), with the resolver's own code:

- :meth:`Upstream.prepare` resolves a revision to a commit (one request,
  :class:`~cmh.hub.resolver.http.HubClient`), keeps the commit's listing
  (``trees/{commit}.json``), links every listed file whose blob the store
  lacks (the link dangles until the blob is filled, so the file is listed and
  answered from the listing at once), confirms the files whose blob the store
  already holds with the resolver (one ``HEAD`` each, as it does), and only
  then moves the ref and records the validation;
- :meth:`Upstream.fill` brings one file's blob in with
  :func:`cmh.hub.resolver.resolve` pinned to the commit (SHA-256 or git blob
  id checked, CMH manifests checked, resumable, tensor-level patching,
  atomic install, the blob lock shared with import, prune and the stock
  client).

Freshness is the resolver's: a branch is fresh until the smallest CMH
``expires_at`` of its stamped safetensors files, otherwise ``fresh_for``
seconds after its last validation. A commit id never revalidates. When the
upstream cannot be asked, a revision that was fresh less than ``stale_for``
seconds ago is served with a stale warning; otherwise the answer is a typed
503. The upstream's refusals map to the Hub's typed errors.

Access: a repo the upstream answers as ``private`` or ``gated`` is recorded
(``.cmh/upstream/access.json``) and is private at the mirror
(:func:`restricted_at_upstream`, used by the server's access policy) unless
the operator chose ``--public-upstream-repos``. For such a repo the upstream
is also asked ``auth-check`` with the mirror's token; a refusal is answered
with the upstream's own status, ``X-Error-Code`` and message, and no listing
is kept (so ``HEAD`` and ``GET`` are refused alike).

The client's ``Authorization`` is never used here: only the mirror's own
upstream token is sent, and the HTTP client drops it on a redirect to
another origin (the Hub's CDN).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmh._atomic import atomic_write

from ..cache.clock import Clock, process_clock
from ..cache.layout import COMMIT_RE, RepoLayout
from ..cache.locks import repo_lock
from .errors import HubError

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
    from ..resolver.types import HubProtocolError, IntegrityError

    if isinstance(exc, (HubProtocolError, IntegrityError)):
        return UpstreamError(502, "UpstreamProtocolError", f"upstream {doing}: {exc}")
    return unavailable(f"upstream {doing}: {exc}")


def _typed(exc: Exception) -> UpstreamError:
    """The Hub's typed error for a resolver error raised by asking the upstream."""
    from ..resolver.types import AccessError, NotFoundError

    if isinstance(exc, NotFoundError):
        if exc.kind == "repo":
            return UpstreamError(404, "RepoNotFound", "Repository not found")
        if exc.kind == "revision":
            return UpstreamError(404, "RevisionNotFound", "Invalid rev id (upstream)")
        return UpstreamError(404, "EntryNotFound", "Entry not found (upstream)")
    if isinstance(exc, AccessError):
        said = exc.said or "the upstream refuses this repo to the mirror's upstream token"
        return UpstreamError(exc.status, exc.code, f"{said} (upstream)")
    return failed(exc, "unavailable")


def fnmatch_literal(path: str) -> str:
    """An ``fnmatch`` pattern that matches exactly ``path``."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in path)


def access_record_path(repo: RepoLayout) -> Path:
    """``.cmh/upstream/access.json``: present while the upstream marks the repo private/gated."""
    return repo.cmh_dir / "upstream" / "access.json"


def restricted_at_upstream(store: Path, repo_type: str, repo_id: str) -> bool:
    """True when the upstream last said the repo is private or gated (private at the mirror)."""
    try:
        repo = RepoLayout(store, repo_id, repo_type)
    except ValueError:
        return False
    return access_record_path(repo).exists()


def _record_access(repo: RepoLayout, private: bool, gated: bool) -> None:
    path = access_record_path(repo)
    if not (private or gated):
        with contextlib.suppress(OSError):
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"private": private, "gated": gated, "at": time.time()}).encode())


def upstream_record_path(repo: RepoLayout, commit: str) -> Path:
    """``.cmh/upstream/{commit}.json``: when a pull-through commit's freshness ends."""
    repo.snapshot_dir(commit)  # validates the commit
    return repo.cmh_dir / "upstream" / f"{commit}.json"


class Upstream:
    """The upstream of one worker: revalidates revisions and fills blobs into ``store``."""

    def __init__(self, store: Path, config: UpstreamConfig) -> None:
        self.store = store
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

    def _count(self, requests: int, nbytes: int) -> None:
        with self._counter_lock:
            self.requests += requests
            self.bytes += nbytes
        if self.on_traffic is not None and (requests or nbytes):
            self.on_traffic(requests, nbytes)

    def _key_lock(self, key: tuple[str, str, str]) -> threading.Lock:
        with self._lock:
            lock = self._keys.get(key)
            if lock is None:
                lock = self._keys[key] = threading.Lock()
            return lock

    def _client(self) -> Any:
        from ..resolver.http import HubClient

        return HubClient(self.url, self.config.token)

    # -- revisions -----------------------------------------------------------------------

    def expiry(self, repo: RepoLayout, revision: str, commit: str) -> float:
        """When the store's copy of ``revision`` (at ``commit``) goes stale."""
        from ..resolver.local import read_tree, read_validation, snapshot_expiry

        tree = read_tree(repo, commit) or {}
        validation = read_validation(repo, revision)
        at = validation.at if validation is not None and validation.commit == commit else None
        return snapshot_expiry(
            repo, commit, sorted(tree), validated_at=at, default_lifetime=self.config.fresh_for
        )

    def prepare(self, repo_type: str, repo_id: str, revision: str) -> str | None:
        """Make ``revision`` answerable from the store; a ``Warning`` value when served stale.

        Raises :class:`UpstreamError` for what the upstream refused, or when it
        cannot be asked and nothing usable is cached.
        """
        from ..resolver.local import read_tree

        repo = RepoLayout(self.store, repo_id, repo_type)
        if COMMIT_RE.match(revision):
            if (repo.snapshots / revision).is_dir() and read_tree(repo, revision) is not None:
                return None  # a commit never changes: never revalidated
        else:
            commit = repo.read_ref(revision)
            now = self.clock.time()
            if commit is not None and now < self._known_expiry(repo, revision, commit):
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
                note = self._prepare_locked(repo, revision)
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
        repo = RepoLayout(self.store, repo_id, repo_type)
        local = revision if COMMIT_RE.match(revision) else repo.read_ref(revision)
        if local is None:
            return None
        expiry = self._known_expiry(repo, revision, local)
        if expiry == float("-inf") or self.clock.time() >= expiry + self.config.stale_for:
            return None
        return STALE_WARNING

    def _known_expiry(self, repo: RepoLayout, revision: str, commit: str) -> float:
        from ..resolver.local import read_tree

        if read_tree(repo, commit) is None or not (repo.snapshots / commit).is_dir():
            return float("-inf")
        return self.expiry(repo, revision, commit)

    def _prepare_locked(self, repo: RepoLayout, revision: str) -> str | None:
        from ..resolver.types import AccessError, NotFoundError, ResolveError

        pinned = bool(COMMIT_RE.match(revision))
        local = revision if pinned else repo.read_ref(revision)
        if local is not None:  # another thread may have revalidated while we waited
            expiry = self._known_expiry(repo, revision, local)
            if pinned and expiry != float("-inf"):
                return None
            if not pinned and self.clock.time() < expiry:
                return None
        else:
            expiry = float("-inf")
        client = self._client()
        try:
            commit, files = self._listing(client, repo, revision)
        except (NotFoundError, AccessError) as exc:
            raise _typed(exc) from None
        except ResolveError as exc:
            usable = local is not None and expiry != float("-inf")
            if usable and self.clock.time() < expiry + self.config.stale_for:
                return f"{STALE_WARNING}, {REVALIDATION_FAILED}"
            raise failed(exc, "unusable and nothing usable cached") from None
        finally:
            self._count(client.requests, client.bytes_received)
        self._install_listing(repo, commit, files)
        if not pinned:
            from ..resolver.local import write_validation

            if repo.read_ref(revision) != commit:
                repo.write_ref(revision, commit)
            write_validation(repo, revision, commit, at=self.clock.time())
        self._record_freshness(repo, revision, commit)
        return None

    def _listing(self, client: Any, repo: RepoLayout, revision: str) -> tuple[str, dict[str, Any]]:
        """The commit and listing of ``revision``, after the upstream's word on access.

        Unlike the resolver, a pinned commit is asked too: its answer says whether the
        repo is private or gated, which decides who reads it here.
        """
        from ..resolver.local import read_tree, remote_files_from_tree

        remote = client.revision(repo.repo_id, repo.repo_type, revision)
        _record_access(repo, remote.private, remote.gated)
        if remote.private or remote.gated:
            client.auth_check(repo.repo_id, repo.repo_type)  # refused: the upstream's answer
        cached = read_tree(repo, remote.commit)
        if cached is not None:
            return remote.commit, remote_files_from_tree(cached)
        if remote.files is not None:
            return remote.commit, remote.files
        return remote.commit, client.tree(repo.repo_id, repo.repo_type, remote.commit)

    def _record_freshness(self, repo: RepoLayout, revision: str, commit: str) -> None:
        """Keep when ``commit``'s upstream freshness ends, for ``cmh prune --expired``."""
        if COMMIT_RE.match(revision):
            until = self.clock.time() + self.config.fresh_for
        else:
            until = self.expiry(repo, revision, commit)
        if until == float("inf"):
            return
        path = upstream_record_path(repo, commit)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps({"fresh_until": until, "at": self.clock.time()}).encode())

    def _install_listing(self, repo: RepoLayout, commit: str, files: dict[str, Any]) -> None:
        """Keep the listing; link absent blobs (filled on demand), confirm present ones."""
        from ..resolver.local import linked_etag, write_tree

        present: list[str] = []
        with repo_lock(repo, shared=True):
            write_tree(repo, commit, files)
            repo.snapshot_dir(commit).mkdir(parents=True, exist_ok=True)
            for path, remote in files.items():
                if linked_etag(repo, commit, path) == remote.etag:
                    continue
                if repo.blob_path(remote.etag).exists():
                    present.append(path)  # confirmed by the resolver before it is linked
                else:
                    repo.link_snapshot_file(commit, path, remote.etag)
        if present:
            self._resolve(repo, commit, present)

    # -- files ---------------------------------------------------------------------------

    def fill(self, repo_type: str, repo_id: str, commit: str, path: str) -> None:
        """Bring the blob of ``path`` at ``commit`` into the store (blocking; resolver code)."""
        from ..resolver.local import read_tree
        from .manifests import keep_for

        repo = RepoLayout(self.store, repo_id, repo_type)
        self._resolve(repo, commit, [path])
        entry = (read_tree(repo, commit) or {}).get(path)
        if entry is not None:
            keep_for(repo, entry.etag, path)  # the tensor manifest, for resolvers downstream

    def _resolve(self, repo: RepoLayout, commit: str, paths: list[str]) -> None:
        from ..resolver.negotiate import resolve
        from ..resolver.types import AccessError, NotFoundError, Policy, ResolveError

        try:
            res = resolve(
                repo.repo_id,
                commit,
                repo_type=repo.repo_type,
                cache_dir=self.store,
                endpoint=self.url,
                token=self.config.token or False,
                allow_patterns=[fnmatch_literal(p) for p in paths],
                # One connection: the fill then writes blobs/{etag}.incomplete in order, which
                # the clients of a filling blob read as it grows (filling.py).
                policy=Policy(stale_if_error=False, connections=1),
            )
        except (NotFoundError, AccessError) as exc:
            raise _typed(exc) from None
        except ResolveError as exc:
            raise failed(exc, "fill failed") from None
        self._count(res.requests, res.bytes_transferred)
