"""Map a raw HTTP request target to a typed mirror route, refusing anything unsafe.

Routing works on the raw target, never on a normalised path: each ``/``
segment is percent-decoded once, strictly (UTF-8; a ``%`` not followed by two hex
digits is refused), and a decoded segment
holding a NUL, a backslash or a control character is refused. Repo ids,
revisions and file paths are then checked by :mod:`cmh.hub.cache._layout`, which
refuses ``.``/``..`` parts, empty parts and absolute paths, so no target can
name anything outside a repo's snapshot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote

from cmh.hub.cache import (
    REPO_PART_RE,
    LayoutError,
    validate_relpath,
    validate_repo_id,
    validate_revision,
)

MAX_TARGET = 8192
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f\\]")
_BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")
API_KEYWORDS = ("revision", "tree", "paths-info", "commits")
#: Last segments naming an endpoint of a repo rather than a repo (``/api/models/{repo}/refs``).
REPO_ENDPOINTS = {"refs": "refs", "auth-check": "auth_check"}


class BadTarget(ValueError):
    """A malformed or unsafe request target (answered 400)."""


class NoRoute(LookupError):
    """A well-formed target the mirror does not serve (answered 404)."""


class Query(dict[str, str]):
    """Query parameters: the last value of each name, ``name[]`` being ``name`` (spec 2), and
    every value with :meth:`getall`."""

    def __init__(self, pairs: list[tuple[str, str]] | None = None) -> None:
        super().__init__((name.removesuffix("[]"), value) for name, value in pairs or [])
        self.pairs = tuple(pairs or [])

    def getall(self, name: str) -> list[str]:
        """Every value of ``name`` and of ``name[]``, in request order."""
        return [v for k, v in self.pairs if k in (name, f"{name}[]")]


@dataclass(frozen=True)
class Route:
    """What a request asks for."""

    # resolve | repo_info | tree | paths_info | fingerprint | manifest | health | metrics
    # | list_repos | refs | commits | auth_check (path "write" for the write check)
    # | agent_harnesses
    kind: str
    repo_type: str = "model"
    repo_id: str = ""
    revision: str | None = None
    path: str = ""
    query: Query = field(default_factory=Query)


def _decode(segment: str) -> str:
    if _BAD_ESCAPE_RE.search(segment):
        raise BadTarget("request target holds a malformed percent-escape")
    try:
        text = unquote(segment, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise BadTarget("request target is not valid UTF-8") from None
    if _CONTROL_RE.search(text):
        raise BadTarget("request target holds a control character or backslash")
    return text


def _repo(parts: list[str]) -> str:
    for p in parts:
        if not REPO_PART_RE.match(p):
            raise BadTarget("invalid repo id")
    try:
        return validate_repo_id("/".join(parts))
    except LayoutError:
        raise BadTarget("invalid repo id") from None


def _revision(text: str) -> str:
    try:
        return validate_revision(text)
    except LayoutError:
        raise BadTarget("invalid revision") from None


def _relpath(parts: list[str]) -> str:
    try:
        return validate_relpath("/".join(parts))
    except LayoutError:
        raise BadTarget("invalid file path") from None


def parse_target(target: str) -> Route:
    """The route of a raw request target such as ``/org/name/resolve/main/config.json``."""
    if len(target) > MAX_TARGET:
        raise BadTarget("request target too long")
    if not target.startswith("/") or target.startswith("//") or "#" in target:
        raise BadTarget("request target must be an absolute path")
    raw_path, _, raw_query = target.partition("?")
    try:
        query = Query(parse_qsl(raw_query, keep_blank_values=True, errors="strict"))
    except (UnicodeDecodeError, ValueError):
        raise BadTarget("malformed query string") from None
    if any(_CONTROL_RE.search(k + v) for k, v in query.pairs):
        raise BadTarget("query string holds a control character")
    segs = [_decode(s) for s in raw_path.split("/")[1:]]
    if segs == ["health"]:
        return Route("health", query=query)
    if segs == ["metrics"]:
        return Route("metrics", query=query)
    if segs == ["api", "agent-harnesses"]:
        return Route("agent_harnesses", query=query)
    if segs[:1] == ["api"]:
        return _api_route(segs[1:], query)
    repo_type = "model"
    if segs[:1] == ["datasets"]:
        repo_type, segs = "dataset", segs[1:]
    return _file_route("resolve", segs, repo_type, query)


def _file_route(kind: str, segs: list[str], repo_type: str, query: Query) -> Route:
    """``{repo}/resolve/{revision}/{path}`` (decoded segments) as a route of ``kind``."""
    for n in (2, 1):
        if len(segs) > n + 2 and segs[n] == "resolve" and all("/" not in s for s in segs[:n]):
            rest = segs[n + 1 :]
            if rest[0] == "refs" and len(rest) > 3 and rest[1] == "pr":
                revision, path_parts = "/".join(rest[:3]), rest[3:]
            else:
                revision, path_parts = rest[0], rest[1:]
            return Route(
                kind,
                repo_type,
                _repo(segs[:n]),
                _revision(revision),
                _relpath([p for part in path_parts for p in part.split("/")]),
                query,
            )
    raise NoRoute("no such endpoint")


def _api_route(segs: list[str], query: Query) -> Route:
    if segs[:2] == ["cmh", "manifest"]:  # /api/cmh/manifest/[datasets/]{repo}/resolve/{rev}/{path}
        rest = segs[2:]
        if rest[:1] == ["datasets"]:
            return _file_route("manifest", rest[1:], "dataset", query)
        return _file_route("manifest", rest, "model", query)
    if segs[:2] == ["cmh", "fingerprint"]:
        rest = segs[2:]
        repo_type = "model"
        if rest[:1] == ["datasets"] and len(rest) >= 3:
            repo_type, rest = "dataset", rest[1:]
        if len(rest) not in (2, 3):
            raise NoRoute("no such endpoint")
        return Route("fingerprint", repo_type, _repo(rest[:-1]), _revision(rest[-1]), "", query)
    if not segs or segs[0] not in ("models", "datasets"):
        raise NoRoute("no such endpoint")
    repo_type = "model" if segs[0] == "models" else "dataset"
    rest = segs[1:]
    if not rest:
        return Route("list_repos", repo_type, query=query)
    write = rest[-2:-1] == ["auth-check"] and rest[-1] == "write"
    last = rest[-2] if write else rest[-1]
    repo_parts = rest[: -2 if write else -1]
    if last in REPO_ENDPOINTS and len(repo_parts) in (1, 2):
        path = "write" if write else ""
        return Route(REPO_ENDPOINTS[last], repo_type, _repo(repo_parts), None, path, query)
    if len(rest) in (1, 2) and all(rest):
        return Route("repo_info", repo_type, _repo(rest), None, "", query)
    for n in (2, 1):
        if len(rest) > n + 1 and rest[n] in API_KEYWORDS:
            repo_id, keyword, tail = _repo(rest[:n]), rest[n], rest[n + 1 :]
            revision = _revision(tail[0])
            if keyword == "revision" and len(tail) == 1:
                return Route("repo_info", repo_type, repo_id, revision, "", query)
            if keyword == "commits" and len(tail) == 1:
                return Route("commits", repo_type, repo_id, revision, "", query)
            if keyword == "paths-info" and len(tail) == 1:
                return Route("paths_info", repo_type, repo_id, revision, "", query)
            if keyword == "tree":
                path_parts = [p for part in tail[1:] for p in part.split("/")]
                if path_parts and path_parts[-1] == "":
                    path_parts = path_parts[:-1]  # tolerate one trailing slash
                path = _relpath(path_parts) if path_parts else ""
                return Route("tree", repo_type, repo_id, revision, path, query)
    raise NoRoute("no such endpoint")


def moved_target(target: str, route: Route, repo_id: str) -> str | None:
    """``target`` (the raw request target ``route`` was parsed from: an API route or a
    page's ``/raw/``) naming ``repo_id`` in place of the route's repo, query kept; ``None``
    when the route's repo is not where its kind names it."""
    raw_path, sep, raw_query = target.partition("?")
    raw = raw_path.split("/")[1:]
    segs = [_decode(s) for s in raw]
    dataset = int(route.repo_type == "dataset")
    if segs[:1] != ["api"]:
        start = dataset  # /[datasets/]{repo}/...
    elif segs[1:2] == ["cmh"]:
        start = 3 + dataset  # /api/cmh/{manifest,fingerprint}/[datasets/]{repo}/...
    else:
        start = 2  # /api/{models,datasets}/{repo}/...
    parts = route.repo_id.split("/")
    if segs[start : start + len(parts)] != parts:
        return None
    named = [quote(p, safe="") for p in repo_id.split("/")]
    return "/" + "/".join(raw[:start] + named + raw[start + len(parts) :]) + sep + raw_query
