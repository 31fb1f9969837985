"""Check records: evidence that a file's bytes were checked against its CMH stamp.

Whoever hashes every tensor of a stamped file and finds the manifest true (``cmh
stamp``, which computed it; ``cmh verify``; the resolver's download check; ``cmh
mirror add``) writes a record naming the file *version* it checked: device, inode,
size, modification and change times (nanoseconds), with the record's fingerprint.
A reader (the semantic fingerprint) takes the stamp as the file's identity only
while the file is still that version. Any write changes the change time, which
``os.utime`` cannot set back, so an edit followed by restoring the mtime is caught;
a copy (``cp -p``) is another inode and is trusted once checked again.

Where records live (``spec/semantic.md`` 2.1): a file that is a blob of a Hub-cache
layout (``{repo}/blobs/{etag}``; a local Hugging Face cache, a mirror's store) has its
record in ``{repo}/.cmh/stamp-checks/{etag}.json``, so it travels with the cache;
any other file in ``$CMH_CHECKS_DIR``, else ``$XDG_CACHE_HOME/cmh/stamp-checks``,
else ``~/.cache/cmh/stamp-checks``, as ``{device}-{inode}.json``. Records are
written atomically and best effort: a read-only location just keeps none, and the
file is then hashed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ._atomic import atomic_write

SCHEMA = "cmh-stamp-check/1"
_ETAG = re.compile(r"^[0-9a-f]{40}\Z|^[0-9a-f]{64}\Z")


@dataclass(frozen=True)
class FileVersion:
    """What identifies one version of a file's bytes."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, source: os.stat_result | int) -> FileVersion:
        """The version a stat result describes, or the one an open file descriptor has now."""
        st = os.fstat(source) if isinstance(source, int) else source
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _default_dir() -> Path:
    configured = os.environ.get("CMH_CHECKS_DIR")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "cmh" / "stamp-checks"


def record_path(path: str | os.PathLike[str], version: FileVersion) -> Path:
    """Where the check record of ``path`` (symlinks resolved) at ``version`` is kept."""
    real = Path(os.path.realpath(path))
    if real.parent.name == "blobs" and _ETAG.match(real.name):
        return real.parent.parent / ".cmh" / "stamp-checks" / f"{real.name}.json"
    return _default_dir() / f"{version.device}-{version.inode}.json"


def record_check(path: str | os.PathLike[str], fingerprint: bytes, fd: int | None = None) -> bool:
    """Record that ``path`` as it is now (``fd``'s file when given) holds bytes whose
    stamp with record fingerprint ``fingerprint`` was checked. True when written."""
    st = os.fstat(fd) if fd is not None else os.stat(path)
    version = FileVersion.of(st)
    target = record_path(path, version)
    document = {"schema": SCHEMA, **asdict(version), "fingerprint": fingerprint.hex()}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, json.dumps(document).encode())
    except OSError:
        return False
    return True


def checked_fingerprint(path: str | os.PathLike[str]) -> tuple[bytes | None, str]:
    """The record fingerprint checked for ``path`` as it is now, else ``None`` and why."""
    try:
        version = FileVersion.of(os.stat(path))
    except OSError as exc:
        return None, f"cannot stat: {exc.strerror or exc}"
    location = record_path(path, version)
    try:
        data = json.loads(location.read_bytes())
    except FileNotFoundError:
        return None, "no check record (the bytes were not checked against the stamp here)"
    except (OSError, ValueError) as exc:
        return None, f"unreadable check record: {exc}"
    try:
        recorded = FileVersion(**{k: int(data[k]) for k in FileVersion.__dataclass_fields__})
        fingerprint = bytes.fromhex(str(data["fingerprint"]))
    except (TypeError, KeyError, ValueError):
        return None, "malformed check record"
    if data.get("schema") != SCHEMA:
        return None, "check record of another schema"
    if recorded != version:
        return None, "written since it was checked (file version differs from its check record)"
    return fingerprint, ""


def forget_check(path: str | os.PathLike[str]) -> None:
    """Remove the check record of ``path`` (best effort)."""
    with contextlib.suppress(OSError):
        record_path(path, FileVersion.of(os.stat(path))).unlink()
