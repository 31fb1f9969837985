"""Loopback load test: 64 concurrent clients mixing HEAD, full GETs and ranges for 30 s.

Bounded in time (``CMH_LOAD_SECONDS``, default 30) and in requests (100,000);
every byte received is compared with the file imported, every header checked,
and the server's own counters must agree with the client's.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from cmh.hub.mirror.stores.local._folder import add_folder

CLIENTS = 64
SECONDS = float(os.environ.get("CMH_LOAD_SECONDS", "30"))
MAX_REQUESTS = 100_000
REPO = "load/test"
SIZES = {"a.txt": 1_000, "b.json": 70_000, "c.bin": 1 << 20, "d.safetensors": 8 << 20}


class Failures(list[str]):
    def check(self, ok: bool, what: str) -> None:
        if not ok and len(self) < 50:
            self.append(what)


async def _one(
    session: aiohttp.ClientSession,
    base: str,
    files: dict[str, bytes],
    commit: str,
    rng: random.Random,
    fail: Failures,
) -> str:
    name = rng.choice(list(files))
    data = files[name]
    size = len(data)
    url = f"{base}/{REPO}/resolve/main/{name}"
    op = rng.choice(["head", "full", "range", "range", "suffix", "multi", "missing"])
    if op == "head":
        async with session.head(url) as r:
            fail.check(r.status == 200, f"HEAD {name}: {r.status}")
            fail.check(r.headers.get("X-Repo-Commit") == commit, f"HEAD {name}: commit")
            fail.check(r.headers.get("Content-Length") == str(size), f"HEAD {name}: length")
    elif op == "full":
        async with session.get(url) as r:
            fail.check(r.status == 200, f"GET {name}: {r.status}")
            offset = 0
            async for chunk in r.content.iter_chunked(1 << 16):
                fail.check(chunk == data[offset : offset + len(chunk)], f"GET {name}: bytes")
                offset += len(chunk)
            fail.check(offset == size, f"GET {name}: got {offset} of {size} bytes")
    elif op in ("range", "suffix"):
        if op == "range":
            start = rng.randrange(size)
            end = min(size - 1, start + rng.randrange(1, 1 << 18))
            header, want, first = f"bytes={start}-{end}", data[start : end + 1], start
        else:
            n = rng.randrange(1, 5000)
            header, want, first = f"bytes=-{n}", data[-n:], max(0, size - n)
        async with session.get(url, headers={"Range": header}) as r:
            body = await r.read()
            fail.check(r.status == 206, f"{header} {name}: {r.status}")
            last = first + len(want) - 1
            fail.check(
                r.headers.get("Content-Range") == f"bytes {first}-{last}/{size}",
                f"{header} {name}: {r.headers.get('Content-Range')}",
            )
            fail.check(body == want, f"{header} {name}: bytes")
    elif op == "multi":
        cuts = sorted(rng.sample(range(size), 4))
        spans = [(cuts[0], cuts[1] - 1), (cuts[2], cuts[3] - 1)] if cuts[1] < cuts[2] - 1 else []
        if not spans or spans[0][1] < spans[0][0] or spans[1][1] < spans[1][0]:
            return await _one(session, base, files, commit, rng, fail)
        header = "bytes=" + ",".join(f"{a}-{b}" for a, b in spans)
        async with session.get(url, headers={"Range": header}) as r:
            fail.check(r.status == 206, f"multi {name}: {r.status}")
            reader = aiohttp.MultipartReader.from_response(r)
            got = []
            while (part := await reader.next()) is not None:
                assert isinstance(part, aiohttp.BodyPartReader)
                got.append((part.headers.get("Content-Range"), await part.read()))
            want = [(f"bytes {a}-{b}/{size}", data[a : b + 1]) for a, b in spans]
            fail.check(got == want, f"multi {name}: parts differ")
    else:
        async with session.head(f"{base}/{REPO}/resolve/main/missing-{name}") as r:
            fail.check(r.status == 404, f"missing: {r.status}")
            fail.check(r.headers.get("X-Error-Code") == "EntryNotFound", "missing: code")
    return op


async def _load(base: str, files: dict[str, bytes], commit: str) -> tuple[dict[str, int], list]:
    fail = Failures()
    ops: dict[str, int] = {}
    deadline = time.monotonic() + SECONDS
    budget = [MAX_REQUESTS]
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=CLIENTS, force_close=False)

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline and budget[0] > 0:
            budget[0] -= 1
            try:
                op = await _one(session, base, files, commit, rng, fail)
                ops[op] = ops.get(op, 0) + 1
            except (aiohttp.ClientError, asyncio.TimeoutError, AssertionError) as exc:
                fail.check(False, f"client error: {exc!r}")
                ops["error"] = ops.get("error", 0) + 1

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return ops, fail


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:unread_data:DeprecationWarning")  # aiohttp client internals
def test_64_clients_for_30_seconds_zero_errors(mirror_server_factory, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    src = tmp_path / "src"
    src.mkdir()
    files: dict[str, bytes] = {}
    for name, size in SIZES.items():
        files[name] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        (src / name).write_bytes(files[name])
    store = tmp_path / "store"
    commit = add_folder(store, src, REPO).commit
    server = mirror_server_factory(store, workers=2)

    ops, failures = asyncio.run(_load(server.url, files, commit))

    total = sum(ops.values())
    assert not failures, failures[:10]
    assert "error" not in ops
    assert set(ops) == {"head", "full", "range", "suffix", "multi", "missing"}
    assert total >= CLIENTS * 5  # it really ran
    assert server.count(route="resolve") == total  # the server saw every request
    assert server.count(route="resolve", status="500") == 0
    assert not [e for e in server.log() if e["status"] >= 500]
    print(f"load: {total} requests in {SECONDS:.0f}s, by kind {ops}")
