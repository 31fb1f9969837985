"""The mirror's Hub API as the stock clients use it (issue 13).

Every check goes through the stock ``huggingface_hub`` client
(``HfApi(endpoint=...)``) or transformers' ``pipeline`` (in a fresh
interpreter with ``HF_ENDPOINT``) against a real ``cmh serve`` started here:
repo info derived from the model card's front matter, parameter counts from
safetensors headers, ``lastCommit`` in expanded trees, refs, commits,
``auth_check``, ``list_models`` / ``list_datasets``, ``get_paths_info`` with
1,000 paths, private repos hidden from every listing, and JSON 404s for
endpoints the mirror does not serve.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import numpy as np
import pytest
from cli_support import run_runner
from deadline_support import TEST_DEADLINE
from huggingface_hub import HfApi
from huggingface_hub.errors import (
    BadRequestError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from mirror_support import MINILM_REPO, MirrorServer, hf_env, run_python
from safetensors import safe_open
from safetensors.numpy import save_file

SECRET_TOKEN = "hf_cmh_hub_api_secret_0001"
OTHER_TOKEN = "hf_cmh_hub_api_other_0002"
EMBEDDER = "cmh-test/embedder"
MIXED = "cmh-test/mixed"
HISTORY = "cmh-test/history"
MANY = "cmh-test/many"
BARE = "cmh-test/bare"
BROKEN_CARD = "cmh-test/broken-card"
OTHER_ORG = "other-org/thing"
SECRET = "cmh-test/secret"
CORPUS = "cmh-test/corpus"
SECRET_DATA = "cmh-test/secret-data"
PUBLIC_MODELS = {EMBEDDER, MIXED, HISTORY, MANY, BARE, BROKEN_CARD, OTHER_ORG}

EMBEDDER_CARD = """---
library_name: transformers
pipeline_tag: feature-extraction
license: apache-2.0
---
# An embedder
"""
MIXED_CARD = """---
language:
- en
- fr
license: mit
library_name: transformers
pipeline_tag: text-classification
tags:
- demo
- transformers
datasets:
- cmh-test/corpus
base_model: cmh-test/base
released: 2024-05-01
---

# Mixed dtypes
"""
CORPUS_CARD = """---
license: cc-by-4.0
task_categories:
- text-classification
language:
- en
size_categories:
- n<1K
pretty_name: A corpus
---
# corpus
"""


@dataclass(frozen=True)
class HubApiStore:
    """The store of this module, its server and the commits its imports made."""

    server: MirrorServer
    commits: dict[str, str]  # "repo@revision#n" -> commit id, in import order
    mixed_dir: Path
    embedder_dir: Path


def _add(
    store: Path, src: Path, repo: str, revision: str = "main", repo_type: str = "model"
) -> str:
    run = run_runner(
        ["mirror", "add", src, "--store", store, "--repo", repo, "--revision", revision,
         "--repo-type", repo_type, "--json"]
    )  # fmt: skip
    assert run.exit_code == 0, run.stdout + run.stderr
    commit = run.json()["commit"]
    assert isinstance(commit, str)
    return commit


def _write(root: Path, files: dict[str, str]) -> Path:
    if root.exists():
        shutil.rmtree(root)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Iterator[HubApiStore]:
    base = tmp_path_factory.mktemp("hub-api")
    store = base / "store"
    commits: dict[str, str] = {}

    embedder = base / "embedder"
    shutil.copytree(minilm_dir, embedder)
    (embedder / "README.md").write_text(EMBEDDER_CARD)
    commits[f"{EMBEDDER}@main"] = _add(store, embedder, EMBEDDER)

    mixed = _write(
        base / "mixed", {"README.md": MIXED_CARD, "config.json": '{"model_type": "bert"}\n'}
    )
    save_file(
        {"a": np.zeros((3, 4), np.float16), "b": np.zeros((5,), np.float32)},
        str(mixed / "model-00001-of-00002.safetensors"),
    )
    save_file(
        {"c": np.zeros((2, 3), np.float32), "d": np.zeros((7,), np.int64)},
        str(mixed / "model-00002-of-00002.safetensors"),
    )
    (mixed / "extra").mkdir()
    save_file({"e": np.zeros((100,), np.float32)}, str(mixed / "extra" / "adapter.safetensors"))
    commits[f"{MIXED}@main"] = _add(store, mixed, MIXED)

    # history: three commits on main, then v1 (the tree of the first, on top of main), then a PR
    src = base / "history"
    commits[f"{HISTORY}@main#1"] = _add(
        store, _write(src, {"a.txt": "a1\n", "b/c.txt": "c1\n"}), HISTORY
    )
    commits[f"{HISTORY}@main#2"] = _add(
        store, _write(src, {"a.txt": "a2\n", "b/c.txt": "c1\n"}), HISTORY
    )
    commits[f"{HISTORY}@main#3"] = _add(
        store, _write(src, {"a.txt": "a2\n", "b/c.txt": "c1\n", "d.txt": "d\n"}), HISTORY
    )
    commits[f"{HISTORY}@v1"] = _add(
        store, _write(src, {"a.txt": "a1\n", "b/c.txt": "c1\n"}), HISTORY, "v1"
    )
    commits[f"{HISTORY}@refs/pr/1"] = _add(
        store, _write(src, {"a.txt": "pr\n", "b/c.txt": "c1\n"}), HISTORY, "refs/pr/1"
    )

    many = _write(base / "many", {f"files/f{i:04d}.txt": f"file {i}\n" for i in range(1000)})
    commits[f"{MANY}@main"] = _add(store, many, MANY)
    commits[f"{BARE}@main"] = _add(store, _write(base / "bare", {"config.json": "{}\n"}), BARE)
    commits[f"{BROKEN_CARD}@main"] = _add(
        store,
        _write(base / "broken", {"README.md": "---\nkey: [unclosed\n---\n# x\n"}),
        BROKEN_CARD,
    )
    commits[f"{OTHER_ORG}@main"] = _add(
        store, _write(base / "other", {"README.md": "---\nlicense: mit\n---\n"}), OTHER_ORG
    )
    commits[f"{SECRET}@main"] = _add(
        store, _write(base / "secret", {"README.md": "---\nlicense: mit\n---\n"}), SECRET
    )
    commits[f"datasets/{CORPUS}@main"] = _add(
        store, _write(base / "corpus", {"README.md": CORPUS_CARD, "train.csv": "a\n1\n"}), CORPUS,
        repo_type="dataset",
    )  # fmt: skip
    commits[f"datasets/{SECRET_DATA}@main"] = _add(
        store,
        _write(base / "secret-data", {"train.csv": "a\n2\n"}),
        SECRET_DATA,
        repo_type="dataset",
    )
    tokens = base / "tokens.txt"
    tokens.write_text(
        f"{SECRET_TOKEN} {SECRET} datasets/{SECRET_DATA}\n{OTHER_TOKEN} cmh-test/nothing-here\n"
    )
    # small pages, so that every paginated listing is followed by the stock client
    server = MirrorServer(store, base / "logs", tokens=tokens, extra_args=("--tree-page-size", "2"))
    try:
        yield HubApiStore(server, commits, mixed, embedder)
    finally:
        server.stop()


def _api(hub: HubApiStore, token: str | bool = False) -> HfApi:
    return HfApi(endpoint=hub.server.url, token=token)


def _front_matter(readme: Path) -> dict[str, Any]:
    import yaml

    text = readme.read_text()
    data = yaml.safe_load(text.split("---\n")[1])
    assert isinstance(data, dict)
    return data


def _parameters(files: list[Path]) -> dict[str, int]:
    """Parameters per safetensors dtype name, counted with the safetensors library."""
    out: dict[str, int] = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open is not a mapping)
                tensor = f.get_slice(name)
                out[tensor.get_dtype()] = out.get(tensor.get_dtype(), 0) + int(
                    np.prod(tensor.get_shape(), dtype=np.int64)
                )
    return out


# -- repo info from the model card ----------------------------------------------------------


def test_the_front_matter_block_and_expand_lists_are_the_stock_clients(tmp_path: Path) -> None:
    """``cmh serve`` keeps ``huggingface_hub.hf_api`` out of its start-up (0.2-0.3 s): the
    card's front matter pattern is a copy checked here, ``expand`` read on first use."""
    from typing import get_args

    from cmh.hub.mirror._front_matter import YAML_BLOCK
    from cmh.hub.mirror._hub_documents import expand_properties
    from huggingface_hub import hf_api
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    assert (YAML_BLOCK.pattern, YAML_BLOCK.flags) == (
        REGEX_YAML_BLOCK.pattern, REGEX_YAML_BLOCK.flags
    )  # fmt: skip
    assert expand_properties("model") == set(get_args(hf_api.ExpandModelProperty_T))
    assert expand_properties("dataset") == set(get_args(hf_api.ExpandDatasetProperty_T))
    started = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "cmh.cli.main", "serve", "--store",
         str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert started.stdout is not None and "Serving" in started.stdout.readline()
    finally:
        started.terminate()
        _, imports = started.communicate(timeout=TEST_DEADLINE)
    assert "cmh.hub.mirror._app" in imports  # the worker is built before it announces
    assert "huggingface_hub" not in imports


def test_repo_info_carries_the_real_minilm_card(mirror: MirrorServer, minilm_dir: Path) -> None:
    card = _front_matter(minilm_dir / "README.md")
    info = HfApi(endpoint=mirror.url, token=False).model_info(MINILM_REPO)
    assert info.pipeline_tag == card["pipeline_tag"] == "sentence-similarity"
    assert info.library_name == card["library_name"] == "sentence-transformers"
    assert info.card_data is not None
    assert info.card_data.to_dict()["datasets"] == card["datasets"]
    assert info.card_data.license == "apache-2.0"
    tags = info.tags or []
    for tag in [*card["tags"], "en", "license:apache-2.0", "dataset:s2orc", "sentence-similarity"]:
        assert tag in tags, (tag, tags)
    assert len(tags) == len(set(tags))
    params = _parameters([minilm_dir / "model.safetensors"])
    assert info.safetensors is not None
    assert info.safetensors.parameters == params
    assert info.safetensors.total == sum(params.values())


def test_repo_info_tags_and_card_data(hub: HubApiStore) -> None:
    info = _api(hub).model_info(MIXED)
    assert (info.pipeline_tag, info.library_name) == ("text-classification", "transformers")
    assert info.tags is not None
    for tag in ["transformers", "demo", "text-classification", "en", "fr", "license:mit",
                "dataset:cmh-test/corpus", "base_model:cmh-test/base"]:  # fmt: skip
        assert tag in info.tags, (tag, info.tags)
    assert len(info.tags) == len(set(info.tags))
    assert info.card_data is not None
    data = info.card_data.to_dict()
    assert data["language"] == ["en", "fr"] and data["license"] == "mit"
    assert data["released"] == "2024-05-01"  # a YAML date goes out as its ISO text
    # a repo without a card, and one whose front matter is not YAML: no card, no failure
    for repo in (BARE, BROKEN_CARD):
        bare = _api(hub).model_info(repo)
        assert bare.pipeline_tag is None and bare.library_name is None and bare.card_data is None
        assert bare.tags == []


def test_dataset_info_tags_come_from_its_card(hub: HubApiStore) -> None:
    info = _api(hub).dataset_info(CORPUS)
    assert info.card_data is not None and info.card_data.to_dict()["pretty_name"] == "A corpus"
    assert info.tags is not None
    for tag in ["license:cc-by-4.0", "task_categories:text-classification", "language:en",
                "size_categories:n<1K"]:  # fmt: skip
        assert tag in info.tags, (tag, info.tags)


def test_safetensors_parameters_per_dtype(hub: HubApiStore) -> None:
    root_files = sorted(hub.mixed_dir.glob("*.safetensors"))
    expected = _parameters(root_files)
    assert expected == {"F16": 12, "F32": 11, "I64": 7}
    info = _api(hub).model_info(MIXED, expand=["safetensors"])
    assert info.safetensors is not None
    assert info.safetensors.parameters == expected
    assert info.safetensors.total == 30
    # expand answers only what it names
    assert info.siblings is None and info.pipeline_tag is None and info.sha is None
    only = _api(hub).model_info(MIXED, expand=["pipeline_tag", "sha"])
    assert only.pipeline_tag == "text-classification" and only.sha == hub.commits[f"{MIXED}@main"]
    assert only.safetensors is None and only.tags is None
    assert _api(hub).model_info(BARE).safetensors is None  # no safetensors file
    with pytest.raises(BadRequestError):
        _api(hub).model_info(MIXED, expand=["no-such-property"])  # type: ignore[list-item]


@pytest.mark.slow
@pytest.mark.heavy
def test_pipeline_without_a_task_answers_as_the_hub_does(
    mirror: MirrorServer, hub: HubApiStore, tmp_path: Path
) -> None:
    """The real MiniLM card names sentence-transformers: transformers refuses, as with the Hub.

    A card naming transformers and ``feature-extraction`` lets ``pipeline``
    infer its task and run.
    """
    script = r"""
import json, os
from transformers import pipeline
out = {}
try:
    pipeline(model=os.environ["T_MINILM"])
    out["minilm"] = "no error"
except RuntimeError as exc:
    out["minilm"] = str(exc)
print(json.dumps(out))
"""
    env = hf_env(mirror.url, tmp_path / "home-a")
    env["T_MINILM"] = MINILM_REPO
    result = run_python(script, env)
    assert result["minilm"] == (
        "This model is meant to be used with sentence-transformers not with transformers"
    )
    script = r"""
import json, os
from transformers import pipeline
pipe = pipeline(model=os.environ["T_EMBEDDER"])
vectors = pipe("a sentence to embed")
print(json.dumps({"task": pipe.task, "shape": [len(vectors), len(vectors[0]), len(vectors[0][0])]}))
"""
    env = hf_env(hub.server.url, tmp_path / "home-b")
    env["T_EMBEDDER"] = EMBEDDER
    result = run_python(script, env)
    assert result["task"] == "feature-extraction"
    assert result["shape"][0] == 1 and result["shape"][2] == 384


# -- tree expand, refs, commits -------------------------------------------------------------


def test_tree_expand_gives_the_last_commit_of_each_path(hub: HubApiStore) -> None:
    c1, c2, c3 = (hub.commits[f"{HISTORY}@main#{n}"] for n in (1, 2, 3))
    v1 = hub.commits[f"{HISTORY}@v1"]
    api = _api(hub)
    tree = {e.path: e.last_commit for e in api.list_repo_tree(HISTORY, recursive=True, expand=True)}
    assert {p: (c.oid if c else None) for p, c in tree.items()} == {
        "a.txt": c2, "b": c1, "b/c.txt": c1, "d.txt": c3,
    }  # fmt: skip
    dated = {c.commit_id: c.created_at for c in api.list_repo_commits(HISTORY)}
    for commit in tree.values():
        assert commit is not None and commit.title == "cmh mirror add"
        assert commit.date == dated[commit.oid]
    at_v1 = api.list_repo_tree(HISTORY, recursive=True, expand=True, revision="v1")
    assert {e.path: e.last_commit.oid for e in at_v1 if e.last_commit} == {
        "a.txt": v1, "b": c1, "b/c.txt": c1,
    }  # fmt: skip
    # without expand: no lastCommit (as the Hub)
    assert all(e.last_commit is None for e in api.list_repo_tree(HISTORY, recursive=True))
    info = api.get_paths_info(HISTORY, ["a.txt", "b", "d.txt"], expand=True)
    assert {e.path: e.last_commit.oid for e in info if e.last_commit} == {
        "a.txt": c2, "b": c1, "d.txt": c3,
    }  # fmt: skip


def test_list_repo_refs(hub: HubApiStore) -> None:
    api = _api(hub)
    refs = api.list_repo_refs(HISTORY)
    assert sorted((r.name, r.ref, r.target_commit) for r in refs.branches) == [
        ("main", "refs/heads/main", hub.commits[f"{HISTORY}@main#3"]),
        ("v1", "refs/heads/v1", hub.commits[f"{HISTORY}@v1"]),
    ]
    assert refs.tags == [] and refs.converts == [] and refs.pull_requests is None
    with_prs = api.list_repo_refs(HISTORY, include_pull_requests=True)
    assert with_prs.pull_requests is not None
    assert [(r.name, r.ref, r.target_commit) for r in with_prs.pull_requests] == [
        ("refs/pr/1", "refs/pr/1", hub.commits[f"{HISTORY}@refs/pr/1"])
    ]
    corpus = api.list_repo_refs(CORPUS, repo_type="dataset")
    assert [r.target_commit for r in corpus.branches] == [hub.commits[f"datasets/{CORPUS}@main"]]
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_refs("cmh-test/no-such-repo")


def test_list_repo_commits(hub: HubApiStore) -> None:
    api = _api(hub)
    c1, c2, c3 = (hub.commits[f"{HISTORY}@main#{n}"] for n in (1, 2, 3))
    before = len(hub.server.log(route="commits"))
    commits = api.list_repo_commits(HISTORY)
    assert [c.commit_id for c in commits] == [c3, c2, c1]  # newest first
    assert len(hub.server.log(route="commits")) - before == 2  # pages of 2, followed by the client
    assert all(c.title == "cmh mirror add" and c.message == "" for c in commits)
    assert all(c.authors == ["cmh mirror"] for c in commits)
    assert [c.created_at for c in commits] == sorted((c.created_at for c in commits), reverse=True)
    for c in commits:
        assert c.created_at == api.model_info(HISTORY, revision=c.commit_id).last_modified
    v1 = [c.commit_id for c in api.list_repo_commits(HISTORY, revision="v1")]
    assert v1 == [hub.commits[f"{HISTORY}@v1"], c3, c2, c1]
    assert [c.commit_id for c in api.list_repo_commits(HISTORY, revision=c2)] == [c2, c1]
    pr = [c.commit_id for c in api.list_repo_commits(HISTORY, revision="refs/pr/1")]
    assert pr == [hub.commits[f"{HISTORY}@refs/pr/1"], c3, c2, c1]  # a PR starts from main
    corpus = api.list_repo_commits(CORPUS, repo_type="dataset")
    assert [c.commit_id for c in corpus] == [hub.commits[f"datasets/{CORPUS}@main"]]
    formatted = api.list_repo_commits(HISTORY, formatted=True)
    assert all(c.formatted_title == "cmh mirror add" for c in formatted)
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_commits(HISTORY, revision="no-such-branch")


def test_a_store_without_commit_records_answers_what_it_has(
    hub: HubApiStore, tmp_path: Path, mirror_server_factory
) -> None:
    """A cache filled by another tool has snapshots and refs but no cmh commit records."""
    store = tmp_path / "store"
    shutil.copytree(
        hub.server.store / "models--cmh-test--history",
        store / "models--cmh-test--history",
        symlinks=True,
    )
    shutil.rmtree(store / "models--cmh-test--history" / ".cmh")
    server = mirror_server_factory(store)
    api = HfApi(endpoint=server.url, token=False)
    head = hub.commits[f"{HISTORY}@main#3"]
    commits = api.list_repo_commits(HISTORY)
    assert [c.commit_id for c in commits] == [head]
    assert commits[0].title == "" and commits[0].authors == []
    tree = api.list_repo_tree(HISTORY, recursive=True, expand=True)
    assert {e.path: e.last_commit.oid for e in tree if e.last_commit} == dict.fromkeys(
        ["a.txt", "b", "b/c.txt", "d.txt"], head
    )


# -- auth_check, listings, private repos ---------------------------------------------------


def test_auth_check(hub: HubApiStore) -> None:
    api = _api(hub)
    api.auth_check(HISTORY)  # public: allowed, no exception
    api.auth_check(CORPUS, repo_type="dataset")
    with pytest.raises(RepositoryNotFoundError):
        api.auth_check(SECRET)  # private, no token: looks missing
    with pytest.raises(RepositoryNotFoundError):
        api.auth_check(SECRET, token=OTHER_TOKEN)  # a token that does not open it
    api.auth_check(SECRET, token=SECRET_TOKEN)
    api.auth_check(SECRET_DATA, repo_type="dataset", token=SECRET_TOKEN)
    with pytest.raises(RepositoryNotFoundError):
        api.auth_check("cmh-test/no-such-repo")
    # the mirror is read-only: nobody may write, and a closed repo still looks missing
    with pytest.raises(HfHubHTTPError) as excinfo:
        api.auth_check(HISTORY, write=True)
    assert excinfo.value.response.status_code == 403
    assert not isinstance(excinfo.value, RepositoryNotFoundError)
    with pytest.raises(RepositoryNotFoundError):
        api.auth_check(SECRET, write=True)


def test_list_models_hides_private_repos(hub: HubApiStore) -> None:
    anonymous = {m.id: m for m in _api(hub).list_models()}
    assert set(anonymous) == PUBLIC_MODELS
    assert not any(m.private for m in anonymous.values())
    opened = {m.id: m for m in _api(hub, SECRET_TOKEN).list_models()}
    assert set(opened) == PUBLIC_MODELS | {SECRET}
    assert opened[SECRET].private is True
    assert {m.id for m in _api(hub, OTHER_TOKEN).list_models()} == PUBLIC_MODELS
    assert {m.id for m in _api(hub).list_models(search="secret")} == set()
    assert {d.id for d in _api(hub).list_datasets()} == {CORPUS}
    assert {d.id for d in _api(hub, SECRET_TOKEN).list_datasets()} == {CORPUS, SECRET_DATA}
    # every per-repo endpoint hides it too
    api = _api(hub)
    for call in (
        lambda: api.list_repo_refs(SECRET),
        lambda: api.list_repo_commits(SECRET),
        lambda: list(api.list_repo_tree(SECRET, expand=True)),
        lambda: api.get_paths_info(SECRET, ["README.md"], expand=True),
        lambda: api.model_info(SECRET, expand=["safetensors"]),
    ):
        with pytest.raises(RepositoryNotFoundError):
            call()
    assert [c.commit_id for c in _api(hub, SECRET_TOKEN).list_repo_commits(SECRET)] == [
        hub.commits[f"{SECRET}@main"]
    ]


def test_list_models_search_author_filter_sort_limit(hub: HubApiStore) -> None:
    api = _api(hub)
    assert [m.id for m in api.list_models(search="HIST")] == [HISTORY]  # substring, any case
    assert {m.id for m in api.list_models(author="other-org")} == {OTHER_ORG}
    assert {m.id for m in api.list_models(author="cmh-test")} == PUBLIC_MODELS - {OTHER_ORG}
    assert {m.id for m in api.list_models(filter="feature-extraction")} == {EMBEDDER}
    assert {m.id for m in api.list_models(filter=["transformers", "license:mit"])} == {MIXED}
    assert {m.id for m in api.list_models(filter="license:mit")} == {MIXED, OTHER_ORG}
    assert {m.id for m in api.list_models(pipeline_tag="text-classification")} == {MIXED}
    assert {m.id for m in api.list_models(search="mixed", author="other-org")} == set()
    # newest first, as the Hub sorts
    by_modified = list(api.list_models(sort="last_modified", expand=["lastModified"]))
    stamps = [m.last_modified for m in by_modified]
    assert len(stamps) == len(PUBLIC_MODELS) and None not in stamps
    assert stamps == sorted(stamps, reverse=True)  # type: ignore[type-var]
    # import order, reversed
    newest_first = [OTHER_ORG, BROKEN_CARD, BARE, MANY, HISTORY, MIXED, EMBEDDER]
    assert [m.id for m in by_modified] == newest_first
    assert [m.id for m in api.list_models(sort="created_at")] == newest_first
    assert [m.id for m in api.list_models()] == sorted(PUBLIC_MODELS)  # no sort: by id
    # limit: the stock client stops after `limit` items; pages of 2 are followed otherwise
    assert len(list(api.list_models(limit=3))) == 3
    before = len(hub.server.log(route="list_repos"))
    assert len(list(api.list_models())) == len(PUBLIC_MODELS)
    assert len(hub.server.log(route="list_repos")) - before == 4  # 7 public models, pages of 2
    # what an item carries
    item = next(iter(api.list_models(search="mixed")))
    assert (item.pipeline_tag, item.library_name, item.private) == (
        "text-classification",
        "transformers",
        False,
    )
    assert item.tags is not None and "license:mit" in item.tags
    assert item.siblings is None and item.card_data is None
    full = next(iter(api.list_models(search="mixed", full=True)))
    assert full.siblings is not None and "README.md" in {s.rfilename for s in full.siblings}
    assert full.sha == hub.commits[f"{MIXED}@main"]
    with_card = next(iter(api.list_models(search="mixed", cardData=True)))
    assert with_card.card_data is not None and with_card.card_data.license == "mit"
    expanded = next(iter(api.list_models(search="mixed", expand=["safetensors", "pipeline_tag"])))
    assert expanded.safetensors is not None and expanded.safetensors.total == 30
    assert expanded.pipeline_tag == "text-classification" and expanded.tags is None


def test_list_datasets_search_author_filter(hub: HubApiStore) -> None:
    api = _api(hub, SECRET_TOKEN)
    assert [d.id for d in api.list_datasets(search="corp")] == [CORPUS]
    assert {d.id for d in api.list_datasets(author="cmh-test")} == {CORPUS, SECRET_DATA}
    assert [d.id for d in api.list_datasets(task_categories="text-classification")] == [CORPUS]
    assert [d.id for d in api.list_datasets(limit=1)] != []
    item = next(iter(api.list_datasets(search="corpus", full=True)))
    assert item.sha == hub.commits[f"datasets/{CORPUS}@main"]
    assert item.siblings is not None and {s.rfilename for s in item.siblings} == {
        "README.md",
        "train.csv",
    }


# -- paths-info at the limit, unknown endpoints ----------------------------------------------


def test_get_paths_info_with_1000_paths(hub: HubApiStore) -> None:
    api = _api(hub)
    paths = [f"files/f{i:04d}.txt" for i in range(1000)]
    got = api.get_paths_info(MANY, paths)
    assert [e.path for e in got] == paths
    with pytest.raises(BadRequestError):
        api.get_paths_info(MANY, [*paths, "files"])  # 1,001 paths: a typed 400, as the Hub


def _raw(
    url: str, method: str = "GET", data: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    try:
        with urlopen(Request(url, method=method, data=data), timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except HTTPError as err:
        return err.code, dict(err.headers), err.read()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/whoami-v2"),
        ("GET", "/api/spaces"),
        ("GET", "/api/spaces/cmh-test/history"),
        ("GET", "/api/models/cmh-test/history/discussions"),
        ("GET", "/api/models/cmh-test/history/xet-read-token/main"),
        ("POST", "/api/models/cmh-test/history/preupload/main"),
        ("POST", "/api/models/cmh-test/history/commit/main"),
        ("DELETE", "/api/repos/delete"),
        ("GET", "/api/models/cmh-test/history/blame/main/a.txt"),  # /raw/ is served (issue 40)
        ("PUT", "/api/unknown"),
    ],
)
def test_unknown_endpoints_answer_a_json_404(hub: HubApiStore, method: str, path: str) -> None:
    data = b"{}" if method in ("POST", "PUT") else None
    status, headers, body = _raw(hub.server.url + path, method, data)
    assert status == 404
    assert headers["Content-Type"].startswith("application/json")
    document = json.loads(body)
    assert isinstance(document.get("error"), str) and document["error"]
    assert headers["X-Error-Message"] == document["error"]
    assert "X-Error-Code" not in headers  # not a repo, revision or entry the client would cache


# -- hostile cards and weight files ---------------------------------------------------------


def _alias_bomb(levels: int = 9) -> str:
    """YAML whose aliases stand for 10**levels strings once written out."""
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 10) + "]")
    return "---\n" + "\n".join(lines) + "\nlicense: mit\n---\n# bomb\n"


def test_hostile_cards_and_weight_files_are_ignored(tmp_path: Path, mirror_server_factory) -> None:
    store = tmp_path / "store"
    cards = {
        "cmh-test/alias-bomb": _alias_bomb(),
        "cmh-test/deep": "---\nx: " + "[" * 5000 + "]" * 5000 + "\n---\n",
        "cmh-test/a-list": "---\n- a\n- b\n---\n",
        "cmh-test/no-block": "# just text\nlicense: mit\n",
    }
    for repo, card in cards.items():
        _add(store, _write(tmp_path / repo.replace("/", "--"), {"README.md": card}), repo)
    latin = tmp_path / "latin"
    latin.mkdir()
    (latin / "README.md").write_bytes(b"---\nlicense: mit\n---\n\xff\xfe not UTF-8 \xe9\n")
    _add(store, latin, "cmh-test/latin")
    bad = _write(tmp_path / "bad", {"README.md": "# weights that are not safetensors\n"})
    (bad / "model.safetensors").write_bytes(b"\xff" * 64)
    _add(store, bad, "cmh-test/bad-weights")
    sharded = _write(tmp_path / "sharded", {"README.md": "# shards\n"})
    save_file({"w": np.zeros((4, 4), np.float32)}, str(sharded / "part-a.safetensors"))
    save_file({"v": np.zeros((3,), np.float16)}, str(sharded / "part-b.safetensors"))
    save_file({"stray": np.zeros((99,), np.float32)}, str(sharded / "other.safetensors"))
    weight_map = {"w": "part-a.safetensors", "v": "part-b.safetensors"}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _add(store, sharded, "cmh-test/sharded")
    server = mirror_server_factory(store)
    api = HfApi(endpoint=server.url, token=False)
    for repo in cards:
        info = api.model_info(repo)
        assert (info.card_data, info.tags) == (None, []), repo
    assert api.model_info("cmh-test/latin").tags == ["license:mit"]  # bad bytes after the block
    assert api.model_info("cmh-test/bad-weights").safetensors is None
    sharded_info = api.model_info("cmh-test/sharded").safetensors
    assert sharded_info is not None  # the shards the index names, not the stray file
    assert (sharded_info.parameters, sharded_info.total) == ({"F16": 3, "F32": 16}, 19)
    assert {m.id for m in api.list_models(filter="license:mit")} == {"cmh-test/latin"}


def test_a_card_whose_blob_is_gone_or_wrong_comes_back_with_it(
    hub: HubApiStore, tmp_path: Path, mirror_server_factory
) -> None:
    """A README blob that is quarantined, or whose bytes do not match its name, gives no
    card; nothing of that is remembered, so the card is back with the good bytes."""
    store = tmp_path / "store"
    folder = "models--cmh-test--mixed"
    shutil.copytree(hub.server.store / folder, store / folder, symlinks=True)
    server = mirror_server_factory(store)
    api = HfApi(endpoint=server.url, token=False)
    readme = store / folder / "snapshots" / hub.commits[f"{MIXED}@main"] / "README.md"
    blob = readme.resolve()
    good = blob.read_bytes()
    kept = tmp_path / "kept-blob"
    blob.rename(kept)
    assert api.model_info(MIXED).card_data is None
    assert api.model_info(MIXED).sha == hub.commits[f"{MIXED}@main"]
    kept.rename(blob)
    blob.chmod(0o644)
    wrong = good.replace(b"text-classification", b"text-clazzification")
    assert len(wrong) == len(good) and wrong != good
    blob.write_bytes(wrong)
    assert api.model_info(MIXED).pipeline_tag is None
    blob.write_bytes(good)
    info = api.model_info(MIXED)
    assert info.card_data is not None and info.pipeline_tag == "text-classification"


@pytest.mark.parametrize(
    "tail",
    ["/refs", "/refs?include_prs=1", "/commits/main", "/auth-check", "/auth-check/write",
     "/tree/main?expand=true", "?expand=safetensors"],
)  # fmt: skip
def test_a_private_repo_answers_the_new_endpoints_like_a_missing_one(
    hub: HubApiStore, tail: str
) -> None:
    answers = []
    for repo in (SECRET, "cmh-test/no-such-repo"):
        status, headers, body = _raw(f"{hub.server.url}/api/models/{repo}{tail}")
        headers.pop("Date", None)
        answers.append((status, headers, body))
    assert answers[0] == answers[1]
    assert answers[0][0] == 404 and answers[0][1]["X-Error-Code"] == "RepoNotFound"
