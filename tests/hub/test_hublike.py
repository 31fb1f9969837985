"""The Hub-like front (``hublike.py``) is faithful to huggingface.co for the stock client.

The stock ``huggingface_hub`` runs in this process against the front (``endpoint=``), the
front in front of the session's ``cmh serve``; plain HTTP only (``HF_HUB_DISABLE_XET=1``,
set by ``tests/conftest.py``, as for a client without the Xet protocol).
"""

from __future__ import annotations

import hashlib
import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from deadline_support import TEST_DEADLINE
from hublike import HubLike, running, xet_stand_in
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from mirror_support import (
    DATA_REPO,
    MINILM_REPO,
    PRIVATE_TOKEN,
    TINY_REPO,
    MirrorServer,
    MirrorStore,
    add_folder,
)

WEIGHTS = "model.safetensors"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _files(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(root).parts
    }


@pytest.fixture
def front(mirror: MirrorServer) -> Iterator[HubLike]:
    """A Hub-like front over the session's ``cmh serve`` (stopped at teardown)."""
    with running(mirror.url) as hub:
        yield hub


@pytest.fixture
def minilm_src(mirror_store: MirrorStore) -> Path:
    return mirror_store.sources[f"{MINILM_REPO}@main"]


@pytest.fixture
def tiny_main(mirror_store: MirrorStore) -> Path:
    return mirror_store.sources[f"{TINY_REPO}@main"]


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "hf-cache"


def _no_xet_headers(front: HubLike) -> None:
    for record in front.records():
        assert "x-xet-hash" not in record.response_headers
        assert "x-xet-refresh-route" not in record.response_headers
        assert "xet-auth" not in record.response_headers.get("link", "")


# -- faithful to the Hub -------------------------------------------------------------------


def test_lfs_file_is_redirected_to_a_signed_cdn_url(
    front: HubLike, minilm_src: Path, mirror_store: MirrorStore, cache: Path
) -> None:
    path = hf_hub_download(MINILM_REPO, WEIGHTS, cache_dir=cache, endpoint=front.url)
    sha = _sha256(minilm_src / WEIGHTS)
    assert _sha256(Path(path)) == sha
    assert Path(path).resolve().name == sha  # the stock cache names the blob by the ETag
    heads = front.records(origin="hub", method="HEAD", path="/resolve/")
    assert [r.status for r in heads] == [302]
    got = heads[0].response_headers
    assert got["x-repo-commit"] == mirror_store.imports[f"{MINILM_REPO}@main"].commit
    assert got["x-linked-etag"] == f'"{sha}"'
    assert got["x-linked-size"] == str((minilm_src / WEIGHTS).stat().st_size)
    assert got["location"].startswith(front.cdn_url + f"/repos/{sha[:2]}/{sha[2:4]}/{sha}?")
    gets = front.records(origin="cdn", method="GET")
    assert [r.status for r in gets] == [200]
    assert {"Expires", "Signature"} <= set(gets[0].query)
    assert gets[0].bytes_sent == (minilm_src / WEIGHTS).stat().st_size
    _no_xet_headers(front)


def test_small_file_is_served_directly_gzip_encoded(
    front: HubLike, minilm_src: Path, cache: Path
) -> None:
    path = hf_hub_download(MINILM_REPO, "tokenizer.json", cache_dir=cache, endpoint=front.url)
    data = (minilm_src / "tokenizer.json").read_bytes()
    assert Path(path).read_bytes() == data
    assert Path(path).resolve().name == _git_blob_id(data)
    (get,) = front.records(origin="hub", method="GET", path="/resolve/")
    assert get.status == 200
    assert get.response_headers["etag"] == f'"{_git_blob_id(data)}"'
    assert get.response_headers["content-encoding"] == "gzip"
    assert 0 < get.bytes_sent < len(data)  # compressed on the wire
    assert "x-linked-etag" not in get.response_headers
    assert front.records(origin="cdn") == []


def test_get_hf_file_metadata(front: HubLike, minilm_src: Path, mirror_store: MirrorStore) -> None:
    commit = mirror_store.imports[f"{MINILM_REPO}@main"].commit
    lfs = get_hf_file_metadata(hf_hub_url(MINILM_REPO, WEIGHTS, endpoint=front.url))
    assert lfs.commit_hash == commit
    assert lfs.etag == _sha256(minilm_src / WEIGHTS)
    assert lfs.size == (minilm_src / WEIGHTS).stat().st_size
    assert lfs.location.startswith(front.cdn_url)
    assert lfs.xet_file_data is None
    url = hf_hub_url(MINILM_REPO, "config.json", endpoint=front.url)
    small = get_hf_file_metadata(url)
    data = (minilm_src / "config.json").read_bytes()
    assert (small.etag, small.size, small.location) == (_git_blob_id(data), len(data), url)


def test_tree_listing_is_paginated_and_lists_xet_hashes(front: HubLike, minilm_src: Path) -> None:
    front.page_size = 4
    entries = list(HfApi(endpoint=front.url).list_repo_tree(MINILM_REPO, recursive=True))
    files = {e.path: e for e in entries if isinstance(e, RepoFile)}
    assert set(files) == set(_files(minilm_src))
    pages = front.records(origin="hub", method="GET", path="/tree/")
    assert len(pages) == math.ceil(len(entries) / 4) > 1
    assert all('rel="next"' in p.response_headers.get("link", "") for p in pages[:-1])
    assert "link" not in pages[-1].response_headers
    weights = files[WEIGHTS]
    assert weights.lfs is not None and weights.lfs.sha256 == _sha256(minilm_src / WEIGHTS)
    assert weights.xet_hash == xet_stand_in(weights.lfs.sha256)
    assert files["config.json"].lfs is None and files["config.json"].xet_hash is None


def test_paths_info_and_model_info(
    front: HubLike, minilm_src: Path, mirror_store: MirrorStore
) -> None:
    api = HfApi(endpoint=front.url)
    infos = {i.path: i for i in api.get_paths_info(MINILM_REPO, [WEIGHTS, "config.json"])}
    assert isinstance(infos[WEIGHTS], RepoFile) and isinstance(infos["config.json"], RepoFile)
    assert infos[WEIGHTS].xet_hash == xet_stand_in(_sha256(minilm_src / WEIGHTS))
    assert infos["config.json"].xet_hash is None
    info = api.model_info(MINILM_REPO)
    assert info.sha == mirror_store.imports[f"{MINILM_REPO}@main"].commit
    assert {s.rfilename for s in info.siblings or []} == set(_files(minilm_src))


def test_snapshot_download_gives_the_store_bytes(
    front: HubLike, minilm_src: Path, cache: Path
) -> None:
    folder = Path(snapshot_download(MINILM_REPO, cache_dir=cache, endpoint=front.url))
    got, want = _files(folder), _files(minilm_src)
    assert set(got) == set(want)
    for name, src in want.items():
        assert got[name].read_bytes() == src.read_bytes(), name
    assert len(front.records(origin="cdn", method="GET")) == 1  # the one LFS file
    _no_xet_headers(front)


def test_dataset_repo_and_missing_file(
    front: HubLike, mirror_store: MirrorStore, cache: Path
) -> None:
    src = mirror_store.sources[f"datasets/{DATA_REPO}@main"]
    path = hf_hub_download(
        DATA_REPO, "train/part-0.csv", repo_type="dataset", cache_dir=cache, endpoint=front.url
    )
    assert Path(path).read_bytes() == (src / "train" / "part-0.csv").read_bytes()
    tree = HfApi(endpoint=front.url).list_repo_tree(DATA_REPO, repo_type="dataset", recursive=True)
    assert {e.path for e in tree if isinstance(e, RepoFile)} == set(_files(src))
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(TINY_REPO, "nope.txt", cache_dir=cache, endpoint=front.url)
    commit = mirror_store.imports[f"{TINY_REPO}@main"].commit
    assert (cache / "models--cmh-test--tiny" / ".no_exist" / commit / "nope.txt").exists()
    missing = httpx2.get(
        hf_hub_url(TINY_REPO, "nope.txt", endpoint=front.url), timeout=TEST_DEADLINE
    )
    assert missing.status_code == 404 and missing.headers["x-error-code"] == "EntryNotFound"


def test_backend_pages_are_followed_then_re_paginated(
    mirror_store: MirrorStore, mirror_server_factory: Any, minilm_src: Path
) -> None:
    server = mirror_server_factory(mirror_store.path, extra_args=("--tree-page-size", "2"))
    with running(server.url, page_size=5) as hub:
        entries = list(HfApi(endpoint=hub.url).list_repo_tree(MINILM_REPO, recursive=True))
        assert {e.path for e in entries if isinstance(e, RepoFile)} == set(_files(minilm_src))
        assert len(hub.records(origin="hub", path="/tree/")) == math.ceil(len(entries) / 5)
    assert server.count(route="tree", method="GET") > len(entries) // 2


@pytest.fixture
def private_front(
    tmp_path: Path, tiny_main: Path, mirror_server_factory: Any
) -> Iterator[tuple[HubLike, Path]]:
    """A store holding a private repo with an LFS file, its ``cmh serve`` and a front."""
    store = tmp_path / "private-store"
    add_folder(store, tiny_main, "cmh-test/secret")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{PRIVATE_TOKEN}  cmh-test/secret\n")
    server = mirror_server_factory(store, tokens=tokens)
    with running(server.url) as hub:
        yield hub, tiny_main


def test_private_repo_token_never_reaches_the_cdn(
    private_front: tuple[HubLike, Path], cache: Path
) -> None:
    front, src = private_front
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("cmh-test/secret", "weights.bin", cache_dir=cache, endpoint=front.url)
    path = hf_hub_download(
        "cmh-test/secret", "weights.bin", cache_dir=cache, endpoint=front.url, token=PRIVATE_TOKEN
    )
    assert Path(path).read_bytes() == (src / "weights.bin").read_bytes()
    assert [r.status for r in front.records(origin="cdn")] == [200]
    assert not front.cdn_saw_authorization
    assert any("authorization" in r.headers for r in front.records(origin="hub"))


def test_expired_or_forged_signed_url_gets_403(
    front: HubLike, tiny_main: Path, cache: Path
) -> None:
    meta = get_hf_file_metadata(hf_hub_url(TINY_REPO, "weights.bin", endpoint=front.url))
    forged = meta.location.replace("Signature=", "Signature=0")
    assert httpx2.get(forged, timeout=TEST_DEADLINE).status_code == 403
    assert (
        httpx2.get(meta.location, timeout=TEST_DEADLINE).content
        == (tiny_main / "weights.bin").read_bytes()
    )
    front.url_lifetime = 0  # every signed URL expires at once
    with pytest.raises(HfHubHTTPError) as err:
        hf_hub_download(TINY_REPO, "weights.bin", cache_dir=cache, endpoint=front.url)
    assert err.value.response.status_code == 403
    assert [r.status for r in front.records(origin="cdn")] == [403, 200, 403]


def test_cdn_serves_one_range_206_and_many_ranges_200_whole(
    front: HubLike, tiny_main: Path
) -> None:
    data = (tiny_main / "weights.bin").read_bytes()
    location = get_hf_file_metadata(
        hf_hub_url(TINY_REPO, "weights.bin", endpoint=front.url)
    ).location
    one = httpx2.get(location, headers={"Range": "bytes=10-19"}, timeout=TEST_DEADLINE)
    assert one.status_code == 206 and one.content == data[10:20]
    assert one.headers["content-range"] == f"bytes 10-19/{len(data)}"
    many = httpx2.get(location, headers={"Range": "bytes=0-9,20-29"}, timeout=TEST_DEADLINE)
    assert many.status_code == 200 and many.content == data
    assert "multipart" not in many.headers.get("content-type", "")
    past = httpx2.get(location, headers={"Range": f"bytes={len(data)}-"}, timeout=TEST_DEADLINE)
    assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{len(data)}"
    followed = httpx2.get(
        hf_hub_url(TINY_REPO, "weights.bin", endpoint=front.url),
        follow_redirects=True,
        timeout=TEST_DEADLINE,
    )
    assert [r.status_code for r in followed.history] == [302] and followed.content == data


# -- fault knobs, each observed by the stock client ------------------------------------------


# The stock client writes what it reads in chunks of ``DOWNLOAD_CHUNK_SIZE`` (10 MiB):
# bytes buffered when a connection breaks are lost, so it resumes at a chunk boundary
# (from 0 for a smaller file). The faults below act past the first chunk of MiniLM.
RESUME_AT = constants.DOWNLOAD_CHUNK_SIZE
FAULT_AT = RESUME_AT + (1 << 20)


def test_fault_cut_then_resume_with_range(front: HubLike, minilm_src: Path, cache: Path) -> None:
    front.cut(after_bytes=FAULT_AT)
    path = hf_hub_download(MINILM_REPO, WEIGHTS, cache_dir=cache, endpoint=front.url)
    assert _sha256(Path(path)) == _sha256(minilm_src / WEIGHTS)
    front.wait_idle()
    first, second = front.records(origin="cdn", method="GET")
    assert first.aborted and first.bytes_sent == FAULT_AT
    assert second.headers["range"] == f"bytes={RESUME_AT}-" and second.status == 206


def test_fault_cut_small_file_restarts_from_zero(
    front: HubLike, tiny_main: Path, cache: Path
) -> None:
    front.cut(after_bytes=100_000)
    path = hf_hub_download(TINY_REPO, "weights.bin", cache_dir=cache, endpoint=front.url)
    assert Path(path).read_bytes() == (tiny_main / "weights.bin").read_bytes()
    front.wait_idle()
    first, second = front.records(origin="cdn", method="GET")
    assert first.aborted and first.bytes_sent == 100_000
    assert "range" not in second.headers and second.status == 200


def test_fault_ignore_range_makes_the_client_restart(
    front: HubLike, minilm_src: Path, cache: Path
) -> None:
    size = (minilm_src / WEIGHTS).stat().st_size
    front.ignore_range = True
    front.cut(after_bytes=FAULT_AT)
    path = hf_hub_download(MINILM_REPO, WEIGHTS, cache_dir=cache, endpoint=front.url)
    assert _sha256(Path(path)) == _sha256(minilm_src / WEIGHTS)
    front.wait_idle()
    second = front.records(origin="cdn", method="GET")[1]
    assert second.headers["range"] == f"bytes={RESUME_AT}-"
    assert second.status == 200 and second.bytes_sent == size


def test_fault_stall_times_the_client_out_and_it_resumes(
    front: HubLike, minilm_src: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)
    front.stall(after_bytes=FAULT_AT, seconds=2.0)
    path = hf_hub_download(MINILM_REPO, WEIGHTS, cache_dir=cache, endpoint=front.url)
    assert _sha256(Path(path)) == _sha256(minilm_src / WEIGHTS)
    front.wait_idle()
    first, second = front.records(origin="cdn", method="GET")
    assert first.bytes_sent == FAULT_AT and first.aborted  # nothing sent after the stall
    assert second.headers["range"] == f"bytes={RESUME_AT}-" and second.status == 206


def test_download_outliving_its_signed_url_fails_in_the_stock_client(
    front: HubLike, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Expires is whole seconds: a 3 s lifetime leaves the URL valid 2 to 3 s. The
    # client's read times out 2.5 s into the stall and it resumes 1 s later, past it.
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 2.5)
    front.url_lifetime = 3
    front.stall(after_bytes=FAULT_AT, seconds=3.0)
    with pytest.raises(HfHubHTTPError) as err:
        hf_hub_download(MINILM_REPO, WEIGHTS, cache_dir=cache, endpoint=front.url)
    assert err.value.response.status_code == 403
    front.wait_idle()
    first, second = front.records(origin="cdn", method="GET")
    assert first.status == 200 and first.aborted
    assert second.status == 403 and second.headers["range"] == f"bytes={RESUME_AT}-"
    assert len(front.records(origin="hub", path="/resolve/")) == 1  # never asked again


def test_fault_429_with_retry_after_then_success(
    front: HubLike, tiny_main: Path, cache: Path
) -> None:
    front.fail(429, times=1, origin="cdn", retry_after=0)
    path = hf_hub_download(TINY_REPO, "weights.bin", cache_dir=cache, endpoint=front.url)
    assert Path(path).read_bytes() == (tiny_main / "weights.bin").read_bytes()
    statuses = [
        (r.status, r.response_headers.get("retry-after")) for r in front.records(origin="cdn")
    ]
    assert statuses == [(429, "0"), (200, None)]


def test_fault_500_on_metadata_then_success(front: HubLike, tiny_main: Path, cache: Path) -> None:
    front.fail(500, times=2, origin="hub", method="HEAD", path="/resolve/")
    path = hf_hub_download(TINY_REPO, "config.json", cache_dir=cache, endpoint=front.url)
    assert Path(path).read_bytes() == (tiny_main / "config.json").read_bytes()
    heads = front.records(origin="hub", method="HEAD")
    assert [r.status for r in heads] == [500, 500, 200]


def test_fault_500_at_the_cdn_is_not_retried(front: HubLike, cache: Path) -> None:
    front.fail(500, times=1, origin="cdn")
    with pytest.raises(HfHubHTTPError) as err:
        hf_hub_download(TINY_REPO, "weights.bin", cache_dir=cache, endpoint=front.url)
    assert err.value.response.status_code == 500
    hf_hub_download(TINY_REPO, "weights.bin", cache_dir=cache, endpoint=front.url)
    assert [r.status for r in front.records(origin="cdn")] == [500, 200]


def test_fault_wrong_bytes_pass_the_stock_client(
    front: HubLike, tiny_main: Path, cache: Path
) -> None:
    data = (tiny_main / "weights.bin").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    front.corrupt(sha)
    path = Path(hf_hub_download(TINY_REPO, "weights.bin", cache_dir=cache, endpoint=front.url))
    got = path.read_bytes()
    # Same length, other bytes, stored under the expected SHA-256 name: the stock
    # client checks the size only (gap 2 of docs/../design).
    assert len(got) == len(data) and got != data
    assert path.resolve().name == sha and hashlib.sha256(got).hexdigest() != sha


def test_fault_edit_json_rewrites_listings_and_revisions(front: HubLike) -> None:
    fake = "f" * 40

    def hook(kind: str, path: str, doc: object) -> object:
        if kind == "tree" and isinstance(doc, list):
            return [{**e, "lfs": {**e["lfs"], "oid": "0" * 64}} if "lfs" in e else e for e in doc]
        if kind == "repo_info" and isinstance(doc, dict):
            return {**doc, "sha": fake}
        return doc

    front.edit_json = hook
    api = HfApi(endpoint=front.url)
    (weights,) = api.get_paths_info(TINY_REPO, ["weights.bin"])  # paths-info untouched
    listed = {e.path: e for e in api.list_repo_tree(TINY_REPO) if isinstance(e, RepoFile)}
    assert isinstance(weights, RepoFile) and weights.lfs is not None
    assert weights.lfs.sha256 != "0" * 64
    assert listed["weights.bin"].lfs is not None and listed["weights.bin"].lfs.sha256 == "0" * 64
    assert api.model_info(TINY_REPO, revision="main").sha == fake


def test_stop_frees_the_ports_and_the_thread(mirror: MirrorServer) -> None:
    with running(mirror.url) as hub:
        ports = [int(u.rsplit(":", 1)[1]) for u in (hub.url, hub.cdn_url)]
        thread = hub._thread
        assert (
            httpx2.get(f"{hub.url}/api/models/{TINY_REPO}", timeout=TEST_DEADLINE).status_code
            == 200
        )
    assert thread is not None and not thread.is_alive()
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_unreachable_backend_is_a_502() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with running(f"http://127.0.0.1:{port}") as hub:
        assert (
            httpx2.get(f"{hub.url}/api/models/{TINY_REPO}", timeout=TEST_DEADLINE).status_code
            == 502
        )
        assert [r.status for r in hub.records()] == [502]
