"""The fingerprint endpoint's cache: one computation per commit, a bounded number kept.

Computing a semantic fingerprint reads every weight file of a snapshot; a
commit's fingerprint never changes, so the answer is kept, for the
:data:`MAX_ENTRIES` commits asked most recently (before, every commit ever
asked stayed in memory for the life of the worker).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import HubError
from ._memo import Memo

if TYPE_CHECKING:
    from pathlib import Path

    from ._index import CommitIndex
    from ._routes import Route
    from ._state import MirrorState

MAX_ENTRIES = 256
#: Where the check records of stamps are (``cmh`` reads them from the environment): the
#: server's values, as they are at each call, are a compute process's too (a stamp whose
#: check the server recorded is taken, not hashed).
CHECK_RECORDS_ENV = ("CMH_CHECKS_DIR", "XDG_CACHE_HOME", "HOME")

Key = tuple[str, str]  # ("{repo_type}:{repo_id}", commit)


class FingerprintCache:
    """Answers by commit, least recently used dropped first; computed once under a lock."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: Memo[Key, dict[str, Any]] = Memo(max_entries)

    def get(self, key: Key, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The cached answer for ``key``, else ``compute()`` (kept only if it returns)."""
        return self._entries.get_or_compute(key, compute, exclusive=True)

    def __len__(self) -> int:
        return len(self._entries)


def fingerprint_of(state: MirrorState, route: Route, index: CommitIndex) -> dict[str, Any]:
    """``cmh.semantic`` fingerprint of a commit, computed once per commit.

    It reads only the index's checked sources (blobs inside the store), through
    ``fingerprint_files``, so a hostile link in a snapshot is never followed. The
    store's files are got here (they stay while read); the reading and hashing runs in
    the compute pool's processes (:meth:`~._compute.ComputePool.in_process`).
    """
    from cmh import InvalidFileError
    from cmh.semantic import SemanticError

    def compute() -> dict[str, Any]:
        paths = sorted(index.files)  # fingerprint_files picks what it reads (spec/semantic.md)
        try:
            source = f"{route.repo_id}@{index.commit}"
            with state.backend.local_files(index, paths, stamped_headers=True) as files:
                result_doc = _in_process(state, files, source)
            if result_doc["hashed_files"]:  # a stamp not taken: its bytes are read whole
                with state.backend.local_files(index, paths) as files:
                    result_doc = _in_process(state, files, source)
        except InvalidFileError as exc:
            raise HubError(422, "InvalidFile", f"invalid safetensors file: {exc}") from None
        except SemanticError as exc:
            if isinstance(exc.__cause__, InvalidFileError):
                raise HubError(422, "InvalidFile", f"invalid safetensors file: {exc}") from None
            raise HubError(422, "NotAModel", f"cannot fingerprint this snapshot: {exc}") from None
        except (ValueError, OverflowError, struct.error) as exc:  # a header no layer typed
            raise HubError(422, "InvalidFile", f"invalid safetensors file: {exc}") from None
        except OSError as exc:
            raise HubError(503, "BlobUnavailable", f"blob unavailable: {exc.strerror}") from None
        return {"repo": route.repo_id, "commit": index.commit, "fingerprint": result_doc}

    return state.fingerprints.get((f"{route.repo_type}:{route.repo_id}", index.commit), compute)


class _Raised(Exception):
    """An error raised in a compute process with the cause the parent's handling reads
    (a pickled exception comes back without its ``__cause__``)."""

    def __init__(self, error: BaseException, cause: BaseException | None) -> None:
        super().__init__(error, cause)
        self.error, self.cause = error, cause


def _in_process(state: MirrorState, files: dict[str, Path], source: str) -> dict[str, Any]:
    """:func:`fingerprint_document` in a compute process; its errors raised as they were."""
    env = {name: os.environ.get(name) for name in CHECK_RECORDS_ENV}
    try:
        return state.compute.in_process(fingerprint_document, files, source, env)
    except _Raised as raised:
        raise raised.error from raised.cause


def fingerprint_document(
    files: dict[str, Path], source: str, env: dict[str, str | None]
) -> dict[str, Any]:
    """In a compute process: the fingerprint of ``files`` as a document (``to_dict``),
    with ``env`` (the server's :data:`CHECK_RECORDS_ENV`, None: unset) in its environment.

    A :class:`~cmh.semantic.SemanticError` caused by an :class:`~cmh.InvalidFileError`
    comes back with that cause, and as a type that pickles."""
    import pickle

    from cmh import InvalidFileError
    from cmh.semantic import SemanticError, fingerprint_files

    for name, value in env.items():  # one call at a time in a process
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        return fingerprint_files(files, source=source).to_dict()
    except SemanticError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, InvalidFileError) else None
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # a subclass whose arguments do not pickle: its base does
            exc = SemanticError(str(exc))
        raise _Raised(exc, cause) from None
