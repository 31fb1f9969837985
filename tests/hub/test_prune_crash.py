"""A prune that dies at any point leaves a cache the stock scanner, the stock client and
the resolver's layout code still read, and a second prune finishes the job.

The executor reports each change on disk just before making it; the test stops
the process's prune there (an exception that nothing in the executor catches),
at every step in turn, on a fresh copy of the same cache.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import cmh.hub as hub
import pytest
from cmh.hub.cache import RepoLayout
from cmh.hub.prune._execute import execute_plan
from cmh.hub.prune._plan import PrunePolicy, plan_prune
from cmh.hub.prune._scan import scan_cache
from prune_support import (
    DAY,
    NOW,
    CacheBuilder,
    fake_commit,
    stock_revisions,
    stock_warnings,
    weights,
)

POLICY = PrunePolicy(expired=True, include_referenced=True, unreferenced=True)


class Crash(BaseException):
    """Stands for the process dying (not an error the executor may handle)."""


def build(root: Path) -> dict[str, str]:
    b = CacheBuilder(root)
    config = b'{"model_type": "toy"}\n'
    out = {
        "expired_main": b.revision(
            "org/a",
            {"config.json": config, "model.safetensors": weights(1, ttl=60, stamped_at=NOW - DAY)},
            ref="main",
            fetched=NOW - 3 * DAY,
        ),
        "live_v2": b.revision(
            "org/a",
            {"config.json": config, "model.safetensors": weights(2, ttl=30 * DAY)},
            ref="v2",
            fetched=NOW - 2 * DAY,
        ),
        "detached": b.revision("org/a", {"config.json": config, "x/y.bin": b"d" * 300}, ref=None),
        "only_b": b.revision(
            "org/b",
            {"model.safetensors": weights(3, ttl=60, stamped_at=NOW - DAY)},
            ref="main",
        ),
        "keep_c": b.revision("org/c", {"w.bin": b"c" * 100}, ref="refs/pr/1"),
    }
    b.file("models--org--a/blobs/" + "a" * 64, b"orphan", mtime=NOW - 2 * DAY)
    b.file("models--org--a/blobs/" + "b" * 64 + ".77.incomplete", b"part", mtime=NOW - 2 * DAY)
    b.file(f"models--org--a/.no_exist/{out['expired_main']}/adapter_config.json")
    b.ref("org/dangling", "main", fake_commit("never"))
    return out


def snapshot_contents(root: Path) -> dict[tuple[str, str, str], bytes]:
    """(repo, commit, path) -> bytes of every file of every snapshot the stock scanner accepts."""
    from huggingface_hub import scan_cache_dir

    out = {}
    for repo in scan_cache_dir(root).repos:
        for rev in repo.revisions:
            for f in rev.files:
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                out[(repo.repo_id, rev.commit_hash, rel)] = f.file_path.read_bytes()
    return out


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("crash") / "cache"
    return root, build(root)


def copy_of(original: Path, dest: Path) -> Path:
    shutil.copytree(original, dest, symlinks=True)
    return dest


def test_crash_at_every_step_leaves_a_readable_cache(
    original: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    source, commits = original
    before = snapshot_contents(source)
    warnings_before = stock_warnings(source)

    # The reference run: how many changes, and where an uninterrupted prune ends.
    steps: list[tuple[str, Path]] = []
    done = copy_of(source, tmp_path / "done")
    execute_plan(
        plan_prune(scan_cache(done), POLICY, NOW), on_change=lambda a, p: steps.append((a, p))
    )
    final = stock_revisions(done)
    assert final == {"org/a": {commits["live_v2"]}, "org/c": {commits["keep_c"]}}
    assert len(steps) >= 15
    assert [a for a, _ in steps].index("rename-snapshot") > [a for a, _ in steps].index(
        "unlink-ref"
    )

    for k in range(len(steps)):
        root = copy_of(source, tmp_path / f"crash-{k}")

        def die_at_k(action: str, path: Path, k: int = k, seen: list[int] = [0]) -> None:  # noqa: B006
            if seen[0] == k:
                raise Crash(f"{action} {path}")
            seen[0] += 1

        with pytest.raises(Crash):
            execute_plan(plan_prune(scan_cache(root), POLICY, NOW), on_change=die_at_k)

        # No new warning; every snapshot the stock scanner lists is whole and unchanged.
        assert set(stock_warnings(root)) <= {
            w.replace(str(source), str(root)) for w in warnings_before
        }, f"after step {k}: {steps[k]}"
        now = snapshot_contents(root)
        for key, data in now.items():
            assert before[key] == data, f"after step {k}, {key} changed"
        # What must survive did, and the stock client still resolves its refs offline.
        assert _complete(now, "org/a", commits["live_v2"], before)
        assert _complete(now, "org/c", commits["keep_c"], before)
        _stock_reads(root, "org/a", "v2", "model.safetensors")
        _stock_reads(root, "org/c", "refs/pr/1", "w.bin")
        assert RepoLayout(root, "org/a").read_ref("v2") == commits["live_v2"]
        res = hub.resolve("org/a", "v2", cache_dir=root, policy=hub.Policy(offline=True))
        assert res.commit == commits["live_v2"] and (res.path / "model.safetensors").is_file()

        # A second prune finishes the job.
        report = execute_plan(plan_prune(scan_cache(root), POLICY, NOW))
        assert not report.all_errors
        assert stock_revisions(root) == final
        assert stock_warnings(root) == []
        shutil.rmtree(root)


def _complete(now: dict, repo: str, commit: str, before: dict) -> bool:
    expected = {k for k in before if k[0] == repo and k[1] == commit}
    return bool(expected) and expected <= set(now)


def _stock_reads(root: Path, repo: str, revision: str, filename: str) -> None:
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo, filename, revision=revision, cache_dir=root, local_files_only=True)
    assert Path(path).stat().st_size > 0
