"""Fleet records authenticated with a fleet key (issue 35): a co-tenant who can write to the
bucket cannot forge the records the replicas of a pull-through fleet share.

Each record type is written forged four ways (unsigned, signed with another key, a
genuine record moved to another name, a genuine record written again an hour later) and
read by the helpers every replica reads it through; a genuine one (the control) is
trusted. Over SeaweedFS and moto's S3 server, both started by the tests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from bucket_support import S3_KINDS, Bucket, use_bucket
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.mirror import FleetKey, FleetKeyError, add_folder, read_fleet_key
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from cmh.hub.mirror.stores.bucket._pull import BucketPullThrough
from cmh.hub.mirror.stores.bucket._read import BucketReader
from fleet_support import Fleet, _cdn_ranges, _fleet, _get, _raw_get
from hublike import running
from mirror_support import MirrorServer

REPO = "fleet/keyed"
FOLDER = "models--fleet--keyed"
ETAG = "a" * 64
COMMIT = "c" * 40
KEY = b"k" * 32
OTHER_KEY = b"o" * 32


@pytest.fixture(params=S3_KINDS)
def bucket(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    found = request.getfixturevalue(f"{request.param}_bucket")
    use_bucket(found, tmp_path, monkeypatch)
    monkeypatch.delenv("CMH_FLEET_KEY_FILE", raising=False)
    return found


def _pull(bucket: Bucket, key: bytes | None) -> BucketPullThrough:
    store = BucketStore.open(bucket.url, fleet_key=None if key is None else FleetKey(key))
    return BucketPullThrough(store, BucketReader(store, ref_ttl=0.0), 3600.0)


class Record:
    """One record type: its object name, a body cmh writes, and whether the reader trusts
    what is stored under the name."""

    def __init__(
        self, name: str, body: Callable[[float], bytes], trusted: Callable[[Any], bool]
    ) -> None:
        self.name, self.body, self.trusted = name, body, trusted


FILLS = f"{FOLDER}/.cmh/fills/{ETAG}"
LEASE = f"{FILLS}/lease"


def _lease_held(pull: BucketPullThrough) -> bool:
    """True when the stored lease keeps this replica from taking it (a fresh lease)."""
    taken = pull.store.take_lease(FOLDER, "a replica", name=LEASE, ttl=30.0)
    if taken:
        pull.store.release_lease(FOLDER, name=LEASE)
    return not taken


RECORDS = {
    "failed": Record(
        f"{FILLS}/failed",
        lambda at: json.dumps({"at": at, "error": "the upstream's blob was bad"}).encode(),
        lambda pull: pull._failure(FILLS) is not None,
    ),
    "cut": Record(
        f"{FOLDER}/.cmh/cuts/{ETAG}",
        lambda at: f"{at:.3f}\n".encode(),
        lambda pull: pull.recently_cut("model", REPO, ETAG),
    ),
    "access": Record(
        f"{FOLDER}/.cmh/upstream/access.json",
        lambda at: json.dumps({"private": False, "gated": True, "at": at}).encode(),
        lambda pull: pull.gated("model", REPO),
    ),
    "validation": Record(
        f"{FOLDER}/.cmh/upstream/validated/main",
        lambda at: json.dumps({"commit": COMMIT, "at": at}).encode(),
        lambda pull: pull._validation(FOLDER, "main")[0].get("commit") == COMMIT,
    ),
    "lease": Record(
        LEASE,
        lambda at: json.dumps({"owner": "replica x", "ttl": 30.0, "nonce": "n"}).encode(),
        _lease_held,
    ),
    "check": Record(
        f"{FOLDER}/.cmh/checked/{ETAG}",
        lambda at: json.dumps({"storage_etag": '"abc"'}).encode(),
        lambda pull: pull.store.read_check(FOLDER, ETAG) == '"abc"',
    ),
    "freshness": Record(
        f"{FOLDER}/.cmh/upstream/{COMMIT}.json",
        lambda at: json.dumps({"fresh_until": at + 600, "at": at}).encode(),
        lambda pull: pull.store.read_upstream_freshness(FOLDER, COMMIT) is not None,
    ),
}


def _forged(kind: str, record: Record, now: float) -> bytes:
    body = record.body(now)
    if kind == "unsigned":  # as written without a key (or by hand)
        return body
    if kind == "other key":
        return FleetKey(OTHER_KEY).seal(record.name, body, now)
    if kind == "moved":  # the fleet's own record of another repo, copied here
        other = record.name.replace(FOLDER, "models--fleet--other")
        return FleetKey(KEY).seal(other, body, now)
    assert kind == "replayed"  # the fleet's own record, written again an hour later
    return FleetKey(KEY).seal(record.name, body, now - 3600)


@pytest.mark.parametrize("kind", ["unsigned", "other key", "moved", "replayed"])
def test_a_forged_fleet_record_of_each_type_is_ignored(
    bucket: Bucket, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every record type forged: no reader trusts it, each refusal is logged once; the
    same record written by the fleet (sealed with its key, now) is trusted."""
    pull = _pull(bucket, KEY)
    now = pull.store.storage_time()
    caplog.set_level(logging.WARNING, logger="cmh.hub.mirror")
    for what, record in RECORDS.items():
        pull.objects.put(record.name, _forged(kind, record, now))
        assert not record.trusted(pull), (what, kind)
        assert not record.trusted(pull), (what, kind)  # read again: still not
        told = [r for r in caplog.records if record.name in r.getMessage()]
        assert len(told) == 1, (what, [r.getMessage() for r in caplog.records])
        pull.objects.delete(record.name)
        pull.store.put_record(record.name, record.body(pull.store.storage_time()))
        assert record.trusted(pull), what  # the fleet's own record: trusted
        pull.objects.delete(record.name)


def test_without_a_key_records_are_trusted_as_before_and_signed_ones_read(
    bucket: Bucket,
) -> None:
    """No key: an unsigned record is trusted (today's behaviour), and so is one a keyed
    replica wrote (its signature is not checked, its body is read)."""
    keyless = _pull(bucket, None)
    keyed = _pull(bucket, KEY)
    for what, record in RECORDS.items():
        keyless.objects.put(record.name, record.body(keyless.store.storage_time()))
        assert record.trusted(keyless), what
        keyless.objects.delete(record.name)
        keyed.store.put_record(record.name, record.body(keyed.store.storage_time()))
        assert record.trusted(keyless), what
        keyless.objects.delete(record.name)


def test_an_oversized_ref_or_record_is_unreadable_and_its_body_not_read(
    bucket: Bucket,
) -> None:
    """A co-tenant's ref or record larger than any cmh writes is not read (its size is
    seen in the answer's headers): it reads as unreadable, even when its bytes begin as a
    valid record (here: a valid body padded with whitespace, which a whole read trusts)."""
    from cmh.hub.mirror.stores.bucket._bucket import MAX_RECORD_BYTES, MAX_REF_BYTES
    from cmh.hub.mirror.stores.bucket._objectstore import ObjectTooLarge

    keyless = _pull(bucket, None)
    for what, record in RECORDS.items():
        if what in ("lease", "cut"):  # keyless, any bytes there hold a lease until it ages
            continue  # and cut a blob (the safe side): only their Last-Modified is read
        body = record.body(keyless.store.storage_time())
        keyless.objects.put(record.name, body + b" " * (MAX_RECORD_BYTES - len(body)))
        assert record.trusted(keyless), what  # the bound itself: still read
        keyless.objects.put(record.name, body + b" " * (MAX_RECORD_BYTES + 1 - len(body)))
        assert not record.trusted(_pull(bucket, None)), what  # a reader with no memory
        keyless.objects.delete(record.name)
    ref = keyless.store.ref_name(FOLDER, "main")
    keyless.objects.put(ref, (COMMIT + "\n").encode().ljust(MAX_REF_BYTES + 1))
    state = keyless.store.read_ref(FOLDER, "main")
    assert state is not None and state.commit == "", state
    keyless.objects.put(ref, (COMMIT + "\n").encode().ljust(MAX_REF_BYTES))
    state = keyless.store.read_ref(FOLDER, "main")
    assert state is not None and state.commit == COMMIT, state
    with pytest.raises(ObjectTooLarge) as caught:
        keyless.objects.get_with_info(ref, limit=100)
    assert caught.value.info.size == MAX_REF_BYTES
    keyless.objects.delete(ref)


def test_a_fleet_key_file_is_checked(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    with pytest.raises(FleetKeyError, match="openssl rand -hex 32"):
        read_fleet_key(short)
    with pytest.raises(FleetKeyError, match="cannot read"):
        read_fleet_key(tmp_path / "missing.key")
    good = tmp_path / "fleet.key"
    good.write_text("ab" * 32 + "\n")
    assert read_fleet_key(good) == b"ab" * 32
    result = CliRunner().invoke(
        cli, ["serve", "--store", "s3://fleet-bucket/p/", "--fleet-key-file", str(short)]
    )
    assert result.exit_code == 2 and "--fleet-key-file" in result.output, result.output
    result = CliRunner().invoke(
        cli, ["serve", "--store", str(tmp_path), "--fleet-key-file", str(good)]
    )
    assert result.exit_code == 2 and "applies to bucket stores" in result.output, result.output


# -- a fleet: replicas with the same key cooperate, one with another key trusts nothing ----


E2E_REPO = "fleet/keyed"
E2E_SIZE = 20 << 20  # three parts: the two replicas' requests meet during the fill


@pytest.fixture(scope="module")
def small_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An origin ``cmh serve`` holding one 20 MiB file, behind the Hub-like front."""
    base = tmp_path_factory.mktemp("keyed-origin")
    src = base / "src"
    src.mkdir()
    data = hashlib.sha256(b"keyed").digest() * (E2E_SIZE // 32)
    (src / "shard.bin").write_bytes(data)
    (src / "config.json").write_text('{"model_type": "keyed"}\n')
    add_folder(base / "store", src, E2E_REPO)
    server = MirrorServer(base / "store", base / "logs")
    try:
        with running(server.url) as front:
            yield {"front": front, "sha": hashlib.sha256(data).hexdigest()}
    finally:
        server.stop()


@pytest.fixture
def keyed_fleet(
    seaweed_bucket: Any, small_origin: dict[str, Any], tmp_path: Path
) -> Iterator[Fleet]:
    yield from _fleet(seaweed_bucket, small_origin, tmp_path)


def _revision_asks(fleet: Fleet) -> int:
    return len(fleet.front.records(origin="hub", path=f"/api/models/{E2E_REPO}/revision/main$"))


def test_replicas_with_one_key_share_a_fill_and_one_with_another_key_trusts_none(
    keyed_fleet: Fleet, small_origin: dict[str, Any], tmp_path: Path
) -> None:
    """Two replicas with the same key: one upstream transfer for a blob both are asked for
    at once, one validation for both. A replica with another key does not take their
    validation (it asks the upstream itself). A replica without a key is warned at start."""
    fleet = keyed_fleet
    keys = []
    for name, secret in (("one.key", "1f" * 32), ("two.key", "2e" * 32)):
        keys.append(tmp_path / name)
        keys[-1].write_text(secret + "\n")
    a, b = (fleet.start("--fleet-key-file", str(keys[0])) for _ in range(2))
    assert "no --fleet-key-file" not in a.stderr_text()
    sha = small_origin["sha"]
    outcomes = ["", ""]
    barrier = threading.Barrier(2)

    def get(i: int) -> None:
        barrier.wait()
        outcomes[i] = _raw_get((a, b)[i], E2E_REPO, [0])

    threads = [threading.Thread(target=get, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert outcomes == [f"complete {sha}"] * 2
    assert len(_cdn_ranges(fleet.front, sha)) == 1  # the lease was honoured
    asked = _revision_asks(fleet)  # by the requests above (both at once: one or two)
    target = f"/api/models/{E2E_REPO}/revision/main"
    assert _get(a, target)[0] == 200 and _get(b, target)[0] == 200
    assert _revision_asks(fleet) == asked  # the fleet's validation, trusted by both
    other = fleet.start("--fleet-key-file", str(keys[1]))
    assert _get(other, target)[0] == 200 and _revision_asks(fleet) == asked + 1
    keyless = fleet.start()
    assert "WARNING: no --fleet-key-file" in keyless.stderr_text()
