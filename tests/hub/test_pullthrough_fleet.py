"""Cluster pull-through: ``cmh serve --store s3://... --upstream URL`` on several replicas.

The chain: stock huggingface_hub clients -> two ``cmh serve`` replicas over one
SeaweedFS bucket prefix (tests/hub/seaweed.py) -> ``tests/hub/hublike.py`` (302 to a
signed CDN, paginated trees, ``xetHash`` in listings) -> an origin ``cmh serve`` of a
local store. Every process is real; fill leases use a short lifetime
(``cmh serve --fill-lease-ttl``), measured on the storage's clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from bucket_support import S3_KINDS, Break, Fault, S3Proxy, S3Request, isolated_aws_env
from cmh.hub.cache import Clock
from cmh.hub.mirror._upstream import NEGATIVE_FOR, Upstream, UpstreamConfig
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from cmh.hub.mirror.stores.bucket._objectstore import ObjectNotFound, ObjectStoreError
from cmh.hub.mirror.stores.bucket._pull import BucketPullThrough
from cmh.hub.mirror.stores.bucket._read import BucketReader
from cmh.hub.mirror.stores.local._folder import add_folder
from deadline_support import TEST_DEADLINE
from hublike import HubLike, running
from mirror_support import MirrorServer, ProcessClock, hf_env, run_python, wait_for
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
        shutil.rmtree(base, ignore_errors=True)  # 600 MB, not kept until the session ends


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
        for server in self.replicas:
            server.stop()


def _fleet(bucket: Any, origin: dict[str, Any], tmp_path: Path) -> Iterator[Fleet]:
    env = isolated_aws_env(bucket, tmp_path)
    origin["front"].clear_records()
    origin["front"].clear_faults()  # a fault an earlier test left unconsumed
    group = Fleet(bucket, origin["front"], tmp_path / "logs", env)
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture
def fleet(seaweed_bucket: SeaweedBucket, origin: dict[str, Any], tmp_path: Path) -> Iterator[Fleet]:
    """Replicas over a SeaweedFS bucket prefix."""
    yield from _fleet(seaweed_bucket, origin, tmp_path)


@pytest.fixture(params=S3_KINDS)
def any_fleet(
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
    # The CDN trickles past 64 MiB until every client has its first byte: on a loaded
    # machine a client may start after a full-speed fill has ended. (Not sooner: the stock
    # client writes 10 MiB at a time.) A mirror that answered only once its fill completed
    # would never get there (the trickle ends after 120 s, then those first bytes come
    # late and the test fails).
    everyone = threading.Event()
    fleet.front.drip(64 << 20, everyone)

    def watch() -> None:
        while not stop.is_set():
            now = time.monotonic()
            for i, home in enumerate(homes):
                if i not in first_byte and _incomplete_size(home) > 0:
                    first_byte[i] = now
            if len(first_byte) == len(homes):
                everyone.set()
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
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(client, range(8)))
        elapsed = time.monotonic() - started
        # the parts become the blob by the storage's copy, which may end after the bodies did
        wait_for(lambda: filled_at, "the blob stored in the bucket")
    finally:
        stop.set()
        everyone.set()
        fleet.front.clear_faults()
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
    def leftovers() -> list[str]:
        return [i.name for i in store.objects.list(f"{FOLDER[BIG_REPO]}/.cmh/fills")]

    wait_for(lambda: not leftovers(), "the fill's parts and lease deleted")
    assert store.read_check(FOLDER[BIG_REPO], sha) == store.objects.head(blob).etag
    firsts = sorted(round(t - started, 1) for t in first_byte.values())
    print(
        f"cold 256 MiB to 8 clients over 2 replicas: {elapsed:.1f} s; fill stored after "
        f"{filled_at[0] - started:.1f} s; first bytes after {firsts} s"
    )


# -- faults --------------------------------------------------------------------------------


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


def test_filling_replica_killed_mid_fill_another_resumes_after_the_lease_expires(
    fleet: Fleet, origin: dict[str, Any], tmp_path: Path
) -> None:
    sha = origin["blobs"][MID_REPO]
    first, second = fleet.start(lease_ttl=2.0), fleet.start(lease_ttl=2.0)
    store = fleet.store()
    fleet.front.stall(after_bytes=20 << 20, seconds=8, path=sha)  # the first transfer stops
    thread, _, outcome = _start_get(first, MID_REPO)
    wait_for(lambda: _stored_parts(store, MID_REPO, 2), what="two parts stored")
    lease = json.loads(store.objects.get(f"{FOLDER[MID_REPO]}/.cmh/fills/{sha}/lease"))
    assert lease["ttl"] == 2.0  # --fill-lease-ttl reached the filling worker
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait()
    thread.join(30)
    assert not outcome[0].startswith("complete"), outcome  # cut: never a complete body
    env = hf_env(second.url, tmp_path / "home-b")
    env.update(T_REPO=MID_REPO, T_FILE="shard.bin")
    out = run_python(CLIENT_SCRIPT, env, timeout=120)
    assert out == {"sha256": sha, "size": MID}
    fleet.front.wait_idle(30)  # the stalled first transfer is recorded once it ends
    ranges = _cdn_ranges(fleet.front, sha)
    assert len(ranges) == 2 and ranges[0] is None, ranges
    # The second replica resumed from the parts stored (8 MiB each), not from byte 0.
    resumed = int((ranges[1] or "bytes=0-").removeprefix("bytes=").split("-")[0])
    assert resumed >= 16 << 20 and resumed % (8 << 20) == 0, ranges
    _wait_stored(store, sha)  # whole bodies end before the fill stores the blob


def test_a_filler_whose_lease_is_taken_over_keeps_its_client_and_waits_for_the_fleet(
    any_fleet: Fleet, origin: dict[str, Any]
) -> None:
    """Was: the replica whose lease another took over (it stalled past the lifetime, or a
    lost answer to its renewal) cut its own clients. Now it waits for the fleet's fill like
    any replica, here takes it back once the other's lease expired, and its client gets the
    whole body."""
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    first = fleet.start(lease_ttl=2.0)
    store = fleet.store()
    fleet.front.stall(after_bytes=20 << 20, seconds=3, path=sha)  # renewals fail meanwhile
    thread, _, outcome = _start_get(first, MID_REPO)
    wait_for(lambda: _stored_parts(store, MID_REPO, 2), what="two parts stored")
    lease = f"{FOLDER[MID_REPO]}/.cmh/fills/{sha}/lease"
    other = {"owner": "another-replica", "ttl": 2.0, "nonce": "0" * 32}
    store.objects.put(lease, json.dumps(other).encode())  # another replica took it over
    thread.join(60)
    assert outcome[0] == f"complete {sha}", outcome
    fleet.front.wait_idle(30)
    ranges = _cdn_ranges(fleet.front, sha)
    assert len(ranges) == 2 and ranges[0] is None, ranges
    resumed = int((ranges[1] or "bytes=0-").removeprefix("bytes=").split("-")[0])
    assert resumed >= 16 << 20 and resumed % (8 << 20) == 0, ranges  # from the stored parts
    _wait_stored(store, sha)


def test_a_filler_unaware_its_lease_expired_never_undoes_the_fleets_fill(
    any_fleet: Fleet, origin: dict[str, Any]
) -> None:
    """Issue 40 (a body cut under load): a filler whose lease renewal hangs (a loaded
    machine) does not know its lease expired; another replica takes the fill over, ends it
    and deletes the parts while the first replica's client still reads them. That client
    gets the whole body; when the stale filler's own transfer then ends, the fleet's blob
    stays right and no failure is recorded (one resumed transfer, from the stored parts)."""
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    lease = f"{FOLDER[MID_REPO]}/.cmh/fills/{sha}/lease"
    armed, held, release, upstream_held = (threading.Event() for _ in range(4))
    seen: list[tuple[str, str]] = []

    def holds(request: S3Request) -> None:
        seen.append((request.method, request.path))
        renewal = request.method == "PUT" and request.key.endswith(lease)
        if renewal and armed.is_set() and not held.is_set():
            held.set()
            release.wait(120)  # the renewal hangs: its filler learns nothing meanwhile

    endpoint = fleet.env["AWS_ENDPOINT_URL"]
    proxy = S3Proxy(endpoint, holds)
    try:
        fleet.env["AWS_ENDPOINT_URL"] = proxy.endpoint
        first = fleet.start(lease_ttl=2.0)
        fleet.env["AWS_ENDPOINT_URL"] = endpoint
        second = fleet.start(lease_ttl=2.0)
        store = fleet.store()
        # Every CDN body trickles past 24 MiB until told: the first transfer stops after
        # three parts; the second replica's resumed one (16 MiB) never gets there.
        fleet.front.drip(24 << 20, upstream_held)
        thread, _, outcome = _start_get(first, MID_REPO)
        wait_for(lambda: _stored_parts(store, MID_REPO, 3), what="three parts stored")
        armed.set()
        wait_for(held.is_set, what="a renewal of the first replica held")
        # The second replica takes the expired lease over, resumes and ends the fill.
        assert _raw_get(second, MID_REPO, [0]) == f"complete {sha}"
        wait_for(lambda: _stored_sha(store, MID_REPO, sha) == sha, what="the blob stored")
        thread.join(60)
        assert outcome[0] == f"complete {sha}", outcome  # read from the fleet's parts/blob
        # Now the stale filler's transfer ends: every byte, but no lease any more.
        mark = len(seen)
        upstream_held.set()
        fleet.front.wait_idle(30)
        # Its end renews once more, after the held renewal: that one now reaches the
        # storage late, as a slow network delivers it (not after the S3 client's 60 s).
        release.set()
        blob = f"{FOLDER[MID_REPO]}/blobs/{sha}"
        wait_for(lambda: any(blob in p for _, p in seen[mark:]), what="the first fill's end")
        assert "failed" not in _parts(store, MID_REPO)
        assert _stored_sha(store, MID_REPO, sha) == sha
        ranges = _cdn_ranges(fleet.front, sha)
        assert len(ranges) == 2 and ranges[1] == f"bytes={24 << 20}-", ranges
    finally:
        release.set()
        upstream_held.set()
        fleet.env["AWS_ENDPOINT_URL"] = endpoint
        fleet.stop()
        proxy.stop()


def test_a_filler_unaware_it_lost_its_lease_leaves_the_end_to_the_holder(
    moto_bucket: Any, origin: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 40: a filler whose lease another replica took over, and which has not tried
    to renew since (it knows nothing), reaches the end of its transfer. It must not act as
    the holder: was, it built the blob from its parts, deleted the parts and then the
    holder's lease (unconditionally; a 412 on that build would have written the fleet's
    ``failed`` record and deleted the holder's parts). Now it asks for its lease once
    more, finds it gone and waits like any replica; once the holder's lease is gone it
    takes the fill back and ends it from the stored parts (no second transfer)."""
    sha = origin["blobs"][MID_REPO]
    lease = f"{FOLDER[MID_REPO]}/.cmh/fills/{sha}/lease"
    seen: list[tuple[str, str]] = []

    def note(request: S3Request) -> None:
        seen.append((request.method, request.path))

    fleets = _fleet(moto_bucket, origin, tmp_path)
    fleet = next(fleets)
    store = fleet.store()
    proxy = S3Proxy(fleet.env["AWS_ENDPOINT_URL"], note)
    upstream_held = threading.Event()
    try:
        fleet.env["AWS_ENDPOINT_URL"] = proxy.endpoint
        replica = fleet.start(lease_ttl=60.0)  # no renewal (each 15 s) during the test
        fleet.front.drip(9 << 20, upstream_held)  # the transfer waits after one part
        thread, _, outcome = _start_get(replica, MID_REPO)
        wait_for(lambda: "part-000000" in _parts(store, MID_REPO), what="a part stored")
        other = {"owner": "another-replica", "ttl": 60.0, "nonce": "0" * 32}
        store.objects.put(lease, json.dumps(other).encode())  # another replica took it over
        mark = len(seen)
        upstream_held.set()

        blob = f"{FOLDER[MID_REPO]}/blobs/{sha}"

        def lease_asked() -> list[str]:
            return [c for c, p in seen[mark:] if p.partition("?")[0].endswith(lease)]

        def built() -> list[str]:
            """What made the blob visible: a PUT or copy of it, or an upload completed
            (the part copies into its upload made during the fill show nothing)."""
            return [c for c, p in seen[mark:] if p.partition("?")[0].endswith(blob)
                    and ((c == "PUT" and "partNumber=" not in p)
                         or (c == "POST" and "uploadId=" in p))]  # fmt: skip

        wait_for(lambda: lease_asked() or built(), what="the end of the filler's transfer")
        assert not built()  # no blob built by a filler that is not the holder
        assert lease_asked()[0] == "PUT", lease_asked()  # its renewal, refused
        assert json.loads(store.objects.get(lease))["owner"] == "another-replica"
        assert "failed" not in _parts(store, MID_REPO)
        store.objects.delete(lease)  # the other replica is gone: the filler takes it back
        thread.join(60)
        assert outcome[0] == f"complete {sha}", outcome
        _wait_stored(store, sha)
        assert len(_cdn_ranges(fleet.front, sha)) == 1  # resumed from its stored parts
        assert store.objects.list_uploads(FOLDER[MID_REPO]) == ()  # the lost fill's aborted
    finally:
        upstream_held.set()
        fleets.close()  # the replica stopped
        proxy.stop()


def test_a_part_read_cut_short_is_read_again_not_passed_on_as_a_cut(
    moto_bucket: Any, origin: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 40: a client's body was cut at 32 MiB (once 24 MiB), where the last part
    starts: a reader's GET of a part failed mid-body (as when the filler deletes the parts
    after the compose while a slow reader is still reading one) and the reader cut its
    client. A part is whole or absent: a failed read of one is looked at again (or the
    blob read), as for a part not there yet. The reader is another replica's (the filling
    replica's own readers take its parts from memory, issue 37). The filler's deletion of
    the last part waits for the reader's GET of it: a fill's end that no longer waits for
    its S3 client (issue 37) could delete it between two of the reader's looks. Its
    completion of the blob waits too (a reader that finds the blob reads no part), and
    the cut is decided by the storage's answer to that GET (the part's bytes), not by a
    listing taken before it: the part's PUT could land in between (1 run in 8 cut
    nothing)."""
    sha = origin["blobs"][MID_REPO]
    last = f"/.cmh/fills/{sha}/part-000004"
    blob = f"{FOLDER[MID_REPO]}/blobs/{sha}"
    cut: list[str] = []
    looked = threading.Event()

    def holds_the_end(request: S3Request) -> None:
        """The filler's deletion of the last part and its completion of the blob wait
        for the reader's GET of that part: the reader cannot find the blob instead."""
        deletes = request.method == "DELETE" and request.key.endswith(last)
        completes = request.method == "POST" and "uploadId=" in request.path  # not its creation
        if deletes or (completes and request.key.endswith(blob)):
            wait_for(lambda: bool(cut), what="the reader's GET of the last part")

    def truncates(request: S3Request) -> Break | None:
        if request.method != "GET" or not request.key.endswith(last) or cut:
            return None

        def applies(status: int) -> bool:
            # By the storage's answer, not by a look before the GET went on: the part's
            # PUT may land in between.
            if status not in (200, 206):  # 206: the reader asks for a range
                looked.set()  # the reader waits for the last part
                return False
            return not cut

        def before_cut() -> None:
            cut.append(request.path)
            # The filler composes the blob and deletes the parts before the cut: the
            # reader's storage client finds the part gone when it asks for the rest.
            _wait_stored(store, sha)

        return Break(Fault.TRUNCATE, before_cut=before_cut, applies=applies)

    fleets = _fleet(moto_bucket, origin, tmp_path)
    fleet = next(fleets)
    store = fleet.store()
    endpoint = fleet.env["AWS_ENDPOINT_URL"]
    proxy = S3Proxy(endpoint, truncates)
    go = threading.Event()
    filler_proxy = S3Proxy(endpoint, holds_the_end)
    try:
        fleet.env["AWS_ENDPOINT_URL"] = filler_proxy.endpoint
        filler = fleet.start()
        fleet.env["AWS_ENDPOINT_URL"] = proxy.endpoint
        reader = fleet.start()
        fleet.front.drip(32 << 20, go)  # the last part waits until the reader looks for it
        thread, _, outcome = _start_get(filler, MID_REPO)
        wait_for(lambda: _stored_parts(store, MID_REPO, 4), what="four parts stored")
        reading, _, read = _start_get(reader, MID_REPO)
        wait_for(looked.is_set, what="the reader looking for the last part")
        go.set()
        reading.join(120)
        thread.join(120)
        assert (read[0], outcome[0]) == (f"complete {sha}", f"complete {sha}")
        assert cut, "no read of the last part was cut"
        assert len(_cdn_ranges(fleet.front, sha)) == 1
        _wait_stored(store, sha)
    finally:
        go.set()
        fleet.env["AWS_ENDPOINT_URL"] = endpoint
        fleets.close()  # the replicas stopped
        proxy.stop()
        filler_proxy.stop()


def test_upstream_flipping_a_byte_mid_fill_cuts_every_client_and_stores_nothing(
    any_fleet: Fleet, origin: dict[str, Any], process_clock: ProcessClock
) -> None:
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    replicas = [fleet.start(), fleet.start()]
    # Started now, not once the fill failed: the 10 s in which it must share the failure
    # are real seconds of the storage's clock, and a start on a busy machine took more.
    later = fleet.start(clock=process_clock)
    store = fleet.store()
    fleet.front.flip_byte(sha, offset=30 << 20)
    gets = [_start_get(replicas[i % 2], MID_REPO) for i in range(4)]
    for thread, _, _ in gets:
        thread.join(120)
    # The fill ends after its clients were cut: the parts go, the failure is told.
    wait_for(
        lambda: _parts(store, MID_REPO) == ["failed"],
        timeout=TEST_DEADLINE,
        what="the failed fill's end",
    )
    # A replica asked within 10 s shares the failure (the fleet's negative cache), asked
    # at once; once they passed on the storage's clock, it fills the blob again, right.
    assert not _raw_get(later, MID_REPO, [0]).startswith("complete")  # 502, or cut at byte 0
    outcomes = [g[2][0] for g in gets]
    assert all(not o.startswith("complete") and not o.startswith("status 2") for o in outcomes), (
        outcomes
    )
    assert all(g[1][0] < MID for g in gets)  # the last byte never sent
    assert _stored_sha(store, MID_REPO, sha) is None  # nothing under the blob's name
    assert len(_cdn_ranges(fleet.front, sha)) == 1  # the failure was shared, not re-fetched
    said = f"fill of {MID_REPO}/shard.bin failed (502): "  # the operator is told
    wait_for(lambda: any(said in r.stderr_path.read_text() for r in replicas), what=said)
    process_clock.advance(NEGATIVE_FOR + 1)
    thread, _, outcome = _start_get(later, MID_REPO)
    thread.join(120)
    assert outcome[0] == f"complete {sha}"
    # A cut client's resume is not spliced onto the good fill, on any replica: its range
    # is answered whole (the cut is recorded in the bucket).
    status, _, body = _get(later, f"/{MID_REPO}/resolve/main/shard.bin", {"Range": "bytes=1000-"})
    assert status == 200 and len(body) == MID
    wait_for(
        lambda: _stored_sha(store, MID_REPO, sha) == sha,
        timeout=TEST_DEADLINE,
        what="the blob stored",
    )


def _status(server: MirrorServer, target: str, headers: dict[str, str]) -> int:
    """The status of a GET, read before its body (which may then be cut)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request("GET", target, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_replica_clocks_60_s_apart_never_splice_a_resume_and_keep_the_negative_cache_10_s(
    any_fleet: Fleet, origin: dict[str, Any], tmp_path: Path
) -> None:
    """Fleet records are aged on the storage's clock, never on a replica's wall clock.

    Replica A's clock runs 60 s ahead of B's. A's clients are cut by a fill whose bytes
    fail their check. A cut client's resume (``Range``, no ``If-Range``) is answered whole
    on B and A, never 206 (which would splice the wrong head onto the right tail); B shares
    the fleet's failure for 10 s of the storage's clock (not 60 s more), then fills the
    blob again, right this time."""
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    target = f"/{MID_REPO}/resolve/main/shard.bin"
    ahead, behind = ProcessClock(tmp_path / "clock-a"), ProcessClock(tmp_path / "clock-b")
    ahead.advance(60.0)
    a, b = fleet.start(clock=ahead), fleet.start(clock=behind)
    store = fleet.store()
    fleet.front.flip_byte(sha, offset=30 << 20)
    gets = [_start_get(a, MID_REPO) for _ in range(2)]
    for thread, _, _ in gets:
        thread.join(120)
    assert all(g[2][0].startswith(("cut", "short")) for g in gets), [g[2][0] for g in gets]
    wait_for(
        lambda: _parts(store, MID_REPO) == ["failed"], timeout=TEST_DEADLINE, what="the failed fill"
    )
    # A resume at B while the failure is fresh: never a 206 (its body is then cut, or a
    # 502: the failure is shared, not fetched again).
    assert _status(b, target, {"Range": "bytes=1000-"}) in (200, 502)
    assert len(_cdn_ranges(fleet.front, sha)) == 1
    for clock in (ahead, behind):
        clock.advance(NEGATIVE_FOR + 1)  # on every clock, so on the storage's as B counts it
    assert _raw_get(b, MID_REPO, [0]) == f"complete {sha}"
    assert len(_cdn_ranges(fleet.front, sha)) == 2
    for server in (b, a):  # the stock client's resume of its cut download: whole, never 206
        status, _, body = _get(server, target, {"Range": "bytes=1000-"})
        assert status == 200 and hashlib.sha256(body).hexdigest() == sha, status
    _wait_stored(store, sha)


def test_upstream_truncating_mid_fill_is_resumed_with_a_range(
    any_fleet: Fleet, origin: dict[str, Any]
) -> None:
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    replicas = [fleet.start(), fleet.start()]
    store = fleet.store()
    fleet.front.cut(after_bytes=(25 << 20) + 12345, path=sha)
    gets = [_start_get(replicas[i % 2], MID_REPO) for i in range(4)]
    for thread, _, _ in gets:
        thread.join(120)
    assert [g[2][0] for g in gets] == [f"complete {sha}"] * 4
    ranges = _cdn_ranges(fleet.front, sha)
    assert len(ranges) == 2 and ranges[1] == f"bytes={(25 << 20) + 12345}-", ranges
    _wait_stored(store, sha)  # whole bodies end before the fill stores the blob


def test_two_replicas_asked_for_the_same_cold_blob_at_once_fetch_it_once(
    any_fleet: Fleet, origin: dict[str, Any]
) -> None:
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    replicas = [fleet.start(), fleet.start()]
    store = fleet.store()
    barrier = threading.Barrier(2)
    outcomes: list[str] = ["", ""]

    def get(i: int) -> None:
        barrier.wait()
        outcomes[i] = _raw_get(replicas[i], MID_REPO, [0])

    threads = [threading.Thread(target=get, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert outcomes == [f"complete {sha}"] * 2
    assert len(_cdn_ranges(fleet.front, sha)) == 1
    wait_for(
        lambda: _stored_sha(store, MID_REPO, sha) == sha,
        timeout=TEST_DEADLINE,
        what="the blob stored",
    )
    # Each replica served a filling answer: neither waited for the other's whole fill.
    for server in replicas:
        assert server.log(route="resolve", status=200)


def test_a_renewal_answered_after_the_fill_ended_leaves_no_lease(
    fleet: Fleet, origin: dict[str, Any]
) -> None:
    """A thread renews a fill's lease while the fill runs. A renewal answered after the
    fill ended, once the fill had released its lease, left the lease rewritten and
    never released (the release found a lease that was no longer its last write): a way
    for a loaded run's wait for a fill's objects to go to time out. A fill now
    waits for a renewal under way before it releases its lease. Here the blob's
    completion is answered 2 s late, so a renewal comes meanwhile, and that renewal's
    answer 2 s later still."""
    sha = origin["blobs"][MID_REPO]
    completing = threading.Event()
    held: list[str] = []

    def late(request: S3Request) -> Break | None:
        blob = request.method == "POST" and request.key.endswith(f"/blobs/{sha}")
        if blob and "uploadId=" in request.path:  # the completion of the blob's upload
            completing.set()
            return Break(Fault.LATE, before_cut=lambda: time.sleep(2.0))
        renewal = request.method == "PUT" and request.key.endswith(f"/fills/{sha}/lease")
        if renewal and completing.is_set() and request.header("If-Match"):
            held.append(request.path)
            return Break(Fault.LATE, before_cut=lambda: time.sleep(2.0))
        return None

    proxy = S3Proxy(fleet.env["AWS_ENDPOINT_URL"], late)
    try:
        fleet.env["AWS_ENDPOINT_URL"] = proxy.endpoint
        replica = fleet.start()
        store = fleet.store()
        assert _raw_get(replica, MID_REPO, [0]) == f"complete {sha}"
        wait_for(lambda: _stored_sha(store, MID_REPO, sha) == sha, "the blob stored")
        wait_for(lambda: bool(held), "a renewal while the blob's completion is answered")
        wait_for(lambda: _parts(store, MID_REPO) == [], "the fill's objects gone", timeout=20)
    finally:
        proxy.stop()


def test_a_fill_uploads_its_bytes_once(any_fleet: Fleet, origin: dict[str, Any]) -> None:
    """Issue 37: the parts became the blob by a second upload of the same bytes (a
    multipart upload fed beside them); now the storage copies the parts into the blob."""
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    proxy = S3Proxy(fleet.env["AWS_ENDPOINT_URL"])
    try:
        fleet.env["AWS_ENDPOINT_URL"] = proxy.endpoint
        replica = fleet.start()
        store = fleet.store()
        assert _raw_get(replica, MID_REPO, [0]) == f"complete {sha}"
        _wait_stored(store, sha)
        wait_for(lambda: not list(store.objects.list(f"{FOLDER[MID_REPO]}/.cmh/fills")),
                 "the fill's parts deleted")  # fmt: skip
        assert (
            store.read_check(FOLDER[MID_REPO], sha)
            == store.objects.head(f"{FOLDER[MID_REPO]}/blobs/{sha}").etag
        )
        put = [int(e.request.header("Content-Length") or 0) for e in proxy.exchanges
               if e.request.method == "PUT"]  # fmt: skip
        assert MID <= sum(put) < MID + (1 << 20), (sum(put), len(put))  # each byte once
    finally:
        proxy.stop()


def test_a_fleet_replica_behind_nginx_x_accel_fills_then_nginx_sends(
    fleet: Fleet, origin: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 37: ``--blob-delivery x-accel`` over a pull-through bucket: a blob the bucket
    lacks is filled and sent by cmh (one upstream transfer), a stored one by nginx from
    the storage (the replica logs no body byte for it)."""
    from types import SimpleNamespace

    from nginx_support import Nginx

    sha = origin["blobs"][MID_REPO]
    replica = fleet.start("--blob-delivery", "x-accel")
    nginx = Nginx(None, f"127.0.0.1:{replica.port}", tmp_path / "nginx",
                  storage=fleet.env["AWS_ENDPOINT_URL"])  # fmt: skip
    try:
        front: Any = SimpleNamespace(host="127.0.0.1", port=nginx.port)
        assert _raw_get(front, MID_REPO, [0]) == f"complete {sha}"  # filled by cmh
        _wait_stored(fleet.store(), sha)
        assert _raw_get(front, MID_REPO, [0]) == f"complete {sha}"  # sent by nginx
        gets = replica.log(route="resolve", method="GET", status=200)
        assert [e["bytes"] for e in gets][-1] == 0 and gets[0]["bytes"] == MID
        assert len(_cdn_ranges(fleet.front, sha)) == 1
    finally:
        nginx.stop()


def _part_copies(proxy: S3Proxy) -> list[S3Request]:
    """The part copies (``UploadPartCopy``) the storage answered, in order."""
    return [e.request for e in proxy.exchanges
            if e.request.method == "PUT" and e.request.header("x-amz-copy-source")
            and "partNumber=" in e.request.path]  # fmt: skip


def _last_part_put(proxy: S3Proxy) -> int:
    """Index in the exchanges of the PUT of the fill's last part (-1: none yet)."""
    last = f"part-{(MID - 1) // (8 << 20):06d}"
    found = [i for i, e in enumerate(proxy.exchanges)
             if e.request.method == "PUT" and e.request.path.split("?")[0].endswith(last)
             and not e.request.header("x-amz-copy-source")]  # fmt: skip
    return found[0] if found else -1


def _get_answer(server: MirrorServer, repo: str) -> tuple[str, str | None]:
    """GET a whole file: its outcome ("complete <sha>" or what went wrong) and its
    ``X-Cmh-Filling`` header (``None``: not a filling answer)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    try:
        conn.request("GET", f"/{repo}/resolve/main/shard.bin")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            return f"status {response.status}", None
        outcome = f"complete {hashlib.sha256(body).hexdigest()}"
        return outcome, response.headers.get("X-Cmh-Filling")
    except (OSError, http.client.HTTPException) as exc:
        return f"cut {type(exc).__name__}", None
    finally:
        conn.close()


def _completions(proxy: S3Proxy) -> list[int]:
    """Indexes in the exchanges of the multipart uploads completed."""
    return [i for i, e in enumerate(proxy.exchanges)
            if e.request.method == "POST" and "uploadId=" in e.request.path]  # fmt: skip


def test_the_copies_wait_for_the_last_byte_and_the_hashed_parts_are_sent_meanwhile(
    any_fleet: Fleet, origin: dict[str, Any]
) -> None:
    """Issue 37: each part was copied into the blob as soon as it was stored, and on a
    storage sharing the fill's cores those copies took a third of its CPU while the
    clients waited for bytes. The copies now start once the whole hash matched (none
    before the last part is stored). Until the blob is made (its upload's completion held
    here), a GET of it is sent the parts as hashed, whole, not as a filling answer: at the
    filling replica, and at another one (from the ``hashed`` record). The blob appears only
    with the completion. The parts are not deleted while a body sent from them at the
    filling replica is held mid-part; a body at the other replica (held meanwhile) whose
    next part is then gone goes on from the blob. Nothing is left behind."""
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    folder = FOLDER[MID_REPO]
    blob = f"{folder}/blobs/{sha}"
    completing = threading.Event()  # the upload's completion goes on
    hold = {"part-000001": threading.Event(), "part-000002": threading.Event()}
    held = {name: threading.Event() for name in hold}  # a presigned GET of it is held
    goes = {name: threading.Event() for name in hold}  # ... until this is set

    def hook(request: S3Request) -> Fault | Break | None:
        if request.method == "POST" and "uploadId=" in request.path:
            completing.wait(TEST_DEADLINE)
        for name, armed in hold.items():
            if (armed.is_set() and request.method == "GET" and name in request.path
                    and "X-Amz-Signature=" in request.path):  # fmt: skip
                armed.clear()

                def pause(name: str = name) -> None:
                    held[name].set()
                    goes[name].wait(TEST_DEADLINE)

                return Break(Fault.PAUSE, pause)
        return None

    def get(server: MirrorServer, into: list[tuple[str, str | None]]) -> threading.Thread:
        thread = threading.Thread(target=lambda: into.append(_get_answer(server, MID_REPO)))
        thread.start()
        return thread

    proxy = S3Proxy(fleet.env["AWS_ENDPOINT_URL"], hook=hook)
    try:
        fleet.env["AWS_ENDPOINT_URL"] = proxy.endpoint
        replica = fleet.start()
        other = fleet.start()
        store = fleet.store()
        assert _get_answer(replica, MID_REPO) == (f"complete {sha}", "1")  # the cold fill
        wait_for(lambda: len(_part_copies(proxy)) == 5, timeout=TEST_DEADLINE,
                 what="the five parts copied")  # fmt: skip
        last_put = _last_part_put(proxy)
        copies = [i for i, e in enumerate(proxy.exchanges)
                  if e.request.method == "PUT"
                  and e.request.header("x-amz-copy-source")]  # fmt: skip
        assert last_put >= 0 and min(copies) > last_put, (last_put, copies)
        with pytest.raises(ObjectNotFound):
            store.objects.head(blob)  # not before the completion
        assert "hashed" in _parts(store, MID_REPO)
        for server in (replica, other):  # sent the hashed parts, not a filling answer
            assert _get_answer(server, MID_REPO) == (f"complete {sha}", None)
        elsewhere: list[tuple[str, str | None]] = []
        here: list[tuple[str, str | None]] = []
        hold["part-000001"].set()
        threads = [get(other, elsewhere)]
        assert held["part-000001"].wait(TEST_DEADLINE)
        hold["part-000002"].set()
        threads.append(get(replica, here))
        assert held["part-000002"].wait(TEST_DEADLINE)
        completing.set()  # the blob is made while both bodies are sent from the parts
        wait_for(lambda: _stored_sha(store, MID_REPO, sha) == sha, timeout=TEST_DEADLINE,
                 what="the blob made")  # fmt: skip
        made = store.objects.head(blob).etag  # its check record follows the blob
        wait_for(lambda: store.read_check(folder, sha) == made, timeout=TEST_DEADLINE,
                 what="the blob's check record")  # fmt: skip
        time.sleep(1.0)  # the fill had time to delete the parts: it waits for the body
        assert _stored_parts(store, MID_REPO, 5)
        goes["part-000002"].set()
        threads[1].join(TEST_DEADLINE)
        assert here == [(f"complete {sha}", None)]
        _wait_stored(store, sha)  # then the parts (and the record) are deleted
        goes["part-000001"].set()  # its next part is gone: the rest comes from the blob
        threads[0].join(TEST_DEADLINE)
        assert elsewhere == [(f"complete {sha}", None)]
        assert len(_part_copies(proxy)) == 5 and len(_completions(proxy)) == 1
        assert store.objects.list_uploads(folder) == ()
        assert _cdn_gets(fleet.front, sha) == 1
    finally:
        completing.set()
        for event in goes.values():
            event.set()
        proxy.stop()


def test_a_failed_fill_leaves_no_upload_of_its_copied_parts(
    fleet: Fleet, origin: dict[str, Any]
) -> None:
    """The parts copied during a fill whose hash then fails never become the blob: the
    upload they went to is aborted with the parts."""
    sha = origin["blobs"][MID_REPO]
    replica = fleet.start()
    store = fleet.store()
    fleet.front.flip_byte(sha, offset=30 << 20)
    assert not _raw_get(replica, MID_REPO, [0]).startswith("complete")
    wait_for(lambda: _parts(store, MID_REPO) == ["failed"], timeout=TEST_DEADLINE,
             what="the failed fill's end")  # fmt: skip
    assert _stored_sha(store, MID_REPO, sha) is None
    assert store.objects.list_uploads(FOLDER[MID_REPO]) == ()


@pytest.mark.parametrize("delivery", ["proxy", "redirect"])
def test_a_warm_blob_of_the_fleet_goes_by_the_stores_delivery(
    fleet: Fleet, origin: dict[str, Any], delivery: str
) -> None:
    """Issue 37: a blob the fleet filled is sent as a plain bucket store sends it, in
    each ``--blob-delivery`` (x-accel: the nginx test above): proxied whole by the replica
    from the stored object, or a redirect to the storage (the replica sends no body byte);
    a blob still missing is filled and sent by the replica in either mode."""
    sha = origin["blobs"][MID_REPO]
    filler, other = (
        fleet.start("--blob-delivery", delivery),
        fleet.start("--blob-delivery", delivery),
    )
    target = f"/{MID_REPO}/resolve/main/shard.bin"
    status, headers, body = _get(filler, target)  # cold: the replica fills and sends it
    assert status == 200 and headers.get("x-cmh-filling") == "1"
    assert hashlib.sha256(body).hexdigest() == sha
    _wait_stored(fleet.store(), sha)
    for replica in (filler, other):
        status, headers, body = _get(replica, target)
        assert "x-cmh-filling" not in headers
        if delivery == "redirect":
            assert status == 302 and body == b""
            assert headers["location"].startswith(fleet.env["AWS_ENDPOINT_URL"])
            assert headers["x-linked-etag"].strip('"') == sha
            with urllib.request.urlopen(headers["location"], timeout=60) as answer:
                body = answer.read()
        else:
            assert status == 200
        assert hashlib.sha256(body).hexdigest() == sha
        gets = replica.log(route="resolve", method="GET")
        assert gets[-1]["bytes"] == (0 if delivery == "redirect" else MID)
    assert len(_cdn_ranges(fleet.front, sha)) == 1


def test_storage_restarted_mid_fill_nothing_wrong_is_stored_and_the_fill_resumes(
    origin: dict[str, Any], tmp_path: Path
) -> None:
    from seaweed import start_or_skip

    sha = origin["blobs"][MID_REPO]
    front: HubLike = origin["front"]
    front.clear_records()
    front.clear_faults()
    server = start_or_skip(tmp_path / "weed")
    try:
        bucket = SeaweedBucket(server, server.bucket, "restart/")
        env = isolated_aws_env(bucket, tmp_path)
        fleet = Fleet(bucket, front, tmp_path / "logs", env)
        try:
            first, second = fleet.start(lease_ttl=2.0), fleet.start(lease_ttl=2.0)
            store = fleet.store()
            front.stall(after_bytes=20 << 20, seconds=6, path=sha)  # a window to restart in
            thread, _, outcome = _start_get(first, MID_REPO)
            wait_for(lambda: _stored_parts(store, MID_REPO, 2), what="two parts stored")
            # Down past the upstream's 6 s pause, so the fill meets the outage when its
            # bytes flow again (a storage back within the pause goes unnoticed).
            server.restart(down_for=6.0)
            thread.join(120)
            # The first client got the whole blob (the fill rode out the outage) or was cut
            # before its last byte: never a complete wrong body.
            assert outcome[0] == f"complete {sha}" or not outcome[0].startswith("complete"), outcome
            again, _, second_outcome = _start_get(second, MID_REPO)
            again.join(120)
            assert second_outcome[0] == f"complete {sha}", second_outcome
            wait_for(
                lambda: _stored_sha(store, MID_REPO, sha) == sha,
                timeout=TEST_DEADLINE,
                what="the blob stored",
            )
            wait_for(
                lambda: not [p for p in _parts(store, MID_REPO) if p.startswith("part-")],
                timeout=TEST_DEADLINE,
                what="the parts deleted",
            )
            front.wait_idle()  # the stalled first transfer is recorded once it ends
            ranges = _cdn_ranges(front, sha)
            # The parts stored before the restart were kept and used: no second transfer
            # from byte 0 (a record is written when its transfer ends: in any order).
            said = (first.stderr_text()[-3000:], second.stderr_text()[-3000:])
            assert ranges.count(None) == 1, (ranges, said)
        finally:
            fleet.stop()
    finally:
        server.stop()


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


def _revision_asks(front: HubLike, revision: str) -> int:
    return len(front.records(origin="hub", path=f"/api/models/{SMALL_REPO}/revision/{revision}$"))


FRESH_FOR = 30.0  # the replicas' --fresh-for in the test below
PAST_FRESH = FRESH_FOR + 1.5  # an advance that passes it on both replicas' views


def test_fleet_keeps_local_pull_through_behaviour(
    any_fleet: Fleet, origin: dict[str, Any], process_clock: ProcessClock
) -> None:
    """Freshness per fleet, pinned commits, typed errors, tokens, manifests, stale answers."""
    fleet = any_fleet
    sha = origin["blobs"][SMALL_REPO]
    # --fresh-for long enough that a loaded machine's real time never makes a validation
    # stale between two steps; the test's advances pass it by more than the storage
    # clock's resolution (1 s: two replicas' views of it may differ by up to that).
    a, b = (fleet.start("--fresh-for", f"{FRESH_FOR:g}s", clock=process_clock) for _ in range(2))
    store = fleet.store()
    status, _, body = _get(a, f"/api/models/{SMALL_REPO}/revision/main")
    assert status == 200, (body, a.stderr_text()[-3000:])
    commit = json.loads(body)["sha"]
    assert _revision_asks(fleet.front, "main") == 1
    status, _, _ = _get(b, f"/api/models/{SMALL_REPO}/revision/main")
    assert status == 200 and _revision_asks(fleet.front, "main") == 1  # A's validation serves B
    # The upstream's refusals, typed as the Hub types them.
    status, headers, _ = _get(b, "/api/models/nobody/nothing/revision/main")
    assert (status, headers.get("x-error-code")) == (404, "RepoNotFound")
    status, headers, _ = _get(b, f"/api/models/{SMALL_REPO}/revision/no-such-branch")
    assert (status, headers.get("x-error-code")) == (404, "RevisionNotFound")
    status, headers, _ = _get(b, f"/{SMALL_REPO}/resolve/main/no-such-file.txt")
    assert (status, headers.get("x-error-code")) == (404, "EntryNotFound")
    # A client's token is never sent upstream; the upstream's never reaches the CDN.
    secret = "Bearer hf_client_secret_never_forwarded"
    status, _, data = _get(
        b, f"/{SMALL_REPO}/resolve/main/model.safetensors", {"Authorization": secret}
    )
    assert status == 200 and hashlib.sha256(data).hexdigest() == sha
    assert not any(secret in json.dumps(r.headers) for r in fleet.front.records())
    assert not fleet.front.cdn_saw_authorization
    # Small files (git blob ids, served by the Hub itself, gzip) and an empty one.
    config = b'{"model_type": "fleet-small"}\n'
    assert _get(b, f"/{SMALL_REPO}/resolve/main/config.json")[::2] == (200, config)
    assert _get(a, f"/{SMALL_REPO}/resolve/main/empty.txt")[::2] == (200, b"")
    # The tensor manifest of the filled safetensors blob is kept in the bucket.
    manifest = f"{FOLDER[SMALL_REPO]}/.cmh/manifests/{sha}.json"
    wait_for(lambda: _exists(store, manifest), timeout=TEST_DEADLINE, what="the tensor manifest")
    status, _, body = _get(a, f"/api/cmh/manifest/{SMALL_REPO}/resolve/main/model.safetensors")
    assert status == 200 and len(json.loads(body)["tensors"]) == 4
    process_clock.advance(PAST_FRESH)  # --fresh-for passes on both replicas
    # A commit id never revalidates its content; who may read it is asked again once per
    # --fresh-for by each replica (the commit's revision answer: no listing, no file).
    before = len(fleet.front.records(origin="hub", path="/revision/"))
    for server in (a, b, a, b):
        assert _get(server, f"/api/models/{SMALL_REPO}/revision/{commit}")[0] == 200
    asked = fleet.front.records(origin="hub", path="/revision/")[before:]
    assert [r.path for r in asked] == [f"/api/models/{SMALL_REPO}/revision/{commit}"] * 2
    # Both replicas asked at once for the stale branch: one revalidation for the fleet.
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(lambda s: _get(s, f"/api/models/{SMALL_REPO}/revision/main")[0], (a, b))
        )
    assert answers == [200, 200]
    assert _revision_asks(fleet.front, "main") == 2
    process_clock.advance(PAST_FRESH)
    # The upstream failing: the held copy answers, with a Warning.
    fleet.front.fail(503, times=50, path=f"/api/models/{SMALL_REPO}/revision/main")
    status, headers, _ = _get(a, f"/api/models/{SMALL_REPO}/revision/main")
    assert status == 200 and headers.get("warning", "").startswith("110"), headers


class _ReplicaClock(Clock):
    """A replica's clock: the real one plus an offset the test moves; while ``held``, its
    sleeps (the replica's waits for another's revalidation) last until ``release``."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.waiting = threading.Event()
        self._go = threading.Event()
        self._go.set()

    def time(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def sleep(self, seconds: float) -> None:
        self.waiting.set()
        assert self._go.wait(60), "the test never released the replica"
        time.sleep(min(seconds, 0.05))

    def hold(self) -> None:
        self._go.clear()

    def release(self) -> None:
        self._go.set()


def _in_process_replica(fleet: Fleet, clock: Clock, ref_ttl: float) -> Upstream:
    """One replica's pull-through policy over the fleet's bucket, in this process (3 s
    of freshness), asking the fleet's upstream."""
    saved = dict(os.environ)
    os.environ.update(fleet.env)
    try:
        store = BucketStore.open(fleet.bucket.url, clock=clock)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    pull = BucketPullThrough(store, BucketReader(store, ref_ttl=ref_ttl), 3.0)
    return Upstream(pull, UpstreamConfig(fleet.front.url, fresh_for=3.0), clock=clock)


def _stale_fleet(fleet: Fleet, b_ref_ttl: float) -> tuple[Upstream, Upstream, list[_ReplicaClock]]:
    """Replicas A and B; A validated ``main``, then its 3 s of freshness passed."""
    clocks = [_ReplicaClock(), _ReplicaClock()]
    a = _in_process_replica(fleet, clocks[0], 0.0)
    b = _in_process_replica(fleet, clocks[1], b_ref_ttl)
    assert a.prepare("model", SMALL_REPO, "main") is None
    assert _revision_asks(fleet.front, "main") == 1
    for replica in (a, b):  # each looks at the storage's clock, then 4 s pass
        replica.pull.store.storage_time()
    for clock in clocks:
        clock.offset += 4.0
    assert not a.fresh("model", SMALL_REPO, "main") and not b.fresh("model", SMALL_REPO, "main")
    return a, b, clocks


def _land_validation(replica: Upstream) -> None:
    """The winner's revalidation ends: its record (and ref) written, as ``prepare`` does."""
    commit = replica.pull.held("model", SMALL_REPO, "main")
    replica.pull.validated("model", SMALL_REPO, "main", commit, pinned=False)


def test_a_replica_that_looks_late_answers_from_the_winners_revalidation(
    any_fleet: Fleet,
) -> None:
    """B lost the claim and waits; A's validation lands; B looks again only after more
    than ``--fresh-for`` passed (a loaded machine): B answers from A's validation, the
    fleet asked the upstream once (issue 40: B asked again)."""
    a, b, (_, b_clock) = _stale_fleet(any_fleet, 0.0)
    assert a.pull.claim("model", SMALL_REPO, "main")  # A won and asks the upstream
    b_clock.hold()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(b.prepare, "model", SMALL_REPO, "main")
        assert b_clock.waiting.wait(60), "B did not wait for A's revalidation"
        _land_validation(a)
        b_clock.offset += 3.5  # B's next look comes late: A's validation is 3.5 s old
        b_clock.release()
        assert pending.result(60) is None
    assert _revision_asks(any_fleet.front, "main") == 1
    assert b.pull.held("model", SMALL_REPO, "main") == a.pull.held("model", SMALL_REPO, "main")


def test_a_validation_landing_before_the_claim_serves_the_replica(any_fleet: Fleet) -> None:
    """B judged ``main`` stale from the record it read (kept ``--ref-ttl``); A's validation
    lands before B claims: B's claim reads the record and answers from it (no ask)."""
    a, b, (_, b_clock) = _stale_fleet(any_fleet, 60.0)  # B keeps what it read for 60 s
    _land_validation(a)
    assert b.prepare("model", SMALL_REPO, "main") is None
    assert _revision_asks(any_fleet.front, "main") == 1
    b_clock.offset += 3.5  # A's validation went stale too
    b.pull._forget("model", SMALL_REPO, "main")
    assert b.prepare("model", SMALL_REPO, "main") is None
    assert _revision_asks(any_fleet.front, "main") == 2  # then B revalidates, once


def _exists(store: BucketStore, name: str) -> bool:
    try:
        store.objects.head(name)
        return True
    except ObjectStoreError:
        return False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--fill-lease-ttl", "0"), "0 seconds is not a lease lifetime: give 2 to 3600"),
        (("--fill-lease-ttl", "nan"), "nan seconds is not a lease lifetime"),
        (("--fill-lease-ttl", "1e9"), "give 2 to 3600 seconds"),
        (("--fill-lease-ttl", "1"), "1 seconds is not a lease lifetime: give 2 to 3600"),
        (("--fill-lease-ttl", "soon"), "'soon' is not a valid float"),
    ],
)
def test_fill_lease_ttl_out_of_range_is_a_usage_error(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    from click.testing import CliRunner
    from cmh.cli.main import cli

    store = "s3://cmh-test/fills"
    result = CliRunner().invoke(
        cli, ["serve", "--store", store, "--upstream", "http://127.0.0.1:9", *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_fill_lease_ttl_needs_upstream_and_a_bucket(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from cmh.cli.main import cli

    folder = tmp_path / "store"
    result = CliRunner().invoke(cli, ["serve", "--store", str(folder), "--fill-lease-ttl", "5"])
    assert result.exit_code == 2 and "--fill-lease-ttl needs --upstream" in result.output
    result = CliRunner().invoke(
        cli, ["serve", "--store", str(folder), "--upstream", "http://127.0.0.1:9",
              "--fill-lease-ttl", "5"],
    )  # fmt: skip
    assert result.exit_code == 2 and "applies to bucket stores" in result.output
    assert not folder.exists()  # refused before anything was made
    help_text = CliRunner().invoke(cli, ["serve", "--help"]).output
    assert "--fill-lease-ttl SECONDS" in help_text
