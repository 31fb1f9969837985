"""The rows of the drop-in matrix, run in a fresh interpreter (``python dropin_rows.py CONFIG``).

CONFIG is a JSON document: ``repos`` (row inputs: ``model``, ``adapter``,
``parquet``, ``csv`` as repo ids, or as local folders for the reference run),
``rows`` (names to run), ``cache_dir`` (optional: a cache folder every row
that takes one names, as ``cache_dir=`` or ``cache_folder=``), ``install``
(call ``cmh.hub.install()`` first),
``marker`` (a URL prefix: ``GET {marker}?sync=row-NAME`` is sent before each
row and ``?sync=done`` after the last, so the caller can split its request
log by row; ``marker`` may carry a query of its own). Prints one JSON document:
``{row: {"output": sha256} or {"error": text}}``. Each output is a SHA-256 over
what the library loaded (tensor bytes, token ids, rows, file bytes): equal outputs
are bit-identical loads. The environment (``HF_HOME``, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``)
comes from the caller.

``python dropin_rows.py --zygote`` is a fork server for the matrix: it imports
the heavy libraries that read nothing of the environment a run sets (PRELOAD:
torch, scikit-learn, pandas, pyarrow...; ~70% of a run's import time) and none
of those that do (FRESH: huggingface_hub, transformers, datasets,
sentence-transformers, peft, cmh), then for each request line on stdin
(``{"config": CONFIG, "env": {...}, "out": PATH}``) forks a child that takes
exactly that environment and runs CONFIG as ``dropin_rows.py CONFIG`` would,
its output in PATH, and answers ``{"out": PATH, "status": N}``. Everything the
drop-in is about is imported fresh in each child.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import json
import os
import subprocess
import sys
import threading
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

TEXTS = ["cheap fresh weights", "a drop-in without surprises"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tensor_sha(tensor: Any) -> str:
    return _sha(tensor.detach().cpu().contiguous().numpy().tobytes())


def _tree_sha(folder: Path) -> str:
    """Every file under ``folder`` (names and bytes), stock ``.cache`` folders left out."""
    files = sorted(
        p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.relative_to(folder).parts
    )
    return _sha(
        json.dumps({p.relative_to(folder).as_posix(): _sha(p.read_bytes()) for p in files}).encode()
    )


def _is_local(name: str) -> bool:
    return os.path.isdir(name)


def _cache(r: dict[str, str], name: str = "cache_dir") -> dict[str, str]:
    """The row's cache folder argument (none for local folders or the default cache)."""
    return {name: r["cache_dir"]} if r.get("cache_dir") and not _is_local(r["model"]) else {}


def row_config(r: dict[str, str]) -> str:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(r["model"], **_cache(r)).to_dict()
    config.pop("_name_or_path", None)
    return _sha(json.dumps(config, sort_keys=True, default=str).encode())


def row_tokenizer(r: dict[str, str]) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(r["model"], **_cache(r))
    return _sha(json.dumps(tok(TEXTS)["input_ids"]).encode())


def _embed(model: Any, name: str, r: dict[str, str]) -> str:
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name, **_cache(r))
    with torch.no_grad():
        out = model(**tok(TEXTS, return_tensors="pt", padding=True)).last_hidden_state
    return _tensor_sha(out)


def row_model(r: dict[str, str]) -> str:
    from transformers import AutoModel

    return _embed(AutoModel.from_pretrained(r["model"], **_cache(r)), r["model"], r)


def row_pipeline(r: dict[str, str]) -> str:
    import numpy as np
    from transformers import pipeline

    # The task is given: without it transformers reads the repo info and refuses a model whose
    # library_name is sentence-transformers (as it does on huggingface.co for this model).
    kwargs = {"model_kwargs": _cache(r)} if _cache(r) else {}
    out = pipeline("feature-extraction", model=r["model"], **kwargs)(TEXTS[0])
    return _sha(np.asarray(out, dtype=np.float32).tobytes())


def row_sentence_transformers(r: dict[str, str]) -> str:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(r["model"], device="cpu", **_cache(r, "cache_folder"))
    return _sha(model.encode(TEXTS).tobytes())


def _dataset_sha(name: str, kind: str) -> str:
    from datasets import load_dataset

    if _is_local(name):
        files = sorted(str(p) for p in Path(name).rglob(f"*.{kind}"))
        ds = load_dataset(kind, data_files=files, split="train")
    else:
        ds = load_dataset(name, split="train")
    return _sha(json.dumps(ds.to_list(), sort_keys=True).encode())


def row_datasets_parquet(r: dict[str, str]) -> str:
    return _dataset_sha(r["parquet"], "parquet")


def row_datasets_csv(r: dict[str, str]) -> str:
    return _dataset_sha(r["csv"], "csv")


def row_peft(r: dict[str, str]) -> str:
    from peft import PeftModel
    from transformers import AutoModel

    base = AutoModel.from_pretrained(r["model"], **_cache(r))
    return _embed(PeftModel.from_pretrained(base, r["adapter"], **_cache(r)), r["model"], r)


def row_hf_hub_download(r: dict[str, str]) -> str:
    if _is_local(r["model"]):
        return _sha((Path(r["model"]) / "config.json").read_bytes())
    from huggingface_hub import hf_hub_download

    return _sha(Path(hf_hub_download(r["model"], "config.json", **_cache(r))).read_bytes())


def row_snapshot_download(r: dict[str, str]) -> str:
    if _is_local(r["model"]):
        return _tree_sha(Path(r["model"]))
    from huggingface_hub import snapshot_download

    return _tree_sha(Path(snapshot_download(r["model"], **_cache(r))))


def row_hffs(r: dict[str, str]) -> str:
    if _is_local(r["model"]):
        return _sha((Path(r["model"]) / "tokenizer_config.json").read_bytes())
    from huggingface_hub import HfFileSystem

    return _sha(HfFileSystem().read_bytes(f"{r['model']}/tokenizer_config.json"))


def row_hf_cli(r: dict[str, str]) -> str:
    if _is_local(r["model"]):
        return _tree_sha(Path(r["model"]))
    hf = Path(sys.executable).parent / "hf"
    proc = subprocess.run(
        [str(hf), "download", "--quiet", r["model"], *_cache_args(r)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hf download failed: {proc.stderr[-2000:]}")
    return _tree_sha(Path(proc.stdout.strip().splitlines()[-1]))


def _cache_args(r: dict[str, str]) -> list[str]:
    return ["--cache-dir", r["cache_dir"]] if _cache(r) else []


ROWS: dict[str, Callable[[dict[str, str]], str]] = {
    "AutoConfig": row_config,
    "AutoTokenizer": row_tokenizer,
    "AutoModel": row_model,
    "pipeline": row_pipeline,
    "SentenceTransformer": row_sentence_transformers,
    "load_dataset parquet": row_datasets_parquet,
    "load_dataset csv": row_datasets_csv,
    "PeftModel": row_peft,
    "hf_hub_download": row_hf_hub_download,
    "snapshot_download": row_snapshot_download,
    "HfFileSystem": row_hffs,
    "hf download": row_hf_cli,
}


def run(config: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The rows of one CONFIG, in order; ``{row: {"output": sha256} or {"error": text}}``."""

    def mark(name: str) -> None:
        if config.get("marker"):
            joiner = "&" if "?" in config["marker"] else "?"
            url = f"{config['marker']}{joiner}sync={quote(name, safe='')}"
            urllib.request.urlopen(url, timeout=30).read()

    results: dict[str, dict[str, str]] = {}
    for name in config["rows"]:
        mark(f"row-{name}")
        try:
            repos = dict(config["repos"], cache_dir=config.get("cache_dir") or "")
            results[name] = {"output": ROWS[name](repos)}
        except Exception as exc:  # reported per cell; the caller asserts
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            traceback.print_exc()
    mark("done")
    return results


def main() -> None:
    """One CONFIG, or ``{"batches": [CONFIG, ...]}`` run one after the other in this
    interpreter (for runs that share no process state: local folders, offline)."""
    config = json.loads(sys.argv[1])
    if config.get("install"):
        import cmh.hub

        assert cmh.hub.install()
    if "batches" in config:
        print(json.dumps([run(batch) for batch in config["batches"]]))
    else:
        print(json.dumps(run(config)))


#: Imported once by the zygote: heavy, and reading nothing of the environment a run sets.
PRELOAD = (
    "numpy", "torch", "scipy", "scipy.sparse", "sklearn", "sklearn.metrics", "pandas",
    "pyarrow", "pyarrow.parquet", "tokenizers", "safetensors", "safetensors.torch",
)  # fmt: skip
#: Never imported by the zygote: they read the environment (HF_HOME, HF_ENDPOINT,
#: HF_HUB_OFFLINE...) or hold per-process state the phases are about.
FRESH = (
    "huggingface_hub", "transformers", "datasets", "sentence_transformers", "peft", "cmh",
    "fsspec", "httpx", "httpx2",
)  # fmt: skip


def zygote() -> None:
    """The fork server (module docstring); ends at the end of stdin."""
    for name in PRELOAD:
        importlib.import_module(name)
    leaked = sorted(m for m in FRESH if m in sys.modules)
    if leaked:
        raise SystemExit(f"zygote: {leaked} imported with the preloaded libraries")
    lock = threading.Lock()
    out = sys.stdout

    def wait(pid: int, path: str) -> None:
        _, status = os.waitpid(pid, 0)
        with lock:
            out.write(json.dumps({"out": path, "status": os.waitstatus_to_exitcode(status)}) + "\n")
            out.flush()

    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()  # from the main thread only: the waiters hold no lock a child needs
        if pid == 0:
            _child(job)
        threading.Thread(target=wait, args=(pid, job["out"]), daemon=True).start()


def _child(job: dict[str, Any]) -> None:
    code = 1
    try:
        fd = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (fresh: no lock of the parent)
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        sys.stdin = open(os.devnull)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(job["env"])
        sys.argv = [__file__, json.dumps(job["config"])]
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # as an interpreter's exit runs them
        with contextlib.suppress(BaseException):
            sys.stderr.flush()  # first: the answer is the output's last line
            sys.stdout.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        main()
