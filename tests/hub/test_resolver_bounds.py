"""Issue 35, the resolver's part: its per-process memory is bounded and a drip-fed body
transfer has a total deadline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from loop_server import LoopServer


def test_the_resolver_revalidation_window_is_bounded() -> None:
    from cmh.hub.resolver import _window

    _window.forget()
    try:
        for i in range(_window.MAX_REMEMBERED + 500):
            _window.remember_commit(Path("/c"), "http://127.0.0.1:1", "model", f"o/r{i}", "main",
                                    "a" * 40)  # fmt: skip
            with _window.in_cache(Path("/c"), "model", f"o/r{i}"):
                pass
        assert len(_window.recent) == _window.MAX_REMEMBERED
        assert len(_window._last_cache) == _window.MAX_REMEMBERED
    finally:
        _window.forget()


def test_a_drip_fed_blob_transfer_is_given_up_past_its_deadline() -> None:
    """A body sent a byte at a time never trips the idle timeout; the transfer's deadline
    (idle timeout plus a second per MIN_TRANSFER_RATE bytes) gives it up, to be resumed."""
    from cmh.hub.resolver import HubClient, HubUnreachableError

    class Drip(LoopServer):
        async def handler(self, request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Length": "200"})
            await response.prepare(request)
            try:
                for _ in range(200):  # 10 s in all: the old code waited for every byte
                    await response.write(b"x")
                    await asyncio.sleep(0.05)
            except (ConnectionError, RuntimeError):
                pass
            return response

    got: list[bytes] = []
    with Drip() as drip:
        client = HubClient(drip.url, None, timeout=1.0)
        with pytest.raises(HubUnreachableError, match="slower than"):
            client.stream(f"{drip.url}/o/r/resolve/main/f", 0, got.append, limit=200)
    assert 0 < sum(map(len, got)) < 200
