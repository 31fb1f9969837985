"""A reader process for the prune concurrency test.

``python prune_reader.py CACHE ENDPOINT SECONDS MIN_READS SEED REPO@REV ...`` resolves
a random repo and revision with ``cmh.hub.hold`` in a loop (for SECONDS, and at least
MIN_READS times however busy the machine is), and reads every
file of the resolved snapshot while holding it against pruning. Each file
is checked against its blob name (SHA-256 or git blob SHA-1). Prints one JSON
line: reads, files, failures (each a missing or wrong file seen while held).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path


def content_matches(path: Path) -> bool:
    etag = os.path.basename(os.readlink(path))
    data = path.read_bytes()
    if len(etag) == 64:
        return hashlib.sha256(data).hexdigest() == etag
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == etag


def main() -> None:
    cache, endpoint, seconds, min_reads, seed, *targets = sys.argv[1:]
    import cmh.hub as hub

    rng = random.Random(int(seed))
    deadline = time.monotonic() + float(seconds)
    reads = files = 0
    failures: list[str] = []
    while time.monotonic() < deadline or reads < int(min_reads):
        repo_id, revision = rng.choice(targets).split("@")
        with hub.hold(repo_id, revision, cache_dir=cache, endpoint=endpoint) as res:
            # A pruner may run now, but not on this snapshot.
            folder = res.path
            for f in res.files:
                path = folder / f.path
                try:
                    if not content_matches(path):
                        failures.append(f"wrong bytes: {path}")
                except OSError as exc:
                    failures.append(f"{type(exc).__name__}: {path}")
                files += 1
                time.sleep(0.003)  # a loader takes its time: the pruner gets every chance
        reads += 1
        time.sleep(rng.random() * 0.02)
    print(json.dumps({"reads": reads, "files": files, "failures": failures}))


if __name__ == "__main__":
    main()
