"""Pruning in a loop while 4 processes resolve and read the same repos: no reader ever
sees a missing or wrong file, and the pruner really deletes (what no reader holds).

Readers follow the documented protocol (``tests/hub/prune_reader.py``): resolve
with ``cmh.hub.resolve`` against a real ``cmh serve`` on 127.0.0.1, then hold
the snapshot (shared revision lock) while reading it. The pruner evicts as hard
as it can: ``--max-size 0`` with no grace for leftovers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cmh.hub.mirror import add_folder
from cmh.hub.prune._execute import execute_plan
from cmh.hub.prune._plan import PrunePolicy, plan_prune
from cmh.hub.prune._scan import scan_cache
from mirror_support import write_tiny_repo
from prune_support import stock_warnings
from resolver_support import write_checkpoint_repo

READERS = 4
SECONDS = 8.0
MIN_READS = 6  # each reader's loop, however long a busy machine makes it take
READER = Path(__file__).with_name("prune_reader.py")


@pytest.mark.slow
def test_prune_loop_never_pulls_a_file_from_under_a_reader(
    tmp_path: Path, mirror_server_factory
) -> None:
    store = tmp_path / "store"
    for version, revision in ((1, "v1"), (2, "main")):
        tiny = write_tiny_repo(tmp_path / f"tiny{version}", version)
        add_folder(store, tiny, "org/tiny", revision=revision)
        src = write_checkpoint_repo(tmp_path / f"toy{version}", version, elems=20_000, ttl="1h")
        add_folder(store, src, "org/toy", revision=revision)
    server = mirror_server_factory(store)
    cache = tmp_path / "cache"
    targets = ["org/tiny@main", "org/tiny@v1", "org/toy@main", "org/toy@v1"]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")}
    readers = [
        subprocess.Popen(
            [
                sys.executable,
                str(READER),
                str(cache),
                server.url,
                str(SECONDS),
                str(MIN_READS),
                str(seed),
                *targets,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for seed in range(READERS)
    ]
    policy = PrunePolicy(max_size=0, in_flight_grace=0, stale_incomplete=0)
    removed = passes = in_use = busy = 0
    try:
        while any(r.poll() is None for r in readers):
            if cache.is_dir():
                report = execute_plan(
                    plan_prune(scan_cache(cache), policy, time.time()), lock_timeout=0.2
                )
                assert not report.all_errors, report.all_errors
                removed += sum(len(o.revisions) for o in report.repos)
                in_use += sum(len(o.kept_in_use) for o in report.repos)
                busy += len(report.skipped)
                passes += 1
            time.sleep(0.01)
        results = []
        for r in readers:
            out, err = r.communicate(timeout=60)
            assert r.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for r in readers:
            if r.poll() is None:
                r.kill()
                r.wait()
    failures = [f for res in results for f in res["failures"]]
    assert failures == []
    assert all(res["reads"] >= MIN_READS for res in results), results
    # The pruner did real work while readers ran, and met readers holding revisions.
    assert passes > 10 and removed > 5, (passes, removed)
    assert in_use + busy > 0
    print(f"passes={passes} removed={removed} in_use={in_use} busy={busy} reads="
          f"{[r['reads'] for r in results]}")  # fmt: skip
    assert stock_warnings(cache) == []
