"""How a blob's bytes reach a client: one object per delivery mode, whatever the store.

The HTTP application asks the store for :meth:`~cmh.hub.mirror.stores.MirrorStore.delivery`
once per mode and hands every download to it: a folder sends its file (``sendfile``) or
hands it to nginx (``x-accel``), a bucket proxies the object or redirects to it. What the
body became (complete, cut by the mirror, or left by its client) comes back as one
:class:`Sent`, so a dropped client, a cut and its cut record are handled in one place
for every kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .._errors import CLIENT_LEFT, BlobUnavailable

if TYPE_CHECKING:
    from aiohttp import web

    from .._index import FileEntry
    from .._ranges import ByteRange

PROXY = "proxy"
REDIRECT = "redirect"
X_ACCEL = "x-accel"
#: Every ``--blob-delivery`` mode some store can do.
DELIVERIES = (PROXY, REDIRECT, X_ACCEL)


def answered_whole(request: web.Request, ranges: list[ByteRange] | None) -> bool:
    """Whether the client asked for a ``Range`` that the mirror answers with the whole body
    (an ``If-Range`` naming another version, a resume after a cut body: spec 8.3). No
    mode may then send a part: ``redirect`` sends it itself (a client would send its
    ``Range`` to the storage), ``x-accel`` hands it to nginx's location under
    :func:`whole_prefix`."""
    return ranges is None and "Range" in request.headers


def whole_prefix(prefix: str) -> str:
    """The prefix of nginx's internal location that sends blobs whole, whatever the client's
    ``Range`` (``max_ranges 0``), beside the one at ``prefix``: ``/_cmh_blobs/`` ->
    ``/_cmh_blobs_whole/``."""
    return prefix.rstrip("/") + "_whole/"


class BlobMismatch(BlobUnavailable):
    """The blob's stored bytes do not hash to its name (known bad): it is not sent."""

    def __init__(self) -> None:
        super().__init__("blob does not match its name")


class BlobMissing(BlobUnavailable):
    """The store does not hold the blob at all (a pull-through server fills it)."""


@dataclass(frozen=True)
class Sent:
    """What a delivery answered: the response, the body bytes this process sent, and
    why the body ended early (None: it did not; :data:`CLIENT_LEFT`: its client left;
    any other reason: the mirror cut it, and a resume of it must start again)."""

    response: web.StreamResponse
    bytes_sent: int = 0
    cut: str | None = None

    @property
    def cut_by_mirror(self) -> bool:
        """True when the mirror cut the body (a cut record is due), not its client."""
        return self.cut is not None and self.cut != CLIENT_LEFT


class NoHashedParts:
    """:meth:`BlobDelivery.send_hashed` of a store whose fills are sent by their filling
    answer alone (a folder, memory): nothing."""

    async def send_hashed(
        self,
        request: web.Request,
        entry: FileEntry,
        headers: dict[str, str],
        ranges: list[ByteRange] | None,
    ) -> Sent | None:
        return None


class BlobDelivery(Protocol):
    """Sends an entry's blob in one delivery mode (one object per worker and mode).

    Every method raises :class:`~cmh.hub.mirror._errors.BlobUnavailable` before anything
    is sent when the blob cannot be sent (:class:`BlobMissing` when the store lacks it,
    :class:`BlobMismatch` when it is known bad)."""

    #: The mode's name (one of the store's ``deliveries``).
    mode: str

    def redirects(self, request: web.Request) -> bool:
        """True when ``request``'s answer is a redirect (a ``HEAD`` is then answered as its
        ``GET``, with the ``Location``)."""

    async def ready(self, entry: FileEntry) -> None:
        """Return when the blob can be sent (present, of its size, not known bad); reads
        none of its bytes (what a ``HEAD`` needs; a check may start beside it)."""

    async def send(
        self,
        request: web.Request,
        entry: FileEntry,
        headers: dict[str, str],
        ranges: list[ByteRange] | None,
    ) -> Sent:
        """Answer ``request`` with the blob (whole, its ``ranges``, or where it is), with
        ``headers``. A body whose bytes turn out not to be the blob's is cut before its
        last byte (``Sent.cut``); a client that leaves ends it (:data:`CLIENT_LEFT`)."""

    async def send_hashed(
        self,
        request: web.Request,
        entry: FileEntry,
        headers: dict[str, str],
        ranges: list[ByteRange] | None,
    ) -> Sent | None:
        """Answer a ``GET`` of a blob the store does not hold yet, whose fill's whole hash
        matched, as :meth:`send` would the blob (a bucket's fill parts, while the storage
        makes the blob of them); ``None`` when the store has nothing so (the filling
        answer sends it)."""

    async def close(self) -> None:
        """Release what the delivery holds (connections), when the server stops."""
