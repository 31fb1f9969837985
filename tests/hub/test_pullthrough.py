# ruff: noqa: E501  (the client scripts below are kept one call per line)
"""Pull-through mirror: ``cmh serve --upstream URL`` in front of the Hub-like front.

The chain is: stock client -> pull-through ``cmh serve`` (empty store, its own
process) -> ``tests/hub/hublike.py`` (302 to a signed CDN origin) -> the
session's ``cmh serve``. The front runs with ``xet_listing=False`` until the
resolver's Xet listing handling (branch ``dropin``) is on main.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.mirror._connections import send_allowance
from deadline_support import TEST_DEADLINE
from hublike import HubLike, running
from mirror_support import (
    MINILM_REPO,
    PRIVATE_REPO,
    PRIVATE_TOKEN,
    STOCK_PRELUDE,
    TINY_REPO,
    MirrorServer,
    MirrorStore,
    ProcessClock,
    big_store,
    hf_env,
    run_python,
    wait_for,
)

STOCK_SCRIPT = (
    STOCK_PRELUDE
    + r"""
from huggingface_hub import hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

def kind(fn):
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__
    return "ok"

out = {}
snap = snapshot_download(os.environ["T_REPO"])
out["files"] = {os.path.relpath(os.path.join(d, f), snap): sha256(os.path.join(d, f))
                for d, _, fs in os.walk(snap) for f in fs}
out["missing_file"] = kind(lambda: hf_hub_download(os.environ["T_REPO"], "no-such-file.txt"))
out["missing_repo"] = kind(lambda: hf_hub_download("nobody/nothing-here", "config.json"))
out["missing_revision"] = kind(lambda: hf_hub_download(os.environ["T_REPO"], "config.json", revision="no-such-branch"))
print(json.dumps(out))
"""
)

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


def _sha256_tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and ".git" not in p.parts:
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _pull_server(
    factory: Callable[..., MirrorServer],
    store: Path,
    upstream: str,
    *extra: str,
    clock: ProcessClock | None = None,
) -> MirrorServer:
    store.mkdir(parents=True, exist_ok=True)
    return factory(store, extra_args=("--upstream", upstream, *extra), clock=clock)


#: The pull-through's ``--fresh-for`` in the freshness tests, passed on ``process_clock``.
FRESH_FOR = 3600


@pytest.fixture
def fresh_pull(
    mirror_server_factory: Callable[..., MirrorServer], process_clock: ProcessClock, tmp_path: Path
) -> Callable[..., MirrorServer]:
    """Start a pull-through (store ``tmp_path/pull``) of ``upstream`` with ``--fresh-for 1h``
    on the test's ``process_clock``."""

    def start(upstream: str, *extra: str) -> MirrorServer:
        return _pull_server(
            mirror_server_factory, tmp_path / "pull", upstream, "--fresh-for", str(FRESH_FOR),
            *extra, clock=process_clock,
        )  # fmt: skip

    return start


def _upstream_requests(front: HubLike) -> int:
    return len(front.records(origin="hub")) + len(front.records(origin="cdn"))


@pytest.fixture
def front(mirror: MirrorServer) -> Any:
    with running(mirror.url, xet_listing=False) as hub:
        yield hub


def test_stock_client_through_pullthrough_is_bit_identical_and_a_second_client_is_free(
    front: HubLike,
    mirror_server_factory: Callable[..., MirrorServer],
    mirror_store: MirrorStore,
    tmp_path: Path,
) -> None:
    pull = _pull_server(mirror_server_factory, tmp_path / "pull", front.url, "--fresh-for", "1h")
    env = hf_env(pull.url, tmp_path / "home-1")
    env["T_REPO"] = TINY_REPO
    first = run_python(STOCK_SCRIPT, env)
    assert first["files"] == _sha256_tree(mirror_store.sources[f"{TINY_REPO}@main"])
    assert first["missing_file"] == "RemoteEntryNotFoundError"
    assert first["missing_repo"] == "RepositoryNotFoundError"
    assert first["missing_revision"] == "RevisionNotFoundError"
    assert len(front.records(origin="cdn")) == 1  # weights.bin: one transfer, by 302 to the CDN
    assert not front.cdn_saw_authorization
    front.wait_idle()
    before = _upstream_requests(front)
    env = hf_env(pull.url, tmp_path / "home-2")
    env["T_REPO"] = TINY_REPO
    second = run_python(STOCK_SCRIPT, env)
    assert second["files"] == first["files"]
    upstream_paths = [r.path for r in front.records()][before:]
    # Only the never-cached answers go upstream again (absent repo and revision).
    assert all("nobody" in p or "no-such-branch" in p for p in upstream_paths), upstream_paths
    metrics = pull.metrics()
    assert any(name == "cmh_mirror_upstream_requests_total" for name, _ in metrics)


@pytest.mark.slow
@pytest.mark.heavy
def test_transformers_loads_minilm_through_pullthrough(
    front: HubLike,
    mirror_server_factory: Callable[..., MirrorServer],
    minilm_dir: Path,
    tmp_path: Path,
) -> None:
    pull = _pull_server(mirror_server_factory, tmp_path / "pull", front.url, "--fresh-for", "1h")
    env = hf_env(pull.url, tmp_path / "home")
    env.update(T_MINILM=MINILM_REPO, T_LOCAL=str(minilm_dir))
    result = run_python(TRANSFORMERS_SCRIPT, env)
    assert result == {"model": "BertModel", "same_weights": True}
    blobs = tmp_path / "pull" / "models--sentence-transformers--all-MiniLM-L6-v2" / "blobs"
    weights = hashlib.sha256((minilm_dir / "model.safetensors").read_bytes()).hexdigest()
    assert (blobs / weights).is_file()
    front.wait_idle()
    before = _upstream_requests(front)
    result = run_python(TRANSFORMERS_SCRIPT, hf_env(pull.url, tmp_path / "home-2") | {
        "T_MINILM": MINILM_REPO, "T_LOCAL": str(minilm_dir)})  # fmt: skip
    assert result["same_weights"]
    assert _upstream_requests(front) == before  # the second client costs the upstream nothing


def test_after_fresh_for_one_revalidation_request(
    front: HubLike,
    fresh_pull: Callable[..., MirrorServer],
    process_clock: ProcessClock,
    tmp_path: Path,
) -> None:
    pull = fresh_pull(front.url)
    url = f"{pull.url}/{TINY_REPO}/resolve/main/config.json"
    assert httpx2.get(url, timeout=TEST_DEADLINE).status_code == 200
    front.wait_idle()
    before = front.records()
    assert httpx2.get(url, timeout=TEST_DEADLINE).status_code == 200  # fresh: nothing asked
    # refs/heads/main is main (was: another ref, asked upstream and kept beside main, so
    # list_repo_refs listed main twice)
    other_name = url.replace("/resolve/main/", "/resolve/refs%2Fheads%2Fmain/")
    assert httpx2.get(other_name, timeout=TEST_DEADLINE).status_code == 200
    assert front.records() == before
    refs = httpx2.get(f"{pull.url}/api/models/{TINY_REPO}/refs", timeout=TEST_DEADLINE).json()
    assert [b["name"] for b in refs["branches"]] == ["main"]
    # A refs/heads/main an older mirror kept (stale) is not read: the name is main's.
    main = refs["branches"][0]["targetCommit"]
    v1 = httpx2.get(f"{pull.url}/api/models/{TINY_REPO}/revision/v1", timeout=TEST_DEADLINE)
    kept = tmp_path / "pull" / "models--cmh-test--tiny" / "refs" / "refs" / "heads" / "main"
    kept.parent.mkdir(parents=True)
    kept.write_text(v1.json()["sha"])
    answer = httpx2.head(other_name, timeout=TEST_DEADLINE)
    assert answer.headers["X-Repo-Commit"] == main != v1.json()["sha"]
    before = front.records()
    process_clock.advance(FRESH_FOR + 1)
    for _ in range(3):
        assert httpx2.get(url, timeout=TEST_DEADLINE).status_code == 200
    front.wait_idle()
    new = front.records()[len(before) :]
    assert [(r.method, r.path) for r in new] == [("GET", f"/api/models/{TINY_REPO}/revision/main")]


def test_commit_pinned_request_never_revalidates_its_content(
    front: HubLike, fresh_pull: Callable[..., MirrorServer], process_clock: ProcessClock
) -> None:
    """A held commit's content is never asked again; who may read it is, once per
    --fresh-for per repo: the commit's revision answer alone (spec 8.1)."""
    pull = fresh_pull(front.url)
    first = httpx2.get(f"{pull.url}/{TINY_REPO}/resolve/main/README.md", timeout=TEST_DEADLINE)
    commit = first.headers["X-Repo-Commit"]
    front.wait_idle()
    pinned = f"{pull.url}/{TINY_REPO}/resolve/{commit}/README.md"
    before = len(front.records())
    assert httpx2.get(pinned, timeout=TEST_DEADLINE).content == first.content
    assert len(front.records()) == before  # within --fresh-for of main's validation
    process_clock.advance(FRESH_FOR + 1)
    for _ in range(2):
        again = httpx2.get(pinned, timeout=TEST_DEADLINE)
        assert again.status_code == 200 and again.content == first.content
    front.wait_idle()
    asked = [(r.method, r.path) for r in front.records()[before:]]
    assert asked == [("GET", f"/api/models/{TINY_REPO}/revision/{commit}")]


def test_upstream_down_serves_stale_with_warning_and_uncached_gets_typed_503(
    mirror: MirrorServer, fresh_pull: Callable[..., MirrorServer], process_clock: ProcessClock
) -> None:
    with running(mirror.url, xet_listing=False) as hub:
        pull = fresh_pull(hub.url)
        cached = httpx2.get(
            f"{pull.url}/{TINY_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE
        )
        assert cached.status_code == 200 and "Warning" not in cached.headers
    process_clock.advance(
        FRESH_FOR + 1
    )  # the front is stopped and the revision is past its freshness
    stale = httpx2.get(f"{pull.url}/{TINY_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE)
    assert stale.status_code == 200 and stale.content == cached.content
    assert stale.headers["Warning"].startswith("110 ")
    listed_not_cached = httpx2.get(
        f"{pull.url}/{TINY_REPO}/resolve/main/weights.bin", timeout=TEST_DEADLINE
    )
    assert listed_not_cached.status_code == 503
    assert listed_not_cached.headers["X-Error-Code"] == "UpstreamUnavailable"
    never_seen = httpx2.get(
        f"{pull.url}/{MINILM_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE
    )
    assert never_seen.status_code == 503
    assert never_seen.headers["X-Error-Code"] == "UpstreamUnavailable"


def test_stale_if_error_is_bounded(
    mirror: MirrorServer, fresh_pull: Callable[..., MirrorServer], process_clock: ProcessClock
) -> None:
    with running(mirror.url, xet_listing=False) as hub:
        pull = fresh_pull(hub.url, "--stale-if-error", str(FRESH_FOR))
        assert (
            httpx2.get(
                f"{pull.url}/{TINY_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE
            ).status_code
            == 200
        )
    process_clock.advance(2 * FRESH_FOR + 1)
    late = httpx2.get(f"{pull.url}/{TINY_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE)
    assert late.status_code == 503 and late.headers["X-Error-Code"] == "UpstreamUnavailable"


def test_tokens_the_client_sends_never_reach_upstream_and_the_mirror_token_opens_private(
    front: HubLike, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    token_file = tmp_path / "upstream-token"
    token_file.write_text(PRIVATE_TOKEN + "\n")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"client-secret-never-forwarded {PRIVATE_REPO}\n")
    (tmp_path / "pull").mkdir()
    pull = mirror_server_factory(
        tmp_path / "pull",
        tokens=tokens,
        extra_args=("--upstream", front.url, "--upstream-token-file", str(token_file)),
    )
    client = {"Authorization": "Bearer client-secret-never-forwarded"}
    answer = httpx2.get(
        f"{pull.url}/{PRIVATE_REPO}/resolve/main/config.json", headers=client, timeout=TEST_DEADLINE
    )
    assert answer.status_code == 200 and answer.json() == {"secret": True}
    got = httpx2.get(
        f"{pull.url}/{TINY_REPO}/resolve/main/weights.bin", headers=client, timeout=TEST_DEADLINE
    )
    assert got.status_code == 200
    front.wait_idle()
    seen = [r.headers.get("authorization") for r in front.records()]
    assert "Bearer client-secret-never-forwarded" not in seen
    assert f"Bearer {PRIVATE_TOKEN}" in seen
    assert not front.cdn_saw_authorization  # the mirror's token stays on the Hub's origin

    plain = _pull_server(mirror_server_factory, tmp_path / "pull-2", front.url)
    refused = httpx2.get(
        f"{plain.url}/{PRIVATE_REPO}/resolve/main/config.json",
        headers=client,
        timeout=TEST_DEADLINE,
    )
    assert refused.status_code == 404 and refused.headers["X-Error-Code"] == "RepoNotFound"


def test_the_mirrors_own_tokens_decide_who_reads(
    front: HubLike, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"local-reader-token-1 {TINY_REPO}\n")
    store = tmp_path / "pull"
    store.mkdir()
    pull = mirror_server_factory(store, tokens=tokens, extra_args=("--upstream", front.url))
    url = f"{pull.url}/{TINY_REPO}/resolve/main/config.json"
    assert httpx2.get(url, timeout=TEST_DEADLINE).status_code == 404
    # A refused reader asks the upstream only while the mirror holds nothing of the repo
    # (its answer says whether the repo is gated, issue 36); once held, never.
    asked = len(front.records())
    assert asked >= 1
    assert httpx2.get(url, timeout=TEST_DEADLINE).status_code == 404
    assert (
        httpx2.get(
            url, headers={"Authorization": "Bearer other-token-0002"}, timeout=TEST_DEADLINE
        ).status_code
        == 404
    )
    assert len(front.records()) == asked
    ok = httpx2.get(
        url, headers={"Authorization": "Bearer local-reader-token-1"}, timeout=TEST_DEADLINE
    )
    assert ok.status_code == 200


def test_tiers_mirror_to_mirror_to_hublike(
    front: HubLike,
    mirror_server_factory: Callable[..., MirrorServer],
    mirror_store: MirrorStore,
    tmp_path: Path,
) -> None:
    region = _pull_server(mirror_server_factory, tmp_path / "region", front.url)
    site = _pull_server(mirror_server_factory, tmp_path / "site", region.url)
    env = hf_env(site.url, tmp_path / "home")
    env["T_REPO"] = TINY_REPO
    result = run_python(STOCK_SCRIPT, env)
    assert result["files"] == _sha256_tree(mirror_store.sources[f"{TINY_REPO}@main"])
    assert result["missing_repo"] == "RepositoryNotFoundError"
    assert len(front.records(origin="cdn")) == 1


def test_eight_concurrent_clients_one_upstream_transfer_bytes_while_filling(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    size = 64 << 20
    store, data = big_store(tmp_path, size)
    backend = mirror_server_factory(store)
    with running(backend.url, xet_listing=False) as hub:
        pull = _pull_server(mirror_server_factory, tmp_path / "pull", hub.url)
        # The upstream transfer trickles past 16 MiB until every client reads and the
        # range has its bytes but the last (a stall of 4 s could end before a client a
        # busy machine served late had its first byte)
        everyone = threading.Event()
        hub.drip(16 << 20, everyone)
        url = f"{pull.url}/cmh-test/big/resolve/main/big.bin"
        bodies: list[bytes] = [b""] * 8
        first_byte_while_transfer_open: list[bool] = [False] * 8
        reading = [threading.Event() for _ in range(8)]
        errors: list[BaseException] = []

        def client(i: int) -> None:
            try:
                with httpx2.stream("GET", url, timeout=TEST_DEADLINE) as response:
                    assert response.status_code == 200, (response.headers, response.read()[:500])
                    chunks = []
                    for chunk in response.iter_bytes():
                        if not chunks:
                            # The upstream transfer is still open: no CDN answer is recorded yet.
                            first_byte_while_transfer_open[i] = not hub.records(origin="cdn")
                            reading[i].set()
                        chunks.append(chunk)
                    bodies[i] = b"".join(chunks)
            except BaseException as exc:  # reported below
                errors.append(exc)
                reading[i].set()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for event in reading:  # every client is reading the fill (the upstream trickles)
            event.wait(TEST_DEADLINE)
        asked = {"Range": "bytes=1000-1999"}
        try:
            with httpx2.stream("GET", url, headers=asked, timeout=TEST_DEADLINE) as ranged:
                assert ranged.status_code == 206
                pieces = ranged.iter_bytes()
                got = b""
                while len(got) < 999:  # its last byte waits for the stored blob
                    got += next(pieces)
                everyone.set()
                got += b"".join(pieces)
        finally:
            everyone.set()
        for t in threads:
            t.join(TEST_DEADLINE)
        hub.wait_idle()
        assert not errors, errors
        assert got == data[1000:2000]
        assert all(b == data for b in bodies)
        assert all(first_byte_while_transfer_open)
        cdn = hub.records(origin="cdn")
        assert [(r.method, r.status) for r in cdn] == [("GET", 200)]  # one upstream transfer
        blob = (
            tmp_path / "pull" / "models--cmh-test--big" / "blobs" / hashlib.sha256(data).hexdigest()
        )
        assert blob.stat().st_size == size


def test_bodies_waiting_for_a_slow_upstream_are_not_cut_as_stalled(
    mirror_server_factory: Callable[..., MirrorServer], process_clock: ProcessClock, tmp_path: Path
) -> None:
    """A filling body waits for bytes at the upstream's pace, and that time is not its
    client's: the body's deadline (60 s plus its length at ``--min-send-rate``) stands
    still while it waits. Before, a range early in a blob whose fill outlasted the range's
    deadline was cut every time (its last byte waits for the whole fill), and so was a
    whole body from an upstream slower than the clients' minimum rate. The deadlines are
    crossed by moving the server's clock while the upstream pauses."""
    size = 24 << 20
    store, data = big_store(tmp_path, size)
    backend = mirror_server_factory(store)
    with running(backend.url, xet_listing=False) as hub:
        pull = _pull_server(mirror_server_factory, tmp_path / "pull", hub.url, clock=process_clock)
        hub.stall(after_bytes=8 << 20, seconds=6.0, times=1, origin="cdn")
        url = f"{pull.url}/cmh-test/big/resolve/main/big.bin"
        bodies: dict[str, bytes] = {}
        received = {"whole": 0, "range": 0}
        errors: list[BaseException] = []

        def read(name: str, headers: dict[str, str]) -> None:
            try:
                with httpx2.stream("GET", url, headers=headers, timeout=TEST_DEADLINE) as answer:
                    assert answer.status_code == (206 if headers else 200)
                    chunks = []
                    for chunk in answer.iter_bytes():
                        chunks.append(chunk)
                        received[name] += len(chunk)
                    bodies[name] = b"".join(chunks)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=read, args=("whole", {})),
            threading.Thread(target=read, args=("range", {"Range": "bytes=1000-1999"})),
        ]
        for t in threads:
            t.start()
        # Each client took what it can before the pause: the whole body every byte that
        # arrived, the range all but its last byte (which waits for the installed blob).
        wait_for(lambda: (received["whole"] >= 8 << 20 and received["range"] == 999)
                 or bool(errors), "the bytes before the pause")  # fmt: skip
        process_clock.advance(send_allowance(size) + 10)  # past both bodies' deadlines
        time.sleep(2.0)  # the guard's sweep runs every second of real time
        for t in threads:
            t.join(TEST_DEADLINE)
        assert not errors, errors
        assert bodies == {"whole": data, "range": data[1000:2000]}
        assert [(r.method, r.status) for r in hub.records(origin="cdn")] == [("GET", 200)]


def test_wrong_upstream_bytes_cut_every_client_and_nothing_is_stored(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    store, data = big_store(tmp_path, 4 << 20)
    etag = hashlib.sha256(data).hexdigest()
    backend = mirror_server_factory(store)
    with running(backend.url, xet_listing=False) as hub:
        hub.corrupt(etag)
        pull = _pull_server(mirror_server_factory, tmp_path / "pull", hub.url)
        url = f"{pull.url}/cmh-test/big/resolve/main/big.bin"
        # No client ever gets the wrong body whole. Either its answer started while the
        # bytes came (200) and the body ends before its last byte, or, when both downloads
        # ended refused before the first byte was read (a fast loopback), the fill's error
        # is the answer: both are right, which one depends on timing alone. Three clients
        # at once: the worker's one hash of their reads refuses all of them (spec 8.3,
        # "One hash per worker").
        received = [0, 0, 0]
        errors: list[BaseException] = []

        def download(i: int) -> None:
            try:
                with httpx2.stream("GET", url, timeout=TEST_DEADLINE) as r:
                    if r.status_code == 200:
                        with pytest.raises(httpx2.HTTPError):
                            for chunk in r.iter_bytes():
                                received[i] += len(chunk)
                    else:
                        assert r.status_code == 502, r.read()
                        assert r.headers["X-Error-Code"] == "UpstreamProtocolError", r.headers
                        assert "does not hash to its ETag" in r.read().decode()
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=download, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TEST_DEADLINE)
        assert not errors, errors
        assert all(got < len(data) for got in received), received
        # The client was cut by its own check; the fill goes on (fetched again once) and
        # ends refused: wait for it while the upstream still runs.
        blobs = tmp_path / "pull" / "models--cmh-test--big" / "blobs"
        deadline = time.monotonic() + TEST_DEADLINE
        while len(hub.records(origin="cdn")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the resolver fetches a blob that failed its check once more
        hub.wait_idle()
        assert len(hub.records(origin="cdn")) == 2
        while list(blobs.glob(f"{etag}*")) and time.monotonic() < deadline:
            assert not (blobs / etag).exists()
            time.sleep(0.1)
        assert not list(blobs.glob(f"{etag}*"))  # neither the blob nor a partial is left


def test_mirror_sync_fills_a_store_for_an_air_gapped_mirror(
    front: HubLike,
    mirror_server_factory: Callable[..., MirrorServer],
    mirror_store: MirrorStore,
    tmp_path: Path,
) -> None:
    store = tmp_path / "carried"
    result = CliRunner().invoke(
        cli, ["mirror", "sync", TINY_REPO, "--store", str(store), "--from", front.url]
    )
    assert result.exit_code == 0, result.output
    assert "cmh-test/tiny@main: downloaded commit" in result.output
    offline = mirror_server_factory(store)  # no upstream: the carried store alone
    env = hf_env(offline.url, tmp_path / "home")
    env["T_REPO"] = TINY_REPO
    got = run_python(STOCK_SCRIPT, env)
    assert got["files"] == _sha256_tree(mirror_store.sources[f"{TINY_REPO}@main"])
    missing = CliRunner().invoke(
        cli, ["mirror", "sync", "nobody/nothing", "--store", str(store), "--from", front.url]
    )
    assert missing.exit_code != 0 and "Traceback" not in missing.output


def test_prune_expired_removes_pullthrough_revisions_past_their_upstream_freshness(
    front: HubLike,
    fresh_pull: Callable[..., MirrorServer],
    process_clock: ProcessClock,
    tmp_path: Path,
) -> None:
    pull = fresh_pull(front.url)
    store = pull.store
    answer = httpx2.get(f"{pull.url}/{TINY_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE)
    commit = answer.headers["X-Repo-Commit"]
    snapshot = store / "models--cmh-test--tiny" / "snapshots" / commit
    assert (snapshot / "weights.bin").is_symlink()  # listed, not filled: not a broken revision
    prune = ["prune", "--store", str(store), "--expired", "--include-referenced", "--yes"]
    kept = CliRunner(env=process_clock.env).invoke(cli, prune)
    assert kept.exit_code == 0, kept.output
    assert snapshot.is_dir()
    process_clock.advance(FRESH_FOR + 1)
    gone = CliRunner(env=process_clock.env).invoke(cli, prune)
    assert gone.exit_code == 0, gone.output
    assert not snapshot.exists()
    again = httpx2.get(
        f"{pull.url}/{TINY_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE
    )  # filled again
    assert again.status_code == 200 and again.content == answer.content


def test_a_client_gone_before_the_first_byte_leaves_no_open_file_in_the_server(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """A client that leaves while its filling answer waits for the fill's first byte: when
    the bytes come, the answer's headers cannot be sent, and the reader it opened on the
    partial file is closed (no descriptor of the blob is left in the server)."""
    store, data = big_store(tmp_path, 1 << 20)
    etag = hashlib.sha256(data).hexdigest()
    backend = mirror_server_factory(store)
    with running(backend.url, xet_listing=False) as hub:
        hub.stall(0, 3.0)  # the CDN's headers, then no byte for 3 s
        pull = _pull_server(mirror_server_factory, tmp_path / "pull", hub.url)
        blobs = tmp_path / "pull" / "models--cmh-test--big" / "blobs"
        ask = b"GET /cmh-test/big/resolve/main/big.bin HTTP/1.1\r\nHost: mirror\r\n\r\n"
        with socket.create_connection((pull.host, pull.port), timeout=TEST_DEADLINE) as s:
            s.sendall(ask)
            deadline = time.monotonic() + TEST_DEADLINE
            while not (blobs / f"{etag}.incomplete").exists():  # the fill has begun
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)  # the answer waits for its first byte meanwhile
        while not (blobs / etag).exists():  # the fill ends, the answer finds its client gone
            assert time.monotonic() < deadline
            time.sleep(0.1)
        hub.wait_idle()

        def open_blob_files() -> list[str]:
            fds = Path(f"/proc/{pull.process.pid}/fd")
            links = []
            for fd in fds.iterdir():
                with contextlib.suppress(OSError):
                    links.append(os.readlink(fd))
            return [link for link in links if etag in link]

        while open_blob_files() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert open_blob_files() == []
