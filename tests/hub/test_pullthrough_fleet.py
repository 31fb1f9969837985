"""Cluster pull-through: ``cmh serve --store s3://... --upstream URL`` on several replicas.

The chain: stock huggingface_hub clients -> two ``cmh serve`` replicas over one
SeaweedFS bucket prefix (tests/hub/seaweed.py) -> ``tests/hub/hublike.py`` (302 to a
signed CDN, paginated trees, ``xetHash`` in listings) -> an origin ``cmh serve`` of a
local store. Every process is real; fill leases use a short lifetime
(``CMH_FILL_LEASE_TTL``), measured on the storage's clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cmh.hub.mirror.bucket import BucketStore
from cmh.hub.mirror.objectstore import ObjectStoreError
from cmh.hub.mirror.store import add_folder
from hublike import HubLike, running
from mirror_support import MirrorServer, hf_env, run_python
from seaweed import SeaweedBucket, SeaweedServer

BIG_REPO = "fleet/big"
MID_REPO = "fleet/mid"
BIG = 256 << 20
MID = 40 << 20
FOLDER = {BIG_REPO: "models--fleet--big", MID_REPO: "models--fleet--mid"}

CLIENT_SCRIPT = r"""
import hashlib, json, os
from huggingface_hub import hf_hub_download
path = hf_hub_download(os.environ["T_REPO"], os.environ["T_FILE"])
h = hashlib.sha256()
with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(json.dumps({"sha256": h.hexdigest(), "size": os.path.getsize(path)}))
"""


def _pattern(size: int, seed: int) -> bytes:
    """``size`` bytes that are not all alike (a counter hashed in blocks), quickly made."""
    block = hashlib.sha256(f"seed-{seed}".encode()).digest() * (1 << 15)  # 1 MiB
    out = bytearray()
    i = 0
    while len(out) < size:
        out += bytes(b ^ (i & 0xFF) for b in block[:64]) + block[64:]
        i += 1
    return bytes(out[:size])


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An origin ``cmh serve`` holding a 256 MiB and a 40 MiB blob, behind the Hub-like front."""
    base = tmp_path_factory.mktemp("fleet-origin")
    store = base / "store"
    blobs = {}
    for repo, size, seed in ((BIG_REPO, BIG, 1), (MID_REPO, MID, 2)):
        src = base / repo.replace("/", "_")
        src.mkdir()
        data = _pattern(size, seed)
        (src / "shard.bin").write_bytes(data)
        (src / "config.json").write_text('{"model_type": "fleet"}\n')
        add_folder(store, src, repo)
        blobs[repo] = hashlib.sha256(data).hexdigest()
        del data
    server = MirrorServer(store, base / "logs")
    try:
        with running(server.url) as front:
            yield {"front": front, "blobs": blobs}
    finally:
        server.stop()


class Fleet:
    """Replicas over one bucket prefix in front of the origin's front."""

    def __init__(self, bucket: SeaweedBucket, front: HubLike, logs: Path, env: dict[str, str]):
        self.bucket = bucket
        self.front = front
        self.logs = logs
        self.env = env
        self.replicas: list[MirrorServer] = []

    def start(self, *extra: str, lease_ttl: float = 3.0) -> MirrorServer:
        saved = dict(os.environ)
        os.environ.update(self.env)
        os.environ["CMH_FILL_LEASE_TTL"] = str(lease_ttl)
        try:
            server = MirrorServer(
                self.bucket.url,  # type: ignore[arg-type]
                self.logs,
                extra_args=(
                    "--upstream",
                    self.front.url,
                    "--fresh-for",
                    "1h",
                    "--ref-ttl",
                    "0.5",
                    *extra,
                ),
            )
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.replicas.append(server)
        return server

    def store(self) -> BucketStore:
        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            return BucketStore.open(self.bucket.url)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def stop(self) -> None:
        for server in self.replicas:
            server.stop()


@pytest.fixture
def fleet(
    seaweed: SeaweedServer, seaweed_bucket: SeaweedBucket, origin: dict[str, Any], tmp_path: Path
) -> Iterator[Fleet]:
    env = {
        **seaweed_bucket.aws_env(),
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    origin["front"].clear_records()
    group = Fleet(seaweed_bucket, origin["front"], tmp_path / "logs", env)
    try:
        yield group
    finally:
        group.stop()


def _cdn_gets(front: HubLike, sha: str) -> int:
    return sum(1 for r in front.records(origin="cdn") if sha in r.path and r.method == "GET")


def _incomplete_size(home: Path) -> int:
    """Bytes the stock client has written so far (its ``.incomplete`` file or the blob)."""
    total = 0
    for p in home.rglob("blobs/*"):
        with contextlib.suppress(OSError):  # renamed meanwhile
            total = max(total, p.stat().st_size)
    return total


def test_two_replicas_eight_stock_clients_cold_256mib_one_cdn_transfer(
    fleet: Fleet, origin: dict[str, Any], tmp_path: Path
) -> None:
    sha = origin["blobs"][BIG_REPO]
    replicas = [fleet.start(), fleet.start()]
    store = fleet.store()
    blob = f"{FOLDER[BIG_REPO]}/blobs/{sha}"
    homes = [tmp_path / f"home-{i}" for i in range(8)]
    first_byte: dict[int, float] = {}
    filled_at: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            now = time.monotonic()
            for i, home in enumerate(homes):
                if i not in first_byte and _incomplete_size(home) > 0:
                    first_byte[i] = now
            if not filled_at:
                try:
                    store.objects.head(blob)
                    filled_at.append(now)
                except ObjectStoreError:  # not there yet (or the storage is busy)
                    pass
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def client(i: int) -> dict[str, Any]:
        env = hf_env(replicas[i % 2].url, homes[i])
        env.update(T_REPO=BIG_REPO, T_FILE="shard.bin")
        out: dict[str, Any] = run_python(CLIENT_SCRIPT, env, timeout=240)
        return out

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(client, range(8)))
    elapsed = time.monotonic() - started
    stop.set()
    watcher.join()
    assert all(r == {"sha256": sha, "size": BIG} for r in results), results
    assert _cdn_gets(fleet.front, sha) == 1, [r.path for r in fleet.front.records(origin="cdn")]
    assert not fleet.front.cdn_saw_authorization
    assert filled_at, "the blob was never stored in the bucket"
    assert len(first_byte) == 8
    late = {i: round(t - filled_at[0], 2) for i, t in first_byte.items() if t >= filled_at[0]}
    assert not late, f"clients whose first byte came after the fill completed: {late}"
    # Both replicas answered filling bodies (one of them without filling itself).
    for server in replicas:
        assert server.log(route="resolve", status=200), server.stderr_text()[-2000:]
    # Nothing left of the fill: its parts and lease are gone, the check is recorded.
    leftovers = [i.name for i in store.objects.list(f"{FOLDER[BIG_REPO]}/.cmh/fills")]
    assert leftovers == []
    assert store.read_check(FOLDER[BIG_REPO], sha) == store.objects.head(blob).etag
    print(f"cold 256 MiB to 8 clients over 2 replicas: {elapsed:.1f} s")
