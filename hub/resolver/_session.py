"""install()'s HTTP hook: huggingface_hub's client answers fresh snapshots from the cache.

huggingface_hub 2.x sends every Hub call of every library through one
``httpx2.Client`` built by the factory given to ``set_client_factory``.
:func:`client_factory` wraps the factory that was in place: the client it
builds is unchanged except that its transport is a :class:`FreshCacheTransport`.

HTTP caching as in RFC 9111, with the snapshot's freshness (spec/resolver.md
§3: the CMH ``expires_at`` of its stamped weights) as the freshness lifetime:

- a revision is *known* at commit C when it is C, when its complete checked
  snapshot is fresh (:func:`~cmh.hub.resolver._negotiate.fresh_commit`), or when
  the Hub named C for it less than ``install(window=...)`` seconds ago in this
  process (the install window, shared with the download hook);
- ``resolve`` (HEAD or GET, one byte range or none) of a file of a known
  commit is answered from the cached blob (404 ``EntryNotFound`` when the
  commit's listing lacks it and the Hub said so: its ``.no_exist`` marker;
  otherwise the request goes on, as stock's does); the Hub API (repo info,
  revision info, tree pages) for a known revision is answered with the answer
  the Hub gave for C, stored in ``{repo}/.cmh/answers/{C}/`` the first time it
  was asked (a commit's answers do not change);
- outside a patched call (a bare API call: ``model_info``, ``HfFileSystem``),
  a revision is known only when, within the window, the Hub named its commit
  or a patched call of the repo was answered from the cache (the call is part
  of that load), unless ``install(api_from_cache=True)``: otherwise it goes to
  the Hub, and fails as stock's does when the Hub cannot be reached;
- for an unknown revision the request goes to the Hub unchanged: one repo
  info answer is the revalidation of the repo (its ``sha`` is remembered for
  the window and, when it confirms the cached ref, recorded as a validation);
- a ``resolve`` of a branch sent on while the branch is known at C (a file C's
  listing lacks, as a load probes) is answered by the Hub at the branch: when
  its ``X-Repo-Commit`` names another commit, the branch moved, and the window
  moves with it (the rest of the load is answered at the commit the Hub named,
  as stock's next calls would be, not at C).

Written here rather than with hishel (measured, see docs/resolver.md): hishel
keeps one freshness per URL from response headers or a fixed TTL, stores
bodies in its own database, and revalidates URL by URL; here freshness is
per repo (the stamps), bodies are the cache's own blobs, and one request
revalidates every URL of the repo. Any failure inside the hook sends the
request on unchanged: the hook can only save requests, never change answers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx2
from cmh.hub.cache import (
    COMMIT_RE,
    LayoutError,
    RepoLayout,
    blob_state,
    json_value,
    validate_repo_id,
)

from .._ranges import RangeNotSatisfiable, parse_range
from ._answers import read_answer, write_answer
from ._credentials import SENDABLE_VALUE, credential_digest
from ._local import hub_said_absent, linked_etag, read_tree, write_validation
from ._window import (
    Asked,
    api_from_cache,
    current_policy,
    in_patched_call,
    loaded_commit,
    recent_commit,
    remember_commit,
    remember_loaded,
    scoped_cache,
)

logger = logging.getLogger("cmh.hub")

_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_PREFIX = {"model": "models", "dataset": "datasets", "space": "spaces"}
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Target:
    """A Hub request the hook may answer: ``kind`` is ``info``, ``tree`` or ``resolve``."""

    kind: str
    repo_type: str
    repo_id: str
    revision: str
    rest: str  # tree: the folder ("" = root); resolve: the file path


def parse_target(url: httpx2.URL) -> Target | None:
    """The repo request ``url`` names, or ``None`` for anything else."""
    parts = [unquote(p) for p in url.raw_path.decode("ascii", "replace").split("?")[0].split("/")]
    parts = parts[1:]
    try:
        if len(parts) >= 3 and parts[0] == "api" and parts[1] in _TYPES:
            return _api_target(_TYPES[parts[1]], parts[2:])
        repo_type = "model"
        if parts and parts[0] in ("datasets", "spaces"):
            repo_type, parts = _TYPES[parts[0]], parts[1:]
        for n in (2, 1):
            if len(parts) > n + 2 and parts[n] == "resolve":
                repo_id = validate_repo_id("/".join(parts[:n]))
                path = "/".join(parts[n + 2 :])
                if path and all(s not in ("", ".", "..") for s in path.split("/")):
                    return Target("resolve", repo_type, repo_id, parts[n + 1], path)
    except LayoutError:
        return None
    return None


def _api_target(repo_type: str, parts: list[str]) -> Target | None:
    for n in (2, 1):
        if len(parts) < n:
            continue
        repo, rest = parts[:n], parts[n:]
        if not rest:
            return Target("info", repo_type, validate_repo_id("/".join(repo)), "main", "")
        if rest[0] == "revision" and len(rest) == 2:
            return Target("info", repo_type, validate_repo_id("/".join(repo)), rest[1], "")
        if rest[0] == "tree" and len(rest) >= 2:
            folder = "/".join(rest[2:])
            return Target("tree", repo_type, validate_repo_id("/".join(repo)), rest[1], folder)
    return None


def _rewritten(url: httpx2.URL, target: Target, commit: str) -> httpx2.URL:
    """``url`` with the revision replaced by ``commit`` (info becomes ``/revision/C``)."""
    base = f"/api/{_PREFIX[target.repo_type]}/{target.repo_id}"
    if target.kind == "info":
        path = f"{base}/revision/{commit}"
    else:
        path = f"{base}/tree/{commit}" + (f"/{quote(target.rest)}" if target.rest else "")
    return url.copy_with(raw_path=(path + (f"?{url.query.decode()}" if url.query else "")).encode())


class _FileStream(httpx2.SyncByteStream):
    """``length`` bytes of a blob from ``start``."""

    def __init__(self, path: Path, start: int, length: int) -> None:
        self.path, self.start, self.length = path, start, length

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            left = self.length
            while left > 0:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk


def _one_range(value: str | None, size: int) -> tuple[int, int] | bool | None:
    """``(start, end)`` of a single satisfiable byte range, ``None`` without one, ``False`` else.

    Read by the hub's one ``Range`` parser; a header of several ranges (even touching
    ones the parser would merge) or another unit is ``False``: the Hub answers those.
    """
    if value is None:
        return None
    try:
        ranges = parse_range(value, size)
    except RangeNotSatisfiable:
        return False
    if ranges is None or len(ranges) != 1 or "," in value:
        return False
    return ranges[0].start, ranges[0].end + 1


def credential_of(request: httpx2.Request) -> str:
    """:func:`~cmh.hub.resolver._credentials.credential_digest` of the ``Authorization``
    header ``request`` carries (``""``: none). Every answer the hook gives from what it
    remembered or stored goes through this: an answer obtained with one credential is
    given only to a request with the same one (an answer obtained without a credential,
    to any request)."""
    sent = [value for name, value in request.headers.raw if name.lower() == b"authorization"]
    return credential_digest(b", ".join(sent) if sent else None)


def _sendable(request: httpx2.Request) -> bool:
    """True when every header value of ``request`` is one the HTTP client sends."""
    return all(SENDABLE_VALUE.fullmatch(value) for _, value in request.headers.raw)


class FreshCacheTransport(httpx2.BaseTransport):
    """Answers Hub requests of known commits from the local cache; the rest goes to ``inner``."""

    def __init__(self, inner: httpx2.BaseTransport) -> None:
        self.inner = inner

    def close(self) -> None:
        self.inner.close()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        target = parse_target(request.url) if request.method in ("GET", "HEAD") else None
        if target is not None and not _sendable(request):
            target = None  # what the client cannot send (token=""): ``inner`` raises, as stock
        if target is not None:
            try:
                answer = self._answer(request, target)
            except (OSError, ValueError, LayoutError, httpx2.HTTPError) as exc:
                if isinstance(exc, httpx2.TransportError):
                    raise
                logger.debug("cmh hook: %s sent on (%s)", request.url, exc)
                answer = None
            if answer is not None:
                return answer
        response = self.inner.handle_request(request)
        if target is not None and target.kind == "resolve":
            with contextlib.suppress(OSError, ValueError, LayoutError):
                self._follow_branch(request, target, response)
                self._keep_absent(request, target, response)
        return response

    def _keep_absent(
        self, request: httpx2.Request, target: Target, response: httpx2.Response
    ) -> None:
        """Keep the Hub's ``404 EntryNotFound`` answer to a ``HEAD`` of a file (status and
        headers, its message among them), under the commit it names, the URL as asked and
        the request's credential: the next lookup of the missing file, answered from its
        ``.no_exist`` marker, raises with the Hub's own message (:func:`absent_answer`)."""
        named = response.headers.get("X-Repo-Commit", "")
        if request.method != "HEAD" or response.status_code != 404 or not COMMIT_RE.match(named):
            return
        if response.headers.get("X-Error-Code") != "EntryNotFound":
            return
        repo = RepoLayout(
            scoped_cache(target.repo_type, target.repo_id), target.repo_id, target.repo_type
        )
        key = f"HEAD {request.url.raw_path.decode()}"
        write_answer(repo, named, key, 404, response.headers.items(), b"", credential_of(request))

    def _follow_branch(
        self, request: httpx2.Request, target: Target, response: httpx2.Response
    ) -> None:
        """A ``resolve`` of a branch known at one commit that the Hub answered at another:
        the branch moved, and the window moves to the commit the Hub named now."""
        named = response.headers.get("X-Repo-Commit", "")
        if COMMIT_RE.match(target.revision) or not COMMIT_RE.match(named):
            return
        root = scoped_cache(target.repo_type, target.repo_id)
        endpoint = f"{request.url.scheme}://{request.url.netloc.decode()}"
        where = Asked(root, endpoint, target.repo_type, target.repo_id, target.revision)
        credential = credential_of(request)
        known = recent_commit(where, credential=credential) or loaded_commit(
            where, credential=credential
        )
        if known is not None and known != named:
            logger.debug("cmh hook: %s moved to %s", target.revision, named[:12])
            remember_commit(where, named, credential=credential)

    # -- deciding ------------------------------------------------------------------------

    def _answer(self, request: httpx2.Request, target: Target) -> httpx2.Response | None:
        repo = RepoLayout(
            scoped_cache(target.repo_type, target.repo_id), target.repo_id, target.repo_type
        )
        endpoint = f"{request.url.scheme}://{request.url.netloc.decode()}"
        credential = credential_of(request)
        where = Asked(repo.root, endpoint, repo.repo_type, repo.repo_id, target.revision)
        named = recent_commit(where, credential=credential)
        commit = named or self._known_commit(repo, endpoint, target.revision, credential)
        if commit is None:
            if target.kind == "info":
                return self._revalidate(request, repo, endpoint, target)
            return None
        if target.kind == "resolve":
            # A file's bytes go only to a credential that read the repo at the commit: the
            # Hub named the commit to it in the window, or it has the commit's repo info
            # (stored, else asked now with the request's own headers).
            if named is None and not self._readable(request, repo, target, commit):
                return None
            return self._file(request, repo, commit, target.rest)
        return self._stored_or_asked(request, repo, target, commit)

    def _readable(
        self, request: httpx2.Request, repo: RepoLayout, target: Target, commit: str
    ) -> bool:
        """True when the request's credential read ``commit``'s repo info: a stored answer
        it obtained, else the Hub's answer now (stored; any other answer: ``False``, and
        the request goes to the Hub, which answers it as it answers stock)."""
        credential = credential_of(request)
        base = f"/api/{_PREFIX[target.repo_type]}/{target.repo_id}/revision/{commit}"
        for key in (f"GET {base}", f"GET {base}?blobs=true"):
            stored = read_answer(repo, commit, key, credential)
            if stored is not None and stored.get("status") == 200:
                return True
        skipped = (b"range", b"if-range", b"if-none-match", b"if-match", b"if-modified-since")
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in skipped]
        asked = httpx2.Request(
            "GET",
            request.url.copy_with(raw_path=base.encode()),
            headers=headers,
            extensions=request.extensions,
        )
        status, headers_got, body = _read_whole(self.inner.handle_request(asked))
        if status != 200 or _sha_of(body, headers_got) != commit:
            return False
        write_answer(repo, commit, f"GET {base}", status, headers_got.items(), body, credential)
        return True

    def _known_commit(
        self, repo: RepoLayout, endpoint: str, revision: str, credential: str
    ) -> str | None:
        """The commit to answer ``revision`` from the cache with, or ``None`` (ask the Hub).

        Not the window's commit (the caller looks that up first). Outside a patched call
        (a bare API call), only a commit a patched call with the same ``credential``
        answered from the cache, unless :func:`api_from_cache` allows the cache's own
        word."""
        from ._negotiate import fresh_commit

        where = Asked(repo.root, endpoint, repo.repo_type, repo.repo_id, revision)
        scoped = in_patched_call()
        if not (scoped or api_from_cache()):
            # As stock, the Hub is asked (ConnectError when it cannot be reached), unless
            # the call belongs to a load a patched call just answered from the cache.
            return loaded_commit(where, credential=credential)
        commit = revision if COMMIT_RE.match(revision) else None
        commit = commit or fresh_commit(repo, revision, current_policy())
        if commit is not None and scoped:
            remember_loaded(where, commit, credential=credential)
        return commit

    # -- answering from the cache ----------------------------------------------------------

    def _file(
        self, request: httpx2.Request, repo: RepoLayout, commit: str, path: str
    ) -> httpx2.Response | None:
        tree = read_tree(repo, commit)
        if tree is None:
            return None
        entry = tree.get(path)
        common = {"X-Repo-Commit": commit}
        if entry is None and not hub_said_absent(repo, commit, path):
            return None  # only the Hub says a file is absent (stock asks it): sent on
        if entry is None:
            # The Hub's own answer to this request, kept when it was given (its message);
            # without one the Hub is asked, as stock asks it.
            stored = absent_answer(repo, commit, request.url, credential_of(request))
            if stored is None or request.method != "HEAD":
                return None
            return _replay(stored, request)
        if linked_etag(repo, commit, path) != entry.etag:
            return None
        if blob_state(repo, entry.etag, entry.size) != "ok":
            return None
        headers = {**common, "ETag": f'"{entry.etag}"', "Accept-Ranges": "bytes"}
        headers["Content-Type"] = "application/octet-stream"
        if len(entry.etag) == 64:  # an LFS file: the Hub names its blob in X-Linked-*
            headers["X-Linked-Etag"] = f'"{entry.etag}"'
            headers["X-Linked-Size"] = str(entry.size)
        wanted = _one_range(request.headers.get("range"), entry.size)
        if wanted is False:
            return None  # several ranges or none satisfiable: the Hub answers that
        start, end = wanted if isinstance(wanted, tuple) else (0, entry.size)
        headers["Content-Length"] = str(end - start)
        status = 200
        if isinstance(wanted, tuple):
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
        if request.method == "HEAD":
            return httpx2.Response(status, headers=headers, request=request)
        stream = _FileStream(repo.blob_path(entry.etag), start, end - start)
        return httpx2.Response(status, headers=headers, stream=stream, request=request)

    def _stored_or_asked(
        self, request: httpx2.Request, repo: RepoLayout, target: Target, commit: str
    ) -> httpx2.Response | None:
        url = _rewritten(request.url, target, commit)
        key = f"{request.method} {url.raw_path.decode()}"
        credential = credential_of(request)
        stored = read_answer(repo, commit, key, credential)
        if stored is not None:
            return _replay(stored, request)
        asked = httpx2.Request(
            request.method, url, headers=request.headers, extensions=request.extensions
        )
        response = self.inner.handle_request(asked)
        status, headers, body = _read_whole(response)
        if status == 200 or (status == 404 and headers.get("x-error-code") == "EntryNotFound"):
            write_answer(repo, commit, key, status, headers.items(), body, credential)
        return _rebuilt(status, headers, body, request, response)

    def _revalidate(
        self, request: httpx2.Request, repo: RepoLayout, endpoint: str, target: Target
    ) -> httpx2.Response:
        """Ask the Hub; a repo info answer names the revision's commit (remembered, stored)."""
        response = self.inner.handle_request(request)
        status, headers, body = _read_whole(response)
        if status == 200:
            commit = _sha_of(body, headers)
            credential = credential_of(request)
            if commit is not None:
                asked = Asked(repo.root, endpoint, repo.repo_type, repo.repo_id, target.revision)
                remember_commit(asked, commit, credential=credential)
                confirmed = repo.read_ref(target.revision) == commit and read_tree(repo, commit)
                if confirmed:
                    at = current_policy().clock.time()
                    write_validation(repo, target.revision, commit, at=at)
                url = _rewritten(request.url, target, commit)
                key = f"{request.method} {url.raw_path.decode()}"
                write_answer(repo, commit, key, status, headers.items(), body, credential)
        return _rebuilt(status, headers, body, request, response)


# -- stored answers ----------------------------------------------------------------------


def absent_answer(
    repo: RepoLayout, commit: str, url: httpx2.URL | str, credential: str
) -> dict[str, Any] | None:
    """The Hub's ``404 EntryNotFound`` to a ``HEAD`` of ``url`` at ``commit`` with
    ``credential``, as :meth:`FreshCacheTransport._keep_absent` kept it, if it did."""
    key = f"HEAD {httpx2.URL(url).raw_path.decode()}"
    stored = read_answer(repo, commit, key, credential)
    if stored is None or stored.get("status") != 404:
        return None
    return stored


def _replay(stored: dict[str, Any], request: httpx2.Request) -> httpx2.Response:
    headers = [(str(k), str(v)) for k, v in stored.get("headers", [])]
    body = str(stored.get("body", "")).encode("utf-8")
    content = b"" if request.method == "HEAD" else body
    response = httpx2.Response(
        int(stored["status"]), headers=headers, content=content, request=request
    )
    return response


def _read_whole(response: httpx2.Response) -> tuple[int, httpx2.Headers, bytes]:
    """Status, headers and the decoded body of an API answer (small JSON)."""
    try:
        body = response.read()
    finally:
        response.close()
    return response.status_code, response.headers, body


def _rebuilt(
    status: int,
    headers: httpx2.Headers,
    body: bytes,
    request: httpx2.Request,
    original: httpx2.Response,
) -> httpx2.Response:
    """The answer handed on with its body decoded (no ``Content-Encoding`` left to undo)."""
    kept = [
        (k, v)
        for k, v in headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx2.Response(
        status, headers=kept, content=body, request=request, extensions=original.extensions
    )


def _sha_of(body: bytes, headers: httpx2.Headers) -> str | None:
    try:
        sha = json_value(body).get("sha")
    except (ValueError, AttributeError):
        sha = None
    if not isinstance(sha, str):
        sha = headers.get("x-repo-commit")
    return sha if isinstance(sha, str) and COMMIT_RE.match(sha) else None


# -- the factory ---------------------------------------------------------------------------


def client_factory(previous: Callable[[], httpx2.Client]) -> Callable[[], httpx2.Client]:
    """A factory building ``previous()``'s client with :class:`FreshCacheTransport` in front."""

    def build() -> httpx2.Client:
        client = previous()
        # httpx2 has no public way to wrap the transport of a built client; the
        # attribute is the one the client sends through (and its proxy mounts).
        inner = getattr(client, "_transport", None)
        if isinstance(inner, httpx2.BaseTransport):
            client._transport = FreshCacheTransport(inner)
        mounts = getattr(client, "_mounts", None)
        if isinstance(mounts, dict):
            for pattern, transport in list(mounts.items()):
                if isinstance(transport, httpx2.BaseTransport):
                    mounts[pattern] = FreshCacheTransport(transport)
        return client

    build.__cmh_previous__ = previous  # type: ignore[attr-defined]
    return build


__all__ = ["FreshCacheTransport", "Target", "absent_answer", "client_factory", "parse_target"]
