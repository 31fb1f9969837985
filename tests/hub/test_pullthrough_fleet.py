"""Cluster pull-through: ``cmh serve --store s3://... --upstream URL`` on several replicas,
part one: a cold 256 MiB blob to eight stock clients, and fills interrupted (a filler
killed, its lease lost or taken over, a lease renewal answered late, the storage
restarted). Part two (upstream faults, deliveries, freshness for the fleet) is
``test_pullthrough_fleet_faults.py``; the two files let ``--dist loadfile`` run them on
two workers.

The chain: stock huggingface_hub clients -> two ``cmh serve`` replicas over one
SeaweedFS bucket prefix (tests/hub/seaweed.py) -> ``tests/hub/hublike.py`` (302 to a
signed CDN, paginated trees, ``xetHash`` in listings) -> an origin ``cmh serve`` of a
local store (``fleet_support.py``). Every process is real; fill leases use a short
lifetime (``cmh serve --fill-lease-ttl``), measured on the storage's clock.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from bucket_support import Break, Fault, S3Proxy, S3Request, isolated_aws_env
from cmh.hub.mirror.stores.bucket._objectstore import ObjectStoreError
from deadline_support import TEST_DEADLINE
from fleet_support import (
    BIG,
    BIG_REPO,
    CLIENT_SCRIPT,
    FOLDER,
    MID,
    MID_REPO,
    Fleet,
    _cdn_gets,
    _cdn_ranges,
    _fleet,
    _incomplete_size,
    _parts,
    _raw_get,
    _start_get,
    _stored_parts,
    _stored_sha,
    _wait_stored,
)
from fleet_support import origin as fleet_origin
from hublike import HubLike
from mirror_support import hf_env, run_python, wait_for
from seaweed import SeaweedBucket


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The origin behind the Hub-like front (``fleet_support.origin``), with the 256 MiB blob."""
    yield from fleet_origin(tmp_path_factory, big=True)


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
