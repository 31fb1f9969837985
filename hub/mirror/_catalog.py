"""Repo listings (``GET /api/models``, ``GET /api/datasets``): the query, matching and order.

The query is the one the stock ``HfApi.list_models`` / ``list_datasets``
send: ``search`` (each value a case-insensitive substring of the repo id),
``author`` (the namespace, any case), ``filter`` (each value one of the
repo's tags), ``pipeline_tag``, ``gated``, ``sort`` with ``direction``,
``limit``, ``full``, ``cardData`` (``expand`` is read by the handler). Other parameters the Hub
knows (``apps``, ``inference``, ``num_parameters``, ``config`` ...) filter
on facts the mirror does not have and are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_LIMIT = 1000
#: ``sort`` values and the property they order by (the counters are all 0 here).
SORT_KEYS = {
    "lastModified": "lastModified",
    "createdAt": "createdAt",
    "downloads": "downloads",
    "likes": "likes",
    "trendingScore": "trendingScore",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class BadQuery(ValueError):
    """A listing query the Hub would refuse (answered 400)."""


@dataclass(frozen=True)
class ListingQuery:
    """What a listing asks for."""

    search: tuple[str, ...] = ()
    author: str | None = None
    filters: tuple[str, ...] = ()
    pipeline_tag: str | None = None
    gated: bool | None = None
    sort: str | None = None
    descending: bool = True
    limit: int | None = None
    full: bool = False
    card_data: bool = False


def _flag(value: str, name: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise BadQuery(f"{name} must be true or false")


def parse_query(pairs: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> ListingQuery:
    """The listing query of a request's query pairs (``BadQuery`` for a malformed one)."""
    values: dict[str, list[str]] = {}
    for key, value in pairs:
        values.setdefault(key.removesuffix("[]"), []).append(value)

    def last(key: str) -> str | None:
        return values[key][-1] if key in values else None

    limit = last("limit")
    ascii_digits = limit is not None and limit.isascii() and limit.isdigit()  # not "²", "١"
    if limit is not None and (not ascii_digits or not 1 <= int(limit) <= MAX_LIMIT):
        raise BadQuery(f"limit must be an integer from 1 to {MAX_LIMIT}")
    sort = last("sort")
    if sort is not None and sort not in SORT_KEYS:
        raise BadQuery(f"invalid sort: {sort!r}")
    direction = last("direction")
    if direction not in (None, "-1", "1"):
        raise BadQuery("direction must be -1 or 1")
    gated = last("gated")
    return ListingQuery(
        search=tuple(s for s in values.get("search", []) if s),
        author=last("author") or None,
        filters=tuple(f for f in values.get("filter", []) if f),
        pipeline_tag=last("pipeline_tag") or None,
        gated=None if gated is None else _flag(gated, "gated"),
        sort=sort,
        descending=direction != "1",
        limit=None if limit is None else int(limit),
        full=_flag(last("full") or "false", "full"),
        card_data=_flag(last("cardData") or "false", "cardData"),
    )


def matches(query: ListingQuery, properties: dict[str, Any]) -> bool:
    """True when a repo (its repo-info properties) passes every filter of ``query``."""
    repo_id = str(properties["id"])
    if any(s.lower() not in repo_id.lower() for s in query.search):
        return False
    if query.author is not None:
        author = properties.get("author")
        if not isinstance(author, str) or author.lower() != query.author.lower():
            return False
    tags = properties.get("tags") or []
    if any(f not in tags for f in query.filters):
        return False
    if query.pipeline_tag is not None and properties.get("pipeline_tag") != query.pipeline_tag:
        return False
    return query.gated is None or bool(properties.get("gated")) == query.gated


def order(query: ListingQuery, rows: list[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows ``(commit time, properties)`` in the listing's order.

    By repo id without ``sort``; by commit time for ``lastModified`` and
    ``createdAt`` (the mirror has one time per commit), newest first unless
    ``direction=1``; equal keys keep the id order.
    """
    rows = sorted(rows, key=lambda r: str(r[1]["id"]))
    if query.sort is None:
        return [r[1] for r in rows]
    key = SORT_KEYS[query.sort]
    if key in ("lastModified", "createdAt"):
        ranked = sorted(rows, key=lambda r: r[0], reverse=query.descending)
    else:
        ranked = sorted(rows, key=lambda r: r[1].get(key, 0), reverse=query.descending)
    return [r[1] for r in ranked]
