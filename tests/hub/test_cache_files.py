"""Atomic file operations of the cache core: refs and snapshot links written by many threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from cmh.hub.cache import RepoLayout

from cmh import temp_path

COMMITS = [f"{i:040x}" for i in range(1, 9)]
BLOB = "a" * 64


def test_temp_names_differ_per_thread(tmp_path):
    names: set[str] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def name() -> None:
        barrier.wait()  # the four threads are alive together: distinct native ids
        with lock:
            names.add(temp_path(tmp_path / "refs" / "main"))

    threads = [threading.Thread(target=name) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(names) == 4


def test_threads_writing_one_ref_never_collide(tmp_path):
    repo = RepoLayout(tmp_path, "org/m")

    def write(i: int) -> None:
        for _ in range(50):
            repo.write_ref("main", COMMITS[i])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))  # re-raises a thread's error (a stolen temp file)
    assert repo.read_ref("main") in COMMITS
    assert [p.name for p in repo.refs.iterdir()] == ["main"]  # no temp file left


def test_threads_linking_one_snapshot_file_never_collide(tmp_path):
    repo = RepoLayout(tmp_path, "org/m")
    repo.blobs.mkdir(parents=True)
    (repo.blobs / BLOB).write_bytes(b"x")

    def link(_: int) -> None:
        for _ in range(50):
            repo.link_snapshot_file(COMMITS[0], "dir/file.bin", BLOB)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(link, range(8)))
    folder = repo.snapshot_dir(COMMITS[0]) / "dir"
    assert [p.name for p in folder.iterdir()] == ["file.bin"]
    assert (folder / "file.bin").read_bytes() == b"x"
