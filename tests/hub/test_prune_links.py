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


# -- links to blobs, however the path to them is spelled ---------------------------------

KINDS = ("--cache-dir", "--store")


def _prune(*args: str) -> str:
    result = CliRunner().invoke(cli, ["prune", *args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("option", KINDS)
def test_a_root_spelled_with_dot_dot_keeps_every_linked_blob(tmp_path: Path, option: str) -> None:
    """Was: ``--cache-dir X/../X`` (or ``--store``) compared each link's target with a path
    spelled another way: every blob older than 10 minutes went as an orphan, under a
    snapshot a ref names."""
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    b.revision(REPO, {"a.bin": b"a" * 100, "b.bin": b"b" * 50}, fetched=NOW - 40 * DAY)
    before = tree_state(root)
    out = _prune(option, f"{root}/../cache", "--yes")
    assert tree_state(root) == before, out


@pytest.mark.parametrize("option", KINDS)
@pytest.mark.parametrize(("links_via", "prune_via"), [("real", "link"), ("link", "real")])
def test_absolute_links_keep_their_blobs_through_a_linked_root(
    tmp_path: Path, option: str, links_via: str, prune_via: str
) -> None:
    """Was: absolute snapshot links (the stock client reads them) spelled through one path
    to the root while prune was given another (the root reached through a link) counted
    none of their blobs as linked: they went as orphans."""
    real, link = tmp_path / "real", tmp_path / "hub"
    b = CacheBuilder(real)
    commit = b.revision(REPO, {"a.bin": b"a" * 100}, fetched=NOW - 40 * DAY)
    link.symlink_to(real, target_is_directory=True)
    spelled = {"real": real, "link": link}
    snap = real / FOLDER / "snapshots" / commit / "a.bin"
    target = spelled[links_via] / FOLDER / "blobs" / os.path.basename(os.readlink(snap))
    snap.unlink()
    snap.symlink_to(target)
    before = tree_state(real)
    _prune(option, str(spelled[prune_via]), "--yes")
    assert tree_state(real) == before
    assert snap.read_bytes() == b"a" * 100


@pytest.mark.parametrize("option", KINDS)
def test_a_blob_another_repo_links_to_is_kept(tmp_path: Path, option: str) -> None:
    """Was: repo B's snapshot (a ref names it) linking to a blob of repo A (a dedupe the
    stock client reads) lost it when A's only revision linking it went."""
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    old = NOW - 40 * DAY
    b.revision("org/a", {"w.bin": b"shared" * 100}, ref=None, fetched=old)
    b.revision("org/a", {"other.bin": b"o" * 10}, fetched=old)
    commit = b.revision("org/b", {"w.bin": b"shared" * 100}, fetched=old)
    b_snap = root / "models--org--b" / "snapshots" / commit / "w.bin"
    name = os.path.basename(os.readlink(b_snap))
    b_snap.unlink()
    b_snap.symlink_to(f"../../../models--org--a/blobs/{name}")
    shutil.rmtree(root / "models--org--b" / "blobs")
    (root / "models--org--b" / "blobs").mkdir()
    out = _prune(option, str(root), "--unreferenced", "--yes")
    assert "1 revision" in out
    assert (root / "models--org--a" / "blobs" / name).exists()
    assert b_snap.read_bytes() == b"shared" * 100
    _prune(option, str(root), "--yes")  # an orphan in A, but not for B
    assert b_snap.read_bytes() == b"shared" * 100
    plan = plan_prune(scan_cache(root), PrunePolicy(unreferenced=True), NOW)
    assert plan.empty


def _dedupe(root: Path, commit: str, name: str) -> Path:
    """Point ``w.bin`` of org/b's snapshot ``commit`` at org/a's blob ``name`` (a dedupe
    the stock client reads); returns the link."""
    link = root / "models--org--b" / "snapshots" / commit / "w.bin"
    link.unlink()
    link.symlink_to(f"../../../models--org--a/blobs/{name}")
    return link


@pytest.mark.parametrize(
    ("whole", "when"),
    [(False, "before the executor"), (False, "at its first change"), (True, "before the executor")],
)
def test_a_link_another_repo_made_after_the_scan_keeps_its_blob(
    tmp_path: Path, whole: bool, when: str
) -> None:
    """Was: the executor scanned the pruned repo again under its lock but kept only the
    blobs the first scan had seen other repos link to, so a link made since (a dedupe
    pointing org/b's snapshot at org/a's blob) lost its blob. The links are now read
    again just before blobs are deleted, and before a repo goes whole."""
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    old = NOW - 40 * DAY
    b.revision("org/a", {"w.bin": b"shared" * 100}, ref=None, fetched=old)
    if not whole:
        b.revision("org/a", {"other.bin": b"o" * 10}, fetched=old)
    commit = b.revision("org/b", {"w.bin": b"shared" * 100}, fetched=old)
    name = os.path.basename(os.readlink(root / "models--org--b" / "snapshots" / commit / "w.bin"))
    blob = root / "models--org--a" / "blobs" / name
    plan = plan_prune(scan_cache(root), PrunePolicy(unreferenced=True), NOW)
    (repo,) = plan.changes
    assert repo.repo_id == "org/a" and len(repo.revisions) == 1 and repo.remove_repo == whole
    assert whole or f"models--org--a/blobs/{name}" in {i.path for i in repo.items}
    linked: list[Path] = []

    def link(action: str, path: Path) -> None:
        if not linked:  # org/a's lock and scan are taken: this is the deletion under way
            linked.append(_dedupe(root, commit, name))

    if when == "before the executor":
        link("", root)
    report = execute_plan(plan, lock_timeout=0, on_change=link)
    assert not report.all_errors
    assert [len(r.revisions) for r in report.repos] == [1]
    assert not any(r.removed_repo for r in report.repos)
    assert blob.is_file()
    assert linked[0].read_bytes() == b"shared" * 100


# -- what is not a regular file is never opened to block ---------------------------------


def _scan_in_thread(root: Path, **options: bool) -> object:
    import threading

    out: list[object] = []
    worker = threading.Thread(
        target=lambda: out.append(scan_cache(root, read_expiry=True, **options)), daemon=True
    )
    worker.start()
    worker.join(60)  # a guard, not a bound: the old code never returned
    assert not worker.is_alive(), "the scan blocks opening a FIFO"
    return out[0]


@pytest.mark.parametrize("where", ["snapshot", "link-out", "blob", "commit-record"])
def test_a_fifo_never_blocks_the_scan(tmp_path: Path, where: str) -> None:
    """Was: a ``*.safetensors`` entry that was (or linked to) a FIFO made ``--expired``, even
    ``--dry-run``, block for ever reading its header; so did a FIFO among the records."""
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    commit = b.revision(REPO, {"config.json": b"{}"}, fetched=NOW - 40 * DAY)
    snap = root / FOLDER / "snapshots" / commit
    if where == "snapshot":
        os.mkfifo(snap / "model.safetensors")
    elif where == "link-out":
        os.mkfifo(tmp_path / "pipe")
        (snap / "model.safetensors").symlink_to(tmp_path / "pipe")
    elif where == "blob":
        os.mkfifo(root / FOLDER / "blobs" / ("f" * 64))
        (snap / "model.safetensors").symlink_to(f"../../blobs/{'f' * 64}")
    else:
        (root / FOLDER / ".cmh" / "commits").mkdir(parents=True)
        os.mkfifo(root / FOLDER / ".cmh" / "commits" / f"{commit}.json")
    scan = _scan_in_thread(root, read_commit_times=True)
    plan = plan_prune(scan, PrunePolicy(expired=True, include_referenced=True), NOW)  # type: ignore[arg-type]
    assert plan.revision_count == 0


def test_a_stamped_file_out_of_the_cache_is_not_read(tmp_path: Path) -> None:
    """A snapshot link out of the cache is not followed to read a header: such a file
    never expires here (only blobs, which may link into a shared store, are read)."""
    from prune_support import weights

    root = tmp_path / "cache"
    b = CacheBuilder(root)
    commit = b.revision(REPO, {"config.json": b"{}"}, fetched=NOW - 40 * DAY)
    outside = tmp_path / "expired.safetensors"
    outside.write_bytes(weights(1, ttl=60, stamped_at=NOW - 2 * DAY))
    (root / FOLDER / "snapshots" / commit / "model.safetensors").symlink_to(outside)
    scan = scan_cache(root, read_expiry=True)
    assert scan.repos[0].revisions[0].expires_at is None
