"""How a folder store's blobs reach a client: this process sends the file (``sendfile``,
:mod:`~cmh.hub.mirror._send`), or nginx does (``X-Accel-Redirect``, :mod:`._xaccel`).

Either way a blob is opened inside the store, a regular file of its size, and served
only while its bytes hash to its name (:mod:`._verify`): a version checked before is
known at once; a body that ends at the blob's last byte waits for the check up to
:data:`VERIFY_WAIT` (a longer check goes on while the body streams and gates its last
byte); any other range is sent at once, its check started beside it
(spec/hub-mirror.md 2.1). Every gate cuts the body when the file changed meanwhile.
"""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path
from urllib.parse import quote

from aiohttp import web

from ..._errors import BlobUnavailable
from ..._index import FileEntry
from ..._ranges import ByteRange, reaches_end
from ..._send import BodyCut, ClientLeft, Gate, frame, open_blob, send_body
from .._delivery import (
    PROXY,
    X_ACCEL,
    BlobMismatch,
    BlobMissing,
    NoHashedParts,
    Sent,
    answered_whole,
    whole_prefix,
)
from ._verify import BlobVerifier, FileVersion, record_path
from ._xaccel import DEFAULT_PREFIX

#: Seconds a request waits for the first check of a blob before its headers are sent;
#: a longer check goes on while the body streams, and gates the body's last byte.
VERIFY_WAIT = 2.0
#: Why a body was cut when its file changed (or failed its check) while it was sent.
BLOB_CHANGED = "blob changed"


class FileDelivery(NoHashedParts):
    """Sends a folder store's blobs from this process (``proxy``) or through nginx
    (``x-accel``, the prefix of nginx's internal location)."""

    def redirects(self, request: web.Request) -> bool:
        return False

    def __init__(
        self, root: Path, verifier: BlobVerifier, mode: str = PROXY, prefix: str = DEFAULT_PREFIX
    ) -> None:
        self.root = root.resolve()
        self.verifier = verifier
        self.mode = mode
        self.prefix = prefix

    async def ready(self, entry: FileEntry) -> None:
        """The blob opens and is not known bad; a check not made yet starts beside the
        answer (the ``GET`` that follows joins it)."""
        f = await self._open(entry)
        with f:
            self._check_beside(entry, f)

    async def send(
        self,
        request: web.Request,
        entry: FileEntry,
        headers: dict[str, str],
        ranges: list[ByteRange] | None,
    ) -> Sent:
        if self.mode == X_ACCEL:
            return Sent(await self._x_accel(entry, headers, answered_whole(request, ranges)))
        f = await self._open(entry)
        try:
            gate = await self._verified(entry, f, reaches_end(ranges, entry.size))
            response, pieces, tail = frame(headers, ranges, entry.size)
            try:  # send_body sends the headers, corked with the body's first bytes
                sent = await send_body(request, response, f, pieces, tail, gate)
            except BodyCut as cut:
                return Sent(response, cut.sent, BLOB_CHANGED)
            except ClientLeft as left:
                return Sent(response, left.sent, str(left))
            return Sent(response, sent)
        finally:
            f.close()

    async def close(self) -> None:
        """Nothing held."""

    async def _open(self, entry: FileEntry) -> io.FileIO:
        """The entry's blob, open (:class:`BlobMissing` when the store lacks it)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self._open_checked, entry)
        except BlobUnavailable as exc:
            if not os.path.lexists(entry.source):
                raise BlobMissing(str(exc)) from None
        # a fill installed it between the open and the look
        return await loop.run_in_executor(None, self._open_checked, entry)

    def _open_checked(self, entry: FileEntry) -> io.FileIO:
        """Open an entry's file; its folder may be reached through links, the file itself
        not, and it must lie inside the store."""
        folder = os.path.realpath(entry.source.parent)
        if not (folder + os.sep).startswith(str(self.root) + os.sep):
            raise BlobUnavailable("blob lies outside the store")
        return open_blob(Path(folder) / entry.source.name, entry.size)

    def _known(
        self, entry: FileEntry, f: io.FileIO
    ) -> tuple[FileVersion, Path | None, bool | None]:
        """The open blob's version, where its check is recorded, and its known outcome."""
        version = FileVersion.of(f.fileno())
        blob = Path(os.path.realpath(entry.source.parent)) / entry.source.name
        record = record_path(blob, entry.etag)
        return version, record, self.verifier.known(version, entry.etag, record)

    def _check_beside(self, entry: FileEntry, f: io.FileIO) -> None:
        """A blob known bad is refused; one not checked yet has its check started (or
        joined), not waited for: its outcome serves the requests that follow."""
        version, record, outcome = self._known(entry, f)
        if outcome is False:
            raise BlobMismatch
        if outcome is None:
            pending = self.verifier.check(f.fileno(), entry.etag, version, record)
            pending.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _verified(self, entry: FileEntry, f: io.FileIO, held: bool) -> Gate:
        """Make sure the open blob hashes to its ETag; the gate for its body's last byte
        (``held``: the body may end at the blob's last byte; see the module's words)."""
        if not held:
            self._check_beside(entry, f)
            version = FileVersion.of(f.fileno())
            pending = None
        else:
            version, record, outcome = self._known(entry, f)
            pending = None
            if outcome is None:
                pending = self.verifier.check(f.fileno(), entry.etag, version, record)
                try:
                    outcome = await asyncio.wait_for(asyncio.shield(pending), VERIFY_WAIT)
                except TimeoutError:
                    outcome = None
                except Exception as exc:  # the check could not read the blob
                    raise BlobUnavailable(f"blob unavailable: {exc}") from None
            if outcome is False:
                raise BlobMismatch

        async def gate() -> bool:
            if pending is not None:
                try:
                    if not await asyncio.shield(pending):
                        return False
                except Exception:  # the check could not read the blob: never complete it
                    return False
            return FileVersion.of(f.fileno()) == version

        return gate

    async def _x_accel(
        self, entry: FileEntry, headers: dict[str, str], whole: bool
    ) -> web.Response:
        """Hand the body to nginx: ``X-Accel-Redirect`` to the blob under the prefix (with
        ``whole``, under the prefix whose location ignores the client's ``Range``: cmh
        answers that request with the whole body).

        The blob is opened and checked first as for any body cmh sends (the check is
        waited for, since nginx's bytes cannot be held back), so nginx is only ever sent
        to a file version cmh would have served. A change to the file after that is not
        seen (see docs/object-storage.md, "What each delivery trusts").
        """
        f = await self._open(entry)
        try:
            gate = await self._verified(entry, f, True)
            if not await gate():
                raise BlobMismatch
        finally:
            f.close()
        real = os.path.join(os.path.realpath(entry.source.parent), entry.source.name)
        rel = os.path.relpath(real, self.root)
        out = {k: v for k, v in headers.items() if k != "Accept-Ranges"}
        prefix = whole_prefix(self.prefix) if whole else self.prefix
        out["X-Accel-Redirect"] = prefix + quote(rel.replace(os.sep, "/"))
        return web.Response(status=200, headers=out)
