"""Counts read as English: ``1 file``, ``1 new blob``, ``try 1 of 6``; a folder argument
ending in ``/`` is printed once with it; no "only to nobody"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_support import run_subprocess
from safetensors.numpy import save_file

import cmh


def _one_file_folder(folder: Path) -> Path:
    folder.mkdir()
    save_file({"w": np.ones((4, 4), np.float32)}, str(folder / "model.safetensors"))
    return folder


def test_plural_helper() -> None:
    assert [cmh.plural(n, "file") for n in (0, 1, 2, 1000)] == [
        "0 files", "1 file", "2 files", "1,000 files",
    ]  # fmt: skip
    assert cmh.plural(1, "try", "tries") == "1 try" and cmh.plural(3, "try", "tries") == "3 tries"


def test_mirror_add_and_ls_of_one_file_say_it_in_the_singular(tmp_path: Path) -> None:
    folder = _one_file_folder(tmp_path / "one")
    store = tmp_path / "store"
    added = run_subprocess(["mirror", "add", folder, "--store", store, "--repo", "org/one"])
    assert added.exit_code == 0, added.stderr
    said = added.stdout + added.stderr
    assert "1 file, " in said and "1 new blob (" in said, said
    assert "1 files" not in said and "1 new blobs" not in said
    listed = run_subprocess(["mirror", "ls", "--store", store])
    assert listed.exit_code == 0, listed.stderr
    assert "1 blob, " in listed.stdout and "1 file, " in listed.stdout, listed.stdout
    assert "1 blobs" not in listed.stdout and "1 files" not in listed.stdout


@pytest.mark.parametrize("argument", ["model", "model/"])
def test_a_folder_argument_is_printed_with_one_slash(tmp_path: Path, argument: str) -> None:
    _one_file_folder(tmp_path / "model")
    stamped = run_subprocess(["stamp", tmp_path / argument])
    assert stamped.exit_code == 0, stamped.stderr
    verified = run_subprocess(["verify", f"{tmp_path}/{argument}"])
    assert verified.exit_code == 0, verified.stderr
    assert f"{tmp_path}/model/ (1 file, no index)" in verified.stdout, verified.stdout
    assert "//" not in verified.stdout.replace("://", "")


def test_pull_through_without_tokens_says_nobody_reads_private_repos(
    tmp_path: Path, mirror: Any, mirror_server_factory: Any
) -> None:
    (tmp_path / "pull").mkdir()
    server = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", mirror.url))
    said = server.stderr_text()
    assert "private or gated are served to nobody (no --tokens file grants them)" in said, said
    assert "only to nobody" not in said


def test_a_resumed_pull_does_not_say_it_was_not_in_the_cache() -> None:
    from types import SimpleNamespace

    from cmh.cli._pull_command import outcome_words
    from cmh.hub.resolver import Action, State

    def result(action: Action) -> SimpleNamespace:
        file = SimpleNamespace(action=action)
        return SimpleNamespace(commit="c" * 40, previous_commit=None, requests=1,
                               state=State.MISSING, files=[file], bytes_transferred=5_000_000,
                               bytes_reused=28_000_000)  # fmt: skip

    resumed = outcome_words(result(Action.RESUMED))
    assert "not in the cache" not in resumed
    assert "resuming 1 file an earlier run had begun" in resumed
    assert "1 request," in resumed and "28.0 MB reused" in resumed
    assert "(it was not in the cache)" in outcome_words(result(Action.DOWNLOADED))


def test_mirror_add_warns_of_an_expired_stamp_and_ls_shows_stamp_states(tmp_path: Path) -> None:
    expired, fresh = _one_file_folder(tmp_path / "old"), _one_file_folder(tmp_path / "new")
    cmh.stamp(expired / "model.safetensors", ttl="1d", now=time.time() - 3 * 86400)
    cmh.stamp(fresh / "model.safetensors", ttl="30d")
    store = tmp_path / "store"
    added = run_subprocess(["mirror", "add", expired, "--store", store, "--repo", "org/old"])
    assert added.exit_code == 0, added.stderr
    assert "warning: model.safetensors: its stamp expired" in added.stderr, added.stderr
    quiet = run_subprocess(["mirror", "add", fresh, "--store", store, "--repo", "org/new"])
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr, quiet.stderr
    listed = run_subprocess(["mirror", "ls", "--store", store])
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert ", expired 20" in listed.stdout and ", stamped, expires 20" in listed.stdout
    assert "main" in lines, listed.stdout
    states = {
        r["repo_id"]: r["refs"][0]["stamp"]["state"]
        for r in run_subprocess(["mirror", "ls", "--store", store, "--json"]).json()["repos"]
    }
    assert states == {"org/old": "expired", "org/new": "stamped"}
