"""The format commands: ``stamp``, ``verify``, ``inspect``, ``fingerprint``, ``keygen``, ``sign``.

Exit statuses (``cli/_common.py``): 0 every file ok, 1 a check failed, 2 a
usage error, 3 an input is not a readable safetensors file. When files of one
run fail in different ways, 3 wins over 1. Human output goes to stdout;
progress bars (terminal only) and warnings go to stderr. ``--json`` prints one
document, described in docs/cli.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from cmh import plural

from ._common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_UNREADABLE,
    TIME,
    TTL,
    describe_os_error,
    emit_json,
    envelope,
    exit_code_for,
    fail,
    handle_errors,
    human_bytes,
    iso_utc,
    json_option,
    print_error,
    progress_bar,
    status_word,
    usage_error,
    warn,
)
from ._documents import (
    checkpoint_document,
    inspection_document,
    path_hex,
    paths_hex,
    record_document,
    verify_document,
)
from ._interrupt import stop_on_interrupt
from ._options import count_option, flag_option
from ._targets import Target, data_size, expand

if TYPE_CHECKING:
    from cmh import Header, Record, VerifyResult

_PATHS = click.argument("paths", nargs=-1, required=True, metavar="PATH...")
_THREADS = count_option(
    "--threads", 1, 64, None, "Hashing threads (default: one per CPU it may use, at most 8)."
)


def _when(ts: int, now: float) -> str:
    from cmh import format_duration

    delta = ts - now
    relative = f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(delta)} ago"
    return f"{iso_utc(ts)} ({relative})"


def _expiry_words(record: Record, now: float) -> str:
    if record.expires_at == 0:
        return "never expires"
    word = "expired" if record.is_expired(now) else "expires"
    return f"{word} {_when(record.expires_at, now)}"


def _finish(as_json: bool, document: dict[str, Any], status: int) -> None:
    if as_json:
        emit_json({**document, "ok": status == EXIT_OK, "exit_status": status})
    if status != EXIT_OK:
        raise click.exceptions.Exit(status)


def _write_each(
    paths: tuple[str, ...],
    participle: str,
    write: Callable[[str], tuple[dict[str, Any], str]],
    as_json: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Run ``write`` on every file of ``paths``; return file and checkpoint documents, status.

    A directory whose index disagrees with its shards is refused whole. ``write``
    returns the document fields and the human line of a file it wrote, or raises.
    """
    from cmh import CMHError, InvalidFileError, NotStampedError

    files: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    status = EXIT_OK
    for target in expand(paths):
        checkpoint = target.argument if target.kind == "directory" else None
        if checkpoint is not None:
            checkpoints.append(checkpoint_document(target, target.consistent))
            if not target.consistent:
                code, why = _refuse_directory(target)
                status = max(status, code)
                if not as_json:
                    click.echo(
                        f"{status_word('FAILED')}   {target.argument}: not {participle}: {why}"
                    )
                continue
        for path in target.files:
            doc: dict[str, Any] = {
                "path": path,
                "path_hex": path_hex(path),
                "checkpoint": checkpoint,
            }
            try:
                fields, line = write(path)
            except InvalidFileError as exc:
                status = max(status, EXIT_UNREADABLE)
                doc.update(outcome="invalid_file", ok=False, error=_about(exc, path))
            except NotStampedError as exc:
                status = max(status, EXIT_CHECK_FAILED)
                doc.update(outcome="unstamped", ok=False, error=_about(exc, path))
            except (CMHError, OSError) as exc:
                status = max(status, EXIT_CHECK_FAILED)
                doc.update(outcome="failed", ok=False, error=_about(exc, path))
            else:
                doc.update(ok=True, error=None, **fields)
            files.append(doc)
            if not as_json:
                click.echo(
                    line if doc["ok"] else f"{status_word('FAILED')}   {path}: {doc['error']}"
                )
    return files, checkpoints, status


def _about(exc: BaseException, path: str) -> str:
    """What went wrong with the file ``path``, without ``path`` (the line and the JSON
    document name it once): a library error's message starts with the path it is about."""
    message = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
    return message.removeprefix(f"{path}: ")


def _refuse_directory(target: Target) -> tuple[int, str]:
    """Exit status and a sentence for a directory that must not be written."""
    if target.error is not None:
        return EXIT_UNREADABLE, target.error
    return EXIT_CHECK_FAILED, "index and shards disagree: " + "; ".join(target.problems)


# -- stamp -----------------------------------------------------------------------------


@click.command()
@_PATHS
@click.option(
    "--ttl",
    type=TTL,
    default=None,
    metavar="DURATION|never",
    help="Lifetime from now: 90s, 12h, 30d, 1d12h, or never. 0s expires the file at once "
    "(expires_at = now); never stores expires_at = 0, which means never expires. "
    "Default: a restamp keeps the previous lifetime; a first stamp never expires.",
)
@click.option(
    "--sign-key",
    metavar="FILE",
    help="Sign with this Ed25519 private key (PEM). An encrypted key takes its passphrase "
    "from $CMH_KEY_PASSPHRASE or a prompt.",
)
@_THREADS
@json_option
@handle_errors
def stamp(
    paths: tuple[str, ...],
    ttl: int | str | None,
    sign_key: str | None,
    threads: int | None,
    as_json: bool,
) -> None:
    """Stamp each PATH (a safetensors file, or a checkpoint directory: every shard).

    A directory whose index disagrees with its shards is not stamped (exit 1).
    """
    import cmh

    from ._keys import load_signing_key

    key = load_signing_key(sign_key) if sign_key else None
    in_progress = _StampInProgress()

    def write(path: str) -> tuple[dict[str, Any], str]:
        in_progress.begin(path)
        with progress_bar(data_size(path), f"stamp {os.path.basename(path)}") as advance:
            hashing = cmh.Hashing(threads, advance)
            result = cmh.stamp(path, ttl, sign_key=key, hashing=hashing)
        now = time.time()
        if result.removed_signature_key_id is not None:
            warn(
                f"{path}: restamped without --sign-key: the signature by key "
                f"{result.removed_signature_key_id} was removed (it would no longer match); "
                "sign it again (cmh sign)"
            )
        signer = f", signed by key {result.signer_key_id}" if key else ""
        line = (
            f"{status_word('stamped')}  {path}  root {result.record.fingerprint.hex()[:16]}…, "
            f"{_expiry_words(result.record, now)}{signer}"
        )
        fields = {
            "outcome": "stamped",
            "in_place": result.in_place,
            "signer_key_id": result.signer_key_id,
            "removed_signature_key_id": result.removed_signature_key_id,
            "record": record_document(result.record, now),
        }
        return fields, line

    with stop_on_interrupt(in_progress.kept):
        files, checkpoints, status = _write_each(paths, "stamped", write, as_json)
    _finish(as_json, envelope("stamp", files=files, checkpoints=checkpoints), status)


class _StampInProgress:
    """The file ``cmh stamp`` is writing and its header before: what Ctrl-C keeps of it.

    A stamp lands in one step (a rename, or the record written in place last), so the
    file is unchanged or stamped; only an in-place restamp stopped between its manifests
    and its record is neither.
    """

    def __init__(self) -> None:
        self.path: str | None = None
        self.before: Header | None = None

    def begin(self, path: str) -> None:
        """``path`` is about to be stamped."""
        self.path, self.before = path, _header_or_none(path)

    def kept(self) -> str:
        """What is kept, for the ``interrupted:`` line (asked when Ctrl-C comes)."""
        from cmh import KEY_RECORD

        done, again = "files reported stamped are complete", "run the same command again"
        rest = f"{again} to stamp the rest"
        if self.path is None or self.before is None:  # no file was being written
            return f"{done}; {rest}"
        now = _header_or_none(self.path)
        if now is None:
            return f"{done}; {self.path} (in progress) cannot be read now; {rest}"
        if now.raw == self.before.raw:
            return f"{done}, {self.path} (in progress) is unchanged; {rest}"
        if (now.metadata or {}).get(KEY_RECORD) != (self.before.metadata or {}).get(KEY_RECORD):
            return f"{done}, and so is {self.path}: it was stamped as Ctrl-C came; {rest}"
        return (
            f"{done}; {self.path} (in progress) has its new manifests but not yet its new "
            f"record, so it fails verification until the stamp is finished: {rest}"
        )


def _header_or_none(path: str) -> Header | None:
    """The header of ``path``, or ``None`` when it cannot be read."""
    from cmh import CMHError, read_header

    try:
        return read_header(path)
    except (CMHError, OSError):
        return None


# -- verify ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _VerifyOptions:
    """The options of ``cmh verify`` as click passes them."""

    keys: tuple[str, ...]
    require_signature: bool
    allow_unsigned: bool
    allow_expired: bool
    at: float | None
    fast: bool
    threads: int | None
    as_json: bool


@click.command()
@_PATHS
@click.option(
    "--key",
    "keys",
    multiple=True,
    metavar="FILE",
    help="A trusted public key (PEM), or a directory of *.pem/*.pub keys. Repeatable.",
)
@flag_option(
    "--require-signature",
    "Fail unless each file is signed by a trusted key (needs --key; the default with --key).",
)
@flag_option(
    "--allow-unsigned",
    "With --key: accept files that carry no signature (a signature present is still checked).",
)
@click.option("--allow-expired", is_flag=True, help="Report expiry as a note, not a failure.")
@click.option(
    "--at",
    type=TIME,
    default=None,
    metavar="TIME",
    help="Judge expiry at TIME (Unix seconds, ISO 8601, or +30d/-12h from now) instead of now.",
)
@flag_option(
    "--fast", "Check tensor bytes against the XXH3 manifest (accidental corruption, not tampering)."
)
@_THREADS
@json_option
@handle_errors
def verify(paths: tuple[str, ...], **options: Any) -> None:
    """Verify each PATH (a file, or a checkpoint directory: every shard and the index).

    With --key, every file must carry a signature by a trusted key, unless
    --allow-unsigned; a signature is then checked, so --fast hashes with
    SHA-256 anyway (the XXH3 manifest is not covered by the signature).
    """
    opt = _VerifyOptions(**options)
    import cmh
    from cmh import Outcome

    from ._keys import load_trusted_keys

    if opt.require_signature and not opt.keys:
        usage_error("--require-signature needs at least one --key to check signatures against")
    if opt.allow_unsigned and not opt.keys:
        usage_error("--allow-unsigned only applies with --key")
    if opt.allow_unsigned and opt.require_signature:
        usage_error("--allow-unsigned and --require-signature contradict each other")
    trusted = load_trusted_keys(opt.keys)
    required = bool(opt.keys) and not opt.allow_unsigned
    now = time.time() if opt.at is None else opt.at
    files: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    status = EXIT_OK
    counts = {"ok": 0, "failed": 0}
    outcomes: list[str] = []
    with stop_on_interrupt("nothing was changed; run the same command again"):
        for target in expand(paths):
            checkpoint = target.argument if target.kind == "directory" else None
            results: list[VerifyResult] = []
            for path in target.files:
                with progress_bar(data_size(path), f"verify {os.path.basename(path)}") as advance:
                    try:
                        result = cmh.verify(
                            path,
                            at=now,
                            fast=opt.fast,
                            trusted_keys=trusted,
                            require_signature=required,
                            allow_expired=opt.allow_expired,
                            hashing=cmh.Hashing(opt.threads, advance),
                        )
                    except OSError as exc:
                        from cmh import Problem

                        why = exc.strerror or str(exc)
                        result = cmh.VerifyResult(
                            path,
                            Outcome.INVALID_FILE,
                            (Problem(Outcome.INVALID_FILE, f"cannot read file: {why}"),),
                        )
                results.append(result)
                if checkpoint is None:
                    outcomes.append(result.outcome.value)
                files.append(verify_document(result, now, checkpoint))
                counts["ok" if result.ok else "failed"] += 1
                if result.outcome is Outcome.INVALID_FILE:
                    status = max(status, EXIT_UNREADABLE)
                elif not result.ok:
                    status = max(status, EXIT_CHECK_FAILED)
                if not opt.as_json:
                    _print_verdict(result, now)
            if checkpoint is not None:
                ok = target.consistent and all(r.ok for r in results)
                identity = _identity_from_manifests(target) if ok else None
                outcome = checkpoint_outcome(target, results)
                outcomes.append(outcome)
                checkpoints.append(
                    {**checkpoint_document(target, ok, identity), "outcome": outcome}
                )
                if target.error is not None:
                    status = max(status, EXIT_UNREADABLE)
                elif target.problems:
                    status = max(status, EXIT_CHECK_FAILED)
                if not opt.as_json:
                    _print_checkpoint(target, ok, identity)
    if not opt.as_json:
        total = counts["ok"] + counts["failed"]
        click.echo(f"{plural(total, 'file')}: {counts['ok']} ok, {counts['failed']} failed")
    overall = next((o for o in outcomes if o != Outcome.OK.value), Outcome.OK.value)
    document = envelope("verify", outcome=overall, files=files, checkpoints=checkpoints)
    _finish(opt.as_json, document, status)


#: The outcome of a checkpoint directory whose index and shards disagree (spec section 6).
INDEX_INCONSISTENT = "index_inconsistent"


def checkpoint_outcome(target: Target, results: list[VerifyResult]) -> str:
    """One outcome name for a checkpoint directory (spec section 6).

    ``invalid_file`` when the directory is not a usable checkpoint or a shard is
    not a valid file, ``index_inconsistent`` when the index and the shards
    disagree, else the first failing shard's outcome in section 9's order.
    """
    from cmh import Outcome

    if target.error is not None or any(r.outcome is Outcome.INVALID_FILE for r in results):
        return Outcome.INVALID_FILE.value
    if target.problems:
        return INDEX_INCONSISTENT
    order = list(Outcome)
    failed = sorted((r.outcome for r in results if not r.ok), key=order.index)
    return failed[0].value if failed else Outcome.OK.value


def _identity_from_manifests(target: Target) -> str | None:
    """The directory identity from the (just verified) manifests; no tensor is re-read."""
    from cmh import CMHError, directory_identity

    try:
        return directory_identity(target.argument, use_manifests=True).hex
    except (CMHError, OSError):
        return None


def _print_verdict(result: VerifyResult, now: float) -> None:
    record = result.record
    notes = list(result.notes)
    if result.ok and record is not None:
        details = [f"root {record.fingerprint.hex()[:16]}…", _expiry_words(record, now)]
        if result.signer_key_id and result.signature_checked:
            details.append(f"signed by trusted key {result.signer_key_id}")
        elif result.signer_key_id:
            details.append(f"signed by key {result.signer_key_id}, NOT checked (no --key)")
            # Said once, on the verdict's line: not again as a warning.
            notes = [n for n in notes if "signature not checked" not in n]
        mode = " (fast: XXH3)" if result.mode == "fast" else ""
        click.echo(f"{status_word('ok')}       {result.path}{mode}: {', '.join(details)}")
    else:
        click.echo(f"{status_word('FAILED')}   {result.path}: {result.outcome.value}")
        for problem in result.problems:
            click.echo(f"         - {problem.outcome.value}: {problem.message}")
            if problem.outcome.value == "expired":
                click.echo(
                    f"           (if its content is still right: restamp it, `cmh stamp "
                    f"{result.path} --ttl 30d`; or accept it once with --allow-expired)"
                )
    for note in notes:
        warn(f"{result.path}: {note}")


def _print_checkpoint(target: Target, ok: bool, identity: str | None) -> None:
    folder = target.argument.rstrip("/") + "/"  # model/ and model both print model/
    if target.error is not None:
        click.echo(f"{status_word('FAILED')}   {folder}: {target.error}")
        return
    index = os.path.basename(target.index) if target.index else "no index"
    files = plural(len(target.files), "file")
    if ok:
        click.echo(f"{status_word('ok')}       {folder} ({files}, {index}): identity {identity}")
        return
    click.echo(f"{status_word('FAILED')}   {folder} ({files}, {index})")
    for problem in target.problems:
        click.echo(f"         - {INDEX_INCONSISTENT}: {problem}")


# -- inspect ---------------------------------------------------------------------------


@click.command()
@click.argument("path", metavar="PATH")
@click.option(
    "--key",
    "keys",
    multiple=True,
    metavar="FILE",
    help="A trusted public key (PEM) or a directory of them: check a signature against "
    "its record (no tensor is read). Repeatable.",
)
@json_option
@handle_errors
def inspect(path: str, keys: tuple[str, ...], as_json: bool) -> None:
    """Show what PATH says about itself (no tensor is hashed); works on unstamped files.

    PATH may be a checkpoint directory: every shard is shown.
    """
    import cmh
    from cmh import InvalidFileError

    from ._keys import load_trusted_keys

    trusted = load_trusted_keys(keys)
    target = expand([path])[0]
    now = time.time()
    status = EXIT_OK
    files: list[dict[str, Any]] = []
    if target.error is not None:
        status = EXIT_UNREADABLE
    for file in target.files:
        try:
            insp = cmh.inspect(file, trusted)
        except InvalidFileError as exc:
            status = EXIT_UNREADABLE
            files.append({"path": file, "path_hex": path_hex(file), "error": str(exc)})
            if not as_json:
                print_error(f"{file}: not a readable safetensors file: {exc.reason}")
            continue
        doc = inspection_document(insp, now)
        files.append({**doc, "error": None})
        if not as_json:
            _print_inspection(doc, insp.dtypes, now)
    checkpoint = (
        checkpoint_document(target, target.consistent and status == EXIT_OK)
        if target.kind == "directory"
        else None
    )
    if not as_json and checkpoint is not None:
        if target.error is not None:
            print_error(target.error)  # it names the directory
        for problem in target.problems:
            warn(f"{path}: index_inconsistent: {problem}")
    _finish(
        as_json,
        envelope(
            "inspect",
            path=path,
            path_hex=path_hex(path),
            kind=target.kind,
            files=files,
            checkpoint=checkpoint,
        ),
        status,
    )


def _print_inspection(doc: dict[str, Any], dtypes: dict[str, int], now: float) -> None:
    lines = [f"{doc['path']}"]
    lines.append(
        f"  file:        {human_bytes(doc['file_size'])} ({doc['file_size']} bytes), "
        f"header {doc['header_size']} bytes"
    )
    kinds = ", ".join(f"{d} x{n}" for d, n in sorted(dtypes.items())) or "none"
    lines.append(
        f"  tensors:     {doc['tensor_count']} ({human_bytes(doc['tensor_bytes'])}); {kinds}"
    )
    metadata = doc["metadata"]
    shown = ", ".join(f"{k}={v}" for k, v in list(metadata.items())[:8])
    more = f" and {len(metadata) - 8} more" if len(metadata) > 8 else ""
    lines.append(f"  metadata:    {shown + more if metadata else 'none'}")
    record = doc["record"]
    if record is None:
        state = f"record unreadable: {doc['record_error']}" if doc["record_error"] else "no"
        lines.append(f"  stamped:     {state}")
    else:
        lines.append(f"  stamped:     yes, at {_when(record['stamped_at'], now)}")
        if record["expires_at"] is None:
            lines.append("  expires:     never")
        else:
            state = "EXPIRED " if record["expired"] else ""
            lines.append(f"  expires:     {state}{_when(record['expires_at'], now)}")
        lines.append(f"  fingerprint: {record['fingerprint']}")
        flags = [
            name
            for name, on in (
                ("SHA-256 manifest", record["sha256_manifest"]),
                ("XXH3 manifest", record["xxh3_manifest"]),
                ("signed", record["signed"]),
            )
            if on
        ]
        lines.append(f"  flags:       0x{record['flags']:02x} ({', '.join(flags) or 'none'})")
        lines.append(
            f"  manifests:   SHA-256 {'present' if doc['sha256_manifest'] else 'absent'}, "
            f"XXH3 {'present' if doc['xxh3_manifest'] else 'absent'}"
        )
        lines.append(f"  signature:   {_signature_words(doc)}")
    click.echo("\n".join(lines))


_SIGNATURE_WORDS = {
    "unchecked": "NOT checked (give --key to check it against the record)",
    "valid": "valid, matches the record",
    "invalid": "does NOT match the record (changed after signing)",
    "untrusted": "key not among the trusted keys given",
}


def _signature_words(doc: dict[str, Any]) -> str:
    if not doc["signed"]:
        return "none"
    return f"by key {doc['signer_key_id']}: {_SIGNATURE_WORDS[doc['signature']]}"


# -- fingerprint -----------------------------------------------------------------------


@click.command()
@click.argument("path", metavar="PATH")
@flag_option(
    "--semantic", "The semantic fingerprint (what the weights compute), from cmh.semantic."
)
@click.option(
    "--base",
    metavar="DIR",
    default=None,
    help="With --semantic and an adapter PATH: the base model it applies to (its keys need it).",
)
@_THREADS
@json_option
@handle_errors
def fingerprint(
    path: str, semantic: bool, base: str | None, threads: int | None, as_json: bool
) -> None:
    """Print the v1 root of a file, or the identity of a checkpoint directory."""
    from cmh import CMHError

    if base is not None and not semantic:
        usage_error("--base applies to --semantic only")
    kind = "semantic" if semantic else ("directory" if os.path.isdir(path) else "file")

    def document(code: int, outcome: str, error: str | None, **fields: Any) -> None:
        emit_json(
            envelope(
                "fingerprint", path=path, path_hex=path_hex(path), kind=kind, **fields,
                outcome=None if semantic else outcome, error=error, ok=code == EXIT_OK,
                exit_status=code,
            )
        )  # fmt: skip

    try:
        with stop_on_interrupt("nothing was changed; run the same command again"):
            fields = (
                _semantic_fields(path, base, threads)
                if semantic
                else _fingerprint_fields(path, threads)
            )
    except (CMHError, OSError) as exc:
        code = EXIT_UNREADABLE if semantic and _not_a_model(exc) else exit_code_for(exc)
        message = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
        if as_json:
            document(code, _fingerprint_outcome(exc), message)
        fail(message, code)
    if as_json:
        document(EXIT_OK, "ok", None, **fields)
    elif semantic:
        _print_semantic(path, fields["semantic"])
    else:
        click.echo(f"{fields['fingerprint']}  {path}")


def _fingerprint_outcome(exc: BaseException) -> str:
    """The outcome ``cmh verify`` names for the same input (spec section 6): no root without one."""
    from cmh import IndexInconsistentError

    return INDEX_INCONSISTENT if isinstance(exc, IndexInconsistentError) else "invalid_file"


def _not_a_model(exc: BaseException) -> bool:
    """The semantic reader's "not a model or adapter directory" (an unreadable input)."""
    from cmh.semantic import NotAModelError

    return isinstance(exc, NotAModelError)


def _fingerprint_fields(path: str, threads: int | None) -> dict[str, Any]:
    import cmh

    total = _bytes_under(path)
    with progress_bar(total, f"fingerprint {os.path.basename(path.rstrip('/'))}") as advance:
        fp = cmh.fingerprint(path, threads=threads, progress=advance)
    return {
        "fingerprint": fp.hex,
        "tensor_count": fp.tensor_count,
        "tensor_bytes": fp.tensor_bytes,
        "files": list(fp.files),
        "files_hex": paths_hex(fp.files),
    }


def _bytes_under(path: str) -> int:
    if not os.path.isdir(path):
        return data_size(path)
    target = expand([path])[0]
    return sum(data_size(f) for f in target.files)


def _semantic_fields(path: str, base: str | None, threads: int | None) -> dict[str, Any]:
    import importlib

    semantic = importlib.import_module("cmh.semantic")  # loaded only when asked for
    return {"semantic": dict(semantic.fingerprint(path, base=base, threads=threads).to_dict())}


def _print_semantic(path: str, fields: dict[str, Any]) -> None:
    click.echo(f"{path} (semantic fingerprint, {fields.get('format', 'unknown format')})")
    for name, value in fields.items():
        if value is None or name == "format":
            continue
        if isinstance(value, dict):
            click.echo(f"  {name}:")
            for sub, item in value.items():
                if isinstance(item, list):  # missing_code: reasons, when there are any
                    for reason in item:
                        click.echo(f"    {sub}: {reason}")
                elif item is not None:
                    click.echo(f"    {sub}: {item}")
        elif isinstance(value, list):
            click.echo(f"  {name}: {', '.join(str(v) for v in value) or '(none)'}")
        else:
            click.echo(f"  {name}: {value}")


# -- keys ------------------------------------------------------------------------------


@click.command()
@click.option(
    "--out",
    "prefix",
    required=True,
    metavar="PREFIX",
    help="Write PREFIX.key (private, mode 0600) and PREFIX.pub (public).",
)
@click.option("--force", is_flag=True, help="Overwrite existing key files.")
@flag_option(
    "--encrypt", "Protect the private key with a passphrase ($CMH_KEY_PASSPHRASE, else a prompt)."
)
@json_option
@handle_errors
def keygen(prefix: str, force: bool, encrypt: bool, as_json: bool) -> None:
    """Write a new Ed25519 key pair (PEM) for signing stamps."""
    from ._keys import write_keypair

    pair = write_keypair(prefix, force=force, encrypt=encrypt)
    if as_json:
        emit_json(
            envelope(
                "keygen",
                private_key=pair.private_path,
                public_key=pair.public_path,
                key_id=pair.key_id,
                encrypted=pair.encrypted,
                ok=True,
                exit_status=EXIT_OK,
            )
        )
        return
    click.echo(f"private key: {pair.private_path} (mode 0600; keep it secret)")
    click.echo(f"public key:  {pair.public_path} (give it to verifiers: cmh verify --key)")
    click.echo(f"key id:      {pair.key_id}")


@click.command()
@_PATHS
@click.option(
    "--key",
    "key_path",
    required=True,
    metavar="FILE",
    help="Ed25519 private key (PEM). An encrypted key takes its passphrase from "
    "$CMH_KEY_PASSPHRASE or a prompt.",
)
@json_option
@handle_errors
def sign(paths: tuple[str, ...], key_path: str, as_json: bool) -> None:
    """Sign the record of each already stamped PATH in place (no tensor is read).

    Signing does not check the tensor bytes: run cmh verify first when in doubt.
    """
    import cmh

    from ._keys import load_signing_key

    key = load_signing_key(key_path)

    def write(path: str) -> tuple[dict[str, Any], str]:
        result = cmh.sign(path, key)
        fields = {
            "outcome": "signed",
            "signer_key_id": result.signer_key_id,
            "in_place": result.in_place,
            "record": record_document(result.record, time.time()),
        }
        return fields, f"signed   {path}  by key {result.signer_key_id}"

    files, checkpoints, status = _write_each(paths, "signed", write, as_json)
    _finish(as_json, envelope("sign", files=files, checkpoints=checkpoints), status)
