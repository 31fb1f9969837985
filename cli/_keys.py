"""Keys for the command line: passphrases, signing keys, trusted keys, new key pairs.

A passphrase is never a command-line argument: it comes from the
``CMH_KEY_PASSPHRASE`` environment variable when set, else from a hidden
prompt when stdin is a terminal; otherwise the command stops with a usage
error that says how to give it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from cmh import temp_path, write_new

from ._common import usage_error

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from cmh import TrustedKeys

PASSPHRASE_ENV = "CMH_KEY_PASSPHRASE"


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _passphrase(prompt: str, confirm: bool) -> bytes:
    if PASSPHRASE_ENV in os.environ:
        return os.environ[PASSPHRASE_ENV].encode()
    if stdin_is_terminal():
        text: str = click.prompt(
            prompt, hide_input=True, confirmation_prompt=confirm, err=True, type=str
        )
        return text.encode()
    usage_error(f"a passphrase is needed: set ${PASSPHRASE_ENV} or run from a terminal")


def _warn_if_readable_by_others(path: str) -> None:
    """Warn (as ssh does) when a private key file is readable by its group or others."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # the load reports it
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        click.echo(
            f"warning: {path}: private key is readable by others (mode "
            f"{stat.S_IMODE(mode):04o}); run chmod 600 {path}",
            err=True,
        )


def load_signing_key(path: str) -> Ed25519PrivateKey:
    """Load an Ed25519 private key, asking for its passphrase when it is encrypted."""
    from cmh import load_private_key, private_key_is_encrypted

    if not private_key_is_encrypted(path):
        # What the file holds first (a public key is an error, with no word on its mode),
        # then how it is kept.
        key = load_private_key(path)
        _warn_if_readable_by_others(path)
        return key
    _warn_if_readable_by_others(path)  # an encrypted private key: before the prompt
    return load_private_key(path, _passphrase(f"Passphrase for {path}", confirm=False))


def load_trusted_keys(paths: Sequence[str]) -> TrustedKeys | None:
    """Trusted public keys from PEM files or directories of them; ``None`` when none given."""
    if not paths:
        return None
    from cmh import TrustedKeys

    return TrustedKeys.load(paths)


@dataclass(frozen=True)
class WrittenKeyPair:
    private_path: str
    public_path: str
    key_id: str
    encrypted: bool


def write_keypair(prefix: str, *, force: bool, encrypt: bool) -> WrittenKeyPair:
    """Write ``PREFIX.key`` (PEM, mode 0600) and ``PREFIX.pub`` (PEM, mode 0644).

    Existing files are never overwritten without ``force``; both files are
    written beside their final names first, so a failure leaves nothing behind.
    """
    from cmh import generate_keypair

    private_path, public_path = f"{prefix}.key", f"{prefix}.pub"
    if not force:
        existing = [p for p in (private_path, public_path) if os.path.lexists(p)]
        if existing:
            usage_error(f"{', '.join(existing)} already exist(s); pass --force to overwrite")
    passphrase = _passphrase("Passphrase for the new key", confirm=True) if encrypt else None
    if encrypt and not passphrase:
        usage_error("an empty passphrase cannot encrypt a key")
    private_pem, public_pem, kid = generate_keypair(passphrase)
    directory = os.path.dirname(os.path.abspath(private_path))
    os.makedirs(directory, exist_ok=True)
    tmp_private = _write_temporary(private_path, private_pem, 0o600)
    try:
        tmp_public = _write_temporary(public_path, public_pem, 0o644)
        try:
            _install(tmp_private, private_path, force)
            try:
                _install(tmp_public, public_path, force)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(private_path)
                raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_public)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_private)
    return WrittenKeyPair(private_path, public_path, kid, encrypt)


def _write_temporary(final: str, data: bytes, mode: int) -> str:
    tmp = temp_path(final, "key", ".tmp")
    write_new(tmp, data, mode)
    return tmp


def _install(tmp: str, final: str, force: bool) -> None:
    if force:
        os.replace(tmp, final)
        return
    try:
        os.link(tmp, final)  # fails if final appeared meanwhile: never overwrite
    except FileExistsError:
        usage_error(f"{final} already exists; pass --force to overwrite")
    except OSError:  # a file system without hard links
        if os.path.lexists(final):
            usage_error(f"{final} already exists; pass --force to overwrite")
        os.replace(tmp, final)
        return
    os.unlink(tmp)
