"""Issue 35's latency bound, as a ratio measured in one run against one ``cmh serve``.

With 8 drip-fed upstream requests, or 8 fingerprint requests, in flight, a stored
repo's tree and a revision request answer within :data:`BOUND` times their latency
alone (before: the tree timed out at 30 s behind drips; a revision took 6.0 s instead
of 0.009 s behind fingerprints). Each latency is the median of :data:`SAMPLES`
requests after a warm-up, the "alone" one measured just before its load starts, so
both medians see the same machine; the fingerprint load is run up to :data:`ATTEMPTS`
times (new commits each), the bound holding in one. ``bench/bounds.py`` measures the
same with larger checkpoints. A checkpoint of :data:`TINY_TENSORS` tiny tensors makes a
fingerprint pure-Python work: on the compute pool's threads it held the GIL, and a tree
took 3-4x its time alone with one compute thread, 75-106x with two; in the pool's
processes it takes its own core. On a busy machine (load average above the core count)
the bound is :data:`BUSY_BOUND`, whose comment gives the reason (issue 40).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from hostile_upstream import DripOrHub
from mirror_support import MirrorServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _synthetic import make_checkpoint

#: Issue 35's bound: loaded latency within 3x the latency alone.
BOUND = 3.0
#: The bound on a busy machine (a load average above the core count, at the start or
#: the end of the measurement; issue 40): every wake-up of the server's threads then
#: waits its turn for a core, and a 1 ms answer took 15-17 ms with the drips in flight
#: at load 15-33 (CPU queueing, not the server's design). The old code's failures stay
#: far beyond it: the tree timed out at 30 s behind drips, a revision took 667x its time
#: behind fingerprints, and 75-106x behind Python-bound ones. ``bench/bounds.py``
#: measures the 3x on a quiet machine.
BUSY_BOUND = 30.0
#: Requests in flight that load the server (the issue's 8).
LOAD = 8
#: Requests per median (each of the tree and the revision), after WARMUP of each.
SAMPLES, WARMUP = 40, 3
#: The fingerprinted checkpoint: hashing it takes tens of ms, so the load outlasts the
#: loaded samples (checked). Thousands of tiny tensors instead make the work Python-bound
#: (the GIL): then 1 ms became 3-4 ms with one compute thread, 66-109 ms with two.
CHECKPOINT_BYTES, TENSORS = 64 << 20, 32
#: Fingerprint loads measured at most (each with commits of its own, not computed yet);
#: the bound must hold in one: a busy machine's noise only makes a run slower, where
#: the old code (6.0 s against 0.009 s) fails every one.
ATTEMPTS = 2
#: The Python-bound checkpoint: this many tensors of a few bytes each.
TINY_TENSORS = 12_000
#: What is measured: a stored repo's tree and its revision.
PROBES = ("/api/models/evil/repo/tree/main", "/api/models/evil/repo/revision/main")


class _ServingImports(DripOrHub):
    """:class:`DripOrHub` that also says ``fp/m`` (imported into the store, not pulled
    through) is public: the mirror asks who may read a held commit once per
    ``--fresh-for``, and the upstream decides it in pull-through mode (spec 8.1)."""

    async def handler(self, request: web.Request) -> web.StreamResponse:
        prefix = "/api/models/fp/m/"
        if request.path == prefix + "auth-check":
            return web.json_response({})
        if request.path.startswith(prefix + "revision/"):
            sha = request.path.rsplit("/", 1)[1]
            return web.json_response({"id": "fp/m", "sha": sha, "private": False})
        return await super().handler(request)


@dataclass
class Served:
    server: MirrorServer
    upstream: DripOrHub
    commits: list[str]  # the commits to fingerprint, pinned (no revalidation)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One ``cmh serve --upstream`` for the module: ``evil/repo`` pulled through (the
    stored repo measured), ``drip/*`` revisions drip-fed, and LOAD * ATTEMPTS imported
    commits of a checkpoint to fingerprint."""
    from cmh.hub.mirror import add_folder

    tmp = tmp_path_factory.mktemp("latency")
    store = tmp / "store"
    src = tmp / "src"
    make_checkpoint(src / "model.safetensors", CHECKPOINT_BYTES, TENSORS)
    commits = []  # a fingerprint is kept per commit: each load asks LOAD commits not asked yet
    for i in range(LOAD * ATTEMPTS):
        (src / "config.json").write_text(f'{{"model_type": "bert", "version": {i}}}\n')
        commits.append(add_folder(store, src, "fp/m", revision=f"v{i}").commit)
    env = {**os.environ, "HF_HUB_ETAG_TIMEOUT": "60"}  # the drips stay in flight
    upstream = _ServingImports().start()
    server = MirrorServer(store, tmp / "logs", extra_args=("--upstream", upstream.url), env=env)
    try:
        yield Served(server, upstream, commits)
    finally:
        upstream.ending = True  # the drips end: so do the revalidations
        server.stop()
        upstream.stop()


async def _medians(session: aiohttp.ClientSession, base: str) -> list[float]:
    """The median latency of each probe, over SAMPLES requests taken in turn."""
    times: list[list[float]] = [[] for _ in PROBES]
    for round_ in range(WARMUP + SAMPLES):
        for i, path in enumerate(PROBES):
            start = time.perf_counter()
            async with session.get(base + path) as r:
                await r.read()
                assert r.status == 200, (path, r.status)
            if round_ >= WARMUP:
                times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _busy() -> bool:
    """More runnable work than cores (the 1-minute load average)."""
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def _bound(busy_at_start: bool) -> float:
    """:data:`BOUND`, or :data:`BUSY_BOUND` when the machine was busy at the start or is
    now (the load average lags: either end may be the one that saw it)."""
    return BUSY_BOUND if busy_at_start or _busy() else BOUND


def _ratio(what: str, alone: list[float], loaded: list[float], bound: float) -> float:
    """The larger ratio of the probes' medians, loaded to alone (each printed)."""
    ratios = [b / a for a, b in zip(alone, loaded, strict=True)]
    for path, a, b, ratio in zip(PROBES, alone, loaded, ratios, strict=True):
        print(f"{what}: {path} alone {a * 1000:.1f} ms, loaded {b * 1000:.1f} ms, "
              f"{ratio:.2f}x (bound {bound:g}x)")  # fmt: skip
    return max(ratios)


def test_a_stored_repo_answers_within_3x_with_drip_fed_revalidations(served: Served) -> None:
    base, upstream = served.server.url, served.upstream

    def dripping() -> int:
        return sum(s.path.startswith("/api/models/drip/") for s in upstream.seen)

    async def run() -> tuple[list[float], list[float], bool]:
        timeout = aiohttp.ClientTimeout(total=60)
        async with (
            aiohttp.ClientSession(timeout=timeout) as probe,
            aiohttp.ClientSession(timeout=timeout) as loader,
        ):
            alone = await _medians(probe, base)  # the first request fills evil/repo
            drips = [
                asyncio.ensure_future(loader.get(f"{base}/api/models/drip/d{i}/revision/main"))
                for i in range(LOAD)
            ]
            async with asyncio.timeout(30):  # every drip has reached the upstream
                while dripping() < LOAD:
                    await asyncio.sleep(0.02)
            loaded = await _medians(probe, base)
            in_flight = not any(d.done() for d in drips)
            for d in drips:
                d.cancel()
            return alone, loaded, in_flight

    busy = _busy()
    try:
        alone, loaded, in_flight = asyncio.run(run())
    finally:
        upstream.ending = True  # the server's revalidations end too, before the next test
    assert in_flight  # the load lasted the whole measurement
    bound = _bound(busy)
    assert _ratio("drip-fed", alone, loaded, bound) <= bound, (alone, loaded)


async def _under_fingerprints(base: str, repo: str, commits: list[str]) -> tuple[float, int]:
    """The probes' ratio, loaded to alone, with ``commits`` of ``repo`` being fingerprinted;
    and how many fingerprints were still computing after the last loaded sample."""
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout) as probe,
        aiohttp.ClientSession(timeout=timeout) as loader,
    ):
        busy = _busy()
        alone = await _medians(probe, base)
        asks = [
            asyncio.ensure_future(loader.get(f"{base}/api/cmh/fingerprint/{repo}/{c}"))
            for c in commits
        ]
        await asyncio.sleep(0.1)  # the fingerprint requests are in
        loaded = await _medians(probe, base)
        pending = sum(not a.done() for a in asks)
        answers = await asyncio.gather(*asks)
        for a in answers:
            assert a.status == 200, a.status
            a.release()
        bound = _bound(busy)
        return _ratio(f"fingerprints of {repo}", alone, loaded, bound) / bound, pending


async def _within_bound_in_one_attempt(base: str, repo: str, commits: list[str]) -> None:
    """The probes' ratio within its bound in one of ATTEMPTS loads, each of LOAD ``commits``."""
    for attempt in range(ATTEMPTS):
        share, pending = await _under_fingerprints(base, repo, commits[attempt * LOAD :][:LOAD])
        # still computing when the last loaded sample was answered: one computation under
        # way (the pool's thread on 2 cores) and more waiting their turn
        assert pending > 2, pending
        if share <= 1.0:
            return
    raise AssertionError(f"over the bound in each of {ATTEMPTS} runs (printed above)")


def test_a_stored_repo_answers_within_3x_with_fingerprints_computing(served: Served) -> None:
    asyncio.run(_within_bound_in_one_attempt(served.server.url, "fp/m", served.commits))


def test_a_stored_repo_answers_within_3x_with_python_bound_fingerprints(
    tmp_path: Path,
) -> None:
    """12,000 tiny tensors make a fingerprint Python work (0.3-0.4 s each here). On the
    compute pool's threads it held the server's GIL: with two compute threads (as on 3
    cores or more; with one, 1.3-3.6x, too close to the bound to tell) a tree took 75-106x
    its time alone. In the pool's processes it does not. The server runs in this
    process, with two compute workers; the probes share its event loop."""
    from aiohttp.test_utils import TestServer
    from cmh.hub.mirror import add_folder
    from cmh.hub.mirror._app import MirrorState, make_app
    from cmh.hub.mirror._auth import AccessPolicy
    from cmh.hub.mirror._compute import ComputePool
    from cmh.hub.mirror._observe import Metrics
    from cmh.hub.mirror.stores import open_store
    from safetensors.numpy import save_file

    store, src = tmp_path / "store", tmp_path / "src"
    src.mkdir()
    tensors = {f"model.layers.{i}.weight": np.full(2, i, np.float32) for i in range(TINY_TENSORS)}
    save_file(tensors, str(src / "model.safetensors"))
    commits = []  # a warm-up's, then LOAD per attempt
    for i in range(1 + LOAD * ATTEMPTS):
        (src / "config.json").write_text(f'{{"model_type": "bert", "version": {i}}}\n')
        commits.append(add_folder(store, src, "evil/repo", revision=f"v{i}").commit)
    (src / "config.json").write_text('{"model_type": "bert"}\n')
    add_folder(store, src, "evil/repo", revision="main")  # the probes' tree and revision
    pool = ComputePool(workers=2)

    async def run() -> None:
        state = MirrorState(open_store(store), AccessPolicy({}), Metrics(None), compute=pool)
        server = TestServer(make_app(state), host="127.0.0.1")
        await server.start_server()
        base = str(server.make_url("")).rstrip("/")
        try:
            warm_up = f"{base}/api/cmh/fingerprint/evil/repo/{commits[0]}"
            async with aiohttp.ClientSession() as session, session.get(warm_up) as r:
                assert r.status == 200, r.status  # the compute processes have started
            await _within_bound_in_one_attempt(base, "evil/repo", commits[1:])
        finally:
            await server.close()

    try:
        asyncio.run(run())
    finally:
        pool.close()
