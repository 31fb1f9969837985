"""The resolver against a lying Hub, hostile files, threads and a full disk (issue 11, items 1-10).

Every Hub here is a real ``cmh serve`` on 127.0.0.1, most behind a
:class:`~hostile_proxy.HostileProxy` that lies, stalls, refuses ranges or
throttles; the cache is a real folder (a real tmpfs for the disk-full case).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cmh.hub as hub
import huggingface_hub
import numpy as np
import pytest
from cli_support import CMH, run_runner, run_subprocess
from cmh.hub.cache import RepoLayout
from cmh.hub.mirror import add_folder
from hostile_proxy import HostileProxy
from mirror_support import MirrorServer
from resolver_support import tensors_for, write_checkpoint_repo
from safetensors.numpy import load_file, save_file

import cmh

REPO = "org/toy"
WEIGHTS = "model.safetensors"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Hub:
    """A repo of its own in the module's store, the module's ``cmh serve`` on it (the
    subject is the resolver, not the server: one server for all), a hostile proxy in
    front, and an empty cache."""

    def __init__(self, tmp: Path, server: MirrorServer) -> None:
        self.tmp = tmp
        self.repo = f"org/toy-{uuid.uuid4().hex[:12]}"
        self.store = Path(server.store)
        self.cache = tmp / "cache"
        self.layout = RepoLayout(self.cache, self.repo)
        self.sources: dict[str, Path] = {}
        self.commits: dict[int, str] = {}
        self.publish(1)
        self.server = server
        self.proxy = HostileProxy(self.server.url)

    def publish(self, version: int, **kw: Any) -> str:
        src = write_checkpoint_repo(self.tmp / f"v{version}", version, **kw)
        commit = add_folder(self.store, src, self.repo).commit
        self.sources[commit] = src
        self.commits[version] = commit
        return commit

    def resolve(self, **kw: Any) -> hub.Resolution:
        kw.setdefault("endpoint", self.proxy.url)
        return hub.resolve(self.repo, cache_dir=self.cache, **kw)

    def pull(self, *args: str) -> Any:
        return run_runner(
            ["pull", self.repo, "--cache-dir", self.cache, "--endpoint", self.proxy.url, *args]
        )

    def published(self, commit: str, path: str = WEIGHTS) -> str:
        return sha256(self.sources[commit] / path)

    def snapshot_sha(self, commit: str, path: str = WEIGHTS) -> str | None:
        file = self.layout.snapshot_file(commit, path)
        return sha256(file) if file.exists() else None


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorServer]:
    """One ``cmh serve`` for the module: each test publishes a repo of its own in its store."""
    base = tmp_path_factory.mktemp("toy-hub")
    store = base / "store"
    add_folder(store, write_checkpoint_repo(base / "seed", 1), "org/seed")
    with MirrorServer(store, base / "logs") as server:
        yield server


@pytest.fixture
def toy(tmp_path: Path, toy_server: MirrorServer) -> Any:
    h = Hub(tmp_path, toy_server)
    yield h
    h.proxy.stop()


def siblings_rewrite(path: str, **lfs: Any) -> Any:
    """A revision-answer rewrite that changes one sibling's ``lfs`` entry (and size)."""

    def rewrite(obj: dict[str, Any]) -> dict[str, Any]:
        for s in obj.get("siblings", []):
            if s.get("rfilename") == path:
                s["lfs"] = {**s.get("lfs", {}), **lfs}
                if "size" in lfs:
                    s["size"] = lfs["size"]
        return obj

    return rewrite


def listed_etag(layout: RepoLayout, commit: str, path: str) -> str | None:
    """The etag ``trees/{commit}.json`` records for ``path`` (the stock listing format)."""
    try:
        data = json.loads((layout.trees / f"{commit}.json").read_text())
    except FileNotFoundError:
        return None
    entry = data["files"].get(path)
    return None if entry is None else entry.get("lfs_sha256") or entry.get("blob_id")


# -- item 1: poisoned listings ----------------------------------------------------------


def test_listing_that_names_the_cached_older_blob_is_not_installed(toy):
    """1a: a new commit's listing claims the weights are the cached older blob."""
    toy.resolve()
    c1 = toy.commits[1]
    c2 = toy.publish(2)
    old_blob = sha256(toy.sources[c1] / WEIGHTS)
    old_size = (toy.sources[c1] / WEIGHTS).stat().st_size
    toy.proxy.rewrite_revision = siblings_rewrite(WEIGHTS, sha256=old_blob, size=old_size)
    with contextlib.suppress(hub.ResolveError):
        toy.resolve(policy=hub.Policy(revalidate=True))
    # Whatever the lying run did, commit C2's snapshot never holds C1's bytes.
    assert toy.snapshot_sha(c2) in (None, toy.published(c2))
    toy.proxy.rewrite_revision = None
    clean = toy.pull("--revalidate", "--json")
    assert clean.exit_code == 0, clean.stderr
    assert clean.json()["commit"] == c2
    assert toy.snapshot_sha(c2) == toy.published(c2)
    assert listed_etag(toy.layout, c2, WEIGHTS) == toy.published(c2)


def test_listing_that_names_an_older_commit_with_newer_files(toy):
    """1b: the revision answer names C1 with C2's file list; C1's snapshot gets C1's bytes."""
    c1 = toy.commits[1]
    c2 = toy.publish(2)
    assert toy.resolve().commit == c2
    toy.proxy.rewrite_revision = lambda obj: {**obj, "sha": c1}
    with contextlib.suppress(hub.ResolveError):
        toy.resolve(policy=hub.Policy(revalidate=True))
    assert toy.snapshot_sha(c1) in (None, toy.published(c1))
    assert listed_etag(toy.layout, c1, WEIGHTS) in (None, toy.published(c1))
    toy.proxy.rewrite_revision = None
    pinned = toy.pull("--revision", c1)
    assert pinned.exit_code == 0, pinned.stderr
    offline = hub.resolve(toy.repo, c1, cache_dir=toy.cache, policy=hub.Policy(offline=True))
    loaded = load_file(str(offline.path / WEIGHTS))
    assert np.array_equal(loaded["layer.3.weight"], tensors_for(1)["layer.3.weight"])
    assert toy.snapshot_sha(c1) == toy.published(c1)
    for name in ("README.md", "config.json"):
        assert toy.snapshot_sha(c1, name) == toy.published(c1, name)


def test_listing_hash_that_no_download_can_match_heals(toy):
    """1c: a listed hash no bytes can match must not fail every later clean run."""
    c1 = toy.commits[1]
    toy.proxy.rewrite_revision = siblings_rewrite(WEIGHTS, sha256="ab" * 32)
    with contextlib.suppress(hub.ResolveError):
        toy.resolve()
    toy.proxy.rewrite_revision = None
    clean = toy.resolve()
    assert clean.commit == c1
    assert toy.snapshot_sha(c1) == toy.published(c1)
    fetched = len(toy.proxy.requests(f"/resolve/{c1}/{WEIGHTS}", "GET"))
    again = toy.resolve(policy=hub.Policy(revalidate=True))
    assert again.state is hub.State.FRESH
    assert len(toy.proxy.requests(f"/resolve/{c1}/{WEIGHTS}", "GET")) == fetched


def test_cached_tree_that_fails_its_check_is_discarded(toy):
    """A cached listing that led to a failed check is dropped; a rerun installs the right bytes."""
    c1 = toy.commits[1]
    toy.resolve()
    tree = toy.layout.trees / f"{c1}.json"
    data = json.loads(tree.read_text())
    data["files"][WEIGHTS]["lfs_sha256"] = "cd" * 32  # a crafted listing, as a lying run left it
    tree.write_text(json.dumps(data))
    link = toy.layout.snapshot_file(c1, WEIGHTS)
    link.unlink()
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(toy.resolve(policy=hub.Policy(revalidate=True)).commit)
        except hub.ResolveError as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[-1] == c1, outcomes
    assert toy.snapshot_sha(c1) == toy.published(c1)
    assert listed_etag(toy.layout, c1, WEIGHTS) == toy.published(c1)


# -- item 2: Range ignored ----------------------------------------------------------------


def test_server_that_ignores_range_still_gets_the_update(toy):
    toy.resolve()
    c2 = toy.publish(2)
    toy.proxy.ignore_range = True
    res = toy.resolve(policy=hub.Policy(revalidate=True))
    assert res.state is hub.State.ETAG_MISMATCH, res.warnings
    assert res.commit == c2 and toy.layout.read_ref("main") == c2
    assert toy.snapshot_sha(c2) == toy.published(c2)


def test_ranges_ignored_after_the_header_leave_no_assembly(toy):
    """The header range is answered, the tensor ranges are not: whole download, no leftovers."""
    toy.resolve()
    c2 = toy.publish(2)
    toy.proxy.ignore_range, toy.proxy.honour_ranges = True, 1
    res = toy.resolve(policy=hub.Policy(revalidate=True))
    assert res.state is hub.State.ETAG_MISMATCH and res.commit == c2
    assert toy.snapshot_sha(c2) == toy.published(c2)
    assert partials(toy.cache) == []


# -- item 3: Retry-After and transient API errors ----------------------------------------


def _gaps_after(seen: list[Any], status: int) -> list[float]:
    """Seconds between each ``status`` answer and the next request for the same path."""
    gaps = []
    for i, s in enumerate(seen):
        if s.status == status:
            later = [t for t in seen[i + 1 :] if t.path == s.path]
            if later:
                gaps.append(later[0].at - s.at)
    return gaps


def test_retry_after_is_honoured_on_429(toy):
    toy.proxy.fail(f"/resolve/{toy.commits[1]}/{WEIGHTS}", 429, 2, {"Retry-After": "1"})
    res = toy.resolve()
    assert toy.snapshot_sha(res.commit) == toy.published(res.commit)
    gaps = _gaps_after(toy.proxy.requests(WEIGHTS), 429)
    assert len(gaps) == 2
    assert min(gaps) >= 0.95, gaps  # the server asked for one second


def _partials(layout: RepoLayout, etag: str) -> list[Path]:
    names = (f"blobs/{etag}.incomplete", *(f".cmh/partial/{etag}.{n}" for n in (
        "chunks", "chunks.log", "assembly", "assembly.log")))  # fmt: skip
    return [layout.path / n for n in names if (layout.path / n).exists()]


def test_partials_of_a_blob_that_is_complete_and_checked_are_discarded(toy):
    """A blob another try completed (stock, another process) leaves nothing to resume:
    the resolver that finds it checked removes its partials."""
    res = toy.resolve()
    etag = toy.published(res.commit)
    for name in (f"blobs/{etag}.incomplete", f".cmh/partial/{etag}.chunks",
                 f".cmh/partial/{etag}.chunks.log", f".cmh/partial/{etag}.assembly"):  # fmt: skip
        (toy.layout.path / name).parent.mkdir(parents=True, exist_ok=True)
        (toy.layout.path / name).write_bytes(b"left over")
    again = toy.resolve(policy=hub.Policy(revalidate=True))
    assert again.state is hub.State.FRESH
    assert _partials(toy.layout, etag) == []


@pytest.mark.parametrize("connections", [1, 2])
def test_a_download_refused_before_its_first_byte_leaves_no_empty_partial(toy, connections):
    """An answer that ends the download before any byte (here a 403 on the file) leaves no
    0-byte partial "for resuming": there is nothing to resume."""
    toy.proxy.fail(f"/resolve/{toy.commits[1]}/{WEIGHTS}", 403, 100, {})
    policy = hub.Policy(connections=connections, chunk_bytes=1 << 20)
    with pytest.raises(hub.AccessError):
        toy.resolve(policy=policy)
    etag = toy.published(toy.commits[1])
    assert _partials(toy.layout, etag) == []


def test_a_commit_the_hub_named_but_whose_files_failed_is_not_served_stale(toy):
    """spec/resolver.md §3: stale-if-error is for a Hub that could not be asked. Once the
    Hub named a new commit, files that cannot be fetched are an error that says so (exit
    3 for ``cmh pull``), not the old snapshot "without the Hub"."""
    c1 = toy.resolve().commit
    c2 = toy.publish(2)
    toy.proxy.fail(f"/resolve/{c2}/", 503, 1000, {})
    with pytest.raises(hub.HubUnreachableError, match=f"the Hub named commit {c2[:12]}"):
        toy.resolve(policy=hub.Policy(revalidate=True))
    run = toy.pull("--revalidate", "--json")
    assert run.exit_code == 3, run.output
    doc = run.json()
    assert doc["error_kind"] == "unreachable" and f"named commit {c2[:12]}" in doc["error"]
    assert toy.layout.read_ref("main") == c1  # the old snapshot is still there, untouched


def test_answers_that_keep_failing_are_named_not_called_no_answer(toy):
    """Failed answers that use up the retries before ``HF_HUB_ETAG_TIMEOUT`` from the
    process's start passed are reported by the last error, not as "no answer within"."""
    toy.proxy.fail("/revision/", 503, 1000, {})
    started = hub.Policy().clock.monotonic()
    with pytest.raises(hub.HubUnreachableError) as caught:
        toy.resolve(policy=hub.Policy(started=started))
    message = str(caught.value)
    assert "no answer within" not in message and "503" in message, message


def test_refused_connection_is_not_retried(toy):
    """No connection at all (offline, Hub down): no retries, the cache answers at once."""
    toy.resolve()
    nobody = socket.socket()  # a port nothing listens on: connections are refused
    nobody.bind(("127.0.0.1", 0))
    port = nobody.getsockname()[1]
    nobody.close()
    res = toy.resolve(endpoint=f"http://127.0.0.1:{port}", policy=hub.Policy(revalidate=True))
    assert res.state is hub.State.STALE_OFFLINE and res.requests == 1


def test_transient_errors_on_the_api_are_retried(toy):
    toy.proxy.fail("/revision/", 500, 1)
    toy.proxy.fail("/revision/", 429, 1, {"Retry-After": "1"})
    res = toy.resolve()
    assert res.state is hub.State.MISSING and not res.warnings
    gaps = _gaps_after(toy.proxy.requests("/revision/"), 429)
    assert len(gaps) == 1 and gaps[0] >= 0.95, gaps


# -- item 4: stalls -------------------------------------------------------------------------

STALL_SECONDS = 20.0


def test_stalled_transfer_is_detected_within_the_download_timeout(toy, monkeypatch):
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
    toy.proxy.stall(WEIGHTS, after=1 << 20, seconds=STALL_SECONDS)
    res = toy.resolve()
    assert toy.snapshot_sha(res.commit) == toy.published(res.commit)
    stall = toy.proxy.stalls_done[0]
    assert stall.started is not None
    resumed = [s for s in toy.proxy.requests(WEIGHTS, "GET") if s.at > stall.started and s.range]
    # A client that waited the stall out would have had the rest on its first GET: a GET
    # with Range after the stall began shows it gave up on it (no wall-time bound: load).
    assert resumed, "the download resumed with a Range request"


# -- item 5: disk full -------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Any:
    path.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def partials(cache: Path) -> list[Path]:
    return [
        p
        for p in cache.rglob("*")
        if p.name.endswith((".incomplete", ".assembly")) or ".cmh-tmp" in p.name
    ]


def test_disk_full_is_a_typed_error_on_a_real_full_filesystem(toy):
    """A 5 MiB tmpfs holds v1 (3 MiB) but not v2 (4 MiB): typed error, partial removed."""
    with tmpfs(toy.tmp / "small", 5 << 20) as small:
        toy.cache = small / "cache"
        toy.layout = RepoLayout(toy.cache, toy.repo)
        c1 = toy.resolve().commit
        c2 = toy.publish(2, elems=128_000, changed=tuple(range(8)))
        before = shutil.disk_usage(small).used
        run = toy.pull("--revalidate", "--json")
        assert run.exit_code == 3, (run.exit_code, run.stdout, run.stderr)
        doc = run.json()
        assert doc["ok"] is False and doc["error_kind"] == "disk_full", doc
        assert doc["exit_status"] == 3 and doc["command"] == "pull"
        assert "space" in doc["error"].lower()
        assert partials(toy.cache) == []
        assert shutil.disk_usage(small).used <= before + (256 << 10)
        assert toy.layout.read_ref("main") == c1
        assert toy.snapshot_sha(c1) == toy.published(c1)
        assert not toy.layout.snapshot_file(c2, WEIGHTS).exists()
        text = toy.pull("--revalidate")
        assert text.exit_code == 3 and text.stderr.count("error:") == 1, text.stderr


def _limit_file_size(limit: int) -> Any:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_file_size_limit_is_a_typed_error(toy):
    """RLIMIT_FSIZE (EFBIG) on a whole download, in a subprocess: same contract as disk full."""
    c1 = toy.resolve().commit
    c2 = toy.publish(2, stamp=False, elems=160_000)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    proc = subprocess.run(
        [str(CMH), "pull", toy.repo, "--cache-dir", str(toy.cache), "--endpoint", toy.proxy.url,
         "--revalidate", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
        preexec_fn=_limit_file_size(4 << 20),
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["error_kind"] == "disk_full", doc
    assert partials(toy.cache) == []
    assert toy.layout.read_ref("main") == c1
    assert toy.snapshot_sha(c1) == toy.published(c1)
    assert not toy.layout.snapshot_file(c2, WEIGHTS).exists()


# -- item 6: threads ---------------------------------------------------------------------------


def test_three_threads_resolve_one_repo_in_one_process(toy):
    for round_ in range(4):
        toy.cache = toy.tmp / f"cache-threads-{round_}"
        toy.layout = RepoLayout(toy.cache, toy.repo)
        barrier = threading.Barrier(3)
        outcomes: list[Any] = [None] * 3

        def run(
            i: int, barrier: threading.Barrier = barrier, outcomes: list[Any] = outcomes
        ) -> None:
            barrier.wait()
            try:
                outcomes[i] = toy.resolve().commit
            except Exception as exc:  # the test reports any failure, typed or not
                outcomes[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert outcomes == [toy.commits[1]] * 3, outcomes
        assert toy.snapshot_sha(toy.commits[1]) == toy.published(toy.commits[1])


def test_three_threads_under_install_never_fall_back_to_stock(toy):
    assert hub.install(window=0.0)
    hf_hub_download = huggingface_hub.hf_hub_download  # the wrapper, looked up after install()
    assert hasattr(hf_hub_download, "__cmh_original__")
    try:
        for round_ in range(3):
            cache = toy.tmp / f"cache-install-{round_}"
            barrier = threading.Barrier(3)
            outcomes: list[Any] = [None] * 3

            def run(
                i: int,
                cache: Path = cache,
                barrier: threading.Barrier = barrier,
                outcomes: list[Any] = outcomes,
            ) -> None:
                barrier.wait()
                try:
                    outcomes[i] = hf_hub_download(
                        toy.repo, WEIGHTS, cache_dir=str(cache), endpoint=toy.proxy.url
                    )
                except Exception as exc:
                    outcomes[i] = exc

            threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert all(isinstance(o, str) for o in outcomes), outcomes
    finally:
        hub.uninstall()
    agents = {s.user_agent or "" for s in toy.proxy.seen}
    assert all(a.startswith("cmh/") for a in agents), agents  # no stock fallback request


# -- item 7: token=False ----------------------------------------------------------------------


def test_token_false_sends_no_token(toy, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_environment_token_must_not_leak")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert hub.install()
    # The wrappers, looked up after install() as code imported later gets them.
    hf_hub_download = huggingface_hub.hf_hub_download
    snapshot_download = huggingface_hub.snapshot_download
    assert hasattr(hf_hub_download, "__cmh_original__")
    try:
        hf_hub_download(
            toy.repo, "config.json", cache_dir=str(toy.cache), endpoint=toy.proxy.url, token=False
        )
        snapshot_download(
            toy.repo, cache_dir=str(toy.tmp / "c2"), endpoint=toy.proxy.url, token=False
        )
        refused = list(toy.proxy.seen)
        hf_hub_download(
            toy.repo, "README.md", cache_dir=str(toy.tmp / "c3"), endpoint=toy.proxy.url,
            token="hf_given_token",
        )  # fmt: skip
    finally:
        hub.uninstall()
    given = [s for s in toy.proxy.seen[len(refused) :] if s.authorization]
    before_direct = len(toy.proxy.seen)
    hub.resolve(toy.repo, cache_dir=toy.tmp / "c4", endpoint=toy.proxy.url, token=False)
    direct = toy.proxy.seen[before_direct:]
    assert refused and all(s.authorization is None for s in refused), refused
    assert given and given[0].authorization == "Bearer hf_given_token"  # the recorder works
    assert direct and all(s.authorization is None for s in direct), direct


# -- item 8: strict decides first -----------------------------------------------------------


def test_strict_refusal_leaves_ref_and_validation_unchanged(toy):
    c1 = toy.resolve().commit
    validation = toy.layout.path / ".cmh" / "validated" / "main.json"
    recorded = validation.read_bytes()
    src = write_checkpoint_repo(toy.tmp / "v2", 2, stamp=False)
    cmh.stamp(src / WEIGHTS, ttl="1d", now=1_700_000_000)  # expired long ago
    add_folder(toy.store, src, toy.repo)
    with pytest.raises(hub.PolicyError):
        toy.resolve(policy=hub.Policy(strict=True, revalidate=True))
    assert toy.layout.read_ref("main") == c1
    assert validation.read_bytes() == recorded
    offline = toy.resolve(policy=hub.Policy(offline=True))
    assert offline.commit == c1


# -- item 9: warnings once, and only when true ---------------------------------------------


def test_warning_is_printed_once(toy):
    toy.resolve()
    toy.proxy.fail("/revision/", 503, 50)  # the Hub stays down for this run
    env = {"HF_HUB_OFFLINE": None}
    args = ["pull", toy.repo, "--cache-dir", toy.cache, "--endpoint", toy.proxy.url, "--revalidate"]
    run = run_subprocess(args, env=env)
    assert run.exit_code == 0, run.stderr
    assert run.stderr.count("stale snapshot") == 1, run.stderr


def test_pinned_commit_of_unstamped_repo_has_no_expiry_warning(tmp_path, mirror_server_factory):
    store, cache = tmp_path / "store", tmp_path / "cache"
    commit = add_folder(store, write_checkpoint_repo(tmp_path / "v1", 1, stamp=False), REPO).commit
    server = mirror_server_factory(store)
    first = hub.resolve(REPO, commit, cache_dir=cache, endpoint=server.url)
    again = hub.resolve(REPO, commit, cache_dir=cache, endpoint=server.url)
    assert again.state is hub.State.LOCAL_ONLY
    assert first.warnings == () and again.warnings == ()
    run = run_subprocess(
        ["pull", REPO, "--revision", commit, "--cache-dir", cache, "--endpoint", server.url],
        env={"HF_HUB_OFFLINE": None},
    )
    assert run.exit_code == 0 and "expiry" not in run.stderr, run.stderr


def test_pinned_commit_past_its_stamp_warns_once(tmp_path, mirror_server_factory):
    store, cache = tmp_path / "store", tmp_path / "cache"
    src = write_checkpoint_repo(tmp_path / "v1", 1, stamp=False)
    cmh.stamp(src / WEIGHTS, ttl="1d", now=1_700_000_000)
    commit = add_folder(store, src, REPO).commit
    server = mirror_server_factory(store)
    hub.resolve(REPO, commit, cache_dir=cache, endpoint=server.url)
    run = run_subprocess(
        ["pull", REPO, "--revision", commit, "--cache-dir", cache, "--endpoint", server.url],
        env={"HF_HUB_OFFLINE": None},
    )
    assert run.exit_code == 0, run.stderr
    assert run.stderr.count("past its CMH expiry") == 1, run.stderr


# -- item 10: headers the format library cannot encode ---------------------------------------


def hostile_weights(path: Path, kind: str) -> None:
    """A stamped file whose header was then edited to hold what no encoder accepts.

    ``too_short`` and ``not_json`` are plainer invalid files: no reader accepts them either.
    """
    if kind == "too_short":
        path.write_bytes(b"\x05\x00\x00")
        return
    if kind == "not_json":
        path.write_bytes(struct.pack("<Q", 8) + b"not json" + b"\0" * 64)
        return
    save_file(
        {
            "a": np.zeros(4, np.float32),
            "b": np.ones(4, np.float32),
            "z": np.zeros((0, 4), np.float32),
        },
        str(path),
    )
    cmh.stamp(path, ttl="30d")
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    if kind == "surrogate_name":
        header["a\ud800"] = header.pop("a")
    elif kind == "surrogate_metadata":
        header["__metadata__"]["note"] = "v\ud800"
    else:
        header["z"]["shape"] = [0, 2**64]
    text = json.dumps(header).encode()  # ensure_ascii: the surrogate is written as \ud800
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


@pytest.mark.parametrize(
    "kind", ["surrogate_name", "surrogate_metadata", "huge_dimension", "too_short", "not_json"]
)
def test_pull_of_a_file_with_an_unencodable_header_is_invalid_file(toy, kind):
    c1 = toy.resolve().commit
    src = write_checkpoint_repo(toy.tmp / f"bad-{kind}", 1)
    hostile_weights(src / WEIGHTS, kind)
    bad = add_folder(toy.store, src, toy.repo).commit
    blobs_before = sorted(p.name for p in toy.layout.blobs.iterdir())
    run = toy.pull("--revalidate", "--json")
    assert run.exit_code == 3, (run.exit_code, run.stdout, run.stderr)
    doc = run.json()
    assert doc["ok"] is False and doc["error_kind"] == "invalid_file", doc
    assert toy.layout.read_ref("main") == c1
    assert toy.snapshot_sha(c1) == toy.published(c1)
    assert not toy.layout.snapshot_dir(bad).exists()
    assert sorted(p.name for p in toy.layout.blobs.iterdir()) == blobs_before
    assert partials(toy.cache) == []
    text = toy.pull("--revalidate")
    assert text.exit_code == 3 and "Traceback" not in text.stderr


def test_pull_of_an_unencodable_header_on_a_fresh_cache(toy):
    src = write_checkpoint_repo(toy.tmp / "bad", 1)
    hostile_weights(src / WEIGHTS, "surrogate_name")
    bad = add_folder(toy.store, src, toy.repo).commit
    run = toy.pull("--json")
    assert run.exit_code == 3, (run.exit_code, run.stdout, run.stderr)
    assert run.json()["error_kind"] == "invalid_file"
    assert toy.layout.read_ref("main") is None
    assert not toy.layout.snapshot_file(bad, WEIGHTS).exists()


# -- the same faults through a Hub-shaped front (302 to a CDN, signed URLs) ------------------


def test_listing_lie_is_caught_through_the_hubs_cdn_redirect(toy):
    """Item 1a where LFS ``resolve`` answers are 302s to a CDN: the 302's headers confirm."""
    from hublike import running

    # xet_listing off: cmh still refuses tree entries that carry xetHash (not this issue).
    with running(toy.server.url, xet_listing=False) as front:
        c1 = hub.resolve(toy.repo, cache_dir=toy.cache, endpoint=front.url).commit
        c2 = toy.publish(2)
        old = toy.sources[c1] / WEIGHTS

        def lie(kind: str, path: str, doc: Any) -> Any:
            if kind == "repo_info":
                doc = siblings_rewrite(WEIGHTS, sha256=sha256(old), size=old.stat().st_size)(doc)
            return doc

        front.edit_json = lie
        res = hub.resolve(
            toy.repo, cache_dir=toy.cache, endpoint=front.url, policy=hub.Policy(revalidate=True)
        )
        heads = front.records(origin="hub", method="HEAD", path=f"/resolve/{c2}/{WEIGHTS}")
        cdn_heads = front.records(origin="cdn", method="HEAD")
    assert res.commit == c2 and toy.snapshot_sha(c2) == toy.published(c2)
    assert [r.status for r in heads] == [302]  # confirmed from the redirect's own headers
    assert cdn_heads == []


def test_stall_at_the_cdn_is_detected_and_resumed(toy, monkeypatch):
    from hublike import running

    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
    with running(toy.server.url) as front:
        front.stall(1 << 20, STALL_SECONDS, origin="cdn")
        res = hub.resolve(toy.repo, cache_dir=toy.cache, endpoint=front.url)
        gets = front.records(origin="cdn", method="GET")
    assert toy.snapshot_sha(res.commit) == toy.published(res.commit)
    # A client that waited the stall out would have had the whole body on its first GET;
    # a GET with Range shows it gave up on the stalled body (no wall-time bound: load).
    assert any("range" in r.headers for r in gets), "the download resumed with Range"
