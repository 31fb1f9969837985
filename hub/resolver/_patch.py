"""``install()``: route the downloads of unchanged user code through the resolver.

Patched (huggingface_hub 2.x, transformers 4.40+/5.x), only while installed:

- ``huggingface_hub.file_download.hf_hub_download`` and
  ``huggingface_hub._snapshot_download.snapshot_download`` (where they are
  defined; ``HfApi.hf_hub_download``/``HfApi.snapshot_download`` import them
  from there at call time);
- the re-exports ``huggingface_hub.hf_hub_download`` and
  ``huggingface_hub.snapshot_download`` (so code imported later, such as
  ``from huggingface_hub import hf_hub_download``, gets the wrapper);
- every attribute of an already imported module that is bound to one of the
  two original functions (``transformers.utils.hub.hf_hub_download`` and
  ``.snapshot_download`` imported by name, sentence-transformers, ...);
- ``try_to_load_from_cache`` in the same places (transformers reads the files of a
  commit it knows straight from the cache with it): a cached file whose blob fails
  its check is answered ``None``, not cached, so the caller downloads it through
  the wrapped ``hf_hub_download``, which fetches it again (or refuses it offline).

Offline (``local_files_only`` or the offline policy), a cached file that fails its
check raises the stock ``LocalEntryNotFoundError`` (the cache cannot serve the call),
caused by the resolver's :class:`IntegrityError`: every caller already handles it,
and the bytes are never returned.

Fail safe: before patching, the signature of each original is checked for the
parameters the wrapper reads; if one is missing the function is left alone and
a :class:`RuntimeWarning` says so. At call time, anything the resolver does
not handle (``local_dir``, ``dry_run``, ``force_download``, ``ignore_patterns``,
unknown arguments, an unsupported repo type, a cache the stock client would fill
without symlinks, errors other than integrity or policy refusals) goes to the
original function unchanged.

Within one process, a branch resolved less than ``window`` seconds ago is used
at the commit it named then, so a ``from_pretrained`` asking for ten files
costs one revalidation request, not ten.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import glob
import inspect
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from cmh.hub.cache import (
    COMMIT_RE,
    LayoutError,
    RepoLayout,
    blob_lock,
    blob_state,
    discard_blob,
)

from . import _window as window_state
from ._credentials import token_credential
from ._local import hub_said_absent, one_file_listing, publish_tree
from ._types import (
    DiskFullError,
    IntegrityError,
    InvalidRemoteFileError,
    NotFoundError,
    OfflineError,
    Policy,
    PolicyError,
    ResolveError,
    State,
)
from ._window import (
    DEFAULT_WINDOW,
    Asked,
    cache_root,
    current_policy,
    recent_commit,
    remember_commit,
    remember_loaded,
)
from ._window import in_cache as _in_cache

#: Resolver errors raised to the caller instead of handing the call to the stock function:
#: refused content is never returned, and a full disk is full for the stock client too.
RAISED = (IntegrityError, PolicyError, InvalidRemoteFileError, DiskFullError)


logger = logging.getLogger("cmh.hub")

HF_HUB_DOWNLOAD_PARAMS = (
    "repo_id",
    "filename",
    "subfolder",
    "repo_type",
    "revision",
    "cache_dir",
    "local_dir",
    "force_download",
    "token",
    "local_files_only",
    "endpoint",
)
TRY_TO_LOAD_PARAMS = ("repo_id", "filename", "cache_dir", "revision", "repo_type")
SNAPSHOT_DOWNLOAD_PARAMS = (
    "repo_id",
    "repo_type",
    "revision",
    "cache_dir",
    "local_dir",
    "allow_patterns",
    "ignore_patterns",
    "force_download",
    "token",
    "local_files_only",
    "endpoint",
)

#: The oldest huggingface_hub release ``install()`` patches (``pyproject.toml``: ``>=2.0``).
MIN_HUB_RELEASE = (2, 0)

_lock = threading.RLock()
_patched: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, wrapper)
_recent = window_state.recent  # the revalidation window (tests clear it as a new process would)
_warned: set[tuple[str, ...]] = set()  # warnings already logged (once per repo and process)
#: An LFS file's ETag: the SHA-256 of its bytes.
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")


def installed() -> bool:
    """True while the resolver is installed."""
    return bool(_patched)


def install(
    *,
    window: float = DEFAULT_WINDOW,
    policy: Policy | None = None,
    api_from_cache: bool | None = None,
) -> bool:
    """Patch the stock download functions; returns ``False`` if nothing could be patched.

    On a huggingface_hub release older than :data:`MIN_HUB_RELEASE` (what ``pyproject.toml``
    requires; 0.x and 1.x lack the client factory hook, and 0.17 even the
    ``constants.HF_HUB_CACHE`` the wrappers read) nothing is patched: a
    :class:`RuntimeWarning` names the release, ``False`` is returned, and the stock
    client works as it does without ``install()``.

    ``policy`` overrides :meth:`Policy.from_env` for routed calls (the
    ``local_files_only`` argument still forces offline). ``api_from_cache``: answer
    bare Hub API calls (``model_info``, ``list_repo_files``, ``HfFileSystem``) of a
    fresh snapshot from the cache, also when the Hub cannot be reached (default:
    ``CMH_HUB_API_FROM_CACHE``, else off: they ask the Hub as stock does).
    """
    with _lock:
        if _patched:
            return True
        unsupported = _unsupported_release()
        if unsupported is not None:
            warnings.warn(
                f"cmh.hub.install: huggingface_hub {unsupported} is not supported (cmh needs "
                f"{'.'.join(map(str, MIN_HUB_RELEASE))} or later): nothing patched, downloads "
                "go to the stock client unchanged",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        window_state.configure(window, policy, api_from_cache)
        from huggingface_hub import _snapshot_download, file_download

        targets = [
            (file_download, "hf_hub_download", HF_HUB_DOWNLOAD_PARAMS, _wrap_hf_hub_download),
            (_snapshot_download, "snapshot_download", SNAPSHOT_DOWNLOAD_PARAMS, _wrap_snapshot),
            (file_download, "try_to_load_from_cache", TRY_TO_LOAD_PARAMS, _wrap_try_to_load),
        ]
        import huggingface_hub

        for module, name, params, make in targets:
            original = getattr(module, name, None)
            problem = _signature_problem(original, params)
            if problem is not None:
                warnings.warn(
                    f"cmh.hub.install: {module.__name__}.{name} left unpatched: {problem}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            assert original is not None
            wrapper = make(original)
            for owner in _owners_of(original):
                _patched.append((owner, name, original, wrapper))
                setattr(owner, name, wrapper)
            if name not in huggingface_hub.__dict__:  # lazy re-export not loaded yet
                _patched.append((huggingface_hub, name, _Absent, wrapper))
                setattr(huggingface_hub, name, wrapper)
        _scope_resolve_revision()
        _install_client_hook()
        return bool(_patched)


def _unsupported_release() -> str | None:
    """The imported huggingface_hub's version when it is older than :data:`MIN_HUB_RELEASE`
    (or not a version at all), else ``None``."""
    import huggingface_hub

    version = str(getattr(huggingface_hub, "__version__", "") or "unknown")
    numbers: list[int] = []
    for part in version.split(".")[: len(MIN_HUB_RELEASE)]:
        digits = part[: len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        numbers.append(int(digits))
    if not numbers or tuple(numbers) < MIN_HUB_RELEASE[: len(numbers)]:
        return version
    return None


def _scope_resolve_revision() -> None:
    """``HfApi.resolve_revision(cache_dir=...)`` (transformers' first call) asks in that cache.

    Its repo info request goes through the client hook, which answers from the
    cache of the call under way: without the scope the default cache would
    vouch for the commit another ``cache_dir`` then loads.
    """
    from huggingface_hub import hf_api

    original = hf_api.HfApi.__dict__.get("resolve_revision")
    if original is None or _signature_problem(original, ("repo_id", "cache_dir")) is not None:
        return

    @functools.wraps(original)
    def resolve_revision(self: Any, *args: Any, **kwargs: Any) -> Any:
        repo_id = args[0] if args else kwargs.get("repo_id")
        with _in_cache(kwargs.get("cache_dir"), kwargs.get("repo_type"), repo_id):
            return original(self, *args, **kwargs)

    _patched.append((hf_api.HfApi, "resolve_revision", original, resolve_revision))
    hf_api.HfApi.resolve_revision = resolve_revision  # type: ignore[method-assign]
    for module in (hf_api, sys.modules.get("huggingface_hub")):  # ``resolve_revision = api.…``
        bound = module.__dict__.get("resolve_revision") if module is not None else None
        if getattr(bound, "__func__", None) is original:
            rebound = bound.__self__.resolve_revision  # type: ignore[union-attr]
            _patched.append((module, "resolve_revision", bound, rebound))
            module.resolve_revision = rebound  # type: ignore[union-attr]


def _install_client_hook() -> None:
    """Put :class:`~cmh.hub.resolver._session.FreshCacheTransport` in huggingface_hub's client."""
    from huggingface_hub.utils import _http

    from ._session import client_factory

    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None)
    set_factory = getattr(_http, "set_client_factory", None)
    if not callable(previous) or not callable(set_factory):
        warnings.warn(
            "cmh.hub.install: huggingface_hub has no client factory hook; Hub API calls "
            "of fresh snapshots still go to the network",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    set_factory(client_factory(previous))
    _patched.append((_http, "_GLOBAL_CLIENT_FACTORY", previous, _FactoryRestore(set_factory)))


class _FactoryRestore:
    """Marks the client factory entry of ``_patched``: uninstall restores it through the hook."""

    def __init__(self, set_factory: Callable[[Any], None]) -> None:
        self.set_factory = set_factory


class _Absent:
    """Marks an attribute that did not exist before install (deleted on uninstall)."""


def uninstall() -> None:
    """Restore every patched attribute that still holds the wrapper."""
    with _lock:
        for owner, attr, original, wrapper in reversed(_patched):
            if isinstance(wrapper, _FactoryRestore):
                wrapper.set_factory(original)  # closes the client built with the hook
                continue
            if owner.__dict__.get(attr) is wrapper:
                if original is _Absent:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, original)
        _patched.clear()
        window_state.forget()
        _warned.clear()


def _owners_of(original: Any) -> list[Any]:
    """Modules holding ``original`` under its own name."""
    name = original.__name__
    owners = []
    for module in list(sys.modules.values()):
        try:
            if module is not None and module.__dict__.get(name) is original:
                owners.append(module)
        except Exception:  # exotic modules without a usable __dict__
            continue
    return owners


def _signature_problem(original: Any, params: tuple[str, ...]) -> str | None:
    if original is None or not callable(original):
        return "function not found"
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError) as exc:
        return f"signature unreadable ({exc})"
    missing = [p for p in params if p not in signature.parameters]
    if missing:
        return f"parameters {', '.join(missing)} are gone (signature changed)"
    return None


#: Legacy arguments the stock functions accept and ignore (transformers still passes ``proxies``).
IGNORED_KWARGS = frozenset(
    {"proxies", "resume_download", "force_filename", "local_dir_use_symlinks"}
)


def _bind(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    kwargs = {k: v for k, v in kwargs.items() if k not in IGNORED_KWARGS}
    try:
        bound = inspect.signature(original).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def _policy_for(local_files_only: bool) -> Policy:
    base = current_policy()
    if local_files_only and not base.offline:
        from dataclasses import replace

        return replace(base, offline=True)
    return base


def _token(value: Any) -> str | bool | None:
    """The caller's ``token`` as the stock client reads it: a string, ``True``, ``False``,
    else ``None`` (the resolver then chooses as stock does, ``token_to_send``)."""
    if value is True or value is False or isinstance(value, str):
        return value
    return None


def _route(a: dict[str, Any], patterns: list[str] | str | None) -> Any:
    """Resolve the bound call ``a`` (its ``allow_patterns``: ``patterns``) through the
    per-process revalidation window."""
    from ._negotiate import COMPLETENESS_UNKNOWN, PINNED_KEPT, resolve

    repo_id, repo_type = a["repo_id"], a.get("repo_type") or "model"
    endpoint, local_files_only = a.get("endpoint"), bool(a.get("local_files_only"))
    revision = _revision(a.get("revision")) or "main"
    root = cache_root(a.get("cache_dir"))
    # The window is the credential's: what the Hub named to another token (or to none)
    # is never used for this call (None: no header can be told, the resolve raises).
    credential = token_credential(_token(a.get("token")))
    where = Asked(root, endpoint, repo_type, repo_id, revision)
    use = revision
    if not local_files_only and credential is not None:
        use = recent_commit(where, credential=credential) or revision
    if use == revision and not local_files_only and not COMMIT_RE.match(revision):
        # A fresh snapshot (its stamps) vouches for its commit, whichever file is asked.
        from ._negotiate import fresh_commit

        with contextlib.suppress(OSError, ValueError):
            use = (
                fresh_commit(RepoLayout(root, repo_id, repo_type), revision, current_policy())
                or use
            )
        if use != revision and credential is not None:  # the load's bare API calls with
            remember_loaded(where, use, credential=credential)  # its credential: cache too
    policy = _policy_for(local_files_only)
    try:
        res = resolve(
            repo_id,
            use,
            repo_type=repo_type,
            cache_dir=root,
            endpoint=endpoint,
            token=_token(a.get("token")),
            allow_patterns=patterns,
            policy=policy,
        )
    except NotFoundError as exc:
        if exc.commit is not None and use == revision and credential is not None:
            remember_commit(where, exc.commit, credential=credential)
        raise
    if use == revision and res.state is not State.STALE_OFFLINE and credential is not None:
        remember_commit(where, res.commit, credential=credential)
    # Not the caller's: a commit the window or the stamps chose (the caller named a branch),
    # a snapshot the stock client filled without a listing (stock serves it as it is).
    quiet = (COMPLETENESS_UNKNOWN, *((PINNED_KEPT,) if use != revision else ()))
    for w in res.warnings:  # unchanged code never sees the Resolution: tell it through logging
        if any(q in w for q in quiet):
            logger.debug("%s: %s", repo_id, w)
            continue
        _warn_once((str(root), repo_type, repo_id, w), "%s: %s", repo_id, w)
    return res


def _warn_once(key: tuple[str, ...], message: str, *args: Any) -> None:
    """Log a WARNING the first time ``key`` (repo and what is said) comes up in this install."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args)


def _fall_back(what: str, exc: BaseException, offline: bool) -> None:
    """Say why a call goes to the stock function after the resolver failed.

    Offline, a cache the resolver cannot vouch for (a partial snapshot, as
    transformers' ``list_repo_templates`` reads with ``local_files_only``) is
    read by the stock client from the same cache, as without ``install()``:
    nothing to warn about.
    """
    if offline and isinstance(exc, OfflineError):
        logger.debug("cmh.hub.install: %s read by the stock client offline: %s", what, exc)
        return
    if type(exc).__name__ == "LocalTokenNotFoundError":  # token=True, none found: stock's
        logger.debug("cmh.hub.install: %s handed to the stock client: %s", what, exc)
        return
    logger.warning("cmh.hub.install: %s handed to the stock client: %s", what, exc)


def _entry_not_found(repo: RepoLayout, commit: str, url: str, token: Any) -> Exception | None:
    """The stock client's error for a file the Hub said is absent at ``commit``: its
    ``hf_raise_for_status`` applied to the Hub's own answer to the same request, as the
    client hook kept it (status, headers, message), with no request and nothing written.
    ``None`` when no answer was kept for the request with this call's credential (the
    stock function then asks the Hub)."""
    import httpx2
    from huggingface_hub import hf_raise_for_status

    from ._session import absent_answer

    credential = token_credential(_token(token))
    stored = None if credential is None else absent_answer(repo, commit, url, credential)
    if stored is None:
        return None
    headers = [(str(k), str(v)) for k, v in stored.get("headers", [])]
    response = httpx2.Response(404, headers=headers, request=httpx2.Request("HEAD", url))
    try:
        hf_raise_for_status(response)
    except Exception as exc:  # the stock type (RemoteEntryNotFoundError) and message
        return exc
    return None  # not an error to huggingface_hub: asked again


def _stock_url(a: dict[str, Any], filename: str, repo_type: str) -> str:
    """The ``resolve`` URL the stock client asks for ``filename`` (shown in its errors)."""
    from huggingface_hub.file_download import hf_hub_url

    return str(
        hf_hub_url(
            a["repo_id"],
            filename,
            repo_type=repo_type,
            revision=_revision(a.get("revision")),
            endpoint=a.get("endpoint"),
        )
    )


def _refused_offline(exc: IntegrityError) -> Exception:
    """What a call that may not use the network raises for a cached file that failed its
    check: the stock error of a cache that cannot serve the call (every caller handles
    it: transformers skips an optional file), caused by the resolver's refusal."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    return LocalEntryNotFoundError(
        f"{exc}: its bytes are not used. Allow the network (no 'local_files_only', no "
        "HF_HUB_OFFLINE) to fetch it again."
    )


def _local_entry_not_found(local_files_only: bool) -> Exception:
    """The stock client's error for a file the cache lacks while offline (nothing written)."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if local_files_only:
        return LocalEntryNotFoundError(
            "Cannot find the requested files in the disk cache and outgoing traffic has been "
            "disabled. To enable hf.co look-ups and downloads online, set 'local_files_only' to "
            "False."
        )
    error = LocalEntryNotFoundError(
        "An error happened while trying to locate the file on the Hub and we cannot find the "
        "requested files in the local cache. Please check your connection and try again or make "
        "sure your Internet connection is on."
    )
    error.__cause__ = OfflineModeIsEnabled(
        "Cannot reach the Hub: offline mode is enabled. To disable it, please unset the "
        "`HF_HUB_OFFLINE` environment variable."
    )
    return error


def repo_filename(filename: Any, subfolder: Any) -> tuple[str, str] | None:
    """The file the stock ``hf_hub_download`` asks for, and the path it returns under the snapshot.

    The stock client joins ``subfolder/filename`` with a ``/`` (an empty
    subfolder counts as none), puts that in the ``resolve`` URL, whose ``.``
    segments the HTTP client removes, and joins the unchanged segments under
    the snapshot folder (``subfolder="."`` reads ``modules.json`` and returns
    ``snapshots/{commit}/./modules.json``). Returns ``(repo path, local
    relative path)``, or ``None`` for a name the resolver leaves to the stock
    function (which rejects ``..`` and absolute names, and sends empty
    segments to the server as they are).
    """
    if not isinstance(filename, str) or not isinstance(subfolder, (str, type(None))):
        return None
    joined = f"{subfolder}/{filename}" if subfolder else filename
    segments = joined.split("/")
    if joined.startswith("/") or any(s == ".." or "\\" in s or ":" in s for s in segments):
        return None  # refused by the stock function, with its own error
    kept = [s for s in segments if s != "."]
    if not kept or any(s == "" for s in kept):
        return None
    return "/".join(kept), os.path.join(*segments)


Routed = Callable[[dict[str, Any], tuple[Any, ...], dict[str, Any]], Any]
#: What ``routed`` returns to hand the call to the stock function, which the wrapper then
#: calls outside any ``except`` block: its errors carry nothing of cmh (no ``__context__``).
_STOCK: Any = object()
#: What ``routed`` returns to hand the call to the stock function after the resolver failed
#: (:func:`_fall_back`): the patched calls the stock function makes meanwhile for the same
#: repo and cache go straight to stock (:func:`_handing_over`).
_HANDED: Any = object()

#: The calls handed to the stock function after the resolver failed, still under way, by
#: (cache, repo type, repo id), and in this thread's context. Stock's ``snapshot_download``
#: calls ``hf_hub_download`` once per file, in threads of its own pool (which do not inherit
#: a context): without this each of them would run the resolver again, with all its retries,
#: inside the stock call.
_handed_over: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cmh_handed_over", default=False
)
_handing: dict[tuple[str, str, str], int] = {}


def _hand_key(a: dict[str, Any]) -> tuple[str, str, str]:
    return (str(cache_root(a.get("cache_dir"))), a.get("repo_type") or "model", str(a["repo_id"]))


@contextlib.contextmanager
def _handing_over(a: dict[str, Any]) -> Iterator[None]:
    """Mark a call handed to the stock function after the resolver failed, while it runs."""
    key = _hand_key(a)
    with _lock:
        _handing[key] = _handing.get(key, 0) + 1
    token = _handed_over.set(True)
    try:
        yield
    finally:
        _handed_over.reset(token)
        with _lock:
            _handing[key] -= 1
            if not _handing[key]:
                del _handing[key]


def _inside_a_hand_over(a: dict[str, Any]) -> bool:
    """True for a call made inside a stock call cmh handed over (same thread, or the same
    repo and cache while it runs): it goes straight to the stock function."""
    if _handed_over.get():
        return True
    with _lock:
        return _hand_key(a) in _handing


def _wrapper(
    original: Callable[..., Any],
    routed: Routed,
    handed: Callable[[dict[str, Any], Any, Any], None] | None = None,
) -> Callable[..., Any]:
    """``original`` with its calls bound and run by ``routed`` in the cache they name
    (calls it cannot bind, and those ``routed`` hands back, go to ``original`` as they are;
    ``handed`` sees what ``original`` returned to a handed-back call, and may refuse it).

    A call made inside a stock call that was handed over after the resolver failed goes
    straight to ``original`` (the resolver is not run again within it), and ``handed``
    sees its answer too."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        a = _bind(original, args, kwargs)
        if a is None:
            return original(*args, **kwargs)
        with _in_cache(a.get("cache_dir"), a.get("repo_type"), a.get("repo_id")):
            if handed is not None and _inside_a_hand_over(a):
                answer = original(*args, **kwargs)
                handed(a, answer, None)
                return answer
            answer = routed(a, args, kwargs)
            if answer is not _STOCK and answer is not _HANDED:
                return answer
            before = _blob_names(a) if handed is not None else None
            if answer is _HANDED:
                with _handing_over(a):
                    answer = original(*args, **kwargs)
            else:
                answer = original(*args, **kwargs)
            if handed is not None:
                handed(a, answer, before)
            return answer

    wrapper.__cmh_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _wrap_hf_hub_download(original: Callable[..., Any]) -> Callable[..., Any]:
    def routed(a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _stock_only(a) or _without_symlinks(a):
            return _STOCK
        repo_type = a.get("repo_type") or "model"
        names = repo_filename(a["filename"], a.get("subfolder"))
        if names is None:
            return _STOCK
        filename, relative = names
        absent: Exception | None = None  # stock's error, raised outside the except below
        try:
            # A name, not a pattern: "a[1].txt" is itself. The listing is cmh's own:
            # stock writes trees/{commit}.json from snapshot_download only.
            with one_file_listing():
                res = _route(a, [glob.escape(filename)])
        except NotFoundError as exc:
            if exc.kind != "entry" or exc.commit is None:
                return _STOCK
            repo = RepoLayout(cache_root(a.get("cache_dir")), a["repo_id"], repo_type)
            if _offline(a):
                absent = _local_entry_not_found(bool(a.get("local_files_only")))
            elif hub_said_absent(repo, exc.commit, filename):
                url = _stock_url(a, filename, repo_type)
                absent = _entry_not_found(repo, exc.commit, url, a.get("token"))
                if absent is None:
                    return _STOCK  # no answer of the Hub kept: it is asked, as by stock
            else:
                # Only the Hub says a file is absent, as for the stock client: it is asked
                # (one HEAD, which the client hook sends on): its 404, its .no_exist marker,
                # or stock's LocalEntryNotFoundError when it cannot be reached.
                return _STOCK
        except IntegrityError as exc:
            if _offline(a):
                raise _refused_offline(exc) from exc
            raise
        except RAISED:
            raise
        except (ResolveError, OSError) as exc:
            _fall_back(f"{a['repo_id']}/{filename}", exc, _offline(a))
            return _HANDED
        if absent is not None:  # its cause as stock gives it (offline mode), nothing of cmh
            raise absent from absent.__cause__
        target = os.path.join(str(res.path), relative)
        if not os.path.isfile(target):
            return _STOCK
        if _served_as_found(res):  # no listing: its blobs were not checked, this one is
            _refuse_a_corrupt_blob(a, target)
        return target

    def handed(a: dict[str, Any], found: Any, before: frozenset[str] | None) -> None:
        # Whatever stock returned, read offline from a cache the resolver could not vouch
        # for or fetched online, a file whose blob fails its check is never returned.
        if isinstance(found, str):
            _refuse_a_corrupt_blob(a, found)

    return _wrapper(original, routed, handed)


def _wrap_snapshot(original: Callable[..., Any]) -> Callable[..., Any]:
    def routed(a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _stock_only(a) or a.get("ignore_patterns") or _without_symlinks(a):
            return _STOCK
        patterns = a.get("allow_patterns")
        try:
            res = _route(a, list(patterns) if isinstance(patterns, (list, tuple)) else patterns)
        except IntegrityError as exc:
            if _offline(a):
                raise _refused_offline(exc) from exc
            raise
        except RAISED:
            raise
        except (ResolveError, OSError) as exc:
            _fall_back(str(a["repo_id"]), exc, _offline(a))
            return _HANDED
        if not _offline(a) and res.state is not State.STALE_OFFLINE:
            # Stock's online snapshot_download writes the commit's listing where
            # get_cached_repo_tree reads it, also for a snapshot it had complete already.
            root = cache_root(a.get("cache_dir"))
            publish_tree(RepoLayout(root, a["repo_id"], a.get("repo_type") or "model"), res.commit)
        return str(res.path)

    def handed(a: dict[str, Any], found: Any, before: frozenset[str] | None) -> None:
        # What stock fetched into the snapshot it returns is checked as a routed file is.
        if isinstance(found, str):
            _refuse_corrupt_snapshot_blobs(a, found, before)

    return _wrapper(original, routed, handed)


def _wrap_try_to_load(original: Callable[..., Any]) -> Callable[..., Any]:
    def routed(a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        found = original(*args, **kwargs)
        if isinstance(found, str) and _blob_refused(a, found):
            return None  # not cached: the caller downloads it (wrapped: fetched again)
        return found

    return _wrapper(original, routed)


def _served_as_found(res: Any) -> bool:
    """True when the resolver served a snapshot without a listing as found (it checked no
    blob of it); every other snapshot it serves has every selected blob checked."""
    from ._negotiate import COMPLETENESS_UNKNOWN

    return any(COMPLETENESS_UNKNOWN in w for w in res.warnings)


def _refuse_a_corrupt_blob(
    a: dict[str, Any], found: str, name: str | None = None, *, only_sha256: bool = False
) -> None:
    """Raise when the cached file ``found`` is a blob that fails its check: offline the stock
    error of a cache that cannot serve the call, else the resolver's ``IntegrityError``.

    Online the stock client has just fetched it (a call handed over): the blob and the
    link ``found`` are deleted, as the resolver never keeps bytes that failed their check,
    and only a blob named by a SHA-256 (an LFS file's ETag) is checked: a small file's ETag
    is the git blob id on the Hub, but not necessarily on every server stock may talk to.
    """
    offline = _offline(a)
    if _blob_refused(a, found, only_sha256=only_sha256 or not offline, discard=not offline):
        what = name if name is not None else a["filename"]
        error = IntegrityError(f"{a['repo_id']}: cached {what} failed its check")
        if offline:
            raise _refused_offline(error) from error
        raise error


def _refuse_corrupt_snapshot_blobs(a: dict[str, Any], folder: str, before: Any) -> None:
    """Check the blobs the stock ``snapshot_download`` fetched into the snapshot ``folder``:
    every SHA-256 blob it links that was not in the cache before the call (``before``; all,
    when unknown), through :func:`_refuse_a_corrupt_blob` (a blob already verified is not
    read again). Online only: offline stock fetched nothing."""
    if _offline(a) or not os.path.isdir(folder):
        return
    for top, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(top, name)
            etag = os.path.basename(os.path.realpath(path))
            if before is not None and etag in before:
                continue
            _refuse_a_corrupt_blob(
                a, path, os.path.relpath(path, folder).replace(os.sep, "/"), only_sha256=True
            )


def _blob_names(a: dict[str, Any]) -> frozenset[str] | None:
    """The blobs of the call's repo in its cache now (``None``: unreadable)."""
    try:
        repo = RepoLayout(
            cache_root(a.get("cache_dir")), a["repo_id"], a.get("repo_type") or "model"
        )
        return frozenset(os.listdir(repo.path / "blobs"))
    except FileNotFoundError:
        return frozenset()
    except (OSError, LayoutError, KeyError, TypeError, ValueError):
        return None


def _blob_refused(
    a: dict[str, Any], found: str, *, only_sha256: bool = False, discard: bool = False
) -> bool:
    """True when the cached file ``found`` is a link to its repo's blob and that blob
    fails its check (hashed once per blob version; a verified marker spares the read).
    ``only_sha256``: a blob not named by a SHA-256 is not checked; ``discard``: a blob
    that fails is deleted, with the link ``found``."""
    try:
        repo = RepoLayout(
            cache_root(a.get("cache_dir")), a["repo_id"], a.get("repo_type") or "model"
        )
        blob = os.path.realpath(found)
        etag = os.path.basename(blob)
        if not os.path.islink(found) or blob != os.path.realpath(repo.blob_path(etag)):
            return False  # not a blob of this cache's repo: read as stock reads it
        if only_sha256 and not SHA256_RE.match(etag):
            return False
        state = blob_state(repo, etag, os.stat(blob).st_size)
        if state == "corrupt" and discard:
            with blob_lock(repo, etag):
                if blob_state(repo, etag, os.stat(blob).st_size) == "corrupt":
                    discard_blob(repo, etag)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(found)
    except (OSError, LayoutError, KeyError, TypeError, ValueError):
        return False
    if state != "corrupt":
        return False
    _warn_once(
        ("corrupt", blob), "%s: cached %s failed its check: not used (fetched again online)",
        a["repo_id"], a.get("filename"),
    )  # fmt: skip
    return True


def _offline(a: dict[str, Any]) -> bool:
    """The call may not use the network (``local_files_only`` or the offline policy)."""
    return _policy_for(bool(a.get("local_files_only"))).offline


def _stock_only(a: dict[str, Any]) -> bool:
    """Arguments the resolver does not take over: the call goes to the stock function."""
    return bool(
        a.get("local_dir") is not None
        or a.get("force_download")
        or a.get("dry_run")
        or a.get("headers")
        or a.get("token") == ""  # stock sends "Bearer " (h11 refuses it): stock's outcome
        or (a.get("repo_type") or "model") not in ("model", "dataset", "space")
    )


#: Cache folders (resolved) where a symlink could not be made, probed once per process.
_no_symlinks: dict[str, bool] = {}


def _without_symlinks(a: dict[str, Any]) -> bool:
    """True when the stock client would not use symlinks for the call's snapshot: the call
    goes to the stock function, which fills (or reads) the cache as it does without
    ``install()`` (plain files in ``snapshots/``, no ``blobs/``).

    That is ``HF_HUB_DISABLE_SYMLINKS``, a cache folder where no symlink can be made
    (huggingface_hub's own ``are_symlinks_supported``, probed as stock probes it; a folder
    not made yet is probed in its nearest existing parent, so nothing is left behind), or
    a snapshot of the revision that holds a plain file (filled by stock that way earlier:
    stock keeps such files where they are, cmh would link them)."""
    from huggingface_hub import constants

    if constants.HF_HUB_DISABLE_SYMLINKS:
        return True
    try:
        root = cache_root(a.get("cache_dir"))
        if not _symlinks_supported(root):
            return True
        return _snapshot_has_plain_files(
            RepoLayout(root, a["repo_id"], a.get("repo_type") or "model"),
            _revision(a.get("revision")) or "main",
        )
    except (OSError, LayoutError, KeyError, TypeError, ValueError):
        return False


def _symlinks_supported(root: Any) -> bool:
    key = str(root)
    with _lock:
        known = _no_symlinks.get(key)
    if known is not None:
        return not known
    if os.path.isdir(root):
        from huggingface_hub.file_download import are_symlinks_supported

        supported = bool(are_symlinks_supported(root))
    else:
        import tempfile

        parent = os.path.dirname(str(root))
        while parent and not os.path.isdir(parent) and parent != os.path.dirname(parent):
            parent = os.path.dirname(parent)
        with tempfile.TemporaryDirectory(dir=parent) as probe:
            try:
                os.symlink("source", os.path.join(probe, "link"))
                supported = True
            except OSError:
                supported = False
        return supported  # not remembered: the folder stock makes is probed itself later
    with _lock:
        _no_symlinks[key] = not supported
    return supported


def _snapshot_has_plain_files(repo: RepoLayout, revision: str) -> bool:
    """True when the snapshot ``revision`` names holds a regular file (not a link)."""
    commit = revision if COMMIT_RE.match(revision) else repo.read_ref(revision)
    if commit is None:
        return False
    for _top, _dirs, files in os.walk(repo.path / "snapshots" / commit):
        for name in files:
            if not os.path.islink(os.path.join(_top, name)):
                return True
    return False


def _revision(value: Any) -> str | None:
    """A plain string revision (``ResolvedRevision`` carries the commit in ``.resolved``)."""
    if value is None:
        return None
    resolved = getattr(value, "resolved", None)
    return resolved if isinstance(resolved, str) else str(value)
