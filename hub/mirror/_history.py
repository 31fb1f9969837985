"""A commit's history from the store's commit records (``.cmh/commits/{commit}.json``).

``cmh mirror add`` records each commit's tree, parents and creation time; a
cache filled by another tool has no records, so its commits have no known
parent and no title or author. The history of a commit is its first-parent
chain, newest first, as far as records go (at most :data:`MAX_HISTORY`
commits). The last commit of a path is the oldest commit of that chain
reached without the path's id (blob or tree oid) changing; the walk stops at
an ancestor whose snapshot is gone (its files are unknown).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cmh.hub.cache import COMMIT_RE, RepoLayout

from ._index import CommitIndex, IndexCache, commit_meta_path, resolve_revision

MAX_HISTORY = 1000
#: The message of every commit ``cmh mirror add`` makes (spec/hub-mirror.md 1.2).
IMPORT_TITLE = "cmh mirror add"
IMPORT_AUTHOR = "cmh mirror"


@dataclass(frozen=True)
class CommitRecord:
    """What the store knows of one commit."""

    commit: str
    parent: str | None  # first parent
    created_at: float
    recorded: bool  # made by ``cmh mirror add`` (it has a record)

    @property
    def title(self) -> str:
        return IMPORT_TITLE if self.recorded else ""

    @property
    def authors(self) -> list[str]:
        return [IMPORT_AUTHOR] if self.recorded else []


def read_record(repo: RepoLayout, commit: str) -> CommitRecord | None:
    """The record of ``commit``, or ``None`` when it has none (or a malformed one)."""
    try:
        data = json.loads(commit_meta_path(repo, commit).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    parents = data.get("parents")
    created = data.get("created_at")
    if not isinstance(parents, list) or not all(
        isinstance(p, str) and COMMIT_RE.match(p) for p in parents
    ):
        return None
    if not isinstance(created, (int, float)) or isinstance(created, bool):
        return None
    return CommitRecord(commit, parents[0] if parents else None, float(created), True)


def history(repo: RepoLayout, head: CommitIndex, limit: int = MAX_HISTORY) -> list[CommitRecord]:
    """``head`` then its first parents, newest first, while records exist (``limit`` at most)."""
    first = read_record(repo, head.commit)
    if first is None:
        return [CommitRecord(head.commit, None, head.last_modified, False)]
    chain = [first]
    seen = {first.commit}
    while len(chain) < limit and chain[-1].parent is not None and chain[-1].parent not in seen:
        record = read_record(repo, chain[-1].parent)
        if record is None:
            break
        chain.append(record)
        seen.add(record.commit)
    return chain


def path_oid(index: CommitIndex, path: str) -> str | None:
    """The tree-listing oid of a file or folder of a commit (what a change changes)."""
    entry = index.files.get(path)
    if entry is not None:
        return entry.oid
    return index.dir_oids.get(path)


def last_commits(
    repo: RepoLayout, head: CommitIndex, paths: Iterable[str], indexes: IndexCache
) -> dict[str, CommitRecord]:
    """The commit that last changed each of ``paths`` (files or folders of ``head``)."""

    def index_of(commit: str) -> CommitIndex | None:
        if resolve_revision(repo, commit) is None:
            return None  # an ancestor whose files are unknown
        return indexes.get(repo, commit)

    return place_changes(history(repo, head), head, paths, index_of)


def place_changes(
    chain: list[CommitRecord],
    head: CommitIndex,
    paths: Iterable[str],
    index_of: Callable[[str], CommitIndex | None],
) -> dict[str, CommitRecord]:
    """The commit of ``chain`` (``head`` and its first parents, newest first) that last
    changed each of ``paths``: the oldest one reached before the path's oid differs.
    The walk stops at an ancestor ``index_of`` cannot give (its files are unknown)."""
    pending = {p: oid for p in paths if (oid := path_oid(head, p)) is not None}
    out: dict[str, CommitRecord] = {}
    reached = chain[0]
    for parent in chain[1:]:
        older = index_of(parent.commit) if pending else None
        if older is None:
            break  # nothing left to place, or an ancestor whose files are unknown
        for path, oid in list(pending.items()):
            if path_oid(older, path) != oid:
                out[path] = reached
                del pending[path]
        reached = parent
    out.update(dict.fromkeys(pending, reached))
    return out
