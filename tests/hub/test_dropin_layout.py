"""Drop-in exactness of the cache's files: what ``install()`` leaves on disk is what the stock
client leaves, for the same calls run stock (fresh cache, no ``install()``) and installed.

Symlink-less caches (``HF_HUB_DISABLE_SYMLINKS``, a snapshot stock filled that way), the
stock tree listing ``get_cached_repo_tree`` reads, and calls that write nothing (a bare API
call or an offline call on an empty cache).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_dropin_hook import (  # noqa: F401 (fixtures)
    REPO,
    aim_stock_client,
    hooked_server,
    toy,
)


def _layout(cache: Path) -> dict[str, str]:
    """Every entry under ``cache`` (cmh's own ``.cmh`` folders left out): ``link``, ``file``
    or ``dir``, by path relative to ``cache``."""
    out: dict[str, str] = {}
    if not cache.exists():
        return out
    for top, dirs, files in os.walk(cache):
        dirs[:] = [d for d in dirs if d != ".cmh"]
        for name in dirs + files:
            path = Path(top) / name
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            out[str(path.relative_to(cache))] = kind
    return out


def _both(
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    tmp_path: Path,
    calls: Callable[[Path], Any],
    prepare: Callable[[Path], None] | None = None,
) -> tuple[Any, Any]:
    """``calls(cache)`` run stock in one fresh cache and installed in another (each first
    ``prepare``d, stock): what each returned."""
    import cmh.hub as hub
    from cmh.hub.resolver import _window

    got = []
    for installed in (False, True):
        cache = tmp_path / ("installed" if installed else "stock")
        aim_stock_client(monkeypatch, url, cache)
        if prepare is not None:
            prepare(cache)
        if installed:
            assert hub.install()
            _window.forget()  # as a new process
        try:
            got.append(calls(cache))
        finally:
            hub.uninstall()
    return got[0], got[1]


def test_symlinks_disabled_fills_the_cache_as_stock_does(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """``HF_HUB_DISABLE_SYMLINKS``: plain files in ``snapshots/``, no blob kept, as stock."""
    import huggingface_hub as hf  # its attributes: the wrappers while installed
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_SYMLINKS", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_SYMLINKS_WARNING", True)

    def calls(cache: Path) -> dict[str, str]:
        config = hf.hf_hub_download(REPO, "config.json")
        folder = hf.snapshot_download(REPO, allow_patterns=["*.json", "sub/*"])
        assert not os.path.islink(config) and os.path.isfile(Path(folder) / "sub" / "notes.txt")
        return _layout(cache)

    stock, installed = _both(monkeypatch, toy.server.url, tmp_path, calls)
    assert "link" not in stock.values()
    assert installed == stock


def test_a_snapshot_stock_filled_without_symlinks_is_left_as_it_is(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A cache stock filled with ``HF_HUB_DISABLE_SYMLINKS``, then an online
    ``snapshot_download`` with symlinks allowed: stock keeps its plain files, so does
    ``install()`` (it used to link the snapshot to new blobs)."""
    import huggingface_hub as hf
    from huggingface_hub import constants

    def prepare(cache: Path) -> None:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(constants, "HF_HUB_DISABLE_SYMLINKS", True)
            m.setattr(constants, "HF_HUB_DISABLE_SYMLINKS_WARNING", True)
            hf.snapshot_download(REPO, allow_patterns=["*.json"])

    def calls(cache: Path) -> dict[str, str]:
        hf.snapshot_download(REPO, allow_patterns="*.json")
        hf.hf_hub_download(REPO, "config.json")
        return _layout(cache)

    stock, installed = _both(monkeypatch, toy.server.url, tmp_path, calls, prepare)
    assert "link" not in stock.values()
    assert installed == stock


@pytest.mark.parametrize("complete", [False, True], ids=["brings-more", "complete-already"])
def test_the_stock_tree_listing_is_written_as_stock_writes_it(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    complete: bool,
) -> None:
    """``get_cached_repo_tree`` after one-file downloads and a ``snapshot_download``: the
    same files with the same ``blob_id`` (an LFS file's git object id, not its SHA-256),
    also when the downloads had made the snapshot complete already (no listing was written)."""
    import huggingface_hub as hf
    from huggingface_hub import get_cached_repo_tree

    names = sorted(p.relative_to(toy.src).as_posix() for p in toy.src.rglob("*") if p.is_file())

    def calls(cache: Path) -> list[tuple[str, str]]:
        for name in names if complete else ["config.json"]:
            hf.hf_hub_download(REPO, name)
        hf.snapshot_download(REPO, allow_patterns=None if complete else ["config.json", "*.safe*"])
        return sorted((f.path, f.blob_id) for f in get_cached_repo_tree(REPO))

    stock, installed = _both(monkeypatch, toy.server.url, tmp_path, calls)
    assert any(len(blob_id) == 40 for _, blob_id in stock) and len(stock) == len(names)
    assert installed == stock


def _outcome(call: Callable[[], Any]) -> str:
    try:
        call()
        return "answered"
    except Exception as exc:
        return type(exc).__name__


def test_bare_api_calls_on_an_empty_cache_write_nothing(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """On an empty cache, ``model_info`` and ``file_exists`` (online) leave the cache as stock
    leaves it: nothing, so ``scan_cache_dir`` raises stock's ``CacheNotFound`` (it reported
    a corrupt repo: the hook's stored answers in a folder without ``snapshots/``)."""
    from huggingface_hub import HfApi, scan_cache_dir

    def calls(cache: Path) -> tuple[list[str], dict[str, str]]:
        out = [
            _outcome(lambda: HfApi().model_info(REPO)),
            _outcome(lambda: HfApi().file_exists(REPO, "config.json")),
            _outcome(lambda: scan_cache_dir(cache)),
        ]
        return out, _layout(cache)

    stock, installed = _both(monkeypatch, toy.server.url, tmp_path, calls)
    assert stock == (["answered", "answered", "CacheNotFound"], {}), stock
    assert installed == stock


def test_calls_that_find_nothing_on_an_empty_cache_write_nothing(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """``local_files_only`` downloads on an empty cache, and online ones of a repo the Hub
    does not have (a model, a space), raise stock's error and leave the cache as stock
    leaves it: nothing (no ``.locks/`` folder, no ``cmh.repo.lock``)."""
    import huggingface_hub as hf

    def calls(cache: Path) -> tuple[list[str], dict[str, str]]:
        out = [
            _outcome(lambda: hf.hf_hub_download(REPO, "config.json", local_files_only=True)),
            _outcome(lambda: hf.snapshot_download(REPO, local_files_only=True)),
            _outcome(lambda: hf.hf_hub_download("org/none", "config.json")),  # online: 404
            _outcome(lambda: hf.hf_hub_download("org/sp", "app.py", repo_type="space")),
        ]
        return out, _layout(cache)

    stock, installed = _both(monkeypatch, toy.server.url, tmp_path, calls)
    assert stock[1] == {}, stock
    assert installed == stock
