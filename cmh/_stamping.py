"""Writing CMH stamps (spec section "Write rules").

First stamp: a new file is written beside the original (new header, then the
byte buffer copied by the kernel), its tensors are hashed from the copy, the
final ``cmh*`` values are written at their fixed widths, the copy is synced
and renamed over the original. A later stamp overwrites only those fixed-width
values in place (no JSON structure and no tensor byte moves) when every value
it writes has a slot of its width, else it rewrites the file as a first stamp
does. A stamp without a key removes a previous signature: it would no longer
match the new record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ._atomic import atomic_file, temp_stem
from ._carrier import (
    KEY_KEY_ID,
    KEY_RECORD,
    KEY_SIGNATURE,
    Carrier,
    carrier_values,
    read_carrier,
    user_metadata,
)
from ._checks import checked_fingerprint, record_check
from ._digests import DEFAULT_HASHING, Hashing, TensorDigest, file_root, hash_tensors, root_entries
from ._duration import TTL, format_duration, ttl_seconds
from ._errors import CMHError, DurationError, StampError
from ._filecopy import BackgroundCopy
from ._header import METADATA_KEY, PREFIX_SIZE, Header, parse_header, read_header
from ._record import FLAG_SHA256, FLAG_SIGNED, FLAG_XXH3, LATEST_TIME, Record
from ._signing import key_id, sign_record

_TMP_PATTERN = re.compile(r"^\.(?P<name>.+)\.cmh-stamp\.(?P<pid>\d+)(?:\.\d+)?\.tmp\Z")


@dataclass(frozen=True)
class StampResult:
    """What a stamp wrote."""

    path: str
    record: Record
    digests: tuple[TensorDigest, ...]  # one per tensor (thousands): left out of repr()
    in_place: bool
    signer_key_id: str | None
    hash_seconds: float = 0.0
    write_seconds: float = 0.0
    #: Key id of the signature this stamp removed (a signed file restamped without a key).
    removed_signature_key_id: str | None = None

    def __repr__(self) -> str:
        return (
            f"StampResult(path={self.path!r}, root={self.record.fingerprint.hex()[:16]}..., "
            f"tensors={len(self.digests)}, in_place={self.in_place}, "
            f"signer_key_id={self.signer_key_id!r}, expires_at={self.record.expires_at})"
        )


def stamp(
    path: str | os.PathLike[str],
    ttl: TTL | None = None,
    *,
    sign_key: Ed25519PrivateKey | None = None,
    xxh3: bool = True,
    now: float | None = None,
    keep_ttl: bool = True,
    hashing: Hashing = DEFAULT_HASHING,
) -> StampResult:
    """Stamp the safetensors file at ``path``; return the record written.

    ``ttl`` is a duration (``"30d"``, seconds, ``timedelta``) or ``"never"``.
    When ``ttl`` is ``None`` and ``keep_ttl`` is true, a restamp keeps the
    file's previous lifetime (counted again from now): "never" when its
    ``expires_at`` is 0, and 0 (expired at once) when its ``expires_at`` is not
    after its ``stamped_at`` (spec 8.3); a first stamp never expires.
    ``sign_key`` adds an Ed25519 signature. Restamping a signed file without a
    key removes its signature (it would no longer match the new record);
    ``removed_signature_key_id`` then names the key that had signed.
    ``hashing`` sets the threads and a progress callback (:class:`cmh.Hashing`).
    A lifetime that ends after the last time a record holds (2106-02-07) raises
    :class:`DurationError`; nothing is written.
    """
    target = os.fspath(path)
    stamped_at = int(now if now is not None else time.time())
    header = read_header(target)
    carrier = _previous_carrier(header)
    previous = carrier.record if carrier else None
    lifetime = ttl_seconds(ttl) if ttl is not None else None
    if ttl is None and keep_ttl and previous is not None and previous.expires_at:
        lifetime = max(0, previous.expires_at - previous.stamped_at)
    expires_at = 0 if lifetime is None else stamped_at + lifetime
    if expires_at > LATEST_TIME:
        raise DurationError(
            f"a lifetime of {format_duration(lifetime or 0)} from now ends after 2106-02-07, "
            "the last time a record holds (an unsigned 32-bit Unix time): use a shorter TTL, "
            "or never"
        )
    job = _StampJob(target, header, expires_at, stamped_at, sign_key, xxh3, hashing)
    result = _stamp_in_place(job) if _fits_in_place(job) else _stamp_rewrite(job)
    removed = _removed_signer(carrier, sign_key)
    return dataclasses.replace(result, removed_signature_key_id=removed) if removed else result


def _removed_signer(previous: Carrier | None, sign_key: Ed25519PrivateKey | None) -> str | None:
    """Key id of the signature a stamp without a key drops."""
    if sign_key is not None or previous is None or not previous.record.signed:
        return None
    return previous.key_id


@dataclass(frozen=True)
class _StampJob:
    """What one stamp writes, decided before any byte is written."""

    target: str
    header: Header
    expires_at: int
    stamped_at: int
    sign_key: Ed25519PrivateKey | None
    xxh3: bool
    hashing: Hashing


def _previous_carrier(header: Header) -> Carrier | None:
    """The file's current ``cmh*`` values, or ``None`` when unstamped or unreadable."""
    try:
        return read_carrier(header.metadata, len(header.tensors))
    except CMHError:
        return None


def _placeholders(job: _StampJob) -> dict[str, str]:
    """``cmh*`` values of the final widths, all zero."""
    count = len(job.header.tensors)
    record = Record(expires_at=0, fingerprint=bytes(32), flags=0, stamped_at=0)
    return carrier_values(record, [bytes(32)] * count, [bytes(16)] * count if job.xxh3 else None)


def _fits_in_place(job: _StampJob) -> bool:
    """True when every value this stamp writes has a slot of its width in the header."""
    metadata = job.header.metadata or {}
    return all(k in metadata and len(metadata[k]) == len(v) for k, v in _placeholders(job).items())


def _new_values(
    job: _StampJob, header: Header, digests: list[TensorDigest]
) -> tuple[dict[str, str], Record, str | None]:
    """The ``cmh*`` values for ``header`` (the file as written) and its digests.

    Signed only with the job's key: a previous signature is never carried over.
    """
    expires_at, stamped_at, sign_key, xxh3 = job.expires_at, job.stamped_at, job.sign_key, job.xxh3
    sha256 = [d.sha256 for d in digests if d.sha256 is not None]
    root = file_root(root_entries(header.tensors, sha256), user_metadata(header.metadata))
    flags = FLAG_SHA256 | (FLAG_XXH3 if xxh3 else 0)
    if sign_key is not None:
        flags |= FLAG_SIGNED
    record = Record(expires_at=expires_at, fingerprint=root, flags=flags, stamped_at=stamped_at)
    signature: bytes | None = None
    signer: str | None = None
    if sign_key is not None:
        signature = sign_record(record.to_bytes(), sign_key)
        signer = key_id(sign_key.public_key())
    xxh3_digests = [d.xxh3 for d in digests if d.xxh3 is not None] if xxh3 else None
    values = carrier_values(record, sha256, xxh3_digests, signature, signer)
    return values, record, signer


# -- first stamp: write beside, then replace --------------------------------------------


def _stamp_rewrite(job: _StampJob) -> StampResult:
    """First stamp (rule 1): the layout is fixed with placeholder values of the final
    widths, the tensors are hashed while the buffer is copied, and the values are then
    filled in."""
    started = time.perf_counter()
    hashed: list[StampResult] = []  # what values_for learnt while the buffer was copied

    def values_for(new_header: Header) -> dict[str, str]:
        hash_started = time.perf_counter()
        digests = hash_tensors(
            job.target,
            job.header,
            xxh3=job.xxh3,
            threads=job.hashing.threads,
            progress=job.hashing.progress,
        )
        values, record, signer = _new_values(job, new_header, digests)
        seconds = time.perf_counter() - hash_started
        hashed.append(StampResult(job.target, record, tuple(digests), False, signer, seconds))
        return values

    written = _rewrite(
        job.target, job.header, _placeholders(job), values_for, stamped_at=job.stamped_at
    )
    (result,) = hashed
    record_own_stamp(job.target, written, result.record.fingerprint)
    write_seconds = time.perf_counter() - started - result.hash_seconds
    return dataclasses.replace(result, write_seconds=write_seconds)


def _rewrite(
    target: str,
    header: Header,
    placeholders: dict[str, str],
    values_for: Callable[[Header], dict[str, str]],
    *,
    stamped_at: int | None,
    unchanged_since: os.stat_result | None = None,
) -> os.stat_result:
    """Write ``target`` anew beside it and rename it over (rule 1); return its stat after.

    The new header is ``header``'s tensors and metadata with the ``cmh*`` values
    ``placeholders`` (of their final widths); the byte buffer is copied unchanged by the
    kernel while ``values_for(new_header)`` runs (a stamp hashes the tensors there), and
    the values it returns are written over the placeholders before the file is synced
    and renamed. A source written since ``unchanged_since`` (else since it was opened)
    is refused and the original is left as it was. With ``stamped_at``, the new file's
    mtime is set to it.
    """
    directory = os.path.dirname(os.path.abspath(target))
    _remove_dead_temporaries(directory, os.path.basename(target))
    metadata = {k: v for k, v in (header.metadata or {}).items() if k not in placeholders}
    metadata.update(placeholders)
    raw = _encode_header(header, metadata)
    try:
        with open(target, "rb") as src, atomic_file(target, tag="stamp", suffix=".tmp") as dst:
            tmp = dst.name
            os.fchmod(dst.fileno(), os.stat(src.fileno()).st_mode & 0o7777)
            dst.write(len(raw).to_bytes(PREFIX_SIZE, "little") + raw)
            dst.flush()
            new_size = PREFIX_SIZE + len(raw) + header.data_size
            os.ftruncate(dst.fileno(), new_size)
            new_header = parse_header(raw, new_size, path=tmp)
            # One pass: the kernel copies the buffer (and writes it back) while the
            # source, whose pages are already cached, is hashed beside it.
            before = unchanged_since or os.fstat(src.fileno())
            copy = BackgroundCopy(
                src.fileno(),
                dst.fileno(),
                header.data_start,
                new_header.data_start,
                header.data_size,
            ).start()
            try:
                values = values_for(new_header)
            finally:
                copy.join()
            if _changed(before, os.fstat(src.fileno())):
                raise StampError(f"{target}: file changed while it was stamped; nothing written")
            if values != placeholders:
                os.pwrite(dst.fileno(), _substitute(new_header, values), PREFIX_SIZE)
            if stamped_at is not None:
                set_mtime_to_stamp(tmp, stamped_at)
            return os.fstat(dst.fileno())
    except OSError as exc:
        raise StampError(
            f"{target}: writing the new file failed, original unchanged: {exc}"
        ) from exc


def set_mtime_to_stamp(path: str, stamped_at: int) -> None:
    """Set a just-stamped file's mtime to ``stamped_at``: a later write is then visible
    as a later mtime (the stamp trust rule of spec/semantic.md 2.1)."""
    os.utime(path, ns=(time.time_ns(), stamped_at * 1_000_000_000))


def record_own_stamp(target: str, written: os.stat_result, fingerprint: bytes) -> None:
    """Write the check record (:mod:`cmh._checks`) of a file this process just stamped.

    ``written`` is the file as this process left it (after its mtime was set): a
    write since then (another inode, size or mtime) gets no record, and the file
    is hashed by readers until it is checked again.
    """
    try:
        now = os.stat(target)
    except OSError:
        return
    if (now.st_ino, now.st_dev, now.st_size, now.st_mtime_ns) == (
        written.st_ino,
        written.st_dev,
        written.st_size,
        written.st_mtime_ns,
    ):
        record_check(target, fingerprint)


def _changed(before: os.stat_result, after: os.stat_result) -> bool:
    return (before.st_size, before.st_mtime_ns, before.st_ctime_ns, before.st_ino) != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ctime_ns,
        after.st_ino,
    )


#: The buffer of a first-stamped file starts at the same offset modulo this block
#: size as in the original, so file systems with extent sharing (XFS, Btrfs) can
#: clone the buffer instead of copying it; elsewhere it costs a few spaces.
CLONE_BLOCK = 4096


def _encode_header(header: Header, metadata: dict[str, str]) -> bytes:
    obj: dict[str, object] = {METADATA_KEY: metadata}
    for t in header.tensors:
        obj[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.begin, t.end]}
    raw = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if header.data_start % 8 == 0:
        pad = (header.data_start - (PREFIX_SIZE + len(raw))) % CLONE_BLOCK
    else:
        pad = -(PREFIX_SIZE + len(raw)) % 8
    return raw + b" " * pad


def _remove_dead_temporaries(directory: str, name: str) -> None:
    """Remove temporaries of earlier stamps of ``name`` whose process is gone."""
    stem = temp_stem(name)
    for entry in Path(directory).glob(f".{stem}.cmh-stamp.*.tmp"):
        match = _TMP_PATTERN.match(entry.name)
        if not match or match.group("name") != stem:
            continue
        if not _process_alive(int(match.group("pid"))):
            with contextlib.suppress(OSError):
                entry.unlink()


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- later stamps: fixed-width values overwritten in place -----------------------------


def _stamp_in_place(job: _StampJob) -> StampResult:
    target, header, xxh3 = job.target, job.header, job.xxh3
    before = os.stat(target)  # the concurrent-write check of the first stamp, here too
    hash_started = time.perf_counter()
    digests = hash_tensors(
        target, header, xxh3=xxh3, threads=job.hashing.threads, progress=job.hashing.progress
    )
    hash_seconds = time.perf_counter() - hash_started
    values, record, signer = _new_values(job, header, digests)
    written, in_place = write_values(
        target, header, values, unchanged_since=before, stamped_at=job.stamped_at
    )
    record_own_stamp(target, written, record.fingerprint)
    write_seconds = time.perf_counter() - hash_started - hash_seconds
    return StampResult(
        target, record, tuple(digests), in_place, signer, hash_seconds, write_seconds
    )


def write_values(
    target: str,
    header: Header,
    values: dict[str, str],
    *,
    unchanged_since: os.stat_result,
    stamped_at: int | None = None,
) -> tuple[os.stat_result, bool]:
    """Write the final ``cmh*`` ``values`` of a stamped file by rule 2 or rule 1 (spec 8).

    In place (:func:`write_values_in_place`) when every value has a slot of its width
    that can be located unambiguously; otherwise (a key or a value written with JSON
    escapes, ``"cmh.s\\u0069g"``; a value also found elsewhere) the file is rewritten
    beside and renamed over, its buffer copied unchanged. Returns the file's stat after
    and whether it was written in place. Both stamp and sign write through here.
    """
    try:
        written = write_values_in_place(
            target, header, values, unchanged_since=unchanged_since, stamped_at=stamped_at
        )
    except _NotInPlace:
        placeholders = dict(values)
        return _rewrite(
            target,
            header,
            placeholders,
            lambda _new_header: values,
            stamped_at=stamped_at,
            unchanged_since=unchanged_since,
        ), False
    return written, True


class _NotInPlace(StampError):
    """The values cannot be overwritten in place (no slot of their width, ambiguous)."""


def write_values_in_place(
    target: str,
    header: Header,
    values: dict[str, str],
    *,
    unchanged_since: os.stat_result | None = None,
    stamped_at: int | None = None,
) -> os.stat_result:
    """Overwrite fixed-width ``cmh*`` values of ``target`` in place; return its stat after.

    Manifests are written and synced first, the record and signature last, so
    a torn write is caught by the record's check or by the root. With
    ``unchanged_since`` (the file's stat before its tensors were hashed), a file
    written since then is refused and nothing is written (a restamp would
    otherwise describe bytes it did not hash). With ``stamped_at``, the mtime is
    set to it through the open file once the values are written.
    """
    record_keys = {KEY_RECORD, KEY_SIGNATURE, KEY_KEY_ID}
    try:
        first = _substitute(header, {k: v for k, v in values.items() if k not in record_keys})
        final = _substitute(header, values)
    except StampError as exc:
        raise _NotInPlace(str(exc)) from exc
    with open(target, "r+b") as f:
        if unchanged_since is not None and _changed(unchanged_since, os.fstat(f.fileno())):
            raise StampError(f"{target}: file changed while it was stamped; nothing written")
        current = os.pread(f.fileno(), header.header_size, PREFIX_SIZE)
        if current != header.raw:
            raise StampError(f"{target}: header changed while it was stamped; nothing written")
        if first != header.raw:
            os.pwrite(f.fileno(), first, PREFIX_SIZE)
            os.fsync(f.fileno())
        os.pwrite(f.fileno(), final, PREFIX_SIZE)
        os.fsync(f.fileno())
        if stamped_at is not None:
            os.utime(f.fileno(), ns=(time.time_ns(), stamped_at * 1_000_000_000))
        return os.fstat(f.fileno())


def _substitute(header: Header, values: dict[str, str]) -> bytes:
    """The header bytes with each reserved value replaced by one of the same width."""
    raw = header.raw
    old = header.metadata or {}
    for key, value in values.items():
        previous = old.get(key)
        if previous is None or len(previous) != len(value):
            raise StampError(f"{key} has no slot of width {len(value)} to overwrite")
        pattern = re.compile(
            rb'"' + re.escape(key.encode()) + rb'"\s*:\s*"(' + re.escape(previous.encode()) + rb')"'
        )
        matches = list(pattern.finditer(raw))
        if len(matches) != 1:
            raise StampError(f"{key} cannot be located unambiguously in the header")
        start, end = matches[0].span(1)
        raw = raw[:start] + value.encode() + raw[end:]
        old = {**old, key: value}
    # Re-read what would be written: same tensors, same metadata but for the values.
    check = parse_header(raw, header.file_size)
    expected = {**(header.metadata or {}), **values}
    if check.tensors != header.tensors or check.metadata != expected:
        raise StampError("in-place substitution would change more than the reserved values")
    return raw


# -- signing an already stamped file ----------------------------------------------------


def sign(path: str | os.PathLike[str], sign_key: Ed25519PrivateKey) -> StampResult:
    """Sign the record of an already stamped file (no tensor byte is read).

    The values are overwritten in place; when they cannot be located unambiguously
    (written with JSON escapes, say), the file is rewritten beside and renamed over with
    its buffer copied unchanged (spec 8.2), as a restamp does.

    The record keeps its fingerprint, expiry and stamp time; only the signed
    flag, ``cmh.sig`` and ``cmh.key`` change. The manifest must agree with the
    record (run ``verify`` to check the bytes themselves).
    """
    from ._checkpoint import claimed_digests
    from ._errors import NotStampedError

    target = os.fspath(path)
    header = read_header(target)
    carrier = read_carrier(header.metadata, len(header.tensors))
    if carrier is None:
        raise NotStampedError(
            f"{target}: file is not stamped; stamp it first (cmh stamp --sign-key)"
        )
    if claimed_digests(header) is None:
        raise StampError(
            f"{target}: the manifest does not agree with the record; restamp before signing"
        )
    old = carrier.record
    record = Record(
        expires_at=old.expires_at,
        fingerprint=old.fingerprint,
        flags=old.flags | FLAG_SIGNED,
        stamped_at=old.stamped_at,
    )
    signature = sign_record(record.to_bytes(), sign_key)
    signer = key_id(sign_key.public_key())
    values = {
        KEY_RECORD: record.to_hex(),
        KEY_SIGNATURE: signature.hex(),
        KEY_KEY_ID: signer,
    }
    before = os.stat(target)
    was_checked = checked_fingerprint(target)[0] == old.fingerprint
    written, in_place = write_values(target, header, values, unchanged_since=before)
    if was_checked:  # only the signature changed: the bytes checked before still are
        record_own_stamp(target, written, record.fingerprint)
    return StampResult(target, record, (), in_place=in_place, signer_key_id=signer)
