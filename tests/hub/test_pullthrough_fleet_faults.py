"""Cluster pull-through, part two (part one: ``test_pullthrough_fleet.py``): upstream
faults during a fleet's fill (a flipped byte, a truncated body, two replicas asked at
once, clocks 60 s apart), how a filled blob is stored and delivered, and the local
pull-through behaviour (freshness, typed errors, tokens) kept by the fleet.

The chain is ``fleet_support.py``'s: stock clients -> replicas over one bucket prefix ->
``hublike.py`` -> an origin ``cmh serve``. Every process is real.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from bucket_support import Break, Fault, S3Proxy, S3Request
from cmh.hub.cache import Clock
from cmh.hub.mirror._upstream import NEGATIVE_FOR, Upstream, UpstreamConfig
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from cmh.hub.mirror.stores.bucket._objectstore import ObjectNotFound
from cmh.hub.mirror.stores.bucket._pull import BucketPullThrough
from cmh.hub.mirror.stores.bucket._read import BucketReader
from deadline_support import TEST_DEADLINE
from fleet_support import (
    FOLDER,
    MID,
    MID_REPO,
    SMALL_REPO,
    Fleet,
    _cdn_gets,
    _cdn_ranges,
    _exists,
    _get,
    _parts,
    _raw_get,
    _start_get,
    _stored_parts,
    _stored_sha,
    _wait_stored,
)
from fleet_support import origin as fleet_origin
from hublike import HubLike
from mirror_support import MirrorServer, ProcessClock, wait_for


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The origin behind the Hub-like front (``fleet_support.origin``)."""
    yield from fleet_origin(tmp_path_factory, big=False)


def test_upstream_flipping_a_byte_mid_fill_cuts_every_client_and_stores_nothing(
    any_fleet: Fleet, origin: dict[str, Any], process_clock: ProcessClock
) -> None:
    fleet = any_fleet
    sha = origin["blobs"][MID_REPO]
    replicas = [fleet.start(), fleet.start()]
    # Asked only once the fill failed, and within the 10 s of the fleet's negative cache:
    # started now, as a replica that starts later (and asks nothing before) would be, so
    # that its start does not use those 10 s on a loaded machine.
    later = fleet.start(clock=process_clock)
    store = fleet.store()
    fleet.front.flip_byte(sha, offset=30 << 20)
    gets = [_start_get(replicas[i % 2], MID_REPO) for i in range(4)]
    for thread, _, _ in gets:
        thread.join(120)
    outcomes = [g[2][0] for g in gets]
    assert all(not o.startswith("complete") and not o.startswith("status 2") for o in outcomes), (
        outcomes
    )
    assert all(g[1][0] < MID for g in gets)  # the last byte never sent
    # The fill ends after its clients were cut: the parts go, the failure is told.
    wait_for(
        lambda: _parts(store, MID_REPO) == ["failed"],
        timeout=TEST_DEADLINE,
        what="the failed fill's end",
    )
    assert len(_cdn_ranges(fleet.front, sha)) == 1  # the failure was shared, not re-fetched
    # A replica asked within 10 s shares the failure (the fleet's negative cache); asked
    # once they passed on the storage's clock, it fills the blob again, right this time.
    assert not _raw_get(later, MID_REPO, [0]).startswith("complete")  # 502, or cut at byte 0
    assert _stored_sha(store, MID_REPO, sha) is None  # nothing under the blob's name
    assert len(_cdn_ranges(fleet.front, sha)) == 1
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
