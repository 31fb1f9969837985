"""The browser pages of ``cmh serve``: routing under ``/`` and ``/-/``, rendering, login.

Pages live at ``/`` (the repo list), under ``/-/`` (a prefix no repo id can
take: a repo id part starts with a letter or digit) and at Hub-style URLs
(``/org/name/tree/main``, :mod:`~cmh.hub.mirror.web._urls`) that the API
hands over only when it has no route for them, so every Hub API path keeps
its meaning. Targets are parsed raw, segment by segment, and repo ids,
revisions and paths are checked by :mod:`cmh.hub.cache._layout` as the API does.
Page work (store reads, rendering) runs in the executor, off the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from cmh.hub.cache import LayoutError, validate_relpath, validate_repo_id, validate_revision

from .._auth import repo_key
from .._derived import NO_CARD
from .._errors import STORAGE_FAILED, storage_failed
from .._index import CommitIndex, FileEntry
from .._observe import ROUTE_KEY
from ..stores import StoreError
from . import _views as views
from ._card_worker import RendererBusy
from ._cards import MAX_CARD_BYTES, Card, as_text, read_card
from ._facets import (
    FACETS,
    FILTERS,
    RepoFacets,
    facet_counts,
    human_count,
    matches,
    repo_facets,
    tag_groups,
)
from ._options import WebOptions
from ._preview import MAX_PREVIEW_BYTES, Preview, file_preview, highlight_css
from ._render import render
from ._session import (
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
from ._snippet import SnippetRepo, use_snippets
from ._urls import HubTarget, RepoUrls, hub_target, list_url

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
#: Commits listed in a repo page's side column (the rest on its commits page).
MAX_SIDE_COMMITS = 10

logger = logging.getLogger("cmh.hub.mirror")


WEB_KEY = web.AppKey("cmh_web_options", WebOptions)
#: The threads that build pages, apart from the default executor the API and file routes
#: use: pages waiting on a card renderer (or a fingerprint) never hold up a download.
PAGES_KEY = web.AppKey("cmh_web_pages", ThreadPoolExecutor)
#: Pages one worker builds at once (more wait for a thread, then build).
PAGE_THREADS = 4


class PageError(Exception):
    """A page that cannot be shown: status and a sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


#: Files that make a repo a sentence-transformers model (its snippet is then offered).
SENTENCE_TRANSFORMERS_FILES = ("config_sentence_transformers.json", "modules.json")


def add_routes(app: web.Application, options: WebOptions) -> None:
    """Register ``/`` and ``/-/...`` on ``app`` (before the API's catch-all route).

    Hub-style page URLs (``/org/name``, ``.../tree/main``) reach :func:`hub_page`
    from the API's dispatcher, for targets the API has no route for.
    """
    app[WEB_KEY] = options
    app[PAGES_KEY] = pages = ThreadPoolExecutor(PAGE_THREADS, thread_name_prefix="cmh-page")
    app.router.add_route("*", "/", dispatch)
    app.router.add_route("*", "/-/{tail:.*}", dispatch)

    async def close_web(app: web.Application) -> None:
        options.cards.close()
        pages.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(close_web)


def _segments(raw_path: str) -> list[str]:
    path = raw_path.partition("?")[0]
    try:
        return [unquote(s, errors="strict") for s in path.split("/")[1:]]
    except UnicodeDecodeError:
        raise PageError(400, "the address is not valid UTF-8") from None


@dataclass(frozen=True)
class Where:
    """The repo a page shows, the revision asked (``None``: the default) and a path in it."""

    repo: views.RepoName
    revision: str | None
    path: str


def _viewer(request: web.Request) -> Viewer:
    from .._state import STORE_KEY

    return viewer(
        request.app[STORE_KEY].policy,
        request.app[WEB_KEY].admin_tokens,
        request.cookies.get(TOKEN_COOKIE),
        request.headers.get("Authorization"),
    )


async def _answer(request: web.Request, who: Viewer, route: Any) -> web.StreamResponse:
    """``await route()``; a :class:`PageError` becomes a small HTML page with its status."""
    request[ROUTE_KEY] = "web"
    try:
        response: web.StreamResponse = await route()
        return response
    except PageError as exc:
        body = render("error.html", _base(request, who, exc.message), status=exc.status)
        return web.Response(
            body=body, status=exc.status, content_type="text/html", charset="utf-8",
            headers=PAGE_HEADERS,
        )  # fmt: skip


async def dispatch(request: web.Request) -> web.StreamResponse:
    """Serve one request for ``/`` or ``/-/...``."""
    who = _viewer(request)
    return await _answer(request, who, partial(_route, request, who))


async def hub_page(request: web.Request) -> web.StreamResponse | None:
    """The page a Hub-style URL names (``None``: not a page URL; the API answers 404)."""
    try:
        target = hub_target(_segments(request.raw_path))
    except PageError:
        return None
    if target is None:
        return None
    who = _viewer(request)
    return await _answer(request, who, partial(_hub_route, request, who, target))


async def _hub_route(request: web.Request, who: Viewer, target: HubTarget) -> web.StreamResponse:

    if target.kind == "list":
        return await _page(request, who, _list_page, _filters(request, target.repo_type))
    if target.kind == "raw":  # the file's bytes, as the Hub's /raw/ serves them
        return await _raw(request, who, target)
    if target.kind == "repo" and "/" not in target.repo_id:
        org = target.repo_id
        if _is_org(request, who, org):  # /ORG: its repos, as on the Hub
            filters = dataclasses.replace(_filters(request, None), org=org)
            return await _page(request, who, _list_page, filters)
    where = Where(_repo(target.repo_type, target.repo_id.split("/")), target.revision,
                  target.path)  # fmt: skip
    build = {"repo": _repo_page, "tree": _repo_page, "blob": _file_page}.get(target.kind)
    return await _page(request, who, build or _commits_page, where)


#: Files ``/raw/`` answers as ``text/plain; charset=utf-8`` (shown in the browser, never
#: run: the origin's answers carry ``nosniff`` and a CSP that allows nothing).
TEXT_SUFFIXES = frozenset(
    {".json", ".md", ".txt", ".py", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".csv", ".tsv",
     ".jinja", ".sh", ".xml", ".gitattributes", ".gitignore", ".rst", ".html", ".js"}
)  # fmt: skip
TEXT_NAMES = frozenset({"LICENSE", "README", "NOTICE", "COPYING", "USE_POLICY"})


def raw_type(path: str) -> str:
    """The Content-Type ``/raw/`` gives ``path``: text/plain for a text file, else bytes."""
    name = path.rsplit("/", 1)[-1]
    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
    text = suffix in TEXT_SUFFIXES or name.upper().split(".")[0] in TEXT_NAMES
    return "text/plain; charset=utf-8" if text else "application/octet-stream"


async def _raw(request: web.Request, who: Viewer, target: HubTarget) -> web.StreamResponse:
    """``/{repo}/raw/{rev}/{path}``: the file's bytes, through the API's own resolve route
    (the same checks of the path, the same access rule with the viewer's token, the same
    delivery), text inline as text/plain."""
    from .._routes import BadTarget, NoRoute, Query, parse_target
    from .._state import FILE_TYPE_KEY, SERVE_FILE_KEY

    url = RepoUrls(target.repo_type, target.repo_id).resolve(target.revision or "main", target.path)
    try:
        route = parse_target(url)
    except (BadTarget, NoRoute) as exc:
        raise PageError(400, f"not a file address: {exc}") from None
    download = request.query.get("download")  # a page reads a parameter's first value
    if download is not None:  # the Download button: saved, not shown (Content-Disposition)
        route = dataclasses.replace(route, query=Query([("download", download)]))
    request[FILE_TYPE_KEY] = raw_type(route.path)
    return await request.app[SERVE_FILE_KEY](request, route, who.token)


async def _route(request: web.Request, who: Viewer) -> web.StreamResponse:
    segs = _segments(request.raw_path)
    if segs[:2] == ["-", "login"]:
        return await _login(request, who)
    if segs[:2] == ["-", "logout"]:
        return await _logout(request)
    if request.method not in ("GET", "HEAD"):
        raise PageError(405, "method not allowed")
    if segs == [""]:
        return await _page(request, who, _list_page, _filters(request, None))
    if segs[:2] == ["-", "static"] and len(segs) == 3:
        return _static(segs[2])
    if segs == ["-", "operator"]:
        if not who.admin:
            raise PageError(403, "the operator page needs an admin token: log in with one")
        return await _page(request, who, _operator_page)
    q = request.query
    if len(segs) >= 3 and segs[1] in _TYPES:
        where = Where(_repo(_TYPES[segs[1]], segs[2:]), q.get("rev"), q.get("path", ""))
        return await _page(request, who, _repo_page, where)
    if len(segs) >= 4 and segs[1] == "files" and segs[2] in _TYPES:
        where = Where(_repo(_TYPES[segs[2]], segs[3:]), q.get("rev"), q.get("path", ""))
        return await _page(request, who, _file_page, where)
    raise PageError(404, "no such page")


def _repo(repo_type: str, parts: list[str]) -> views.RepoName:
    if not 1 <= len(parts) <= 2:
        raise PageError(404, "no such page")
    try:
        return views.RepoName(repo_type, validate_repo_id("/".join(parts)))
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
    from .._state import STORE_KEY, base_url

    return base_url(request, request.app[STORE_KEY]).rstrip("/")


def _host(request: web.Request) -> str:
    """The ``Host`` the browser sent: a form post's ``Origin`` must name it."""
    return request.headers.get("Host", "")


async def _page(request: web.Request, who: Viewer, build: Any, *args: Any) -> web.Response:
    loop = asyncio.get_running_loop()
    context = _base(request, who)
    context["endpoint"] = mirror_url(request)
    work = partial(build, request, who, context, *args)
    threads = request.app[PAGES_KEY]
    try:
        if build in (_repo_page, _file_page):
            # They may compute (a card, a fingerprint, verify now): a client builds at most
            # the compute pool's ``per_client`` at once, so it cannot hold every thread.
            pool = _compute(request)
            async with pool.turn(pool.client_of(request)):
                body = await loop.run_in_executor(threads, work)
        else:
            body = await loop.run_in_executor(threads, work)
    except StoreError as exc:  # the storage failed (StoreUnavailable): its names stay in the log
        storage_failed(exc, "store unavailable")
        kind = getattr(exc, "kind", STORAGE_FAILED)
        raise PageError(503, f"the store cannot be read now: {kind}") from None
    return web.Response(body=body, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS)


def _static(name: str) -> web.Response:
    if name == "highlight.css":  # Pygments' colours, written by Pygments itself
        return _static_answer(highlight_css(), STATIC_TYPES[".css"])
    path = STATIC / name
    kind = STATIC_TYPES.get(path.suffix)
    if kind is None or "/" in name or name.startswith(".") or not path.is_file():
        raise PageError(404, "no such file")
    return _static_answer(path.read_bytes(), kind)


def _static_answer(body: bytes, kind: str) -> web.Response:
    return web.Response(
        body=body,
        headers={"Content-Type": kind, "Cache-Control": "max-age=3600",
                 "X-Content-Type-Options": "nosniff"},
    )  # fmt: skip


# -- pages -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListFilters:
    """What the repo list is asked for: a name, a type, facet values, a page."""

    query: str = ""
    kind: str = ""
    page: str = "1"
    facets: tuple[tuple[str, str], ...] = ()
    #: ``/ORG``: only that organisation's repos (the Hub's organisation page).
    org: str = ""

    def link(self, **changes: Any) -> str:
        """This list with some parameters changed (an empty value drops one)."""
        params = {"q": self.query, "type": self.kind, **dict(self.facets), "page": ""}
        params.update({k: str(v) for k, v in changes.items()})
        return list_url(**params)


def _filters(request: web.Request, kind: str | None) -> ListFilters:
    q = request.query
    asked = kind if kind is not None else q.get("type", "")
    facets = tuple((name, q.get(name, "")[:200]) for name in FILTERS if q.get(name))
    return ListFilters(q.get("q", "")[:200], asked if asked in ("model", "dataset") else "",
                       q.get("page", "1"), facets)  # fmt: skip


def _is_org(request: web.Request, who: Viewer, name: str) -> bool:
    """Whether ``name`` is an organisation of repos this viewer may see, and no repo of
    its own (a one-name repo, as ``gpt2``, keeps its page)."""
    from .._state import STORE_KEY

    state = request.app[STORE_KEY]
    seen = [
        (kind, repo_id) for kind, repo_id in state.backend.repos()
        if repo_id == name or repo_id.split("/")[0] == name
    ]  # fmt: skip
    visible = [(k, r) for k, r in seen if who.can_read(state.policy, k, r)]
    return bool(visible) and all("/" in r for _, r in visible)


def _list_page(
    request: web.Request, who: Viewer, ctx: dict[str, Any], filters: ListFilters
) -> bytes:
    from .._state import STORE_KEY

    state = request.app[STORE_KEY]
    options = request.app[WEB_KEY]
    store = state.backend
    found = views.visible_repos(store, state.policy, who, filters.query, filters.kind)
    if filters.org:
        found = [r for r in found if r.repo_id.split("/")[0] == filters.org and "/" in r.repo_id]
    described: list[tuple[views.RepoName, RepoFacets]] = []
    for repo in found:
        _, index = views.default_revision(store, repo)
        fields = NO_CARD
        if index is not None:
            try:
                fields = state.derived.card(index, repo.repo_type, store.opener)
            except OSError:
                fields = NO_CARD
        described.append((repo, repo_facets(fields, repo.repo_type)))
    wanted = dict(filters.facets)
    repos = [(r, f) for r, f in described if matches(f, wanted)]
    pages = max(1, math.ceil(len(repos) / views.PAGE_SIZE))
    number = _page_number(filters.page, pages)
    chunk = repos[(number - 1) * views.PAGE_SIZE : number * views.PAGE_SIZE]
    now = state.clock.time()
    rows = [(views.repo_row(store, r, state.policy, options.stamps, now), f)
            for r, f in chunk]  # fmt: skip
    ctx.update(rows=rows, filters=filters, query=filters.query, kind=filters.kind,
               total=len(repos), page=number, pages=pages, wanted=wanted,
               counts=facet_counts(f for _, f in repos), facet_names=FACETS,
               prev=filters.link(page=number - 1) if number > 1 else None,
               next=filters.link(page=number + 1) if number < pages else None, now=now,
               urls=RepoUrls)  # fmt: skip
    return render("list.html", ctx)


def _page_number(page: str, pages: int) -> int:
    """The list page asked: 1 to ``pages`` in ASCII digits, else 1 (``str.isdigit`` is true
    for ``²`` and ``①`` too, which ``int`` refuses, and for 5,000 nines, which it refuses
    as well)."""
    if page.isascii() and page.isdigit() and len(page) <= 9 and 1 <= int(page) <= pages:
        return int(page)
    return 1


def _open_repo(request: web.Request, who: Viewer, where: Where) -> tuple[str, CommitIndex]:
    """``(revision, index)`` of the revision asked, with the API's access rule."""
    from .._state import STORE_KEY

    state = request.app[STORE_KEY]
    store = state.backend
    repo = where.repo
    readable = who.can_read(state.policy, repo.repo_type, repo.repo_id)
    exists = store.repo_exists(repo.repo_type, repo.repo_id)  # looked at for every name
    if not (readable and exists):
        raise PageError(404, "Repository not found")
    asked = where.revision
    if asked:
        try:
            checked = validate_revision(asked)
        except LayoutError:
            raise PageError(400, "invalid revision") from None
        revision: str | None = checked
        index = store.resolve(repo.repo_type, repo.repo_id, checked)
    else:
        revision, index = views.default_revision(store, repo)
    if index is None or revision is None:
        raise PageError(404, f"Invalid rev id: {asked}")
    return revision, index


def _repo_context(
    request: web.Request, where: Where, revision: str, index: CommitIndex
) -> dict[str, Any]:
    """What every page of one repo shows in its header: id, revision, chips, parameters."""
    from .._state import STORE_KEY

    state = request.app[STORE_KEY]
    repo = where.repo
    opener = state.backend.opener
    try:
        fields = state.derived.card(index, repo.repo_type, opener)
        params = state.derived.safetensors(index, opener) if repo.repo_type == "model" else None
    except OSError:
        fields, params = NO_CARD, None
    key = repo_key(repo.repo_type, repo.repo_id)
    return {
        "repo": repo, "key": key, "revision": revision, "index": index,
        "private": state.policy.is_private(repo.repo_type, repo.repo_id),
        "urls": RepoUrls(repo.repo_type, repo.repo_id),
        "chips": tag_groups(fields, repo.repo_type), "params": params, "list_url": list_url,
        "human_count": human_count, "now": state.clock.time(),
    }  # fmt: skip


def _repo_page(request: web.Request, who: Viewer, ctx: dict[str, Any], where: Where) -> bytes:
    from .._state import STORE_KEY

    state = request.app[STORE_KEY]
    options = request.app[WEB_KEY]
    repo = where.repo
    revision, index = _open_repo(request, who, where)
    directory = where.path.strip("/")
    if directory:
        try:
            validate_relpath(directory)
        except LayoutError:
            raise PageError(400, "invalid path") from None
        if not index.is_dir(directory):
            raise PageError(404, f"{directory} is not a folder of {revision}")
    store = state.backend
    refs, commits = views.revisions(store, repo)
    card: Card | None = None
    readme = index.files.get("README.md")
    if readme is not None and not directory:
        card = _card(request, readme)
    records = views.commit_records(store, repo, index, refs)
    ctx.update(_repo_context(request, where, revision, index))
    ctx.update(
        directory=directory, crumbs=_crumbs(directory),
        rows=views.tree(store, index, directory, options.stamps), refs=refs,
        commits=[(c, records.get(c.commit)) for c in commits[:MAX_SIDE_COMMITS]],
        more_commits=max(0, len(commits) - MAX_SIDE_COMMITS),
        card=card, images=card.images if card else None,
        stamp=views.stamp_state(store, index, options.stamps, state.clock.time()),
        fingerprint=_fingerprint(request, repo, index) if repo.repo_type == "model" else None,
    )  # fmt: skip
    sentence = any(name in index.files for name in SENTENCE_TRANSFORMERS_FILES)
    ctx["snippets"] = use_snippets(SnippetRepo(
        ctx["endpoint"], repo.repo_type, repo.repo_id, revision, bool(ctx["private"]), sentence,
    ))  # fmt: skip
    return render("repo.html", ctx)


def _commits_page(request: web.Request, who: Viewer, ctx: dict[str, Any], where: Where) -> bytes:
    """A revision's history (``/{repo}/commits/{rev}``): message, author, date of each."""
    from .._state import STORE_KEY

    store = request.app[STORE_KEY].backend
    repo = where.repo
    revision, index = _open_repo(request, who, where)
    refs = store.refs(repo.repo_type, repo.repo_id)
    chain = store.history(repo.repo_type, repo.repo_id, index)
    ctx.update(_repo_context(request, where, revision, index))
    ctx.update(chain=[(r, sorted(n for n, c in refs.items() if c == r.commit)) for r in chain])
    return render("commits.html", ctx)


def _card(request: web.Request, entry: FileEntry) -> Card | None:
    """The card ``entry`` (a Markdown file) renders to: a repo page's README.md and every
    ``*.md`` file page take this one path (its limits, deadline and cache: ``_cards``).
    ``None`` when its blob cannot be read now; shown as text, for this view only, when no
    renderer is free in time."""
    from .._state import STORE_KEY

    store = request.app[STORE_KEY].backend
    try:
        return read_card(entry, store.opener, request.app[WEB_KEY].cards.render)
    except OSError:
        return None
    except RendererBusy:
        try:
            with store.opener(entry) as f:
                raw = f.read(MAX_CARD_BYTES + 1)
        except OSError:
            return None
        return as_text(raw, "other cards are being rendered: shown as text for now (reload)")


def _compute(request: web.Request) -> Any:
    """The worker's pool for CPU-heavy work (fingerprints, verify now): :mod:`.._compute`."""
    from .._state import STORE_KEY

    return request.app[STORE_KEY].compute


def _crumbs(directory: str) -> list[tuple[str, str]]:
    parts = directory.split("/") if directory else []
    return [(p, "/".join(parts[: i + 1])) for i, p in enumerate(parts)]


def _fingerprint(request: web.Request, repo: views.RepoName, index: CommitIndex) -> dict[str, Any]:
    """The semantic fingerprint summary: the API's own computation and cache."""
    from .._errors import HubError
    from .._fingerprints import fingerprint_of
    from .._routes import Route
    from .._state import STORE_KEY

    state = request.app[STORE_KEY]
    route = Route("fingerprint", repo.repo_type, repo.repo_id, index.commit)
    try:
        body = state.compute.call(fingerprint_of, state, route, index)  # the CPU pool
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


def _file_page(request: web.Request, who: Viewer, ctx: dict[str, Any], where: Where) -> bytes:
    from .._state import STORE_KEY

    store = request.app[STORE_KEY].backend
    options = request.app[WEB_KEY]
    revision, index = _open_repo(request, who, where)
    path = where.path
    try:
        validate_relpath(path)
    except LayoutError:
        raise PageError(400, "invalid path") from None
    entry = index.files.get(path)
    if entry is None:
        raise PageError(404, f"{path} does not exist on {revision}")
    stamp = views.file_stamp(store, entry, options.stamps)
    verification = None
    if stamp is not None and stamp.stamped:
        if request.query.get("verify") == "1":
            try:
                verify = options.stamps.verify
                verification = _compute(request).call(verify, store, index, entry)
            except OSError as exc:
                raise PageError(503, f"blob unavailable: {exc.strerror or exc}") from None
        else:
            verification = options.stamps.verified(entry)
    preview = None
    if stamp is None:
        try:
            preview = file_preview(entry, store.opener)
        except OSError:
            preview = Preview(None, reason="the blob cannot be read now")
    rendered = None
    if preview is not None and preview.html is not None and path.lower().endswith(".md"):
        rendered = _card(request, entry)  # as a card is: the same limits, deadline, cache
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    ctx.update(_repo_context(request, where, revision, index))
    ctx.update(
        entry=entry, stamp=stamp, verification=verification, parent=parent, preview=preview,
        rendered=rendered, images=rendered.images if rendered else None,
        crumbs=_crumbs(parent), trusted_keys=bool(options.trusted_keys),
        max_preview=MAX_PREVIEW_BYTES,
    )  # fmt: skip
    return render("file.html", ctx)


def _operator_page(request: web.Request, who: Viewer, ctx: dict[str, Any]) -> bytes:
    from .._state import STORE_KEY

    state = request.app[STORE_KEY]
    options = request.app[WEB_KEY]
    view = views.operator_view(
        state.backend, options.prune_preview, state.metrics.exposition(), options.access_log,
        state.clock.time(),
    )  # fmt: skip
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


async def _checked_form(request: web.Request, refusal: str) -> Any:
    """The posted form once its CSRF token and ``Origin`` pass (session.csrf_ok), else a 403
    page saying ``refusal``."""
    form = await _form(request)
    field = form.get(CSRF_FIELD)
    if not csrf_ok(
        request.cookies.get(CSRF_COOKIE),
        field if isinstance(field, str) else None,
        request.headers.get("Origin"),
        _host(request),
    ):
        raise PageError(403, refusal)
    return form


async def _login(request: web.Request, who: Viewer) -> web.StreamResponse:
    if request.method == "POST":
        form = await _checked_form(request, "this form was not sent from this site's login page")
        raw = form.get("token")
        token = valid_token(raw.strip()) if isinstance(raw, str) else None
        from .._state import STORE_KEY

        state = request.app[STORE_KEY]
        options = request.app[WEB_KEY]
        client = state.compute.client_of(request)
        wait = state.logins.wait(client)
        if wait > 0:  # refused unchecked: guessing tokens is bounded per address
            seconds = math.ceil(wait)
            response = _login_form(
                request, who, f"too many unknown tokens: try again in {seconds} s", status=429
            )
            response.headers["Retry-After"] = str(seconds)
            return response
        known = token is not None and viewer(state.policy, options.admin_tokens, token, None).known
        if token is None or not known:
            state.logins.failed(client)
            return _login_form(request, who, "unknown token", status=403)
        state.logins.passed(client)
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
    await _checked_form(request, "this form was not sent from this site")
    response = web.Response(status=303, headers={"Location": "/"})
    response.del_cookie(TOKEN_COOKIE, path="/")
    return response
