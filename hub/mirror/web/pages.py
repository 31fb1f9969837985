"""The browser pages of ``cmh serve``: routing under ``/`` and ``/-/``, rendering, login.

Pages live at ``/`` (the repo list) and under ``/-/``, a prefix no repo id can
take (a repo id part starts with a letter or digit), so every Hub API path
keeps its meaning. Targets are parsed raw, segment by segment, and repo ids,
revisions and paths are checked by :mod:`cmh.hub.cache.layout` as the API does.
Page work (store reads, rendering) runs in the executor, off the event loop.
"""

from __future__ import annotations

import asyncio
import math
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

from aiohttp import web

from ...cache.layout import (
    LayoutError,
    RepoLayout,
    validate_relpath,
    validate_repo_id,
    validate_revision,
)
from ..auth import repo_key
from ..index import CommitIndex, repo_exists, resolve_revision
from ..observe import ROUTE_KEY
from . import views
from .cards import Card, read_card
from .options import WebOptions
from .render import render
from .session import (
    COOKIE_MAX_AGE,
    CSRF_COOKIE,
    CSRF_FIELD,
    TOKEN_COOKIE,
    Viewer,
    csrf_ok,
    new_csrf_token,
    valid_token,
    viewer,
)
from .snippet import use_snippet

STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
#: No inline script or style, nothing from elsewhere; forms post only here.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
_TYPES = {"models": "model", "datasets": "dataset"}


WEB_KEY = web.AppKey("cmh_web_options", WebOptions)


class PageError(Exception):
    """A page that cannot be shown: status and a sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def add_routes(app: web.Application, options: WebOptions) -> None:
    """Register ``/`` and ``/-/...`` on ``app`` (before the API's catch-all route)."""
    app[WEB_KEY] = options
    app.router.add_route("*", "/", dispatch)
    app.router.add_route("*", "/-/{tail:.*}", dispatch)


def _segments(raw_path: str) -> list[str]:
    path = raw_path.partition("?")[0]
    try:
        return [unquote(s, errors="strict") for s in path.split("/")[1:]]
    except UnicodeDecodeError:
        raise PageError(400, "the address is not valid UTF-8") from None


async def dispatch(request: web.Request) -> web.StreamResponse:
    """Serve one page request; every refusal is a small HTML page with its status."""
    from ..app import STORE_KEY

    request[ROUTE_KEY] = "web"
    state = request.app[STORE_KEY]
    options = request.app[WEB_KEY]
    who = viewer(
        state.policy,
        options.admin_tokens,
        request.cookies.get(TOKEN_COOKIE),
        request.headers.get("Authorization"),
    )
    try:
        segs = _segments(request.raw_path)
        if segs[:2] == ["-", "login"]:
            return await _login(request, who)
        if segs[:2] == ["-", "logout"]:
            return await _logout(request)
        if request.method not in ("GET", "HEAD"):
            raise PageError(405, "method not allowed")
        if segs == [""]:
            q = request.query
            args = (q.get("q", ""), q.get("type", ""), q.get("page", "1"))
            return await _page(request, who, _list_page, *args)
        if segs[:2] == ["-", "static"] and len(segs) == 3:
            return _static(segs[2])
        if segs == ["-", "operator"]:
            if not who.admin:
                raise PageError(403, "the operator page needs an admin token: log in with one")
            return await _page(request, who, _operator_page)
        if len(segs) >= 3 and segs[1] in _TYPES:
            repo = _repo(state.store, _TYPES[segs[1]], segs[2:])
            return await _page(request, who, _repo_page, repo)
        if len(segs) >= 4 and segs[1] == "files" and segs[2] in _TYPES:
            repo = _repo(state.store, _TYPES[segs[2]], segs[3:])
            return await _page(request, who, _file_page, repo)
        raise PageError(404, "no such page")
    except PageError as exc:
        body = render("error.html", _base(request, who, exc.message), status=exc.status)
        return web.Response(
            body=body, status=exc.status, content_type="text/html", charset="utf-8",
            headers=PAGE_HEADERS,
        )  # fmt: skip


def _repo(store: Path, repo_type: str, parts: list[str]) -> RepoLayout:
    if not 1 <= len(parts) <= 2:
        raise PageError(404, "no such page")
    try:
        return RepoLayout(store, validate_repo_id("/".join(parts)), repo_type)
    except LayoutError:
        raise PageError(400, "invalid repo id") from None


def _base(request: web.Request, who: Viewer, message: str = "") -> dict[str, Any]:
    return {"viewer": who, "message": message, "path": request.path}


def _https(request: web.Request) -> bool:
    """Served over https, here or by a TLS-terminating proxy in front."""
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def mirror_url(request: web.Request) -> str:
    """The URL to put in the page's snippet (``HF_ENDPOINT``): the API's own base URL.

    That is ``--public-url`` when given, else the address this connection
    reached; never the ``Host`` header (spec/hub-mirror.md: links the mirror
    sends never reflect an arbitrary ``Host``).
    """
    from ..app import STORE_KEY, base_url

    return base_url(request, request.app[STORE_KEY]).rstrip("/")


def _host(request: web.Request) -> str:
    """The ``Host`` the browser sent: a form post's ``Origin`` must name it."""
    return request.headers.get("Host", "")


async def _page(request: web.Request, who: Viewer, build: Any, *args: Any) -> web.Response:
    loop = asyncio.get_running_loop()
    context = _base(request, who)
    context["endpoint"] = mirror_url(request)
    body = await loop.run_in_executor(None, partial(build, request, who, context, *args))
    return web.Response(body=body, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS)


def _static(name: str) -> web.Response:
    path = STATIC / name
    kind = STATIC_TYPES.get(path.suffix)
    if kind is None or "/" in name or name.startswith(".") or not path.is_file():
        raise PageError(404, "no such file")
    return web.Response(
        body=path.read_bytes(),
        headers={"Content-Type": kind, "Cache-Control": "max-age=3600",
                 "X-Content-Type-Options": "nosniff"},
    )  # fmt: skip


# -- pages -------------------------------------------------------------------------------


def _list_page(
    request: web.Request, who: Viewer, ctx: dict[str, Any], query: str, kind: str, page: str
) -> bytes:
    from ..app import STORE_KEY

    state = request.app[STORE_KEY]
    options = request.app[WEB_KEY]
    kind = kind if kind in ("model", "dataset") else ""
    repos = views.visible_repos(state.store, state.policy, who, query[:200], kind)
    pages = max(1, math.ceil(len(repos) / views.PAGE_SIZE))
    number = int(page) if page.isdigit() and 1 <= int(page) <= pages else 1
    chunk = repos[(number - 1) * views.PAGE_SIZE : number * views.PAGE_SIZE]
    assert state.indexes is not None
    now = time.time()
    rows = [views.repo_row(r, state.policy, state.indexes, options.stamps, now) for r in chunk]

    def link(n: int) -> str:
        return "/?" + urlencode({k: v for k, v in (("q", query), ("type", kind), ("page", n)) if v})

    ctx.update(rows=rows, query=query, kind=kind, total=len(repos), page=number, pages=pages,
               prev=link(number - 1) if number > 1 else None,
               next=link(number + 1) if number < pages else None, now=now)  # fmt: skip
    return render("list.html", ctx)


def _open_repo(request: web.Request, who: Viewer, repo: RepoLayout) -> tuple[str, CommitIndex]:
    """``(revision, index)`` of the revision asked (``?rev=``), with the API's access rule."""
    from ..app import STORE_KEY

    state = request.app[STORE_KEY]
    if not who.can_read(state.policy, repo.repo_type, repo.repo_id) or not repo_exists(repo):
        raise PageError(404, "Repository not found")
    asked = request.query.get("rev")
    if asked:
        try:
            revision = validate_revision(asked)
        except LayoutError:
            raise PageError(400, "invalid revision") from None
        commit = resolve_revision(repo, revision)
    else:
        revision, commit = views.default_revision(repo)  # type: ignore[assignment]
    if commit is None or revision is None:
        raise PageError(404, f"Invalid rev id: {asked}")
    assert state.indexes is not None
    return revision, state.indexes.get(repo, commit)


def _repo_page(request: web.Request, who: Viewer, ctx: dict[str, Any], repo: RepoLayout) -> bytes:
    from ..app import STORE_KEY

    state = request.app[STORE_KEY]
    options = request.app[WEB_KEY]
    revision, index = _open_repo(request, who, repo)
    directory = request.query.get("path", "").strip("/")
    if directory:
        try:
            validate_relpath(directory)
        except LayoutError:
            raise PageError(400, "invalid path") from None
        if not index.is_dir(directory):
            raise PageError(404, f"{directory} is not a folder of {revision}")
    assert state.indexes is not None
    refs, commits = views.revisions(repo, state.indexes)
    card: Card | None = None
    readme = index.files.get("README.md")
    if readme is not None and not directory:
        try:
            card = read_card(readme.source)
        except OSError:
            card = None
    ctx.update(
        repo=repo, key=repo_key(repo.repo_type, repo.repo_id), revision=revision, index=index,
        private=state.policy.is_private(repo.repo_type, repo.repo_id),
        directory=directory, crumbs=_crumbs(directory),
        rows=views.tree(index, directory, options.stamps), refs=refs, commits=commits,
        card=card, stamp=views.stamp_state(index, options.stamps, time.time()),
        fingerprint=_fingerprint(request, repo, index) if repo.repo_type == "model" else None,
        now=time.time(),
    )  # fmt: skip
    ctx["snippet"] = use_snippet(
        ctx["endpoint"], repo.repo_type, repo.repo_id, revision,
        ctx["key"] if ctx["private"] else None,
    )  # fmt: skip
    return render("repo.html", ctx)


def _crumbs(directory: str) -> list[tuple[str, str]]:
    parts = directory.split("/") if directory else []
    return [(p, "/".join(parts[: i + 1])) for i, p in enumerate(parts)]


def _fingerprint(request: web.Request, repo: RepoLayout, index: CommitIndex) -> dict[str, Any]:
    """The semantic fingerprint summary: the API's own computation and cache."""
    from ..app import STORE_KEY, fingerprint_of
    from ..errors import HubError
    from ..routes import Route

    state = request.app[STORE_KEY]
    route = Route("fingerprint", repo.repo_type, repo.repo_id, index.commit)
    try:
        body = fingerprint_of(state, route, index)
    except HubError as exc:
        return {"error": exc.message}
    fp = body["fingerprint"]
    return {
        "error": None,
        "keys": fp.get("keys", {}),
        "arch": fp.get("arch"),
        "family": fp.get("family"),
        "task": fp.get("task"),
        "scope": fp.get("scope"),
        "tensor_count": fp.get("tensor_count"),
        "tensor_bytes": fp.get("tensor_bytes"),
        "untrusted_stamps": fp.get("untrusted_stamps") or {},
        "api": f"/api/cmh/fingerprint/{repo.repo_id}/{index.commit}",
    }


def _file_page(request: web.Request, who: Viewer, ctx: dict[str, Any], repo: RepoLayout) -> bytes:
    options = request.app[WEB_KEY]
    revision, index = _open_repo(request, who, repo)
    path = request.query.get("path", "")
    try:
        validate_relpath(path)
    except LayoutError:
        raise PageError(400, "invalid path") from None
    entry = index.files.get(path)
    if entry is None:
        raise PageError(404, f"{path} does not exist on {revision}")
    stamp = views.file_stamp(entry, options.stamps)
    verification = None
    if stamp is not None and stamp.stamped:
        if request.query.get("verify") == "1":
            try:
                verification = options.stamps.verify(entry.source)
            except OSError as exc:
                raise PageError(503, f"blob unavailable: {exc.strerror}") from None
        else:
            verification = options.stamps.verified(entry.source)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    ctx.update(
        repo=repo, key=repo_key(repo.repo_type, repo.repo_id), revision=revision, index=index,
        entry=entry, stamp=stamp, verification=verification, parent=parent,
        crumbs=_crumbs(parent), trusted_keys=bool(options.trusted_keys), now=time.time(),
    )  # fmt: skip
    return render("file.html", ctx)


def _operator_page(request: web.Request, who: Viewer, ctx: dict[str, Any]) -> bytes:
    from ..app import STORE_KEY

    state = request.app[STORE_KEY]
    options = request.app[WEB_KEY]
    view = views.operator_view(state.store, state.metrics.exposition(), options.access_log)
    ctx.update(view=view, chart=views.size_chart(view.sizes))
    return render("operator.html", ctx)


# -- login -------------------------------------------------------------------------------


def _cookie_args(request: web.Request) -> dict[str, Any]:
    return {"httponly": True, "samesite": "Strict", "secure": _https(request), "path": "/"}


async def _form(request: web.Request) -> Any:
    """The posted form; a malformed body is a 400 page, not a server error."""
    try:
        return await request.post()
    except (ValueError, UnicodeDecodeError):
        raise PageError(400, "malformed form") from None


async def _login(request: web.Request, who: Viewer) -> web.StreamResponse:
    if request.method == "POST":
        form = await _form(request)
        field = form.get(CSRF_FIELD)
        if not csrf_ok(
            request.cookies.get(CSRF_COOKIE),
            field if isinstance(field, str) else None,
            request.headers.get("Origin"),
            _host(request),
        ):
            raise PageError(403, "this form was not sent from this site's login page")
        raw = form.get("token")
        token = valid_token(raw.strip()) if isinstance(raw, str) else None
        from ..app import STORE_KEY

        state = request.app[STORE_KEY]
        options = request.app[WEB_KEY]
        known = token is not None and viewer(state.policy, options.admin_tokens, token, None).known
        if token is None or not known:
            return _login_form(request, who, "unknown token", status=403)
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(TOKEN_COOKIE, token, max_age=COOKIE_MAX_AGE, **_cookie_args(request))
        return response
    if request.method not in ("GET", "HEAD"):
        raise PageError(405, "method not allowed")
    return _login_form(request, who, "")


def _login_form(request: web.Request, who: Viewer, message: str, status: int = 200) -> web.Response:
    csrf = new_csrf_token()
    ctx = _base(request, who, message)
    ctx["csrf"] = csrf
    body = render("login.html", ctx)
    response = web.Response(
        body=body, status=status, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS
    )
    response.set_cookie(CSRF_COOKIE, csrf, max_age=3600, **_cookie_args(request))
    return response


async def _logout(request: web.Request) -> web.StreamResponse:
    if request.method != "POST":
        raise PageError(405, "log out with the form's button (POST)")
    form = await _form(request)
    field = form.get(CSRF_FIELD)
    if not csrf_ok(
        request.cookies.get(CSRF_COOKIE),
        field if isinstance(field, str) else None,
        request.headers.get("Origin"),
        _host(request),
    ):
        raise PageError(403, "this form was not sent from this site")
    response = web.Response(status=303, headers={"Location": "/"})
    response.del_cookie(TOKEN_COOKIE, path="/")
    return response
