"""Drop-in exactness, part two (issue 26): what a stock client sees under ``install()``.

Each test reproduces one way the hook differed from the stock client: offline errors,
the agent harness registry, requests wasted, warnings and labels. The scripts over
every cache folder a caller names and after ``cmh pull`` are in
``test_dropin_exact_scripts.py``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
from deadline_support import TEST_DEADLINE
from mirror_support import MirrorServer, hf_env, run_python

REGISTRY = {"standardEnvVars": ["AI_AGENT"], "harnesses": {"cmh-test": {"envVars": {"T": "*"}}}}


@pytest.fixture
def registry_upstream() -> Iterator[tuple[str, list[str]]]:
    """A loopback upstream answering only ``/api/agent-harnesses`` (and the paths it saw)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = json.dumps(REGISTRY if self.path == "/api/agent-harnesses" else {}).encode()
            self.send_response(200 if self.path == "/api/agent-harnesses" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- item 4: /api/agent-harnesses ------------------------------------------------------------

HARNESS_SCRIPT = r"""
import json
from huggingface_hub import constants
from huggingface_hub.utils._detect_agent import detect_agent
agent = detect_agent()
print(json.dumps({"agent": agent, "cached": json.load(open(constants.AGENT_HARNESSES_PATH))}))
"""


def test_mirror_answers_an_empty_agent_registry_that_the_stock_client_caches(
    mirror: MirrorServer, tmp_path: Path
) -> None:
    answer = httpx2.get(f"{mirror.url}/api/agent-harnesses", timeout=TEST_DEADLINE)
    assert answer.status_code == 200
    assert answer.json() == {"standardEnvVars": [], "harnesses": {}}
    env = dict(hf_env(mirror.url, tmp_path / "home"), AI_AGENT="1")
    mark = len(mirror.log())
    first = run_python(HARNESS_SCRIPT, env)
    second = run_python(HARNESS_SCRIPT, env)
    assert first["cached"] == second["cached"] == {"standardEnvVars": [], "harnesses": {}}
    asked = [e for e in mirror.log()[mark:] if "agent-harnesses" in (e.get("target") or "")]
    assert len(asked) == 1, asked  # the second process read the cached answer


def test_pullthrough_mirror_answers_the_upstreams_agent_registry(
    registry_upstream: tuple[str, list[str]],
    mirror_server_factory: Callable[..., MirrorServer],
    tmp_path: Path,
) -> None:
    upstream, seen = registry_upstream
    (tmp_path / "pull").mkdir()
    pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", upstream))
    env = dict(hf_env(pull.url, tmp_path / "home"), AI_AGENT="cmh-test")
    got = run_python(HARNESS_SCRIPT, env)
    assert got == {"agent": "cmh-test", "cached": REGISTRY}
    assert seen == ["/api/agent-harnesses"]


def test_pullthrough_registry_of_a_failing_upstream_is_a_typed_503(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    import socket

    with socket.socket() as silent:  # a loopback port that refuses connections
        silent.bind(("127.0.0.1", 0))
        port = silent.getsockname()[1]
    (tmp_path / "pull").mkdir()
    pull = mirror_server_factory(
        tmp_path / "pull", extra_args=("--upstream", f"http://127.0.0.1:{port}")
    )
    answer = httpx2.get(f"{pull.url}/api/agent-harnesses", timeout=60)
    assert answer.status_code == 503
    assert answer.headers["X-Error-Code"] == "UpstreamUnavailable"


# -- item 3 and the URL of item 6: missing files offline and online -----------------------------

from test_dropin_hook import (  # noqa: E402, F401 (the hook tests' fixtures)
    REPO,
    aim_stock_client,
    hooked_server,
    installed,
    toy,
)


def _no_exist(cache: Path) -> list[str]:
    folder = cache / f"models--{REPO.replace('/', '--')}" / ".no_exist"
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


@pytest.mark.parametrize("how", ["local_files_only", "HF_HUB_OFFLINE"])
def test_offline_missing_file_raises_the_stock_local_error_and_writes_nothing(
    toy: Any,  # noqa: F811 (a fixture)
    installed: None,  # noqa: F811
    how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    hf_hub_download(REPO, "config.json")  # the listing of main is cached
    kwargs: dict[str, Any] = {}
    if how == "local_files_only":
        kwargs["local_files_only"] = True
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LocalEntryNotFoundError) as caught:
        hf_hub_download(REPO, "adapter_config.json", **kwargs)
    assert isinstance(caught.value, FileNotFoundError)  # what code catching it relies on
    assert _no_exist(toy.cache) == []
    chain = [caught.value.__cause__, caught.value.__context__]
    assert not [e for e in chain if e is not None and type(e).__module__.startswith("cmh")]
    if how == "HF_HUB_OFFLINE":  # stock's cause: the offline mode
        assert type(caught.value.__cause__).__name__ == "OfflineModeIsEnabled"


def _spoil(cache: Path, name: str) -> bytes:
    """Flip one byte of the cached blob of ``name`` at main (same size); its good bytes."""
    folder = cache / f"models--{REPO.replace('/', '--')}"
    commit = (folder / "refs" / "main").read_text().strip()
    blob = (folder / "snapshots" / commit / name).resolve()
    good = blob.read_bytes()
    blob.write_bytes(good[:-2] + bytes([good[-2] ^ 1]) + good[-1:])
    return good


def test_a_corrupt_cached_file_is_not_what_try_to_load_from_cache_finds(
    toy: Any,  # noqa: F811 (a fixture)
    installed: None,  # noqa: F811
) -> None:
    """transformers reads the files of a commit it knows with ``try_to_load_from_cache``,
    not ``hf_hub_download``: a cached blob that fails its check is answered as not cached,
    so the caller downloads it (fetched again), never loads it."""
    from huggingface_hub import hf_hub_download, snapshot_download, try_to_load_from_cache

    snapshot_download(REPO)
    good = _spoil(toy.cache, "model.safetensors")
    assert try_to_load_from_cache(REPO, "model.safetensors") is None
    intact = try_to_load_from_cache(REPO, "config.json")
    assert (
        isinstance(intact, str)
        and Path(intact).read_bytes() == (toy.src / "config.json").read_bytes()
    )
    assert Path(hf_hub_download(REPO, "model.safetensors")).read_bytes() == good


@pytest.mark.parametrize("call", ["snapshot_download", "hf_hub_download"])
def test_offline_a_corrupt_cached_file_raises_the_stock_local_error(
    toy: Any,  # noqa: F811 (a fixture)
    installed: None,  # noqa: F811
    call: str,
) -> None:
    """Offline, a cached file that fails its check is never returned: the stock error of a
    cache that cannot serve the call (transformers' ``list_repo_templates`` catches it,
    so a tokenizer still loads), caused by the resolver's refusal; another file is read."""
    from cmh.hub import IntegrityError
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    snapshot_download(REPO)
    _spoil(toy.cache, "model.safetensors")
    with pytest.raises(LocalEntryNotFoundError) as caught:
        if call == "snapshot_download":
            snapshot_download(REPO, local_files_only=True)
        else:
            hf_hub_download(REPO, "model.safetensors", local_files_only=True)
    assert isinstance(caught.value.__cause__, IntegrityError)
    assert "failed its check" in str(caught.value)
    config = hf_hub_download(REPO, "config.json", local_files_only=True)
    assert Path(config).read_bytes() == (toy.src / "config.json").read_bytes()


def test_online_missing_file_names_the_url_as_stock(
    toy: Any,  # noqa: F811 (a fixture)
    installed: None,  # noqa: F811
) -> None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    hf_hub_download(REPO, "config.json")
    with pytest.raises(RemoteEntryNotFoundError) as caught:
        hf_hub_download(REPO, "adapter_config.json")
    url = f"{toy.server.url}/{REPO}/resolve/main/adapter_config.json"
    assert f"Entry Not Found for url: {url}." in str(caught.value)
    assert _no_exist(toy.cache) == ["adapter_config.json"]  # as the stock client marks it


# -- item 6: warnings once per repo and process, and only when true ------------------------------


def _warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and text in r.message
    ]


def test_local_only_snapshot_of_a_partial_cache_warns_nothing(
    toy: Any,  # noqa: F811 (a fixture)
    installed: None,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """transformers' ``list_repo_templates`` reads a partial snapshot with ``local_files_only``."""
    from huggingface_hub import hf_hub_download, snapshot_download

    hf_hub_download(REPO, "config.json")  # a partial snapshot: the weights are not fetched
    caplog.set_level("DEBUG", logger="cmh.hub")
    # As for a cache the stock client filled: no trees/{commit}.json (stock writes it from
    # snapshot_download only), so the stock client returns the partial folder.
    path = snapshot_download(REPO, local_files_only=True)
    assert sorted(p.name for p in Path(path).iterdir()) == ["config.json"]
    assert not _warnings_of(caplog, "handed to the stock client")


def test_expiry_warning_once_per_repo_and_process(
    tmp_path: Path,
    mirror_server_factory: Callable[..., MirrorServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import cmh.hub as hub
    import huggingface_hub
    from cmh.hub.mirror import add_folder
    from resolver_support import write_checkpoint_repo

    import cmh

    src = write_checkpoint_repo(tmp_path / "src", 1, stamp=False)
    cmh.stamp(src / "model.safetensors", ttl="1d", now=1_700_000_000)  # expired long ago
    commit = add_folder(tmp_path / "store", src, REPO).commit
    server = mirror_server_factory(tmp_path / "store")
    aim_stock_client(monkeypatch, server.url, tmp_path / "cache")
    assert hub.install()
    try:
        caplog.set_level("WARNING", logger="cmh.hub")
        for name in ("model.safetensors", "config.json", "model.safetensors", "README.md"):
            huggingface_hub.hf_hub_download(REPO, name, revision=commit)
    finally:
        hub.uninstall()
    assert len(_warnings_of(caplog, "past its CMH expiry")) == 1, caplog.text


def test_pull_of_a_commit_into_an_empty_cache_reports_missing(
    toy: Any,  # noqa: F811 (a fixture)
    tmp_path: Path,
) -> None:
    """spec/resolver.md §2: MISSING when no selected file was in the cache, also for a commit."""
    from click.testing import CliRunner
    from cmh.cli.main import cli
    from cmh.hub.resolver._negotiate import resolve

    commit = resolve(REPO, cache_dir=tmp_path / "probe", endpoint=toy.server.url).commit
    result = CliRunner().invoke(
        cli,
        ["pull", REPO, "--revision", commit, "--cache-dir", str(tmp_path / "empty"), "--json"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["state"] == "missing"
    again = resolve(REPO, commit, cache_dir=tmp_path / "empty", endpoint=toy.server.url)
    assert again.state.value == "local_only"


def test_pull_of_a_tag_naming_a_cached_commit_reports_fresh(
    mirror: MirrorServer, tmp_path: Path
) -> None:
    """spec/resolver.md §2: a tag asked for the first time (no ``refs/{tag}``) whose commit
    is complete in the cache is FRESH, every file kept; it was reported MISSING ("it was
    not in the cache")."""
    from click.testing import CliRunner
    from cmh.cli.main import cli
    from cmh.hub.resolver._negotiate import resolve
    from mirror_support import TINY_REPO

    commit = resolve(TINY_REPO, "v1", cache_dir=tmp_path / "probe", endpoint=mirror.url).commit
    cache = tmp_path / "cache"
    resolve(TINY_REPO, commit, cache_dir=cache, endpoint=mirror.url)
    args = ["pull", TINY_REPO, "--revision", "v1", "--cache-dir", str(cache)]
    result = CliRunner().invoke(cli, [*args, "--endpoint", mirror.url, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["commit"] == commit and doc["state"] == "fresh"
    assert {f["action"] for f in doc["files"]} == {"kept"}


# -- item 5: no listing fetched twice in one process --------------------------------------------


def test_a_listing_is_fetched_once_per_process_even_when_the_probed_file_is_absent(
    mirror: MirrorServer, tmp_path: Path
) -> None:
    """transformers probes ``adapter_config.json`` before the weights: one listing, not two."""
    from cmh.hub.resolver._negotiate import resolve
    from cmh.hub.resolver._types import NotFoundError
    from hublike import running
    from mirror_support import TINY_REPO

    def no_siblings(kind: str, path: str, doc: object) -> object:
        if kind == "repo_info" and isinstance(doc, dict):  # the listing comes from tree pages
            return {k: v for k, v in doc.items() if k != "siblings"}
        return doc

    with running(mirror.url, page_size=2) as front:
        front.edit_json = no_siblings
        with pytest.raises(NotFoundError):
            resolve(
                TINY_REPO, cache_dir=tmp_path, endpoint=front.url,
                allow_patterns=["adapter_config.json"],
            )  # fmt: skip
        pages = len(front.records(origin="hub", path="/tree/"))
        assert pages >= 2  # the listing was asked for, page by page
        resolve(TINY_REPO, cache_dir=tmp_path, endpoint=front.url, allow_patterns=["config.json"])
        assert len(front.records(origin="hub", path="/tree/")) == pages


# -- the whole script: a fresh stamped snapshot costs 0 requests, agent detection on ------------

WHOLE_SCRIPT = r"""
import json, logging, os
import cmh.hub
warned = []
class Keep(logging.Handler):
    def emit(self, record):
        warned.append(record.getMessage())
logging.getLogger("cmh.hub").addHandler(Keep(logging.WARNING))
assert cmh.hub.install()
from transformers import AutoConfig, AutoModel, AutoTokenizer, pipeline
from sentence_transformers import SentenceTransformer
from huggingface_hub.utils._detect_agent import detect_agent
repo = os.environ["T_REPO"]
AutoConfig.from_pretrained(repo)
tok = AutoTokenizer.from_pretrained(repo)
model = AutoModel.from_pretrained(repo)
pipeline("feature-extraction", model=repo)("cheap fresh weights")
vectors = SentenceTransformer(repo, device="cpu").encode(["cheap fresh weights"])
print(json.dumps({"agent": detect_agent(), "dims": int(vectors.shape[1]), "warned": warned}))
"""


@pytest.mark.slow
def test_a_fresh_stamped_snapshot_costs_no_request_for_a_whole_script(
    tmp_path: Path, minilm_dir: Path, mirror_server_factory: Callable[..., MirrorServer]
) -> None:
    import shutil

    from cmh.hub.mirror import add_folder

    import cmh

    src = tmp_path / "src"
    shutil.copytree(minilm_dir, src)
    cmh.stamp(src / "model.safetensors", ttl="30d")
    add_folder(tmp_path / "store", src, "org/minilm-stamped")
    server = mirror_server_factory(tmp_path / "store")
    env = dict(hf_env(server.url, tmp_path / "home"), AI_AGENT="1", T_REPO="org/minilm-stamped")
    # A partial snapshot first (config only): the tokenizer's template probe reads it offline.
    run_python(
        "import cmh.hub, json; cmh.hub.install(); import huggingface_hub as h; "
        "h.hf_hub_download('org/minilm-stamped', 'config.json'); print(json.dumps(1))",
        env,
    )
    cold = run_python(WHOLE_SCRIPT, env)
    # Detection ran: it asked the mirror's (empty, not pull-through) registry once and cached it.
    assert cold == {"agent": None, "dims": 384, "warned": []}  # no warning: none is true
    server.sync()
    asked = [e for e in server.log() if e.get("target") == "/api/agent-harnesses"]
    assert len(asked) == 1 and asked[0]["status"] == 200, asked
    assert (tmp_path / "home" / ".agent_harnesses.json").is_file()
    mark = len(server.log())
    fresh = run_python(WHOLE_SCRIPT, env)
    server.sync()
    seen = [
        f"{e['method']} {e.get('target')}"
        for e in server.log()[mark:]
        if e["route"] not in ("health", "metrics")
    ]
    assert fresh == cold
    assert seen == [], seen


@pytest.mark.parametrize("front", [False, True], ids=["cmh-serve", "hublike"])
def test_resolve_keeps_the_stock_repo_info_and_tree_answers(
    front: bool, mirror: MirrorServer, tmp_path: Path
) -> None:
    """What ``resolve()`` keeps is what the server answers the stock client's own
    requests (the plain repo info; tree pages, when it listed them), byte for byte in JSON."""
    from cmh.hub.cache import RepoLayout
    from cmh.hub.resolver._answers import read_answer
    from cmh.hub.resolver._negotiate import resolve
    from hublike import running
    from mirror_support import TINY_REPO

    def no_siblings(kind: str, path: str, doc: object) -> object:
        if kind == "repo_info" and isinstance(doc, dict):
            return {k: v for k, v in doc.items() if k != "siblings"}  # listed from tree pages
        return doc

    with (
        contextlib.nullcontext(mirror.url) if not front else running(mirror.url, page_size=2) as hub
    ):
        url = hub if isinstance(hub, str) else hub.url
        if not isinstance(hub, str):
            hub.edit_json = no_siblings
        commit = resolve(TINY_REPO, cache_dir=tmp_path, endpoint=url).commit
        repo = RepoLayout(tmp_path, TINY_REPO, "model")
        base = f"/api/models/{TINY_REPO}"
        wanted = [f"{base}/revision/{commit}", f"{base}/revision/{commit}?blobs=true"]
        if front:
            wanted.append(f"{base}/tree/{commit}?recursive=true&expand=false")
        for target in wanted:
            kept = read_answer(repo, commit, f"GET {target}", "")  # asked without a token
            assert kept is not None, target
            asked = httpx2.get(url + target, timeout=30)
            assert kept["status"] == asked.status_code == 200
            assert json.loads(kept["body"]) == asked.json(), target
            if "tree" in target:  # the next page the stock client follows is kept too
                link = dict(kept["headers"])["link"]
                assert link == asked.headers["link"].replace("&expand=false", ""), link


def test_offline_a_corrupt_file_of_a_cache_stock_filled_is_refused(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cache the stock client filled has no listing: offline the resolver serves its
    snapshot as found, and hands what it cannot answer to stock; a file whose blob fails
    its check is refused either way (stock would return it)."""
    import cmh.hub as hub
    import cmh.hub.resolver._patch as patch
    import huggingface_hub as stock  # its attribute: the wrapper once installed
    from huggingface_hub.errors import LocalEntryNotFoundError

    stock.hf_hub_download(REPO, "config.json")  # stock, before install(): no listing
    stock.hf_hub_download(REPO, "README.md")
    _spoil(toy.cache, "config.json")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.install()
    patch._recent.clear()
    try:
        with pytest.raises(LocalEntryNotFoundError) as caught:
            stock.hf_hub_download(REPO, "config.json")
        assert "failed its check" in str(caught.value)
        readme = stock.hf_hub_download(REPO, "README.md")
        assert Path(readme).read_bytes() == (toy.src / "README.md").read_bytes()
    finally:
        hub.uninstall()
