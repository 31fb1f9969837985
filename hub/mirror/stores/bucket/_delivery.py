"""How a bucket store's bytes reach a client: proxied through this process, a
redirect to a presigned URL, or handed to nginx (``X-Accel-Redirect``)
(:mod:`~cmh.hub.mirror.stores.bucket._send`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._read import BucketReader


@dataclass
class RemoteSender:
    """Sends an entry's blob in one delivery mode; ``send`` answers
    ``(response, body bytes sent, why the body was cut or None)``."""

    reader: BucketReader
    delivery: str
    fetcher: Any = None
    verifier: Any = None
    signer: Any = None  # what signs redirect URLs (an ObjectStore for the client's address)

    async def send(
        self, request: Any, entry: Any, headers: dict[str, str], ranges: Any
    ) -> tuple[Any, int, str | None]:
        from . import _send as bucket_send

        if self.delivery == bucket_send.REDIRECT:
            answer = await bucket_send.redirect(request, self.reader, entry, headers, self.signer)
            return answer, 0, None
        if self.delivery == bucket_send.X_ACCEL:
            answer = await bucket_send.x_accel(
                self.reader, self.fetcher, self.verifier, entry, headers
            )
            return answer, 0, None  # nginx sends the body
        return await bucket_send.proxy(
            request, self.reader, self.fetcher, self.verifier, entry, headers, ranges
        )

    @property
    def redirects(self) -> bool:
        """True when the answer is a redirect (a ``HEAD`` is answered as a ``GET``)."""
        from . import _send as bucket_send

        return self.delivery == bucket_send.REDIRECT

    async def ready(self, entry: Any) -> None:
        """Raise :class:`~cmh.hub.mirror._send.BlobUnavailable` unless the blob can be
        sent (present, of its size, not known bad); reads none of its bytes."""
        from . import _send as bucket_send

        await bucket_send.ready(self.reader, self.verifier, entry)

    async def close(self) -> None:
        if self.fetcher is not None:
            await self.fetcher.close()


def make_sender(reader: BucketReader, delivery: str, signer: Any = None) -> RemoteSender:
    from . import _send as bucket_send

    if delivery == bucket_send.REDIRECT:
        return RemoteSender(reader, delivery, signer=signer)
    return RemoteSender(
        reader, delivery, bucket_send.ObjectFetcher(reader), bucket_send.ObjectVerifier()
    )
