"""``cmh prune`` on a bucket store aborts the incomplete multipart uploads a killed import
left, once they are older than ``--stale-incomplete`` (on SeaweedFS and moto, started by
the fixtures). Ages are on the storage's clock; the plan is judged later instead of
waiting a day."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bucket_support import S3_KINDS, use_bucket
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.mirror import BucketStore
from cmh.hub.prune import PrunePolicy, execute_bucket_plan, plan_prune, scan_bucket

DAY = 86400.0
BLOB = "models--cmh-test--uploads/blobs/" + "a" * 64


@pytest.fixture(params=S3_KINDS)
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BucketStore]:
    bucket = request.getfixturevalue(f"{request.param}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    yield BucketStore.open(bucket.url)


def killed_upload(store: BucketStore, name: str) -> str:
    """Start a multipart upload of ``name``, send one part and never complete it."""
    client = store.objects._s3_client()
    bucket, key = store.objects.location.bucket, store.objects.location.key(name)
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"x" * 1000)
    return str(upload_id)


def test_stale_uploads_are_aborted_and_fresh_ones_kept(store: BucketStore) -> None:
    upload_id = killed_upload(store, BLOB)
    [listed] = store.objects.list_uploads()
    assert (listed.name, listed.upload_id, listed.size) == (BLOB, upload_id, 1000)
    policy = PrunePolicy()
    scan = scan_bucket(store)
    assert plan_prune(scan, policy).empty  # just written: it may be an import in flight
    later = plan_prune(scan, policy, time.time() + 2 * DAY)
    [item] = later.root_items
    assert (item.kind, item.path, item.reason) == ("upload", f"{BLOB}?uploadId={upload_id}",
                                                   "stale")  # fmt: skip
    report = execute_bucket_plan(store, later, settle=0)
    assert report.root_items == [item] and not report.all_errors
    assert store.objects.list_uploads() == ()


def test_the_cli_lists_stale_uploads(store: BucketStore) -> None:
    killed_upload(store, BLOB)
    url = str(store.objects.location)
    now = CliRunner().invoke(cli, ["prune", "--store", url, "--dry-run"])
    assert now.exit_code == 0, now.output
    assert "upload" not in now.stdout
    later = CliRunner().invoke(cli, ["prune", "--store", url, "--dry-run", "--at", "+2d"])
    assert later.exit_code == 0, later.output
    assert "store root\n  upload x1 (stale: interrupted or spent" in later.stdout


#: Keys another tool may leave under the prefix that cmh never makes (moto and ministack
#: take them as they are).
ODD_KEYS = ("models--cmh-test--uploads/a//b", "models--cmh-test--uploads/../escape", "./x")


@pytest.mark.parametrize("kind", ["moto", "ministack"])
def test_stale_uploads_of_names_cmh_never_makes_are_aborted(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: an upload listed under the prefix whose key has an empty, ``.`` or ``..``
    segment was planned for abort, then refused by cmh's own name check: an error every
    run, and its parts never freed. It is aborted by the key the storage listed."""
    bucket = request.getfixturevalue(f"{kind}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    store = BucketStore.open(bucket.url)
    client, name = store.objects._s3_client(), store.objects.location.bucket
    ids = {}
    for key in ODD_KEYS:
        full = store.objects.location.prefix + key
        upload_id = client.create_multipart_upload(Bucket=name, Key=full)["UploadId"]
        client.upload_part(Bucket=name, Key=full, UploadId=upload_id, PartNumber=1, Body=b"x")
        ids[key] = str(upload_id)
    assert sorted((u.name, u.upload_id) for u in store.objects.list_uploads()) == sorted(
        ids.items()
    )
    later = plan_prune(scan_bucket(store), PrunePolicy(), time.time() + 2 * DAY)
    assert sorted(i.path for i in later.root_items) == sorted(
        f"{k}?uploadId={v}" for k, v in ids.items()
    )
    report = execute_bucket_plan(store, later, settle=0)
    assert not report.all_errors and len(report.root_items) == len(ODD_KEYS)
    assert store.objects.list_uploads() == ()
