"""How ``cmh prune --dry-run`` scales from 1,000 to 10,000 revisions, in one run.

Builds (or reuses) stores in bench-work/ in the stock layout: repos of 10
revisions each, every revision a config.json shared within the repo, a
README and its own stamped model.safetensors (lifetimes from 1 hour to 60
days, stamped up to 30 days ago), refs ``main`` and ``v1`` on the two newest,
and usage records on half of them. Then measures, warm, best of ``--repeat``:

- baseline: the stock ``huggingface_hub.scan_cache_dir`` of the same store;
- cmh scan (``scan_cache`` with the stamped headers read) and plan
  (``plan_prune`` with every policy on) in this process;
- the whole command, ``cmh prune --store S --dry-run --json`` with every
  policy, as a subprocess (interpreter start-up included).

Prints each figure, its ratio against the stock scan of the same store, and
the scaling 1,000 -> 10,000 as ratios. Usage:
``python bench/prune.py [--sizes 1000,10000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
from _timing import best_of
from cmh.hub.cache import RepoLayout
from cmh.hub.prune import PrunePolicy, plan_prune, scan_cache
from safetensors.numpy import save_file

import cmh

WORK = Path(__file__).resolve().parent.parent / "bench-work"
PER_REPO = 10
DAY = 86400
TEMPLATES = 64
POLICY_ARGS = [
    "--expired", "--unreferenced", "--keep-latest", "3", "--older-than", "30d",
    "--max-size", "5MB",
]  # fmt: skip


def stamped_templates(now: float) -> list[bytes]:
    """Small stamped safetensors files with varied lifetimes and stamp times."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        for i in range(TEMPLATES):
            rng = np.random.default_rng(i)
            save_file(
                {f"layer.{j}.weight": rng.standard_normal(64).astype(np.float32) for j in range(4)},
                str(path),
            )
            ttl = [3600, 7 * DAY, 30 * DAY, 60 * DAY][i % 4]
            cmh.stamp(path, ttl=ttl, now=now - (i % 30) * DAY)
            out.append(path.read_bytes())
    return out


def build_store(root: Path, revisions: int) -> None:
    """A store of ``revisions`` revisions (see module docstring)."""
    marker = root.with_name(root.name + ".complete")
    if marker.exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    now = time.time()
    templates = stamped_templates(now)
    for r in range(revisions // PER_REPO):
        repo = RepoLayout(root, f"bench/repo-{r:05d}")
        repo.blobs.mkdir(parents=True, exist_ok=True)
        config = f'{{"repo": {r}}}\n'.encode()
        config_etag = hashlib.sha1(config).hexdigest()
        (repo.blobs / config_etag).write_bytes(config)
        for v in range(PER_REPO):
            n = r * PER_REPO + v
            commit = hashlib.sha1(f"{r}:{v}".encode()).hexdigest()
            readme = f"# repo {r} revision {v}\n".encode()
            readme_etag = hashlib.sha1(readme).hexdigest()
            (repo.blobs / readme_etag).write_bytes(readme)
            weights = templates[n % TEMPLATES]
            # Distinct blob per revision (as distinct weights would be), same header cost.
            weights_etag = hashlib.sha256(weights + n.to_bytes(4, "little")).hexdigest()
            (repo.blobs / weights_etag).write_bytes(weights)
            for path, etag in (
                ("config.json", config_etag),
                ("README.md", readme_etag),
                ("model.safetensors", weights_etag),
            ):
                repo.link_snapshot_file(commit, path, etag)
            fetched = now - (PER_REPO - v) * 3 * DAY
            os.utime(repo.snapshot_dir(commit), (fetched, fetched))
            if v == PER_REPO - 1:
                repo.write_ref("main", commit)
            elif v == PER_REPO - 2:
                repo.write_ref("v1", commit)
            if v % 2:
                used = repo.cmh_dir / "used" / commit
                used.parent.mkdir(parents=True, exist_ok=True)
                used.touch()
                os.utime(used, (fetched + DAY, fetched + DAY))
    marker.touch()


def stock_scan(root: Path) -> None:
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(root)
    assert not info.warnings, info.warnings[:3]


def cmh_scan(root: Path) -> None:
    scan_cache(root, read_expiry=True, read_commit_times=True)


def cmh_plan(root: Path) -> None:
    scan = scan_cache(root, read_expiry=True, read_commit_times=True)
    policy = PrunePolicy(
        expired=True, unreferenced=True, keep_latest=3, older_than=30 * DAY, max_size=5_000_000
    )
    plan_prune(scan, policy)


def cmh_command(root: Path) -> dict[str, object]:
    cmd = [sys.executable, "-m", "cmh.cli.main", "prune", "--store", str(root), "--dry-run"]
    proc = subprocess.run([*cmd, *POLICY_ARGS, "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, object] = json.loads(proc.stdout)
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        root = WORK / f"prune-store-{n}"
        start = time.perf_counter()
        build_store(root, n)
        built = time.perf_counter() - start
        stock_scan(root)  # warm the page cache
        row = {
            "stock scan_cache_dir": best_of(args.repeat, partial(stock_scan, root)),
            "cmh scan (headers read)": best_of(args.repeat, partial(cmh_scan, root)),
            "cmh scan + plan": best_of(args.repeat, partial(cmh_plan, root)),
            "cmh prune --dry-run (process)": best_of(args.repeat, partial(cmh_command, root)),
        }
        doc = cmh_command(root)
        results[n] = row
        print(f"\n{n} revisions ({n // PER_REPO} repos; store built or reused in {built:.1f} s)")
        print(f"  plan: {doc['revisions']} revisions would go, {doc['freed']} bytes freed")
        base = row["stock scan_cache_dir"]
        for name, seconds in row.items():
            print(f"  {name:32s} {seconds:7.3f} s   x{seconds / base:5.2f} of stock scan")
    if len(sizes) >= 2:
        small, large = sizes[0], sizes[-1]
        print(f"\nscaling {small} -> {large} revisions (x{large / small:.0f} revisions):")
        for name in results[small]:
            ratio = results[large][name] / results[small][name]
            print(f"  {name:32s} x{ratio:5.2f}")
        whole = results[large]["cmh prune --dry-run (process)"]
        print(f"\ntarget: plans {large} revisions in seconds -> {whole:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
