"""The cache core: the stock cache/store layout, locks, usage records, blob checks.

Plain file work, no network: the resolver, the mirror and the pruner all build
on it, through the names below (the modules are private, ``_name.py``). Atomic
file operations come from :mod:`cmh` (``atomic_write``, ``atomic_symlink``).
"""

from __future__ import annotations

from ._blobs import (
    READ_CHUNK,
    THREADED_DIGEST_BYTES,
    UNREADABLE_HEADER,
    ContentCheck,
    Progress,
    blob_matches,
    blob_state,
    check_file,
    disk_full_error,
    feed_file,
    git_blob_hasher,
    hash_blob,
    install_blob,
    is_disk_full,
    new_digest,
    partial_path,
)
from ._clock import CLOCK_FILE_ENV, SYSTEM_CLOCK, Clock, process_clock
from ._errors import DiskFullError, IntegrityError, InvalidRemoteFileError, ResolveError
from ._housekeeping import CACHEDIR_TAG, adopt_orphans, clean_no_exist, tag_cache_dir
from ._layout import (
    CHECK_RECORDS,
    COMMIT_RE,
    CUT_MEMORY,
    CUT_RECORDS,
    ETAG_RE,
    FILL_LEASE_TTL,
    FILL_STATE,
    REPO_PART_RE,
    REPO_TYPE_PREFIX,
    VERIFIED_MARKERS,
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
from ._locks import LockBusy, blob_lock, flock, repo_lock, revision_lock, snapshot_in_use
from ._records import record_number
from ._usage import record_use, usage_path

__all__ = [
    "CACHEDIR_TAG",
    "CHECK_RECORDS",
    "CLOCK_FILE_ENV",
    "COMMIT_RE",
    "CUT_MEMORY",
    "CUT_RECORDS",
    "ETAG_RE",
    "FILL_LEASE_TTL",
    "FILL_STATE",
    "READ_CHUNK",
    "REPO_PART_RE",
    "REPO_TYPE_PREFIX",
    "SYSTEM_CLOCK",
    "THREADED_DIGEST_BYTES",
    "UNREADABLE_HEADER",
    "VERIFIED_MARKERS",
    "Clock",
    "ContentCheck",
    "DiskFullError",
    "IntegrityError",
    "InvalidRemoteFileError",
    "LayoutError",
    "LockBusy",
    "Progress",
    "RepoLayout",
    "ResolveError",
    "adopt_orphans",
    "blob_lock",
    "blob_matches",
    "blob_state",
    "check_file",
    "clean_no_exist",
    "default_cache_dir",
    "disk_full_error",
    "feed_file",
    "flock",
    "git_blob_hasher",
    "hash_blob",
    "install_blob",
    "is_disk_full",
    "iter_repos",
    "new_digest",
    "parse_repo_folder",
    "partial_path",
    "process_clock",
    "record_number",
    "record_use",
    "repo_folder_name",
    "repo_lock",
    "revision_lock",
    "snapshot_in_use",
    "tag_cache_dir",
    "usage_path",
    "validate_relpath",
    "validate_repo_id",
    "validate_revision",
]
