"""Fleet records authenticated with a fleet key (HMAC-SHA256), docs/object-storage.md.

Replicas of a pull-through fleet share records in the bucket (fill leases, ``failed``
records, cut records, access records, validations, upstream freshness, check records).
Anyone who can write to the bucket could forge one. With a fleet key, every record is
written as its body followed by one trailer line::

    {body}\\ncmh-fleet-mac/1 {at} {hex}\\n

where ``at`` is the storage's time of the write and ``hex`` the HMAC-SHA256, under the
key, of the record's object name, ``at`` and body. A record is trusted only when its MAC
matches (so it cannot be made without the key, nor moved to another name) and ``at`` is
within :data:`RECORD_SKEW` of the object's ``Last-Modified`` (so an old record written
again later is not taken as new). Anything else is ignored as absent.

Without a key, records are written as before; a trailer found is dropped unchecked.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import re
import threading
from pathlib import Path

from cachetools import LRUCache

from cmh import read_small_file

from ..._errors import StoreError

#: The environment variable naming the fleet key file (``cmh serve --fleet-key-file``
#: sets it for its workers; ``cmh prune``, ``mirror add|sync|scrub`` read it too).
FLEET_KEY_ENV = "CMH_FLEET_KEY_FILE"
#: Seconds a record's signed ``at`` may differ from its object's ``Last-Modified``.
RECORD_SKEW = 60.0
#: Fewest bytes of secret a key file must hold (``openssl rand -hex 32`` gives 64).
MIN_KEY_BYTES = 32
#: Largest key file read.
MAX_KEY_BYTES = 4096
#: Names of refused records told in the log, per process (each told once).
MAX_TOLD = 4096

_TAG = b"\ncmh-fleet-mac/1 "
_MAC_RE = re.compile(r"[0-9a-f]{64}")
logger = logging.getLogger("cmh.hub.mirror")


class FleetKeyError(StoreError):
    """A fleet key file that cannot be used (missing, unreadable, too short)."""


def read_fleet_key(path: Path) -> bytes:
    """The secret in a fleet key file (surrounding whitespace removed)."""
    hint = "make one with `openssl rand -hex 32 > fleet.key` (the same file on every replica)"
    try:
        data = read_small_file(path)  # never blocks on a FIFO, never reads a huge file
    except OSError as exc:
        raise FleetKeyError(f"{path}: cannot read the fleet key ({exc.strerror}); {hint}") from None
    secret = data.strip()
    if len(data) > MAX_KEY_BYTES or len(secret) < MIN_KEY_BYTES:
        raise FleetKeyError(
            f"{path}: a fleet key file holds {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes "
            f"(it has {len(secret)}); {hint}"
        )
    return secret


def fleet_key_from_env() -> FleetKey | None:
    """The key named by ``CMH_FLEET_KEY_FILE``, or ``None`` when it is unset or empty."""
    path = os.environ.get(FLEET_KEY_ENV, "").strip()
    return FleetKey(read_fleet_key(Path(path))) if path else None


class FleetKey:
    """Seals and opens the fleet's records with one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._told: LRUCache[str, bool] = LRUCache(MAX_TOLD)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "FleetKey(...)"

    def _mac(self, name: str, at: str, body: bytes) -> str:
        message = b"\0".join((b"cmh-fleet-record/1", name.encode(), at.encode(), body))
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def seal(self, name: str, body: bytes, at: float) -> bytes:
        """``body`` as the record ``name`` written at ``at`` (the storage's time)."""
        stamp = f"{at:.3f}"
        return body + _TAG + f"{stamp} {self._mac(name, stamp, body)}\n".encode()

    def open(self, name: str, data: bytes, written: float) -> bytes | None:
        """The body of the record ``name`` whose object was last written at ``written``
        (its ``Last-Modified``), or ``None`` when the key did not seal it there and then."""
        body, found, trailer = data.rpartition(_TAG)
        parts = trailer.decode("ascii", "replace").removesuffix("\n").split(" ")
        if not found or len(parts) != 2:
            self._refused(name, "not signed with the fleet key")
            return None
        stamp, mac = parts
        if not _MAC_RE.fullmatch(mac) or not hmac.compare_digest(mac, self._mac(name, stamp, body)):
            self._refused(name, "its signature does not match the fleet key")
            return None
        try:
            at = float(stamp)
        except ValueError:
            self._refused(name, "its signed time is unreadable")
            return None
        if not math.isfinite(at) or abs(at - written) > RECORD_SKEW:
            self._refused(name, "it was not written when it was signed (a replay)")
            return None
        return body

    def _refused(self, name: str, why: str) -> None:
        with self._lock:
            told = name in self._told
            self._told[name] = True
        if not told:
            logger.warning("ignored the fleet record %s in the bucket: %s", name, why)


def unsealed(data: bytes) -> bytes:
    """A record's body without its trailer, unchecked (a store without a fleet key)."""
    body, found, _ = data.rpartition(_TAG)
    return body if found else data
