"""Bytes that crossed the wire are counted, also for multi-range answers that were aborted.

Issue 26 item 6: an update whose multi-range answers were cut, or whose
assembly was given up for a whole download, reported 0 bytes (or the whole
download's only) though megabytes had come over the wire. A real ``cmh serve``
(multipart answers) behind the fault proxy, which cuts or damages answers that
ask for several ranges only.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import cmh.hub as hub
import pytest
from cmh.hub.cache import RepoLayout
from cmh.hub.mirror import add_folder
from cmh.hub.resolver._http import HubClient, RangeNotSatisfied
from resolver_support import Fault, FaultProxy, write_checkpoint_repo

REPO = "org/ranges"


def _version(folder, version: int):
    """16 tensors, three of 240 kB changed apart: an update is one multi-range request."""
    return write_checkpoint_repo(folder, version, count=16, elems=60_000, changed=(1, 5, 9))


@pytest.fixture
def updated(tmp_path, mirror_server_factory):
    """v1 resolved into a cache through a fault proxy, then v2 published."""
    store = tmp_path / "store"
    add_folder(store, _version(tmp_path / "v1", 1), REPO)
    proxy = FaultProxy(mirror_server_factory(store).url)
    cache = tmp_path / "cache"
    first = hub.resolve(REPO, cache_dir=cache, endpoint=proxy.url)
    add_folder(store, _version(tmp_path / "v2", 2), REPO)
    try:
        yield proxy, cache, first
    finally:
        proxy.stop()


def _multi_range_requests(proxy: FaultProxy) -> int:
    return sum(1 for _, path, r in proxy.stats.requests if r and "," in r and "/resolve/" in path)


def test_cut_multi_range_answers_of_a_named_commit_raise_not_stale(updated):
    """Every multi-range answer of the update cut: the Hub named the new commit, so the
    old snapshot is not served stale (spec/resolver.md §3); the error says so."""
    proxy, cache, first = updated
    cut = Fault("drop", times=1000, at=20_000, multi_range=True)
    proxy.faults.append(cut)
    with pytest.raises(hub.HubUnreachableError, match="the Hub named commit") as caught:
        hub.resolve(REPO, cache_dir=cache, endpoint=proxy.url, policy=hub.Policy(revalidate=True))
    assert first.commit[:12] not in str(caught.value)
    assert cut.applied >= 2 and cut.applied == _multi_range_requests(proxy)
    layout = RepoLayout(cache, REPO)
    assert layout.read_ref("main") == first.commit


def test_an_update_given_up_for_a_whole_download_counts_both(updated):
    proxy, cache, _ = updated
    damaged = Fault("corrupt", times=1, at=50_000, multi_range=True)
    proxy.faults.append(damaged)
    res = hub.resolve(REPO, cache_dir=cache, endpoint=proxy.url, policy=hub.Policy(revalidate=True))
    weights = next(f for f in res.files if f.path == "model.safetensors")
    assert damaged.applied == 1
    assert weights.action is hub.Action.DOWNLOADED  # the assembly failed its check
    assert any("assembled file failed its check" in w for w in res.warnings)
    # The whole file, plus the update's header read (128 KiB) and the damaged ranges
    # (the check stopped the rest): not the whole download's bytes only.
    changed = 3 * 60_000 * 4
    extra = weights.bytes_transferred - weights.size
    assert (128 << 10) < extra <= (128 << 10) + changed
    assert weights.bytes_transferred <= res.bytes_transferred


def test_a_whole_body_answer_to_several_ranges_counts_what_arrived():
    """A CDN answers several ranges with 200 and its whole body, at once (huggingface.co's
    does): the client gives it up unread and counts the body bytes that had reached it.

    A loopback server that sends the answer in one write stands in for the CDN; the
    Hub-like front's CDN relays its body after its headers, so whether any of it arrives
    before the client closes is a race there.
    """
    body = bytes(1 << 20)
    listener = socket.create_server(("127.0.0.1", 0))
    closed = threading.Event()

    def cdn() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the request
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            with contextlib.suppress(OSError):
                conn.sendall(head + body)  # until the client's window is full and it closes
            closed.wait(10)

    server = threading.Thread(target=cdn, daemon=True)
    server.start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    client = HubClient(endpoint, None)
    try:
        with pytest.raises(RangeNotSatisfied):
            url = f"{endpoint}/org/x/resolve/main/w.bin"
            client.stream_ranges(url, [(0, 10), (99, 110)], lambda offset, data: None)
    finally:
        closed.set()
        listener.close()
    server.join(10)
    assert client.requests == 1
    assert 0 < client.bytes_received <= len(body)  # was 0: an aborted answer counted nothing
