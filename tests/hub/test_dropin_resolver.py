"""The resolver against a Hub-faithful server, and what it hands back (issue 13).

The Hub-faithful front (``hublike.py``) lists ``xetHash`` on LFS entries,
answers LFS ``resolve`` requests with a 302 to a signed CDN URL and paginates
tree listings, as huggingface.co does.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx2
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


MOVED = "org/moved-head"


@pytest.mark.parametrize("shape", ["resolve_cache", "compress_head"])
def test_a_kept_file_confirmed_by_head_is_read_as_stock_reads_it(
    shape, tmp_path, mirror_server_factory, monkeypatch
):
    """``main`` moves with config.json unchanged: its cached blob is confirmed by one HEAD.

    A small file answered by a relative 307 carrying ``ETag`` but no ``X-Linked-Size``
    (the redirect's ``Content-Length`` is its own body's), or a HEAD answered compressed
    to a client that accepts gzip: the size read was not the file's, the confirmation
    failed twice, and the old snapshot was served as if the Hub could not be asked.
    Stock (``Accept-Encoding: identity``, no size from a redirect) loads the new commit;
    so does the resolver, and ``install()`` with it.
    """
    import cmh.hub as hub
    from cmh.hub.mirror import add_folder
    from huggingface_hub import snapshot_download
    from resolver_support import write_checkpoint_repo
    from test_dropin_hook import aim_stock_client

    store = tmp_path / "store"
    add_folder(store, write_checkpoint_repo(tmp_path / "v1", 1, stamp=False), MOVED)
    with running(mirror_server_factory(store).url) as front:
        setattr(front, shape, True)
        aim_stock_client(monkeypatch, front.url, tmp_path / "unused")
        caches = {name: tmp_path / name for name in ("cmh", "stock", "installed")}
        first = hub.resolve(MOVED, cache_dir=caches["cmh"], endpoint=front.url)
        snapshot_download(MOVED, cache_dir=caches["stock"], endpoint=front.url)
        add_folder(store, write_checkpoint_repo(tmp_path / "v2", 2, stamp=False), MOVED)
        res = hub.resolve(MOVED, cache_dir=caches["cmh"], endpoint=front.url)
        stock = snapshot_download(MOVED, cache_dir=caches["stock"], endpoint=front.url)
        heads = front.records(method="HEAD", path="/config.json$")
        assert hub.install()
        try:
            snapshot_download(MOVED, cache_dir=caches["installed"], endpoint=front.url)
            installed = snapshot_download(MOVED, cache_dir=caches["installed"], endpoint=front.url)
        finally:
            hub.uninstall()
    assert res.commit == Path(stock).name == Path(installed).name != first.commit
    assert res.state is hub.State.ETAG_MISMATCH and not res.warnings
    kept = next(f for f in res.files if f.path == "config.json")
    assert kept.action is hub.Action.LINKED  # confirmed by the HEAD, not fetched
    assert heads and all(r.headers.get("accept-encoding") == "identity" for r in heads)
    config = (tmp_path / "v2" / "config.json").read_bytes()
    assert (Path(installed) / "config.json").read_bytes() == config


def test_a_listing_that_disagrees_twice_is_raised_not_served_stale(
    tmp_path, mirror_server_factory, monkeypatch, caplog
):
    """spec/resolver.md §4: a second disagreement raises ``HubProtocolError`` and nothing is
    linked; stale-if-error (§3) is for a Hub that cannot be asked, not one that answered.
    ``install()`` hands the call to the stock client, which loads the new commit."""
    import cmh.hub as hub
    from cmh.hub.mirror import add_folder
    from cmh.hub.resolver._http import HubClient
    from huggingface_hub import snapshot_download
    from resolver_support import write_checkpoint_repo
    from test_dropin_hook import aim_stock_client

    served = HubClient.served

    def lying(self, url):  # resolve serves config.json one byte longer than listed
        answer = served(self, url)
        if url.endswith("/config.json") and answer.size is not None:
            return dataclasses.replace(answer, size=answer.size + 1)
        return answer

    store = tmp_path / "store"
    add_folder(store, write_checkpoint_repo(tmp_path / "v1", 1, stamp=False), MOVED)
    with running(mirror_server_factory(store).url) as front:
        aim_stock_client(monkeypatch, front.url, tmp_path / "unused")
        first = hub.resolve(MOVED, cache_dir=tmp_path / "cmh", endpoint=front.url)
        snapshot_download(MOVED, cache_dir=tmp_path / "installed", endpoint=front.url)
        add_folder(store, write_checkpoint_repo(tmp_path / "v2", 2, stamp=False), MOVED)
        monkeypatch.setattr(HubClient, "served", lying)
        with pytest.raises(hub.HubProtocolError, match="also in a listing fetched again"):
            hub.resolve(MOVED, cache_dir=tmp_path / "cmh", endpoint=front.url)
        stock = snapshot_download(MOVED, cache_dir=tmp_path / "stock", endpoint=front.url)
        assert hub.install()
        try:
            installed = snapshot_download(
                MOVED, cache_dir=tmp_path / "installed", endpoint=front.url
            )
        finally:
            hub.uninstall()
    repo = tmp_path / "cmh" / f"models--{MOVED.replace('/', '--')}"
    assert (repo / "refs" / "main").read_text() == first.commit  # nothing linked or moved
    assert Path(installed).name == Path(stock).name != first.commit
    assert not any("stale" in r.getMessage() for r in caplog.records)


def _no_token_anywhere(monkeypatch, tmp_path):
    """No ``HF_TOKEN`` and no token file: ``get_token()`` finds nothing."""
    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))


def test_the_token_sent_is_the_one_stock_chooses(front, tmp_path, monkeypatch):
    """``HF_HUB_DISABLE_IMPLICIT_TOKEN`` with ``HF_TOKEN`` set: stock sends no token for
    ``token=None``, and ``token=True`` still sends it; so do the resolver and ``install()``
    (the resolver read ``HF_TOKEN`` itself and sent it)."""
    import cmh.hub as hub
    from huggingface_hub import constants, hf_hub_download, snapshot_download
    from test_dropin_hook import aim_stock_client

    aim_stock_client(monkeypatch, front.url, tmp_path / "unused")
    _no_token_anywhere(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_implicit_token")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)

    def sent(call) -> set[str | None]:
        before = len(front.records(origin="hub"))
        call()
        front.wait_idle()
        return {r.headers.get("authorization") for r in front.records(origin="hub")[before:]}

    def loads(cache):
        hf_hub_download(TINY_REPO, "config.json", cache_dir=cache, endpoint=front.url)
        snapshot_download(TINY_REPO, cache_dir=cache, endpoint=front.url)

    stock = sent(lambda: loads(tmp_path / "stock"))
    assert hub.install()
    try:
        installed = sent(lambda: loads(tmp_path / "installed"))
    finally:
        hub.uninstall()
    resolved = sent(lambda: hub.resolve(TINY_REPO, cache_dir=tmp_path / "r", endpoint=front.url))
    asked = sent(
        lambda: hub.resolve(TINY_REPO, cache_dir=tmp_path / "t", endpoint=front.url, token=True)
    )
    assert stock == installed == resolved == {None}
    assert asked == {"Bearer hf_implicit_token"}


def test_an_empty_token_fails_as_stock_fails(front, tmp_path, monkeypatch):
    """``token=""``: huggingface_hub's ``get_token_to_send`` returns it as it is (every
    release, 0.x to 2.x), so the stock client builds ``Authorization: Bearer ``, which h11
    refuses before a byte is sent: ``httpx2.LocalProtocolError``, and the Hub sees nothing;
    a cached pinned commit is returned without a request. Was: ``install()`` sent
    ``HF_TOKEN`` instead (``""`` read as ``None``) and ``resolve()`` sent no token, and
    both downloaded; the client hook answered the stock client's requests from a fresh
    cache without trying to send them."""
    import cmh.hub as hub
    import huggingface_hub
    from test_dropin_hook import aim_stock_client

    aim_stock_client(monkeypatch, front.url, tmp_path / "unused")
    _no_token_anywhere(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_implicit_token")

    def outcome(call) -> tuple[object, list[str | None]]:
        before = len(front.records(origin="hub"))
        try:
            got: object = Path(call()).name
        except Exception as exc:
            got = (type(exc), str(exc))
        front.wait_idle()
        return got, [r.headers.get("authorization") for r in front.records(origin="hub")[before:]]

    def loads(cache: Path) -> list[tuple[object, list[str | None]]]:
        # Looked up at each call, as code imported after install() gets the wrappers.
        hf_hub_download = huggingface_hub.hf_hub_download
        snapshot_download = huggingface_hub.snapshot_download
        commit = hub.resolve(TINY_REPO, cache_dir=cache, endpoint=front.url).commit  # fresh
        return [
            outcome(lambda: hf_hub_download(TINY_REPO, "config.json", cache_dir=cache,
                                            endpoint=front.url, token="")),
            outcome(lambda: snapshot_download(TINY_REPO, cache_dir=cache, endpoint=front.url,
                                              token="")),
            outcome(lambda: hf_hub_download(TINY_REPO, "config.json", cache_dir=cache,
                                            endpoint=front.url, token="", revision=commit)),
        ]  # fmt: skip

    stock = loads(tmp_path / "stock")
    refused = (httpx2.LocalProtocolError, "Illegal header value b'Bearer '")
    assert stock == [(refused, []), (refused, []), ("config.json", [])]
    assert hub.install()
    try:
        assert hasattr(huggingface_hub.hf_hub_download, "__cmh_original__")
        installed = loads(tmp_path / "installed")
    finally:
        hub.uninstall()
    assert installed == stock
    assert outcome(
        lambda: hub.resolve(TINY_REPO, cache_dir=tmp_path / "r", endpoint=front.url, token="")
    ) == (refused, [])


def test_a_required_token_that_cannot_be_found_raises_as_stock(front, tmp_path, monkeypatch):
    """``token=True`` with no token anywhere: stock raises ``LocalTokenNotFoundError`` from
    ``hf_hub_download`` and ``snapshot_download``; ``install()`` downloaded anonymously."""
    import cmh.hub as hub
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import LocalTokenNotFoundError
    from test_dropin_hook import aim_stock_client

    aim_stock_client(monkeypatch, front.url, tmp_path / "unused")
    _no_token_anywhere(monkeypatch, tmp_path)

    def raised(cache) -> list[str]:
        out = []
        for call in (hf_hub_download, snapshot_download):
            kwargs = {"filename": "config.json"} if call is hf_hub_download else {}
            with pytest.raises(LocalTokenNotFoundError) as caught:
                call(TINY_REPO, cache_dir=cache, endpoint=front.url, token=True, **kwargs)
            out.append(str(caught.value))
        return out

    stock = raised(tmp_path / "stock")
    hub.resolve(TINY_REPO, cache_dir=tmp_path / "installed", endpoint=front.url)  # cached
    assert hub.install()
    try:
        installed = raised(tmp_path / "installed")
    finally:
        hub.uninstall()
    assert installed == stock
    with pytest.raises(LocalTokenNotFoundError):
        hub.resolve(TINY_REPO, cache_dir=tmp_path / "installed", endpoint=front.url, token=True)
