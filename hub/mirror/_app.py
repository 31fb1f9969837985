"""The mirror's HTTP application: Hub API handlers over a store (aiohttp).

Transport only: routing lives in :mod:`~cmh.hub.mirror._routes`, ranges in
:mod:`~cmh.hub.mirror._ranges`, access control in :mod:`~cmh.hub.mirror._auth`,
the store's read side in :mod:`~cmh.hub.mirror._index`, the Hub's JSON
documents and cursors in :mod:`~cmh.hub.mirror._documents` and
:mod:`~cmh.hub.mirror._hub_documents`, card fields and parameter counts in
:mod:`~cmh.hub.mirror._derived`, commit history in
:mod:`~cmh.hub.mirror._history`, repo listings in :mod:`~cmh.hub.mirror._catalog`,
the fingerprint cache in :mod:`~cmh.hub.mirror._fingerprints`. A blob's bytes go
out through the store's one :class:`~cmh.hub.mirror.stores.BlobDelivery` for the
server's ``--blob-delivery`` mode, whatever the kind; what each body became is settled
in :func:`_settle`. No handler ever sends a Xet header.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from aiohttp import web
from cmh.hub.cache import LayoutError, json_value, validate_relpath

from . import _catalog as catalog
from . import _documents as documents
from . import _hub_documents as hub_documents
from ._auth import bearer_token
from ._connections import STALLED_CUT, STALLED_KEY
from ._cuts import RESTART_MESSAGE, appends_whole_body
from ._errors import CLIENT_LEFT, BlobUnavailable, HubError, storage_failed
from ._fingerprints import fingerprint_of
from ._index import CommitIndex, FileEntry, branch_name
from ._observe import BYTES_KEY, CONTENT_TYPE, INFO_KEY, RANGE_KEY, ROUTE_KEY
from ._ranges import ByteRange, RangeNotSatisfiable, parse_range
from ._routes import BadTarget, NoRoute, Route, moved_target, parse_target
from ._send import BodyCut, Pieces, frame
from ._state import (
    FILE_TYPE_KEY,
    PENDING_KEY,
    SERVE_FILE_KEY,
    STALE_KEY,
    STORE_KEY,
    MirrorState,
    base_url,
)
from ._upstream import UpstreamError, UpstreamRenamed
from .stores import BlobMismatch, BlobMissing, Sent

if TYPE_CHECKING:
    from ._upstream import Upstream

EXPAND_PAGE_SIZE = 50
COMMITS_PAGE_SIZE = 50
MAX_PATHS_INFO = 1000
#: Form fields a paths-info body may hold: the paths and a few flags (``expand``).
MAX_FORM_FIELDS = MAX_PATHS_INFO + 8
_TRUE = {"1", "true", "yes", "on"}
#: Seconds a pull-through request waits for a revalidation before a usable stale copy
#: answers (the revalidation goes on; spec/hub-mirror.md 8.2).
STALE_AFTER = 3.0
#: Seconds a manifest request waits for a pull-through fill (under a client's 10 s timeout).
MANIFEST_FILL_WAIT = 8.0

logger = logging.getLogger("cmh.hub.mirror")


def make_app(state: MirrorState, pages: Any = None) -> web.Application:
    """The aiohttp application serving ``state.backend`` (``pages``: the web pages' options)."""
    from .web import WebOptions, add_routes

    app = web.Application(
        client_max_size=1 << 20,
        client_max_fields=MAX_FORM_FIELDS,
        middlewares=[_unrouted, _busy] if state.guard is not None else [_unrouted],
    )
    app[STORE_KEY] = state
    app[SERVE_FILE_KEY] = serve_file
    add_routes(app, pages if pages is not None else WebOptions())  # "/" and "/-/..." pages
    app.router.add_route("*", r"/{tail:[\s\S]*}", dispatch)  # a decoded %0A too
    app.on_response_prepare.append(_origin_headers)
    if state.guard is not None:  # every body's total deadline (_connections.py)
        app.on_response_prepare.append(state.guard.body_starts)

    async def close_compute(app: web.Application) -> None:
        state.compute.close()  # a computation under way does not hold the exit
        state.revalidations.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(close_compute)

    async def close_delivery(app: web.Application) -> None:
        await state.blobs.close()

    app.on_cleanup.append(close_delivery)
    return app


@web.middleware
async def _unrouted(request: web.Request, handler: Any) -> web.StreamResponse:
    """A target no route takes (not an absolute path: ``CONNECT host:port``, ``OPTIONS *``) is
    answered as every refusal is, a typed JSON ``400``, not aiohttp's plain ``404``."""
    if request.match_info.http_exception is not None:
        return _error(HubError(400, "BadRequest", "request target must be an absolute path"))
    return await handler(request)  # type: ignore[no-any-return]


@web.middleware
async def _busy(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every route (the web pages too) counts as busy in the connection guard while it works."""
    state = request.app[STORE_KEY]
    assert state.guard is not None
    with state.guard.answering(request.transport):
        return await handler(request)  # type: ignore[no-any-return]


#: Every answer of the origin (API, files, errors): nothing is sniffed as a document, and
#: an answer opened as one runs nothing (the web pages send their own, wider policy).
ORIGIN_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'"


async def _origin_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Content-Security-Policy", ORIGIN_CSP)


def _error(err: HubError) -> web.Response:
    headers = dict(err.headers)
    if err.code:
        headers["X-Error-Code"] = err.code
    # a header is ASCII for every client (a non-ASCII path as \u escapes; the body keeps it)
    headers["X-Error-Message"] = err.message.encode("ascii", "backslashreplace").decode()
    response = web.json_response({"error": err.message}, status=err.status, headers=headers)
    if headers.get("Connection") == "close":
        response.force_close()  # at once: no lingering read of a body that does not come
    return response


async def dispatch(request: web.Request) -> web.StreamResponse:
    """Route one request and turn every refusal into a typed 4xx answer."""
    state = request.app[STORE_KEY]
    if state.guard is None:
        return await _dispatch(request, state)
    with state.guard.answering(request.transport):
        return await _dispatch(request, state)


async def _dispatch(request: web.Request, state: MirrorState) -> web.StreamResponse:
    request[ROUTE_KEY] = "invalid"
    try:
        try:
            route = parse_target(request.raw_path)
        except BadTarget as exc:
            raise HubError(400, "BadRequest", str(exc)) from None
        except NoRoute as exc:
            page = await _hub_page(request)  # /org/name, .../tree/REV, ...: a browser page
            if page is not None:
                return page
            raise HubError(404, None, str(exc)) from None
        request[ROUTE_KEY] = route.kind
        allowed = ("POST",) if route.kind == "paths_info" else ("GET", "HEAD")
        if request.method not in allowed:
            raise HubError(405, None, "method not allowed", {"Allow": ", ".join(allowed)})
        if route.kind == "health":
            return web.json_response({"status": "ok", "pid": os.getpid()})
        if route.kind == "metrics":
            body = await asyncio.get_running_loop().run_in_executor(None, state.metrics.exposition)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
        if route.kind == "agent_harnesses":
            return await _agent_harnesses(state)
        token = bearer_token(request.headers.get("Authorization"))
        if route.kind == "list_repos":
            return await _list_repos(request, state, route, token)
        if route.kind in ("refs", "auth_check"):
            request[INFO_KEY] = {"repo": route.repo_id}
            handler = _refs if route.kind == "refs" else _auth_check
            answer: web.Response = await _run(handler, state, route, token)
            return answer
        if route.kind == "resolve":
            return await _file(request, state, route, token)
        if state.upstream is not None:
            await _pull(request, state, route, token)
        index = await _run(_lookup, state, route, token, False)
        request[INFO_KEY] = {"repo": route.repo_id, "commit": index.commit}
        if route.kind == "repo_info":
            answer = await _run(_repo_info, state, route, index)
        elif route.kind == "tree":
            answer = await _tree(request, route, index)
        elif route.kind == "paths_info":
            answer = await _paths_info(request, state, route, index)
        elif route.kind == "commits":
            answer = await _commits(request, state, route, index)
        elif route.kind == "manifest":
            answer = await _manifest(state, route, index, state.compute.client_of(request))
        else:
            answer = await _fingerprint(state, route, index, state.compute.client_of(request))
        if request.get(STALE_KEY):
            answer.headers["Warning"] = request[STALE_KEY]
        return answer
    except HubError as err:
        return _error(err)


async def _file(
    request: web.Request, state: MirrorState, route: Route, token: str | None
) -> web.StreamResponse:
    """A resolve route's file: the access check, pull-through, lookup and delivery."""
    if state.upstream is not None:
        await _pull(request, state, route, token)
    index = await _run(_lookup, state, route, token, True)
    request[INFO_KEY] = {"repo": route.repo_id, "commit": index.commit}
    return await _resolve(request, state, route, index)


async def serve_file(request: web.Request, route: Route, token: str | None) -> web.StreamResponse:
    """A resolve ``route`` answered exactly as the API answers it, errors included (the
    pages' ``/raw/``); ``request[FILE_TYPE_KEY]`` may name the Content-Type."""
    request[ROUTE_KEY] = route.kind
    try:
        return await _file(request, request.app[STORE_KEY], route, token)
    except HubError as err:
        return _error(err)


async def _hub_page(request: web.Request) -> web.StreamResponse | None:
    """The web page a Hub-style page URL names, for a target the API has no route for."""
    if request.method not in ("GET", "HEAD"):
        return None
    from .web import _pages as pages

    if pages.WEB_KEY not in request.app:
        return None  # an app made without the pages
    return await pages.hub_page(request)


async def _pull(request: web.Request, state: MirrorState, route: Route, token: str | None) -> None:
    """Pull-through: make the route's revision answerable from the store (upstream.py).

    Only for a reader the mirror's own tokens admit; the client's credentials
    are never passed on. A repo the upstream names otherwise (another case of its id, a
    renamed repo's old name) is answered as that repo (:func:`_moved`).
    """
    try:
        await _prepare(request, state, route, token)
    except UpstreamRenamed as moved:
        await _moved(request, state, route, token, moved.canonical)


async def _moved(
    request: web.Request, state: MirrorState, route: Route, token: str | None, canonical: str
) -> None:
    """The answer for a repo the upstream calls ``canonical``: what ``canonical`` answers
    this reader (prepared and checked as if asked: a private repo's refusal, a gated one's
    ``GatedRepo``) or, for a reader it opens, a ``307`` to the same target under the
    upstream's name, relative, as the Hub sends a renamed repo's readers (stock clients
    follow it, their token kept: same origin). Nothing is kept under the asked name, so
    no spelling of a repo reads more than the repo's own name does."""
    there = replace(route, repo_id=canonical)
    try:
        await _prepare(request, state, there, token)
    except UpstreamRenamed:
        message = f"the upstream names {route.repo_id} {canonical}, and {canonical} otherwise"
        raise HubError(502, "UpstreamProtocolError", message) from None
    await _run(_readable, state, there, token)
    location = moved_target(request.raw_path, route, canonical)
    what = f"{route.repo_id} is {canonical} at the upstream"
    if location is None:  # not a target naming the repo where its route does: say so
        raise HubError(404, "RepoNotFound", f"{what}: ask for {canonical}")
    raise HubError(307, None, what, {"Location": location})


async def _prepare(
    request: web.Request, state: MirrorState, route: Route, token: str | None
) -> None:
    """:func:`_pull` for one name; :class:`UpstreamRenamed` when the upstream names the
    repo otherwise."""
    assert state.upstream is not None
    if state.policy.names(route.repo_type, route.repo_id) and not state.policy.can_read(
        route.repo_type, route.repo_id, token
    ):
        # The operator's private repo: the upstream is asked only while the store holds
        # nothing of it (as for a missing repo), so a gated one is refused as the Hub does.
        with _store_errors():
            held = await _run(state.backend.repo_exists, route.repo_type, route.repo_id)
        if held:
            return
    # A repo private or gated at the upstream is asked for anyway: the upstream's refusal of
    # the mirror's token is everyone's answer (the mirror holds nothing of it), and what the
    # token reads is kept but not served without a grant (_readable).
    revision = branch_name(route.revision or "main")  # refs/heads/main is main
    with _store_errors():
        fresh = await _run(state.upstream.fresh, route.repo_type, route.repo_id, revision)
    if fresh:
        return
    # Revalidations wait on the upstream: on threads of their own, so an upstream that
    # answers slowly cannot take the threads that answer other requests and read the store.
    loop = asyncio.get_running_loop()
    pending = loop.run_in_executor(
        state.revalidations, _prepare_checked, state.upstream, route.repo_type, route.repo_id,
        revision,
    )  # fmt: skip
    try:
        note = await asyncio.wait_for(asyncio.shield(pending), STALE_AFTER)
    except TimeoutError:
        # A stalled upstream: answer from a usable stale copy while the revalidation goes on.
        note = await _run(state.upstream.stale_note, route.repo_type, route.repo_id, revision)
        if note is None:
            note = await _settled(pending, _left_of_upstream_wait(state))
        else:
            pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            request[PENDING_KEY] = pending  # a blob not held waits for it (_start_fill)
    except UpstreamRenamed:
        raise
    except UpstreamError as exc:
        raise HubError(exc.status, exc.code, exc.message, exc.headers) from None
    request[STALE_KEY] = note


def _prepare_checked(upstream: Upstream, repo_type: str, repo_id: str, revision: str) -> Any:
    """``upstream.prepare``; a store whose storage fails meanwhile answers 503."""
    with _store_errors():
        return upstream.prepare(repo_type, repo_id, revision)


def _left_of_upstream_wait(state: MirrorState) -> float:
    """What is left of a request's wait for its revalidation once it waited
    :data:`STALE_AFTER` (60 s in all, spec 8.2)."""
    return max(0.0, state.upstream_wait - STALE_AFTER)


async def _settled(pending: asyncio.Future[Any], wait: float) -> Any:
    """The outcome of a revalidation, waited for ``wait`` seconds at most (then a typed 503;
    the revalidation goes on, bounded by its own requests' deadlines)."""
    try:
        return await asyncio.wait_for(asyncio.shield(pending), wait)
    except TimeoutError:
        pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        message = "the upstream did not answer in time and nothing usable is cached"
        raise HubError(503, "UpstreamUnavailable", message, {"Retry-After": "30"}) from None
    except UpstreamRenamed:
        raise
    except UpstreamError as exc:
        raise HubError(exc.status, exc.code, exc.message, exc.headers) from None


#: The agent harness registry answered without an upstream: no harness is known.
EMPTY_HARNESSES: dict[str, Any] = {"standardEnvVars": [], "harnesses": {}}
MAX_HARNESSES = 1 << 16  # bytes of an upstream registry kept


async def _agent_harnesses(state: MirrorState) -> web.Response:
    """``/api/agent-harnesses``: the upstream's registry in pull-through mode, else an empty one.

    huggingface_hub caches the answer a day, so a stock client asks once a day, not
    once per process. An upstream that fails or answers something not shaped like
    the registry gives a typed 503 (the client keeps no answer and asks again later).
    """
    if state.upstream is None:
        return web.json_response(EMPTY_HARNESSES)
    try:
        registry = await _run(_upstream_harnesses, state.upstream)
    except Exception as exc:  # any upstream failure is the upstream's, typed below
        message = f"upstream registry unavailable: {exc}"
        raise HubError(503, "UpstreamUnavailable", message, {"Retry-After": "30"}) from None
    return web.json_response(registry)


def _upstream_harnesses(upstream: Upstream) -> dict[str, Any]:
    """The upstream's registry through the upstream's own client (its token, its retries)."""
    import json

    client = upstream._client()
    registry, _ = client._get_json(f"{upstream.url}/api/agent-harnesses")
    upstream._count(1, 0)
    if (
        not isinstance(registry, dict)
        or not isinstance(registry.get("standardEnvVars", []), list)
        or not isinstance(registry.get("harnesses", {}), dict)
        or len(json.dumps(registry)) > MAX_HARNESSES
    ):
        raise ValueError("the answer is not an agent harness registry")
    return registry


async def _run(func: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)


#: What the Hub answers anyone about a gated repo: its info and its listings (files with
#: their sizes and ids, history, refs). Its files' bytes (``resolve``), ``auth-check`` and
#: what cmh derives from the bytes (manifests, fingerprints) are for granted readers only.
GATED_PUBLIC_KINDS = frozenset({"repo_info", "tree", "paths_info", "commits", "refs"})


def _readable(state: MirrorState, route: Route, token: str | None) -> None:
    """RepoNotFound when the route's repo is missing or private and not opened; the Hub's
    ``GatedRepo`` for a repo the upstream marks gated (see :func:`_closed`), except for
    what the Hub shows anyone of a gated repo (:data:`GATED_PUBLIC_KINDS`).

    Every name takes the same steps (:func:`access_steps`), so a refused repo answers
    as fast as a missing one."""
    exists, readable, gated = access_steps(state, route.repo_type, route.repo_id, token)
    if not readable:
        closed = _closed(state, route, token, gated)
        if not (route.kind in GATED_PUBLIC_KINDS and closed.code == "GatedRepo" and exists):
            raise closed
    if not exists:
        raise HubError(404, "RepoNotFound", "Repository not found")


def access_steps(
    state: MirrorState, repo_type: str, repo_id: str, token: str | None
) -> tuple[bool, bool, bool]:
    """``(exists, readable, gated)`` of a repo for ``token``: its existence, the access
    policy (the tokens file and the access records) and the upstream's gated record,
    each looked at for every name, private, public or missing alike."""
    with _store_errors():
        exists = state.backend.repo_exists(repo_type, repo_id)
    readable = state.policy.can_read(repo_type, repo_id, token)
    # gated upstream: refused as the Hub refuses, also when the tokens file names it
    gated = state.upstream is not None and state.upstream.pull.gated(repo_type, repo_id)
    return exists, readable, gated


def _closed(state: MirrorState, route: Route, token: str | None, gated: bool) -> HubError:
    """What huggingface.co answers a reader a repo is closed to: for a repo the upstream
    marks gated (public there, also when the tokens file names it), ``GatedRepo`` with 401
    to a reader without a token and 403 to one whose token it does not grant; else the
    answer of a missing repo."""
    upstream = state.upstream
    if upstream is None or not gated:
        return HubError(404, "RepoNotFound", "Repository not found")
    what = f"Access to {route.repo_type} {route.repo_id} is restricted"
    if token is None:
        message = f"{what}. You must have access to it and be authenticated to access it. "
        return HubError(401, "GatedRepo", message + "Please log in.")
    page = f"{upstream.url}/{'' if route.repo_type == 'model' else route.repo_type + 's/'}"
    message = f"{what} and you are not in the authorized list. Visit {page}{route.repo_id}"
    return HubError(403, "GatedRepo", message + " to ask for access.")


def _lookup(state: MirrorState, route: Route, token: str | None, used: bool) -> CommitIndex:
    """The index of the commit a route names; RepoNotFound also for a closed private repo."""
    _readable(state, route, token)
    revision = route.revision or "main"
    if state.upstream is not None:  # the upstream's branch X, revalidated as X (_prepare)
        revision = branch_name(revision)
    with _store_errors():
        index = state.backend.resolve(route.repo_type, route.repo_id, revision, used=used)
    if index is None:
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
    return index


@contextlib.contextmanager
def _store_errors() -> Iterator[None]:
    """A store whose storage fails (or holds an invalid tree) answers 503: the client is
    told what kind of failure it was, never the storage's names (bucket, prefix, keys,
    endpoint), which the log keeps."""
    from .stores import StoreUnavailable

    try:
        yield
    except StoreUnavailable as exc:
        storage_failed(exc, "store unavailable")
        raise HubError(503, "StoreUnavailable", f"store unavailable: {exc.kind}",
                       {"Retry-After": "5"}) from None  # fmt: skip


# -- resolve -----------------------------------------------------------------------------


#: The Content-Type a file is answered with, when the caller chose one (``/raw/``).
def _disposition(route: Route) -> str:
    """``attachment`` for ``?download=true`` (or ``1``; the last ``download`` counts, spec 2),
    else ``inline``."""
    return "attachment" if route.query.get("download") in ("true", "1") else "inline"


def _etag_in(header: str | None, etag: str) -> bool:
    """``If-None-Match``: ``*`` or a listed tag equal to ``etag`` (weak comparison)."""
    if header is None:
        return False
    for item in header.split(","):
        tag = item.strip()
        if tag == "*" or tag.removeprefix("W/").strip('"') == etag:
            return True
    return False


def _if_match_fails(header: str | None, etag: str) -> bool:
    """``If-Match`` (RFC 9110 13.1.1): false unless ``*`` or a listed tag is ``etag``, strongly
    (a weak tag never matches)."""
    if header is None:
        return False
    tags = [item.strip() for item in header.split(",")]
    return "*" not in tags and f'"{etag}"' not in tags


def _if_range_matches(header: str, etag: str) -> bool:
    """``If-Range`` (RFC 9110 13.1.5): one entity-tag, strongly equal to ``etag``; a weak tag,
    a list, ``*``, an unquoted tag or a date (no ``Last-Modified`` is sent) never matches."""
    return header.strip() == f'"{etag}"'


async def _resolve(
    request: web.Request, state: MirrorState, route: Route, index: CommitIndex
) -> web.StreamResponse:
    entry = index.files.get(route.path)
    if entry is None and route.path in index.unavailable:
        raise HubError(503, "BlobUnavailable", "blob unavailable", {"Retry-After": "60"})
    if entry is None:
        raise HubError(
            404, "EntryNotFound", f"{route.path} does not exist on {route.revision}",
            {"X-Repo-Commit": index.commit},
        )  # fmt: skip
    headers = {
        "X-Repo-Commit": index.commit,
        "ETag": f'"{entry.etag}"',
        "X-Linked-Etag": f'"{entry.etag}"',
        "X-Linked-Size": str(entry.size),
        "Accept-Ranges": "bytes",
        "Content-Type": request.get(FILE_TYPE_KEY, "application/octet-stream"),
        # ?download=true (the pages' download button) saves the file, as on the Hub.
        "Content-Disposition": f"{_disposition(route)}; "
        f"filename*=UTF-8''{quote(entry.path.rsplit('/', 1)[-1])}",
    }
    if request.get(STALE_KEY):
        headers["Warning"] = request[STALE_KEY]
    if _if_match_fails(request.headers.get("If-Match"), entry.etag):
        raise HubError(
            412, "PreconditionFailed", "If-Match does not name this file's ETag",
            {"X-Repo-Commit": index.commit, "ETag": f'"{entry.etag}"'},
        )  # fmt: skip
    if _etag_in(request.headers.get("If-None-Match"), entry.etag):
        response = web.StreamResponse(status=304, headers=headers)
        await response.prepare(request)
        await response.write_eof()
        return response
    range_header = request.headers.get("Range")
    if_range = request.headers.get("If-Range")
    if (
        range_header is not None
        and if_range is not None
        and not _if_range_matches(if_range, entry.etag)
    ):
        range_header = None
        request[RANGE_KEY] = "full"
    try:
        ranges = parse_range(range_header, entry.size)
    except RangeNotSatisfiable as exc:
        request[RANGE_KEY] = "unsatisfiable"
        raise HubError(
            416, "RangeNotSatisfiable", str(exc),
            {"Content-Range": f"bytes */{entry.size}", "X-Repo-Commit": index.commit},
        ) from None  # fmt: skip
    if ranges is not None and _recently_cut(state, route, entry):
        # A resume must not splice two fills' bytes: start again (cuts.py).
        if appends_whole_body(request.headers.get("User-Agent")):
            request[RANGE_KEY] = "unsatisfiable"
            raise HubError(
                416, "RangeNotSatisfiable", RESTART_MESSAGE,
                {"Content-Range": f"bytes */{entry.size}", "X-Repo-Commit": index.commit},
            )  # fmt: skip
        ranges = None
    asked = _Asked(route, index, entry, headers, ranges, range_header)
    if state.fills is not None and not await _run(_present, state, entry):
        return await _fill_or_deliver(request, state, asked)
    try:
        return await _deliver(request, state, asked)
    except BlobMissing as exc:
        if state.fills is None:
            raise _unavailable(request, exc) from None
        return await _fill_or_deliver(request, state, asked)  # pull-through fills it


async def _deliver(request: web.Request, state: MirrorState, asked: _Asked) -> web.StreamResponse:
    """Send a blob the store holds: the one delivery of every kind and mode
    (stores.BlobDelivery); :class:`BlobMissing` when it does not hold it."""
    blobs = state.blobs
    try:
        if request.method == "HEAD" and not blobs.redirects(request):
            return await _head(request, state, asked)
        _note_range(request, asked.ranges, asked.range_header)
        sent = await blobs.send(request, asked.entry, asked.headers, asked.ranges)
    except BlobUnavailable as exc:
        if isinstance(exc, BlobMissing):
            raise
        raise _unavailable(request, exc) from None
    await _settle(request, state, asked.route, asked.entry, sent)
    return sent.response


async def _fill_or_deliver(
    request: web.Request, state: MirrorState, asked: _Asked
) -> web.StreamResponse:
    """Pull-through of a blob the store lacks, the one way every path takes: a fill whose
    bytes a client's check refused is not joined; its end is waited out, then the blob
    is sent if a retry installed it, else filled (or the fill's failure answered). The
    caller just found the blob missing: it is looked for again only after such a wait."""
    assert state.fills is not None
    waited = await state.fills.wait_out_refused(asked.entry.source)
    if waited and await _run(_present, state, asked.entry):
        with contextlib.suppress(BlobMissing):
            return await _deliver(request, state, asked)
    _note_range(request, asked.ranges, asked.range_header)
    sent = await state.blobs.send_hashed(request, asked.entry, asked.headers, asked.ranges)
    if sent is not None:  # a fill whose hash matched, its blob not made yet (spec 8.6)
        await _settle(request, state, asked.route, asked.entry, sent)
        return sent.response
    return await _resolve_filling(request, state, asked)  # sent as it arrives


def _unavailable(request: web.Request, exc: BlobUnavailable) -> HubError:
    """The answer to a blob that cannot be sent: 503, logged as a mismatch when known bad."""
    if isinstance(exc, BlobMismatch):
        request[INFO_KEY] = {**request.get(INFO_KEY, {}), "blob": "mismatch"}
    return HubError(503, "BlobUnavailable", str(exc), {"Retry-After": "60"})


async def _settle(
    request: web.Request, state: MirrorState, route: Route, entry: FileEntry, sent: Sent
) -> None:
    """What every body sent ends with, whatever sent it: its bytes and its cut in the
    access log, and a cut by the mirror recorded where every worker and replica of the
    store sees it (a resume of it must start again, cuts.py); a client that left is
    no cut of the blob's."""
    request[BYTES_KEY] = sent.bytes_sent
    if sent.cut is not None:
        cut = STALLED_CUT if request.get(STALLED_KEY) else sent.cut  # the guard cut it
        request[INFO_KEY] = {**request.get(INFO_KEY, {}), "cut": cut}
    if sent.cut_by_mirror:
        await _run(_record_cut, state, route, entry.etag)


@dataclass(frozen=True)
class _Asked:
    """One file a resolve request names, and what its answer is made of."""

    route: Route
    index: CommitIndex
    entry: FileEntry
    headers: dict[str, str]
    ranges: list[ByteRange] | None
    range_header: str | None


async def _head(request: web.Request, state: MirrorState, asked: _Asked) -> web.StreamResponse:
    """The one answer to a ``HEAD`` of a file (every delivery but a redirect, whose
    answer has no body anyway): the status and headers its ``GET`` would have.

    The blob must be sendable (present, of its size, not known bad: else 503), but
    none of its bytes are read (:meth:`~cmh.hub.mirror.stores.BlobDelivery.ready`: a
    check not made yet starts beside the answer on a folder, the ``GET`` that follows
    joins it; it waits for a ``GET`` on a bucket). Pull-through fills a blob the store
    lacks (``X-Cmh-Filling``, :func:`_resolve_filling`).
    """
    await state.blobs.ready(asked.entry)
    response, _, _ = _framing(request, asked.entry, asked.headers, asked.ranges,
                              asked.range_header)  # fmt: skip
    await response.prepare(request)
    await response.write_eof()
    request[BYTES_KEY] = 0
    return response


def _recently_cut(state: MirrorState, route: Route, entry: FileEntry) -> bool:
    """True when a body of the entry's blob was cut within the cut memory (cuts.py)."""
    return bool(state.cut_records.recently_cut(route.repo_type, route.repo_id, entry.etag))


def _record_cut(state: MirrorState, route: Route, etag: str) -> None:
    """Keep a cut of ``etag`` where every worker and replica of the store sees it."""
    state.cut_records.record_cut(route.repo_type, route.repo_id, etag)


def _framing(
    request: web.Request,
    entry: FileEntry,
    headers: dict[str, str],
    ranges: list[Any] | None,
    range_header: str | None,
) -> tuple[web.StreamResponse, Pieces, bytes]:
    """The response (status, length, type) and the ``(prefix, offset, count)`` pieces to
    send; the access log's range kind."""
    _note_range(request, ranges, range_header)
    return frame(headers, ranges, entry.size)


def _note_range(request: web.Request, ranges: list[Any] | None, range_header: str | None) -> None:
    """The access log's range kind: none, ``full`` (a Range ignored), single or multi."""
    if ranges is None:
        if range_header is not None:
            request[RANGE_KEY] = "full"
    else:
        request[RANGE_KEY] = "single" if len(ranges) == 1 else "multi"


async def _resolve_filling(
    request: web.Request, state: MirrorState, asked: _Asked
) -> web.StreamResponse:
    """Pull-through: a listed file whose blob the store lacks, sent while it is filled."""
    from ._filling import BodyRefused, send_filling
    from .stores import FillFailed

    assert state.upstream is not None
    route, entry = asked.route, asked.entry
    fill = await _start_fill(request, state, route, asked.index, entry)
    response, pieces, tail = _framing(
        request, entry, asked.headers, asked.ranges, asked.range_header
    )
    response.headers["X-Cmh-Filling"] = "1"
    source = None
    if request.method != "HEAD":
        source = state.upstream.pull.reader(route.repo_type, route.repo_id, entry, fill)
    try:
        if source is not None:
            await _first_byte(source, fill, pieces)
        await response.prepare(request)
    except ConnectionError:  # the client went away before its headers; the fill goes on
        if source is not None:
            source.close()
        await _settle(request, state, route, entry, Sent(response, 0, CLIENT_LEFT))
        return response
    except BaseException:  # a failed fill, a client gone (cancelled) before the headers
        if source is not None:
            source.close()  # its file, its subscription (send_filling closes it after)
        raise
    if source is None:
        await response.write_eof()
        request[BYTES_KEY] = 0
        return response
    try:
        sent = Sent(response, await send_filling(request, response, fill, source, entry,
                                                 pieces, tail))  # fmt: skip
    except (BodyCut, FillFailed) as cut:
        if isinstance(cut, BodyRefused) and state.fills is not None:
            state.fills.refused(entry.source, fill)
        why = (
            "fill failed"
            if not fill.done() or fill.exception() is None
            else (f"fill failed: {str(fill.exception())[:200]}")
        )
        sent = Sent(response, getattr(cut, "sent", 0), why)
    except ConnectionError:  # the client went away mid-body; the fill goes on
        sent = Sent(response, 0, CLIENT_LEFT)
        # What it holds was sent unchecked: a cut only if the fill fails its check (cuts.py).
        _cut_if_fill_fails(state, route, entry.etag, fill)
    await _settle(request, state, route, entry, sent)
    return response


def _cut_if_fill_fails(state: MirrorState, route: Route, etag: str, fill: Any) -> None:
    """Record a cut of ``etag`` once ``fill`` ends, if it failed: a client that left
    during a fill that then verified holds only the blob's bytes, and resumes (206)."""
    loop = asyncio.get_running_loop()

    def settled(done: Any) -> None:
        if done.cancelled() or done.exception() is not None:
            loop.run_in_executor(None, _record_cut, state, route, etag)

    fill.add_done_callback(settled)


async def _first_byte(source: Any, fill: Any, pieces: Pieces) -> None:
    """Wait for the first byte a filling answer sends (before its headers): a fill that
    fails before it answers with the fill's error, never a 200 cut with nothing sent."""
    from .stores import FillFailed

    first = next((offset for _, offset, count in pieces if count > 0), None)
    if first is None:
        return
    try:
        await source.read(first, 1)
    except FillFailed as exc:  # the caller closes ``source``
        error = fill.exception() if fill.done() and not fill.cancelled() else None
        raise _fill_error(error if error is not None else exc) from None


def _fill_error(failed: BaseException) -> HubError:
    """The Hub-shaped answer for a fill that failed: the upstream's typed error, else 502."""
    if isinstance(failed, UpstreamError):
        return HubError(failed.status, failed.code, failed.message, {"Retry-After": "10"})
    return HubError(
        502, "UpstreamProtocolError", f"the upstream's blob failed its check: {failed}",
        {"Retry-After": "10"},
    )  # fmt: skip


async def _start_fill(
    request: web.Request, state: MirrorState, route: Route, index: CommitIndex, entry: FileEntry
) -> Any:
    """Pull-through: start (or join) the fill of a blob the store lacks; its future.
    A 503/502 when the upstream just failed (negative cache, upstream.NEGATIVE_FOR)."""
    assert state.fills is not None
    if request.get(STALE_KEY):
        pending = request.get(PENDING_KEY)
        # A stale copy without the blob is not usable: a revalidation still under way (a
        # slow upstream, not a failed one) is waited for, 60 s in all, as with no stale copy
        try:
            unusable = pending is None or (
                await _settled(pending, _left_of_upstream_wait(state)) is not None
            )
        except UpstreamRenamed:  # the stale copy's name is not the upstream's any more
            unusable = True
        if unusable:
            raise HubError(  # the upstream failed: a fill would fail too
                503, "UpstreamUnavailable", "upstream unavailable and the blob is not cached",
                {"Retry-After": "30"},
            )  # fmt: skip
    await _access_checked(request, state, route, index)
    failed = state.fills.recent_failure(entry.source)
    if failed is not None:  # negative cache: a fill of it just failed (upstream.NEGATIVE_FOR)
        raise HubError(failed.status, failed.code, failed.message, {"Retry-After": "10"})
    return state.fills.start(route.repo_type, route.repo_id, index.commit, entry.path, entry.source)


async def _access_checked(
    request: web.Request, state: MirrorState, route: Route, index: CommitIndex
) -> None:
    """No file is fetched with the mirror's upstream token on the upstream's word on access
    older than ``--fresh-for`` (a branch fresh by its stamps, a worker just started): the
    repo's access is asked again (the commit's revision answer, and ``auth-check`` without
    the token), then the reader's own access, before any fill starts."""
    upstream = state.upstream
    assert upstream is not None
    if await _run(upstream.access_known, route.repo_type, route.repo_id):
        return
    loop = asyncio.get_running_loop()
    try:
        note = await loop.run_in_executor(
            state.revalidations, _prepare_checked, upstream, route.repo_type, route.repo_id,
            index.commit,
        )  # fmt: skip
    except UpstreamError as exc:
        status, code = (
            (exc.status, exc.code) if exc.status != 307 else (502, "UpstreamProtocolError")
        )
        raise HubError(status, code, exc.message, exc.headers) from None
    if note is not None:  # the upstream could not be asked: nothing is fetched for now
        message = "upstream unavailable: who may read this repo cannot be confirmed"
        raise HubError(503, "UpstreamUnavailable", message, {"Retry-After": "30"})
    token = bearer_token(request.headers.get("Authorization"))
    await _run(_readable, state, route, token)


# -- repo info, tree, paths-info ------------------------------------------------------------


def _repo_info(state: MirrorState, route: Route, index: CommitIndex) -> web.Response:
    expand = _expand(route)
    properties = _properties(
        state, route.repo_type, route.repo_id, index,
        blobs=route.query.get("blobs", "").lower() in _TRUE,
        safetensors=not expand or "safetensors" in expand,
    )  # fmt: skip
    body = hub_documents.repo_info(properties, expand)
    if state.upstream is not None and state.upstream.pull.gated(route.repo_type, route.repo_id):
        # As the Hub answers a gated repo's info (to anyone): public, gated.
        body.update({k: v for k, v in (("private", False), ("gated", "manual")) if k in body})
    return web.json_response(body, headers={"X-Repo-Commit": index.commit})


def _expand(route: Route) -> list[str]:
    try:
        return hub_documents.check_expand(route.repo_type, route.query.getall("expand"))
    except hub_documents.BadExpand as exc:
        raise HubError(400, "BadRequest", str(exc)) from None


def _properties(
    state: MirrorState,
    repo_type: str,
    repo_id: str,
    index: CommitIndex,
    *,
    blobs: bool,
    safetensors: bool,
) -> dict[str, Any]:
    """Every repo-info property of a repo at ``index``'s commit (card and weights read once)."""
    opener: Any = state.backend.opener
    return hub_documents.repo_properties(
        repo_type, repo_id, index,
        private=state.policy.is_private(repo_type, repo_id),
        blobs=blobs,
        card=state.derived.card(index, repo_type, opener),
        safetensors=state.derived.safetensors(index, opener) if safetensors else None,
    )  # fmt: skip


async def _tree(request: web.Request, route: Route, index: CommitIndex) -> web.Response:
    if route.path and not index.is_dir(route.path):
        raise HubError(
            404, "EntryNotFound", f"{route.path} is not a folder of {route.revision}",
            {"X-Repo-Commit": index.commit},
        )  # fmt: skip
    recursive = route.query.get("recursive", "").lower() in _TRUE
    expand = route.query.get("expand", "").lower() in _TRUE
    state = request.app[STORE_KEY]
    page_size = min(state.page_size, EXPAND_PAGE_SIZE) if expand else state.page_size
    names = documents.children(index, route.path, recursive)
    cursor = route.query.get("cursor")
    try:
        start = documents.decode_cursor(cursor, index.commit) if cursor else 0
    except documents.BadCursor as exc:
        raise HubError(400, "BadRequest", str(exc)) from None
    page = names[start : start + page_size]
    headers = {"X-Repo-Commit": index.commit}
    if start + page_size < len(names):
        kind = f"{route.repo_type}s"
        path = f"/{quote(route.path, safe='')}" if route.path else ""
        query = urlencode(
            {"recursive": str(recursive).lower(), "expand": str(expand).lower(),
             "cursor": documents.encode_cursor(index.commit, start + page_size)}
        )  # fmt: skip
        base = base_url(request, state)
        url = f"{base}/api/{kind}/{route.repo_id}/tree/{index.commit}{path}?{query}"
        headers["Link"] = f'<{url}>; rel="next"'
    entries = [documents.tree_entry(index, p) for p in page]
    if expand:
        await _run(_add_last_commits, state, route, index, entries)
    return web.json_response(entries, headers=headers)


async def _read_paths_body(request: web.Request) -> tuple[list[str], object]:
    """The ``paths`` and ``expand`` fields of a paths-info body (JSON or form)."""
    paths: list[str] = []
    expand: object = False
    if request.content_type == "application/json":
        try:
            data = json_value(await request.read())  # nesting too deep is not JSON here
        except ValueError:
            raise HubError(400, "BadRequest", "body is not JSON") from None
        raw = data.get("paths") if isinstance(data, dict) else None
        paths = [p for p in raw if isinstance(p, str)] if isinstance(raw, list) else []
        expand = data.get("expand", False) if isinstance(data, dict) else False
    else:
        try:
            form = await request.post()
        except (ValueError, UnicodeDecodeError):
            raise HubError(400, "BadRequest", "malformed form body") from None
        paths = [p for p in form.getall("paths", []) if isinstance(p, str)]
        expand = form.get("expand", "false")
    return paths, expand


async def _paths_info(
    request: web.Request, state: MirrorState, route: Route, index: CommitIndex
) -> web.Response:
    try:
        # wait_for, not asyncio.timeout: the package supports Python 3.10.
        paths, expand = await asyncio.wait_for(_read_paths_body(request), state.body_timeout)
    except asyncio.TimeoutError:
        raise HubError(408, None, "request body too slow", {"Connection": "close"}) from None
    except web.HTTPRequestEntityTooLarge as exc:
        raise HubError(413, None, f"request body too large: {exc.text}") from None
    if len(paths) > MAX_PATHS_INFO:
        raise HubError(400, "BadRequest", f"at most {MAX_PATHS_INFO} paths")
    out = []
    for p in dict.fromkeys(q.rstrip("/") for q in paths):
        try:
            validate_relpath(p)
        except LayoutError:
            raise HubError(400, "BadRequest", "invalid path in paths") from None
        if p in index.files or p in index.dir_oids:
            out.append(documents.tree_entry(index, p))
    if expand is True or (isinstance(expand, str) and expand.lower() in _TRUE):
        await _run(_add_last_commits, state, route, index, out)
    return web.json_response(out, headers={"X-Repo-Commit": index.commit})


# -- history, refs, access check, listings ------------------------------------------------


def _add_last_commits(
    state: MirrorState, route: Route, index: CommitIndex, entries: list[dict[str, Any]]
) -> None:
    """Give each tree or paths-info entry its ``lastCommit`` (``expand``)."""
    paths = [e["path"] for e in entries]
    with _store_errors():
        found = state.backend.last_commits(route.repo_type, route.repo_id, index, paths)
    for entry in entries:
        entry["lastCommit"] = hub_documents.last_commit(found[entry["path"]])


def _next_link(
    request: web.Request, state: MirrorState, path: str, pairs: list[tuple[str, str]], cursor: str
) -> str:
    query = urlencode([(k, v) for k, v in pairs if k != "cursor"] + [("cursor", cursor)])
    return f'<{base_url(request, state)}{path}?{query}>; rel="next"'


def _page_start(route: Route, pinned: str) -> int:
    cursor = route.query.get("cursor")
    try:
        return documents.decode_cursor(cursor, pinned) if cursor else 0
    except documents.BadCursor as exc:
        raise HubError(400, "BadRequest", str(exc)) from None


async def _commits(
    request: web.Request, state: MirrorState, route: Route, index: CommitIndex
) -> web.Response:
    with _store_errors():
        chain = await _run(state.backend.history, route.repo_type, route.repo_id, index)
    formatted = "formatted" in route.query.getall("expand")
    page_size = min(state.page_size, COMMITS_PAGE_SIZE)
    start = _page_start(route, index.commit)
    page = [hub_documents.commit_item(r, formatted) for r in chain[start : start + page_size]]
    headers = {"X-Repo-Commit": index.commit}
    if start + page_size < len(chain):
        path = f"/api/{route.repo_type}s/{route.repo_id}/commits/{index.commit}"
        cursor = documents.encode_cursor(index.commit, start + page_size)
        headers["Link"] = _next_link(request, state, path, list(route.query.pairs), cursor)
    return web.json_response(page, headers=headers)


def _refs(state: MirrorState, route: Route, token: str | None) -> web.Response:
    include_prs = route.query.get("include_prs", "").lower() in _TRUE
    _readable(state, route, token)
    with _store_errors():
        named = state.backend.refs(route.repo_type, route.repo_id)
    return web.json_response(hub_documents.refs(named, include_prs))


def _auth_check(state: MirrorState, route: Route, token: str | None) -> web.Response:
    _readable(state, route, token)
    if route.path == "write":
        raise HubError(403, None, "the mirror is read-only: no token may write to it")
    return web.json_response({})


async def _list_repos(
    request: web.Request, state: MirrorState, route: Route, token: str | None
) -> web.Response:
    try:
        query = catalog.parse_query(route.query.pairs)
    except catalog.BadQuery as exc:
        raise HubError(400, "BadRequest", str(exc)) from None
    expand = _expand(route)
    items = await _run(_listing, state, route.repo_type, token, query, expand)
    listing = f"{route.repo_type}s"
    page_size = min(state.page_size, query.limit or state.page_size)
    start = _page_start(route, listing)
    headers = {}
    if start + page_size < len(items):
        cursor = documents.encode_cursor(listing, start + page_size)
        link_path = f"/api/{listing}"
        headers["Link"] = _next_link(request, state, link_path, list(route.query.pairs), cursor)
    return web.json_response(items[start : start + page_size], headers=headers)


def _listing(
    state: MirrorState,
    repo_type: str,
    token: str | None,
    query: catalog.ListingQuery,
    expand: list[str],
) -> list[dict[str, Any]]:
    """Every item of a listing, in order: readable repos of ``repo_type`` whose main matches."""
    rows: list[tuple[float, dict[str, Any]]] = []
    with _store_errors():
        for kind, repo_id in state.backend.repos():
            if kind != repo_type or not state.policy.can_read(repo_type, repo_id, token):
                continue
            index = state.backend.resolve(kind, repo_id, "main")
            if index is None:
                continue  # no main, or a snapshot removed since: not listed this time
            properties = _properties(state, repo_type, repo_id, index, blobs=False,
                                     safetensors="safetensors" in expand)  # fmt: skip
            if catalog.matches(query, properties):
                rows.append((index.last_modified, properties))
    return [
        hub_documents.listing_item(
            repo_type, p, full=query.full, card_data=query.card_data, expand=expand
        )
        for p in catalog.order(query, rows)
    ]


# -- tensor manifest (cmh extension) -----------------------------------------------------


async def _manifest(
    state: MirrorState, route: Route, index: CommitIndex, client: str
) -> web.Response:
    """Per-tensor SHA-256 and v1 root of one safetensors file (manifests.py)."""
    from ._manifests import ManifestError

    entry = index.files.get(route.path)
    commit = {"X-Repo-Commit": index.commit}
    if entry is None:
        raise HubError(404, "EntryNotFound", f"{route.path} does not exist", commit)
    if not entry.path.endswith(".safetensors") or entry.lfs_sha256 is None:
        raise HubError(422, "NotSafetensors", f"{route.path} is not a safetensors file", commit)
    if state.fills is not None and not await _run(_present, state, entry):
        # Pull-through: fill it (or join its fill) and wait a while; the manifest follows.
        fill = state.fills.start(
            route.repo_type, route.repo_id, index.commit, entry.path, entry.source
        )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(fill), MANIFEST_FILL_WAIT)
    if not await _run(_present, state, entry):
        raise HubError(503, "BlobUnavailable", "blob not in the store yet", {"Retry-After": "30"})
    try:
        doc = await state.compute.run(
            client, state.backend.manifest, route.repo_type, route.repo_id, entry
        )
    except ManifestError as exc:
        raise HubError(422, "InvalidFile", f"invalid safetensors file: {exc}", commit) from None
    except OSError as exc:
        raise HubError(503, "BlobUnavailable", f"blob unavailable: {exc.strerror}") from None
    body = {"repo": route.repo_id, "commit": index.commit, "path": entry.path, **doc}
    return web.json_response(body, headers=commit)


def _present(state: MirrorState, entry: FileEntry) -> bool:
    with _store_errors():
        return state.backend.blob_present(entry)


# -- fingerprint (cmh extension) ---------------------------------------------------------


async def _fingerprint(
    state: MirrorState, route: Route, index: CommitIndex, client: str
) -> web.Response:
    body = await state.compute.run(client, fingerprint_of, state, route, index)
    return web.json_response(body, headers={"X-Repo-Commit": index.commit})
