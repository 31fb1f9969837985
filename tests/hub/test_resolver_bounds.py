"""Issue 35, the resolver's part: its per-process memory is bounded and a drip-fed body
transfer has a total deadline."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest
from aiohttp import web
from loop_server import LoopServer


def test_the_resolver_revalidation_window_is_bounded() -> None:
    from cmh.hub.resolver import _window

    _window.forget()
    try:
        for i in range(_window.MAX_REMEMBERED + 500):
            where = _window.Asked(Path("/c"), "http://127.0.0.1:1", "model", f"o/r{i}", "main")
            _window.remember_commit(where, "a" * 40, credential="")
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


def test_an_answer_whose_headers_come_a_byte_at_a_time_ends_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Headers sent a byte at a time never trip a read timeout; every read of a request
    now waits no later than its total deadline (HF_HUB_ETAG_TIMEOUT for metadata)."""
    from cmh.hub.resolver import HubClient, ResolveError

    head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 100
    rest = b'\r\nETag: "' + b"a" * 40 + b'"\r\nContent-Length: 0\r\n\r\n'
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def drip() -> None:
        listener.settimeout(30)
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                for byte in head:  # 5 s in all, then a good answer: the old code took it
                    if stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(0.05)
                conn.sendall(rest)
                stop.wait(10)

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")
    try:
        client = HubClient(f"http://127.0.0.1:{listener.getsockname()[1]}", None)
        with pytest.raises(ResolveError):  # a HEAD: no body whose reads would check time
            client.served(client.file_url("o/r", "model", "main", "f"))
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def test_a_hub_error_message_is_kept_short() -> None:
    """An error answer's ``error`` field (up to 32 MiB) was kept whole, passed on and
    remembered with the failure."""
    import httpx2
    from cmh.hub.resolver._http import MAX_MESSAGE, hub_message

    long = httpx2.Response(404, json={"error": "x" * 1_000_000})
    assert len(hub_message(long)) <= MAX_MESSAGE
    header = httpx2.Response(404, headers={"X-Error-Message": "y" * 20_000})
    assert len(hub_message(header)) <= MAX_MESSAGE
    assert hub_message(httpx2.Response(404, json={"error": " Repo not found "})) == (
        "Repo not found"
    )


def test_a_listed_size_is_bounded_at_1_pib() -> None:
    """A size past 2**63 reached ``os.pread`` (OverflowError); over 2**50 bytes (1 PiB) is
    now :class:`InvalidListing`, in a revision's siblings and in a tree page (an
    ``lfs.size`` too); 2**50 itself is a size."""
    from cmh.hub.resolver import HubClient
    from cmh.hub.resolver._types import InvalidListing
    from hostile_upstream import HostileHub, oversized_entry

    def listing(hub: HostileHub) -> dict[str, object]:
        client = HubClient(hub.url, None)
        remote = client.revision(hub.repo_id, "model", "main")
        return remote.files or client.tree(hub.repo_id, "model", remote.commit)

    for siblings in (True, False):
        with HostileHub(siblings=siblings, tree_entries=[oversized_entry(1 << 50)]) as hub:
            assert listing(hub)["config.json"].size == 1 << 50  # type: ignore[attr-defined]
        refused = [
            (oversized_entry((1 << 50) + 1), "over 1 PiB"),
            (oversized_entry(2**70, lfs=True), "over 1 PiB"),
            (oversized_entry(-1, lfs=True), "negative size"),  # was checked before lfs
        ]
        for entry, says in refused:
            with (
                HostileHub(siblings=siblings, tree_entries=[entry]) as hub,
                pytest.raises(InvalidListing, match=says),
            ):
                listing(hub)


def test_a_json_true_is_no_listed_size() -> None:
    """A spec-only reader's hostile upstream: ``"size": true`` in a revision's siblings
    was taken as 1 byte (Python's bool is an int), and a mirror then listed the repo
    without the file and answered it 503; an ``lfs.size`` of ``true`` replaced the size
    in siblings and tree pages alike. ``true`` is no integer: the siblings are not the
    listing (the tree is asked), a tree entry is malformed, an ``lfs.size`` is ignored."""
    from cmh.hub.resolver import HubClient
    from cmh.hub.resolver._types import InvalidListing
    from hostile_upstream import BODY, HostileHub, oversized_entry

    def listing(hub: HostileHub) -> dict[str, object]:
        client = HubClient(hub.url, None)
        remote = client.revision(hub.repo_id, "model", "main")
        return remote.files or client.tree(hub.repo_id, "model", remote.commit)

    for siblings in (True, False):
        entry = oversized_entry(len(BODY))
        entry["size"] = True
        with (
            HostileHub(siblings=siblings, tree_entries=[entry]) as hub,
            pytest.raises(InvalidListing, match="malformed tree entry"),
        ):
            listing(hub)
        lfs_true = oversized_entry(len(BODY), lfs=True)
        lfs_true["lfs"]["size"] = True
        with HostileHub(siblings=siblings, tree_entries=[lfs_true]) as hub:
            size = listing(hub)["config.json"].size  # type: ignore[attr-defined]
            assert size == len(BODY) and size is not True


@pytest.mark.parametrize(
    ("value", "size"),
    [(b"120", 120), (b"0120", 120), (b"\xb2", None), (b"\xd9\xa1", None), (b"+1", None)],
)
def test_a_served_size_is_ascii_digits(value: bytes, size: int | None) -> None:
    """A confirming HEAD's ``X-Linked-Size: ²`` (latin-1 0xB2) raised an untyped
    ValueError (``"²".isdigit()`` holds, ``int("²")`` fails), and ``١`` (Arabic-Indic one)
    was a size of 1; any value but ASCII digits gives no size (not compared, spec §4)."""
    import httpx2
    from cmh.hub.resolver._http import _served_size

    assert _served_size(httpx2.Response(200, headers=[(b"X-Linked-Size", value)])) == size


@pytest.mark.parametrize("value", ["\u00b2", "\u0661"])
def test_a_retry_after_is_ascii_digits(value: str) -> None:
    """``Retry-After: ²`` raised an untyped ValueError; any value but ASCII digits or an
    HTTP date asks for no wait."""
    import httpx2
    from cmh.hub.resolver._http import retry_after

    headers = httpx2.Headers([(b"Retry-After", value.encode("utf-8"))])
    assert retry_after(headers) is None
    assert retry_after(httpx2.Headers({"Retry-After": "7"})) == 7.0
