"""install(): ``hf_hub_download`` names files exactly as the stock client does (issue 13)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mirror_support import TINY_REPO

# (filename, subfolder): every spelling a library may use for a file of the tiny repo.
SPELLINGS = [
    ("config.json", "."),  # sentence-transformers: modules.json with subfolder="."
    ("config.json", ""),
    ("./config.json", None),
    ("notes.txt", "sub"),
    ("deeper/leaf.txt", "sub/."),
    ("sub/./notes.txt", None),
    ("leaf.txt", "./sub/deeper"),
]


@pytest.fixture
def installed() -> Iterator[Any]:
    import cmh.hub as hub
    from huggingface_hub import file_download

    assert hub.install()
    try:
        yield file_download.hf_hub_download
    finally:
        hub.uninstall()


@pytest.mark.parametrize(("filename", "subfolder"), SPELLINGS)
def test_same_path_and_bytes_as_stock(mirror, tmp_path, installed, filename, subfolder):
    stock = installed.__cmh_original__
    common = {"endpoint": mirror.url, "subfolder": subfolder}
    want = stock(TINY_REPO, filename, cache_dir=tmp_path / "stock", **common)
    got = installed(TINY_REPO, filename, cache_dir=tmp_path / "ours", **common)
    stock_root, our_root = str(tmp_path / "stock"), str(tmp_path / "ours")
    assert got.replace(our_root, "") == want.replace(stock_root, "")
    assert Path(got).read_bytes() == Path(want).read_bytes()
    # No false "this file does not exist" entry for a file that exists.
    assert not list((tmp_path / "ours").rglob(".no_exist/*/*"))


def test_missing_file_under_dot_subfolder_is_entry_not_found(mirror, tmp_path, installed):
    from huggingface_hub.errors import RemoteEntryNotFoundError

    stock = installed.__cmh_original__
    with pytest.raises(RemoteEntryNotFoundError):
        stock(
            TINY_REPO, "modules.json", subfolder=".", cache_dir=tmp_path / "s", endpoint=mirror.url
        )
    with pytest.raises(RemoteEntryNotFoundError):
        installed(
            TINY_REPO, "modules.json", subfolder=".", cache_dir=tmp_path / "o", endpoint=mirror.url
        )
    for root in ("s", "o"):
        markers = [p.name for p in (tmp_path / root).rglob(".no_exist/*/*")]
        assert markers == ["modules.json"], root


def test_refused_names_get_the_stock_error(mirror, tmp_path, installed):
    for filename, subfolder in [("../x", None), ("x", ".."), ("/etc/passwd", None)]:
        with pytest.raises(ValueError):
            installed(
                TINY_REPO, filename, subfolder=subfolder, cache_dir=tmp_path, endpoint=mirror.url
            )


def test_glob_characters_in_a_name_are_the_name(tmp_path, mirror_server_factory, installed):
    from cmh.hub.mirror import add_folder

    src = tmp_path / "src"
    src.mkdir()
    (src / "a[1].txt").write_text("bracket\n")
    (src / "a1.txt").write_text("plain\n")
    (src / "a?.txt").write_text("question\n")
    store = tmp_path / "store"
    add_folder(store, src, "org/globs")
    server = mirror_server_factory(store)
    for name, text in [("a[1].txt", "bracket\n"), ("a?.txt", "question\n"), ("a1.txt", "plain\n")]:
        path = installed("org/globs", name, cache_dir=tmp_path / "c", endpoint=server.url)
        assert Path(path).read_text() == text and Path(path).name == name
    assert not list((tmp_path / "c").rglob(".no_exist/*/*"))
