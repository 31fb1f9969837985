"""The resolver: cache negotiation, atomic snapshot swap, per-file fetch policy.

``resolve()`` decides, per repo and revision, like an HTTP cache with the CMH
``expires_at`` as the lifetime (normative text: ``spec/resolver.md``):

- answer from the cache with no request when the local snapshot is complete,
  checked and fresh (LOCAL_ONLY), or when offline;
- otherwise one request resolves the revision to a commit; an unchanged
  commit whose listing is cached costs nothing more (FRESH);
- changed files are fetched (whole, resumed, or tensor by tensor), checked,
  installed as blobs, linked into ``snapshots/{commit}``, and only then is
  ``refs/{revision}`` moved (ETAG_MISMATCH, MISSING, CORRUPT);
- if the Hub cannot be asked, an expired snapshot is served with a warning
  (STALE_OFFLINE) unless the policy is strict.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TypedDict, Unpack

from cmh.hub.cache import (
    COMMIT_RE,
    RepoLayout,
    adopt_orphans,
    blob_lock,
    blob_state,
    clean_no_exist,
    default_cache_dir,
    disk_full_error,
    is_disk_full,
    partial_path,
    record_use,
    repo_lock,
    snapshot_in_use,
    tag_cache_dir,
    validate_repo_id,
    validate_revision,
)

from . import _chunked as chunked
from ._answers import keep_resolver_answers
from ._credentials import check_sendable, token_to_send
from ._fetch import discard_partials, download_whole, has_partials
from ._http import HubClient, metadata_timeout
from ._local import (
    LocalEntry,
    discard_tree,
    find_old_version,
    linked_etag,
    read_tree,
    read_validation,
    remote_files_from_tree,
    select,
    snapshot_expiry,
    stamped_expiry,
    write_tree,
    write_validation,
)
from ._partial import PatchNotPossible, patch_blob
from ._transfer import Job, Tally
from ._types import (
    Action,
    FileResult,
    HubProtocolError,
    HubUnreachableError,
    IntegrityError,
    NotFoundError,
    OfflineError,
    Policy,
    PolicyError,
    RemoteFile,
    Resolution,
    SnapshotPath,
    State,
)

logger = logging.getLogger("cmh.hub")

#: The end of the warnings about a pinned commit past its expiry and a snapshot without a
#: listing (``install()`` logs them only where they are the caller's: stock says neither).
PINNED_KEPT = "a pinned commit is kept"
COMPLETENESS_UNKNOWN = "served as found, completeness unknown"

#: Files smaller than this are fetched whole even when an older version is local.
PATCH_MIN_BYTES = 1 << 20

Progress = Callable[[int], None]


@dataclass
class _Local:
    """The local side of the negotiation for one revision."""

    commit: str | None  # the commit the ref (or the pinned revision) names
    tree: dict[str, object] | None  # listing of that commit, when cached
    selection: list[str] = field(default_factory=list)
    complete: bool = False  # every selected file linked and its blob present
    corrupt: list[str] = field(default_factory=list)  # selected files whose blob failed
    last_good: str | None = None  # commit of the last validation


class ResolveOptions(TypedDict, total=False):
    """The keyword arguments of :func:`resolve` and :func:`hold`, as the stock client names them."""

    repo_type: str
    cache_dir: str | Path | None
    endpoint: str | None
    token: str | bool | None
    allow_patterns: Sequence[str] | str | None
    policy: Policy | None
    progress: Progress | None
    on_total: Callable[[int], None] | None


@dataclass(frozen=True)
class _Ask:
    """What :func:`resolve` was asked: one repo at one revision, which files, how."""

    repo: RepoLayout
    revision: str
    patterns: Sequence[str] | str | None
    policy: Policy
    progress: Progress | None = None
    on_total: Callable[[int], None] | None = None

    @property
    def pinned(self) -> bool:
        """The revision is a commit id (immutable)."""
        return bool(COMMIT_RE.match(self.revision))

    @property
    def where(self) -> str:
        return f"{self.repo.repo_id}@{self.revision}"


def _options(options: ResolveOptions) -> ResolveOptions:
    """``options`` checked for names :func:`resolve` does not take (``TypeError``, as Python's)."""
    unknown = sorted(set(options) - ResolveOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"resolve() got an unexpected keyword argument {unknown[0]!r}")
    return options


def _cache_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def resolve(repo_id: str, revision: str = "main", **options: Unpack[ResolveOptions]) -> Resolution:
    """Make ``repo_id`` at ``revision`` available in the local stock cache.

    Keyword arguments (:class:`ResolveOptions`): ``repo_type`` (``"model"``),
    ``cache_dir``, ``endpoint``, ``token``, ``allow_patterns``, ``policy``,
    ``progress`` and ``on_total``. Returns a :class:`~cmh.hub.Resolution`
    whose ``path`` is the snapshot folder (``from_pretrained(resolution.path)``).
    ``policy`` defaults to :meth:`Policy.from_env` (offline under
    ``HF_HUB_OFFLINE``). ``progress`` receives byte counts as they arrive,
    ``on_total`` the bytes to fetch. ``token`` as in the stock client
    (:func:`~cmh.hub.resolver._credentials.token_to_send`): a string is sent (``""``
    cannot be: ``httpx2.LocalProtocolError`` once the Hub is to be asked, as stock),
    ``False`` sends no token at all, ``True`` sends ``HF_TOKEN`` or the token
    file (none: the stock ``LocalTokenNotFoundError``), ``None`` too unless
    ``HF_HUB_DISABLE_IMPLICIT_TOKEN`` is set. Raises a
    :class:`~cmh.hub.ResolveError` subclass; the cache is then left with its
    previous snapshot intact.
    """
    o = _options(options)
    policy = o.get("policy")
    validate_repo_id(repo_id)
    validate_revision(revision)
    if o.get("token") is True:  # as stock, a required token that cannot be found is raised
        token_to_send(True)  # before anything else (LocalTokenNotFoundError), also offline
    repo = RepoLayout(_cache_root(o.get("cache_dir")), repo_id, o.get("repo_type", "model"))
    ask = _Ask(
        repo,
        revision,
        o.get("allow_patterns"),
        policy if policy is not None else Policy.from_env(),
        o.get("progress"),
        o.get("on_total"),
    )
    if ask.policy.offline and not os.path.lexists(repo.path):
        # Nothing to read and nothing will be written: no lock, so no lock folder is made
        # (stock's offline call on a cache without the repo leaves none either).
        return _answer_offline(ask, _inspect_local(repo, revision, ask.patterns, ask.pinned))
    # Folders the lock makes that were not there: a resolve that writes nothing (a missing
    # repo, a refusal) removes them again with its lock file, as stock leaves nothing.
    made = [f for f in (repo.root, repo.root / ".locks", repo.locks) if not os.path.lexists(f)]
    try:
        return _resolve_locked(repo, ask, o)
    finally:
        if made and not os.path.lexists(repo.path):
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)


def _resolve_locked(repo: RepoLayout, ask: _Ask, o: ResolveOptions) -> Resolution:
    """:func:`resolve` under the shared repo lock (its file deleted again when the resolve
    left no repo folder and nobody else holds it)."""
    revision = ask.revision
    with repo_lock(repo, shared=True, discard=lambda: not os.path.lexists(repo.path)):
        local = _inspect_local(repo, revision, ask.patterns, ask.pinned)
        if ask.policy.offline:
            return _answer_offline(ask, local)
        if local.complete and not local.corrupt and not ask.policy.revalidate:
            fresh = _local_answer(ask, local)
            if fresh is not None:
                return fresh
        token = token_to_send(o.get("token"))
        check_sendable(token)  # token="": stock's request fails before it is sent, so does this
        started = ask.policy.started
        answer_by = None if started is None else started + metadata_timeout()
        client = HubClient(
            o.get("endpoint"),
            token,
            clock=ask.policy.clock,
            answer_by=answer_by,
            done_by=ask.policy.done_by,
        )
        try:
            return _answer_online(client, ask, local)
        except HubUnreachableError as exc:
            return _answer_stale(ask, local, exc, client)
        except HubProtocolError as exc:
            # Stale-if-error is for a Hub that could not be asked: an answer to the revision
            # request that is not a Hub's (a proxy's page, a refused redirect). Once the Hub
            # named the commit, an answer against the protocol (a listing that disagrees
            # with resolve twice, §4) is raised: serving the old commit would hide it.
            if client.named is not None:
                raise
            return _answer_stale(ask, local, exc, client)
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(exc, f"{repo.repo_id}: writing the cache") from None
            raise
        finally:
            client.close()


@contextlib.contextmanager
def hold(
    repo_id: str, revision: str = "main", **options: Unpack[ResolveOptions]
) -> Iterator[Resolution]:
    """Resolve like :func:`resolve`, and keep the snapshot from being pruned in the block.

    The snapshot's revision lock is taken while the shared repo lock that
    covered the resolve is still held, so no pruner can slip in between;
    ``cmh prune`` skips a held revision until the block ends.
    """
    o = _options(options)
    root = _cache_root(o.get("cache_dir"))
    repo = RepoLayout(root, repo_id, o.get("repo_type", "model"))
    with contextlib.ExitStack() as stack:
        with repo_lock(repo, shared=True):
            scoped = o.copy()
            scoped["cache_dir"] = root
            res = resolve(repo_id, revision, **scoped)
            stack.enter_context(snapshot_in_use(repo, res.commit))
        yield res


# -- local inspection ----------------------------------------------------------------------


def _inspect_local(
    repo: RepoLayout, revision: str, patterns: Sequence[str] | str | None, pinned: bool
) -> _Local:
    commit = revision if pinned else repo.read_ref(revision)
    validation = None if pinned else read_validation(repo, revision)
    local = _Local(commit=commit, tree=None, last_good=validation.commit if validation else None)
    if commit is None:
        return local
    tree = read_tree(repo, commit)
    if tree is None:
        return local
    local.tree = dict(tree)
    local.selection = select(tree, patterns)
    complete = True
    for path in local.selection:
        entry = tree[path]
        etag = linked_etag(repo, commit, path)
        if etag != entry.etag:
            complete = False
            continue
        state = blob_state(repo, entry.etag, entry.size)
        if state == "missing":
            complete = False
        elif state == "corrupt":
            local.corrupt.append(path)
    local.complete = complete
    return local


def _expiry(
    repo: RepoLayout, revision: str, commit: str, paths: list[str], policy: Policy
) -> float:
    if COMMIT_RE.match(revision):
        # A commit id is immutable: only a stamped expiry can pass (unstamped: never).
        return snapshot_expiry(repo, commit, paths, validated_at=float("inf"), default_lifetime=0.0)
    validation = read_validation(repo, revision)
    validated_at = validation.at if validation is not None and validation.commit == commit else None
    return snapshot_expiry(
        repo, commit, paths, validated_at=validated_at, default_lifetime=policy.default_lifetime
    )


def _finite(expiry: float) -> float | None:
    return None if expiry == float("inf") else max(expiry, 0.0)


def _kept_files(repo: RepoLayout, commit: str, paths: list[str]) -> tuple[FileResult, ...]:
    tree = read_tree(repo, commit) or {}
    return tuple(
        FileResult(p, Action.KEPT, tree[p].etag, tree[p].size, 0, tree[p].size)
        for p in paths
        if p in tree
    )


@dataclass(frozen=True)
class _Outcome:
    """What an answer says beside its commit: the state, the files, what asking cost."""

    state: State
    files: tuple[FileResult, ...] = ()
    requests: int = 0
    received: int | None = None  # body bytes over the wire (default: the files')
    expires_at: float | None = None
    previous: str | None = None
    warnings: Sequence[str] = ()


def _result(ask: _Ask, commit: str, outcome: _Outcome) -> Resolution:
    """The answer for ``commit`` (its use recorded for pruning)."""
    repo, files = ask.repo, outcome.files
    record_use(repo, commit, ask.policy.clock.time())
    received = outcome.received
    return Resolution(
        repo_id=repo.repo_id,
        repo_type=repo.repo_type,
        revision=ask.revision,
        commit=commit,
        path=SnapshotPath(repo.snapshot_dir(commit)),
        state=outcome.state,
        files=files,
        requests=outcome.requests,
        bytes_transferred=(
            received if received is not None else sum(f.bytes_transferred for f in files)
        ),
        bytes_reused=sum(f.bytes_reused for f in files),
        expires_at=outcome.expires_at,
        previous_commit=outcome.previous,
        warnings=tuple(outcome.warnings),
    )


def _local_answer(ask: _Ask, local: _Local) -> Resolution | None:
    """LOCAL_ONLY when the complete local snapshot is still fresh, else ``None``."""
    repo, revision, policy, pinned = ask.repo, ask.revision, ask.policy, ask.pinned
    assert local.commit is not None
    expiry = _expiry(repo, revision, local.commit, local.selection, policy)
    now = policy.clock.time()
    if not local.selection and (pinned or now < expiry):
        raise NotFoundError(f"{ask.where}: no such file", "entry", local.commit)
    warnings: list[str] = []
    if now >= expiry:
        if not pinned:
            return None
        if policy.strict:
            raise PolicyError(f"{ask.where} expired at {expiry:.0f} (strict policy)")
        warnings.append(f"commit {revision} is past its CMH expiry; {PINNED_KEPT}")
    files = _kept_files(repo, local.commit, local.selection)
    outcome = _Outcome(State.LOCAL_ONLY, files, expires_at=_finite(expiry), warnings=warnings)
    return _result(ask, local.commit, outcome)


def _answer_offline(ask: _Ask, local: _Local) -> Resolution:
    repo, revision = ask.repo, ask.revision
    if local.corrupt:
        raise IntegrityError(
            f"{repo.repo_id}: cached {', '.join(local.corrupt)} failed its check and the "
            "network may not be used (offline)"
        )
    if local.commit is not None and local.tree is not None and not local.selection:
        raise NotFoundError(f"{ask.where}: no such file", "entry", local.commit)
    if local.commit is not None and local.complete:
        return _serve_local(ask, local.commit, local.selection, _Why(offline=True))
    if local.commit is not None and local.tree is None and repo.snapshot_files(local.commit):
        if ask.policy.strict:
            raise PolicyError(
                f"{ask.where}: snapshot has no tree listing, its completeness "
                "cannot be checked (strict policy)"
            )
        note = f"snapshot has no tree listing: {COMPLETENESS_UNKNOWN}"
        return _result(ask, local.commit, _Outcome(State.LOCAL_ONLY, warnings=[note]))
    fallback = _last_good(repo, local, ask.patterns)
    if fallback is not None:
        note = f"refs/{revision} names an incomplete snapshot; serving the last checked one"
        return _serve_local(ask, fallback[0], fallback[1], _Why(offline=True, note=note))
    return _no_local(repo, revision)


def _no_local(repo: RepoLayout, revision: str) -> NoReturn:
    raise OfflineError(
        f"{repo.repo_id}@{revision} is not in the cache at {repo.root} and the network "
        "may not be used (offline: HF_HUB_OFFLINE or --offline)"
    )


def _last_good(
    repo: RepoLayout, local: _Local, patterns: Sequence[str] | str | None
) -> tuple[str, list[str]] | None:
    commit = local.last_good
    if commit is None or commit == local.commit:
        return None
    tree = read_tree(repo, commit)
    if tree is None:
        return None
    paths = select(tree, patterns)
    for p in paths:
        if linked_etag(repo, commit, p) != tree[p].etag:
            return None
        if blob_state(repo, tree[p].etag, tree[p].size) != "ok":
            return None
    return commit, paths


@dataclass(frozen=True)
class _Why:
    """Why a local snapshot is served without the Hub, and what trying to ask it cost."""

    offline: bool
    note: str | None = None
    cause: str | None = None
    requests: int = 0
    received: int = 0


def _serve_local(ask: _Ask, commit: str, paths: list[str], why: _Why) -> Resolution:
    """A complete checked local snapshot served without the Hub: fresh or stale."""
    repo, policy = ask.repo, ask.policy
    if why.offline:
        # Offline, only a stamped expiry counts: the default lifetime only says how
        # often to revalidate, which offline use cannot do.
        expiry = snapshot_expiry(
            repo, commit, paths, validated_at=float("inf"), default_lifetime=0.0
        )
    else:
        expiry = _expiry(repo, ask.revision, commit, paths, policy)
    warnings = [why.note] if why.note else []
    stale = policy.clock.time() >= expiry and not (ask.pinned and not policy.strict)
    if not stale and why.note is None and why.offline:
        state = State.LOCAL_ONLY
    else:
        reason = why.cause or "offline"
        if policy.strict:
            raise PolicyError(
                f"{ask.where}: the cached snapshot is expired or unconfirmed and "
                f"the Hub cannot confirm it ({reason}); strict policy refuses it"
            )
        state = State.STALE_OFFLINE
        warnings.append(
            f"serving a stale snapshot (commit {commit[:12]}) without the Hub: {reason}"
        )
    outcome = _Outcome(
        state,
        _kept_files(repo, commit, paths),
        requests=why.requests,
        received=why.received,
        expires_at=_finite(expiry),
        warnings=warnings,
    )
    return _result(ask, commit, outcome)


def _answer_stale(ask: _Ask, local: _Local, error: Exception, client: HubClient) -> Resolution:
    """The Hub could not be asked: stale-if-error, or the error.

    What the failed exchange cost is kept: its requests, and every byte that
    came over the wire (an aborted update's ranges included).
    """
    usable: tuple[str, list[str]] | None = None
    if local.commit is not None and local.complete and not local.corrupt:
        usable = (local.commit, local.selection)
    named = client.named
    if named is not None and (usable is None or named != usable[0]):
        # The Hub answered: it named another commit, whose listing or files could not be
        # fetched. Not a Hub that could not be asked: the old commit is not served as if
        # it were the revision's (stock fails here too), and the error says what happened.
        raise HubUnreachableError(
            f"{ask.where}: the Hub named commit {named[:12]}; its files could not be "
            f"fetched: {error}",
            getattr(error, "retry_after", None),
            transient=getattr(error, "transient", True),
        ) from None
    if usable is None or not ask.policy.stale_if_error:
        raise error
    why = _Why(
        offline=False,
        cause=str(error),
        requests=client.requests,
        received=client.bytes_received,
    )
    return _serve_local(ask, usable[0], usable[1], why)


# -- online --------------------------------------------------------------------------------


def revision_listing(
    client: HubClient, repo: RepoLayout, revision: str, pinned: bool
) -> tuple[str, dict[str, RemoteFile], bool]:
    """The commit ``revision`` names and its file list: the cached tree when there is one,
    else the revision answer's list, else the tree endpoint. The flag says whether the list
    came from the Hub (not from the cache). A pinned commit costs no revision request."""
    if pinned:
        commit, listed = revision, None
    else:
        remote_rev = client.revision(repo.repo_id, repo.repo_type, revision)
        commit, listed = remote_rev.commit, remote_rev.files
    cached = read_tree(repo, commit)
    if cached is not None:
        return commit, remote_files_from_tree(cached), False
    if listed is not None:
        return commit, listed, True
    key = (client.endpoint, repo.repo_type, repo.repo_id, commit)
    with _listings_lock:
        seen = _listings.get(key)
    if seen is not None:
        return commit, dict(seen), True
    files = client.tree(repo.repo_id, repo.repo_type, commit)
    with _listings_lock:
        _listings[key] = dict(files)
        while len(_listings) > MAX_LISTINGS_KEPT:
            del _listings[next(iter(_listings))]
    return commit, files, True


#: Listings fetched in this process and not (yet) kept on disk, newest last: a commit's
#: listing never changes, so a process asks for it once even when no file of it was
#: installed (an absent ``adapter_config.json`` probe keeps no ``trees/`` file).
MAX_LISTINGS_KEPT = 32
_listings: dict[tuple[str, str, str, str], dict[str, RemoteFile]] = {}
_listings_lock = threading.Lock()


def forget_listing(client: HubClient, repo: RepoLayout, commit: str) -> None:
    """Drop the in-process listing of ``commit`` (it disagreed with ``resolve``)."""
    with _listings_lock:
        _listings.pop((client.endpoint, repo.repo_type, repo.repo_id, commit), None)


@dataclass(frozen=True)
class _Listing:
    """The files of ``commit`` as a listing names them; ``fetched``: from the Hub, not the cache."""

    commit: str
    files: dict[str, RemoteFile]
    fetched: bool


@dataclass(frozen=True)
class _Brought:
    """A checked blob installed for every selected file of ``listing``."""

    listing: _Listing
    selection: list[str]
    results: tuple[FileResult, ...]
    warnings: list[str]


def _answer_online(client: HubClient, ask: _Ask, local: _Local) -> Resolution:
    """Ask the Hub, bring in what changed, link the snapshot, move the ref, name the state."""
    repo = ask.repo
    adopt_orphans(repo)
    listing = _Listing(*revision_listing(client, repo, ask.revision, ask.pinned))
    old_tree = read_tree(repo, local.commit) if local.commit is not None else None
    # What the cache held before anything is linked (a pinned commit links into its own
    # snapshot: read afterwards, a cold fetch would look FRESH). Without a ref for the
    # revision (a tag asked for the first time), the snapshot of the commit it names.
    before = local.commit if local.commit is not None else listing.commit
    before_tree = old_tree if local.commit is not None else read_tree(repo, before)
    linked_before = _linked_etags(repo, before, select(listing.files, ask.patterns))
    brought = _bring_in_agreed(
        client, repo, listing, lambda agreed: _bring_in(client, ask, local, agreed, old_tree)
    )
    # Decide before acting: a strict refusal leaves snapshots, refs and validations as they were.
    _refuse_expired(ask, brought)
    _link(ask, brought)
    keep_resolver_answers(
        repo, brought.listing.commit, client.answers
    )  # for install() (answers.py)
    previous = _swap(ask, brought.listing)
    commit = brought.listing.commit
    expiry = _expiry(repo, ask.revision, commit, brought.selection, ask.policy)
    outcome = _Outcome(
        _state(brought, _old_etags(brought, before_tree, linked_before)),
        brought.results,
        requests=client.requests,
        received=client.bytes_received,
        expires_at=_finite(expiry),
        previous=previous if previous != commit else None,
        warnings=brought.warnings,
    )
    return _result(ask, commit, outcome)


def _bring_in_agreed(
    client: HubClient,
    repo: RepoLayout,
    listing: _Listing,
    bring_in: Callable[[_Listing], _Brought],
) -> _Brought:
    """``bring_in(listing)``, with the listing asked for once more if it disagrees with
    ``resolve``."""
    commit = listing.commit
    try:
        return bring_in(listing)
    except _ListingDisagrees as first:
        disagreement = first
    except IntegrityError:
        discard_tree(repo, commit)  # a listing that led to a failed check is not kept
        forget_listing(client, repo, commit)
        raise
    # What the listing claims for this commit is not what resolve serves for it:
    # drop the listing and ask for it again (the tree endpoint, not the one that lied).
    logger.info("%s@%s: %s; listing fetched again", repo.repo_id, commit[:12], disagreement)
    discard_tree(repo, commit)
    forget_listing(client, repo, commit)
    again = _Listing(commit, client.tree(repo.repo_id, repo.repo_type, commit), True)
    try:
        return bring_in(again)
    except _ListingDisagrees as exc:
        raise HubProtocolError(
            f"{repo.repo_id}@{commit[:12]}: {exc}, also in a listing fetched again; "
            "nothing installed"
        ) from None


def _refuse_expired(ask: _Ask, brought: _Brought) -> None:
    """Strict policy: refuse a selection with a file past its CMH expiry."""
    if not ask.policy.strict:
        return
    files = brought.listing.files
    now = ask.policy.clock.time()
    expired = [
        p for p in brought.selection if _stamp_expired(ask.repo.blob_path(files[p].etag), p, now)
    ]
    if expired:
        raise PolicyError(f"{ask.where}: {', '.join(expired)} past its CMH expiry (strict policy)")


def _link(ask: _Ask, brought: _Brought) -> None:
    """Keep the listing, then link the snapshot: every selected blob is installed and holds
    what ``resolve`` serves for the commit."""
    listing = brought.listing
    write_tree(ask.repo, listing.commit, listing.files, replace=listing.fetched)
    added = [r for r in brought.results if r.action is not Action.KEPT]
    if added:  # as the stock client, before it writes a file into the cache
        tag_cache_dir(ask.repo.root)
    for r in added:
        ask.repo.link_snapshot_file(listing.commit, r.path, r.etag)


def _swap(ask: _Ask, listing: _Listing) -> str | None:
    """Move the ref to the linked commit (only now) and record the validation; the ref's
    previous commit (``None`` for a pinned commit)."""
    repo, revision, commit = ask.repo, ask.revision, listing.commit
    previous = repo.read_ref(revision) if not ask.pinned else None
    if not ask.pinned and previous != commit:
        repo.write_ref(revision, commit)
    if not ask.pinned:
        write_validation(repo, revision, commit, at=ask.policy.clock.time())
    clean_no_exist(repo, commit, listing.files)
    return previous


def _old_etags(
    brought: _Brought,
    old_tree: dict[str, LocalEntry] | None,
    linked_before: dict[str, str],
) -> dict[str, str]:
    """The blob each selected file had in the cache before (linked files only)."""
    old: dict[str, str] = {}
    for p in brought.selection:
        if old_tree is not None and p in old_tree and p in linked_before:
            old[p] = old_tree[p].etag
        elif p in linked_before:
            old[p] = linked_before[p]
    return old


def _state(brought: _Brought, old_etags: dict[str, str]) -> State:
    """The state the answer is in (spec/resolver.md §2), from what the cache held before."""
    files = brought.listing.files
    if any(r.action is Action.REFETCHED for r in brought.results):
        return State.CORRUPT
    if not old_etags:
        return State.MISSING
    if all(old_etags.get(p) == files[p].etag for p in brought.selection):
        return State.FRESH
    return State.ETAG_MISMATCH


def _linked_etags(repo: RepoLayout, commit: str | None, paths: list[str]) -> dict[str, str]:
    """The blob each of ``paths`` links to in ``snapshots/{commit}`` now (unlinked left out)."""
    if commit is None:
        return {}
    linked = {p: linked_etag(repo, commit, p) for p in paths}
    return {p: e for p, e in linked.items() if e is not None}


def _fetch_all(
    work: Callable[[tuple[str, RemoteFile]], FileResult],
    plans: list[tuple[str, RemoteFile]],
    workers: int,
) -> tuple[FileResult, ...]:
    """``work`` over every plan; the first error cancels the files not yet started.

    A refusal (a gated repo) or a missing commit is the same for every file:
    only the requests already in flight (at most ``workers``) are made.
    """
    failed = threading.Event()

    def guarded(plan: tuple[str, RemoteFile]) -> FileResult | None:
        if failed.is_set():
            return None  # an earlier file failed: not started
        try:
            return work(plan)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(guarded, plan) for plan in plans]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            error = future.exception() if future.done() else None
            if error is not None:
                for other in futures:
                    other.cancel()
                raise error
        results = tuple(future.result() for future in futures)
    return tuple(r for r in results if r is not None)


def _bring_in(
    client: HubClient,
    ask: _Ask,
    local: _Local,
    listing: _Listing,
    old_tree: dict[str, LocalEntry] | None,
) -> _Brought:
    """Install a checked blob for every selected file of the commit as ``listing`` lists it."""
    repo, files, commit = ask.repo, listing.files, listing.commit
    selection = select(files, ask.patterns)
    if ask.patterns is not None and not selection:
        raise NotFoundError(f"{ask.where}: no file matches {ask.patterns!r}", "entry", commit)
    prefer = [c for c in (local.commit, local.last_good) if c]
    old = old_tree or {}
    corrupt_etags = {old[p].etag for p in local.corrupt if p in old}
    fetcher = _Fetcher(client, repo, ask.policy, ask.progress)
    plans = [(p, files[p]) for p in selection]
    if ask.on_total is not None:
        ask.on_total(sum(f.size for _, f in plans if blob_state(repo, f.etag, f.size) != "ok"))

    def work(item: tuple[str, RemoteFile]) -> FileResult:
        path, remote = item
        return fetcher.ensure(commit, path, remote, prefer, remote.etag in corrupt_etags)

    results = _fetch_all(work, plans, max(1, min(ask.policy.max_workers, len(plans))))
    return _Brought(listing, selection, results, fetcher.warnings)


class _ListingDisagrees(Exception):
    """The listing names another blob for a path than ``resolve`` serves for the commit."""


def _stamp_expired(blob: Path, path: str, now: float) -> bool:
    if not path.endswith(".safetensors"):
        return False
    value = stamped_expiry(blob)
    return value is not None and value != 0 and now >= value


class _Fetcher:
    """Brings the blob of one file of a commit into the cache (linking is the caller's)."""

    def __init__(
        self, client: HubClient, repo: RepoLayout, policy: Policy, progress: Progress | None
    ) -> None:
        self.client = client
        self.repo = repo
        self.policy = policy
        self.progress = progress
        self.warnings: list[str] = []
        self._lock = threading.Lock()

    def _warn(self, message: str) -> None:
        with self._lock:
            self.warnings.append(message)

    def ensure(
        self, commit: str, path: str, remote: RemoteFile, prefer: list[str], was_corrupt: bool
    ) -> FileResult:
        repo = self.repo
        linked = linked_etag(repo, commit, path) == remote.etag
        state = blob_state(repo, remote.etag, remote.size, recheck=was_corrupt)
        if state == "ok":
            if has_partials(repo, remote.etag):  # left by a try that another one completed
                with blob_lock(repo, remote.etag):
                    discard_partials(repo, remote.etag)
            if not linked:
                self._confirm(commit, path, remote)
            action = Action.KEPT if linked else Action.LINKED
            return FileResult(path, action, remote.etag, remote.size, 0, remote.size)
        with blob_lock(repo, remote.etag):
            # Another process may have installed it while we waited.
            state = blob_state(repo, remote.etag, remote.size, recheck=was_corrupt)
            if state == "ok":
                discard_partials(repo, remote.etag)
                self._confirm(commit, path, remote)
                return FileResult(path, Action.LINKED, remote.etag, remote.size, 0, remote.size)
            corrupt = state == "corrupt" or was_corrupt
            if corrupt:
                self._warn(
                    f"{path}: cached blob {remote.etag[:12]} failed its check; fetched again"
                )
            try:
                result = self._fetch(commit, path, remote, prefer, corrupt)
            except IntegrityError:
                # Wrong bytes, or a listing that names a blob the commit does not serve?
                self._confirm(commit, path, remote)
                raise
            discard_partials(repo, remote.etag)  # e.g. a prefix an assembly did not need
            return result

    def _confirm(self, commit: str, path: str, remote: RemoteFile) -> None:
        """Check the listed blob against what ``resolve`` answers for ``path`` at ``commit``.

        A file whose bytes are fetched is confirmed by them (they hash to the
        listed ETag or are refused); a file linked to a blob already cached is
        confirmed here, with one HEAD request.
        """
        repo = self.repo
        url = self.client.file_url(repo.repo_id, repo.repo_type, commit, path)
        try:
            served = self.client.served(url)
        except NotFoundError as exc:
            if exc.kind != "entry":
                raise
            raise _ListingDisagrees(f"{path} is listed but resolve has no such file") from None
        if served.etag is None:
            raise HubProtocolError(f"{url}: answer has no ETag")
        if served.commit is not None and served.commit != commit:
            raise _ListingDisagrees(f"{path}: resolve answered for commit {served.commit[:12]}")
        if served.etag != remote.etag or (served.size is not None and served.size != remote.size):
            raise _ListingDisagrees(
                f"{path} is listed as blob {remote.etag[:12]} ({remote.size} bytes) but resolve "
                f"serves {served.etag[:12]} ({served.size} bytes)"
            )

    def _fetch(
        self, commit: str, path: str, remote: RemoteFile, prefer: list[str], corrupt: bool
    ) -> FileResult:
        repo, client = self.repo, self.client
        job = Job(
            client,
            repo,
            remote,
            client.file_url(repo.repo_id, repo.repo_type, commit, path),
            strict=self.policy.strict,
            connections=self.policy.connections,
            chunk_bytes=self.policy.chunk_bytes,
            tally=Tally(self.progress),
        )
        if not corrupt and self._patchable(path, remote):
            patched = self._patch(job, commit, path, prefer)
            if patched is not None:
                return patched
        resumable = partial_path(repo, remote.etag)
        had_partial = (resumable.exists() and resumable.stat().st_size > 0) or chunked.has_partial(
            repo, remote.etag
        )
        before = job.tally.total
        resumed, warnings = download_whole(job)
        for w in warnings:
            self._warn(f"{path}: {w}")
        if corrupt:
            action = Action.REFETCHED
        elif resumed and had_partial:
            action = Action.RESUMED
        else:
            action = Action.DOWNLOADED
        # Reused: what a partial already held; received: every byte of the file that came
        # over the wire, an update given up for this download included.
        reused = max(0, remote.size - (job.tally.total - before))
        return FileResult(path, action, remote.etag, remote.size, job.tally.total, reused)

    def _patch(self, job: Job, commit: str, path: str, prefer: list[str]) -> FileResult | None:
        """``path`` updated tensor by tensor from an older local version; ``None``: fetch whole."""
        repo, client = self.repo, self.client
        old = find_old_version(repo, path, prefer)
        if old is None or old == job.remote.etag:
            return None
        if blob_state(repo, old, repo.blob_path(old).stat().st_size) != "ok":
            return None
        try:
            patched = patch_blob(
                job,
                old,
                manifest=lambda: client.tensor_manifest(repo.repo_id, repo.repo_type, commit, path),
            )
        except (PatchNotPossible, HubProtocolError) as exc:
            # Not stamped, no usable old version, or a server that does not
            # answer ranges as asked (e.g. ignores Range): fetch it whole.
            logger.info("%s: fetched whole (%s)", path, exc)
            return None
        except IntegrityError as exc:
            self._warn(f"{path}: assembled file failed its check ({exc}); fetched whole")
            return None
        for w in patched.warnings:
            self._warn(f"{path}: {w}")
        remote = job.remote
        return FileResult(
            path, Action.PATCHED, remote.etag, remote.size, job.tally.total, patched.bytes_reused
        )

    def _patchable(self, path: str, remote: RemoteFile) -> bool:
        return path.endswith(".safetensors") and remote.lfs and remote.size >= PATCH_MIN_BYTES


def fresh_commit(repo: RepoLayout, revision: str, policy: Policy | None = None) -> str | None:
    """The commit ``revision`` names when its local snapshot may be used without the Hub.

    The rule by which :func:`resolve` answers LOCAL_ONLY (spec/resolver.md
    §3), for the selection of the files the snapshot holds: the commit's
    listing is cached, each of those files is linked to its listed blob,
    checked, and the selection is fresh (a commit id: whatever its expiry).
    ``None`` otherwise, or when the policy says ``revalidate``. No request.
    """
    policy = policy if policy is not None else Policy.from_env()
    if policy.revalidate:
        return None
    pinned = bool(COMMIT_RE.match(revision))
    commit = revision if pinned else repo.read_ref(revision)
    tree = read_tree(repo, commit) if commit is not None else None
    if commit is None or tree is None:
        return None
    present = [p for p in tree if os.path.lexists(repo.snapshot_file(commit, p))]
    if not present:
        return None
    local = _inspect_local(repo, revision, [glob.escape(p) for p in present], pinned)
    if local.commit is None or local.tree is None or not local.complete or local.corrupt:
        return None
    if pinned:
        return local.commit
    expiry = _expiry(repo, revision, local.commit, local.selection, policy)
    return local.commit if policy.clock.time() < expiry else None
