"""The Hub's JSON about a repo beyond one commit's files: card-derived repo info and ``expand``,
refs, commits, ``lastCommit`` and the items of ``GET /api/models`` / ``/api/datasets``.

Pure functions (no I/O, no aiohttp). The shapes are the ones the stock
``huggingface_hub`` client parses (``ModelInfo``, ``DatasetInfo``,
``GitRefs``, ``GitCommitInfo``, ``LastCommitInfo``); property names accepted
by ``expand`` are the client's own lists.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, get_args

from . import _documents as documents
from ._derived import CardFields
from ._history import CommitRecord
from ._index import CommitIndex


@functools.cache
def expand_properties(repo_type: str) -> frozenset[str]:
    """``expand`` values the Hub accepts for ``repo_type`` (any other answers 400): the stock
    client's own lists, read on first use (importing ``hf_api`` costs ``cmh serve`` 0.2 s)."""
    from huggingface_hub.hf_api import ExpandDatasetProperty_T, ExpandModelProperty_T

    kinds = {"model": ExpandModelProperty_T, "dataset": ExpandDatasetProperty_T}
    return frozenset(get_args(kinds[repo_type]))


#: Counters the Hub keeps and the mirror does not: always 0.
_COUNTERS = {"downloads": 0, "downloadsAllTime": 0, "likes": 0, "trendingScore": 0}
#: Properties answered only when ``expand`` names them.
_EXPAND_ONLY = ("downloadsAllTime", "trendingScore")
#: The properties of a listing item without ``full``, ``cardData`` or ``expand``.
LISTING_PROPERTIES = {
    "model": ("_id", "id", "modelId", "author", "likes", "trendingScore", "private", "downloads",
              "tags", "pipeline_tag", "library_name", "createdAt"),
    "dataset": ("_id", "id", "author", "disabled", "gated", "lastModified", "likes",
                "trendingScore", "private", "sha", "downloads", "tags", "createdAt"),
}  # fmt: skip


class BadExpand(ValueError):
    """An ``expand`` value the Hub does not know."""


def repo_properties(
    repo_type: str,
    repo_id: str,
    index: CommitIndex,
    *,
    private: bool,
    blobs: bool,
    card: CardFields,
    safetensors: dict[str, Any] | None,
) -> dict[str, Any]:
    """Every property the mirror knows of a repo at a commit (the repo-info document and more)."""
    body = documents.repo_info(repo_type, repo_id, index, private=private, blobs=blobs)
    body.update(_COUNTERS)
    body["tags"] = list(card.tags)
    if card.card_data is not None:
        body["cardData"] = card.card_data
    if card.pipeline_tag is not None:
        body["pipeline_tag"] = card.pipeline_tag
    if card.library_name is not None:
        body["library_name"] = card.library_name
    if repo_type == "model" and safetensors is not None:
        body["safetensors"] = safetensors
    return body


def check_expand(repo_type: str, expand: Iterable[str]) -> list[str]:
    """``expand`` as a list, or :class:`BadExpand` naming the first unknown property."""
    names = list(expand)
    for name in names:
        if name not in expand_properties(repo_type):
            raise BadExpand(f"invalid expand property: {name!r}")
    return names


def repo_info(properties: dict[str, Any], expand: list[str] | None) -> dict[str, Any]:
    """The repo-info answer: the document without ``expand``, else ``_id``, ``id`` and only
    the expanded properties the mirror has."""
    if not expand:
        return {k: v for k, v in properties.items() if k not in _EXPAND_ONLY}
    return _only(properties, expand)


def listing_item(
    repo_type: str,
    properties: dict[str, Any],
    *,
    full: bool,
    card_data: bool,
    expand: list[str] | None,
) -> dict[str, Any]:
    """One item of a repo listing, as the Hub shapes it for these query flags."""
    if expand:
        return _only(properties, expand)
    if full:
        item = {k: v for k, v in properties.items() if k not in ("cardData", "safetensors")}
    else:
        item = {k: properties[k] for k in LISTING_PROPERTIES[repo_type] if k in properties}
    if card_data and "cardData" in properties:
        item["cardData"] = properties["cardData"]
    return item


def _only(properties: dict[str, Any], expand: list[str]) -> dict[str, Any]:
    out = {"_id": properties["_id"], "id": properties["id"]}
    out.update({k: properties[k] for k in expand if k in properties})
    return out


def refs(named: dict[str, str], include_prs: bool) -> dict[str, Any]:
    """``GET /api/{type}s/{repo}/refs``: each ref name with the commit it names.

    A store cannot tell a tag from a branch (both are ``refs/{name}``): a plain
    name is a branch, ``refs/heads/X`` a branch ``X``, ``refs/tags/X`` a tag
    ``X``, ``refs/convert/X`` a convert ``X``, ``refs/pr/N`` a pull request.
    """
    out: dict[str, list[dict[str, str]]] = {"branches": [], "converts": [], "tags": []}
    prs: list[dict[str, str]] = []
    for name, commit in sorted(named.items()):
        kind, short, ref = "branches", name, f"refs/heads/{name}"
        for prefix, group in (("refs/heads/", "branches"), ("refs/tags/", "tags"),
                              ("refs/convert/", "converts")):  # fmt: skip
            if name.startswith(prefix):
                kind, short, ref = group, name[len(prefix) :], name
        if name.startswith("refs/pr/"):
            prs.append({"name": name, "ref": name, "targetCommit": commit})
            continue
        if name.startswith("refs/") and ref != name:
            continue  # another kind of ref the Hub does not list
        out[kind].append({"name": short, "ref": ref, "targetCommit": commit})
    body: dict[str, Any] = dict(out)
    if include_prs:
        body["pullRequests"] = prs
    return body


def commit_item(record: CommitRecord, formatted: bool) -> dict[str, Any]:
    """One item of ``GET /api/{type}s/{repo}/commits/{rev}``."""
    item: dict[str, Any] = {
        "id": record.commit,
        "title": record.title,
        "message": "",
        "authors": [{"user": name} for name in record.authors],
        "date": documents.iso(record.created_at),
    }
    if formatted:
        item["formatted"] = {"title": record.title, "message": ""}
    return item


def last_commit(record: CommitRecord) -> dict[str, str]:
    """The ``lastCommit`` of a tree or paths-info entry (with ``expand``)."""
    return {"id": record.commit, "title": record.title, "date": documents.iso(record.created_at)}
