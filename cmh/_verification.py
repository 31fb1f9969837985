"""Verification of stamped files (spec section "Verification outcomes")."""

from __future__ import annotations

import contextlib
import enum
import os
import time
from dataclasses import dataclass, field

from ._carrier import Carrier, read_carrier, user_metadata
from ._digests import DEFAULT_HASHING, Hashing, file_root, hash_tensors, root_entries
from ._errors import (
    CarrierError,
    CorruptRecordError,
    InvalidFileError,
    NotARecordError,
    UnsupportedVersionError,
)
from ._header import Header, read_header
from ._record import Record
from ._signing import TrustedKeys, signature_status


class Outcome(str, enum.Enum):
    """Stable names of verification outcomes, in the order they are judged."""

    OK = "ok"
    INVALID_FILE = "invalid_file"
    UNSTAMPED = "unstamped"
    CORRUPT_RECORD = "corrupt_record"
    UNSUPPORTED_VERSION = "unsupported_version"
    MANIFEST_INCONSISTENT = "manifest_inconsistent"
    ROOT_MISMATCH = "root_mismatch"
    TENSOR_MISMATCH = "tensor_mismatch"
    SIGNATURE_MISSING = "signature_missing"
    SIGNATURE_INVALID = "signature_invalid"
    SIGNATURE_UNTRUSTED = "signature_untrusted"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Problem:
    """One failed check, with its outcome name and a sentence for people."""

    outcome: Outcome
    message: str


@dataclass(frozen=True)
class VerifyResult:
    """The verdict on one file.

    ``outcome`` is the first problem's outcome, or ``OK``. ``mismatched`` names
    the tensors whose bytes do not match the manifest.
    """

    path: str
    outcome: Outcome
    problems: tuple[Problem, ...] = ()
    record: Record | None = None
    mismatched: tuple[str, ...] = ()
    signer_key_id: str | None = None
    signature_checked: bool = False
    expired: bool = False
    mode: str = "full"
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def message(self) -> str:
        return "; ".join(p.message for p in self.problems) if self.problems else "ok"


def verify(
    path: str | os.PathLike[str],
    *,
    at: float | None = None,
    fast: bool = False,
    trusted_keys: TrustedKeys | None = None,
    require_signature: bool | None = None,
    allow_expired: bool = False,
    hashing: Hashing = DEFAULT_HASHING,
) -> VerifyResult:
    """Verify the file at ``path``; never raises for a bad file, returns its outcome.

    ``fast`` checks tensor bytes against the XXH3 manifest (accidental
    corruption) instead of SHA-256; the root is still checked against the
    SHA-256 manifest. The XXH3 manifest is covered by neither the root nor the
    signature, so whenever a signature is checked or required the verification
    is full, whatever ``fast`` says. ``require_signature`` defaults to "when
    ``trusted_keys`` are given": pass ``False`` to accept unsigned files then.
    Expiry is judged at ``at`` (Unix seconds), else now. ``hashing`` sets the
    threads and a progress callback (:class:`cmh.Hashing`).
    """
    target = os.fspath(path)
    if require_signature is None:
        require_signature = bool(trusted_keys)
    mode = "fast" if fast else "full"
    try:
        header = read_header(target)
    except InvalidFileError as exc:
        return VerifyResult(target, Outcome.INVALID_FILE, (_p(Outcome.INVALID_FILE, exc.reason),))
    try:
        carrier = read_carrier(header.metadata, len(header.tensors))
    except NotARecordError as exc:
        return _fail(target, Outcome.CORRUPT_RECORD, str(exc), mode)
    except CorruptRecordError as exc:
        return _fail(target, Outcome.CORRUPT_RECORD, str(exc), mode)
    except UnsupportedVersionError as exc:
        return _fail(target, Outcome.UNSUPPORTED_VERSION, str(exc), mode)
    except CarrierError as exc:
        return _fail(target, Outcome.MANIFEST_INCONSISTENT, str(exc), mode)
    if carrier is None:
        return _fail(target, Outcome.UNSTAMPED, "file carries no CMH record", mode)
    when = time.time() if at is None else at
    policy = _Policy(when, fast, trusted_keys, require_signature, allow_expired)
    return _judge(target, header, carrier, policy, hashing)


def _p(outcome: Outcome, message: str) -> Problem:
    return Problem(outcome, message)


def _fail(path: str, outcome: Outcome, message: str, mode: str) -> VerifyResult:
    return VerifyResult(path, outcome, (_p(outcome, message),), mode=mode)


@dataclass(frozen=True)
class _Policy:
    """What :func:`verify` was asked to judge, and when."""

    at: float
    fast: bool
    trusted_keys: TrustedKeys | None
    require_signature: bool
    allow_expired: bool


def _judge(
    path: str, header: Header, carrier: Carrier, policy: _Policy, hashing: Hashing
) -> VerifyResult:
    at, fast, trusted_keys = policy.at, policy.fast, policy.trusted_keys
    require_signature, allow_expired = policy.require_signature, policy.allow_expired
    record = carrier.record
    problems: list[Problem] = []
    notes: list[str] = []
    mismatched: list[str] = []
    mode = "fast" if fast else "full"
    if fast:
        fallback = _full_instead_of_fast(carrier, bool(trusted_keys) or require_signature)
        if fallback is not None:
            notes.append(fallback)
            fast, mode = False, "full"
    before = os.stat(path)
    digests = hash_tensors(
        path, header, sha256=not fast, xxh3=fast, threads=hashing.threads, progress=hashing.progress
    )
    if carrier.sha256 is not None:
        claimed = carrier.sha256
        root = file_root(root_entries(header.tensors, claimed), user_metadata(header.metadata))
        if root != record.fingerprint:
            problems.append(
                _p(
                    Outcome.ROOT_MISMATCH,
                    "fingerprint root does not match the record: tensor names, dtypes, shapes "
                    "or metadata changed since stamping",
                )
            )
    expected = carrier.xxh3 if fast else carrier.sha256
    for t, d, want in zip(header.tensors, digests, expected or [None] * len(digests), strict=True):
        got = d.xxh3 if fast else d.sha256
        if want is not None and got != want:
            mismatched.append(t.name)
    if mismatched:
        shown = ", ".join(repr(n) for n in mismatched[:10])
        more = f" and {len(mismatched) - 10} more" if len(mismatched) > 10 else ""
        problems.append(
            _p(Outcome.TENSOR_MISMATCH, f"tensor bytes changed since stamping: {shown}{more}")
        )
    if carrier.sha256 is None and not fast:
        sha = [d.sha256 for d in digests if d.sha256 is not None]
        root = file_root(root_entries(header.tensors, sha), user_metadata(header.metadata))
        if root != record.fingerprint:
            problems.append(_p(Outcome.ROOT_MISMATCH, "fingerprint root does not match the record"))
    if not fast and carrier.sha256 is not None and not mismatched and not problems:
        _record_checked(path, before, record.fingerprint)
    signer, checked = _judge_signature(carrier, trusted_keys, require_signature, problems, notes)
    expired = record.is_expired(at)
    if expired:
        message = f"expired at {_iso(record.expires_at)}"
        if allow_expired:
            notes.append(message + " (allowed)")
        else:
            problems.append(_p(Outcome.EXPIRED, message))
    outcome = min((p.outcome for p in problems), key=_ORDER.index, default=Outcome.OK)
    problems.sort(key=lambda p: _ORDER.index(p.outcome))
    return VerifyResult(
        path,
        outcome,
        tuple(problems),
        record,
        tuple(mismatched),
        signer,
        checked,
        expired,
        mode,
        tuple(notes),
    )


_ORDER = list(Outcome)


def _record_checked(path: str, before: os.stat_result, fingerprint: bytes) -> None:
    """Every tensor hashed to its SHA-256 manifest entry and the root holds: write the
    check record (:mod:`cmh._checks`) unless the file changed while it was read."""
    from ._checks import FileVersion, record_check

    with contextlib.suppress(OSError), open(path, "rb") as f:
        if FileVersion.of(os.fstat(f.fileno())) == FileVersion.of(before):
            record_check(path, fingerprint, fd=f.fileno())


def _full_instead_of_fast(carrier: Carrier, checks_signature: bool) -> str | None:
    """Why a fast verification must hash with SHA-256 instead, or ``None``."""
    if checks_signature:
        return (
            "a signature is checked: fast mode fell back to SHA-256 (the XXH3 manifest is "
            "covered by neither the root nor the signature)"
        )
    if carrier.sha256 is None:
        return "no SHA-256 manifest to check the root against: fast mode fell back to SHA-256"
    if carrier.xxh3 is None:
        return "no XXH3 manifest: fast mode fell back to SHA-256"
    return None


def _judge_signature(
    carrier: Carrier,
    trusted_keys: TrustedKeys | None,
    require_signature: bool,
    problems: list[Problem],
    notes: list[str],
) -> tuple[str | None, bool]:
    record = carrier.record
    if not record.signed or carrier.signature is None:
        if require_signature:
            problems.append(_p(Outcome.SIGNATURE_MISSING, "file is not signed"))
        return None, False
    signer = carrier.key_id
    status = signature_status(record.to_bytes(), carrier.signature, signer or "", trusted_keys)
    if status == "unchecked":
        if require_signature:
            problems.append(
                _p(Outcome.SIGNATURE_UNTRUSTED, f"signed by key {signer}, but no trusted key given")
            )
        else:
            notes.append(f"signed by key {signer}; signature not checked (no trusted key given)")
        return signer, False
    if status == "untrusted":
        problems.append(
            _p(Outcome.SIGNATURE_UNTRUSTED, f"signed by key {signer}, which is not trusted")
        )
        return signer, False
    if status == "invalid":
        problems.append(
            _p(
                Outcome.SIGNATURE_INVALID,
                f"signature by key {signer} does not match the record "
                "(the record changed after signing)",
            )
        )
    return signer, True


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
