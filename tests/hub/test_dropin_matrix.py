"""The drop-in matrix (issue 13): real libraries, with and without ``install()``.

Rows (``dropin_rows.py``): transformers AutoConfig / AutoTokenizer / AutoModel /
pipeline, sentence-transformers, datasets ``load_dataset`` (parquet, csv), peft
``PeftModel.from_pretrained``, huggingface_hub ``hf_hub_download`` /
``snapshot_download`` / ``HfFileSystem``, the ``hf download`` CLI.

Columns: the cache folder (the default one of ``HF_HOME``, or one every row names
with ``cache_dir=``/``cache_folder=``/``--cache-dir``), the server (``cmh serve``,
or the Hub-faithful front over it: LFS
answered by a 302 to a signed CDN URL that serves one range only, ``xetHash``
in listings, tree pages of 3 entries), ``install()`` or stock, stamped or
unstamped model repos, and three phases run in fresh interpreters on one
cache: ``cold`` (empty cache, online), ``fresh`` (online again) and
``offline`` (``HF_HUB_OFFLINE=1``). Every cell must load exactly what loading
the local folder loads (a SHA-256 over tensors, token ids, rows or bytes), and
its requests are counted per row from the server's own log.

The dataset repos hold no safetensors, so they carry no CMH stamp: their rows
revalidate in every column. ``hf download`` is another process, where
``install()`` is not called: its row is the stock client in every column.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from hublike import HubLike, running
from mirror_support import MirrorServer, hf_env

import cmh

ROWS_SCRIPT = Path(__file__).with_name("dropin_rows.py")
ROWS = [
    "AutoConfig",
    "AutoTokenizer",
    "AutoModel",
    "pipeline",
    "SentenceTransformer",
    "load_dataset parquet",
    "load_dataset csv",
    "PeftModel",
    "hf_hub_download",
    "snapshot_download",
    "HfFileSystem",
    "hf download",
]
#: Rows made of bare Hub API calls only (no patched function): under install() they ask
#: the Hub as stock does unless they follow a load of the repo within the window, or
#: ``install(api_from_cache=True)`` (issue 36).
BARE_ROWS = ["HfFileSystem"]
#: Rows of stamped repos: zero requests when fresh under install().
STAMPED_ROWS = [
    r
    for r in ROWS
    if not r.startswith("load_dataset") and r != "hf download" and r not in BARE_ROWS
]
PHASES = ("cold", "fresh", "offline")
#: Rows the stock library cannot run offline (``HfFileSystem`` lists through the API,
#: which ``HF_HUB_OFFLINE`` refuses): the cell must fail as stock does.
OFFLINE_UNSUPPORTED = {"HfFileSystem"}
#: huggingface_hub asks ``/api/agent-harnesses`` once per process until an answer is
#: cached: not a repo request; counted apart (behind the Hub-like front only: against the
#: shared server its bare client's request carries no origin to tell the column).
HARNESSES = "(agent-harnesses)"

#: A test waits for its job, which shares the machine with the others (and the first one
#: also for the module's fixtures): more than the suite's 600 s per test on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(1800)]


@dataclass(frozen=True)
class Sources:
    minilm: Path
    minilm_stamped: Path
    adapter: Path
    adapter_stamped: Path
    parquet: Path
    csv: Path
    st_only: Path  # MiniLM without the files no loader reads (.gitattributes, data_config.json)


def _write_adapter(folder: Path, base_dir: Path, base_repo: str) -> None:
    """A LoRA adapter for MiniLM with non-zero weights (so it changes the output)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules=["query", "value"], init_lora_weights=False)
    model = get_peft_model(AutoModel.from_pretrained(base_dir), config)
    model.save_pretrained(folder)
    adapter_config = json.loads((folder / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = base_repo
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))


def _write_tables(parquet: Path, csv: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"text": [f"row {i}" for i in range(40)], "label": [i % 3 for i in range(40)]}
    (parquet / "data").mkdir(parents=True)
    pq.write_table(pa.table(rows), parquet / "data" / "train-00000-of-00001.parquet")
    (csv / "data").mkdir(parents=True)
    lines = ["text,label"] + [f"{t},{n}" for t, n in zip(rows["text"], rows["label"], strict=True)]
    (csv / "data" / "train.csv").write_text("\n".join(lines) + "\n")
    for folder in (parquet, csv):
        (folder / "README.md").write_text("# table\n")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Sources:
    base = tmp_path_factory.mktemp("dropin-src")
    stamped = base / "minilm-stamped"
    shutil.copytree(minilm_dir, stamped)
    cmh.stamp(stamped / "model.safetensors", ttl="30d")
    adapter, adapter_stamped = base / "adapter", base / "adapter-stamped"
    _write_adapter(adapter, minilm_dir, "org/minilm")
    _write_adapter(adapter_stamped, minilm_dir, "org/minilm-stamped")
    cmh.stamp(adapter_stamped / "adapter_model.safetensors", ttl="30d")
    parquet, csv = base / "parquet", base / "csv"
    _write_tables(parquet, csv)
    st_only = base / "minilm-st"
    shutil.copytree(minilm_dir, st_only, ignore=shutil.ignore_patterns(".gitattributes", "data_*"))
    return Sources(minilm_dir, stamped, adapter, adapter_stamped, parquet, csv, st_only)


@pytest.fixture(scope="module")
def server(sources: Sources, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorServer]:
    from cmh.hub.mirror import add_folder

    store = tmp_path_factory.mktemp("dropin-store") / "store"
    add_folder(store, sources.minilm, "org/minilm")
    add_folder(store, sources.minilm_stamped, "org/minilm-stamped")
    add_folder(store, sources.adapter, "org/adapter")
    add_folder(store, sources.adapter_stamped, "org/adapter-stamped")
    add_folder(store, sources.parquet, "org/table-parquet", repo_type="dataset")
    add_folder(store, sources.csv, "org/table-csv", repo_type="dataset")
    add_folder(store, sources.st_only, "org/minilm-st")
    mirror = MirrorServer(store, tmp_path_factory.mktemp("dropin-logs"))
    yield mirror
    mirror.stop()


def _repos(stamped: bool) -> dict[str, str]:
    suffix = "-stamped" if stamped else ""
    return {
        "model": f"org/minilm{suffix}",
        "adapter": f"org/adapter{suffix}",
        "parquet": "org/table-parquet",
        "csv": "org/table-csv",
    }


class Zygote:
    """``dropin_rows.py --zygote`` (its docstring): each run a child forked from one process
    that imported torch, scikit-learn, pandas and pyarrow once, and none of the libraries
    the drop-in is about. Thread-safe: the jobs of the pool share it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROWS_SCRIPT), "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(env, TOKENIZERS_PARALLELISM="false"),
        )
        self._lock = threading.Lock()
        self._done: dict[str, tuple[threading.Event, list[int]]] = {}
        self._count = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self._lock:
                event, status = self._done[answer["out"]]
            status.append(answer["status"])
            event.set()

    def run(self, config: dict[str, Any], env: dict[str, str]) -> tuple[int, str]:
        """Exit status and output (stdout and stderr) of one run."""
        with self._lock:
            self._count += 1
            out = str(self.folder / f"run-{self._count}.out")
            event, status = self._done[out] = (threading.Event(), [])
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"config": config, "env": env, "out": out}) + "\n")
            self.proc.stdin.flush()
        if not event.wait(600):
            raise TimeoutError(f"zygote run {out} did not end")
        return status[0], Path(out).read_text(errors="replace")

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


#: ``CMH_DROPIN_FORK=0``: every run in a fresh interpreter instead (slower, same answers).
FORK = os.environ.get("CMH_DROPIN_FORK", "1") != "0"
_zygote: list[Zygote] = []


@pytest.fixture(scope="module", autouse=True)
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if FORK:
        _zygote.append(Zygote(tmp_path_factory.mktemp("zygote")))
    try:
        yield
    finally:
        while _zygote:
            _zygote.pop().stop()


def _run_rows(config: dict[str, Any], env: dict[str, str]) -> Any:
    """``dropin_rows.py CONFIG`` as a fresh interpreter runs it; its JSON answer."""
    if _zygote:
        status, output = _zygote[0].run(config, env)
    else:
        proc = subprocess.run(
            [sys.executable, str(ROWS_SCRIPT), json.dumps(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        status, output = proc.returncode, proc.stderr + proc.stdout
    assert status == 0, output[-4000:]
    return json.loads(output.strip().splitlines()[-1])


def _reference(sources: Sources, home: Path) -> dict[str, Any]:
    """What loading the local folders gives, per stamped-ness (no server; one process)."""
    env = dict(hf_env("http://127.0.0.1:9", home), HF_HUB_OFFLINE="1")
    batches = []
    for stamped in (False, True):
        local = {
            "model": str(sources.minilm_stamped if stamped else sources.minilm),
            "adapter": str(sources.adapter_stamped if stamped else sources.adapter),
            "parquet": str(sources.parquet),
            "csv": str(sources.csv),
        }
        batches.append({"rows": ROWS, "repos": local})
    out: dict[str, Any] = {}
    for stamped, got in zip((False, True), _run_rows({"batches": batches}, env), strict=True):
        errors = {k: v["error"] for k, v in got.items() if "error" in v}
        assert not errors, errors
        out["stamped" if stamped else "unstamped"] = {k: v["output"] for k, v in got.items()}
    return out


#: Jobs run at once (each its own processes, one ``cmh serve`` for the module): a column
#: spends most of its time importing libraries in one core or waiting for the server.
PARALLEL = max(1, int(os.environ.get("CMH_DROPIN_PARALLEL", "3")))
#: ``HF_HUB_USER_AGENT_ORIGIN`` of a job's processes: the stock client and the resolver end
#: their ``User-Agent`` with ``origin/...``, so the shared server's log is split per job.
ORIGIN = "cmx"


@pytest.fixture(scope="module")
def jobs(
    request: pytest.FixtureRequest,
    server: MirrorServer,
    sources: Sources,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[Any]]]:
    """The reference, every selected matrix column and the sentence-transformers check,
    started at once in a pool; each test waits for its own job and asserts on its result."""
    selected = {
        item.callspec.id if hasattr(item, "callspec") else item.name
        for item in request.session.items
        if item.module is request.module
    }
    pool = ThreadPoolExecutor(PARALLEL)
    futures: dict[str, Future[Any]] = {}
    futures["reference"] = pool.submit(_reference, sources, tmp_path_factory.mktemp("ref-home"))
    for param in COLUMNS:
        if param.id in selected and not param.marks:
            where, install, stamped, named = param.values
            home = tmp_path_factory.mktemp(f"col-{param.id}")
            # A short origin: the server's log keeps the first 256 characters of a User-Agent.
            spec = Column(f"c{COLUMNS.index(param)}", where, install, stamped, named)  # type: ignore[arg-type]
            futures[str(param.id)] = pool.submit(_run_column, server, spec, home)
    if "test_sentence_transformers_cache_passes_hf_cache_verify" in selected:
        home = tmp_path_factory.mktemp("st-verify")
        futures["st"] = pool.submit(_sentence_transformers_caches, server, home)
    try:
        yield futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def reference(jobs: dict[str, Future[Any]]) -> dict[str, Any]:
    result: dict[str, Any] = jobs["reference"].result()
    return result


def _split_by_row(paths: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Requests between the ``row-NAME`` markers, by row (``health`` markers left out)."""
    rows: dict[str, list[str]] = {}
    current: str | None = None
    for method, target in paths:
        if "sync=row-" in target:
            current = unquote(target.split("sync=row-", 1)[1].split("&")[0])
            rows[current] = []
        elif "sync=done" in target:
            current = None
        elif target.startswith("/api/agent-harnesses"):
            rows.setdefault(HARNESSES, []).append(f"{method} {target}")
        elif current is not None and not target.startswith("/health"):
            rows[current].append(f"{method} {target}")
    return rows


@dataclass(frozen=True)
class Column:
    """One column of the matrix: its id, server, install() or stock, stamped repos, and
    whether every row names a cache folder."""

    id: str
    where: str
    install: bool
    stamped: bool
    named: bool


def _run_column(server: MirrorServer, column: Column, home: Path) -> dict[str, Any]:
    """The three phases of one column; ``{phase: {row: {output|error, requests}}}``."""
    if column.where == "hublike":
        with running(server.url) as front:
            table = _phases(server, front, column, home)
            table["cdn_saw_authorization"] = front.cdn_saw_authorization
            return table
    return _phases(server, None, column, home)


def _log(server: MirrorServer) -> list[dict[str, Any]]:
    """The server's access log, as :meth:`MirrorServer.log`, read while other jobs write to
    it (a last line still being written is left out)."""
    server.sync()
    entries = []
    for line in server.access_log.read_text(errors="replace").splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def _attributed(entry: dict[str, Any], origin: str) -> bool:
    """Whether a server log entry comes from the processes of ``origin`` (a job's phase)."""
    agent = entry.get("user_agent") or ""
    mine = agent.endswith(f"origin/{origin}") or f"origin/{origin};" in agent
    return mine or f"o={origin}&" in (entry.get("target") or "")


def _phases(
    server: MirrorServer, front: HubLike | None, column: Column, home: Path
) -> dict[str, Any]:
    url = front.url if front is not None else server.url
    cache_dir = home / "named-cache" if column.named else None
    out: dict[str, Any] = {}
    for phase in PHASES:
        origin = f"{ORIGIN}{column.id}{phase[0]}"
        # A token, so that the front can show it never reaches the CDN origin.
        env = dict(
            hf_env(url, home, token="hf_cmh_dropin_matrix_token"), HF_HUB_USER_AGENT_ORIGIN=origin
        )
        if phase == "offline":
            env["HF_HUB_OFFLINE"] = "1"
        config = {
            "rows": ROWS,
            "repos": _repos(column.stamped),
            "install": column.install,
            "marker": f"{url}/health?o={origin}",
            "cache_dir": str(cache_dir) if cache_dir is not None else None,
        }
        if front is not None:
            front.clear_records()
        results = _run_rows(config, env)
        if front is not None:
            front.wait_idle()
            seen = sorted(front.records(), key=lambda r: r.seq)
            requests = [
                (
                    r.method,
                    r.path
                    + ("?" + "&".join(f"{k}={v}" for k, v in r.query.items()) if r.query else ""),
                )
                for r in seen
            ]
        else:
            entries = [e for e in _log(server) if _attributed(e, origin)]
            requests = [(e["method"], e.get("target") or "") for e in entries]
        by_row = _split_by_row(requests)
        for row, cell in results.items():
            cell["requests"] = by_row.get(row, [])
        results[HARNESSES] = {"requests": by_row.get(HARNESSES, [])}
        out[phase] = results
    return out


def _check(table: dict[str, dict[str, Any]], want: dict[str, str], label: str) -> list[str]:
    problems = []
    for phase, rows in table.items():
        for row, cell in rows.items():
            if row == HARNESSES:
                continue
            if phase == "offline" and row in OFFLINE_UNSUPPORTED:
                if "OfflineModeIsEnabled" not in cell.get("error", ""):
                    problems.append(f"{label} {phase} {row}: expected the stock offline error")
                continue
            if "error" in cell:
                problems.append(f"{label} {phase} {row}: {cell['error']}")
            elif cell["output"] != want[row]:
                problems.append(f"{label} {phase} {row}: output differs from the local folder")
    return problems


def _summary(label: str, table: dict[str, dict[str, Any]]) -> str:
    lines = [f"{label}:"]
    for row in [*ROWS, HARNESSES]:
        counts = [str(len(table[p][row]["requests"])) for p in PHASES]
        lines.append(f"  {row:22s} cold/fresh/offline requests {'/'.join(counts)}")
        if table["fresh"][row]["requests"]:
            lines.append(f"      fresh: {table['fresh'][row]['requests']}")
    return "\n".join(lines)


#: Columns run by default (the suite's time budget); ``CMH_DROPIN_MATRIX=full`` runs all
#: sixteen (each server x install/stock x stamped/unstamped x default/named cache folder).
#: Three by default, as before the cache_dir column: install + stamped over the Hub-like
#: front in the default cache and over ``cmh serve`` in a named one, and stock.
DEFAULT_COLUMNS = {
    ("mirror", True, True, True),
    ("mirror", False, False, False),
    ("hublike", True, True, False),
}
FULL = os.environ.get("CMH_DROPIN_MATRIX") == "full"
COLUMNS = [
    pytest.param(
        where,
        install,
        stamped,
        named,
        id=f"{where}-{'install' if install else 'stock'}-{'stamped' if stamped else 'unstamped'}"
        + ("-cache_dir" if named else ""),
        marks=[]
        if FULL or (where, install, stamped, named) in DEFAULT_COLUMNS
        else [pytest.mark.skip(reason="CMH_DROPIN_MATRIX=full runs every column")],
    )
    for named in (False, True)
    for where in ("mirror", "hublike")
    for install in (True, False)
    for stamped in (True, False)
]
REPOS = ("minilm-stamped", "minilm", "adapter-stamped", "adapter", "table-parquet", "table-csv")


def _repo_of(request: str) -> str | None:
    path = request.split(" ", 1)[-1].split("?", 1)[0] + "/"
    return next((r for r in REPOS if f"/org/{r}/" in path), None)


@pytest.mark.parametrize(("where", "install", "stamped", "named"), COLUMNS)
def test_matrix(where, install, stamped, named, jobs, reference, request, record_property):
    """``named``: every row that takes a cache folder names one (``cache_dir=``,
    ``cache_folder=``, ``--cache-dir``) other than the default cache of ``HF_HOME``."""
    want = reference["stamped" if stamped else "unstamped"]
    label = f"{where} {'install' if install else 'stock'} {'stamped' if stamped else 'unstamped'}"
    label += " cache_dir" if named else ""
    table = jobs[request.node.callspec.id].result()
    if where == "hublike":
        assert not table.pop("cdn_saw_authorization")
    print(_summary(label, table))
    record_property(
        "matrix", json.dumps({r: [len(table[p][r]["requests"]) for p in PHASES] for r in ROWS})
    )
    assert not _check(table, want, label), _check(table, want, label)
    # Offline: nothing goes to the network, in every column.
    offline = {r: c["requests"] for r, c in table["offline"].items() if c["requests"]}
    assert not offline, offline
    if install:
        # Stale or unstamped: at most one revalidation request per repo for each row
        # (a row is one library call; the window is 10 s, so a long script may ask again).
        for row in ROWS:
            if row == "hf download":  # another process, not installed
                continue
            per_repo: dict[str | None, int] = {}
            for request in table["fresh"][row]["requests"]:
                per_repo[_repo_of(request)] = per_repo.get(_repo_of(request), 0) + 1
            assert all(n <= 1 for n in per_repo.values()), (row, per_repo)
    if install and stamped:
        # A fresh stamped snapshot costs nothing, whatever library asks.
        fresh = {r: table["fresh"][r]["requests"] for r in STAMPED_ROWS}
        assert all(not v for v in fresh.values()), fresh


def _sentence_transformers_caches(server: MirrorServer, home: Path) -> dict[bool, Any]:
    """SentenceTransformer of ``org/minilm-st`` stock and under install(), each in its own
    home: ``{install: (cell, hf cache verify, snapshot files, .no_exist markers)}``."""
    hf = Path(sys.executable).parent / "hf"
    out: dict[bool, Any] = {}
    for install in (False, True):
        folder_home = home / ("ours" if install else "stock")
        env = dict(hf_env(server.url, folder_home), HF_HUB_USER_AGENT_ORIGIN=f"{ORIGIN}st")
        got = _run_rows(
            {"rows": ["SentenceTransformer"], "repos": {"model": "org/minilm-st"},
             "install": install},
            env,
        )  # fmt: skip
        verify = subprocess.run(
            [str(hf), "cache", "verify", "org/minilm-st", "--fail-on-missing-files"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        repo = folder_home / "hub" / "models--org--minilm-st"
        folder = next((repo / "snapshots").iterdir())
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        no_exist = repo / ".no_exist"
        markers = {
            p.relative_to(no_exist).as_posix().split("/", 1)[1]
            for p in no_exist.rglob("*")
            if p.is_file()
        }
        out[install] = (got["SentenceTransformer"], verify, files, markers)
    return out


def test_sentence_transformers_cache_passes_hf_cache_verify(jobs, reference):
    """Under install(), the same embeddings and a cache that stock ``hf cache verify`` passes.

    The repo holds exactly the files sentence-transformers reads, so a stock load
    leaves a complete snapshot; before the fix, install() left 7 of them out.
    """
    caches = jobs["st"].result()
    for install, (cell, verify, files, markers) in caches.items():
        assert cell == {"output": reference["unstamped"]["SentenceTransformer"]}, install
        assert verify.returncode == 0, (install, verify.stdout, verify.stderr)
        assert not markers & set(files), markers  # no false "does not exist"
    assert caches[True][2] == caches[False][2]


def test_every_request_of_the_shared_server_is_told_apart(jobs, server):
    """The jobs share one server: each request they sent carries its job's origin (the
    ``User-Agent`` of the stock client and of the resolver, or the row marker's query),
    so no column counts another's requests or misses one of its own."""
    for future in jobs.values():
        future.result()
    strays = [
        f"{e['method']} {e.get('target')} {e.get('user_agent')}"
        for e in _log(server)
        if not e.get("target", "").startswith(("/health", "/metrics"))
        and f"origin/{ORIGIN}" not in (e.get("user_agent") or "")
        and "aiohttp" not in (e.get("user_agent") or "")  # a Hub-like front's own requests
        # huggingface_hub's agent detection asks with a bare client (no origin): not a repo
        # request, and counted for no column
        and e.get("target") != "/api/agent-harnesses"
    ]
    assert not strays, strays[:20]


#: The gated-through-pull-through row (issue 26 item 2): the libraries' own calls.
GATED_ROWS = ["AutoConfig", "AutoModel", "hf_hub_download", "snapshot_download"]


def _error_type(cell: dict[str, str]) -> str:
    return cell.get("error", "no error").split(":", 1)[0]


def test_gated_repo_through_pullthrough_fails_as_the_gated_hub_does(
    server: MirrorServer, tmp_path: Path
) -> None:
    """A gated upstream repo the mirror's upstream token cannot read, asked by a reader
    the mirror's ``--tokens`` grants: every row fails with the error the stock library
    gives against the gated Hub itself, with and without install(); no body is started."""
    from mirror_support import MirrorServer as Server

    token = "hf_cmh_dropin_matrix_token"
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{token} org/minilm\n")
    store = tmp_path / "pull"
    store.mkdir()
    with running(server.url) as front:
        front.gate("org/minilm")
        pull = Server(store, tmp_path / "logs", tokens=tokens, extra_args=("--upstream", front.url))
        try:
            config = {"rows": GATED_ROWS, "repos": {"model": "org/minilm"}}
            hub = _run_rows(config, hf_env(front.url, tmp_path / "hub-home", token=token))
            want = {row: _error_type(hub[row]) for row in GATED_ROWS}
            assert all(v != "no error" for v in want.values()), hub
            for install in (False, True):
                env = hf_env(pull.url, tmp_path / f"home-{install}", token=token)
                got = _run_rows({**config, "install": install}, env)
                assert {row: _error_type(got[row]) for row in GATED_ROWS} == want, (install, got)
            assert not front.records(origin="cdn")  # nothing was sent and then cut
            # The upstream's refusal of the (tokenless) mirror, as the upstream said it.
            statuses = {e["status"] for e in pull.log() if e.get("route") == "resolve"}
            assert statuses == {401}, statuses
        finally:
            pull.stop()
