"""install()'s client hook: huggingface_hub's own calls answered from a fresh cache (issue 13)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from deadline_support import TEST_DEADLINE
from resolver_support import write_checkpoint_repo

REPO = "org/hooked"


def aim_stock_client(monkeypatch: pytest.MonkeyPatch, url: str, cache: Path) -> None:
    """Point this process's huggingface_hub at the Hub ``url`` and the cache ``cache``, online."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture(scope="module")
def hooked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """A stamped repo on one ``cmh serve`` for the module (the subject is the client hook,
    not the server; no test changes the repo), and the repo's source folder."""
    from cmh.hub.mirror import add_folder
    from mirror_support import MirrorServer

    base = tmp_path_factory.mktemp("hooked")
    src = write_checkpoint_repo(base / "src", 1, ttl="30d")
    (src / "sub").mkdir()
    (src / "sub" / "notes.txt").write_text("notes\n" * 100)
    store = base / "store"
    add_folder(store, src, REPO)
    with MirrorServer(store, base / "logs") as server:
        yield server, src


@pytest.fixture
def toy(tmp_path: Path, hooked_server: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The module's stamped repo and server; the default cache points at ``tmp_path``."""
    server, src = hooked_server
    cache = tmp_path / "cache"
    aim_stock_client(monkeypatch, server.url, cache)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))

    class Toy:
        pass

    toy = Toy()
    toy.src, toy.server, toy.cache = src, server, cache  # type: ignore[attr-defined]
    return toy


@pytest.fixture
def installed() -> Iterator[None]:
    import cmh.hub as hub
    import cmh.hub.resolver._patch as patch

    assert hub.install()
    patch._recent.clear()
    try:
        yield
    finally:
        hub.uninstall()


@pytest.mark.parametrize("version", ["1.33.0", "0.17.3", "unknown"])
def test_install_patches_nothing_on_a_release_older_than_2(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version gate (``test_dropin_versions.py`` runs a real 0.17.3): below 2.0 nothing is
    patched, a warning names the release, and ``install()`` returns False."""
    import cmh.hub as hub
    import huggingface_hub
    from huggingface_hub import file_download
    from huggingface_hub.utils import _http

    before = (file_download.hf_hub_download, huggingface_hub.snapshot_download,
              _http._GLOBAL_CLIENT_FACTORY)  # fmt: skip
    monkeypatch.setattr(huggingface_hub, "__version__", version)
    with pytest.warns(RuntimeWarning, match=f"huggingface_hub {version} is not supported"):
        assert hub.install() is False
    try:
        assert not hub.installed()
        after = (file_download.hf_hub_download, huggingface_hub.snapshot_download,
                 _http._GLOBAL_CLIENT_FACTORY)  # fmt: skip
        assert after == before
    finally:
        hub.uninstall()
    monkeypatch.setattr(huggingface_hub, "__version__", "2.0.0rc1")
    assert hub.install()  # a 2.x pre-release is 2.x
    hub.uninstall()


def _requests(server: Any, since: int) -> list[str]:
    return [
        f"{e['method']} {e.get('target')}"
        for e in server.log()[since:]
        if e["route"] not in ("health", "metrics")
    ]


def test_parse_target() -> None:
    from cmh.hub.resolver._session import Target, parse_target

    def parse(url: str) -> Target | None:
        return parse_target(httpx2.URL("http://h" + url))

    assert parse("/api/models/a/b") == Target("info", "model", "a/b", "main", "")
    assert parse("/api/models/gpt2/revision/v1") == Target("info", "model", "gpt2", "v1", "")
    assert parse("/api/datasets/a/b/tree/main/x/y?recursive=true") == Target(
        "tree", "dataset", "a/b", "main", "x/y"
    )
    assert parse("/a/b/resolve/refs%2Fpr%2F1/sub/f.txt") == Target(
        "resolve", "model", "a/b", "refs/pr/1", "sub/f.txt"
    )
    assert parse("/spaces/a/b/resolve/main/app.py") == Target(
        "resolve", "space", "a/b", "main", "app.py"
    )
    for other in ("/api/models/a/b/paths-info/main", "/api/whoami-v2", "/a/b/blob/main/x", "/"):
        assert parse(other) is None, other


def test_fresh_snapshot_answers_stock_calls_without_requests(
    toy: Any, installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stock functions themselves (not the patched ones) make no request when fresh,
    bare API calls included once ``CMH_HUB_API_FROM_CACHE=1`` allows it (by default they
    ask the Hub as stock does, issue 36: see test_dropin_stock.py)."""
    import cmh.hub as hub

    monkeypatch.setenv("CMH_HUB_API_FROM_CACHE", "1")
    import cmh.hub.resolver._patch as patch
    from huggingface_hub import HfApi, HfFileSystem, file_download

    hub.resolve(REPO)  # the snapshot, fresh for 30 days (stamped)
    stock_download = file_download.hf_hub_download.__cmh_original__
    from huggingface_hub.errors import EntryNotFoundError

    def calls() -> None:
        assert HfApi().model_info(REPO).sha == hub.resolve(REPO).commit
        path = stock_download(REPO, "config.json")
        assert Path(path).read_bytes() == (toy.src / "config.json").read_bytes()
        with HfFileSystem(skip_instance_cache=True).open(f"{REPO}/model.safetensors", "rb") as f:
            f.seek(100)  # a ranged read of the blob
            assert f.read(50) == (toy.src / "model.safetensors").read_bytes()[100:150]
        with pytest.raises(EntryNotFoundError):
            stock_download(REPO, "missing.json")

    first = len(toy.server.log())
    calls()
    # The first time, API answers are asked at the commit and stored; no file is asked but
    # the missing one: only the Hub says a file is absent (its .no_exist marker, kept).
    asked = [r for r in _requests(toy.server, first) if "/resolve/" in r]
    assert asked == [f"HEAD /{REPO}/resolve/main/missing.json"], asked
    patch._recent.clear()  # as in a new process
    mark = len(toy.server.log())
    calls()
    assert _requests(toy.server, mark) == []


def test_an_empty_token_is_not_answered_from_the_cache(
    toy: Any, installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``token=""``: the stock client's requests carry ``Authorization: Bearer ``, which
    h11 refuses before a byte is sent (``httpx2.LocalProtocolError``). Was: the hook
    answered them from a fresh snapshot, so the stock functions returned files that
    without ``install()`` raise. Now such a request goes to the HTTP client, which raises."""
    import cmh.hub as hub

    monkeypatch.setenv("CMH_HUB_API_FROM_CACHE", "1")  # bare calls answered too
    import huggingface_hub
    from huggingface_hub import HfApi, file_download

    hub.resolve(REPO)  # the snapshot, fresh for 30 days (stamped)
    stock_download = file_download.hf_hub_download.__cmh_original__
    first = len(toy.server.log())
    calls = (
        lambda: huggingface_hub.hf_hub_download(REPO, "config.json", token=""),
        lambda: stock_download(REPO, "config.json", token=""),
        lambda: huggingface_hub.snapshot_download(REPO, token=""),
        lambda: HfApi().model_info(REPO, token=""),
    )
    for call in calls:
        with pytest.raises(httpx2.LocalProtocolError, match="Illegal header value b'Bearer '"):
            call()
    path = stock_download(REPO, "config.json", token=False)  # the hook answers this one
    assert Path(path).read_bytes() == (toy.src / "config.json").read_bytes()
    assert _requests(toy.server, first) == []


def test_stale_snapshot_revalidates_once_per_repo(toy: Any, installed: None) -> None:
    import cmh.hub as hub
    from huggingface_hub import HfApi, file_download

    unstamped = write_checkpoint_repo(toy.src.parent / "v2", 1, stamp=False)
    from cmh.hub.mirror import add_folder

    add_folder(toy.server.store, unstamped, "org/plain")
    hub.resolve("org/plain")
    api = HfApi()
    mark = len(toy.server.log())
    for _ in range(3):
        api.model_info("org/plain")
        file_download.hf_hub_download("org/plain", "config.json")
        file_download.hf_hub_download.__cmh_original__("org/plain", "README.md")
        api.list_repo_tree("org/plain", recursive=True).__iter__().__next__()
    asked = _requests(toy.server, mark)
    revalidations = [r for r in asked if r.split("?")[0] == "GET /api/models/org/plain"]
    assert len(revalidations) == 1, asked
    assert not [r for r in asked if "/resolve/" in r], asked


def test_uninstall_restores_the_users_client_factory(toy: Any) -> None:
    import cmh.hub as hub
    from huggingface_hub import get_session, set_client_factory
    from huggingface_hub.utils import _http

    def mine() -> httpx2.Client:
        return httpx2.Client(headers={"X-Mine": "1"}, follow_redirects=True)

    original = _http._GLOBAL_CLIENT_FACTORY
    set_client_factory(mine)
    try:
        assert hub.install()
        try:
            client = get_session()
            assert client.headers["X-Mine"] == "1"  # the user's client, behind cmh's transport
            assert type(client._transport).__name__ == "FreshCacheTransport"
        finally:
            hub.uninstall()
        assert _http._GLOBAL_CLIENT_FACTORY is mine
        assert type(get_session()._transport).__name__ != "FreshCacheTransport"
    finally:
        set_client_factory(original)


def test_answers_served_from_the_cache_match_the_hub(toy: Any, installed: None) -> None:
    """HEAD metadata from the cache equals what the server says (ETag, commit, size)."""
    import cmh.hub as hub
    import cmh.hub.resolver._patch as patch
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    hub.resolve(REPO)
    for name in ("model.safetensors", "sub/notes.txt"):
        url = hf_hub_url(REPO, name)
        local = get_hf_file_metadata(url)
        patch._recent.clear()
        with httpx2.Client(timeout=TEST_DEADLINE) as plain:
            remote = plain.head(url, follow_redirects=False)
        etag = remote.headers.get("X-Linked-Etag") or remote.headers["ETag"]
        assert local.etag == etag.strip('"')
        assert local.commit_hash == remote.headers["X-Repo-Commit"]
        data = (toy.src / name).read_bytes()
        assert local.size == len(data)
        if len(local.etag) == 64:
            assert local.etag == hashlib.sha256(data).hexdigest()


def test_a_branch_that_moved_within_the_window_is_followed_by_the_rest_of_the_load(
    tmp_path: Path, mirror_server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``main`` moves A -> B while the window holds A: a file A's listing lacks is asked of
    the Hub at ``main``, which answers at B; the rest of the load (weights, ``model_info``)
    was answered at A, one load of two commits. The window now moves to the commit the Hub
    named, so they are B's, as stock's (which asks at every call) are."""
    import cmh.hub as hub
    import huggingface_hub
    from cmh.hub.mirror import add_folder

    v1 = write_checkpoint_repo(tmp_path / "v1", 1, stamp=False)
    v2 = write_checkpoint_repo(tmp_path / "v2", 2, stamp=False)
    (v2 / "new.txt").write_text("only in B\n")

    def load(name: str) -> tuple[list[str], str]:
        """README at A, then main moves to B: new.txt, the weights, model_info."""
        store = tmp_path / name / "store"
        add_folder(store, v1, "org/moving")
        server = mirror_server_factory(store)
        aim_stock_client(monkeypatch, server.url, tmp_path / name / "cache")
        first = Path(huggingface_hub.hf_hub_download("org/moving", "README.md")).parent.name
        add_folder(store, v2, "org/moving")
        got = [
            Path(huggingface_hub.hf_hub_download("org/moving", n)).parent.name
            for n in ("new.txt", "model.safetensors")
        ]
        got.append(str(huggingface_hub.HfApi().model_info("org/moving").sha))
        assert first not in got
        return got, hub.resolve("org/moving", cache_dir=tmp_path / name / "probe").commit

    stock, stock_b = load("stock")
    assert hub.install(window=3600.0)  # the window outlasts the test: no clock involved
    try:
        ours, ours_b = load("ours")
    finally:
        hub.uninstall()
    assert stock == [stock_b] * 3
    assert ours == [ours_b] * 3  # weights and model_info were A's
