"""The object-store primitives (``mirror.stores.bucket._objectstore``) against a real SeaweedFS.

Every request goes to a ``weed server`` started on 127.0.0.1 by the ``seaweed``
fixture (tests/hub/seaweed.py); no S3 mock.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
from cmh.hub.mirror.stores.bucket._objectstore import (
    MIN_PART_SIZE,
    Credentials,
    InvalidLocation,
    InvalidObjectName,
    InvalidRange,
    NoSuchBucket,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailed,
    S3Location,
    S3Settings,
    SettingsError,
)
from deadline_support import TEST_DEADLINE
from seaweed import ACCESS_KEY, SECRET_KEY, SeaweedBucket, _free_ports


@pytest.fixture
def aws_env(seaweed_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The standard AWS settings pointing at SeaweedFS; no profile files of the machine's."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in seaweed_bucket.aws_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance role
    return tmp_path


@pytest.fixture
def store(seaweed_bucket: SeaweedBucket, aws_env: Path) -> ObjectStore:
    """A store under this test's own prefix of the session's bucket."""
    return ObjectStore.open(seaweed_bucket.url)


def random_bytes(size: int, seed: int = 0) -> bytes:
    return hashlib.shake_256(seed.to_bytes(4, "big")).digest(size)


# -- location and settings ------------------------------------------------------------


def test_clients_are_imported_lazily() -> None:
    """Importing the module loads neither obstore nor botocore (cmh start-up stays light)."""
    code = (
        "import sys, cmh.hub.mirror.stores.bucket._objectstore as m\n"
        "m.S3Location.parse('s3://bucket/p')\n"
        "print(sorted(n for n in ('obstore', 'botocore', 'boto3') if n in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_parse_location() -> None:
    assert S3Location.parse("s3://bucket") == S3Location("bucket", "")
    assert S3Location.parse("s3://bucket/") == S3Location("bucket", "")
    assert S3Location.parse("s3://my.bucket-1/a/b") == S3Location("my.bucket-1", "a/b/")
    assert S3Location.parse("s3://bucket/a/b/") == S3Location("bucket", "a/b/")
    assert str(S3Location.parse("s3://bucket/a")) == "s3://bucket/a/"
    assert S3Location("b00", "p/").key("blobs/x") == "p/blobs/x"
    bad_urls = ["bucket/a", "http://bucket/a", "s3://", "s3://B", "s3://ab", "s3://a..b/x"]
    bad_urls += ["s3://bucket/a//b", "s3://bucket/../x", "s3://bucket/a?x=1", "s3://-bucket"]
    for bad in bad_urls:
        with pytest.raises(InvalidLocation):
            S3Location.parse(bad)
    for bad_name in ("", "/abs", "a//b", "a/./b", "../up", "a/..", "new\nline"):
        with pytest.raises(InvalidObjectName):
            S3Location("bucket", "").key(bad_name)


def test_settings_environment_order(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = S3Settings.from_environment()
    assert settings.endpoint == os.environ["AWS_ENDPOINT_URL"]
    assert settings.region == "us-east-1"
    assert settings.credentials is not None
    creds = settings.credentials()
    assert (creds.access_key_id, creds.secret_access_key) == (ACCESS_KEY, SECRET_KEY)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    settings = S3Settings.from_environment()
    assert (settings.endpoint, settings.region) == ("http://127.0.0.1:1", "eu-west-3")
    monkeypatch.delenv("AWS_REGION")
    assert S3Settings.from_environment().region == "ap-south-1"


def test_settings_from_variables_alone_skip_botocore(aws_env: Path) -> None:
    """Keys, endpoint and region in variables: the answer needs no botocore import."""
    code = (
        "import sys\nfrom cmh.hub.mirror.stores.bucket._objectstore import S3Settings\n"
        "s = S3Settings.from_environment()\n"
        "print(s.endpoint, s.region, s.source, 'botocore' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        os.environ["AWS_ENDPOINT_URL"],
        "us-east-1",
        "environment",
        "False",
    ]


def test_settings_endpoint_from_config_file_with_keys_in_variables(
    seaweed_bucket: SeaweedBucket, aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys in variables, endpoint and region only in the default profile's config."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_REGION")
    config = aws_env / "config"
    config.write_text(f"[default]\nregion = eu-north-1\nendpoint_url = {seaweed_bucket.endpoint}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    settings = S3Settings.from_environment()
    assert (settings.endpoint, settings.region) == (seaweed_bucket.endpoint, "eu-north-1")
    assert settings.source == "the default AWS settings (env)"
    store = ObjectStore(S3Location.parse(seaweed_bucket.url), settings)
    etag = store.put("k", b"v")
    assert store.head("k").etag == etag
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert S3Settings.from_environment().endpoint is None


def test_settings_from_profile_reach_the_storage(
    seaweed_bucket: SeaweedBucket, aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Endpoint, region and keys from ~/.aws files alone (AWS_PROFILE), used for real."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(name)
    (aws_env / "config").write_text(
        f"[profile weed]\nregion = eu-central-1\nendpoint_url = {seaweed_bucket.endpoint}\n"
    )
    (aws_env / "credentials").write_text(
        f"[weed]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(aws_env / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(aws_env / "credentials"))
    with pytest.raises(SettingsError, match="no AWS credentials"):
        S3Settings.from_environment()  # the default profile has none
    monkeypatch.setenv("AWS_PROFILE", "weed")
    settings = S3Settings.from_environment()
    assert (settings.endpoint, settings.region) == (seaweed_bucket.endpoint, "eu-central-1")
    assert "weed" in settings.source
    store = ObjectStore(S3Location.parse(seaweed_bucket.url), settings)
    etag = store.put("hello", b"from a profile")
    assert store.head("hello").etag == etag
    with pytest.raises(SettingsError, match="nope"):
        S3Settings.from_environment(profile="nope")
    # Key variables come before AWS_PROFILE (as in the AWS CLI); an explicit profile wins.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-variables")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-variables-secret")
    settings = S3Settings.from_environment()
    assert settings.credentials is not None
    assert settings.credentials().access_key_id == "from-variables"
    assert settings.endpoint == seaweed_bucket.endpoint  # still the profile's
    settings = S3Settings.from_environment(profile="weed")
    assert settings.credentials is not None
    assert settings.credentials().access_key_id == ACCESS_KEY


def test_credentials_never_printed(seaweed_bucket: SeaweedBucket, aws_env: Path) -> None:
    settings = S3Settings.from_environment()
    assert settings.credentials is not None
    assert SECRET_KEY not in repr(settings) + repr(settings.credentials())
    (port,) = _free_ports(1)  # nothing listens there
    dead = S3Settings(f"http://127.0.0.1:{port}", "us-east-1", settings.credentials)
    store = ObjectStore(S3Location.parse(seaweed_bucket.url), dead, max_retries=1,
                        timeout=timedelta(seconds=5))  # fmt: skip
    assert SECRET_KEY not in repr(store)
    with pytest.raises(ObjectStoreError) as info:
        store.put("x", b"x")
    message = str(info.value)
    assert message.startswith(f"PUT {seaweed_bucket.url}x: ")
    assert SECRET_KEY not in message and "\n" not in message


def test_refused_signatures_are_typed(seaweed_bucket: SeaweedBucket, aws_env: Path) -> None:
    """SeaweedFS here checks signatures: a wrong secret or no signature is refused."""
    location = S3Location.parse(seaweed_bucket.url)
    endpoint = seaweed_bucket.endpoint
    wrong = S3Settings(endpoint, "us-east-1", lambda: Credentials(ACCESS_KEY, "not-the-secret"))
    unsigned = S3Settings(endpoint, "us-east-1", None)
    for settings in (wrong, unsigned):
        store = ObjectStore(location, settings, max_retries=0)
        with pytest.raises(ObjectStoreError) as info:
            store.put("x", b"x")
        assert "403" in str(info.value) or "denied" in str(info.value)
        assert "not-the-secret" not in str(info.value)


# -- reads ----------------------------------------------------------------------------


def test_put_head_get_delete(store: ObjectStore) -> None:
    data = random_bytes(100_000)
    etag = store.put("blobs/a", data)
    info = store.head("blobs/a")
    assert (info.name, info.size, info.etag) == ("blobs/a", len(data), etag)
    assert etag.strip('"') == hashlib.md5(data).hexdigest()  # a single-part ETag is the MD5
    assert store.get("blobs/a") == data
    assert asyncio.run(store.head_async("blobs/a")) == info
    assert store.get_with_info("blobs/a") == (data, info)
    replaced = store.put("blobs/a", b"other")
    assert replaced != etag and store.get("blobs/a") == b"other"
    store.delete("blobs/a")
    with pytest.raises(ObjectNotFound):
        store.head("blobs/a")
    store.delete("blobs/a")  # deleting a missing object is fine, as in S3


def test_server_side_copy(store: ObjectStore) -> None:
    data = random_bytes(50_000, seed=5)
    store.put("blobs/c", data)
    store.put(".quarantine/c.1", b"older")
    store.copy("blobs/c", ".quarantine/c.1")
    assert store.get(".quarantine/c.1") == data and store.get("blobs/c") == data
    with pytest.raises(ObjectNotFound) as info:
        store.copy("blobs/none", ".quarantine/none.1")
    assert info.value.name == "blobs/none"


def test_byte_ranges(store: ObjectStore) -> None:
    data = random_bytes(3000, seed=1)
    store.put("r", data)
    assert store.get_range("r", 0, 1) == data[:1]
    assert store.get_range("r", 100, 2000) == data[100:2000]
    assert store.get_range("r", 2999, 3000) == data[2999:]
    assert store.get_range("r", 2990, 5000) == data[2990:]  # clipped at the end, as HTTP does
    assert asyncio.run(store.get_range_async("r", 5, 17)) == data[5:17]
    for start, end in ((3000, 3001), (4000, 5000)):
        with pytest.raises(InvalidRange):
            store.get_range("r", start, end)
    for start, end in ((10, 10), (10, 5), (-1, 4)):
        with pytest.raises(InvalidRange):
            store.get_range("r", start, end)


def test_streaming_in_chunks(store: ObjectStore) -> None:
    data = random_bytes(3 << 20, seed=2)
    store.put("big", data)
    chunks = list(store.iter_chunks("big", chunk_size=256 << 10))
    assert len(chunks) >= 4 and b"".join(chunks) == data
    assert b"".join(store.iter_chunks("big", 1000, None, chunk_size=64 << 10)) == data[1000:]
    part = list(store.iter_chunks("big", 100, 900_100, chunk_size=128 << 10))
    assert len(part) >= 2 and b"".join(part) == data[100:900_100]

    async def collect() -> list[bytes]:
        return [c async for c in store.iter_chunks_async("big", 7, 2_000_007, 256 << 10)]

    chunks = asyncio.run(collect())
    assert len(chunks) >= 2 and b"".join(chunks) == data[7:2_000_007]


def test_missing_object_is_typed(store: ObjectStore, seaweed_bucket: SeaweedBucket) -> None:
    where = f"{seaweed_bucket.url}no/such"
    calls = [
        lambda: store.head("no/such"),
        lambda: store.get("no/such"),
        lambda: store.get_with_info("no/such"),
        lambda: store.get_range("no/such", 0, 10),
        lambda: list(store.iter_chunks("no/such")),
        lambda: asyncio.run(store.head_async("no/such")),
        lambda: asyncio.run(store.get_range_async("no/such", 0, 10)),
    ]
    for call in calls:
        with pytest.raises(ObjectNotFound) as info:
            call()
        assert info.value.name == "no/such" and where in str(info.value)


def test_missing_bucket_is_typed(seaweed_bucket: SeaweedBucket, aws_env: Path) -> None:
    store = ObjectStore.open("s3://no-such-bucket-here/p")
    with pytest.raises(NoSuchBucket, match="'no-such-bucket-here' does not exist"):
        store.put("x", b"x")
    with pytest.raises(NoSuchBucket):
        store.get("x")


# -- writes ---------------------------------------------------------------------------


def test_put_file_uses_multipart_above_part_size(store: ObjectStore, tmp_path: Path) -> None:
    assert store.part_size >= MIN_PART_SIZE
    big = tmp_path / "big.bin"
    data = random_bytes(2 * store.part_size + 12345, seed=3)
    big.write_bytes(data)
    etag = store.put_file("blobs/big", big)
    assert etag.strip('"').endswith("-3")  # S3's multipart ETag: md5 of part md5s, "-parts"
    assert store.head("blobs/big").size == len(data)
    assert hashlib.sha256(store.get("blobs/big")).digest() == hashlib.sha256(data).digest()
    small = tmp_path / "small.bin"
    small.write_bytes(b"small")
    assert store.put_file("blobs/small", small).strip('"') == hashlib.md5(b"small").hexdigest()
    with pytest.raises(ObjectStoreError, match="cannot read"):
        store.put_file("blobs/none", tmp_path / "missing.bin")


def test_the_docs_example_runs_as_written(
    seaweed_bucket: SeaweedBucket, aws_env: Path, tmp_path: Path
) -> None:
    """docs/object-storage.md's example, run as printed (its bucket aside): names from the
    public face, ``put_file`` given a ``str`` path."""
    text = (Path(__file__).parents[2] / "docs" / "object-storage.md").read_text("utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "from cmh.hub.mirror import ObjectStore, PreconditionFailed" in code
    code = code.replace('"s3://my-bucket/mirror"', repr(seaweed_bucket.url))
    blob = tmp_path / "blob"
    blob.write_bytes(random_bytes(300))
    names = {"path": str(blob), "doc": b"{}", "new": b"commit-2"}
    exec(compile(code, "docs/object-storage.md", "exec"), names)
    assert names["store"].get("blobs/<sha256>") == blob.read_bytes()
    assert names["store"].get("refs/main") == b"commit-2"
    assert names["url"].startswith("http")


def test_put_if_absent(store: ObjectStore) -> None:
    etag = store.put_if_absent("commits/c1", b"first")
    with pytest.raises(PreconditionFailed) as info:
        store.put_if_absent("commits/c1", b"second")
    assert info.value.name == "commits/c1" and "412" in str(info.value)
    assert store.get("commits/c1") == b"first" and store.head("commits/c1").etag == etag


def test_compare_and_swap(store: ObjectStore) -> None:
    first = store.put("refs/main", b"commit-1")
    second = store.put_if_match("refs/main", b"commit-2", first)
    with pytest.raises(PreconditionFailed):
        store.put_if_match("refs/main", b"commit-3", first)  # stale ETag: someone moved it
    assert store.get("refs/main") == b"commit-2"
    assert store.put_if_match("refs/main", b"commit-3", second) != second
    store.delete("refs/main")
    with pytest.raises(PreconditionFailed):
        store.put_if_match("refs/main", b"commit-4", second)  # gone: not silently created
    with pytest.raises(ObjectNotFound):
        store.head("refs/main")


RACER = """
import json, os, sys, time
from pathlib import Path
from cmh.hub.mirror.stores.bucket._objectstore import ObjectStore, PreconditionFailed
store = ObjectStore.open(sys.argv[1])
me, keys, go = sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
won = []
for i in range(keys):
    try:
        store.put_if_absent(f"race/{i}", me.encode())
        won.append(i)
    except PreconditionFailed:
        pass
print(json.dumps(won), flush=True)
"""


def test_two_processes_racing_a_create_only_put(
    store: ObjectStore, seaweed_bucket: SeaweedBucket, aws_env: Path
) -> None:
    """Two writers create the same keys at once: each key has exactly one winner, whose
    bytes are the ones stored."""
    keys, go = 40, aws_env / "go"
    url = seaweed_bucket.url
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, url, name, str(keys), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("writer-a", "writer-b")
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    won_a, won_b = (set(json.loads(o[0])) for o in outs)
    assert won_a.isdisjoint(won_b) and won_a | won_b == set(range(keys))
    for i in range(keys):
        assert store.get(f"race/{i}") == (b"writer-a" if i in won_a else b"writer-b")


APPENDER = """
import sys
from cmh.hub.mirror.stores.bucket._objectstore import (
    ObjectNotFound, ObjectStore, PreconditionFailed
)
store = ObjectStore.open(sys.argv[1])
me, count = sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
refused = 0
for i in range(count):
    while True:  # read the ref and its ETag, append, compare-and-swap; retry when refused
        try:
            body, info = store.get_with_info("refs/main")
        except ObjectNotFound:
            body, info = b"", None
        line = f"{me}-{i}\\n".encode()
        try:
            if info is None:
                store.put_if_absent("refs/main", line)
            else:
                store.put_if_match("refs/main", body + line, info.etag)
            break
        except PreconditionFailed:
            refused += 1
print(refused, flush=True)
"""


def test_two_writers_moving_one_ref_by_compare_and_swap_lose_nothing(
    store: ObjectStore, seaweed_bucket: SeaweedBucket, aws_env: Path
) -> None:
    """The rule a bucket store relies on, on SeaweedFS: two processes each append 25
    lines to one object by read + If-Match (create-only when absent), retrying when
    refused; at the end every line of both is there, each writer's in its order."""
    count = 25
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, seaweed_bucket.url, name, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:  # both start at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    lines = store.get("refs/main").decode().splitlines()
    assert len(lines) == 2 * count
    for name in ("a", "b"):
        assert [line for line in lines if line.startswith(name)] == [
            f"{name}-{i}" for i in range(count)
        ]


# -- listing and presigned URLs -------------------------------------------------------


def test_list_past_one_page(store: ObjectStore) -> None:
    """1100 objects under one prefix: more than S3's 1000 a page."""
    names = [f"many/{i:05d}" for i in range(1100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: store.put(n, n.encode()), [*names, "other/x", "many-not/y"]))
    listed = list(store.list("many"))
    assert sorted(i.name for i in listed) == names
    assert all(i.size == len(i.name) and i.etag for i in listed)
    assert {i.name for i in store.list("")} == {*names, "other/x", "many-not/y"}
    assert [i.name for i in store.list("other/")] == ["other/x"]
    assert list(store.list("nothing/here")) == []


def test_presigned_url_plain_http_with_range(store: ObjectStore) -> None:
    data = random_bytes(10_000, seed=4)
    store.put("blobs/p", data)
    url = store.presigned_get_url("blobs/p", timedelta(minutes=5))
    assert "X-Amz-Signature=" in url and SECRET_KEY not in url
    with urlopen(url, timeout=TEST_DEADLINE) as resp:
        assert resp.status == 200 and resp.read() == data
    with urlopen(Request(url, headers={"Range": "bytes=1000-1999"}), timeout=TEST_DEADLINE) as resp:
        assert resp.status == 206 and resp.read() == data[1000:2000]
        assert resp.headers["Content-Range"] == f"bytes 1000-1999/{len(data)}"
    with urlopen(Request(url, headers={"Range": "bytes=9990-"}), timeout=TEST_DEADLINE) as resp:
        assert resp.status == 206 and resp.read() == data[9990:]
    tampered = url.replace("blobs/p", "blobs/q")
    with pytest.raises(HTTPError) as info:
        urlopen(tampered, timeout=TEST_DEADLINE)
    assert info.value.code == 403


def test_presigned_url_expires(store: ObjectStore) -> None:
    store.put("blobs/e", b"soon gone")
    url = store.presigned_get_url("blobs/e", timedelta(seconds=1))
    deadline = time.monotonic() + 10
    while True:  # valid until the second has passed, refused after
        # The storage's own clock judges the signature's expiry: no test can move it.
        time.sleep(0.1)
        try:
            urlopen(url, timeout=10).close()
        except HTTPError as exc:
            assert exc.code == 403
            break
        assert time.monotonic() < deadline, "the presigned URL never expired"
