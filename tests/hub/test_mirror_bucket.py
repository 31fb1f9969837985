"""A mirror store in a bucket (``cmh.hub.mirror.stores.bucket._bucket``) on a real SeaweedFS.

Every request goes to the ``weed server`` the ``seaweed`` fixture starts on 127.0.0.1
(tests/hub/seaweed.py); there is no S3 mock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from bucket_support import use_bucket
from cmh.hub.cache import RepoLayout
from cmh.hub.mirror._index import build_index
from cmh.hub.mirror.stores.bucket._bucket import (
    BucketError,
    BucketStore,
    SourceChanged,
    TreeObject,
)
from cmh.hub.mirror.stores.bucket._objectstore import ObjectNotFound, ObjectStore
from cmh.hub.mirror.stores.local._folder import InvalidNameError, add_folder
from seaweed import SeaweedBucket

REPO = "cmh-test/bucket"
FOLDER = "models--cmh-test--bucket"


@pytest.fixture
def aws_env(
    seaweed_bucket: SeaweedBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The standard AWS settings pointing at SeaweedFS (and no profile files)."""
    return use_bucket(seaweed_bucket, tmp_path, monkeypatch)


@pytest.fixture
def bucket(seaweed_bucket: SeaweedBucket, aws_env: dict[str, str]) -> BucketStore:
    return BucketStore.open(seaweed_bucket.url, write_window=5.0, lease_poll=0.1)


def write_folder(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def sample(root: Path, tag: str = "a") -> Path:
    return write_folder(
        root,
        {
            "config.json": json.dumps({"tag": tag}).encode(),
            "sub/dir/notes.txt": f"notes {tag}\n".encode(),
            "model.safetensors": (tag.encode() * 4096)[:12000],
        },
    )


def dangling(bucket: BucketStore, folder: str, refs_only: bool = False) -> list[str]:
    """What is wrong in a repo: refs naming no tree, trees naming missing blobs (only
    trees a ref names with ``refs_only``)."""
    problems = []
    blobs = bucket.blob_infos(folder)
    trees = bucket.tree_infos(folder)
    for name, ref in bucket.refs(folder).items():
        if ref.commit not in trees:
            problems.append(f"ref {name} -> {ref.commit} has no tree")
    named = {r.commit for r in bucket.refs(folder).values()}
    for commit in trees:
        if refs_only and commit not in named:
            continue  # a writer's tree whose ref is not moved yet
        tree = bucket.read_tree(folder, commit)
        assert tree is not None
        for f in tree.files:
            if f.etag not in blobs or blobs[f.etag].size != f.size:
                problems.append(f"{commit}:{f.path} blob {f.etag} missing")
    return problems


def test_add_gives_the_local_stores_commit_and_files(bucket: BucketStore, tmp_path: Path) -> None:
    src = sample(tmp_path / "src")
    result = bucket.add_folder(src, REPO)
    local = add_folder(tmp_path / "store", src, REPO)
    assert result.created and result.ref_moved and result.new_blobs == 3
    assert result.commit == local.commit  # same ids as the local store (spec 1.2)
    assert bucket.read_ref(FOLDER, "main").commit == result.commit  # type: ignore[union-attr]
    tree = bucket.read_tree(FOLDER, result.commit)
    assert tree is not None and tree.parents == ()
    index = bucket.index(FOLDER, tree)
    want = build_index(RepoLayout(tmp_path / "store", REPO), local.commit)
    assert index.dir_oids == want.dir_oids
    assert {p: (f.etag, f.oid, f.size, f.lfs_sha256) for p, f in index.files.items()} == {
        p: (f.etag, f.oid, f.size, f.lfs_sha256) for p, f in want.files.items()
    }
    for f in tree.files:  # the blob holds the file's bytes, named as the Hub names it
        assert bucket.objects.get(bucket.blob_name(FOLDER, f.etag)) == (src / f.path).read_bytes()
    assert not dangling(bucket, FOLDER)


def test_unchanged_folder_creates_nothing_and_a_change_chains(
    bucket: BucketStore, tmp_path: Path
) -> None:
    first = bucket.add_folder(sample(tmp_path / "a"), REPO)
    again = bucket.add_folder(tmp_path / "a", REPO)
    assert not again.created and not again.ref_moved and again.commit == first.commit
    assert again.new_blobs == 0
    second = bucket.add_folder(sample(tmp_path / "b", "b"), REPO)
    assert second.created and second.parent == first.commit
    branch = bucket.add_folder(sample(tmp_path / "c", "c"), REPO, revision="v1")
    assert branch.parent == second.commit  # a new branch starts from main
    assert bucket.resolve_revision(FOLDER, "v1") == branch.commit
    assert bucket.resolve_revision(FOLDER, first.commit) == first.commit
    assert bucket.resolve_revision(FOLDER, "nope") is None
    assert [(r.repo_id, [x.name for x in r.refs], len(r.commits)) for r in bucket.list_store()] == [
        (REPO, ["main", "v1"], 3)
    ]


def test_a_commit_another_revision_wrote_is_not_reported_new(
    bucket: BucketStore, tmp_path: Path
) -> None:
    """The same tree on the same parent reached by a second ref: its tree object (and
    created_at) is the first import's, and the import says it created nothing."""
    sample(tmp_path / "a")
    bucket.add_folder(tmp_path / "a", REPO)
    bucket.add_folder(sample(tmp_path / "b", "b"), REPO)
    tag = bucket.add_folder(tmp_path / "a", REPO, revision="tag1")
    assert tag.created
    written = bucket.objects.get(bucket.tree_name(FOLDER, tag.commit))
    again = bucket.add_folder(tmp_path / "a", REPO)
    assert again.commit == tag.commit and again.ref_moved
    assert not again.created and again.parent == tag.parent
    assert bucket.objects.get(bucket.tree_name(FOLDER, tag.commit)) == written
    assert not dangling(bucket, FOLDER)


def test_bad_names_are_refused_before_any_write(bucket: BucketStore, tmp_path: Path) -> None:
    src = sample(tmp_path / "src")
    for kwargs in ({"revision": "a" * 40}, {"revision": "../x"}, {"repo_type": "space"}):
        with pytest.raises(InvalidNameError):
            bucket.add_folder(src, REPO, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError):
        bucket.add_folder(src, "bad--name")
    assert list(bucket.objects.list()) == []


def test_a_source_that_changes_during_upload_creates_no_blob(
    seaweed_bucket: SeaweedBucket, aws_env: dict[str, str], tmp_path: Path
) -> None:
    objects = ObjectStore.open(seaweed_bucket.url, part_size=5 << 20)
    bucket = BucketStore(objects)
    src = write_folder(tmp_path / "src", {"big.bin": os.urandom(11 << 20)})
    from cmh.hub.mirror.stores.bucket import _bucket as bucket_module
    from cmh.hub.mirror.stores.local._folder import SourceFile, hash_source

    size, sha, git = hash_source(src / "big.bin")
    wrong = SourceFile("big.bin", src / "big.bin", size, "0" * 64, git, True)
    with pytest.raises(SourceChanged):
        objects.put_stream("x/blob", bucket_module._checked_chunks(wrong))
    with pytest.raises(ObjectNotFound):
        objects.head("x/blob")
    good = SourceFile("big.bin", src / "big.bin", size, sha, git, True)
    assert bucket._store_blob(FOLDER, good)
    assert objects.head(bucket.blob_name(FOLDER, sha)).size == size


def test_a_corrupt_tree_object_is_refused(bucket: BucketStore, tmp_path: Path) -> None:
    result = bucket.add_folder(sample(tmp_path / "src"), REPO)
    name = bucket.tree_name(FOLDER, result.commit)
    doc = json.loads(bucket.objects.get(name))
    lfs = next(e for e in doc["entries"] if "lfs" in e)
    lfs["size"] += 1  # its LFS pointer's oid no longer matches
    bucket.objects.put(name, json.dumps(doc).encode())
    with pytest.raises(BucketError, match="invalid"):
        bucket.read_tree(FOLDER, result.commit)
    with pytest.raises(BucketError):
        TreeObject.from_bytes(b"[]", result.commit)


_WRITER = """
import sys, json
from pathlib import Path
from cmh.hub.mirror.stores.bucket._bucket import BucketStore
url, src, repo, go, ready = sys.argv[1:6]
store = BucketStore.open(url, write_window=5.0, lease_poll=0.1)
Path(ready).touch()
while not Path(go).exists():
    pass
r = store.add_folder(Path(src), repo)
print(json.dumps({"commit": r.commit, "parent": r.parent, "created": r.created}))
"""


def test_two_processes_adding_to_one_repo_lose_no_commit(
    bucket: BucketStore, seaweed_bucket: SeaweedBucket, aws_env: dict[str, str], tmp_path: Path
) -> None:
    base = bucket.add_folder(sample(tmp_path / "base", "base"), REPO)
    rounds = 3
    for i in range(rounds):
        go = tmp_path / f"go-{i}"
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _WRITER,
                    seaweed_bucket.url,
                    str(sample(tmp_path / f"w{i}-{k}", f"w{i}-{k}")),
                    REPO,
                    str(go),
                    str(tmp_path / f"ready-{i}-{k}"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **aws_env},
            )
            for k in range(2)
        ]
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob(f"ready-{i}-*"))) < 2:  # both started and polling
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.02)
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        results = [json.loads(o) for o, _ in outs]
        commits = {r["commit"] for r in results}
        assert len(commits) == 2 and all(r["created"] for r in results)
        head = bucket.read_ref(FOLDER, "main")
        assert head is not None and head.commit in commits
        # walking the history from the ref finds both new commits and the base
        seen, cur = [], head.commit
        while cur:
            seen.append(cur)
            tree = bucket.read_tree(FOLDER, cur)
            assert tree is not None
            cur = tree.parents[0] if tree.parents else ""
        assert commits <= set(seen) and base.commit in seen
        assert not dangling(bucket, FOLDER)


def test_a_writer_waits_while_a_pruner_holds_the_lease(bucket: BucketStore, tmp_path: Path) -> None:
    first = bucket.add_folder(sample(tmp_path / "a"), REPO)
    bucket.objects.put_if_absent(bucket.lease_name(FOLDER), b'{"owner": "test"}')
    done: list[str] = []
    told: list[str] = []
    waiting = threading.Event()
    bucket.on_notice = lambda text: (told.append(text), waiting.set())
    thread = threading.Thread(
        target=lambda: done.append(bucket.add_folder(sample(tmp_path / "b", "b"), REPO).commit)
    )
    thread.start()
    assert waiting.wait(30)  # the writer reached the lease and waits on it
    assert "waiting for test" in told[0]
    assert not done and bucket.read_ref(FOLDER, "main").commit == first.commit  # type: ignore[union-attr]
    bucket.objects.delete(bucket.lease_name(FOLDER))
    thread.join(30)
    assert done and bucket.read_ref(FOLDER, "main").commit == done[0]  # type: ignore[union-attr]


def total_bytes(bucket: BucketStore) -> int:
    return sum(i.size for i in bucket.objects.list())


def blob_bytes(bucket: BucketStore) -> int:
    """The bytes of every blob (what a prune's ``freed`` counts)."""
    return sum(i.size for i in bucket.objects.list() if "/blobs/" in i.name)


def test_scrub_finds_and_quarantines_a_corrupted_object(
    bucket: BucketStore, tmp_path: Path
) -> None:
    from cmh.hub.mirror.stores.bucket._scrub import scrub_bucket

    result = bucket.add_folder(sample(tmp_path / "src"), REPO)
    clean = scrub_bucket(bucket)
    assert clean.to_dict()["ok"] and len(clean.checks) == 3 and not clean.broken_links
    tree = bucket.read_tree(FOLDER, result.commit)
    assert tree is not None
    victim = next(f for f in tree.files if f.path == "model.safetensors")
    name = bucket.blob_name(FOLDER, victim.etag)
    data = bytearray(bucket.objects.get(name))
    data[100] ^= 1  # one flipped bit, same size
    bucket.objects.put(name, bytes(data))
    report = scrub_bucket(bucket)
    assert [(c.blob, c.method) for c in report.bad] == [(victim.etag, "sha256")]
    assert report.bad[0].quarantined_to is not None
    with pytest.raises(ObjectNotFound):
        bucket.objects.head(name)
    kept = [i.name for i in bucket.objects.list(".quarantine")]
    assert len(kept) == 2 and bucket.objects.get(kept[0]) == bytes(data)
    assert json.loads(bucket.objects.get(kept[1]))["blob"] == victim.etag
    again = scrub_bucket(bucket, do_quarantine=False)
    assert again.to_dict()["ok"] and any(victim.etag in b for b in again.broken_links)
    bucket.add_folder(tmp_path / "src", REPO)  # a re-import uploads the blob again
    assert bucket.objects.get(name) == (tmp_path / "src/model.safetensors").read_bytes()


def test_scrub_reports_a_missing_blob_unless_a_pull_through_fills_it(
    bucket: BucketStore, tmp_path: Path
) -> None:
    """A blob missing from an imported commit is broken; from a pull-through commit (one
    with a freshness record) it is a blob not filled yet (spec 8.5), not reported."""
    from cmh.hub.mirror.stores.bucket._scrub import scrub_bucket

    result = bucket.add_folder(sample(tmp_path / "src"), REPO)
    tree = bucket.read_tree(FOLDER, result.commit)
    assert tree is not None
    victim = next(f for f in tree.files if f.path == "model.safetensors")
    bucket.objects.delete(bucket.blob_name(FOLDER, victim.etag))
    broken = scrub_bucket(bucket, do_quarantine=False).broken_links
    assert broken == [f"{REPO}@{result.commit}:model.safetensors (blob {victim.etag} missing)"]
    record = bucket.upstream_record_name(FOLDER, result.commit)
    bucket.put_record(record, json.dumps({"fresh_until": 0, "at": 0}).encode())
    assert scrub_bucket(bucket, do_quarantine=False).broken_links == []


def test_prune_frees_what_it_reports_blobs_last(bucket: BucketStore, tmp_path: Path) -> None:
    from cmh.hub.prune import PrunePolicy, prune_bucket

    first = bucket.add_folder(sample(tmp_path / "a"), REPO)
    second = bucket.add_folder(sample(tmp_path / "b", "b"), REPO)
    third = bucket.add_folder(sample(tmp_path / "c", "c"), REPO, revision="old")
    bucket.objects.put(bucket.ref_name(FOLDER, "gone"), b"f" * 40 + b"\n")  # dangling
    policy = PrunePolicy(keep_latest=1)
    plan, _ = prune_bucket(bucket, policy, dry_run=True)
    before = blob_bytes(bucket)
    assert blob_bytes(bucket) == before  # a dry run changes nothing
    deleted: list[str] = []
    real_delete = bucket.objects.delete

    def spy(name: str) -> None:
        deleted.append(name)
        real_delete(name)

    bucket.objects.delete = spy  # type: ignore[method-assign]
    _, report = prune_bucket(bucket, policy, settle=0.2)
    assert report is not None
    repo = report.repos[0]
    # "main" and "old" both name served commits (ref heads): only first, one commit down
    # main's history, is beyond the latest one, and the dangling ref goes
    assert [r.commit for r in repo.revisions] == [first.commit]
    assert [i.path for i in repo.items if i.kind == "ref"] == [f"{FOLDER}/refs/gone"]
    assert report.freed == plan.freed > 0
    assert before - blob_bytes(bucket) == report.freed
    kinds = [n.split("/")[1] for n in deleted if "/.cmh/" not in n and ".cmh/probe" not in n]
    assert kinds == sorted(kinds, key=["refs", "trees", "blobs"].index)  # refs, trees, blobs
    assert not dangling(bucket, FOLDER)
    assert sorted(bucket.tree_infos(FOLDER)) == sorted({second.commit, third.commit})
    with pytest.raises(ObjectNotFound):
        bucket.objects.head(bucket.lease_name(FOLDER))


def test_prune_skips_a_repo_whose_lease_is_held(bucket: BucketStore, tmp_path: Path) -> None:
    from cmh.hub.prune import PrunePolicy, prune_bucket

    bucket.add_folder(sample(tmp_path / "a"), REPO)
    bucket.add_folder(sample(tmp_path / "b", "b"), REPO)
    bucket.objects.put_if_absent(bucket.lease_name(FOLDER), b"{}")
    _, report = prune_bucket(bucket, PrunePolicy(keep_latest=1), settle=0)
    assert report is not None and report.repos[0].skipped and report.freed == 0
    assert len(bucket.tree_infos(FOLDER)) == 2


def test_writers_racing_a_pruner_never_leave_a_ref_to_missing_blobs(
    bucket: BucketStore, tmp_path: Path
) -> None:
    """Writers keep adding commits while pruners keep only the newest one: after every
    round, every ref names a tree object whose blobs are all there."""
    from cmh.hub.prune import PrunePolicy, prune_bucket

    bucket.add_folder(sample(tmp_path / "base"), REPO)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        i = 0
        try:
            while not stop.is_set():
                bucket.add_folder(sample(tmp_path / f"w{k}-{i}", f"w{k}-{i}"), REPO)
                i += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in writers:
        t.start()
    try:
        for _ in range(3):
            # settle > the writers' window (5 s) + their request time here
            prune_bucket(bucket, PrunePolicy(keep_latest=1), settle=6.0)
            assert not dangling(bucket, FOLDER, refs_only=True)
    finally:
        stop.set()
        for t in writers:
            t.join(60)
    assert not errors
    assert not dangling(bucket, FOLDER)
    assert bucket.resolve_revision(FOLDER, "main") is not None


def cmh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", *args],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=300,
    )  # fmt: skip


def test_cli_two_mirror_add_processes_at_once_then_ls_scrub_prune(
    bucket: BucketStore, seaweed_bucket: SeaweedBucket, aws_env: dict[str, str], tmp_path: Path
) -> None:
    url = seaweed_bucket.url
    srcs = [sample(tmp_path / f"s{k}", f"s{k}") for k in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cmh.cli.main",
                "mirror",
                "add",
                str(src),
                "--store",
                url,
                "--repo",
                REPO,
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **aws_env},
        )
        for src in srcs
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    commits = {json.loads(o)["commit"] for o, _ in outs}
    head = bucket.read_ref(FOLDER, "main")
    assert len(commits) == 2 and head is not None and head.commit in commits
    other = (commits - {head.commit}).pop()
    tree = bucket.read_tree(FOLDER, head.commit)
    # the two imports are serialised by the ref's compare-and-swap: one builds on the other
    # (or both started from no ref and the loser rebased onto the winner)
    assert tree is not None and tree.parents == (other,)
    assert not dangling(bucket, FOLDER)

    ls = cmh(aws_env, "mirror", "ls", "--store", url, "--json")
    assert ls.returncode == 0, ls.stderr
    (repo,) = json.loads(ls.stdout)["repos"]
    assert repo["repo_id"] == REPO and [r["commit"] for r in repo["refs"]] == [head.commit]
    # a writer that lost the race may leave its first tree object behind, unreferenced
    # (whole: `dangling` checked every tree's blobs above); prune --unreferenced takes it
    assert commits <= set(repo["commits"]) and len(repo["commits"]) <= 3

    victim = next(f for f in tree.files if f.path == "config.json")
    bucket.objects.put(bucket.blob_name(FOLDER, victim.etag), b"x" * victim.size)
    scrub = cmh(aws_env, "mirror", "scrub", "--store", url, "--json")
    assert scrub.returncode == 1, scrub.stderr
    bad = json.loads(scrub.stdout)["bad"]
    assert [b["blob"] for b in bad] == [victim.etag] and bad[0]["quarantined_to"]

    before = blob_bytes(bucket)
    dry = cmh(aws_env, "prune", "--store", url, "--keep-latest", "1", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert blob_bytes(bucket) == before
    done = cmh(aws_env, "prune", "--store", url, "--keep-latest", "1", "--settle", "0.2",
               "--yes", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    freed = json.loads(done.stdout)["freed"]
    assert freed == json.loads(dry.stdout)["freed"] > 0
    assert before - blob_bytes(bucket) == freed
    assert list(bucket.tree_infos(FOLDER)) == [head.commit]


def test_cli_bucket_errors_are_clear(aws_env: dict[str, str], tmp_path: Path) -> None:
    src = sample(tmp_path / "src")
    missing = cmh(aws_env, "mirror", "ls", "--store", "s3://no-such-bucket-cmh/x")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "no-such-bucket-cmh" in missing.stderr
    bad = cmh(aws_env, "mirror", "add", str(src), "--store", "s3://Bad_Bucket/x", "--repo", REPO)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    sized = cmh(aws_env, "prune", "--store", "s3://cmh-test/x", "--max-size", "1GB",
                "--expired", "--dry-run")  # fmt: skip
    assert sized.returncode == 0 and "Traceback" not in sized.stderr, sized.stderr


def test_serve_refuses_a_missing_bucket_and_a_delivery_the_store_cannot_do(
    aws_env: dict[str, str], seaweed_bucket: SeaweedBucket, tmp_path: Path
) -> None:
    for workers in ("1", "2"):
        missing = cmh(aws_env, "serve", "--store", "s3://no-such-bucket-cmh/x", "--port", "0",
                      "--workers", workers)  # fmt: skip
        assert missing.returncode == 2 and "no-such-bucket-cmh" in missing.stderr
        assert "Traceback" not in missing.stderr
    # x-accel applies to both kinds (a bucket's: test_mirror_bucket_xaccel.py)
    (tmp_path / "store").mkdir()
    redirect = cmh(aws_env, "serve", "--store", str(tmp_path / "store"), "--port", "0",
                   "--blob-delivery", "redirect")  # fmt: skip
    assert redirect.returncode == 2 and "does not apply to the store" in redirect.stderr
    assert "use proxy or x-accel" in redirect.stderr
