"""A hostile upstream Hub for ``cmh serve --upstream`` and ``cmh pull`` (issue 23).

:class:`HostileHub` speaks just enough of the Hub API for one repo at a time
(``revision``, ``tree``, ``resolve``) and lets a test make each answer lie:
``redirect`` the ``resolve`` of a file elsewhere (without an ETag), point the
tree's ``Link: rel="next"`` at another origin, loop redirects, list names no
Hub would. :class:`Recorder` is a listener on another loopback origin that
records what reached it (a "thief": it must never see a token). Both run on
their own event loop thread; use them as context managers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from loop_server import LoopServer

COMMIT = "c0ffee" + "0" * 34
BODY = b"{}\n"  # what a Recorder serves (config.json of the default repo)
#: Valid JSON no parser of this process can nest (``HostileHub.deep_json``).
DEEP_JSON = b"[" * 200_000 + b"]" * 200_000


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def oversized_entry(size: int, *, lfs: bool = False) -> dict[str, Any]:
    """A tree entry of ``config.json`` (:data:`BODY`) listed with ``size`` bytes (in its
    ``lfs`` field when ``lfs``: its own ``size`` is then the true one)."""
    entry: dict[str, Any] = {"type": "file", "path": "config.json", "oid": git_blob_id(BODY)}
    entry["size"] = len(BODY) if lfs else size
    if lfs:
        entry["lfs"] = {"oid": hashlib.sha256(BODY).hexdigest(), "size": size}
    return entry


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None


class Recorder(LoopServer):
    """Records every request; answers 200 with a small body (a HEAD: an ETag too)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        self.seen: list[Seen] = []

    async def handler(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(request.method, request.path, request.headers.get("Authorization")))
        if "/api/" in request.path:
            return web.json_response([])
        return web.Response(body=BODY, headers={"ETag": f'"{git_blob_id(BODY)}"'})


@dataclass
class HostileHub(LoopServer):
    """One repo, ``repo_id``, with ``files`` (path -> bytes) at :data:`COMMIT`.

    Knobs: ``siblings`` (list blobs in the revision answer, with an entry's ``lfs``,
    else the tree is asked), ``next_link`` (the tree's ``Link: rel="next"`` target),
    ``resolve_redirect`` (a function ``(method, path) -> Location or None``),
    ``tree_entries`` (replace the listing: raw entries), ``revision_extra``
    (fields merged into the revision answer).
    """

    repo_id: str = "evil/repo"
    files: dict[str, bytes] = field(default_factory=lambda: {"config.json": BODY})
    siblings: bool = True
    next_link: str | None = None
    resolve_redirect: Callable[[str, str], str | None] | None = None
    tree_entries: list[dict[str, Any]] | None = None
    revision_extra: dict[str, Any] = field(default_factory=dict)
    #: Extra body bytes after each file's listed ones (a body longer than listed).
    overlong: int = 0
    #: The next this many GETs of a file answer ``200`` with the body's last 100 bytes
    #: missing, under a Content-Length that says so (a body shorter than listed).
    short_bodies: int = 0
    #: Pad the revision answer with this many spaces, sent gzip-compressed (a gzip bomb).
    gzip_bomb: int = 0
    #: Tree pages: ``(pages, entries each)`` of generated files, chained by same-origin Links.
    tree_pages: tuple[int, int] | None = None
    #: Seconds the revision answer waits before it is sent (a stalled upstream).
    revision_delay: float = 0.0
    #: Seconds a GET of a file waits before its answer is sent (a slow first byte).
    resolve_delay: float = 0.0
    #: Seconds each tree page waits before it is sent (with ``tree_pages``: a slow walk).
    tree_delay: float = 0.0
    #: ``(bytes, seconds)``: a file's GET body sent that many bytes at a time, with a pause
    #: between (a slow body that never idles long).
    drip: tuple[int, float] | None = None
    #: Answer every case of ``repo_id`` as the repo itself, as huggingface.co does (its
    #: answers name the repo ``repo_id``).
    any_case: bool = False
    #: Serve the repo only to ``Authorization: Bearer {token_only}``: anyone else gets the
    #: Hub's ``401 RepoNotFound`` for every request (a repo made private).
    token_only: str | None = None
    #: Answer this API endpoint of the repo (``"revision"``, ``"tree"``, ``"auth-check"``)
    #: with valid JSON nested 200,000 deep (400 KB: under every size bound), or with
    #: ``"error"`` its revision with a ``404 RepoNotFound`` whose body is that.
    deep_json: str | None = None
    seen: list[Seen] = field(default_factory=list)
    _bomb: bytes | None = None

    def __post_init__(self) -> None:
        super().__init__("127.0.0.1")
        if self.gzip_bomb:  # compressing 400 MiB takes seconds (tens on a loaded machine):
            self._bomb = self._compress_bomb()  # before a client waits for the answer

    def _revision_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.repo_id, "sha": COMMIT, "private": False}
        if self.siblings:
            doc["siblings"] = [
                {"rfilename": e["path"], "blobId": e["oid"], "size": e["size"]}
                | ({"lfs": e["lfs"]} if "lfs" in e else {})
                for e in self._entries()
            ]
        doc.update(self.revision_extra)
        return doc

    def _compress_bomb(self) -> bytes:
        raw = json.dumps(self._revision_doc()).encode()[:-1] + b" " * self.gzip_bomb + b"}"
        return gzip.compress(raw, 6)

    def _entries(self) -> list[dict[str, Any]]:
        if self.tree_entries is not None:
            return self.tree_entries
        return [
            {"type": "file", "path": p, "oid": git_blob_id(b), "size": len(b)}
            for p, b in self.files.items()
        ]

    async def handler(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(request.method, request.path, request.headers.get("Authorization")))
        path = request.path
        if self.token_only is not None and (
            request.headers.get("Authorization") != f"Bearer {self.token_only}"
        ):
            headers = {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
            return web.json_response({"error": "Repository not found"}, status=401, headers=headers)
        if self.any_case:  # every case of the repo's id names it
            at = path.lower().find(f"/{self.repo_id.lower()}/")
            if at >= 0:
                end = at + len(self.repo_id) + 1
                path = path[:at] + "/" + self.repo_id + path[end:]
        api = f"/api/models/{self.repo_id}/"
        if self.deep_json is not None:
            endpoint = "revision" if self.deep_json == "error" else self.deep_json
            if path.startswith(api + endpoint):
                if self.deep_json == "error":  # a refusal whose message is in the body
                    headers = {"X-Error-Code": "RepoNotFound"}
                    return web.Response(status=404, body=DEEP_JSON, headers=headers)
                return web.Response(body=DEEP_JSON, content_type="application/json")
        if path.startswith(api + "revision/"):
            if self.revision_delay:  # a Hub slow to answer: the client's timeouts are real
                await asyncio.sleep(self.revision_delay)
            if self.gzip_bomb:
                if self._bomb is None:  # set after the start: compressed once
                    self._bomb = self._compress_bomb()
                return web.Response(
                    body=self._bomb,
                    headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
                )
            return web.json_response(self._revision_doc())
        if path == api + "auth-check":  # a public repo: anyone may read it
            return web.json_response({})
        if path.startswith(api + "tree/") and self.tree_pages is not None:
            if self.tree_delay:
                await asyncio.sleep(self.tree_delay)
            pages, each = self.tree_pages
            page = int(request.query.get("page", "0"))
            entries = [
                {"type": "file", "path": f"f/{page}/{i}.txt", "oid": "0" * 40, "size": 1}
                for i in range(each)
            ]
            headers = {}
            if page + 1 < pages:
                headers["Link"] = f'<{self.url}{path}?page={page + 1}>; rel="next"'
            return web.json_response(entries, headers=headers)
        if path.startswith(api + "tree/"):
            headers = {"Link": f'<{self.next_link}>; rel="next"'} if self.next_link else {}
            return web.json_response(self._entries(), headers=headers)
        prefix = f"/{self.repo_id}/resolve/"
        if path.startswith(prefix):
            file_path = path[len(prefix) :].split("/", 1)[1]
            if self.resolve_redirect is not None:
                where = self.resolve_redirect(request.method, file_path)
                if where is not None:
                    return web.Response(status=302, headers={"Location": where})
            data = self.files.get(file_path)
            if data is None:
                return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
            if request.method == "GET" and self.resolve_delay:  # no first byte for a while
                await asyncio.sleep(self.resolve_delay)
            headers = {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": COMMIT}
            if request.method == "GET" and self.drip is not None:
                return await self._drip(request, data, headers, *self.drip)
            if request.method == "GET" and self.short_bodies > 0:
                self.short_bodies -= 1
                return web.Response(body=data[:-100], headers=headers)
            if request.method == "HEAD" or not self.overlong:
                return web.Response(body=data, headers=headers)
            response = web.StreamResponse(headers=headers)
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(data)
            for _ in range(self.overlong >> 16):
                await response.write(b"x" * (1 << 16))
            await response.write_eof()
            return response
        return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})

    async def _drip(
        self, request: web.Request, data: bytes, headers: dict[str, str], each: int, pause: float
    ) -> web.StreamResponse:
        """``data`` ``each`` bytes at a time, ``pause`` s apart (until the client goes away)."""
        response = web.StreamResponse(headers=headers)
        response.content_length = len(data)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            for i in range(0, len(data), each):
                await response.write(data[i : i + each])
                await asyncio.sleep(pause)
        return response


class DripOrHub(HostileHub):
    """:class:`HostileHub` (``evil/repo``), and any ``drip/*`` revision answered a byte
    every 50 ms, for 60 s at most or until ``ending`` is set."""

    ending = False

    async def handler(self, request: web.Request) -> web.StreamResponse:
        if not request.path.startswith("/api/models/drip/"):
            return await super().handler(request)
        self.seen.append(Seen(request.method, request.path, None))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            await response.write(b"{")
            for _ in range(1200):
                if self.ending:
                    break
                await response.write(b" ")
                await asyncio.sleep(0.05)
        except (ConnectionError, RuntimeError):
            pass
        return response
