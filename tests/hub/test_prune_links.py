"""Prune never follows a link out of the store.

A folder prune walks (a repo's ``blobs/``, ``snapshots/``, ``.no_exist/``, ``trees/``,
``.cmh/``, its lock folder, or the root's ``.locks/``) that is a symbolic link to a
folder elsewhere leaves that repo alone, with a note, under every policy; and a folder
swapped for a link after the executor's scan is still not followed: each removal is made
relative to folders opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.prune import PrunePolicy, execute_plan, plan_prune, scan_cache
from prune_support import DAY, NOW, CacheBuilder, fake_commit, tree_state

REPO = "org/linked"
FOLDER = "models--org--linked"
MODES = {
    "housekeeping": PrunePolicy(),
    "unreferenced": PrunePolicy(unreferenced=True),
    "keep-latest": PrunePolicy(keep_latest=0),
    "older-than": PrunePolicy(older_than=0.0),
    "max-size": PrunePolicy(max_size=0),
    "expired": PrunePolicy(expired=True, include_referenced=True),
}
LINKED = ("blobs", "snapshots", ".no_exist", "trees", ".cmh", f"../.locks/{FOLDER}", "../.locks")


def build(root: Path) -> CacheBuilder:
    """A repo with an old unreferenced revision, an orphan blob, old leftovers of a commit
    that is gone, and the lock files of what is gone: all of it goes under some policy."""
    b = CacheBuilder(root)
    old = NOW - 40 * DAY
    b.revision(REPO, {"a.bin": b"a" * 1000}, ref=None, fetched=old, used=old)
    b.revision(REPO, {"b.bin": b"b" * 1000}, ref="main", fetched=old, used=old)
    b.blob(REPO, "orphan.bin", b"o" * 500, mtime=old)
    gone = fake_commit("gone")
    for rel in (f".no_exist/{gone}/x.bin", f"trees/{gone}.json", f".cmh/used/{gone}"):
        b.file(f"{FOLDER}/{rel}", b"{}", mtime=old)
    b.file(f".locks/{FOLDER}/cmh.rev.{gone}.lock", mtime=old)
    b.file(".locks/models--org--gone/x.lock", mtime=old)  # the lock folder of a repo gone
    return b


def link_out(root: Path, rel: str, outside: Path) -> None:
    """Move the folder ``{repo}/{rel}`` to ``outside`` and leave a link to it in its place."""
    place = (root / FOLDER / rel).resolve()
    shutil.move(place, outside)
    place.symlink_to(outside, target_is_directory=True)
    old = NOW - 40 * DAY
    for dirpath, _, files in os.walk(outside):
        for name in [*files, "."]:
            os.utime(Path(dirpath, name), (old, old), follow_symlinks=False)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("rel", LINKED)
def test_a_linked_folder_is_never_followed(tmp_path: Path, rel: str, mode: str) -> None:
    root, outside = tmp_path / "cache", tmp_path / "elsewhere"
    build(root)
    link_out(root, rel, outside)
    before = tree_state(outside)
    assert before  # old files a prune following the link would delete
    plan = plan_prune(scan_cache(root, read_expiry=True), MODES[mode], NOW)
    report = execute_plan(plan, lock_timeout=0)
    assert tree_state(outside) == before
    assert any("never followed" in note for note in plan.notes)
    assert not report.all_errors


def test_the_cli_says_which_link_it_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    build(root)
    link_out(root, "blobs", tmp_path / "elsewhere")
    result = CliRunner().invoke(cli, ["prune", "--cache-dir", str(root), "--unreferenced", "-y"])
    assert result.exit_code == 0, result.output
    assert f"Note: {REPO}: blobs/ is a link to another folder, never followed" in result.output
    assert len(os.listdir(tmp_path / "elsewhere")) == 3


def test_a_folder_swapped_for_a_link_after_the_scan_is_not_followed(tmp_path: Path) -> None:
    """The executor scans again under the repo lock; a folder swapped for a link after
    that (here: at its first removal of a blob) makes that removal fail, reported."""
    root, outside = tmp_path / "cache", tmp_path / "elsewhere"
    build(root)
    plan = plan_prune(scan_cache(root), PrunePolicy(unreferenced=True), NOW)
    blobs = root / FOLDER / "blobs"
    swapped: list[str] = []

    def swap(action: str, path: Path) -> None:
        if action.startswith("unlink-blob") and not swapped:
            shutil.copytree(blobs, outside)
            shutil.rmtree(blobs)
            blobs.symlink_to(outside, target_is_directory=True)
            swapped.append(path.name)

    before = tree_state(tmp_path / "cache" / FOLDER / "snapshots")
    report = execute_plan(plan, lock_timeout=0, on_change=swap)
    assert swapped
    assert (outside / swapped[0]).exists()
    assert sorted(os.listdir(outside)) == sorted(os.listdir(blobs))
    assert report.all_errors and all("a link is never followed" in e for e in report.all_errors)
    assert tree_state(tmp_path / "cache" / FOLDER / "snapshots") != before  # the rest went
