# ruff: noqa: E501  (the client scripts below are kept one call per line)
"""``cmh serve --store s3://...``: replicas over one SeaweedFS bucket, stock clients.

Everything is real: SeaweedFS (tests/hub/seaweed.py), ``cmh serve`` processes, the
stock huggingface_hub and transformers clients in fresh interpreters.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import threading
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

import pytest
from bucket_support import S3Proxy, S3Request, aws_env_applied, isolated_aws_env
from client_versions import client_env
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
from deadline_support import TEST_DEADLINE
from mirror_support import (
    MINILM_REPO,
    TINY_REPO,
    MirrorServer,
    ProcessClock,
    hf_env,
    run_python,
    stop_servers,
    wait_for,
    write_tiny_repo,
)
from seaweed import SeaweedBucket, SeaweedServer

MODES = ("proxy", "redirect")
REF_TTL = 60.0  # the replicas' clock (replica_clock) is moved past it


@pytest.fixture(scope="module")
def served_bucket(
    seaweed: SeaweedServer, minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BucketStore, SeaweedBucket, dict[str, str]]]:
    """A bucket store holding MiniLM and the tiny repo, and the AWS settings to reach it."""
    where = SeaweedBucket(seaweed, seaweed.bucket, f"serve-{uuid.uuid4().hex[:10]}/")
    tmp = tmp_path_factory.mktemp("bucket-serve")
    env = isolated_aws_env(where, tmp)
    with aws_env_applied(env):
        store = BucketStore.open(where.url)
        store.add_folder(minilm_dir, MINILM_REPO)
        store.add_folder(write_tiny_repo(tmp / "tiny", 1), TINY_REPO)
        yield store, where, env


@pytest.fixture(scope="module")
def replica_clock(tmp_path_factory: pytest.TempPathFactory) -> ProcessClock:
    """The clock of the module's replicas."""
    return ProcessClock(tmp_path_factory.mktemp("replica-clock") / "clock")


@pytest.fixture(scope="module")
def replicas(
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]],
    replica_clock: ProcessClock,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, list[MirrorServer]]]:
    """Two ``cmh serve`` replicas per delivery mode over the one bucket."""
    _, where, env = served_bucket
    servers: dict[str, list[MirrorServer]] = {}
    logs = tmp_path_factory.mktemp("replica-logs")
    try:
        for mode in MODES:
            servers[mode] = [
                MirrorServer(where.url, logs, env={**os.environ, **env}, clock=replica_clock,
                             extra_args=("--blob-delivery", mode, "--ref-ttl", str(REF_TTL)))
                for _ in range(2)
            ]  # fmt: skip
        yield servers
    finally:
        stop_servers([server for group in servers.values() for server in group])


STOCK_SCRIPT = r"""
import json, os, hashlib
import httpx2
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()
repo = os.environ["T_MINILM"]
out = {}
out["config"] = sha256(hf_hub_download(repo, "config.json"))
out["weights"] = sha256(hf_hub_download(repo, "model.safetensors"))
snap = snapshot_download(os.environ["T_TINY"])
out["tiny"] = sorted(os.path.relpath(os.path.join(d, f), snap) for d, _, fs in os.walk(snap) for f in fs)
api = HfApi()
info = api.model_info(repo)
out["sha"] = info.sha
out["card"] = bool(info.card_data) and info.card_data.get("license")
out["refs"] = sorted(b.name for b in api.list_repo_refs(repo).branches)
out["commits"] = [c.commit_id for c in api.list_repo_commits(os.environ["T_TINY"])]
out["models"] = sorted(m.id for m in api.list_models())
out["last"] = sorted({e.last_commit.oid for e in api.list_repo_tree(os.environ["T_TINY"], expand=True)})
url = os.environ["HF_ENDPOINT"] + f"/{repo}/resolve/main/model.safetensors"
r = httpx2.get(url, headers={"Range": "bytes=8-1031"}, follow_redirects=True)
out["range"] = [r.status_code, hashlib.sha256(r.content).hexdigest(), r.headers.get("Content-Range")]
print(json.dumps(out))
"""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


SAME_HOST_SCRIPT = r"""
import json, os, hashlib
import huggingface_hub
from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
repo = os.environ["T_MINILM"]
meta = get_hf_file_metadata(hf_hub_url(repo, "model.safetensors"))
out = {"version": huggingface_hub.__version__, "commit": meta.commit_hash, "size": meta.size}
for name in ("config.json", "model.safetensors"):
    out[name] = hashlib.sha256(open(hf_hub_download(repo, name), "rb").read()).hexdigest()
print(json.dumps(out))
"""


@pytest.mark.parametrize("version", ["1.33.0", "2.1.1"])
def test_a_release_that_follows_same_host_redirects_downloads_in_redirect_mode(
    version: str,
    replicas: dict[str, list[MirrorServer]],
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]],
    minilm_dir: Path,
    tmp_path: Path,
) -> None:
    """huggingface_hub 1.33, 2.0 and 2.1 follow a HEAD's redirect to any port of the host they
    asked (their own token sent along) and read the storage's headers: the storage here
    shares the mirror's host (127.0.0.1). Was: every download failed ("missing the
    'X-Repo-Commit' header"). A HEAD is now answered with the file's headers when the
    presigned URL is on the asked host; the GET still redirects."""
    store, _, _ = served_bucket
    commit = store.read_ref("models--sentence-transformers--all-MiniLM-L6-v2", "main")
    assert commit is not None
    env = client_env(hf_env(replicas["redirect"][0].url, tmp_path / "home"), version)
    if env is None:
        pytest.skip(f"huggingface_hub {version} cannot be installed here (no package index)")
    out = run_python(SAME_HOST_SCRIPT, {**env, "T_MINILM": MINILM_REPO})
    weights = minilm_dir / "model.safetensors"
    # A HEAD sent to another host name than the storage's still gets the Hub's 302.
    url = f"{replicas['redirect'][0].url}/{MINILM_REPO}/resolve/main/model.safetensors"
    for host, status in (("127.0.0.1", 200), ("localhost", 302)):
        head = http.client.HTTPConnection(host, replicas["redirect"][0].port, timeout=TEST_DEADLINE)
        head.request("HEAD", url.split(str(replicas["redirect"][0].port), 1)[1])
        answer = head.getresponse()
        assert (answer.status, answer.getheader("X-Repo-Commit")) == (status, commit.commit)
        head.close()
    assert out == {
        "version": version,
        "commit": commit.commit,
        "size": weights.stat().st_size,
        "config.json": _sha256(minilm_dir / "config.json"),
        "model.safetensors": _sha256(weights),
    }


@pytest.mark.parametrize("mode", MODES)
def test_stock_client_loads_through_each_of_two_replicas(
    mode: str,
    replicas: dict[str, list[MirrorServer]],
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]],
    minilm_dir: Path,
    tmp_path: Path,
) -> None:
    store, _, _ = served_bucket
    commit = store.read_ref("models--sentence-transformers--all-MiniLM-L6-v2", "main")
    tiny = store.read_ref("models--cmh-test--tiny", "main")
    assert commit is not None and tiny is not None
    weights = (minilm_dir / "model.safetensors").read_bytes()
    for i, server in enumerate(replicas[mode]):
        env = hf_env(server.url, tmp_path / f"home-{i}")
        env.update(T_MINILM=MINILM_REPO, T_TINY=TINY_REPO)
        out = run_python(STOCK_SCRIPT, env)
        assert out["config"] == _sha256(minilm_dir / "config.json")
        assert out["weights"] == hashlib.sha256(weights).hexdigest()
        assert "sub/deeper/leaf.txt" in out["tiny"] and "weights.bin" in out["tiny"]
        assert out["sha"] == commit.commit
        assert out["card"] == "apache-2.0"  # the card read from the bucket's README blob
        assert out["refs"] == ["main"] and out["commits"] == out["last"] == [tiny.commit]
        assert {MINILM_REPO, TINY_REPO} <= set(out["models"])
        assert out["range"] == [206, hashlib.sha256(weights[8:1032]).hexdigest(),
                                f"bytes 8-1031/{len(weights)}"]  # fmt: skip
        gets = server.log(route="resolve", method="GET")
        statuses = {e["status"] for e in gets}
        if mode == "redirect":  # the bytes came from the storage, not the replica
            assert statuses == {302}
        else:
            assert statuses <= {200, 206} and 206 in statuses
            assert sum(e["bytes"] for e in gets) >= len(weights)


TRANSFORMERS_SCRIPT = r"""
import json, os, torch
from transformers import AutoModel, AutoTokenizer
repo = os.environ["T_MINILM"]
tok = AutoTokenizer.from_pretrained(repo)
model = AutoModel.from_pretrained(repo)
local = AutoModel.from_pretrained(os.environ["T_LOCAL"])
same = all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), local.state_dict().values()))
print(json.dumps({"model": type(model).__name__, "same_weights": same}))
"""


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("mode", MODES)
def test_transformers_loads_through_a_replica(
    mode: str, replicas: dict[str, list[MirrorServer]], minilm_dir: Path, tmp_path: Path
) -> None:
    server = replicas[mode][1]
    before = len(server.log(route="resolve"))
    env = hf_env(server.url, tmp_path / "home")
    env.update(T_MINILM=MINILM_REPO, T_LOCAL=str(minilm_dir))
    result = run_python(TRANSFORMERS_SCRIPT, env)
    assert result == {"model": "BertModel", "same_weights": True}
    answered = server.log(route="resolve")[before:]
    # it came through this replica (404s: files transformers probes for and the repo lacks);
    # a redirect's HEAD gets the file's headers: the storage is on the asked host (127.0.0.1)
    for method in ("GET", "HEAD"):
        statuses = {e["status"] for e in answered if e["method"] == method}
        redirected = method == "GET" and mode == "redirect"
        assert statuses - {404} == ({302} if redirected else {200}), method


def _commit_at(server: MirrorServer, repo: str) -> str:
    """``X-Repo-Commit`` of a HEAD (a redirect is not followed)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TEST_DEADLINE)
    try:
        conn.request("HEAD", f"/{repo}/resolve/main/config.json")
        response = conn.getresponse()
        assert response.status in (200, 302), response.status
        return str(response.getheader("X-Repo-Commit"))
    finally:
        conn.close()


def test_a_new_commit_is_served_by_every_replica_within_the_ref_ttl(
    replicas: dict[str, list[MirrorServer]],
    replica_clock: ProcessClock,
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]],
    tmp_path: Path,
) -> None:
    store, _, _ = served_bucket
    every = [s for group in replicas.values() for s in group]
    repo = "cmh-test/fresh"
    first = store.add_folder(write_tiny_repo(tmp_path / "v1", 1), repo)
    replica_clock.advance(REF_TTL + 0.5)
    assert {_commit_at(s, repo) for s in every} == {first.commit}  # cached now
    second = store.add_folder(write_tiny_repo(tmp_path / "v2", 2), repo)
    assert {_commit_at(s, repo) for s in every} == {first.commit}  # within ref_ttl: cached
    replica_clock.advance(REF_TTL + 0.5)  # the documented bound: ref_ttl after the ref moved
    assert {_commit_at(s, repo) for s in every} == {second.commit}


def _get(url: str, rng: tuple[int, int] | None) -> bytes:
    headers = {"Range": f"bytes={rng[0]}-{rng[1]}"} if rng else {}
    with urlopen(Request(url, headers=headers), timeout=30) as r:
        return bytes(r.read())


@pytest.mark.parametrize("mode", MODES)
def test_killing_one_replica_fails_no_request_at_the_other(
    mode: str,
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]],
    minilm_dir: Path,
    tmp_path: Path,
) -> None:
    """16 clients, 8 per replica, each fetching ranges and whole files in a loop; one
    replica is SIGKILLed mid-run. Every request sent to the other one succeeds."""
    _, where, env = served_bucket
    pair = [MirrorServer(where.url, tmp_path, env={**os.environ, **env},
                         extra_args=("--blob-delivery", mode)) for _ in range(2)]  # fmt: skip
    weights = (minilm_dir / "model.safetensors").read_bytes()
    config = (minilm_dir / "config.json").read_bytes()
    stop = threading.Event()
    results: dict[int, list[str]] = {0: [], 1: []}
    lock = threading.Lock()

    def client(k: int) -> None:
        server = pair[k % 2]
        i = 0
        while not stop.is_set():
            i += 1
            start = (k * 7919 * i) % (len(weights) - 4096)
            try:
                if i % 4 == 0:
                    ok = (
                        _get(f"{server.url}/{MINILM_REPO}/resolve/main/config.json", None) == config
                    )
                else:
                    got = _get(f"{server.url}/{MINILM_REPO}/resolve/main/model.safetensors",
                               (start, start + 4095))  # fmt: skip
                    ok = got == weights[start : start + 4096]
                outcome = "ok" if ok else "wrong bytes"
            except Exception as exc:  # counted below: any failure at the survivor fails the test
                outcome = f"{type(exc).__name__}: {exc}"
            with lock:
                results[k % 2].append(outcome)

    def counts() -> tuple[int, int, bool]:
        with lock:
            return len(results[0]), len(results[1]), any(r != "ok" for r in results[0])

    def wait_until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + TEST_DEADLINE
        while not done():
            assert time.monotonic() < deadline, counts()
            time.sleep(0.02)

    try:
        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(client, k) for k in range(16)]
            wait_until(lambda: counts()[0] >= 20 and counts()[1] >= 20)  # both serve
            before_kill, at_kill, _ = counts()
            os.kill(pair[0].process.pid, signal.SIGKILL)
            # the killed one's clients fail; the survivor's go on for 60 more requests
            wait_until(lambda: counts()[2] and counts()[1] >= at_kill + 60)
            stop.set()
            for f in futures:
                f.result()
    finally:
        stop_servers(pair)
    survivor = results[1]
    assert before_kill > 0 and len(survivor) > 50
    assert [r for r in survivor if r != "ok"] == []  # zero failed requests at the survivor
    assert any(r != "ok" for r in results[0])  # the killed one really went away mid-run


def test_a_corrupted_object_is_never_sent_complete_in_proxy_mode(
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]], tmp_path: Path
) -> None:
    store, where, env = served_bucket
    repo = "cmh-test/corrupt"
    src = write_tiny_repo(tmp_path / "src", 3)
    result = store.add_folder(src, repo)
    tree = store.read_tree("models--cmh-test--corrupt", result.commit)
    assert tree is not None
    blob = next(f for f in tree.files if f.path == "weights.bin")
    name = store.blob_name("models--cmh-test--corrupt", blob.etag)
    data = bytearray(store.objects.get(name))
    data[-1] ^= 0xFF  # same size, last byte differs
    store.objects.put(name, bytes(data))
    server = MirrorServer(where.url, tmp_path, env={**os.environ, **env})
    try:
        url = f"{server.url}/{repo}/resolve/main/weights.bin"
        outcomes: list[Any] = []
        end = (blob.size - 1000, blob.size - 1)
        for rng in (end, (0, 999), None):
            try:
                outcomes.append(len(_get(url, rng)))
            except urllib.error.HTTPError as exc:
                outcomes.append(exc.code)
            except Exception as exc:  # an incomplete body: the connection was cut
                outcomes.append(type(exc).__name__)
        # A range holding the last byte (a resume could complete the file with it) waits
        # for the whole-object check beside it and is cut before that byte; once known
        # bad, every body answers 503 (a range short of the end of a version not checked
        # yet goes at once: test_a_small_range_of_an_unchecked_blob_reads_only_its_bytes).
        assert outcomes[0] not in (1000, 503) and outcomes[1:] == [503, 503], outcomes
        asked = f"bytes={end[0]}-{end[1]}"
        # logged once its handler kept the cut record (in the bucket); in the order each
        # answer ended
        wait_for(lambda: any(e.get("range") == asked for e in server.log(route="resolve")),
                 "the cut range's log line")  # fmt: skip
        log = server.log(route="resolve")
        first = next(e for e in log if e.get("range") == asked)
        assert first.get("cut") == "blob does not match its name", log
        # a whole body of a version not checked yet is hashed as it goes: cut too
        notes = next(f for f in tree.files if f.path == "sub/notes.txt")
        other = store.blob_name("models--cmh-test--corrupt", notes.etag)
        store.objects.put(other, b"X" * notes.size)
        whole = f"{server.url}/{repo}/resolve/main/sub/notes.txt"
        with pytest.raises(Exception) as cut:  # an incomplete read, whatever its type
            _get(whole, None)
        assert not isinstance(cut.value, urllib.error.HTTPError)
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(whole, None)
        assert refused.value.code == 503
    finally:
        server.stop()


def test_a_cut_on_a_bucket_served_without_upstream_is_recorded_in_the_bucket(
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]], tmp_path: Path
) -> None:
    """Issue 34: a bucket store served without ``--upstream`` wrote its cut records under
    ``/dev/null`` (and the proxy's own cuts were not recorded at all), so once the blob
    was put right a resume of the cut body got ``206``: the wrong head with the right
    tail. The cut is kept in the bucket now, and the resume starts again."""
    store, where, env = served_bucket
    repo = "cmh-test/cut-record"
    folder = "models--cmh-test--cut-record"
    src = write_tiny_repo(tmp_path / "src", 5)
    result = store.add_folder(src, repo)
    tree = store.read_tree(folder, result.commit)
    assert tree is not None
    blob = next(f for f in tree.files if f.path == "weights.bin")
    name = store.blob_name(folder, blob.etag)
    good = store.objects.get(name)
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # same size, last byte differs
    store.objects.put(name, bytes(bad))
    server = MirrorServer(where.url, tmp_path, env={**os.environ, **env})
    try:
        url = f"{server.url}/{repo}/resolve/main/weights.bin"
        with pytest.raises(Exception) as cut:  # an incomplete read, whatever its type
            _get(url, None)
        assert not isinstance(cut.value, urllib.error.HTTPError)
        # its log line is written once the handler kept the record
        wait_for(lambda: any(e.get("cut") for e in server.log(route="resolve")), "the cut's line")
        assert store.objects.get(store.cut_name(folder, blob.etag))  # kept in the bucket
        store.objects.put(name, good)  # put right: a new object version
        restart = MirrorServer(where.url, tmp_path / "again", env={**os.environ, **env})
        try:  # a fresh worker (nothing remembered in memory): the bucket says it was cut
            again = f"{restart.url}/{repo}/resolve/main/weights.bin"
            with urlopen(Request(again, headers={"Range": "bytes=1000-"}), timeout=30) as r:
                status, body = r.status, r.read()
            assert (status, body) == (200, good)  # the whole body: the client starts again
        finally:
            restart.stop()
    finally:
        server.stop()


class HeldWholeBlobReads:
    """An :class:`S3Proxy` hook that holds every GET of a whole blob object (no ``Range``)
    until :attr:`release` is set: a request that waited on a whole-object read cannot
    finish while it is held."""

    def __init__(self) -> None:
        self.whole_gets = 0
        self.release = threading.Event()

    def __call__(self, request: S3Request) -> None:
        if _blob_get(request) and request.header("Range") is None:
            self.whole_gets += 1
            self.release.wait(TEST_DEADLINE)


def _blob_get(request: S3Request) -> bool:
    return request.method == "GET" and "/blobs/" in request.key


def _blob_bytes(proxy: S3Proxy) -> int:
    """The body bytes of the blob-object GETs the storage answered through ``proxy``."""
    return sum(e.body_bytes for e in proxy.exchanges if _blob_get(e.request))


def test_a_small_range_of_an_unchecked_blob_reads_only_its_bytes(
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]], tmp_path: Path
) -> None:
    """A 1 KiB range of a 24 MiB blob with no check record (imported by another tool)
    is answered while the whole-object read of its check is held at the storage: only
    the range's bytes were read. The check goes on beside it and records the version."""
    store, where, env = served_bucket
    repo = "cmh-test/unchecked"
    folder = "models--cmh-test--unchecked"
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(24 << 20)
    (src / "big.bin").write_bytes(data)
    result = store.add_folder(src, repo)
    tree = store.read_tree(folder, result.commit)
    assert tree is not None
    (big,) = [f for f in tree.files if f.path == "big.bin"]
    store.objects.delete(store.check_name(folder, big.etag))  # as another tool leaves it
    held = HeldWholeBlobReads()
    counter = S3Proxy(env["AWS_ENDPOINT_URL"], held)
    saved = dict(os.environ)
    os.environ.update({**env, "AWS_ENDPOINT_URL": counter.endpoint})
    try:
        server = MirrorServer(where.url, tmp_path, extra_args=())  # type: ignore[arg-type]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        url = f"{server.url}/{repo}/resolve/main/big.bin"
        start = 5 << 20
        got = _get(url, (start, start + 1023))
        assert got == data[start : start + 1024]
        assert _blob_bytes(counter) == 1024  # the whole-object read is still held
        deadline = time.monotonic() + TEST_DEADLINE
        while held.whole_gets == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.whole_gets == 1  # the check started beside the range
        held.release.set()
        storage_etag = store.objects.head(store.blob_name(folder, big.etag)).etag
        deadline = time.monotonic() + TEST_DEADLINE
        while store.read_check(folder, big.etag) != storage_etag:
            assert time.monotonic() < deadline, "the check beside the range was not recorded"
            time.sleep(0.1)
        assert _get(url, None) == data  # known good now
    finally:
        server.stop()
        held.release.set()
        counter.stop()


STOCK_LOAD_SCRIPT = r"""
import json, os, sys, threading, time, hashlib
from huggingface_hub import hf_hub_download
urls, repo, base = json.loads(os.environ["T_URLS"]), os.environ["T_MINILM"], os.environ["T_BASE"]
files = ["config.json", "tokenizer_config.json", "vocab.txt", "model.safetensors"]
want = json.loads(os.environ["T_SHA"])
results = {u: [] for u in urls}
lock = threading.Lock()
def client(k):
    url = urls[k % 2]
    i = 0
    while not os.path.exists(os.environ["T_STOP"]):
        name = files[(k + i) % len(files)]
        try:
            path = hf_hub_download(repo, name, endpoint=url, cache_dir=f"{base}/{k}-{i}", force_download=True, etag_timeout=30)
            ok = hashlib.sha256(open(path, "rb").read()).hexdigest() == want[name]
            outcome = "ok" if ok else "wrong bytes"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"[:300]
        with lock:
            results[url].append(outcome)
            print(json.dumps({"url": url, "outcome": outcome}), flush=True)  # as it goes
        i += 1
threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
"""


@pytest.mark.parametrize("mode", MODES)
def test_stock_clients_keep_loading_from_one_replica_while_the_other_is_killed(
    mode: str,
    served_bucket: tuple[BucketStore, SeaweedBucket, dict[str, str]],
    minilm_dir: Path,
    tmp_path: Path,
) -> None:
    """16 stock huggingface_hub clients (threads), 8 per replica, downloading in a loop;
    one replica is SIGKILLed mid-run: every download from the other one succeeds."""
    import subprocess
    import sys

    _, where, env = served_bucket
    pair = [MirrorServer(where.url, tmp_path, env={**os.environ, **env},
                         extra_args=("--blob-delivery", mode)) for _ in range(2)]  # fmt: skip
    files = ["config.json", "tokenizer_config.json", "vocab.txt", "model.safetensors"]
    client_env = hf_env(pair[0].url, tmp_path / "home")
    client_env.update(
        T_URLS=json.dumps([s.url for s in pair]), T_MINILM=MINILM_REPO,
        T_BASE=str(tmp_path / "caches"), T_STOP=str(tmp_path / "stop"),
        T_SHA=json.dumps({f: _sha256(minilm_dir / f) for f in files}),
    )  # fmt: skip
    killed_url, survivor_url = pair[0].url, pair[1].url
    told: dict[str, list[str]] = {killed_url: [], survivor_url: []}

    def read_until(done: Callable[[], bool]) -> None:
        while not done():
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, "the clients ended early"
            seen = json.loads(line)
            told[seen["url"]].append(seen["outcome"])

    errors = open(tmp_path / "clients.stderr", "w+")  # noqa: SIM115 (closed below)
    try:
        proc = subprocess.Popen([sys.executable, "-c", STOCK_LOAD_SCRIPT], env=client_env,
                                stdout=subprocess.PIPE, stderr=errors, text=True)  # fmt: skip
        read_until(lambda: told[killed_url].count("ok") >= 2)  # it serves
        at_kill = len(told[survivor_url])
        os.kill(pair[0].process.pid, signal.SIGKILL)
        # the killed one's clients fail; the survivor's go on for 8 more downloads
        read_until(
            lambda: (
                any(r != "ok" for r in told[killed_url]) and len(told[survivor_url]) >= at_kill + 8
            )
        )
        (tmp_path / "stop").touch()
        out, _ = proc.communicate(timeout=180)
        errors.seek(0)
        assert proc.returncode == 0, errors.read()[-3000:]
    finally:
        errors.close()
        stop_servers(pair)
    results = json.loads(out.strip().splitlines()[-1])
    killed, survivor = results[pair[0].url], results[pair[1].url]
    assert len(survivor) >= 8 and [r for r in survivor if r != "ok"] == []
    assert "ok" in killed and any(r != "ok" for r in killed)  # it served, then went away
