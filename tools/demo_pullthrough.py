"""`make demo`, pull-through step: a second mirror in front of the first one.

An empty store served with ``cmh serve --upstream URL`` (the demo's mirror as
its upstream) is asked for the model by the stock client twice, from two
empty caches: the first load fills the pull-through store from the upstream,
the second costs the upstream nothing. The upstream counters come from the
pull-through mirror's ``/metrics``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.request import Request, urlopen

from demo_mirror import serving
from mirror_support import hf_env  # tests/hub is on the path (demo_mirror)

CLIENT = r"""
import hashlib, json, os
from huggingface_hub import snapshot_download
snap = snapshot_download(os.environ["DEMO_REPO"])
weights = os.path.join(snap, "model.safetensors")
print(json.dumps({"sha256": hashlib.sha256(open(weights, "rb").read()).hexdigest()}))
"""


def _upstream_counters(url: str) -> tuple[float, float]:
    text = urlopen(f"{url}/metrics", timeout=10).read().decode()
    values = {}
    for name in ("cmh_mirror_upstream_requests_total", "cmh_mirror_upstream_bytes_total"):
        match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
        values[name] = float(match.group(1)) if match else 0.0
    return values["cmh_mirror_upstream_requests_total"], values["cmh_mirror_upstream_bytes_total"]


def _load(url: str, home: Path, repo: str) -> str:
    env = {**hf_env(url, home), "DEMO_REPO": repo}
    proc = subprocess.run([sys.executable, "-c", CLIENT], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"FAILED: the stock client could not load {repo}:\n{proc.stderr[-2000:]}")
    return str(json.loads(proc.stdout.strip().splitlines()[-1])["sha256"])


def run(work_dir: Path, upstream: str, repo: str) -> None:
    """Serve ``repo`` through a pull-through mirror of ``upstream``; print what it cost."""
    store = work_dir / "pull-store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    head = Request(f"{upstream}/{repo}/resolve/main/model.safetensors", method="HEAD")
    with urlopen(head, timeout=10) as answer:  # the upstream's SHA-256 ETag of the weights
        expected = answer.headers["X-Linked-Etag"].strip('"')
    extra = ("--upstream", upstream, "--fresh-for", "10m")
    with serving(store, work_dir / "pull-access.log", extra) as url:
        for n, home in enumerate(("pull-client-1", "pull-client-2"), 1):
            before = _upstream_counters(url)
            got = _load(url, work_dir / home, repo)
            after = _upstream_counters(url)
            requests, nbytes = after[0] - before[0], after[1] - before[1]
            print(
                f"client {n}: weights bit-identical: {got == expected}; "
                f"upstream requests {requests:.0f}, upstream bytes {nbytes:,.0f}"
            )
            if got != expected:
                raise SystemExit("FAILED: the pull-through mirror served other bytes")
            if n == 2 and requests:
                raise SystemExit("FAILED: the second client cost the upstream requests")
