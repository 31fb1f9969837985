"""The resolver against a Hub-faithful server, and what it hands back (issue 13).

The Hub-faithful front (``hublike.py``) lists ``xetHash`` on LFS entries,
answers LFS ``resolve`` requests with a 302 to a signed CDN URL and paginates
tree listings, as huggingface.co does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import run_runner
from hublike import HubLike, running
from mirror_support import DATA_REPO, MINILM_REPO, TINY_REPO, MirrorServer, MirrorStore


@pytest.fixture
def front(mirror: MirrorServer) -> Iterator[HubLike]:
    with running(mirror.url) as hub:
        yield hub


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pull_by_commit_through_xet_listings(front, mirror_store: MirrorStore, tmp_path):
    """Listings with ``xetHash`` are read: every file comes over HTTP from its resolve URL."""
    commit = mirror_store.imports[f"{MINILM_REPO}@main"].commit
    src = mirror_store.sources[f"{MINILM_REPO}@main"]
    run = run_runner(
        [
            "pull",
            MINILM_REPO,
            "--revision",
            commit,
            "--endpoint",
            front.url,
            "--cache-dir",
            tmp_path,
            "--json",
        ],
        env={"HF_HUB_OFFLINE": None},
    )
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    pages = front.records(origin="hub", path="/tree/")
    assert len(pages) > 1 and {r.status for r in pages} == {200}  # paginated, with xetHash
    folder = Path(doc["path"])
    for f in src.rglob("*"):
        if f.is_file():
            assert _sha256(folder / f.relative_to(src)) == _sha256(f), f
    assert doc["fingerprint"]["weights"]  # the documented --json field
    assert not front.cdn_saw_authorization


def test_resolution_path_is_a_string_every_loader_takes(mirror, tmp_path):
    import cmh.hub as hub
    from sentence_transformers import SentenceTransformer

    res = hub.resolve(MINILM_REPO, cache_dir=tmp_path, endpoint=mirror.url)
    assert isinstance(res.path, str) and "/" in res.path
    assert (res.path / "config.json").is_file() and res.path.exists()
    assert res.path.name == res.commit
    model = SentenceTransformer(res.path, device="cpu")  # a PosixPath raised TypeError here
    assert model.encode(["x"]).shape == (1, 384)


def test_fingerprint_of_a_dataset_is_none(mirror, tmp_path):
    import cmh.hub as hub

    res = hub.resolve(DATA_REPO, repo_type="dataset", cache_dir=tmp_path, endpoint=mirror.url)
    assert res.fingerprint is None
    run = run_runner(
        [
            "pull",
            DATA_REPO,
            "--repo-type",
            "dataset",
            "--endpoint",
            mirror.url,
            "--cache-dir",
            tmp_path,
            "--json",
        ],
        env={"HF_HUB_OFFLINE": None},
    )
    assert run.exit_code == 0 and run.json()["fingerprint"] is None


def test_refusal_keeps_the_hubs_message_and_stops_early(front, tmp_path):
    import cmh.hub as hub

    front.fail(401, times=100, path="/resolve/")
    with pytest.raises(hub.AccessError, match="injected 401"):
        hub.resolve(MINILM_REPO, cache_dir=tmp_path, endpoint=front.url)
    refused = front.records(origin="hub", path="/resolve/")
    # Stops at the first refusal: only the requests already in flight were made.
    assert 1 <= len(refused) <= hub.Policy().max_workers < 13
    assert not list(tmp_path.rglob("refs/main"))


def test_tiny_repo_by_branch_through_the_front(front, mirror_store: MirrorStore, tmp_path):
    import cmh.hub as hub

    res = hub.resolve(TINY_REPO, cache_dir=tmp_path, endpoint=front.url)
    src = mirror_store.sources[f"{TINY_REPO}@main"]
    for f in src.rglob("*"):
        if f.is_file():
            assert (res.path / f.relative_to(src).as_posix()).read_bytes() == f.read_bytes()


def _wire_totals(front: HubLike) -> tuple[int, int]:
    front.wait_idle()
    records = [r for r in front.records() if not r.path.startswith("/health")]
    return len(records), sum(r.bytes_sent for r in records)


def test_requests_and_bytes_are_what_went_over_the_wire(front, tmp_path):
    """A 302 and its CDN GET are two requests; an aborted answer's bytes count."""
    import cmh.hub as hub

    front.cut(after_bytes=3_000_000, origin="cdn")  # the weights, cut once, then resumed
    res = hub.resolve(MINILM_REPO, cache_dir=tmp_path, endpoint=front.url)
    requests, sent = _wire_totals(front)
    assert any(r.aborted for r in front.records(origin="cdn"))
    assert len(front.records(origin="hub", path="/resolve/")) > 0
    assert res.requests == requests
    aborted = sum(r.bytes_sent for r in front.records(origin="cdn") if r.aborted)
    assert aborted >= 3_000_000
    # Everything the front sent is counted, the aborted answer included; the front
    # records no body size for the JSON answers it relays (a few KiB here).
    assert sent <= res.bytes_transferred <= sent + 16_384


def test_small_files_are_asked_compressed(front, mirror_store: MirrorStore, tmp_path):
    import cmh.hub as hub

    res = hub.resolve(MINILM_REPO, cache_dir=tmp_path, endpoint=front.url)
    vocab = next(
        r for r in front.records(origin="hub", method="GET") if r.path.endswith("/vocab.txt")
    )
    assert "gzip" in vocab.headers.get("accept-encoding", "")
    assert vocab.response_headers.get("content-encoding") == "gzip"
    size = (mirror_store.sources[f"{MINILM_REPO}@main"] / "vocab.txt").stat().st_size
    assert vocab.bytes_sent < size / 2  # what crossed the wire: compressed
    assert (res.path / "vocab.txt").stat().st_size == size  # what was installed: the file
    # Ranged requests (the weights at the CDN) ask for identity.
    for r in front.records(origin="cdn"):
        if "range" in r.headers:
            assert r.headers.get("accept-encoding") == "identity"
