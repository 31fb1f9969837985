"""What ``install()`` and its HTTP hook share in one process: the window, the cache, the policy.

The download hook (:mod:`cmh.hub.resolver._patch`) writes here and the client
hook (:mod:`cmh.hub.resolver._session`) reads here; neither imports the other
for it, so the two hooks have no import cycle:

- the revalidation window: the commit the Hub named for a branch less than
  ``window`` seconds ago (:func:`recent_commit`, :func:`remember_commit`), for the
  credential it was asked with (:func:`~cmh.hub.resolver._credentials.credential_digest`
  of the ``Authorization`` header sent): a request with another credential, or none,
  is never answered from what that one obtained;
- the cache folder a Hub request is answered from (:func:`scoped_cache`,
  set by :func:`in_cache` around every patched call);
- the policy routed calls use (:func:`current_policy`);
- whether bare Hub API calls may be answered from a fresh cache
  (:func:`api_from_cache`, ``install(api_from_cache=...)``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from cachetools import LRUCache
from cmh.hub.cache import COMMIT_RE

from ._credentials import default_endpoint
from ._types import Policy

DEFAULT_WINDOW = 10.0
#: Revisions and repos remembered per process (least recently used first out): a long-lived
#: process that loads many repos keeps this many, not one entry per name ever asked.
MAX_REMEMBERED = 4096

_lock = threading.Lock()
#: (cache, endpoint, repo type, repo id, revision, credential digest) -> (commit, the
#: policy clock's monotonic time when named).
recent: LRUCache[tuple[str, ...], tuple[str, float]] = LRUCache(MAX_REMEMBERED)
_window = DEFAULT_WINDOW
_policy: Policy | None = None
#: Environment switch for :func:`api_from_cache` when ``install()`` is not told.
API_FROM_CACHE_ENV = "CMH_HUB_API_FROM_CACHE"
_api_from_cache: bool | None = None
#: The cache folder of the patched call under way (``None``: none is). The client hook
#: answers from this folder only, so no other cache vouches for a commit.
_scope: contextvars.ContextVar[Path | None] = contextvars.ContextVar("cmh_scope", default=None)
#: The folder the last patched call of each repo (type, id) named in this install.
_last_cache: LRUCache[tuple[str, str], Path] = LRUCache(MAX_REMEMBERED)


def configure(window: float, policy: Policy | None, api_cache: bool | None = None) -> None:
    """Set the window length, the policy of routed calls and :func:`api_from_cache`
    (``install()``; ``None``: read ``CMH_HUB_API_FROM_CACHE`` when asked)."""
    global _window, _policy, _api_from_cache
    with _lock:
        _window, _policy, _api_from_cache = window, policy, api_cache


def api_from_cache() -> bool:
    """True when a bare Hub API call (``model_info``, ``list_repo_files``, ``HfFileSystem``,
    made outside a patched call) may be answered from a fresh snapshot without asking the
    Hub. Off by default: such a call then asks the Hub as the stock client does (and raises
    what it raises when the Hub cannot be reached) unless, less than ``window`` seconds ago
    in this process, the Hub named the commit or a patched call of the repo was answered
    from the cache (the call is then part of that load: :func:`loaded_commit`)."""
    if _api_from_cache is not None:
        return _api_from_cache
    return os.environ.get(API_FROM_CACHE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


#: (cache, endpoint, repo type, repo id, revision or commit, credential digest) -> (commit,
#: the policy clock's monotonic time) of a patched call answered from the cache without the
#: Hub (a fresh snapshot); bounded like :data:`recent`.
loaded: LRUCache[tuple[str, ...], tuple[str, float]] = LRUCache(MAX_REMEMBERED)


class Asked(NamedTuple):
    """What a call asked for: the revision of a repo, at an endpoint, into a cache."""

    root: Path
    endpoint: str | None
    repo_type: str
    repo_id: str
    revision: str


def remember_loaded(where: Asked, commit: str, *, credential: str) -> None:
    """Record that a patched call made with ``credential`` answered ``revision`` at
    ``commit`` from the cache now: the bare API calls of the same load (transformers'
    template listing, peft's probes) made with the same credential within ``window``
    seconds are answered from the cache too (:func:`loaded_commit`)."""
    now = current_policy().clock.monotonic()
    with _lock:
        for name in {where.revision, commit}:
            loaded[_key(where, name, credential)] = (commit, now)


def loaded_commit(where: Asked, *, credential: str) -> str | None:
    """The commit a patched call made with ``credential`` answered ``revision`` with from
    the cache less than ``window`` seconds ago, if one did."""
    with _lock:
        hit = loaded.get(_key(where, where.revision, credential))
    if hit is not None and current_policy().clock.monotonic() - hit[1] < _window:
        return hit[0]
    return None


def in_patched_call() -> bool:
    """True inside a patched call (its stock calls included), where the stock function
    itself falls back to the cache when the Hub cannot be reached."""
    return _scope.get() is not None


def forget() -> None:
    """Drop every remembered commit and cache folder (``uninstall()``)."""
    with _lock:
        recent.clear()
        loaded.clear()
        _last_cache.clear()


def current_policy() -> Policy:
    """The policy routed calls use (``install(policy=...)``, else from the environment)."""
    return _policy if _policy is not None else Policy.from_env()


def cache_root(cache_dir: Any = None) -> Path:
    """The cache folder the stock client uses for ``cache_dir``: as given, else its default.

    As ``hf_hub_download`` computes it: ``huggingface_hub.constants.HF_HUB_CACHE``
    (read from ``HF_HUB_CACHE``/``HF_HOME`` when huggingface_hub was imported) when
    ``cache_dir`` is ``None``, user-expanded and made absolute.
    """
    if cache_dir is None:
        from huggingface_hub import constants

        cache_dir = constants.HF_HUB_CACHE
    return Path(str(cache_dir)).expanduser().resolve()


def scoped_cache(repo_type: str, repo_id: str) -> Path:
    """The cache folder a Hub request of ``repo_id`` is answered from.

    Inside a patched call, the folder it names. Outside (a bare API call such
    as transformers' ``list_repo_templates`` or peft's file probes, made in the
    middle of a load whose downloads name ``cache_dir``), the folder the last
    patched call of that repo named, else the stock default.
    """
    scoped = _scope.get()
    if scoped is not None:
        return scoped
    with _lock:
        last = _last_cache.get((repo_type, repo_id))
    return last or cache_root(None)


@contextlib.contextmanager
def in_cache(cache_dir: Any, repo_type: Any, repo_id: Any) -> Iterator[Path]:
    """Run a patched call (and the stock calls inside it) against the cache it names."""
    root = cache_root(cache_dir)
    if isinstance(repo_id, str):
        with _lock:
            _last_cache[(repo_type if isinstance(repo_type, str) else "model", repo_id)] = root
    token = _scope.set(root)
    try:
        yield root
    finally:
        _scope.reset(token)


def _key(where: Asked, revision: str, credential: str) -> tuple[str, ...]:
    endpoint = (where.endpoint or default_endpoint()).rstrip("/")
    root = str(Path(where.root).expanduser())
    return (root, endpoint, where.repo_type, where.repo_id, revision, credential)


def recent_commit(where: Asked, *, credential: str) -> str | None:
    """The commit the Hub named for ``revision`` less than ``window`` seconds ago, asked
    with ``credential``, if it did."""
    with _lock:
        hit = recent.get(_key(where, where.revision, credential))
    if hit is not None and current_policy().clock.monotonic() - hit[1] < _window:
        return hit[0]
    return None


def remember_commit(where: Asked, commit: str, *, credential: str) -> None:
    """Record that the Hub named ``commit`` for ``revision`` now to a request made with
    ``credential`` (opens the window for that credential only; for the commit itself too:
    the calls of the same load that ask at the commit, such as datasets' info and tree
    pages, are part of that revalidation)."""
    if COMMIT_RE.match(where.revision):
        return
    now = current_policy().clock.monotonic()
    with _lock:
        recent[_key(where, where.revision, credential)] = (commit, now)
        if COMMIT_RE.match(commit):
            recent[_key(where, commit, credential)] = (commit, now)
