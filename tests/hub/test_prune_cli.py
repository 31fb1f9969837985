"""``cmh prune`` on the command line: options, --dry-run, asking, --yes, --json."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import CMH, run_runner, run_subprocess
from prune_support import (
    DAY,
    NOW,
    CacheBuilder,
    stock_revisions,
    stock_warnings,
    tree_state,
    weights,
)


@pytest.fixture
def cache(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    commits = {
        "expired": b.revision(
            "org/a",
            {"model.safetensors": weights(1, ttl=60, stamped_at=NOW - DAY)},
            ref=None,
            fetched=NOW - 2 * DAY,
        ),
        "main": b.revision("org/a", {"model.safetensors": weights(2, ttl=30 * DAY)}),
    }
    b.file("models--org--a/blobs/" + "a" * 64, b"orphan", mtime=NOW - 2 * DAY)
    b.file("notes.txt", b"the user's own file")
    return root, commits


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "exactly one of --cache-dir"),
        (["--cache-dir", "X", "--store", "X"], "exactly one of --cache-dir"),
        (["--cache-dir", "X", "--grace", "1d"], "apply to --expired only"),
        (["--cache-dir", "X", "--at", "+30d"], "with --dry-run only"),
        (["--cache-dir", "X", "--older-than", "soon"], "invalid duration"),
        (["--cache-dir", "X", "--max-size", "lots"], "invalid size"),
        (["--cache-dir", "X", "--keep-latest", "-1"], "-1"),
        # Was: an OverflowError traceback (time.sleep), exit status 1.
        (["--cache-dir", "X", "--unreferenced", "--settle", "1e10", "-y"], "about 31 years"),
        (["--cache-dir", "X", "--lock-timeout", "1e10"], "about 31 years"),
        # Was: silently the current folder.
        (["--cache-dir", "", "--dry-run"], "an empty path names no folder"),
        (["--store", "", "--dry-run"], "an empty path names no store"),
    ],
)
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    args = [str(tmp_path) if a == "X" else a for a in args]
    run = run_runner(["prune", *args])
    assert run.exit_code == 2
    assert message in run.stderr


def test_missing_directory_is_unreadable(tmp_path: Path) -> None:
    run = run_runner(["prune", "--store", tmp_path / "nope", "--dry-run"])
    assert run.exit_code == 3 and "no such directory" in run.stderr
    run = run_runner(["prune", "--cache-dir", tmp_path / "nope", "--dry-run", "--json"])
    assert run.exit_code == 3 and run.json()["error"] == f"{tmp_path / 'nope'}: no such directory"
    assert run.json()["ok"] is False and run.json()["command"] == "prune"


def test_dry_run_reports_and_changes_nothing(cache: tuple[Path, dict[str, str]]) -> None:
    root, commits = cache
    before = tree_state(root)
    run = run_runner(["prune", "--cache-dir", root, "--expired", "--dry-run"])
    assert run.exit_code == 0, run.stderr
    assert f"revision {commits['expired'][:12]}: its stamped files expired" in run.stdout
    assert (
        "blob x1 (orphan: no revision links to it), 6 B" in run.stdout
        and "Left alone (not cache entries): notes.txt" in run.stdout
    )
    doc = run_runner(["prune", "--cache-dir", root, "--expired", "--dry-run", "--json"]).json()
    assert doc["command"] == "prune" and doc["dry_run"] is True and doc["kind"] == "cache"
    [repo] = doc["repos"]
    assert [r["commit"] for r in repo["revisions"]] == [commits["expired"]]
    assert repo["revisions"][0]["reasons"] == ["expired"]
    assert doc["freed"] == repo["freed"] > 0
    # Judged a year from now, the main revision is expired too (but a ref names it).
    later = run_runner(
        ["prune", "--cache-dir", root, "--expired", "--include-referenced", "--dry-run",
         "--at", "+365d", "--json"]
    ).json()  # fmt: skip
    assert {r["commit"] for r in later["repos"][0]["revisions"]} == set(commits.values())
    assert tree_state(root) == before


def test_refuses_without_yes_when_stdin_is_not_a_terminal(
    cache: tuple[Path, dict[str, str]],
) -> None:
    root, _ = cache
    before = tree_state(root)
    run = run_subprocess(["prune", "--cache-dir", root, "--expired"])
    assert run.exit_code == 2 and "refusing to delete without --yes" in run.stderr
    assert tree_state(root) == before


def test_yes_deletes_and_reports_json(cache: tuple[Path, dict[str, str]]) -> None:
    root, commits = cache
    warnings_before = stock_warnings(root)
    assert len(warnings_before) == 1  # notes.txt is not a repo: left alone, not new
    run = run_subprocess(["prune", "--cache-dir", root, "--expired", "--yes", "--json"])
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert doc["dry_run"] is False and doc["ok"] is True and doc["errors"] == []
    assert [r["commit"] for r in doc["repos"][0]["revisions"]] == [commits["expired"]]
    assert doc["freed"] == doc["planned_freed"] > 0
    assert stock_revisions(root) == {"org/a": {commits["main"]}}
    assert stock_warnings(root) == warnings_before
    assert (root / "notes.txt").read_bytes() == b"the user's own file"
    again = run_subprocess(["prune", "--cache-dir", root, "--expired", "--yes"])
    assert (
        again.exit_code == 0
        and "Nothing to remove from cache" in again.stdout
        and "Would remove" not in again.stdout
    )


def _answer_on_a_terminal(args: list[str], answer: bytes) -> tuple[int, str]:
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [str(CMH), *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + 60
        while b"Delete these?" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                seen += os.read(master, 65536)
        os.write(master, answer + b"\n")
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
        return proc.wait(timeout=60), seen.decode(errors="replace")
    finally:
        os.close(master)


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_asks_on_a_terminal(cache: tuple[Path, dict[str, str]]) -> None:
    root, commits = cache
    before = tree_state(root)
    status, shown = _answer_on_a_terminal(["prune", "--cache-dir", str(root), "--expired"], b"n")
    assert status == 1 and "nothing deleted" in shown and "error:" not in shown
    assert f"revision {commits['expired'][:12]}: its stamped files expired" in shown
    assert tree_state(root) == before
    args = ["prune", "--cache-dir", str(root), "--expired", "--json"]
    status, shown = _answer_on_a_terminal(args, b"n")  # declined: a document all the same
    assert status == 1 and '"error": "declined: nothing deleted"' in shown, shown
    assert '"exit_status": 1' in shown and tree_state(root) == before
    status, shown = _answer_on_a_terminal(["prune", "--cache-dir", str(root), "--expired"], b"y")
    assert status == 0 and "Removed from cache" in shown
    assert stock_revisions(root) == {"org/a": {commits["main"]}}


def test_the_plan_declares_every_reason_it_gives() -> None:
    """Every reason constant of the plan module is in ``REVISION_REASONS`` or
    ``ITEM_REASONS`` (which ``tests/test_cli_prune_words.py`` checks have words)."""
    import ast
    import inspect

    from cmh.hub.prune import ITEM_REASONS, REVISION_REASONS, _plan

    # Every string constant the plan module declares, other than an item's kind.
    declared = {
        node.value.value
        for node in ast.parse(inspect.getsource(_plan)).body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and not any(isinstance(t, ast.Name) and t.id.startswith("KIND_") for t in node.targets)
    }
    assert declared == set(REVISION_REASONS) | set(ITEM_REASONS)


@pytest.mark.parametrize(
    ("policy", "words", "name"),
    [
        (["--older-than", "1d"], "not used for longer than --older-than", "unused"),
        (["--max-size", "1"], "least recently used, over --max-size", "over-size"),
    ],
)
def test_size_and_age_reasons_are_said_in_words(
    cache: tuple[Path, dict[str, str]], policy: list[str], words: str, name: str
) -> None:
    root, commits = cache
    run = run_runner(["prune", "--cache-dir", root, *policy, "--dry-run"])
    assert run.exit_code == 0, run.stderr
    assert f"revision {commits['expired'][:12]}: {words}" in run.stdout
    assert f": {name}" not in run.stdout and f"{name};" not in run.stdout


def test_json_dry_run_and_nothing_to_do_carry_the_exit_status(
    cache: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, _ = cache
    dry = run_runner(["prune", "--cache-dir", root, "--expired", "--dry-run", "--json"]).json()
    assert dry["exit_status"] == 0 and dry["ok"] is True
    (tmp_path / "empty").mkdir()
    nothing = run_runner(["prune", "--cache-dir", tmp_path / "empty", "--yes", "--json"]).json()
    assert nothing["exit_status"] == 0 and nothing["repos"] == []


def test_counts_say_one_revision_and_two_revisions(cache: tuple[Path, dict[str, str]]) -> None:
    root, _ = cache
    one = run_runner(["prune", "--cache-dir", root, "--expired", "--dry-run"])
    assert "Total: 1 revision, " in one.stdout
    two = run_runner(["prune", "--cache-dir", root, "--max-size", "0", "--dry-run"])
    assert "Total: 2 revisions, " in two.stdout and "(s)" not in two.stdout


def test_a_stores_quarantine_is_not_listed_as_left_alone(tmp_path: Path) -> None:
    from cmh.hub.mirror import add_folder, scrub_store

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello\n")
    store = tmp_path / "store"
    add_folder(store, src, "org/x")
    [blob] = (store / "models--org--x" / "blobs").iterdir()
    blob.write_text("rot\n")
    scrub_store(store)
    assert (store / ".quarantine").is_dir()
    run = run_runner(["prune", "--store", store, "--dry-run"])
    assert run.exit_code == 0, run.stderr
    assert "Left alone" not in run.stdout


@pytest.mark.parametrize("option", ["--cache-dir", "--store"])
def test_a_repo_folder_holding_what_is_not_cache_content_is_never_removed(
    tmp_path: Path, option: str
) -> None:
    """Was: a folder named like a repo holding only a user's files (notes, a fine-tune)
    was "a repo with nothing left in it" and went whole, files the scan never looked at
    included ("0 B freed")."""
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    b.file("models--org--x/NOTES.txt", b"notes", mtime=NOW - 2 * DAY)
    b.file("models--org--x/my-finetune/model.safetensors", b"precious", mtime=NOW - 2 * DAY)
    b.revision("org/y", {"a.bin": b"a" * 10}, ref=None, fetched=NOW - 2 * DAY)
    b.file("models--org--y/keep.txt", b"mine", mtime=NOW - 2 * DAY)
    b.file("models--org--y/blobs/a-folder/x", b"?", mtime=NOW - 2 * DAY)
    os.utime(root / "models--org--x", (NOW - 2 * DAY, NOW - 2 * DAY))
    run = run_runner(["prune", option, root, "--unreferenced", "--yes"])
    assert run.exit_code == 0, run.stderr
    assert "whole repo" not in run.stdout
    assert "org/x: NOTES.txt, my-finetune/: not cache content, left alone" in run.stdout
    assert "org/y: keep.txt, blobs/a-folder/: not cache content" in run.stdout
    assert (root / "models--org--x" / "my-finetune" / "model.safetensors").read_bytes()
    assert (root / "models--org--y" / "keep.txt").exists()
    assert (root / "models--org--y" / "blobs" / "a-folder" / "x").exists()
    assert not os.listdir(root / "models--org--y" / "snapshots")  # the revision went


@pytest.mark.parametrize("option", ["--cache-dir", "--store"])
def test_a_folder_that_is_no_cache_is_refused(tmp_path: Path, option: str) -> None:
    """Was: ``--cache-dir /`` or ``$HOME`` was pruned (everything "left alone", exit 0).
    A folder with entries of its own and no repo folder, ``.locks/`` or ``CACHEDIR.TAG``
    is refused as a usage error; an empty folder is an empty cache."""
    home = tmp_path / "home"
    (home / "hub" / "models--org--a").mkdir(parents=True)
    (home / "token").write_text("x")
    run = run_runner(["prune", option, home, "--dry-run", "--json"])
    assert run.exit_code == 2, run.stdout
    assert "is not a Hugging Face cache or mirror store" in run.stderr
    assert run.stderr.strip().endswith(f"did you mean {home / 'hub'}?")
    (home / "token").unlink()
    (home / "hub" / "models--org--a").rmdir()
    run = run_runner(["prune", option, home / "hub", "--dry-run"])
    assert run.exit_code == 0, run.stderr
    # transformers 4.x writes hub/version.txt on import: a cache with nothing else yet
    (home / "hub" / "version.txt").write_text("1")
    (home / "token").write_text("x")
    run = run_runner(["prune", option, home / "hub", "--dry-run"])
    assert run.exit_code == 0, run.stderr
    run = run_runner(["prune", option, home, "--dry-run"])
    assert run.exit_code == 2 and run.stderr.strip().endswith(f"did you mean {home / 'hub'}?")


def test_help_says_every_exit_status() -> None:
    """Was: "1 refused or declined", but a refusal without --yes exits 2, and 3 (the
    folder cannot be read) was not said at all."""
    run = run_runner(["prune", "--help"])
    text = " ".join(run.stdout.split())
    assert "1 declined or a deletion failed" in text
    assert "2 usage error (also: refusing to delete without --yes" in text
    assert "3 the cache or store cannot be read" in text
