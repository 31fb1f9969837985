"""Issue 35: what a remote party can grow is bounded, every wait has a total deadline, CPU
work runs apart, and a fill outlives a short upstream outage."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cmh.hub.cache import SYSTEM_CLOCK, Clock
from cmh.hub.mirror import _upstream
from cmh.hub.mirror._memo import KeyedLocks, Memo
from cmh.hub.mirror._upstream import Outcome, Upstream, UpstreamConfig, UpstreamError
from cmh.hub.mirror.stores import open_store
from deadline_support import TEST_DEADLINE
from hostile_upstream import COMMIT, DripOrHub, HostileHub
from loop_server import LoopServer


class FakeClock(Clock):
    """Time that moves only when slept (or moved): retry schedules run at once."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.on_sleep: Any = None

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.now)


def refused_url() -> tuple[str, socket.socket]:
    """A loopback port that refuses connections (bound, not listening) and its socket."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return f"http://127.0.0.1:{sock.getsockname()[1]}", sock


def make_upstream(tmp_path: Path, url: str, store: str | None = None) -> Upstream:
    """An upstream of ``url`` filling ``store`` (a folder or bucket URL; else a folder)."""
    backend = open_store(store or tmp_path / "store")
    upstream = Upstream(backend.pull_through(300.0), UpstreamConfig(url))
    upstream.clock = FakeClock()
    return upstream


@pytest.fixture(params=["folder", "bucket"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store kind a pull-through fills: a folder, a bucket (moto)."""
    if request.param == "folder":
        return str(tmp_path / "store")
    from bucket_support import use_bucket

    bucket = request.getfixturevalue("moto_bucket")
    use_bucket(bucket, tmp_path, request.getfixturevalue("monkeypatch"))
    backend = open_store(bucket.url)
    backend.create()
    return str(bucket.url)


# -- 1. bounded structures -----------------------------------------------------------------


def test_keyed_locks_hold_only_the_keys_in_use() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with locks.hold("a"):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(TEST_DEADLINE)
    for i in range(1000):
        with locks.hold(f"k{i}"):
            pass
    assert len(locks) == 1  # only the key still held
    release.set()
    t.join(10)
    assert len(locks) == 0


def test_exclusive_memo_computes_one_key_without_holding_up_another() -> None:
    memo: Memo[str, int] = Memo(8)
    started, release = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        release.wait(10)
        return 1

    t = threading.Thread(
        target=memo.get_or_compute, args=("slow", slow), kwargs={"exclusive": True}
    )
    t.start()
    assert started.wait(TEST_DEADLINE)
    # Another key is answered while "slow" computes (before: one lock for every key).
    assert memo.get_or_compute("fast", lambda: 2, exclusive=True) == 2
    release.set()
    t.join(10)
    assert memo.get("slow") == 1


def test_unknown_names_leave_a_bounded_negative_cache_and_no_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 unknown names left 20,000 locks and cached errors; now at most MAX_NEGATIVE
    outcomes and no lock once no request is under way."""
    monkeypatch.setattr(_upstream, "MAX_NEGATIVE", 50, raising=False)
    url, sock = refused_url()
    try:
        upstream = make_upstream(tmp_path, url)
        for i in range(300):
            with pytest.raises(UpstreamError) as caught:
                upstream.prepare("model", f"nobody/n{i}", "main")
            assert caught.value.status == 503
        assert len(upstream._failed) <= 50
        assert len(upstream._keys) == 0
    finally:
        sock.close()


def test_a_cached_failure_is_an_outcome_and_each_raise_is_fresh(tmp_path: Path) -> None:
    """The cached exception kept the 32 MiB read buffer through its traceback, and was
    re-raised, its traceback growing at every request."""
    url, sock = refused_url()
    try:
        upstream = make_upstream(tmp_path, url)
        errors = []
        for _ in range(5):
            with pytest.raises(UpstreamError) as caught:
                upstream.prepare("model", "nobody/x", "main")
            errors.append(caught.value)
        kept = upstream._failed.get(("model", "nobody/x", "main"))
        assert isinstance(kept, Outcome) and kept.status == 503
        assert len({id(e) for e in errors}) == 5  # never the same object raised again
        for e in errors[1:]:
            assert e.__context__ is None and e.__cause__ is None
            tb, depth = e.__traceback__, 0
            while tb is not None:
                depth, tb = depth + 1, tb.tb_next
            assert depth <= 3  # this test's frame and prepare's: it does not grow
    finally:
        sock.close()


def test_failed_fills_are_kept_as_outcomes_within_their_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cmh.hub.mirror import _filling

    monkeypatch.setattr(_filling, "MAX_FAILED_FILLS", 20, raising=False)

    class Refusing:
        clock = SYSTEM_CLOCK  # an Upstream's clock: the negative cache's

        def fill(self, *args: Any) -> None:
            raise UpstreamError(503, "UpstreamUnavailable", "down", {"Retry-After": "30"})

    async def run() -> _filling.Fills:
        fills = _filling.Fills(Refusing())  # type: ignore[arg-type]
        for i in range(200):
            fut = fills.start("model", "o/r", "c" * 40, f"f{i}", Path(f"/nowhere/{i}"))
            with pytest.raises(UpstreamError):
                await fut
        await asyncio.sleep(0)
        return fills

    fills = asyncio.run(run())
    assert len(fills._failed) <= 20
    outcome = fills.recent_failure(Path("/nowhere/199"))
    assert isinstance(outcome, Outcome) and outcome.status == 503


def test_commit_indexes_kept_are_bounded(tmp_path: Path) -> None:
    from cmh.hub.cache import RepoLayout
    from cmh.hub.mirror._index import INDEX_BASE, IndexCache

    cache = IndexCache(size=8 * (INDEX_BASE + 1))  # an empty commit: its root folder
    repo = RepoLayout(tmp_path, "o/r")
    for i in range(100):
        cache.get(repo, f"{i:040x}")
    assert len(cache) == 8


def test_kept_commit_indexes_are_bounded_by_their_entries_not_their_number() -> None:
    """Was: 256 indexes per worker whatever their size: a hostile upstream listing 99,000
    files in each of a few repos grew a worker by about 200 MB per repo (up to 30 GB).
    Now the indexes (and a bucket's tree objects) weigh their entries in one bound."""
    from cmh.hub.mirror._index import INDEX_BASE, CommitIndex, index_weight
    from cmh.hub.mirror._memo import Memo

    def index(files: int) -> CommitIndex:
        entries: dict[str, Any] = {f"f{i}": None for i in range(files)}
        return CommitIndex("0" * 40, entries, {"": "0" * 40}, 0.0)

    memo: Memo[str, CommitIndex] = Memo(3 * INDEX_BASE + 3_000, weight=index_weight)
    for name in ("a", "b", "c"):
        memo.put(name, index(999))
    assert len(memo) == 3
    memo.put("d", index(999))  # the least recently used goes
    assert memo.get("a") is None and len(memo) == 3
    memo.put("huge", index(10_000))  # heavier than the whole bound: not kept, none evicted
    assert memo.get("huge") is None and len(memo) == 3


# -- 3. CPU-heavy work apart ---------------------------------------------------------------


def test_a_revision_answers_while_fingerprints_compute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 16 fingerprint requests in flight (their computation held), a revision request
    is answered: before, each took a thread of the worker's 6 and the rest waited on one
    global lock, so the revision waited for the fingerprints."""
    from concurrent.futures import ThreadPoolExecutor

    import aiohttp
    from aiohttp.test_utils import TestServer
    from cmh.hub.mirror import _fingerprints
    from cmh.hub.mirror._app import MirrorState, make_app
    from cmh.hub.mirror._auth import AccessPolicy
    from cmh.hub.mirror._observe import Metrics
    from cmh.hub.mirror.stores.local._folder import add_folder
    from mirror_support import write_tiny_repo

    import cmh.semantic

    store = tmp_path / "store"
    add_folder(store, write_tiny_repo(tmp_path / "src", 1), "o/r")
    release = threading.Event()
    started = threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(60)
        raise cmh.semantic.SemanticError("held")

    monkeypatch.setattr(_fingerprints, "_in_process", held)  # the computation, in-thread

    async def run() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(6))  # as on 2 cores: min(32, 2 + 4)
        state = MirrorState(open_store(store), AccessPolicy({}), Metrics(None))
        server = TestServer(make_app(state), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                base = str(server.make_url(""))
                fingerprints = [
                    asyncio.ensure_future(session.get(f"{base}/api/cmh/fingerprint/o/r/main"))
                    for _ in range(16)
                ]
                await loop.run_in_executor(None, started.wait, 30)
                await asyncio.sleep(0.1)  # the other fingerprint requests are in, too
                async with asyncio.timeout(30):
                    async with session.get(f"{base}/api/models/o/r/revision/main") as r:
                        status = r.status
                assert not any(f.done() for f in fingerprints)  # still computing
                release.set()
                answers = await asyncio.gather(*fingerprints)
                for a in answers:
                    a.release()
                return status, answers[0].status
        finally:
            release.set()
            await server.close()
            state.compute.close()

    revision, fingerprint = asyncio.run(run())
    assert revision == 200 and fingerprint == 422


def test_card_front_matter_with_aliases_or_oversized_is_ignored() -> None:
    from cmh.hub.mirror._front_matter import MAX_FRONT_MATTER_BYTES, read_front_matter

    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    fm = read_front_matter(f"---\n{bomb}---\n# body\n")
    assert fm.data is None and fm.problem is not None and "alias" in fm.problem
    big = "---\n" + "".join(f"k{i}: v\n" for i in range(MAX_FRONT_MATTER_BYTES // 6)) + "---\n"
    fm = read_front_matter(big + "# body\n")
    assert fm.data is None and fm.problem is not None and "KiB" in fm.problem
    assert read_front_matter("---\nlicense: mit\n---\n# body\n").data == {"license": "mit"}


# -- a hostile upstream for a real `cmh serve --upstream` ----------------------------------


class Hostile(LoopServer):
    """Any ``big/*`` revision: a gzip body over ``oversized`` bytes once decoded (32 MiB,
    the largest API answer a server accepts by default); any ``drip/*`` one: a body sent
    a byte every 50 ms, never ending; any other name: 404 RepoNotFound."""

    def __init__(self, oversized: int = 32 << 20) -> None:
        super().__init__("127.0.0.1")
        raw = b'{"sha": "' + b" " * (oversized + (1 << 20)) + b'"}'
        self.bomb = __import__("gzip").compress(raw, 6)

    async def handler(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/api/models/big/"):
            headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
            return web.Response(body=self.bomb, headers=headers)
        if request.path.startswith("/api/models/drip/"):
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            try:
                await response.write(b"{")
                for _ in range(2400):  # 120 s at most
                    await asyncio.sleep(0.05)
                    await response.write(b" ")
            except (ConnectionError, RuntimeError):
                pass
            return response
        return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _ask_all(base: str, paths: list[str], concurrency: int = 8) -> list[int]:
    """GET every path, ``concurrency`` at a time, each on its own keep-alive connection."""
    import aiohttp

    statuses: list[int] = []
    queue = list(reversed(paths))
    timeout = aiohttp.ClientTimeout(total=60)

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            path = queue.pop()
            async with session.get(base + path) as r:
                await r.read()
                statuses.append(r.status)

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return statuses


#: Growth of the server's RSS allowed over the test below (docs/mirror.md, "Bounds").
RSS_GROWTH_BOUND_MIB = 48
#: Issue 35's counts (1,000 oversized upstream answers, 20,000 unknown repo names) with
#: ``CMH_BOUNDS_FULL=1``: about 90 s on 2 busy cores (the server spends ~2 ms of CPU on
#: each unknown name, ~9 ms on each oversized answer). By default a tenth of each: an
#: oversized answer kept alive still shows (100 MiB or more).
FULL = os.environ.get("CMH_BOUNDS_FULL") == "1"
OVERSIZED, UNKNOWN = (1000, 20_000) if FULL else (100, 2000)
#: The largest API answer the server accepts in this test (``CMH_MAX_API_BYTES``): each
#: oversized answer is 2 MiB decoded, not 33, so 1,000 take seconds; an answer kept
#: alive (the old bug) still costs 1 MiB or more per name, 1 GB over the test.
SMALL_API_LIMIT = 1 << 20


def test_oversized_answers_and_unknown_names_leave_rss_bounded(tmp_path: Path) -> None:
    """Each oversized upstream answer kept ~33 MB (RSS 64 -> 729 MB after 21 requests);
    20,000 unknown names kept 51.8 MB. Now the server's RSS stays within a bound."""
    from mirror_support import MirrorServer

    store = tmp_path / "pull"
    store.mkdir()
    env = {**os.environ, "CMH_MAX_API_BYTES": str(SMALL_API_LIMIT)}
    with Hostile(SMALL_API_LIMIT) as upstream:
        server = MirrorServer(
            store, tmp_path / "logs", extra_args=("--upstream", upstream.url), env=env
        )
        try:
            base = server.url
            warm = [f"/api/models/big/w{i}/revision/main" for i in range(4)]
            warm += [f"/api/models/nobody/w{i}/revision/main" for i in range(100)]
            asyncio.run(_ask_all(base, warm))
            before = _rss_kib(server.process.pid)
            big = [f"/api/models/big/b{i}/revision/main" for i in range(OVERSIZED)]
            big += ["/api/models/big/b0/revision/main"] * 20  # the same failure, shared
            unknown = [f"/api/models/nobody/n{i}/revision/main" for i in range(UNKNOWN)]
            statuses = asyncio.run(_ask_all(base, big + unknown))
            after = _rss_kib(server.process.pid)
        finally:
            server.stop()
    assert statuses.count(502) == OVERSIZED + 20 and statuses.count(404) == UNKNOWN
    grown = (after - before) / 1024
    print(f"RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB (+{grown:.1f}) after {OVERSIZED} "
          f"oversized answers and {UNKNOWN} unknown names")  # fmt: skip
    assert grown < RSS_GROWTH_BOUND_MIB, (before, after)


# -- 2. total deadlines --------------------------------------------------------------------


def test_a_drip_fed_upstream_answer_ends_in_a_typed_error(tmp_path: Path) -> None:
    """An upstream sending one byte at a time held a mirror request forever (no answer
    after 200 s). The API request's total deadline (HF_HUB_ETAG_TIMEOUT, 2 s here) ends it;
    so does the incoming request's."""
    import os

    from mirror_support import MirrorServer

    store = tmp_path / "pull"
    store.mkdir()
    env = {**os.environ, "HF_HUB_ETAG_TIMEOUT": "2"}
    with Hostile() as upstream:
        server = MirrorServer(
            store, tmp_path / "logs", extra_args=("--upstream", upstream.url), env=env
        )
        try:
            # generous: the deadline under test is 2 s; the old code never answered
            statuses = asyncio.run(_ask_all(server.url, ["/api/models/drip/x/revision/main"]))
        finally:
            server.stop()
    assert statuses == [503]


# -- 4. a fill outlives a short outage -----------------------------------------------------


class OnPort(HostileHub):
    """A :class:`HostileHub` on a given port (the one a refused upstream had)."""

    def __init__(self, port: int, files: dict[str, bytes]) -> None:
        self.port = port
        super().__init__(files=files)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.url = f"http://{self.host}:{self.port}"


def test_a_fill_retries_an_upstream_that_refuses_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    """A 3 s upstream restart failed fills (4 tries in 1.8 s, all refused). A fill now
    retries for FILL_RETRY_BUDGET s on the upstream's clock: here the upstream refuses for
    10 s of that clock, then answers, and the fill completes."""
    monkeypatch.setattr(_upstream, "FILL_RETRY_FIRST", 4.0, raising=False)  # fewer tries
    data = b"weights " * 1000
    files = {"config.json": b"{}\n", "model.bin": data}
    with HostileHub(files=files) as first:
        upstream = make_upstream(tmp_path, first.url, store_url)
        upstream.prepare("model", "evil/repo", "main")  # the listing is held
        port = int(first.url.rsplit(":", 1)[1])
    # nothing listens on the port now: every connection is refused
    clock = upstream.clock
    assert isinstance(clock, FakeClock)
    back: list[HostileHub] = []

    def restart(now: float) -> None:
        if now >= 1010.0 and not back:
            back.append(OnPort(port, files).start())

    clock.on_sleep = restart
    try:
        upstream.fill("model", "evil/repo", COMMIT, "model.bin")
    finally:
        for hub in back:
            hub.stop()
    assert back and sum(clock.slept) >= 10.0
    backend = open_store(store_url)
    index = backend.resolve("model", "evil/repo", COMMIT)
    assert index is not None
    with backend.opener(index.files["model.bin"]) as f:
        assert f.read() == data


def test_a_fill_gives_up_after_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_upstream, "FILL_RETRY_FIRST", 10.0)  # fewer tries, the same budget
    monkeypatch.setattr(_upstream, "FILL_RETRY_MAX", 10.0)
    with HostileHub() as first:
        upstream = make_upstream(tmp_path, first.url)
        upstream.prepare("model", "evil/repo", "main")
    clock = upstream.clock
    assert isinstance(clock, FakeClock)
    with pytest.raises(UpstreamError) as caught:
        upstream.fill("model", "evil/repo", COMMIT, "config.json")
    assert caught.value.status == 503
    assert _upstream.FILL_RETRY_BUDGET - 10.0 <= sum(clock.slept) <= _upstream.FILL_RETRY_BUDGET


@pytest.mark.parametrize("unit", ["*_", "a*", "**a", "_a"])
def test_a_card_full_of_emphasis_markers_is_shown_as_text(unit: str) -> None:
    """500 KB of emphasis markers cost 7.5 s to render; past MAX_CARD_EMPHASIS the card is
    shown as text (the check counts, it does not time)."""
    from cmh.hub.mirror.web._cards import MAX_CARD_EMPHASIS, _read_card

    card = _read_card((unit * (500_000 // len(unit))).encode())
    assert any("shown as text" in n for n in card.notes)
    assert str(MAX_CARD_EMPHASIS) in " ".join(card.notes)
    fine = _read_card(b"# title\n\nsome *emphasis* and __strong__ words\n")
    assert "<em>emphasis</em>" in fine.html and not fine.notes


def test_the_compute_pool_limits_each_client_and_forgets_idle_ones() -> None:
    """Six unauthenticated requests stalled a worker; now a client has at most
    ``per_client`` computations under way and another client is not held up by it."""
    from cmh.hub.mirror._compute import ComputePool

    pool = ComputePool(workers=4, per_client=2)  # threads to spare: the limit is the client's
    release = threading.Event()
    running: list[str] = []

    def work(who: str) -> str:
        running.append(who)
        release.wait(30)
        return who

    async def run() -> list[str]:
        loop = asyncio.get_running_loop()
        greedy = [asyncio.ensure_future(pool.run("a", work, "a")) for _ in range(6)]
        while len(running) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert running == ["a", "a"]  # the other four wait, without a thread
        async with asyncio.timeout(30):
            async with pool.turn("b"):  # another client's turn is not held up
                pass
        await loop.run_in_executor(None, release.set)
        return await asyncio.gather(*greedy)

    try:
        assert asyncio.run(run()) == ["a"] * 6
        assert pool.clients() == 0
    finally:
        release.set()
        pool.close()


def test_fills_under_way_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fill holds a thread; a client naming many blobs (and leaving) started one per
    blob without bound."""
    from cmh.hub.mirror import _filling
    from cmh.hub.mirror._errors import HubError

    monkeypatch.setattr(_filling, "MAX_PENDING_FILLS", 5, raising=False)
    release = threading.Event()

    class Held:
        clock = SYSTEM_CLOCK

        def fill(self, *args: Any) -> None:
            release.wait(30)

    async def run() -> int:
        fills = _filling.Fills(Held())  # type: ignore[arg-type]
        started = []
        refused = 0
        for i in range(20):
            try:
                started.append(fills.start("model", "o/r", "c" * 40, f"f{i}", Path(f"/x/{i}")))
            except HubError as exc:
                assert exc.status == 503
                refused += 1
        await asyncio.get_running_loop().run_in_executor(None, release.set)
        await asyncio.gather(*started)
        return refused

    try:
        assert asyncio.run(run()) == 15
    finally:
        release.set()


def test_slow_revalidations_leave_the_request_threads_free(tmp_path: Path) -> None:
    """With as many drip-fed revalidations in flight as the worker has request threads, a
    stored repo's tree and the repo list timed out: the revalidations held every thread.
    They run on threads of their own now."""
    import os

    import aiohttp
    from mirror_support import MirrorServer

    drips = min(32, (os.cpu_count() or 1) + 4) + 2  # more than the default executor's threads
    store = tmp_path / "pull"
    store.mkdir()
    env = {**os.environ, "HF_HUB_ETAG_TIMEOUT": "60"}  # the drips stay in flight
    upstream = DripOrHub().start()
    server = MirrorServer(
        store, tmp_path / "logs", extra_args=("--upstream", upstream.url), env=env
    )

    def dripping() -> int:
        return sum(s.path.startswith("/api/models/drip/") for s in upstream.seen)

    async def run() -> tuple[list[int], bool]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async with session.get(f"{server.url}/api/models/evil/repo/tree/main") as first:
                assert first.status == 200  # now stored and fresh
            slow = [
                asyncio.ensure_future(
                    session.get(f"{server.url}/api/models/drip/d{i}/revision/main")
                )
                for i in range(drips)
            ]
            async with asyncio.timeout(30):  # the revalidations are under way
                while dripping() < 6:
                    await asyncio.sleep(0.05)
            statuses = []
            async with asyncio.timeout(20):  # generous; before: no answer at all
                for path in ("/api/models/evil/repo/tree/main", "/api/models"):
                    async with session.get(server.url + path) as r:
                        statuses.append(r.status)
            in_flight = not any(s.done() for s in slow)
            for s in slow:
                s.cancel()
            return statuses, in_flight

    try:
        statuses, in_flight = asyncio.run(run())
    finally:
        upstream.ending = True  # the drips end: the revalidations too, the server stops at once
        server.stop()
        upstream.stop()
    assert statuses == [200, 200] and in_flight


def test_a_compute_process_that_dies_is_a_503_and_the_next_call_starts_new_ones() -> None:
    from cmh.hub.mirror._compute import ComputePool
    from cmh.hub.mirror._errors import HubError

    pool = ComputePool(workers=1)
    try:
        first = pool.in_process(os.getpid)
        assert first != os.getpid()  # another process
        with pytest.raises(HubError) as died:
            pool.in_process(os._exit, 1)
        assert (died.value.status, died.value.code) == (503, "ComputeUnavailable")
        assert "compute process died" in died.value.message
        assert pool.in_process(os.getpid) not in (first, os.getpid())  # a new one
    finally:
        pool.close()


def test_errors_of_a_fingerprint_in_a_compute_process_keep_their_types(tmp_path: Path) -> None:
    """What the fingerprint's handling tells apart (an invalid file, not a model, an
    unreadable blob) comes back from the child as it was raised there."""
    from types import SimpleNamespace

    from cmh.hub.mirror import _fingerprints
    from cmh.hub.mirror._compute import ComputePool

    from cmh import InvalidFileError
    from cmh.semantic import SemanticError

    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "bert"}')
    state: Any = SimpleNamespace(compute=ComputePool(workers=1))
    try:
        with pytest.raises(SemanticError) as invalid:
            _fingerprints._in_process(state, {"model.safetensors": bad, "config.json": config}, "s")
        assert isinstance(invalid.value.__cause__, InvalidFileError), invalid.value.__cause__
        with pytest.raises(SemanticError) as empty:
            _fingerprints._in_process(state, {"config.json": config}, "s")
        assert not isinstance(empty.value.__cause__, InvalidFileError)
        with pytest.raises(FileNotFoundError) as unreadable:  # a read failing mid-hash
            state.compute.in_process(os.stat, tmp_path / "gone")
        assert unreadable.value.strerror
    finally:
        state.compute.close()
