"""Hub API answers kept per commit, for install()'s hook (``{repo}/.cmh/answers/{C}/``).

A commit's API answers never change, so the hook (``session.py``) answers a
stock client's repo info or tree request of a known commit from a stored copy.
Each answer is stored under its request key, ``"GET /api/models/{id}/revision/{C}"``
with the query as sent, and the credential it was obtained with
(:func:`~cmh.hub.resolver._credentials.credential_digest` of the ``Authorization``
header sent: ``""`` for none, else a SHA-256, never the token): one JSON file named
by the SHA-256 of both. An answer is given again only to a request with the same
credential (a private repo's answer never to another token, or to none; an answer
stored without a credential record, by an older cmh, to no request).

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
    #: :func:`~cmh.hub.resolver._credentials.credential_digest` of the header it was asked
    #: with. Deny by default: an answer nobody said the credential of is kept for none.
    credential: str | None = None


def answer_path(repo: RepoLayout, commit: str, key: str, credential: str) -> Path:
    named = key if not credential else f"{credential}\n{key}"
    name = hashlib.sha256(named.encode()).hexdigest()
    return repo.cmh_dir / "answers" / commit / f"{name}.json"


def read_answer(repo: RepoLayout, commit: str, key: str, credential: str) -> dict[str, Any] | None:
    """The stored answer of ``key`` at ``commit`` (``status``, ``headers``, ``body``) that
    was obtained with ``credential``, if any."""
    try:
        path = answer_path(repo, commit, key, credential)
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    if data.get("credential") != credential:
        return None  # obtained with another credential, or not said: asked again
    return data


def write_answer(
    repo: RepoLayout,
    commit: str,
    key: str,
    status: int,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    credential: str | None,
) -> None:
    """Store an answer obtained with ``credential`` (best effort: a failed write only costs
    a request later; ``None``, a credential nobody can tell: not stored)."""
    if not COMMIT_RE.match(commit) or credential is None:
        return
    if not (repo.path / "snapshots").is_dir():
        # A repo folder with no snapshots/ is a corrupt repo to huggingface_hub's
        # scan_cache_dir (and a cache folder made only for it, one that is there): an
        # answer is kept only beside a snapshot (a bare API call on an empty cache
        # writes nothing, as stock's).
        return
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return
    kept = [[k, v] for k, v in headers if k.lower() in KEPT_HEADERS]
    document = {
        "key": key,
        "credential": credential,
        "status": status,
        "headers": kept,
        "body": text,
    }
    path = answer_path(repo, commit, key, credential)
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
            write_answer(repo, commit, key, 200, answer.headers, answer.body, answer.credential)
            if query == "recursive=true":  # the first page, as the stock client asks it
                stock = f"GET {path}?recursive=true&expand=false"
                write_answer(
                    repo, commit, stock, 200, answer.headers, answer.body, answer.credential
                )


def _keep_revision(repo: RepoLayout, commit: str, base: str, answer: ApiAnswer) -> None:
    try:
        doc = json_value(answer.body)
    except ValueError:
        return
    if not isinstance(doc, dict) or doc.get("sha") != commit:
        return  # the answer of another commit (the branch moved meanwhile)
    key = f"GET {base}/revision/{commit}?blobs=true"
    write_answer(repo, commit, key, 200, answer.headers, answer.body, answer.credential)
    siblings = doc.get("siblings")
    if isinstance(siblings, list):
        if not all(isinstance(s, dict) and "rfilename" in s for s in siblings):
            return
        doc = {**doc, "siblings": [{"rfilename": s["rfilename"]} for s in siblings]}
    plain = [(k, v) for k, v in answer.headers if k.lower() in _DERIVED_HEADERS]
    body = json.dumps(doc, separators=(",", ":")).encode()
    write_answer(repo, commit, f"GET {base}/revision/{commit}", 200, plain, body, answer.credential)


__all__ = [
    "ApiAnswer",
    "answer_path",
    "keep_resolver_answers",
    "read_answer",
    "write_answer",
]
