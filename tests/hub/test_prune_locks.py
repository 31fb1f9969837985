"""Lock files may be deleted while held (the pruner cleans ``.locks/``): a process that
was waiting on the deleted file must then lock the new one, never run beside its holder."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

from cmh.hub.cache import LockBusy, RepoLayout, flock, snapshot_in_use
from deadline_support import TEST_DEADLINE


def _wait_for_a_blocked_flock(path: Path, timeout: float = TEST_DEADLINE) -> None:
    """Return once the kernel lists a waiter blocked on ``path``'s flock (/proc/locks ``->``)."""
    inode = f":{path.stat().st_ino} "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in Path("/proc/locks").read_text().splitlines():
            if "->" in line and "FLOCK" in line and inode in line:
                return
        time.sleep(0.01)
    raise AssertionError("no thread blocked on the lock in time")


def test_waiter_on_a_deleted_lock_file_locks_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / ".locks" / "x.lock"
    events: list[str] = []
    first_holds = threading.Event()
    third_holds = threading.Event()
    release_third = threading.Event()

    def second() -> None:
        first_holds.wait()
        with flock(path):  # opens the old file, waits on it
            events.append("second in")
        events.append("second out")

    def third() -> None:
        with flock(path):  # the new file, made after the first holder deleted the old one
            third_holds.set()
            events.append("third in")
            release_third.wait()
            events.append("third out")

    waiter = threading.Thread(target=second)
    with flock(path):
        first_holds.set()
        waiter.start()
        _wait_for_a_blocked_flock(path)  # the second is now blocked on the old file
        path.unlink()
        newcomer = threading.Thread(target=third)
        newcomer.start()
        assert third_holds.wait(TEST_DEADLINE)
    _wait_for_a_blocked_flock(path)  # the second woke on the old file, now waits on the new one
    assert "second in" not in events
    release_third.set()
    newcomer.join(5)
    waiter.join(5)
    assert events == ["third in", "third out", "second in", "second out"]


def test_snapshot_in_use_blocks_a_pruner_and_reports_a_pruned_snapshot(tmp_path: Path) -> None:
    layout = RepoLayout(tmp_path, "org/x")
    commit = "c" * 40
    layout.snapshot_dir(commit).mkdir(parents=True)
    with snapshot_in_use(layout, commit) as folder:
        assert folder == layout.snapshot_dir(commit)
        try:
            with flock(layout.locks / f"cmh.rev.{commit}.lock", timeout=0):
                raise AssertionError("the pruner got a revision a reader holds")
        except LockBusy:
            pass
    layout.snapshot_dir(commit).rmdir()
    try:
        with snapshot_in_use(layout, commit):
            raise AssertionError("a pruned snapshot was handed out")
    except FileNotFoundError:
        pass


def test_lock_files_are_group_writable_like_the_stock_clients(tmp_path):
    path = tmp_path / ".locks" / "models--org--m" / "x.lock"
    old = os.umask(0o022)  # a umask that would narrow a plain create to 0644
    try:
        with flock(path):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o664


def test_a_lock_folder_that_cannot_be_made_fails_at_once() -> None:
    """Was: ``flock`` made the folder again forever (``cmh pull --cache-dir /proc/x`` spun at
    full CPU). A folder that vanishes between looks is made again; one that cannot be made
    at all raises after a few tries."""
    raised: list[BaseException] = []

    def lock() -> None:
        try:
            with flock(Path("/proc/cmh-no-such-folder/x.lock")):
                pass
        except BaseException as exc:  # handed to the test's thread
            raised.append(exc)

    attempt = threading.Thread(target=lock, daemon=True)
    attempt.start()
    attempt.join(60)  # a guard, not a bound: the old code never ended (a few tries take ms)
    assert not attempt.is_alive(), "flock keeps trying to make a folder that cannot be made"
    assert [type(e) for e in raised] == [FileNotFoundError], raised


def test_pull_into_a_cache_folder_that_cannot_be_made_says_so(tmp_path: Path) -> None:
    import subprocess
    import sys

    cmh = Path(sys.executable).parent / "cmh"
    argv = [str(cmh), "pull", "org/x", "--cache-dir", "/proc/cmh-no-such-folder",
            "--endpoint", "http://127.0.0.1:9"]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(tmp_path / "home")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == "error: /proc/cmh-no-such-folder: No such file or directory"


def test_a_lock_file_that_is_a_link_is_never_followed(tmp_path: Path) -> None:
    """Was: ``flock`` opened a planted link (``O_CREAT``), so it created the missing file it
    names or chmodded another user's private file 0664. A link is refused, its target is
    neither made nor changed."""
    from cmh.hub.cache import LockFileRefused

    locks, outside = tmp_path / ".locks" / "models--org--m", tmp_path / "outside"
    locks.mkdir(parents=True)
    outside.mkdir()
    secret = outside / "id_rsa"
    secret.write_text("secret")
    secret.chmod(0o600)
    (locks / "cmh.repo.lock").symlink_to(secret)
    (locks / "x.lock").symlink_to(outside / "made-by-a-lock")
    for name in ("cmh.repo.lock", "x.lock"):
        try:
            with flock(locks / name, timeout=0):
                raise AssertionError("a lock was taken through a link")
        except LockFileRefused as exc:
            assert "link" in str(exc)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(os.listdir(outside)) == ["id_rsa"]


def test_an_existing_lock_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / ".locks" / "models--org--m" / "x.lock"
    path.parent.mkdir(parents=True)
    path.touch()
    path.chmod(0o600)
    with flock(path, timeout=0):
        pass
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_prune_leaves_a_repo_with_a_linked_lock_file_alone(tmp_path: Path) -> None:
    from cmh.hub.prune import PrunePolicy, execute_plan, plan_prune, scan_cache
    from prune_support import DAY, NOW, CacheBuilder

    root, outside = tmp_path / "cache", tmp_path / "outside"
    b = CacheBuilder(root)
    b.revision("org/m", {"a.bin": b"a" * 10}, ref=None, fetched=NOW - 40 * DAY)
    b.revision("org/m", {"b.bin": b"b" * 10}, fetched=NOW - 40 * DAY)
    outside.mkdir()
    secret = outside / "id_rsa"
    secret.write_text("secret")
    secret.chmod(0o600)
    locks = root / ".locks" / "models--org--m"
    locks.mkdir(parents=True)
    (locks / "cmh.repo.lock").symlink_to(secret)
    plan = plan_prune(scan_cache(root), PrunePolicy(unreferenced=True), NOW)
    assert plan.empty
    assert any("cmh.repo.lock is a link, never followed" in n for n in plan.notes)
    execute_plan(plan, lock_timeout=0)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_a_blob_lock_swapped_for_a_link_after_the_scan_is_refused(tmp_path: Path) -> None:
    """The executor takes each blob's lock without following a link planted after its
    scan: that blob stays, the failure is reported, nothing outside is made."""
    from cmh.hub.prune import PrunePolicy, execute_plan, plan_prune, scan_cache
    from prune_support import DAY, NOW, CacheBuilder

    root, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    b = CacheBuilder(root)
    b.revision("org/m", {"a.bin": b"a" * 10}, ref=None, fetched=NOW - 40 * DAY)
    b.revision("org/m", {"b.bin": b"b" * 10}, fetched=NOW - 40 * DAY)
    plan = plan_prune(scan_cache(root), PrunePolicy(unreferenced=True), NOW)
    (blob,) = [i.path for i in plan.repos[0].items if i.kind == "blob"]
    etag = blob.rsplit("/", 1)[1]

    def plant(action: str, path: Path) -> None:
        if action == "rename-snapshot":
            (root / ".locks" / "models--org--m" / f"{etag}.lock").symlink_to(outside / "made")

    report = execute_plan(plan, lock_timeout=0, on_change=plant)
    assert (root / blob).exists()
    assert os.listdir(outside) == []
    assert any("link" in e for e in report.all_errors)
