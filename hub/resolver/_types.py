"""The resolver's data model: remote files, states, policy, per-file actions, errors.

Pure data, no I/O: imported by ``cmh.hub`` without pulling in the HTTP stack.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cmh.hub.cache import DiskFullError, IntegrityError, InvalidRemoteFileError, ResolveError

if TYPE_CHECKING:
    from cmh.hub.cache import Clock


def _process_clock() -> Clock:
    from cmh.hub.cache import process_clock  # cmh.hub.cache imports this module's errors

    return process_clock()


class State(str, enum.Enum):
    """How the local snapshot compared with the Hub (spec/resolver.md, "States")."""

    MISSING = "missing"
    LOCAL_ONLY = "local_only"
    FRESH = "fresh"
    ETAG_MISMATCH = "etag_mismatch"
    STALE_OFFLINE = "stale_offline"
    CORRUPT = "corrupt"


class Action(str, enum.Enum):
    """What happened to one file of the snapshot."""

    KEPT = "kept"  # already linked in the snapshot, blob checked
    LINKED = "linked"  # blob already in the cache (another commit), linked
    DOWNLOADED = "downloaded"  # fetched whole
    RESUMED = "resumed"  # fetched whole, continuing an earlier partial download
    PATCHED = "patched"  # assembled from local tensors + fetched byte ranges
    REFETCHED = "refetched"  # the local blob failed its check and was fetched again


@dataclass(frozen=True)
class Policy:
    """How fresh a snapshot must be and what to do when the Hub cannot be asked.

    ``default_lifetime``: seconds an unstamped snapshot stays fresh after a
    revalidation (0 = revalidate on every call). ``offline``: never touch the
    network. ``stale_if_error``: serve an expired snapshot, with a warning,
    when the Hub is unreachable. ``strict``: refuse expired or unverified
    content. ``revalidate``: ask the Hub even when the snapshot is fresh.
    ``connections``: parallel range connections for one large file (default
    ``CMH_DOWNLOAD_CONNECTIONS``, else 8; 1 = one connection per file).
    ``chunk_bytes``: the largest range one such request asks for (16 MiB).
    ``clock``: the clock of every freshness, window and wait of the calls made with this
    policy (:class:`~cmh.hub.cache.Clock`; this process's by default, a test passes one
    it moves). ``started``: the ``clock.monotonic()`` time the process started (``cmh
    pull``): a Hub that has not answered by then plus ``HF_HUB_ETAG_TIMEOUT`` is given
    up (None: that budget runs from each request).
    """

    default_lifetime: float = 0.0
    offline: bool = False
    stale_if_error: bool = True
    strict: bool = False
    revalidate: bool = False
    max_workers: int = 4
    connections: int = field(default_factory=lambda: default_connections())
    chunk_bytes: int = 16 << 20
    clock: Clock = field(default_factory=_process_clock, repr=False, compare=False)
    started: float | None = field(default=None, repr=False, compare=False)
    #: The ``clock.monotonic()`` time past which no request or transfer try of the call
    #: starts, and by which every API request is done (a pull-through fill's time for
    #: tries; a transfer under way ends by its own limits); ``None``: no such time.
    done_by: float | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.connections < 1 or self.chunk_bytes < 1 or self.max_workers < 1:
            raise ValueError("connections, chunk_bytes and max_workers must be at least 1")

    @classmethod
    def from_env(cls, **overrides: Any) -> Policy:
        """The default policy; offline when ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` is set."""
        offline = env_true("HF_HUB_OFFLINE") or env_true("TRANSFORMERS_OFFLINE")
        values: dict[str, Any] = {"offline": offline}
        values.update(overrides)
        return cls(**values)


def default_connections() -> int:
    """``CMH_DOWNLOAD_CONNECTIONS`` (1 to 64), else 8."""
    value = os.environ.get("CMH_DOWNLOAD_CONNECTIONS", "").strip()
    if not value:
        return 8
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 64:
        raise ValueError(f"CMH_DOWNLOAD_CONNECTIONS={value!r}: a whole number from 1 to 64")
    return int(value)


def env_true(name: str) -> bool:
    """The stock client's reading of a boolean environment variable."""
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class RemoteFile:
    """One file of a commit as the Hub lists it; ``etag`` names its blob."""

    path: str
    size: int
    etag: str
    lfs: bool
    blob_id: str

    def tree_entry(self) -> dict[str, Any]:
        """The stock ``trees/{commit}.json`` entry for this file."""
        entry: dict[str, Any] = {"size": self.size, "blob_id": self.blob_id}
        if self.lfs:
            entry["lfs_sha256"] = self.etag
            entry["lfs_size"] = self.size
        return entry


@dataclass(frozen=True)
class RemoteRevision:
    """A revision resolved to a commit; ``files`` when the answer listed blobs."""

    commit: str
    files: dict[str, RemoteFile] | None
    #: What the answer says of access: ``private``, and ``gated`` (any value but false).
    private: bool = False
    gated: bool = False
    #: The repo id the answer names (its ``id``), ``None`` when it names none: the Hub
    #: answers every spelling of a repo id (another case, a renamed repo's old name) with
    #: the repo's own one.
    repo_id: str | None = None


@dataclass(frozen=True)
class FileResult:
    """One file of the resolved snapshot and what it cost."""

    path: str
    action: Action
    etag: str
    size: int
    bytes_transferred: int = 0
    bytes_reused: int = 0


class SnapshotPath(str):
    """A snapshot folder: a ``str`` for every loader, with the :class:`~pathlib.Path` API besides.

    Loaders differ in what they accept (sentence-transformers tests ``"/" in
    name``, which a :class:`~pathlib.Path` refuses), so the folder is a string;
    ``path / "config.json"`` gives a :class:`~pathlib.Path`, and ``Path``
    attributes a ``str`` lacks (``exists()``, ``name``, ``iterdir()``, ...)
    are those of ``Path(path)``.
    """

    __slots__ = ()

    def __truediv__(self, other: str | os.PathLike[str]) -> Path:
        return Path(self) / other

    def __fspath__(self) -> str:
        return str.__str__(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(Path(self), name)


@dataclass
class Resolution:
    """The outcome of :func:`cmh.hub.resolve`.

    ``path`` is the snapshot directory (``from_pretrained(resolution.path)``), a
    :class:`SnapshotPath`: a ``str`` that also offers the ``Path`` API.
    ``requests`` and ``bytes_transferred`` count what this call asked of the
    Hub; ``bytes_reused`` counts file bytes taken from the local cache.
    """

    repo_id: str
    repo_type: str
    revision: str
    commit: str
    path: SnapshotPath
    state: State
    files: tuple[FileResult, ...]
    requests: int = 0
    bytes_transferred: int = 0
    bytes_reused: int = 0
    expires_at: float | None = None
    previous_commit: str | None = None
    warnings: tuple[str, ...] = ()
    _fingerprint: Any = field(default=None, repr=False, compare=False)
    _fingerprinted: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.path, SnapshotPath):
            self.path = SnapshotPath(self.path)

    @property
    def fingerprint(self) -> Any:
        """The semantic fingerprint of the snapshot, computed on first access.

        ``None`` when the snapshot holds no model or adapter this can read (a
        dataset, a space, a selection without weights).
        """
        if not self._fingerprinted:
            from cmh import semantic  # type: ignore[attr-defined,unused-ignore]

            try:
                self._fingerprint = semantic.fingerprint(self.path)
            except semantic.NotAModelError:
                self._fingerprint = None
            self._fingerprinted = True
        return self._fingerprint

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (used by ``cmh pull --json``)."""
        return {
            "repo_id": self.repo_id,
            "repo_type": self.repo_type,
            "revision": self.revision,
            "commit": self.commit,
            "previous_commit": self.previous_commit,
            "path": str(self.path),
            "state": self.state.value,
            "requests": self.requests,
            "bytes_transferred": self.bytes_transferred,
            "bytes_reused": self.bytes_reused,
            "expires_at": self.expires_at,
            "warnings": list(self.warnings),
            "fingerprint": None if self.fingerprint is None else self.fingerprint.to_dict(),
            "files": [
                {
                    "path": f.path,
                    "action": f.action.value,
                    "etag": f.etag,
                    "size": f.size,
                    "bytes_transferred": f.bytes_transferred,
                    "bytes_reused": f.bytes_reused,
                }
                for f in self.files
            ],
        }


class HubUnreachableError(ResolveError):
    """The Hub could not be reached (connection, timeout, 429, 5xx).

    ``retry_after``: the seconds the server asked to wait (``Retry-After``), if it said.
    ``transient``: whether trying again soon may help (``False``: no connection
    could be made for a metadata request, as when offline; not retried).
    """

    def __init__(
        self, message: str, retry_after: float | None = None, *, transient: bool = True
    ) -> None:
        self.retry_after = retry_after
        self.transient = transient
        super().__init__(message)


class NotFoundError(ResolveError):
    """The Hub says the repo, revision or file does not exist (``kind`` says which).

    ``status``: the Hub's status (huggingface.co answers 401 for a repo it does not show
    an anonymous client); ``said``: its ``X-Error-Message``, if any.
    """

    def __init__(
        self, message: str, kind: str, commit: str | None = None, *, status: int = 404,
        said: str = "",
    ) -> None:  # fmt: skip
        self.kind = kind
        self.commit = commit
        self.status = status
        self.said = said
        super().__init__(message)


class AccessError(ResolveError):
    """The Hub refused access (401/403, gated repo): its status, ``X-Error-Code`` and message."""

    def __init__(
        self, message: str, status: int = 403, code: str | None = "GatedRepo", said: str = ""
    ) -> None:
        self.status = status
        self.code = code
        self.said = said
        super().__init__(message)


class HubProtocolError(ResolveError):
    """The Hub answered something the protocol does not allow."""


class NoSuchEndpoint(HubProtocolError):
    """The server has no such API endpoint (404 without a Hub ``X-Error-Code``, or 405):
    another kind of server than the Hub, or an older one."""


class InvalidListing(HubProtocolError):
    """The Hub listed a file name no cache can hold (absolute, ``..``, NUL, too long, a
    file that is also a folder), or more files than the resolver accepts."""


class AnswerTooLarge(HubProtocolError):
    """A Hub answer past a limit: a body longer than the listed size, an API answer
    over :data:`~cmh.hub.resolver._http.MAX_API_BYTES` once decoded."""


class OfflineError(ResolveError):
    """Offline, and no usable local snapshot."""


class PolicyError(ResolveError):
    """The policy refuses what is available (expired or unverified under ``strict``)."""


__all__ = [
    "AccessError",
    "Action",
    "DiskFullError",
    "FileResult",
    "HubProtocolError",
    "HubUnreachableError",
    "IntegrityError",
    "InvalidRemoteFileError",
    "NoSuchEndpoint",
    "NotFoundError",
    "OfflineError",
    "Policy",
    "PolicyError",
    "RemoteFile",
    "Resolution",
    "ResolveError",
    "SnapshotPath",
    "State",
]
