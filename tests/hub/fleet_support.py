"""Cluster pull-through helpers: ``cmh serve --store s3://... --upstream URL`` on several
replicas (``test_pullthrough_fleet.py``, ``test_pullthrough_fleet_faults.py``).

The chain: stock huggingface_hub clients -> replicas over one bucket prefix -> ``hublike.py``
(302 to a signed CDN, paginated trees, ``xetHash`` in listings) -> an origin ``cmh serve``
of a local store. A test module defines its module-scoped ``origin`` fixture with
:func:`origin` (``big``: with the 256 MiB blob) and imports ``fleet`` / ``any_fleet``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bucket_support import S3_KINDS, isolated_aws_env
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from cmh.hub.mirror.stores.bucket._objectstore import ObjectStoreError
from cmh.hub.mirror.stores.local._folder import add_folder
from deadline_support import TEST_DEADLINE
from hublike import HubLike, running
from mirror_support import MirrorServer, ProcessClock, stop_servers, wait_for
from seaweed import SeaweedBucket

BIG_REPO = "fleet/big"


MID_REPO = "fleet/mid"


BIG = 256 << 20


MID = 40 << 20


SMALL_REPO = "fleet/small"


FOLDER = {
    BIG_REPO: "models--fleet--big",
    MID_REPO: "models--fleet--mid",
    SMALL_REPO: "models--fleet--small",
}


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


def _write_safetensors(path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    tensors = {
        f"layer.{i}.weight": rng.standard_normal((64, 64)).astype("float32") for i in range(4)
    }
    save_file(tensors, str(path))


class Fleet:
    """Replicas over one bucket prefix in front of the origin's front."""

    def __init__(self, bucket: SeaweedBucket, front: HubLike, logs: Path, env: dict[str, str]):
        self.bucket = bucket
        self.front = front
        self.logs = logs
        self.env = env
        self.replicas: list[MirrorServer] = []

    def start(
        self, *extra: str, lease_ttl: float = 3.0, clock: ProcessClock | None = None
    ) -> MirrorServer:
        saved = dict(os.environ)
        os.environ.update(self.env)
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
                    "--fill-lease-ttl",
                    str(lease_ttl),
                    *extra,
                ),
                clock=clock,
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
        stop_servers(self.replicas)


def _fleet(bucket: Any, origin: dict[str, Any], tmp_path: Path) -> Iterator[Fleet]:
    env = isolated_aws_env(bucket, tmp_path)
    origin["front"].clear_records()
    origin["front"].clear_faults()  # a fault an earlier test left unconsumed
    group = Fleet(bucket, origin["front"], tmp_path / "logs", env)
    try:
        yield group
    finally:
        group.stop()


def origin(tmp_path_factory: pytest.TempPathFactory, big: bool) -> Iterator[dict[str, Any]]:
    """An origin ``cmh serve`` holding the 40 MiB blob (and the 256 MiB one if ``big``) and
    a small safetensors repo, behind the Hub-like front: a module-scoped fixture's body."""
    base = tmp_path_factory.mktemp("fleet-origin")
    store = base / "store"
    blobs = {}
    sizes = ((BIG_REPO, BIG, 1), (MID_REPO, MID, 2)) if big else ((MID_REPO, MID, 2),)
    for repo, size, seed in sizes:
        src = base / repo.replace("/", "_")
        src.mkdir()
        data = _pattern(size, seed)
        (src / "shard.bin").write_bytes(data)
        (src / "config.json").write_text('{"model_type": "fleet"}\n')
        add_folder(store, src, repo)
        blobs[repo] = hashlib.sha256(data).hexdigest()
        del data
    small = base / "small"
    small.mkdir()
    _write_safetensors(small / "model.safetensors")
    (small / "config.json").write_text('{"model_type": "fleet-small"}\n')
    (small / "empty.txt").write_bytes(b"")
    add_folder(store, small, SMALL_REPO)
    blobs[SMALL_REPO] = hashlib.sha256((small / "model.safetensors").read_bytes()).hexdigest()
    server = MirrorServer(store, base / "logs")
    try:
        with running(server.url) as front:
            yield {"front": front, "blobs": blobs}
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)  # up to 600 MB, not kept until the session ends


@pytest.fixture(name="fleet")
def fleet_fixture(
    seaweed_bucket: SeaweedBucket, origin: dict[str, Any], tmp_path: Path
) -> Iterator[Fleet]:
    """Replicas over a SeaweedFS bucket prefix (``origin``: the test module's fixture)."""
    yield from _fleet(seaweed_bucket, origin, tmp_path)


@pytest.fixture(name="any_fleet", params=S3_KINDS)
def any_fleet_fixture(
    request: pytest.FixtureRequest, origin: dict[str, Any], tmp_path: Path
) -> Iterator[Fleet]:
    """Replicas over a bucket prefix of each S3 implementation (SeaweedFS, moto's server)."""
    bucket = request.getfixturevalue(f"{request.param}_bucket")
    yield from _fleet(bucket, origin, tmp_path)


def _cdn_gets(front: HubLike, sha: str) -> int:
    return sum(1 for r in front.records(origin="cdn") if sha in r.path and r.method == "GET")


def _incomplete_size(home: Path) -> int:
    """Bytes the stock client has written so far (its ``.incomplete`` file or the blob)."""
    total = 0
    for p in home.rglob("blobs/*"):
        with contextlib.suppress(OSError):  # renamed meanwhile
            total = max(total, p.stat().st_size)
    return total


def _raw_get(server: MirrorServer, repo: str, got: list[int], timeout: float = 120.0) -> str:
    """GET a whole file with a plain HTTP client; its outcome ("complete <sha>" or the
    error), the body bytes received so far kept in ``got[0]``."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    h = hashlib.sha256()
    try:
        conn.request("GET", f"/{repo}/resolve/main/shard.bin")
        response = conn.getresponse()
        if response.status != 200:
            return f"status {response.status}"
        length = int(response.headers["Content-Length"])
        while True:
            chunk = response.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
            got[0] += len(chunk)
        return f"complete {h.hexdigest()}" if got[0] == length else f"short {got[0]}"
    except (OSError, http.client.HTTPException) as exc:
        return f"cut {type(exc).__name__}"
    finally:
        conn.close()


def _start_get(server: MirrorServer, repo: str) -> tuple[threading.Thread, list[int], list[str]]:
    got, outcome = [0], [""]

    def run() -> None:
        outcome[0] = _raw_get(server, repo, got)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got, outcome


def _stored_parts(store: BucketStore, repo: str, count: int) -> bool:
    """Whether parts ``0 .. count - 1`` are all stored. (A fill PUTs several parts at
    once: a later part can be stored before an earlier one, and a resume stops at the
    first gap.)"""
    names = set(_parts(store, repo))
    return all(f"part-{n:06d}" in names for n in range(count))


def _parts(store: BucketStore, repo: str) -> list[str]:
    try:
        return sorted(
            i.name.rsplit("/", 1)[-1] for i in store.objects.list(f"{FOLDER[repo]}/.cmh/fills")
        )
    except ObjectStoreError:
        return []


def _stored_sha(store: BucketStore, repo: str, sha: str) -> str | None:
    """SHA-256 of what the bucket holds under the blob's name (None: nothing)."""
    name = f"{FOLDER[repo]}/blobs/{sha}"
    try:
        store.objects.head(name)
    except ObjectStoreError:
        return None
    h = hashlib.sha256()
    for chunk in store.objects.iter_chunks(name):
        h.update(chunk)
    return h.hexdigest()


def _wait_stored(store: BucketStore, sha: str) -> None:
    """Wait for the mid blob's fill to end right: its bytes under its name, no parts left."""
    wait_for(
        lambda: _stored_sha(store, MID_REPO, sha) == sha,
        timeout=TEST_DEADLINE,
        what="the blob stored",
    )
    wait_for(lambda: _parts(store, MID_REPO) == [], timeout=TEST_DEADLINE, what="the parts deleted")


def _cdn_ranges(front: HubLike, sha: str) -> list[str | None]:
    return [
        r.headers.get("range") for r in front.records(origin="cdn", method="GET") if sha in r.path
    ]


def _get(
    server: MirrorServer, target: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request("GET", target, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _exists(store: BucketStore, name: str) -> bool:
    try:
        store.objects.head(name)
        return True
    except ObjectStoreError:
        return False
