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
