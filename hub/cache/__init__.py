"""The cache core: the stock cache/store layout, locks, usage records, blob checks.

Plain file work, no network: the resolver, the mirror and the pruner all build
on it. Atomic file operations come from :mod:`cmh._atomic`.
"""

from __future__ import annotations

from .blobs import blob_matches, blob_state, check_file, hash_blob
from .clock import SYSTEM_CLOCK, Clock, process_clock
from .layout import (
    COMMIT_RE,
    ETAG_RE,
    LayoutError,
    RepoLayout,
    default_cache_dir,
    iter_repos,
    parse_repo_folder,
    repo_folder_name,
    validate_relpath,
    validate_repo_id,
    validate_revision,
)
from .locks import LockBusy, blob_lock, repo_lock, revision_lock, snapshot_in_use
from .usage import record_use

__all__ = [
    "COMMIT_RE",
    "ETAG_RE",
    "SYSTEM_CLOCK",
    "Clock",
    "LayoutError",
    "LockBusy",
    "RepoLayout",
    "blob_lock",
    "blob_matches",
    "blob_state",
    "check_file",
    "default_cache_dir",
    "hash_blob",
    "iter_repos",
    "parse_repo_folder",
    "process_clock",
    "record_use",
    "repo_folder_name",
    "repo_lock",
    "revision_lock",
    "snapshot_in_use",
    "validate_relpath",
    "validate_repo_id",
    "validate_revision",
]
