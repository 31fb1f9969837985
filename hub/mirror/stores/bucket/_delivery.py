"""How a bucket store's bytes reach a client: proxied through this process, a
redirect to a presigned URL, or handed to nginx (``X-Accel-Redirect``)
(:mod:`~cmh.hub.mirror.stores.bucket._send`), as one
:class:`~cmh.hub.mirror.stores.BlobDelivery`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from ..._index import FileEntry
from ..._ranges import ByteRange
from .._delivery import PROXY, REDIRECT, X_ACCEL, Sent, answered_whole
from . import _send as bucket_send
from ._objectstore import ObjectStore, ObjectStoreError
from ._pull import PART, hashed_parts, reading_parts
from ._read import BucketReader


@dataclass
class BucketDelivery:
    """Sends an entry's blob in one delivery mode: ``proxy`` (the object's bytes through
    this process, checked), ``redirect`` (a presigned URL, signed by ``signer``) or
    ``x-accel`` (nginx fetches the checked version from the storage and sends it).

    A GET whose ``Range`` the mirror answers with the whole body (an ``If-Range`` naming
    another version, a resume after a cut body: spec 8.3) is never answered with a part:
    ``redirect`` proxies it (a client would send its ``Range`` to the storage), ``x-accel``
    hands it to nginx's location that ignores ranges."""

    reader: BucketReader
    mode: str
    signer: ObjectStore | None = None  # signs redirect URLs (for the client's address)
    fetcher: bucket_send.ObjectFetcher = field(init=False)
    verifier: bucket_send.ObjectVerifier = field(
        default_factory=bucket_send.ObjectVerifier, init=False
    )

    def __post_init__(self) -> None:
        if self.mode not in (PROXY, REDIRECT, X_ACCEL):
            raise ValueError(f"a bucket store has no {self.mode!r} delivery")
        self.fetcher = bucket_send.ObjectFetcher(self.reader)  # its session opens on first use

    def redirects(self, request: web.Request) -> bool:
        """True in ``redirect`` mode (a ``HEAD`` is then answered as its ``GET``, as the Hub
        answers an LFS file's), except for a ``HEAD`` asked of the host the presigned URL
        names (on another port): huggingface_hub 2.0, 2.1 and late 1.x take such a ``Location`` for
        the Hub's own, follow it with the caller's token and read the storage's headers
        (no ``X-Repo-Commit``: every download failed), so that ``HEAD`` is answered with
        the file's headers and its ``GET`` with the redirect."""
        if self.mode != REDIRECT:
            return False
        return request.method != "HEAD" or not _on_asked_host(
            request, self.signer or self.reader.store.objects
        )

    async def ready(self, entry: FileEntry) -> None:
        await bucket_send.ready(self.reader, self.verifier, entry)

    async def send(
        self,
        request: web.Request,
        entry: FileEntry,
        headers: dict[str, str],
        ranges: list[ByteRange] | None,
    ) -> Sent:
        whole = answered_whole(request, ranges)
        if self.mode == REDIRECT and not (whole and request.method == "GET"):
            answer = await bucket_send.redirect(request, self.reader, entry, headers, self.signer)
            return Sent(answer)
        if self.mode == X_ACCEL:  # nginx sends the body
            return Sent(await bucket_send.x_accel(
                self.reader, self.fetcher, self.verifier, entry, headers, whole
            ))  # fmt: skip
        response, sent, cut = await bucket_send.proxy(
            request, self.reader, self.fetcher, self.verifier, entry, headers, ranges
        )
        return Sent(response, sent, cut)

    async def send_hashed(
        self,
        request: web.Request,
        entry: FileEntry,
        headers: dict[str, str],
        ranges: list[ByteRange] | None,
    ) -> Sent | None:
        """A ``GET`` of a blob not made yet whose fill's whole hash matched: sent from the
        fill's parts through the proxy's data plane, in every mode (a filling answer goes
        through this process too; a client cannot be sent to a part); ``None`` when there
        are no such parts or they cannot be sent so (the filling answer sends them)."""
        if request.method != "GET":
            return None
        blob = entry.source.as_posix()
        loop = asyncio.get_running_loop()
        with reading_parts(blob):  # from before the look: the fill deletes no part under it
            try:
                parts = await loop.run_in_executor(
                    None, hashed_parts, self.reader.store, blob, entry.size
                )
            except ObjectStoreError:
                return None
            if not parts:
                return None
            done = await bucket_send.proxy_parts(
                request, self.reader, self.verifier, entry, headers, ranges, parts, PART
            )
        return None if done is None else Sent(*done)

    async def close(self) -> None:
        await self.fetcher.close()


def _on_asked_host(request: web.Request, signer: ObjectStore) -> bool:
    """Whether the URLs ``signer`` presigns name the host ``request`` was sent to (the
    storage's endpoint; none: the provider's own hosts, never the mirror's)."""
    endpoint = signer.settings.endpoint
    if not endpoint:
        return False
    asked = urlsplit(f"//{request.host}").hostname
    return bool(asked) and asked == urlsplit(endpoint).hostname
