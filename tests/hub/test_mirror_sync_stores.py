# ruff: noqa: E501  (the client script below is kept one call per line)
"""``cmh mirror sync`` end to end into every store kind: a folder, a SeaweedFS bucket and
a moto bucket (real servers started by the fixtures), from a Hub-like upstream (302 to a
signed CDN, paginated trees, ``xetHash`` in listings) whose repo has a history, so its
commit ids are not the ones an import of the files alone would compute.

A synced store must answer as the upstream does: the branch names the upstream's commit,
a client pinned to that commit id gets its files, the tensor manifests are there, a sync
again is idempotent, and a moved upstream branch moves the store's branch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from bucket_support import S3_KINDS, use_bucket
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.mirror.stores import MirrorStore, open_store
from cmh.hub.mirror.stores.local._folder import add_folder
from deadline_support import TEST_DEADLINE
from hublike import HubLike, running
from mirror_support import MINILM_REPO, MirrorServer, hf_env, run_python, write_tiny_repo

KINDS = ("local", *S3_KINDS)
REPO = "cmh-test/history"

PINNED_SCRIPT = r"""
import json, os, hashlib
from huggingface_hub import snapshot_download
snap = snapshot_download(os.environ["T_REPO"], revision=os.environ["T_REVISION"])
print(json.dumps({os.path.relpath(os.path.join(d, f), snap): hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
                  for d, _, fs in os.walk(snap) for f in fs}))
"""


@dataclass
class Upstream:
    store: Path
    server: MirrorServer
    front: HubLike
    sources: dict[int, Path]

    def commit(self, repo: str = REPO, revision: str = "main") -> str:
        answer = httpx2.get(
            f"{self.server.url}/api/models/{repo}/revision/{revision}", timeout=TEST_DEADLINE
        )
        assert answer.status_code == 200, answer.text
        return str(answer.json()["sha"])


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Iterator[Upstream]:
    base = tmp_path_factory.mktemp("sync-upstream")
    store = base / "store"
    sources = {v: write_tiny_repo(base / f"v{v}", v) for v in (1, 2)}
    for version in (1, 2):  # main: v1, then v2 on top (the head has a parent)
        add_folder(store, sources[version], REPO)
    add_folder(store, minilm_dir, MINILM_REPO)
    server = MirrorServer(store, base / "logs")
    try:
        with running(server.url, page_size=3) as front:
            yield Upstream(store, server, front, sources)
    finally:
        server.stop()


@dataclass
class Target:
    kind: str
    location: str
    store: MirrorStore


@pytest.fixture(params=KINDS)
def target(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Target:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # a bucket's sync cache
    if request.param == "local":
        location = str(tmp_path / "carried")
        return Target("local", location, open_store(Path(location)))
    bucket = request.getfixturevalue(f"{request.param}_bucket")
    use_bucket(bucket, tmp_path, monkeypatch)
    return Target(request.param, bucket.url, open_store(bucket.url))


def sync(target: Target, upstream: Upstream, *repos: str, revision: str = "main") -> dict:
    result = CliRunner().invoke(cli, ["mirror", "sync", *repos, "--store", target.location,
                                      "--from", upstream.front.url, "--revision", revision,
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def sha256_tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_sync_keeps_the_upstream_commit_and_serves_it_pinned(
    target: Target, upstream: Upstream, tmp_path: Path
) -> None:
    head = upstream.commit()
    doc = sync(target, upstream, REPO, MINILM_REPO)
    assert [r["commit"] for r in doc["repos"]] == [head, upstream.commit(MINILM_REPO)]
    assert target.store.refs("model", REPO) == {"main": head}
    assert target.store.commits("model", REPO) == [head]
    served = MirrorServer(target.location, tmp_path / "logs")  # type: ignore[arg-type]
    try:
        answer = httpx2.head(f"{served.url}/{REPO}/resolve/main/config.json", timeout=TEST_DEADLINE)
        assert answer.status_code == 200 and answer.headers["X-Repo-Commit"] == head
        env = hf_env(served.url, tmp_path / "home")
        env.update(T_REPO=REPO, T_REVISION=head)
        assert run_python(PINNED_SCRIPT, env) == sha256_tree(upstream.sources[2])
        weights = f"{served.url}/api/cmh/manifest/{MINILM_REPO}/resolve/main/model.safetensors"
        manifest = httpx2.get(weights, timeout=TEST_DEADLINE)
        assert manifest.status_code == 200 and manifest.json()["tensors"], manifest.text
    finally:
        served.stop()


def test_sync_again_is_idempotent_and_follows_the_upstream_branch(
    target: Target, upstream: Upstream, tmp_path: Path
) -> None:
    first = upstream.commit()
    sync(target, upstream, REPO)
    again = sync(target, upstream, REPO)
    assert again["repos"][0]["commit"] == first
    assert target.store.commits("model", REPO) == [first]  # no second commit for the same
    pinned = sync(target, upstream, REPO, revision=first)  # a commit id moves no branch
    assert pinned["repos"][0]["commit"] == first
    assert target.store.refs("model", REPO) == {"main": first}
    moved = add_folder(upstream.store, write_tiny_repo(tmp_path / "v3", 3), REPO)
    try:
        assert moved.commit == upstream.commit() != first
        assert sync(target, upstream, REPO)["repos"][0]["commit"] == moved.commit
        assert target.store.refs("model", REPO) == {"main": moved.commit}
        assert sorted(target.store.commits("model", REPO)) == sorted([first, moved.commit])
        index = target.store.resolve("model", REPO, moved.commit)
        assert index is not None
        assert json.loads(target.store.opener(index.files["config.json"]).read()) == {
            "model_type": "tiny",
            "version": 3,
        }
    finally:  # the module's upstream goes back to v2 for the other kinds
        ref = upstream.store / "models--cmh-test--history" / "refs" / "main"
        ref.write_text(first)
        os.utime(ref)


# -- a sync again: incremental into every kind ----------------------------------------------

WRITES = ("put", "put_file", "put_stream", "put_if_absent", "put_if_match", "copy", "delete")


def count_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every object written (or removed) by this process from now on: ``(method, name)``."""
    from cmh.hub.mirror.stores.bucket._objectstore import ObjectStore

    written: list[tuple[str, str]] = []
    for method in WRITES:
        original = getattr(ObjectStore, method)

        def wrapper(self: object, name: str, *args: object, _m: str = method,
                    _f: object = original, **kwargs: object) -> object:  # fmt: skip
            written.append((_m, name))
            return _f(self, name, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(ObjectStore, method, wrapper)
    return written


def listing(target: Target) -> dict[str, tuple[str, object]]:
    """Every object of a bucket store: name -> (ETag, LastModified)."""
    objects = target.store.bucket.objects  # type: ignore[attr-defined]
    return {i.name: (i.etag, i.last_modified) for i in objects.list("")}


def file_bodies(upstream: Upstream) -> dict[str, int]:
    """Body bytes the upstream sent for file downloads (hub resolves and the CDN), by path."""
    out: dict[str, int] = {}
    for r in upstream.front.records():
        if (r.origin == "cdn" or "/resolve/" in r.path) and r.bytes_sent:
            out[r.path] = out.get(r.path, 0) + r.bytes_sent
    return out


def test_sync_again_of_an_unchanged_repo_fetches_no_file_and_writes_nothing(
    target: Target, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = sync(target, upstream, REPO)["repos"][0]
    assert first["store"]["state"] == "updated"
    before = listing(target) if target.kind != "local" else {}
    upstream.front.clear_records()
    written = count_writes(monkeypatch)
    again = CliRunner().invoke(cli, ["mirror", "sync", REPO, "--store", target.location,
                                     "--from", upstream.front.url])  # fmt: skip
    assert again.exit_code == 0, again.output
    assert "the store held it already (nothing written)" in again.output
    assert file_bodies(upstream) == {}  # metadata requests only
    assert written == []
    if target.kind != "local":
        assert listing(target) == before  # same objects, same versions
    doc = sync(target, upstream, REPO)["repos"][0]
    assert doc["store"]["state"] == "unchanged"
    assert [f["bytes_transferred"] for f in doc["files"] if f["bytes_transferred"]] == []
    assert doc["commit"] == first["commit"] and written == []
    pinned = sync(target, upstream, REPO, revision=first["commit"])["repos"][0]
    assert pinned["store"]["state"] == "unchanged" and written == []  # held by its id


def test_sync_again_puts_back_a_blob_the_store_lost(target: Target, upstream: Upstream) -> None:
    """A blob scrub quarantined or a hand removed: a sync again does not take the tree
    object's word for it, it stores the blob again."""
    first = sync(target, upstream, REPO)["repos"][0]
    etag = next(f["etag"] for f in first["files"] if f["path"] == "config.json")
    folder = "models--cmh-test--history"
    if target.kind == "local":
        (Path(target.location) / folder / "blobs" / etag).unlink()
    else:
        target.store.bucket.objects.delete(f"{folder}/blobs/{etag}")  # type: ignore[attr-defined]
    again = sync(target, upstream, REPO)["repos"][0]
    assert again["store"]["state"] == "updated"
    index = target.store.resolve("model", REPO, first["commit"])
    assert index is not None
    assert json.loads(target.store.opener(index.files["config.json"]).read())["version"] == 2


def test_sync_of_a_new_version_fetches_and_uploads_only_the_changed_file(
    target: Target, upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = upstream.commit()
    sync(target, upstream, REPO)
    changed = tmp_path / "v2-changed"
    changed.mkdir()
    for path, _ in sha256_tree(upstream.sources[2]).items():
        (changed / path).parent.mkdir(parents=True, exist_ok=True)
        (changed / path).write_bytes((upstream.sources[2] / path).read_bytes())
    (changed / "config.json").write_text('{"model_type": "tiny", "version": 2, "edited": 1}\n')
    moved = add_folder(upstream.store, changed, REPO)
    try:
        upstream.front.clear_records()
        written = count_writes(monkeypatch)
        doc = sync(target, upstream, REPO)["repos"][0]
        assert doc["commit"] == moved.commit != first
        assert set(file_bodies(upstream)) == {f"/{REPO}/resolve/{moved.commit}/config.json"}
        fetched = {
            f["path"]: f["bytes_transferred"] for f in doc["files"] if f["bytes_transferred"]
        }
        assert list(fetched) == ["config.json"]
        assert doc["bytes_reused"] >= 300_000  # weights.bin came from the kept cache
        assert doc["store"]["state"] == "updated"
        if target.kind != "local":
            assert (doc["store"]["new_blobs"], doc["store"]["new_bytes"]) == (
                1, (changed / "config.json").stat().st_size)  # fmt: skip
            blobs = [name for _, name in written if "/blobs/" in name]
            etag = next(f["etag"] for f in doc["files"] if f["path"] == "config.json")
            assert blobs == [f"models--cmh-test--history/blobs/{etag}"]
        assert target.store.refs("model", REPO) == {"main": moved.commit}
        index = target.store.resolve("model", REPO, moved.commit)
        assert index is not None
        assert json.loads(target.store.opener(index.files["config.json"]).read())["edited"] == 1
    finally:  # the module's upstream goes back to v2 for the other kinds
        ref = upstream.store / "models--cmh-test--history" / "refs" / "main"
        ref.write_text(first)
        os.utime(ref)


def test_sync_cache_dir_defaults_to_the_user_cache_and_a_folder_store_is_its_own(
    target: Target, upstream: Upstream, tmp_path: Path
) -> None:
    from cmh.hub.mirror.stores import default_sync_cache

    doc = sync(target, upstream, REPO)["repos"][0]
    if target.kind == "local":
        assert doc["store"]["cache_dir"] == target.location
    else:
        default = default_sync_cache(target.location)
        assert default.parent == tmp_path / "xdg-cache" / "cmh" / "sync"
        assert doc["store"]["cache_dir"] == str(default)
        assert Path(doc["path"]).is_relative_to(default) and Path(doc["path"]).is_dir()
    chosen = tmp_path / "chosen"
    result = CliRunner().invoke(cli, ["mirror", "sync", REPO, "--store", target.location,
                                      "--from", upstream.front.url, "--cache-dir", str(chosen),
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["repos"][0]
    if target.kind == "local":  # ignored: the folder store is the cache
        assert doc["store"]["cache_dir"] == target.location and not chosen.exists()
    else:
        assert doc["store"]["cache_dir"] == str(chosen)
        assert Path(doc["path"]).is_relative_to(chosen)
        assert doc["store"]["state"] == "unchanged"  # a new cache: fetched, not uploaded


def test_sync_help_says_what_cache_dir_is_for() -> None:
    shown = CliRunner().invoke(cli, ["mirror", "sync", "--help"], terminal_width=200).output
    words = " ".join(shown.split())
    assert "--cache-dir" in words and "For a bucket store" in words
    assert "A folder store is its own cache: it ignores this." in words
