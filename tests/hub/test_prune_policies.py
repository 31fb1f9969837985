"""What each prune policy removes and keeps, on caches built with real files and links.

Each test builds the same mixed cache (stamped revisions with short and long
lifetimes, unreferenced revisions, orphans, partial downloads, half-broken
repos), prunes it for real, and checks the exact outcome on disk, with the
stock scanner and the stock client reading what is left.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from cmh.hub.cache import RepoLayout
from cmh.hub.prune._execute import execute_plan
from cmh.hub.prune._plan import (
    BEYOND_KEEP_LATEST,
    BROKEN,
    EXPIRED,
    OVER_SIZE,
    UNREFERENCED,
    UNUSED,
    PrunePolicy,
    plan_prune,
)
from cmh.hub.prune._scan import scan_cache
from prune_support import (
    DAY,
    NOW,
    CacheBuilder,
    fake_commit,
    stock_revisions,
    stock_warnings,
    tree_state,
    weights,
)

CONFIG = b'{"model_type": "toy"}\n'


@dataclass
class Built:
    root: Path
    b: CacheBuilder
    stamped_old: str  # expired an hour after it was stamped 2 days ago, unreferenced
    stamped_main: str  # expired too, but main points to it
    stamped_v2: str  # stamped for 30 days, ref v2
    plain_stale: str  # unstamped, unreferenced, last used 40 days ago
    plain_main: str  # unstamped, main, used yesterday
    broken: str  # a snapshot whose blob is missing
    shared_blob: str  # config.json, linked by every org/stamped revision


@pytest.fixture
def built(tmp_path: Path) -> Built:
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    expired = {
        "config.json": CONFIG,
        "model.safetensors": weights(1, ttl=3600, stamped_at=NOW - 2 * DAY),
    }
    old = b.revision("org/stamped", expired, ref=None, fetched=NOW - 5 * DAY)
    main_files = {
        "config.json": CONFIG,
        "model.safetensors": weights(2, ttl=3600, stamped_at=NOW - 2 * DAY),
    }
    main = b.revision("org/stamped", main_files, ref="main", fetched=NOW - 3 * DAY)
    v2_files = {"config.json": CONFIG, "model.safetensors": weights(3, ttl=30 * DAY)}
    v2 = b.revision("org/stamped", v2_files, ref="v2", fetched=NOW - 2 * DAY)
    shared = hashlib.sha1(b"blob %d\0" % len(CONFIG) + CONFIG).hexdigest()

    stale = b.revision(
        "org/plain",
        {"weights.bin": b"s" * 3000},
        ref=None,
        fetched=NOW - 50 * DAY,
        used=NOW - 40 * DAY,
    )
    plain_main = b.revision(
        "org/plain", {"weights.bin": b"m" * 2000}, fetched=NOW - 45 * DAY, used=NOW - DAY
    )

    # Leftovers: an old orphan, a fresh one (a download finishing), partial downloads.
    b.file("models--org--stamped/blobs/" + "a" * 64, b"old orphan", mtime=NOW - 2 * DAY)
    b.file("models--org--stamped/blobs/" + "b" * 64, b"fresh", mtime=NOW - 60)
    b.file(
        "models--org--stamped/blobs/" + "c" * 64 + ".0a1b2c.incomplete",
        b"x" * 50,
        mtime=NOW - 2 * DAY,
    )
    b.file("models--org--stamped/blobs/" + "d" * 64 + ".incomplete", b"y" * 70, mtime=NOW - 3600)
    gone = fake_commit("gone")
    b.file(f"models--org--stamped/.no_exist/{gone}/adapter_config.json")
    b.file(f"models--org--stamped/.no_exist/{main}/adapter_config.json")
    b.file(f"models--org--stamped/trees/{gone}.json", b"{}")
    b.file("models--org--stamped/refs/.main.cmh-tmp.999", b"half a ref")
    # A temporary link a crashed writer left in a kept snapshot (points at the shared blob).
    temp_link = b.layout("org/stamped").snapshot_dir(v2) / ".config.json.cmh-link.4242"
    os.symlink(f"../../blobs/{shared}", temp_link)
    os.utime(temp_link, (NOW - DAY, NOW - DAY), follow_symlinks=False)
    os.utime(temp_link.parent, (NOW - 2 * DAY, NOW - 2 * DAY))

    # Half-broken repos the stock scanner gives up on.
    b.ref("org/dangling", "main", fake_commit("never fetched"))
    b.file("models--org--dangling/blobs/" + "e" * 40 + ".ff.incomplete", b"z", mtime=NOW - 2 * DAY)
    broken = b.revision("org/broken", {"config.json": b"{}", "w.bin": b"w" * 500})
    layout = b.layout("org/broken")
    (layout.snapshots / broken / "w.bin").resolve().unlink()
    b.file(".locks/models--org--gone/" + "f" * 40 + ".lock", mtime=NOW - 2 * DAY)
    return Built(root, b, old, main, v2, stale, plain_main, broken, shared)


def prune(built: Built, **policy: object):
    plan = plan_prune(scan_cache(built.root), PrunePolicy(**policy), NOW)  # type: ignore[arg-type]
    report = execute_plan(plan, lock_timeout=1)
    assert not report.all_errors
    return plan, report


def reasons(plan) -> dict[str, tuple[str, ...]]:
    return {r.commit: r.reasons for repo in plan.repos for r in repo.revisions}


def item_paths(plan) -> set[str]:
    return {i.path for repo in plan.repos for i in repo.items} | {i.path for i in plan.root_items}


def test_housekeeping_alone_repairs_what_the_stock_scanner_rejects(built: Built) -> None:
    before = stock_warnings(built.root)
    assert len(before) == 3
    assert sum("models--org--dangling" in w for w in before) == 1  # no snapshots/ at all
    assert sum("Blob missing" in w for w in before) == 1  # org/broken
    assert sum("missing commit hashes" in w for w in before) == 1  # the half-written ref
    plan, report = prune(built)

    assert reasons(plan) == {built.broken: (BROKEN,)}
    repo = plan.repo("models--org--broken")
    assert repo is not None and repo.remove_repo  # its only revision was broken
    assert plan.repo("models--org--dangling").remove_repo  # type: ignore[union-attr]
    stamped = "models--org--stamped/"
    assert item_paths(plan) == {
        stamped + "blobs/" + "a" * 64,
        stamped + "blobs/" + "c" * 64 + ".0a1b2c.incomplete",
        stamped + f".no_exist/{fake_commit('gone')}",
        stamped + f"trees/{fake_commit('gone')}.json",
        stamped + "refs/.main.cmh-tmp.999",
        stamped + f"snapshots/{built.stamped_v2}/.config.json.cmh-link.4242",
        ".locks/models--org--gone",
    }
    # Kept: every revision, the fresh orphan and the fresh partial download, .no_exist of main.
    assert stock_warnings(built.root) == []
    assert stock_revisions(built.root) == {
        "org/stamped": {built.stamped_old, built.stamped_main, built.stamped_v2},
        "org/plain": {built.plain_stale, built.plain_main},
    }
    blobs = built.root / stamped / "blobs"
    assert (blobs / ("b" * 64)).exists() and (blobs / ("d" * 64 + ".incomplete")).exists()
    assert (built.root / stamped / ".no_exist" / built.stamped_main).is_dir()
    temp_link = built.root / stamped / "snapshots" / built.stamped_v2 / ".config.json.cmh-link.4242"
    assert not os.path.lexists(temp_link)
    for gone in ("gone", "broken", "dangling"):
        assert not (built.root / ".locks" / f"models--org--{gone}").exists()
    # old orphan 10, stale partial 50, tree 2, org/broken's other blob 2, org/dangling's partial 1
    assert report.freed == plan.freed == 65
    # A second run has nothing left to do.
    again = plan_prune(scan_cache(built.root), PrunePolicy(), NOW)
    assert again.empty


def test_expired_spares_referenced_revisions_unless_asked(built: Built) -> None:
    plan = plan_prune(scan_cache(built.root), PrunePolicy(expired=True), NOW)
    assert {c for c, r in reasons(plan).items() if EXPIRED in r} == {built.stamped_old}
    plan = plan_prune(scan_cache(built.root), PrunePolicy(expired=True, grace=3 * DAY), NOW)
    assert not [c for c, r in reasons(plan).items() if EXPIRED in r]

    plan, _ = prune(built, expired=True, include_referenced=True)
    assert {c for c, r in reasons(plan).items() if EXPIRED in r} == {
        built.stamped_old,
        built.stamped_main,
    }
    layout = built.b.layout("org/stamped")
    assert layout.refs_by_name() == {"v2": built.stamped_v2}  # main went with its revision
    assert layout.commits() == [built.stamped_v2]
    # The shared config blob stays (v2 links it); the expired weights' blobs are gone.
    assert (layout.blobs / built.shared_blob).exists()
    assert {p.name for p in layout.blobs.iterdir()} == {
        built.shared_blob,
        *(f.resolve().name for f in layout.snapshot_dir(built.stamped_v2).iterdir()),
        "b" * 64,
        "d" * 64 + ".incomplete",
    }
    assert not (layout.no_exist / built.stamped_main).exists()
    assert stock_warnings(built.root) == []


def test_unreferenced(built: Built) -> None:
    plan, _ = prune(built, unreferenced=True)
    assert {c for c, r in reasons(plan).items() if UNREFERENCED in r} == {
        built.stamped_old,
        built.plain_stale,
    }
    assert stock_revisions(built.root) == {
        "org/stamped": {built.stamped_main, built.stamped_v2},
        "org/plain": {built.plain_main},
    }


def test_keep_latest_per_repo(built: Built) -> None:
    plan, _ = prune(built, keep_latest=1)
    assert {c for c, r in reasons(plan).items() if BEYOND_KEEP_LATEST in r} == {
        built.stamped_old,
        built.stamped_main,
        built.plain_stale,
    }
    assert stock_revisions(built.root) == {
        "org/stamped": {built.stamped_v2},
        "org/plain": {built.plain_main},
    }


def test_older_than_uses_recorded_use_then_snapshot_time(built: Built) -> None:
    plan, _ = prune(built, older_than=30 * DAY)
    # plain_main was fetched 45 days ago but used yesterday: kept. plain_stale: used 40 days ago.
    assert {c for c, r in reasons(plan).items() if UNUSED in r} == {built.plain_stale}
    plan = plan_prune(scan_cache(built.root), PrunePolicy(older_than=4 * DAY), NOW)
    # No recorded use: the snapshot time decides (old one fetched 5 days ago).
    assert {c for c, r in reasons(plan).items() if UNUSED in r} == {built.stamped_old}


def test_max_size_evicts_least_recently_used_until_it_fits(built: Built) -> None:
    scan = scan_cache(built.root)
    total = plan_prune(scan, PrunePolicy(), NOW).size_after
    # Dropping the two least recently used revisions (plain_stale: 3000 bytes, then
    # stamped_old's weights) is enough to fit under total - 3100.
    plan, _ = prune(built, max_size=total - 3100)
    evicted = [c for c, r in reasons(plan).items() if OVER_SIZE in r]
    assert set(evicted) == {built.plain_stale, built.stamped_old}
    assert plan.size_after <= total - 3100
    after = plan_prune(scan_cache(built.root), PrunePolicy(), NOW)
    assert after.size_before == plan.size_after
    assert stock_warnings(built.root) == []


def test_stock_client_reads_what_is_left(built: Built) -> None:
    from huggingface_hub import hf_hub_download

    prune(built, expired=True, unreferenced=True)
    for revision, commit in (("main", built.stamped_main), ("v2", built.stamped_v2)):
        path = hf_hub_download(
            "org/stamped",
            "model.safetensors",
            revision=revision,
            cache_dir=built.root,
            local_files_only=True,
        )
        assert Path(path).parent.name == commit
        assert Path(path).read_bytes()[:8]  # a real file behind the link
    config = hf_hub_download(
        "org/plain", "weights.bin", cache_dir=built.root, local_files_only=True
    )
    assert Path(config).read_bytes() == b"m" * 2000


def test_dry_run_plan_changes_nothing(built: Built) -> None:
    before = tree_state(built.root)
    plan = plan_prune(
        scan_cache(built.root),
        PrunePolicy(expired=True, unreferenced=True, keep_latest=0, max_size=0),
        NOW,
    )
    assert plan.revision_count == 6
    assert tree_state(built.root) == before


def _unreadable_ref(root: Path, how: str, monkeypatch: pytest.MonkeyPatch, commit: str) -> None:
    """Make ``org/r``'s ``refs/main`` unreadable to the pruner: another user's private file
    (the pruner's open refused), or a link (never followed)."""
    ref = root / "models--org--r" / "refs" / "main"
    if how == "link":
        elsewhere = root.parent / "elsewhere-ref"
        elsewhere.write_text(commit)
        ref.unlink()
        ref.symlink_to(elsewhere)
        os.utime(ref, (NOW - 40 * DAY, NOW - 40 * DAY), follow_symlinks=False)
        return
    from cmh.hub.prune import _scan

    from cmh import open_regular as real_open

    def refuse(path: str, *args: object, **kwargs: object) -> object:
        if os.fspath(path) == str(ref):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_scan, "open_regular", refuse, raising=False)


@pytest.mark.parametrize("served", [False, True], ids=["cache", "store"])
@pytest.mark.parametrize("how", ["permission", "link"])
def test_a_ref_that_cannot_be_read_is_kept_with_every_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, served: bool
) -> None:
    """Was: a ref the pruner could not read (another user's 0600 file in a shared cache)
    was "invalid" and went by housekeeping alone; its revision was then unreferenced.
    Unreadable is not invalid: the ref stays, and so does every revision it may name."""
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    old = NOW - 40 * DAY
    main = b.revision("org/r", {"a.bin": b"a" * 10}, fetched=old, used=old)
    b.revision("org/r", {"b.bin": b"b" * 10}, ref=None, fetched=old, used=old)
    _unreadable_ref(root, how, monkeypatch, main)
    before = tree_state(root / "models--org--r")
    for policy in (
        PrunePolicy(),
        PrunePolicy(unreferenced=True),
        PrunePolicy(keep_latest=0, older_than=0.0, max_size=0),
        PrunePolicy(expired=True, include_referenced=True),
    ):
        plan = plan_prune(scan_cache(root, served=served), policy, NOW)
        assert plan.empty, plan
        assert any("refs/main cannot be read" in n for n in plan.notes)
        execute_plan(plan, lock_timeout=0)
    assert tree_state(root / "models--org--r") == before


@pytest.mark.parametrize("served", [False, True], ids=["cache", "store"])
@pytest.mark.parametrize("folder", ["snapshot", "blobs", "refs", "locks", "root-locks"])
def test_one_unreadable_folder_keeps_its_repo_whole_and_the_rest_is_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str, served: bool
) -> None:
    """Was: one folder the pruner could not read (another user's private snapshot in a
    shared cache) ended the whole prune with exit status 3 and no plan. Now its repo is
    left out whole, with a note, and every other repo is planned."""
    root = tmp_path / "cache"
    b = CacheBuilder(root)
    old = NOW - 40 * DAY
    stale = {}
    for repo in ("org/a", "org/b"):
        stale[repo] = b.revision(repo, {"x.bin": repo.encode() * 5}, ref=None, fetched=old)
        b.revision(repo, {"y.bin": repo.encode() * 7}, fetched=old)
        b.file(f".locks/models--{repo.replace('/', '--')}/cmh.repo.lock", mtime=old)
    b.file(".locks/models--org--gone/x.lock", mtime=old)
    a = root / "models--org--a"
    unreadable = {
        "snapshot": a / "snapshots" / stale["org/a"],
        "blobs": a / "blobs",
        "refs": a / "refs",
        "locks": root / ".locks" / "models--org--a",
        "root-locks": root / ".locks",
    }[folder]
    real_scandir = os.scandir

    def scandir(path: object = ".") -> object:
        if not isinstance(path, int) and os.fspath(path) == str(unreadable):  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", os.fspath(path))  # type: ignore[arg-type]
        return real_scandir(path)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "scandir", scandir)
    plan = plan_prune(scan_cache(root, served=served), PrunePolicy(unreferenced=True), NOW)
    relative = unreadable.relative_to(root).as_posix()
    assert any(f"{relative} cannot be read (Permission denied)" in n for n in plan.notes)
    planned = {r.repo_id: [rev.commit for rev in r.revisions] for r in plan.changes}
    if folder == "root-locks":
        assert planned == {repo: [commit] for repo, commit in stale.items()}
        assert not plan.root_items
    else:
        assert planned == {"org/b": [stale["org/b"]]}
        assert [i.path for i in plan.root_items] == [".locks/models--org--gone"]


@pytest.mark.parametrize("served", [False, True], ids=["cache", "store"])
@pytest.mark.parametrize("read_ago", [60.0, 11 * 60.0])
def test_a_store_keeps_a_revision_read_within_the_grace(
    tmp_path: Path, served: bool, read_ago: float
) -> None:
    """A served store's mirror sends bodies without a lock, recording each read: a
    revision read within the in-flight grace goes by no policy there (a cache's readers
    hold the revision lock instead). Judged on the plan's clock, and again by the
    executor for a read recorded after the plan."""
    from cmh.hub.cache import record_use

    root = tmp_path / "store"
    b = CacheBuilder(root)
    old = NOW - 40 * DAY
    stale = b.revision("org/r", {"a.bin": b"a" * 10}, ref=None, fetched=old, used=NOW - read_ago)
    b.revision("org/r", {"b.bin": b"b" * 10}, fetched=old)
    later = b.revision("org/r", {"c.bin": b"c" * 10}, ref=None, fetched=old, used=old)
    policy = PrunePolicy(unreferenced=True, keep_latest=0, older_than=0.0, max_size=0)
    plan = plan_prune(scan_cache(root, served=served), policy, NOW)
    [repo] = plan.changes
    kept = served and read_ago < policy.in_flight_grace
    assert repo.removes(stale) is not kept
    assert any(f"revision {stale[:12]} was read within" in n for n in plan.notes) is kept
    assert repo.removes(later)
    record_use(RepoLayout(root, "org/r", "model"), later, NOW)  # read after the plan
    report = execute_plan(plan, lock_timeout=0)
    [outcome] = report.repos
    assert (later in outcome.kept_in_use) is served
    assert (root / "models--org--r" / "snapshots" / later).exists() is served


def test_partials_beside_their_complete_blob_go_whatever_their_age(built: Built) -> None:
    """A partial download whose blob is present (another try completed it) holds nothing
    to resume: it goes at once, as ``blob-present``; one whose blob is absent waits for
    ``--stale-incomplete``."""
    from cmh.hub.prune._plan import BLOB_PRESENT, STALE

    layout = built.b.layout("org/stamped")
    present = next(f.resolve().name for f in layout.snapshot_dir(built.stamped_v2).iterdir())
    stamped = "models--org--stamped/"
    fresh = NOW - 60  # a minute old: well within --stale-incomplete
    beside = [
        f"blobs/{present}.incomplete",
        f"blobs/{present}.0a1b2c.incomplete",
        f".cmh/partial/{present}.chunks",
        f".cmh/partial/{present}.chunks.log",
    ]
    for name in (*beside, f".cmh/partial/{'d' * 64}.chunks"):
        built.b.file(stamped + name, b"p" * 10, mtime=fresh)
    plan, _ = prune(built)
    why = {i.path: i.reason for repo in plan.repos for i in repo.items}
    for name in beside:
        assert why[stamped + name] == BLOB_PRESENT, name
        assert not (built.root / stamped / name).exists()
    assert why[stamped + "blobs/" + "c" * 64 + ".0a1b2c.incomplete"] == STALE
    # No blob of its own: kept until stale, like the fresh `d` prefix beside it.
    assert (built.root / stamped / ".cmh/partial" / ("d" * 64 + ".chunks")).exists()
    assert (layout.blobs / present).exists()
    assert stock_warnings(built.root) == []
