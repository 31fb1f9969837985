"""Ed25519 signatures over the CMH record (spec section "Signature").

The signed message is ``b"CMH-SIG-v1\\0" + record`` (the 64 record bytes). A key
id is the first 16 hex characters of SHA-256 of the raw 32-byte public key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ._errors import SigningKeyError
from ._regular import read_small_file

SIGNATURE_DOMAIN = b"CMH-SIG-v1\x00"
PASSPHRASE_ENV = "CMH_KEY_PASSPHRASE"


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 hex characters of SHA-256 of the raw public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign_record(record: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """The 64-byte Ed25519 signature of a 64-byte record."""
    return private_key.sign(SIGNATURE_DOMAIN + record)


def signature_valid(record: bytes, signature: bytes, public_key: Ed25519PublicKey) -> bool:
    try:
        public_key.verify(signature, SIGNATURE_DOMAIN + record)
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True)
class TrustedKeys:
    """Public keys a verifier trusts, by key id."""

    keys: dict[str, Ed25519PublicKey]

    @classmethod
    def load(cls, paths: Iterable[str | os.PathLike[str]]) -> TrustedKeys:
        """Load PEM public keys from files or from every ``*.pem``/``*.pub`` in directories."""
        keys: dict[str, Ed25519PublicKey] = {}
        for item in paths:
            p = Path(item)
            files = (
                sorted(f for f in p.iterdir() if f.is_file() and f.suffix in {".pem", ".pub"})
                if p.is_dir()
                else [p]
            )
            if p.is_dir() and not files:
                raise SigningKeyError(f"{p}: directory holds no .pem or .pub key files")
            for f in files:
                key = load_public_key(f)
                keys[key_id(key)] = key
        return cls(keys)

    def __bool__(self) -> bool:
        return bool(self.keys)


def signature_status(
    record: bytes, signature: bytes, signer: str, trusted_keys: TrustedKeys | None
) -> str:
    """What a verifier holding ``trusted_keys`` knows of a record's signature (spec section 7).

    ``"unchecked"`` with no trusted key; ``"untrusted"`` when the key id is not
    among them (the key id decides first: the signature is then not checked);
    else ``"valid"`` or ``"invalid"`` (the record changed after signing).
    """
    if not trusted_keys:
        return "unchecked"
    key = trusted_keys.keys.get(signer)
    if key is None:
        return "untrusted"
    return "valid" if signature_valid(record, signature, key) else "invalid"


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Load an Ed25519 public key from a PEM file (a private key also yields its public half)."""
    data = _read(path)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (TypeError, ValueError) as exc:
            raise SigningKeyError(f"{path}: not a PEM Ed25519 public key") from exc
        if not isinstance(private, Ed25519PrivateKey):
            raise SigningKeyError(f"{path}: not an Ed25519 key") from None
        return private.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path}: not an Ed25519 public key")
    return key


def load_private_key(
    path: str | os.PathLike[str], passphrase: bytes | None = None
) -> Ed25519PrivateKey:
    """Load an Ed25519 private key from PEM.

    An encrypted key takes ``passphrase``, else the ``CMH_KEY_PASSPHRASE``
    environment variable; :class:`~cmh._errors.SigningKeyError` says which is missing.
    """
    data = _read(path)
    if passphrase is None and PASSPHRASE_ENV in os.environ:
        passphrase = os.environ[PASSPHRASE_ENV].encode()
    try:
        key = serialization.load_pem_private_key(data, password=passphrase)
    except TypeError as exc:
        if passphrase is None:
            raise SigningKeyError(
                f"{path}: key is encrypted; give its passphrase (prompt or ${PASSPHRASE_ENV})"
            ) from exc
        raise SigningKeyError(f"{path}: key is not encrypted, but a passphrase was given") from exc
    except ValueError as exc:
        if b"-----BEGIN PUBLIC KEY-----" in data and b"PRIVATE KEY-----" not in data:
            raise SigningKeyError(
                f"{path}: not a PEM private key: it holds a public key (sign with the "
                "private key, the .key file `cmh keygen` wrote beside it)"
            ) from exc
        raise SigningKeyError(f"{path}: not a PEM private key, or wrong passphrase") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path}: not an Ed25519 private key")
    return key


def private_key_is_encrypted(path: str | os.PathLike[str]) -> bool:
    """True when the PEM at ``path`` needs a passphrase."""
    data = _read(path)
    return b"ENCRYPTED" in data.split(b"\n", 1)[0] or b"Proc-Type: 4,ENCRYPTED" in data


def generate_keypair(passphrase: bytes | None = None) -> tuple[bytes, bytes, str]:
    """A new key pair as (private PEM, public PEM, key id)."""
    private = Ed25519PrivateKey.generate()
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    public = private.public_key()
    public_pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem, key_id(public)


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return read_small_file(path)  # a FIFO or a device given as a key never blocks
    except OSError as exc:
        raise SigningKeyError(f"{path}: cannot read key file: {exc.strerror or exc}") from exc
