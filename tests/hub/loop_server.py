"""One loop for the tests' small HTTP servers: an aiohttp app on a free 127.0.0.1 port,
in its own thread with its own event loop (the fault proxies, the hostile upstreams).

A subclass defines ``async handler(request)`` and, when it needs more, ``on_start()``
(run on the loop once the site listens: open a client session) and ``on_stop()`` (run
before the runner's cleanup). ``start()`` returns once ``url`` answers; ``stop()``
frees the port and ends the thread. Both are also the context manager.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web
from deadline_support import TEST_DEADLINE


class LoopServer:
    """An aiohttp app on ``host``, a free port, in its own thread (``url``)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None

    async def handler(self, request: web.Request) -> web.StreamResponse:  # overridden
        raise NotImplementedError

    async def on_start(self) -> None:
        """Run on the loop once the site listens."""

    async def on_stop(self) -> None:
        """Run on the loop before the runner's cleanup."""

    def start(self) -> Any:
        self._thread.start()
        if not self._ready.wait(TEST_DEADLINE):
            raise RuntimeError(f"{type(self).__name__} did not start")
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            await self.on_stop()
            assert self._runner is not None
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)
        self._loop.close()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}"
        await self.on_start()
