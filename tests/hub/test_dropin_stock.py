"""Drop-in exactness, part three (issue 36): stock exceptions and stock cache files.

Each test puts ``install()`` in a state where it once answered otherwise than the
stock client, and compares with what the stock client raises or writes.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from test_dropin_hook import (  # noqa: F401 (fixtures)
    REPO,
    aim_stock_client,
    hooked_server,
    installed,
    toy,
)


def _refusing_url() -> str:
    """A loopback port nothing listens on: the Hub is unreachable (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stock client's backoff between retries of a refused connection, without its
    waits (about 23 s per call; the outcome does not depend on them)."""
    import types

    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))


def _repo_dir(cache: Path) -> Path:
    return cache / f"models--{REPO.replace('/', '--')}"


def _no_exist(cache: Path) -> list[str]:
    folder = _repo_dir(cache) / ".no_exist"
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


STOCK_UNREACHABLE = (
    "An error happened while trying to locate the file on the Hub and we cannot find the "
    "requested files in the local cache. Please check your connection and try again or make "
    "sure your Internet connection is on."
)


def test_fresh_snapshot_without_the_hub_missing_file_raises_the_stock_local_error(
    toy: Any,  # noqa: F811 (a fixture)
    installed: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 1: the listing of a fresh stamped snapshot lacks the file and the Hub cannot be
    reached: stock raises ``LocalEntryNotFoundError`` and writes nothing; so does install()."""
    import cmh.hub as hub
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

    assert hub.resolve(REPO).expires_at is not None  # fresh for 30 days (stamped)
    _no_backoff(monkeypatch)
    aim_stock_client(monkeypatch, _refusing_url(), toy.cache)
    with pytest.raises(LocalEntryNotFoundError) as caught:
        hf_hub_download(REPO, "adapter_config.json")
    assert isinstance(caught.value, FileNotFoundError)
    assert str(caught.value) == STOCK_UNREACHABLE
    assert _no_exist(toy.cache) == []
    # The Hub back: its own 404, status line and message, and the marker stock writes.
    aim_stock_client(monkeypatch, toy.server.url, toy.cache)
    with pytest.raises(RemoteEntryNotFoundError) as online:
        hf_hub_download(REPO, "adapter_config.json")
    message = str(online.value)
    assert message.startswith("404 Client Error."), message
    url = f"{toy.server.url}/{REPO}/resolve/main/adapter_config.json"
    assert f"Entry Not Found for url: {url}." in message
    assert _no_exist(toy.cache) == ["adapter_config.json"]


def _stock_offline_snapshot(cache: Path) -> tuple[str, str]:
    """What the stock ``snapshot_download(local_files_only=True)`` makes of ``cache``."""
    from huggingface_hub import _snapshot_download

    original = getattr(_snapshot_download.snapshot_download, "__cmh_original__", None)
    stock = original or _snapshot_download.snapshot_download
    try:
        path = stock(REPO, cache_dir=str(cache), local_files_only=True)
    except Exception as exc:
        return type(exc).__name__, ""
    return "ok", sorted(p.name for p in Path(path).iterdir()).__repr__()


def test_one_file_download_writes_no_stock_tree_listing(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Item 2: stock writes ``trees/{commit}.json`` from ``snapshot_download`` only; after
    one ``hf_hub_download`` a stock offline ``snapshot_download`` answers as for a cache
    the stock client filled (the partial folder, not ``IncompleteSnapshotError``)."""
    import cmh.hub as hub
    import cmh.hub.resolver._patch as patch
    from huggingface_hub import file_download

    stock_cache = tmp_path / "stock-filled"
    file_download.hf_hub_download(REPO, "config.json", cache_dir=str(stock_cache))
    assert hub.install()
    patch._recent.clear()
    try:
        from huggingface_hub import hf_hub_download, snapshot_download

        hf_hub_download(REPO, "config.json")
        trees = _repo_dir(toy.cache) / "trees"
        assert not trees.exists() or list(trees.iterdir()) == []
        assert _stock_offline_snapshot(toy.cache) == _stock_offline_snapshot(stock_cache)
        assert _stock_offline_snapshot(toy.cache)[0] == "ok"
        # The resolver still knows the listing (its own copy): a second file asks nothing new.
        commit = (_repo_dir(toy.cache) / "refs" / "main").read_text()
        assert (_repo_dir(toy.cache) / ".cmh" / "trees" / f"{commit}.json").is_file()
        snapshot_download(REPO)  # as stock: the snapshot's listing is written where stock reads it
        assert (trees / f"{commit}.json").is_file()
    finally:
        hub.uninstall()


def test_cachedir_tag_written_as_stock_writes_it(
    toy: Any,  # noqa: F811 (a fixture)
    tmp_path: Path,
) -> None:
    """Item 4: a cache filled by ``install()`` or ``cmh pull`` carries the stock client's
    ``CACHEDIR.TAG`` at its root, byte for byte (backup tools skip it by that file)."""
    from click.testing import CliRunner
    from cmh.cli.main import cli
    from huggingface_hub import file_download

    stock = tmp_path / "stock"
    file_download.hf_hub_download(REPO, "config.json", cache_dir=str(stock))
    expected = (stock / "CACHEDIR.TAG").read_bytes()
    import cmh.hub as hub

    assert hub.install()
    try:
        from huggingface_hub import hf_hub_download

        hf_hub_download(REPO, "config.json")  # routed through the resolver
    finally:
        hub.uninstall()
    assert (_repo_dir(toy.cache) / ".cmh").is_dir()  # the resolver did it, not the stock function
    assert (toy.cache / "CACHEDIR.TAG").read_bytes() == expected
    pulled = tmp_path / "pulled"
    result = CliRunner().invoke(cli, ["pull", REPO, "--cache-dir", str(pulled)])
    assert result.exit_code == 0, result.output
    assert (pulled / "CACHEDIR.TAG").read_bytes() == expected


def _bare_calls() -> dict[str, str]:
    """Bare Hub API calls (no load under way): what each returned or raised."""
    from huggingface_hub import HfApi, HfFileSystem

    calls = {
        "model_info": lambda: HfApi().model_info(REPO).sha,
        "list_repo_files": lambda: HfApi().list_repo_files(REPO),
        "ls": lambda: HfFileSystem(skip_instance_cache=True).ls(REPO, detail=False),
        "read_bytes": lambda: HfFileSystem(skip_instance_cache=True).read_bytes(
            f"{REPO}/config.json"
        ),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "answered"
        except Exception as exc:
            out[name] = type(exc).__name__
    return out


@pytest.mark.parametrize("api_from_cache", [False, True], ids=["default", "api-from-cache"])
def test_bare_api_calls_without_the_hub_raise_as_stock_unless_asked(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    api_from_cache: bool,
) -> None:
    """Item 3: a warm, fresh stamped cache (its API answers kept) and the Hub unreachable:
    ``model_info``, ``list_repo_files``, ``HfFileSystem().ls/read_bytes`` raise the stock
    client's ``ConnectError``; ``install(api_from_cache=True)`` answers them from the cache."""
    import cmh.hub as hub
    from cmh.hub.resolver import _window

    assert hub.install(api_from_cache=api_from_cache)
    try:
        hub.resolve(REPO)  # the snapshot, fresh for 30 days
        assert set(_bare_calls().values()) == {"answered"}  # online: answers kept
        _window.forget()  # as a new process
        _no_backoff(monkeypatch)
        aim_stock_client(monkeypatch, _refusing_url(), toy.cache)
        got = _bare_calls()
    finally:
        hub.uninstall()
    if api_from_cache:
        assert set(got.values()) == {"answered"}, got
    else:
        assert set(got.values()) == {"ConnectError"}, got


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_no_pinned_commit_warning_when_the_caller_named_a_branch(
    tmp_path: Path,
    mirror_server_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Item 7: a branch whose stamp expired, asked twice in the window: the second call uses
    the commit the Hub just named; no "a pinned commit is kept" (nothing was pinned)."""
    import cmh.hub as hub
    from cmh.hub.mirror import add_folder
    from resolver_support import write_checkpoint_repo

    import cmh

    src = write_checkpoint_repo(tmp_path / "src", 1, stamp=False)
    cmh.stamp(src / "model.safetensors", ttl="1d", now=1_700_000_000)  # expired long ago
    add_folder(tmp_path / "store", src, REPO)
    server = mirror_server_factory(tmp_path / "store")
    aim_stock_client(monkeypatch, server.url, tmp_path / "cache")
    assert hub.install()
    try:
        import huggingface_hub

        caplog.set_level("WARNING", logger="cmh.hub")
        for name in ("model.safetensors", "config.json", "model.safetensors"):
            huggingface_hub.hf_hub_download(REPO, name)
    finally:
        hub.uninstall()
    assert not [w for w in _warned(caplog) if "pinned commit" in w], caplog.text


def test_stock_filled_partial_snapshot_read_offline_warns_nothing(
    toy: Any,  # noqa: F811 (a fixture)
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Item 7: a snapshot the stock client filled (no listing), read offline under
    install(): served as stock serves it, without a "completeness unknown" warning."""
    import cmh.hub as hub
    from huggingface_hub import file_download

    stock_path = file_download.hf_hub_download(REPO, "config.json")
    assert hub.install()
    try:
        import huggingface_hub

        caplog.set_level("WARNING", logger="cmh.hub")
        path = huggingface_hub.hf_hub_download(REPO, "config.json", local_files_only=True)
    finally:
        hub.uninstall()
    assert path == stock_path
    assert _warned(caplog) == [], caplog.text


def test_bare_calls_at_the_commit_the_hub_just_named_ask_nothing(
    toy: Any,  # noqa: F811 (a fixture)
    installed: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    """An unstamped repo revalidated by a patched call: the same load's bare calls at the
    commit the Hub named (datasets asks info and tree pages at the commit) are part of that
    revalidation, answered from the cache within the window."""
    from cmh.hub.mirror import add_folder
    from huggingface_hub import HfApi, hf_hub_download
    from resolver_support import write_checkpoint_repo

    add_folder(toy.server.store, write_checkpoint_repo(tmp_path / "plain", 1, stamp=False), "o/p")
    path = Path(hf_hub_download("o/p", "config.json"))  # revalidates: the Hub names the commit
    commit = path.parent.name
    HfApi().model_info("o/p", revision=commit)  # asked once, their answers kept
    HfApi().list_repo_files("o/p", revision=commit)
    toy.server.sync()
    mark = len(toy.server.log())
    assert HfApi().model_info("o/p", revision=commit).sha == commit
    assert HfApi().list_repo_files("o/p", revision=commit)
    toy.server.sync()
    asked = [e["target"] for e in toy.server.log()[mark:] if e["route"] not in ("health",)]
    assert asked == [], asked


def _second_lookup_of_a_missing_file(cache: Path) -> list[tuple[str, list[str]]]:
    """Two ``hf_hub_download`` of a file the repo lacks: each error's type and message
    lines (the request id left out: each answer has its own)."""
    import huggingface_hub

    out = []
    for _ in range(2):
        try:
            huggingface_hub.hf_hub_download(REPO, "nope.json")
            out.append(("answered", []))
        except Exception as exc:
            lines = [line for line in str(exc).splitlines() if "Request ID" not in line]
            out.append((type(exc).__name__, lines))
    assert _no_exist(cache) == ["nope.json"]
    return out


def test_a_missing_file_asked_again_raises_with_the_hubs_own_message(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The second lookup of a missing file, answered from its ``.no_exist`` marker, raises
    what stock's second lookup raises (it asks the Hub again): the same type and the Hub's
    own message line (``nope.json does not exist on main``), not a made-up one."""
    import cmh.hub as hub
    from cmh.hub.resolver import _window

    aim_stock_client(monkeypatch, toy.server.url, tmp_path / "stock")
    stock = _second_lookup_of_a_missing_file(tmp_path / "stock")
    aim_stock_client(monkeypatch, toy.server.url, tmp_path / "installed")
    assert hub.install()
    try:
        _window.forget()
        installed = _second_lookup_of_a_missing_file(tmp_path / "installed")
    finally:
        hub.uninstall()
    assert stock[0] == stock[1] and stock[0][0] == "RemoteEntryNotFoundError", stock
    assert installed == stock
