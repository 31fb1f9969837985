"""What ``install()`` does after it handed a call to the stock function.

The resolver fails (a Hub it could not use) and the call goes to stock
huggingface_hub, which then fetches from a front that inverts every byte of the
weights: the stock client would return those bytes; under ``install()`` they are
refused as a resolver's corrupt download is (``IntegrityError``), deleted with their
link, and stock's own nested calls do not run the resolver again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hublike import HubLike, running
from resolver_support import write_checkpoint_repo

REPO = "org/handed"


@pytest.fixture
def handed(
    tmp_path: Path, mirror_server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """A front over a toy repo whose weights it serves corrupt; the resolver fails with a
    Hub error at every call (counted), so ``install()`` hands each call to stock."""
    import cmh.hub as hub
    import cmh.hub.resolver._negotiate as negotiate
    import cmh.hub.resolver._patch as patch
    from cmh.hub.mirror import add_folder
    from test_dropin_hook import aim_stock_client

    src = write_checkpoint_repo(tmp_path / "src", 1, stamp=False)
    store = tmp_path / "store"
    add_folder(store, src, REPO)
    calls: list[str] = []

    def failing(repo_id: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(repo_id)
        raise hub.HubUnreachableError("injected: the Hub could not be used")

    monkeypatch.setattr(negotiate, "resolve", failing)
    with running(mirror_server_factory(store).url) as front:
        cache = tmp_path / "cache"
        aim_stock_client(monkeypatch, front.url, cache)
        weights = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
        front.corrupt(weights)
        assert hub.install()
        patch._recent.clear()
        try:

            class Handed:
                pass

            h = Handed()
            h.front, h.cache, h.src, h.weights, h.calls = front, cache, src, weights, calls  # type: ignore[attr-defined]
            yield h
        finally:
            hub.uninstall()


def _repo(cache: Path) -> Path:
    return cache / f"models--{REPO.replace('/', '--')}"


def test_a_corrupt_file_stock_fetched_after_a_hand_over_is_refused_and_deleted(
    handed: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import cmh.hub as hub
    from huggingface_hub import hf_hub_download

    front: HubLike = handed.front
    with (
        caplog.at_level(logging.WARNING, logger="cmh.hub"),
        pytest.raises(hub.IntegrityError, match=r"model\.safetensors failed its check"),
    ):
        hf_hub_download(REPO, "model.safetensors")
    assert any("handed to the stock client" in r.getMessage() for r in caplog.records)
    assert front.records(origin="cdn", method="GET")  # stock did fetch it
    repo = _repo(handed.cache)
    assert not (repo / "blobs" / handed.weights).exists()
    assert not list((repo / "snapshots").glob("*/model.safetensors"))
    # A small file stock fetched is returned as stock returns it.
    config = hf_hub_download(REPO, "config.json")
    assert Path(config).read_bytes() == (handed.src / "config.json").read_bytes()


def test_a_snapshot_stock_fetched_after_a_hand_over_is_checked_and_not_resolved_again(
    handed: Any,
) -> None:
    import cmh.hub as hub
    from huggingface_hub import snapshot_download

    with pytest.raises(hub.IntegrityError, match=r"model\.safetensors failed its check"):
        snapshot_download(REPO)
    # One resolve, the snapshot's: the per-file calls stock makes inside it went to stock.
    assert handed.calls == [REPO]
    repo = _repo(handed.cache)
    assert not (repo / "blobs" / handed.weights).exists()
    assert not list((repo / "snapshots").glob("*/model.safetensors"))
    assert list((repo / "snapshots").glob("*/config.json"))  # the good files stay


def test_a_good_snapshot_stock_fetched_after_a_hand_over_is_returned(
    handed: Any,
) -> None:
    from huggingface_hub import snapshot_download

    handed.front.clear_faults()
    folder = Path(snapshot_download(REPO))
    for name in ("config.json", "README.md", "model.safetensors"):
        assert (folder / name).read_bytes() == (handed.src / name).read_bytes()
    assert handed.calls == [REPO]
