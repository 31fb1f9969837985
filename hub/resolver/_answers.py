"""Hub API answers kept per commit, for install()'s hook (``{repo}/.cmh/answers/{C}/``).

A commit's API answers never change, so the hook (``session.py``) answers a
stock client's repo info or tree request of a known commit from a stored copy.
Each answer is stored under its request key, ``"GET /api/models/{id}/revision/{C}"``
with the query as sent, one JSON file named by the key's SHA-256.

:func:`keep_resolver_answers` keeps what a resolve already had, so the first
``install()`` use after ``cmh pull`` or :func:`~cmh.hub.resolver.resolve`
asks nothing again:

- the revision answer the resolver asks with ``?blobs=true``, under that key
  (at the commit it named) and, with each sibling cut to its ``rfilename``,
  under the key of the stock client's plain repo info request (the answer the
  Hub gives without ``blobs``: the same document without blob ids, sizes and
  LFS pointers);
- the tree pages it listed, under their own URLs; the first also under the
  stock ``list_repo_tree`` key (``recursive=true&expand=false``: ``expand``
  is ``false`` by default, so the Hub answers both alike, and the stock
  client follows the page's own ``Link`` to the pages kept after it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cmh.hub.cache import COMMIT_RE, RepoLayout, json_value

from cmh import atomic_write

#: Response headers kept with a stored API answer.
KEPT_HEADERS = ("content-type", "x-repo-commit", "x-error-code", "x-error-message", "link", "etag")
#: Headers of an answer derived from another (its ``ETag`` names the other body).
_DERIVED_HEADERS = ("content-type", "x-repo-commit")
_PREFIX = {"model": "models", "dataset": "datasets", "space": "spaces"}
#: Bodies larger than this are not kept by :func:`keep_resolver_answers`.
MAX_KEPT_BODY = 8 << 20


@dataclass(frozen=True)
class ApiAnswer:
    """One 200 API answer the resolver's client received: URL (with query), headers, body."""

    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


def answer_path(repo: RepoLayout, commit: str, key: str) -> Path:
    name = hashlib.sha256(key.encode()).hexdigest()
    return repo.cmh_dir / "answers" / commit / f"{name}.json"


def read_answer(repo: RepoLayout, commit: str, key: str) -> dict[str, Any] | None:
    """The stored answer of ``key`` at ``commit`` (``status``, ``headers``, ``body``), if any."""
    try:
        data = json.loads(answer_path(repo, commit, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    return data


def write_answer(
    repo: RepoLayout,
    commit: str,
    key: str,
    status: int,
    headers: Iterable[tuple[str, str]],
    body: bytes,
) -> None:
    """Store an answer (best effort: a failed write only costs a request later)."""
    if not COMMIT_RE.match(commit):
        return
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return
    kept = [[k, v] for k, v in headers if k.lower() in KEPT_HEADERS]
    document = {"key": key, "status": status, "headers": kept, "body": text}
    path = answer_path(repo, commit, key)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(document).encode())


def keep_resolver_answers(repo: RepoLayout, commit: str, answers: Iterable[ApiAnswer]) -> None:
    """Store the revision and tree answers of ``repo`` at ``commit`` a resolve received."""
    base = f"/api/{_PREFIX[repo.repo_type]}/{repo.repo_id}"
    revision_re = re.compile(re.escape(base) + r"/revision/[^/?]+")
    tree_path = f"{base}/tree/{commit}"
    for answer in answers:
        if len(answer.body) > MAX_KEPT_BODY:
            continue
        parts = urlsplit(answer.url)
        path, query = parts.path, parts.query
        if revision_re.fullmatch(path) and query == "blobs=true":
            _keep_revision(repo, commit, base, answer)
        elif path == tree_path:
            key = f"GET {path}" + (f"?{query}" if query else "")
            write_answer(repo, commit, key, 200, answer.headers, answer.body)
            if query == "recursive=true":  # the first page, as the stock client asks it
                stock = f"GET {path}?recursive=true&expand=false"
                write_answer(repo, commit, stock, 200, answer.headers, answer.body)


def _keep_revision(repo: RepoLayout, commit: str, base: str, answer: ApiAnswer) -> None:
    try:
        doc = json_value(answer.body)
    except ValueError:
        return
    if not isinstance(doc, dict) or doc.get("sha") != commit:
        return  # the answer of another commit (the branch moved meanwhile)
    write_answer(
        repo, commit, f"GET {base}/revision/{commit}?blobs=true", 200, answer.headers, answer.body
    )
    siblings = doc.get("siblings")
    if isinstance(siblings, list):
        if not all(isinstance(s, dict) and "rfilename" in s for s in siblings):
            return
        doc = {**doc, "siblings": [{"rfilename": s["rfilename"]} for s in siblings]}
    plain = [(k, v) for k, v in answer.headers if k.lower() in _DERIVED_HEADERS]
    body = json.dumps(doc, separators=(",", ":")).encode()
    write_answer(repo, commit, f"GET {base}/revision/{commit}", 200, plain, body)


__all__ = [
    "ApiAnswer",
    "answer_path",
    "keep_resolver_answers",
    "read_answer",
    "write_answer",
]
