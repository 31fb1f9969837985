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
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ..cache.blobs import blob_state, disk_full_error, is_disk_full, partial_path
from ..cache.housekeeping import adopt_orphans, clean_no_exist
from ..cache.layout import (
    COMMIT_RE,
    RepoLayout,
    default_cache_dir,
    validate_repo_id,
    validate_revision,
)
from ..cache.locks import blob_lock, repo_lock, snapshot_in_use
from ..cache.usage import record_use
from . import chunked
from .credentials import default_token
from .fetch import download_whole
from .http import HubClient
from .local import (
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
from .partial import PatchNotPossible, patch_blob
from .types import (
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


def resolve(
    repo_id: str,
    revision: str = "main",
    *,
    repo_type: str = "model",
    cache_dir: str | Path | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    allow_patterns: Sequence[str] | str | None = None,
    policy: Policy | None = None,
    progress: Progress | None = None,
    on_total: Callable[[int], None] | None = None,
) -> Resolution:
    """Make ``repo_id`` at ``revision`` available in the local stock cache.

    Returns a :class:`~cmh.hub.Resolution` whose ``path`` is the snapshot
    folder (``from_pretrained(resolution.path)``). ``policy`` defaults to
    :meth:`Policy.from_env` (offline under ``HF_HUB_OFFLINE``). ``progress``
    receives byte counts as they arrive, ``on_total`` the bytes to fetch.
    ``token`` as in the stock client: a string is sent, ``False`` sends no
    token at all, ``None`` or ``True`` sends ``HF_TOKEN`` (or the token file).
    Raises a :class:`~cmh.hub.ResolveError` subclass; the cache is then left
    with its previous snapshot intact.
    """
    policy = policy if policy is not None else Policy.from_env()
    validate_repo_id(repo_id)
    validate_revision(revision)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    repo = RepoLayout(root, repo_id, repo_type)
    pinned = bool(COMMIT_RE.match(revision))
    with repo_lock(repo, shared=True):
        local = _inspect_local(repo, revision, allow_patterns, pinned)
        if policy.offline:
            return _answer_offline(repo, revision, local, policy, allow_patterns)
        if local.complete and not local.corrupt and not policy.revalidate:
            fresh = _local_answer(repo, revision, local, policy, pinned)
            if fresh is not None:
                return fresh
        client = HubClient(endpoint, _token_to_send(token))
        try:
            return _answer_online(
                client, repo, revision, local, policy, allow_patterns, pinned, progress, on_total
            )
        except (HubUnreachableError, HubProtocolError) as exc:
            return _answer_stale(repo, revision, local, policy, exc, client.requests)
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(exc, f"{repo.repo_id}: writing the cache") from None
            raise
        finally:
            client.close()


def _token_to_send(token: str | bool | None) -> str | None:
    """The stock meaning of ``token``: ``False`` refuses any token, ``None``/``True`` finds one."""
    if token is False:
        return None
    if isinstance(token, str):
        return token or None
    return default_token()


@contextlib.contextmanager
def hold(
    repo_id: str,
    revision: str = "main",
    *,
    repo_type: str = "model",
    cache_dir: str | Path | None = None,
    **options: Any,
) -> Iterator[Resolution]:
    """Resolve like :func:`resolve`, and keep the snapshot from being pruned in the block.

    The snapshot's revision lock is taken while the shared repo lock that
    covered the resolve is still held, so no pruner can slip in between;
    ``cmh prune`` skips a held revision until the block ends.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    repo = RepoLayout(root, repo_id, repo_type)
    with contextlib.ExitStack() as stack:
        with repo_lock(repo, shared=True):
            res = resolve(repo_id, revision, repo_type=repo_type, cache_dir=root, **options)
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


def _result(
    repo: RepoLayout,
    revision: str,
    commit: str,
    state: State,
    files: tuple[FileResult, ...],
    *,
    requests: int = 0,
    received: int | None = None,
    expires_at: float | None = None,
    previous: str | None = None,
    warnings: Sequence[str] = (),
) -> Resolution:
    """The answer; ``received``: body bytes that came over the wire (default: the files')."""
    record_use(repo, commit)
    return Resolution(
        repo_id=repo.repo_id,
        repo_type=repo.repo_type,
        revision=revision,
        commit=commit,
        path=SnapshotPath(repo.snapshot_dir(commit)),
        state=state,
        files=files,
        requests=requests,
        bytes_transferred=(
            received if received is not None else sum(f.bytes_transferred for f in files)
        ),
        bytes_reused=sum(f.bytes_reused for f in files),
        expires_at=expires_at,
        previous_commit=previous,
        warnings=tuple(warnings),
    )


def _local_answer(
    repo: RepoLayout, revision: str, local: _Local, policy: Policy, pinned: bool
) -> Resolution | None:
    """LOCAL_ONLY when the complete local snapshot is still fresh, else ``None``."""
    assert local.commit is not None
    expiry = _expiry(repo, revision, local.commit, local.selection, policy)
    if not local.selection and (pinned or time.time() < expiry):
        raise NotFoundError(f"{repo.repo_id}@{revision}: no such file", "entry", local.commit)
    now = time.time()
    warnings: list[str] = []
    if now >= expiry:
        if not pinned:
            return None
        if policy.strict:
            raise PolicyError(f"{repo.repo_id}@{revision} expired at {expiry:.0f} (strict policy)")
        warnings.append(f"commit {revision} is past its CMH expiry; a pinned commit is kept")
    return _result(
        repo,
        revision,
        local.commit,
        State.LOCAL_ONLY,
        _kept_files(repo, local.commit, local.selection),
        expires_at=_finite(expiry),
        warnings=warnings,
    )


def _answer_offline(
    repo: RepoLayout,
    revision: str,
    local: _Local,
    policy: Policy,
    patterns: Sequence[str] | str | None,
) -> Resolution:
    if local.corrupt:
        raise IntegrityError(
            f"{repo.repo_id}: cached {', '.join(local.corrupt)} failed its check and the "
            "network may not be used (offline)"
        )
    if local.commit is not None and local.tree is not None and not local.selection:
        raise NotFoundError(f"{repo.repo_id}@{revision}: no such file", "entry", local.commit)
    if local.commit is not None and local.complete:
        return _serve_local(repo, revision, local.commit, local.selection, policy, offline=True)
    if local.commit is not None and local.tree is None and repo.snapshot_files(local.commit):
        if policy.strict:
            raise PolicyError(
                f"{repo.repo_id}@{revision}: snapshot has no tree listing, its completeness "
                "cannot be checked (strict policy)"
            )
        note = "snapshot has no tree listing: served as found, completeness unknown"
        return _result(repo, revision, local.commit, State.LOCAL_ONLY, (), warnings=[note])
    fallback = _last_good(repo, local, patterns)
    if fallback is not None:
        return _serve_local(
            repo,
            revision,
            fallback[0],
            fallback[1],
            policy,
            offline=True,
            note=f"refs/{revision} names an incomplete snapshot; serving the last checked one",
        )
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


def _serve_local(
    repo: RepoLayout,
    revision: str,
    commit: str,
    paths: list[str],
    policy: Policy,
    *,
    offline: bool,
    note: str | None = None,
    cause: str | None = None,
    requests: int = 0,
) -> Resolution:
    """A complete checked local snapshot served without the Hub: fresh or stale."""
    if offline:
        # Offline, only a stamped expiry counts: the default lifetime only says how
        # often to revalidate, which offline use cannot do.
        expiry = snapshot_expiry(
            repo, commit, paths, validated_at=float("inf"), default_lifetime=0.0
        )
    else:
        expiry = _expiry(repo, revision, commit, paths, policy)
    pinned = bool(COMMIT_RE.match(revision))
    warnings = [note] if note else []
    stale = time.time() >= expiry and not (pinned and not policy.strict)
    if not stale and note is None and offline:
        state = State.LOCAL_ONLY
    else:
        if policy.strict:
            why = cause or "offline"
            raise PolicyError(
                f"{repo.repo_id}@{revision}: the cached snapshot is expired or unconfirmed and "
                f"the Hub cannot confirm it ({why}); strict policy refuses it"
            )
        state = State.STALE_OFFLINE
        reason = cause or "offline"
        warnings.append(
            f"serving a stale snapshot (commit {commit[:12]}) without the Hub: {reason}"
        )
    return _result(
        repo,
        revision,
        commit,
        state,
        _kept_files(repo, commit, paths),
        requests=requests,
        expires_at=_finite(expiry),
        warnings=warnings,
    )


def _answer_stale(
    repo: RepoLayout,
    revision: str,
    local: _Local,
    policy: Policy,
    error: Exception,
    requests: int,
) -> Resolution:
    """The Hub could not be asked: stale-if-error, or the error."""
    usable: tuple[str, list[str]] | None = None
    if local.commit is not None and local.complete and not local.corrupt:
        usable = (local.commit, local.selection)
    if usable is None or not policy.stale_if_error:
        raise error
    return _serve_local(
        repo,
        revision,
        usable[0],
        usable[1],
        policy,
        offline=False,
        cause=str(error),
        requests=requests,
    )


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


def _answer_online(
    client: HubClient,
    repo: RepoLayout,
    revision: str,
    local: _Local,
    policy: Policy,
    patterns: Sequence[str] | str | None,
    pinned: bool,
    progress: Progress | None,
    on_total: Callable[[int], None] | None,
) -> Resolution:
    adopt_orphans(repo)
    commit, files, fetched = revision_listing(client, repo, revision, pinned)
    old_tree = read_tree(repo, local.commit) if local.commit is not None else None
    # What the cache held before anything is linked (a pinned commit links into its own
    # snapshot: read afterwards, a cold fetch would look FRESH).
    linked_before = _linked_etags(repo, local.commit, select(files, patterns))
    try:
        selection, results, fetcher = _bring_in(
            client, repo, revision, commit, files, local, old_tree, policy, patterns,
            progress, on_total,
        )  # fmt: skip
    except _ListingDisagrees as first:
        # What the listing claims for this commit is not what resolve serves for it:
        # drop the listing and ask for it again (the tree endpoint, not the one that lied).
        logger.info("%s@%s: %s; listing fetched again", repo.repo_id, commit[:12], first)
        discard_tree(repo, commit)
        forget_listing(client, repo, commit)
        files = client.tree(repo.repo_id, repo.repo_type, commit)
        fetched = True
        try:
            selection, results, fetcher = _bring_in(
                client, repo, revision, commit, files, local, old_tree, policy, patterns,
                progress, on_total,
            )  # fmt: skip
        except _ListingDisagrees as again:
            raise HubProtocolError(
                f"{repo.repo_id}@{commit[:12]}: {again}, also in a listing fetched again; "
                "nothing installed"
            ) from None
    except IntegrityError:
        discard_tree(repo, commit)  # a listing that led to a failed check is not kept
        forget_listing(client, repo, commit)
        raise

    # Decide before acting: a strict refusal leaves snapshots, refs and validations as they were.
    if policy.strict:
        expired = [p for p in selection if _stamp_expired(repo.blob_path(files[p].etag), p)]
        if expired:
            raise PolicyError(
                f"{repo.repo_id}@{revision}: {', '.join(expired)} past its CMH expiry "
                "(strict policy)"
            )
    # Every selected blob is installed and holds what resolve serves for this commit:
    # keep the listing, then link the snapshot.
    write_tree(repo, commit, files, replace=fetched)
    for r in results:
        if r.action is not Action.KEPT:
            repo.link_snapshot_file(commit, r.path, r.etag)

    # Swap: every file is linked to a checked blob; only now does the ref move.
    previous = repo.read_ref(revision) if not pinned else None
    if not pinned and previous != commit:
        repo.write_ref(revision, commit)
    if not pinned:
        write_validation(repo, revision, commit)
    clean_no_exist(repo, commit, files)

    old_etags: dict[str, str] = {}
    if local.commit is not None:
        for p in selection:
            if old_tree is not None and p in old_tree and p in linked_before:
                old_etags[p] = old_tree[p].etag
            elif p in linked_before:
                old_etags[p] = linked_before[p]
    if any(r.action is Action.REFETCHED for r in results):
        state = State.CORRUPT
    elif not old_etags:
        state = State.MISSING
    elif all(old_etags.get(p) == files[p].etag for p in selection):
        state = State.FRESH
    else:
        state = State.ETAG_MISMATCH
    expiry = _expiry(repo, revision, commit, selection, policy)
    return _result(
        repo,
        revision,
        commit,
        state,
        results,
        requests=client.requests,
        received=client.bytes_received,
        expires_at=_finite(expiry),
        previous=previous if previous != commit else None,
        warnings=list(fetcher.warnings),
    )


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
    repo: RepoLayout,
    revision: str,
    commit: str,
    files: dict[str, RemoteFile],
    local: _Local,
    old_tree: dict[str, LocalEntry] | None,
    policy: Policy,
    patterns: Sequence[str] | str | None,
    progress: Progress | None,
    on_total: Callable[[int], None] | None,
) -> tuple[list[str], tuple[FileResult, ...], _Fetcher]:
    """Install a checked blob for every selected file of ``commit`` as ``files`` lists it."""
    selection = select(files, patterns)
    if patterns is not None and not selection:
        raise NotFoundError(
            f"{repo.repo_id}@{revision}: no file matches {patterns!r}", "entry", commit
        )
    prefer = [c for c in (local.commit, local.last_good) if c]
    old = old_tree or {}
    corrupt_etags = {old[p].etag for p in local.corrupt if p in old}
    fetcher = _Fetcher(client, repo, policy, progress)
    plans = [(p, files[p]) for p in selection]
    if on_total is not None:
        on_total(sum(f.size for _, f in plans if blob_state(repo, f.etag, f.size) != "ok"))

    def work(item: tuple[str, RemoteFile]) -> FileResult:
        path, remote = item
        return fetcher.ensure(commit, path, remote, prefer, remote.etag in corrupt_etags)

    results = _fetch_all(work, plans, max(1, min(policy.max_workers, len(plans))))
    return selection, results, fetcher


class _ListingDisagrees(Exception):
    """The listing names another blob for a path than ``resolve`` serves for the commit."""


def _stamp_expired(blob: Path, path: str) -> bool:
    if not path.endswith(".safetensors"):
        return False
    value = stamped_expiry(blob)
    return value is not None and value != 0 and time.time() >= value


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
            if not linked:
                self._confirm(commit, path, remote)
            action = Action.KEPT if linked else Action.LINKED
            return FileResult(path, action, remote.etag, remote.size, 0, remote.size)
        with blob_lock(repo, remote.etag):
            # Another process may have installed it while we waited.
            state = blob_state(repo, remote.etag, remote.size, recheck=was_corrupt)
            if state == "ok":
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
        url = client.file_url(repo.repo_id, repo.repo_type, commit, path)
        if not corrupt and self._patchable(path, remote):
            old = find_old_version(repo, path, prefer)
            if old is not None and old != remote.etag:
                old_size = repo.blob_path(old).stat().st_size
                if blob_state(repo, old, old_size) == "ok":
                    try:
                        patched = patch_blob(
                            client,
                            repo,
                            remote,
                            url,
                            old,
                            strict=self.policy.strict,
                            connections=self.policy.connections,
                            chunk_bytes=self.policy.chunk_bytes,
                            progress=self.progress,
                            manifest=lambda: client.tensor_manifest(
                                repo.repo_id, repo.repo_type, commit, path
                            ),
                        )
                    except (PatchNotPossible, HubProtocolError) as exc:
                        # Not stamped, no usable old version, or a server that does not
                        # answer ranges as asked (e.g. ignores Range): fetch it whole.
                        logger.info("%s: fetched whole (%s)", path, exc)
                    except IntegrityError as exc:
                        self._warn(
                            f"{path}: assembled file failed its check ({exc}); fetched whole"
                        )
                    else:
                        for w in patched.warnings:
                            self._warn(f"{path}: {w}")
                        return FileResult(
                            path,
                            Action.PATCHED,
                            remote.etag,
                            remote.size,
                            patched.bytes_received,
                            patched.bytes_reused,
                        )
        resumable = partial_path(repo, remote.etag)
        had_partial = (resumable.exists() and resumable.stat().st_size > 0) or chunked.has_partial(
            repo, remote.etag
        )
        received, resumed, warnings = download_whole(
            client, repo, remote, url, strict=self.policy.strict, progress=self.progress,
            connections=self.policy.connections, chunk_bytes=self.policy.chunk_bytes,
        )  # fmt: skip
        for w in warnings:
            self._warn(f"{path}: {w}")
        if corrupt:
            action = Action.REFETCHED
        elif resumed and had_partial:
            action = Action.RESUMED
        else:
            action = Action.DOWNLOADED
        reused = max(0, remote.size - received)
        return FileResult(path, action, remote.etag, remote.size, received, reused)

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
    return local.commit if time.time() < expiry else None
