"""The resolver's own listings (``.cmh/trees/{commit}.json``, written after a one-file
download where stock writes no ``trees/``) belong to their commit (issue 36): ``cmh
prune`` removes one with its revision, or once its commit is gone, never leaves it
behind nor reports it as something else; the ``.no_exist`` housekeeping after a resolve
removes a dead commit's listing with its ``.no_exist`` folder."""

from __future__ import annotations

from pathlib import Path

from cli_support import run_runner
from cmh.hub.cache import clean_no_exist
from cmh.hub.prune._execute import execute_plan
from cmh.hub.prune._plan import UNREFERENCED, PrunePolicy, plan_prune
from cmh.hub.prune._scan import scan_cache
from prune_support import DAY, NOW, CacheBuilder, fake_commit

REPO = "org/peft"
FOLDER = "models--org--peft"
LISTING = b'{"format_version": 1, "files": {}}\n'


def _build(root: Path) -> tuple[CacheBuilder, str, str, str]:
    """``main`` (kept) and an old unreferenced revision, each with its own listing, and
    the listing of a commit with no snapshot and no ref (a day old)."""
    b = CacheBuilder(root)
    old = b.revision(REPO, {"adapter_config.json": b"{}"}, ref=None, fetched=NOW - 5 * DAY)
    main = b.revision(REPO, {"adapter_config.json": b'{"r": 8}'}, fetched=NOW - DAY)
    gone = fake_commit("gone")
    for commit in (old, main, gone):
        b.file(f"{FOLDER}/.cmh/trees/{commit}.json", LISTING, mtime=NOW - DAY)
    return b, old, main, gone


def _prune(root: Path, **policy: object):  # type: ignore[no-untyped-def]
    plan = plan_prune(scan_cache(root), PrunePolicy(**policy), NOW)  # type: ignore[arg-type]
    report = execute_plan(plan, lock_timeout=1)
    assert not report.all_errors
    return plan, report


def test_a_listing_goes_with_its_revision_and_a_dead_commits_listing_goes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cache"
    _, old, main, gone = _build(root)
    plan, _ = _prune(root, unreferenced=True)
    assert {
        r.commit for repo in plan.repos for r in repo.revisions if UNREFERENCED in r.reasons
    } == {old}
    own = root / FOLDER / ".cmh" / "trees"
    assert sorted(p.name for p in own.iterdir()) == [f"{main}.json"]
    paths = {i.path for repo in plan.repos for i in repo.items}
    assert {f"{FOLDER}/.cmh/trees/{old}.json", f"{FOLDER}/.cmh/trees/{gone}.json"} <= paths
    assert plan_prune(scan_cache(root), PrunePolicy(unreferenced=True), NOW).empty


def test_a_repo_whose_revisions_all_go_goes_whole_with_its_listings(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    old = b.revision(REPO, {"adapter_config.json": b"{}"}, ref=None, fetched=NOW - 5 * DAY)
    b.file(f"{FOLDER}/.cmh/trees/{old}.json", LISTING, mtime=NOW - 5 * DAY)
    plan, _ = _prune(root, unreferenced=True)
    repo = plan.repo(FOLDER)
    assert repo is not None and repo.remove_repo
    assert not (root / FOLDER).exists()


def test_the_cli_lists_the_listing_and_reports_no_stray(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    _, old, _, _ = _build(root)
    run = run_runner(["prune", "--cache-dir", root, "--unreferenced", "--dry-run", "--json"])
    assert run.exit_code == 0, run.stderr
    [repo] = run.json()["repos"]
    assert f"{FOLDER}/.cmh/trees/{old}.json" in {i["path"] for i in repo["items"]}
    text = run_runner(["prune", "--cache-dir", root, "--unreferenced", "--dry-run"])
    assert "not cache entries" not in text.stdout, text.stdout


def test_no_exist_housekeeping_removes_a_dead_commits_listing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    b, old, main, gone = _build(root)
    b.file(f"{FOLDER}/.no_exist/{gone}/adapter_model.bin")
    report = clean_no_exist(b.layout(REPO), main, ["adapter_config.json"])
    own = root / FOLDER / ".cmh" / "trees"
    assert sorted(p.name for p in own.iterdir()) == sorted([f"{old}.json", f"{main}.json"])
    assert str(own / f"{gone}.json") in report.removed
    assert not (root / FOLDER / ".no_exist" / gone).exists()
