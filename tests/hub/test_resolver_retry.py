"""The resolver's one retry policy against a real ``cmh serve`` behind a loopback proxy.

The proxy answers chosen requests with 429/503 (with or without ``Retry-After``);
the policy must wait what the server asks, capped, and otherwise back off with
jitter. Waits are recorded through the policy's ``sleep`` (the delays it chose);
one case checks at the proxy that a real resolve did wait.
"""

from __future__ import annotations

import email.utils
import hashlib
import time
from pathlib import Path

import cmh.hub as hub
import pytest
from cmh.hub.mirror import add_folder
from cmh.hub.resolver import HubUnreachableError
from cmh.hub.resolver._http import HubClient
from cmh.hub.resolver._retry import RetryPolicy
from mirror_support import MirrorServer
from resolver_support import Fault, FaultProxy, write_checkpoint_repo

REPO = "org/toy"


class Recorder:
    """A ``sleep`` that records the delays asked for and does not wait."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


#: The repo the resumed-download tests pull (4 tensors of 2 MiB).
RESUMED = "org/resumed"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One ``cmh serve`` for the module (the subject is the client's retry policy, not the
    server; no test changes the store): org/toy and org/resumed, and org/toy's source."""
    base = tmp_path_factory.mktemp("retry-hub")
    store = base / "store"
    src = write_checkpoint_repo(base / "v1", 1)
    add_folder(store, src, REPO)
    add_folder(store, write_checkpoint_repo(base / "src", 1, count=4, elems=1 << 19), RESUMED)
    with MirrorServer(store, base / "logs") as server:
        yield server, src


@pytest.fixture
def proxied(served):
    server, src = served
    proxy = FaultProxy(server.url)
    proxy.source = src / "model.safetensors"
    yield proxy
    proxy.stop()


def fetch_with(policy: RetryPolicy, proxy: FaultProxy) -> bytes:
    client = HubClient(proxy.url)
    commit = client.revision(REPO, "model", "main").commit
    url = client.file_url(REPO, "model", commit, "model.safetensors")
    body = bytearray()

    def step() -> bytes:
        body.clear()
        client.stream(url, 0, body.extend)
        return bytes(body)

    return policy.run(step, "model.safetensors")


def model_gets(proxy: FaultProxy) -> list[float]:
    return [
        at
        for (method, path, _), at in zip(proxy.stats.requests, proxy.stats.arrived, strict=True)
        if method == "GET" and path.endswith("/model.safetensors")
    ]


def test_resolve_waits_what_a_429_asks(proxied, tmp_path):
    proxied.faults.append(Fault("status", status_code=429, retry_after="1"))
    res = hub.resolve(REPO, endpoint=proxied.url, cache_dir=tmp_path / "cache")
    model = res.path / "model.safetensors"
    assert (
        hashlib.sha256(model.read_bytes()).digest()
        == hashlib.sha256(proxied.source.read_bytes()).digest()
    )
    first, second = model_gets(proxied)
    assert second - first >= 1.0  # before: retried after 0.05 s, whatever the server asked


def test_retry_after_is_capped_and_http_dates_are_read(proxied):
    later = email.utils.formatdate(time.time() + 3, usegmt=True)
    proxied.faults += [
        Fault("status", status_code=429, retry_after="3600"),
        Fault("status", status_code=503, retry_after=later),
    ]
    recorder = Recorder()
    body = fetch_with(RetryPolicy(max_retry_after=5.0, sleep=recorder), proxied)
    assert body == proxied.source.read_bytes()
    assert recorder.delays[0] == 5.0  # an hour asked, the cap given
    assert 1.0 < recorder.delays[1] <= 3.0  # an HTTP date about 3 s ahead
    assert len(recorder.delays) == 2


def test_backoff_without_retry_after_is_exponential_with_jitter(proxied):
    runs = []
    for _ in range(2):
        proxied.faults.append(Fault("status", status_code=503, times=4))
        recorder = Recorder()
        policy = RetryPolicy(base_delay=0.05, max_delay=0.2, sleep=recorder)
        assert fetch_with(policy, proxied) == proxied.source.read_bytes()
        assert len(recorder.delays) == 4
        for attempt, delay in enumerate(recorder.delays):
            ceiling = min(0.2, 0.05 * 2**attempt)
            assert ceiling / 2 <= delay <= ceiling
        runs.append(recorder.delays)
    assert runs[0] != runs[1]  # jitter: two clients failing together come back apart


def test_retries_run_out_with_a_typed_error(proxied):
    proxied.faults.append(Fault("status", status_code=503, times=10))
    recorder = Recorder()
    with pytest.raises(hub.HubUnreachableError, match="failed after 3 tries"):
        fetch_with(RetryPolicy(attempts=3, sleep=recorder), proxied)
    assert len(recorder.delays) == 2  # no wait after the last try
    assert len(model_gets(proxied)) == 3


def test_a_retry_that_gives_up_at_its_deadline_counts_its_tries() -> None:
    def step() -> None:
        raise HubUnreachableError("connection refused")

    policy = RetryPolicy(sleep=lambda seconds: None)
    with pytest.raises(HubUnreachableError) as raised:
        policy.run(step, "GET http://127.0.0.1:9/x", deadline=time.monotonic(), notice=False)
    assert "try 1 of 6" in str(raised.value) and "tries)" not in str(raised.value)
    with pytest.raises(HubUnreachableError) as raised:
        policy.run(step, "GET http://127.0.0.1:9/x", notice=False)
    assert "failed after 6 tries" in str(raised.value)


@pytest.mark.parametrize("connections", [1, 2], ids=["one-connection", "chunked"])
def test_a_resumed_download_shows_progress_from_where_it_stopped(
    tmp_path, served, connections
) -> None:
    """The bar of a resumed pull starts at the bytes the partial already holds: the shown
    counts add up to the file's size, while only the rest is received."""
    from cmh.hub.resolver import Policy

    url = served[0].url
    policy = Policy(offline=False, connections=connections, chunk_bytes=1 << 20)
    first = hub.resolve(RESUMED, cache_dir=tmp_path / "first", endpoint=url, policy=policy)
    weights = Path(first.path) / "model.safetensors"
    data = weights.read_bytes()
    etag = hashlib.sha256(data).hexdigest()
    fresh = tmp_path / "fresh"
    partial = fresh / f"models--{RESUMED.replace('/', '--')}" / "blobs" / f"{etag}.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[: len(data) // 2])  # an interrupted whole download
    shown: list[int] = []
    totals: list[int] = []
    second = hub.resolve(RESUMED, cache_dir=fresh, endpoint=url, policy=policy,
                         progress=shown.append, on_total=totals.append)  # fmt: skip
    resumed = [f for f in second.files if f.action.value == "resumed"]
    assert [f.path for f in resumed] == ["model.safetensors"]
    assert sum(shown) == totals[0], (sum(shown), totals)
    held = resumed[0].bytes_reused  # the prefix (whole chunks of it, when chunked)
    assert 0 < held <= len(data) // 2 and resumed[0].bytes_transferred == len(data) - held


def test_a_retry_sleeps_the_pause_its_deadline_was_checked_against(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The jitter is drawn once per pause: checked against the deadline, then slept. Two
    draws (one to check, another to sleep) let a long second draw sleep past the
    deadline (a loaded run of test_pull_budget slept 0.27 s of a 0.2 s budget)."""
    from cmh.hub.resolver import _retry
    from mirror_support import ManualClock

    draws = iter([0.0, 1.0] * 10)  # low, high, low, high...: the fraction of the jitter
    monkeypatch.setattr(_retry.random, "uniform", lambda a, b: a + next(draws) * (b - a))
    clock = ManualClock()
    policy = RetryPolicy(clock=clock)
    start = clock.now

    def step() -> None:
        raise HubUnreachableError("no answer")

    with pytest.raises(HubUnreachableError, match="the deadline comes before the next"):
        policy.run(step, "GET x", start + 0.12, notice=False)
    # 0.025 slept after the first try (its draw low); the second try's pause (0.1, its
    # draw high) would end past the deadline: given up without sleeping it
    assert clock.now - start == pytest.approx(0.025, abs=1e-6)


def test_an_answer_that_is_not_http_is_said_to_be_one() -> None:
    """A Hub (or a proxy before it) answering with a header line that has no colon: the
    error said "cannot reach http://...: illegal header line: bytearray(b'...')", for a
    server that was reached, in Python's repr. It says the answer broke the protocol,
    and the line as text."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_garbled() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Bad header without colon\r\n\r\n")

    threading.Thread(target=answer_garbled, daemon=True).start()
    try:
        client = HubClient(f"http://127.0.0.1:{port}")
        with pytest.raises(HubUnreachableError) as raised:
            client.revision(REPO, "model", "main")
    finally:
        listener.close()
    said = str(raised.value)
    assert "the answer broke the HTTP protocol" in said, said
    assert "'X-Bad header without colon'" in said and "bytearray" not in said, said
    assert "cannot reach" not in said, said
