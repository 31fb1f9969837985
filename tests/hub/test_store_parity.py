"""One suite, every store kind: each mirror feature over a local folder, a SeaweedFS
bucket, a moto bucket and a ministack bucket (real servers started by the fixtures),
and the in-memory store.

Each kind gets one store (MiniLM, the tiny repo, a private repo, imported with
``cmh mirror add``) and one ``cmh serve`` for the module; the tests then ask every
feature of it the same way, through the CLI and HTTP only. The in-memory store lives
in this process: its repos are imported through the store protocol (what ``mirror
add`` calls) and it is served here, by the same application on 127.0.0.1
(:class:`InProcessServer`); a feature asked through the CLI (another process) or
that only a storage has (check records, redirects) does not apply to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import HTTPRedirectHandler, Request, build_opener

import pytest
from deadline_support import TEST_DEADLINE
from mirror_support import (
    MINILM_REPO,
    PRIVATE_REPO,
    PRIVATE_TOKEN,
    TINY_REPO,
    MirrorServer,
    write_tiny_repo,
)
from motoserver import BUCKET, S3Bucket
from seaweed import SeaweedBucket

from cmh import format_size, plural

KINDS = ("local", "seaweed", "moto", "ministack", "memory")
#: A tiny stamped model: its fingerprint takes the stamp, checked at import, for its bytes.
STAMPED_REPO = "acme/stamped"
#: Opens the web operator page (``--admin-tokens``).
ADMIN_TOKEN = "hf_cmh_parity_admin_0001"


class InProcessServer:
    """The mirror's application over a store of this process, served on 127.0.0.1 from a
    thread: what ``cmh serve`` runs in a worker (the same ``MirrorState``, ``make_app``,
    access logger and pages), for a store another process cannot open (memory)."""

    def __init__(self, store: Any, log_dir: Path, tokens: Path, admins: Path) -> None:
        import asyncio
        import logging
        import threading

        from aiohttp import web
        from cmh.hub.mirror._app import make_app
        from cmh.hub.mirror._auth import load_tokens
        from cmh.hub.mirror._observe import AccessLogger, Metrics, configure
        from cmh.hub.mirror._state import RECORDS_FRESH_FOR, MirrorState
        from cmh.hub.mirror.web._options import web_options

        log_dir.mkdir(parents=True, exist_ok=True)
        self.access_log = log_dir / f"access-{uuid.uuid4().hex[:8]}.jsonl"
        self.stderr_path = self.access_log.with_suffix(".stderr")
        self._stream = open(self.access_log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._errors = logging.FileHandler(self.stderr_path)  # what a server prints
        self._errors.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger("aiohttp").addHandler(self._errors)
        records = store.pull_through(RECORDS_FRESH_FOR)
        policy = load_tokens(tokens)
        from dataclasses import replace

        policy = replace(policy, restricted=records.restricted)
        metrics = Metrics(store, private=policy.private, restricted=policy.restricted)
        configure(metrics, self._stream)
        state = MirrorState(store, policy, metrics, records=records)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(make_app(state, web_options(admins, (), self.access_log)),
                                    access_log_class=AccessLogger)  # fmt: skip
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.host, self.port = site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{self.port}"
        self.workers = 1  # one process logs every request (MirrorServer.sync)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def log(self, **match: Any) -> list[dict[str, Any]]:
        return MirrorServer.log(self, **match)  # type: ignore[arg-type]

    def sync(self) -> None:
        MirrorServer.sync(self)  # type: ignore[arg-type]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return MirrorServer.metrics(self)  # type: ignore[arg-type]

    def stop(self) -> None:
        import asyncio
        import logging

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()
        logging.getLogger("aiohttp").removeHandler(self._errors)
        self._errors.close()
        self._stream.close()


def not_for_memory(served: Served, why: str) -> None:
    """Skip a feature the in-memory store cannot show (it lives in this process only)."""
    if served.kind == "memory":
        pytest.skip(f"not for a memory store: {why}")


@dataclass
class Served:
    kind: str
    store: str  # what --store takes
    env: dict[str, str]
    server: MirrorServer
    tokens: Path
    commits: dict[str, str]  # repo -> commit of main
    minilm_dir: Path
    stamped_dir: Path


def write_stamped_model(folder: Path) -> Path:
    """A two-tensor BERT-shaped model, stamped (``cmh stamp``)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir()
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 8,
              "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 32}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(7)
    tensors = {
        "embeddings.word_embeddings.weight": rng.standard_normal((32, 8)).astype("float32"),
        "pooler.dense.weight": rng.standard_normal((8, 8)).astype("float32"),
    }
    save_file(tensors, str(folder / "model.safetensors"))
    cmh(["stamp", str(folder / "model.safetensors"), "--ttl", "30d"], dict(os.environ))
    return folder


def cmh(
    args: list[str], env: dict[str, str], check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", *args], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _aws_env(settings: dict[str, str], tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(settings)
    env["AWS_CONFIG_FILE"] = str(tmp / "no-aws-config")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp / "no-aws-credentials")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


@pytest.fixture(scope="module", params=KINDS)
def served(
    request: pytest.FixtureRequest, minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"parity-{kind}")
    if kind == "local":
        store, env = str(tmp / "store"), _aws_env({}, tmp)
    elif kind == "seaweed":
        seaweed = request.getfixturevalue("seaweed")
        where = SeaweedBucket(seaweed, seaweed.bucket, f"parity-{uuid.uuid4().hex[:10]}/")
        store, env = where.url, _aws_env(where.aws_env(), tmp)
    elif kind == "memory":
        store, env = f"memory://parity-{uuid.uuid4().hex[:10]}", _aws_env({}, tmp)
    else:  # moto, ministack: a fresh prefix of the session server's bucket
        s3 = request.getfixturevalue(kind)
        bucket = S3Bucket(s3.endpoint, s3.bucket, f"parity-{uuid.uuid4().hex[:10]}/")
        store, env = bucket.url, _aws_env(bucket.aws_env(), tmp)
    commits = {}
    stamped = write_stamped_model(tmp / "stamped")
    private = tmp / "private"
    private.mkdir()
    (private / "config.json").write_text('{"secret": true}\n')
    for src, repo in (
        (minilm_dir, MINILM_REPO),
        (write_tiny_repo(tmp / "tiny", 1), TINY_REPO),
        (private, PRIVATE_REPO),
        (stamped, STAMPED_REPO),
    ):
        if kind == "memory":  # what `mirror add` calls, in this process
            from cmh.hub.mirror.stores import open_store

            commits[repo] = open_store(store).add_folder(src, repo).commit
            continue
        out = cmh(["mirror", "add", str(src), "--store", store, "--repo", repo, "--json"], env)
        commits[repo] = json.loads(out.stdout)["commit"]
    tokens = tmp / "tokens.txt"
    # a case typo: the tokens file names a repo the store does not hold
    tokens.write_text(f"{PRIVATE_TOKEN}  {PRIVATE_REPO}\n{PRIVATE_TOKEN}  CMH-test/Tiny\n")
    admins = tmp / "admin-tokens.txt"
    admins.write_text(ADMIN_TOKEN + "\n")
    server: Any
    if kind == "memory":
        from cmh.hub.mirror.stores import open_store

        server = InProcessServer(open_store(store), tmp / "logs", tokens, admins)
    else:
        server = MirrorServer(store, tmp / "logs", tokens=tokens, env=env,
                              extra_args=("--admin-tokens", str(admins)))  # fmt: skip
    try:
        yield Served(kind, store, env, server, tokens, commits, minilm_dir, stamped)
    finally:
        server.stop()


class _NoRedirect(HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 302 is the answer under test, not followed


_OPENER = build_opener(_NoRedirect)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET (redirects are not followed)."""
    try:
        with _OPENER.open(Request(url, headers=headers or {}), timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_hub_api(served: Served) -> None:
    url = served.server.url
    status, _, body = get(f"{url}/api/models/{TINY_REPO}")
    assert status == 200 and json.loads(body)["sha"] == served.commits[TINY_REPO]
    status, _, body = get(f"{url}/api/models/{TINY_REPO}/tree/main?recursive=true")
    assert status == 200
    assert "sub/deeper/leaf.txt" in {e["path"] for e in json.loads(body)}
    status, headers, body = get(f"{url}/{TINY_REPO}/resolve/main/weights.bin")
    assert status == 200 and body == bytes((i * 7 + 1) % 256 for i in range(300_000))
    assert headers["ETag"].strip('"') == hashlib.sha256(body).hexdigest()
    status, _, body = get(f"{url}/{TINY_REPO}/resolve/main/weights.bin", {"Range": "bytes=10-19"})
    assert status == 206 and body == bytes((i * 7 + 1) % 256 for i in range(10, 20))
    status, _, body = get(f"{url}/api/models/{TINY_REPO}/refs")
    assert (
        status == 200
        and json.loads(body)["branches"][0]["targetCommit"] == served.commits[TINY_REPO]
    )
    status, _, body = get(f"{url}/api/models/{TINY_REPO}/commits/main")
    assert status == 200 and json.loads(body)[0]["id"] == served.commits[TINY_REPO]
    status, _, body = get(f"{url}/api/models?search=tiny")
    assert status == 200 and [m["id"] for m in json.loads(body)] == [TINY_REPO]
    assert get(f"{url}/api/models/{PRIVATE_REPO}")[0] == 404
    auth = {"Authorization": f"Bearer {PRIVATE_TOKEN}"}
    assert get(f"{url}/api/models/{PRIVATE_REPO}", auth)[0] == 200


def test_preconditions_and_range_forms(served: Served) -> None:
    """Every kind answers ``If-Match``, ``If-Range`` and the edge forms of ``Range`` alike
    (RFC 9110 13.1.1, 13.1.5, 14.1): one place decides, before any delivery."""
    url = f"{served.server.url}/{TINY_REPO}/resolve/main/weights.bin"
    data = bytes((i * 7 + 1) % 256 for i in range(300_000))
    etag = f'"{hashlib.sha256(data).hexdigest()}"'
    status, headers, body = get(url, {"If-Match": '"0000"', "Range": "bytes=0-9"})
    assert (status, headers["X-Error-Code"], headers["ETag"]) == (412, "PreconditionFailed", etag)
    assert data[:10] not in body
    for matching in (etag, "*", f'"0000", {etag}'):
        assert get(url, {"If-Match": matching, "Range": "bytes=0-9"})[::2] == (206, data[:10])
    assert get(url, {"If-Match": f"W/{etag}"})[0] == 412  # a weak tag never matches
    assert get(url, {"Range": "bytes=0-9", "If-Range": etag})[::2] == (206, data[:10])
    for other in (f"W/{etag}", "*", f"{etag}, {etag}", etag.strip('"'),
                  "Mon, 07 Dec 2026 12:00:00 GMT"):  # fmt: skip
        assert get(url, {"Range": "bytes=0-9", "If-Range": other})[::2] == (200, data), other
    huge = "9" * 25
    assert get(url, {"Range": f"bytes=299990-{huge}"})[::2] == (206, data[299990:])
    assert get(url, {"Range": f"bytes=-{huge}"})[::2] == (206, data)
    assert get(url, {"Range": f"bytes={huge}-"})[0] == 416
    assert get(url, {"Range": "bytes=0-1,,4-5,"})[0] == 206  # empty list elements ignored
    assert get(url, {"Range": "bytes=\uff10-\uff11".encode().decode("latin-1")})[0] == 416


def test_fingerprint(served: Served) -> None:
    from cmh.semantic import fingerprint

    status, _, body = get(f"{served.server.url}/api/cmh/fingerprint/{MINILM_REPO}/main")
    assert status == 200, body
    doc = json.loads(body)
    assert doc["commit"] == served.commits[MINILM_REPO]
    assert doc["fingerprint"] == json.loads(json.dumps(fingerprint(served.minilm_dir).to_dict()))
    status, headers, _ = get(f"{served.server.url}/api/cmh/fingerprint/{TINY_REPO}/main")
    assert status == 422 and headers["X-Error-Code"] == "NotAModel"


def test_fingerprint_of_a_stamped_model_hashes_no_blob(served: Served) -> None:
    """Issue 34: a bucket's fingerprint re-read and re-hashed every blob on a cold replica
    ("no check record"), though ``mirror add`` had checked each; a folder hashed none.
    Every kind now takes the stamp checked at import: nothing is hashed."""
    from cmh.semantic import fingerprint

    status, _, body = get(f"{served.server.url}/api/cmh/fingerprint/{STAMPED_REPO}/main")
    assert status == 200, body
    doc = json.loads(body)["fingerprint"]
    assert doc["hashed_files"] == [] and doc["untrusted_stamps"] == {}, doc
    local = fingerprint(served.stamped_dir).to_dict()
    assert {k: doc[k] for k in ("scope", "graph", "weights", "config")} == {
        k: local[k] for k in ("scope", "graph", "weights", "config")
    }


@contextlib.contextmanager
def storage_env(served: Served) -> Iterator[None]:
    """This process's environment set to reach the store's storage, for a while."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(served.env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _store_file(served: Served, name: str) -> bytes | None:
    """The bytes of ``name`` (relative to the store) read straight from the storage."""
    if served.kind == "local":
        path = Path(served.store) / name
        return path.read_bytes() if path.is_file() else None
    if served.kind == "memory":  # the manifests it keeps (it has no other files)
        from cmh.hub.mirror.stores import open_store

        folder, _, rest = name.partition("/.cmh/manifests/")
        store: Any = open_store(served.store)
        for (repo_type, repo_id), repo in store._repos.items():
            if f"{repo_type}s--{repo_id.replace('/', '--')}" == folder:
                doc = repo.manifests.get(rest.removesuffix(".json"))
                return json.dumps(doc).encode() if doc is not None else None
        return None
    from cmh.hub.mirror.stores.bucket._objectstore import ObjectNotFound, ObjectStore

    with storage_env(served):
        try:
            return ObjectStore.open(served.store).get(name)
        except ObjectNotFound:
            return None


def _overwrite(served: Served, name: str, data: bytes) -> None:
    """Replace the bytes of ``name`` in the storage (a corruption)."""
    if served.kind == "local":
        path = Path(served.store) / name
        path.chmod(0o644)
        with open(path, "r+b") as f:  # in place, as a storage fault would
            f.write(data)
        return
    if served.kind == "memory":
        from cmh.hub.mirror.stores import open_store

        folder, _, etag = name.partition("/blobs/")
        store: Any = open_store(served.store)
        for (repo_type, repo_id), repo in store._repos.items():
            if f"{repo_type}s--{repo_id.replace('/', '--')}" == folder:
                repo.blobs[etag] = data
        return
    from cmh.hub.mirror.stores.bucket._objectstore import ObjectStore

    with storage_env(served):
        ObjectStore.open(served.store).put(name, data)


def _manifest_kept(served: Served, etag: str) -> bool:
    """Whether the import kept the manifest of ``etag`` (read straight from the store)."""
    folder = "models--" + MINILM_REPO.replace("/", "--")
    return _store_file(served, f"{folder}/.cmh/manifests/{etag}.json") is not None


def test_manifest_written_at_import_and_served(served: Served) -> None:

    blob = (served.minilm_dir / "model.safetensors").read_bytes()
    etag = hashlib.sha256(blob).hexdigest()
    assert _manifest_kept(served, etag)
    url = f"{served.server.url}/api/cmh/manifest/{MINILM_REPO}/resolve/main/model.safetensors"
    status, _, body = get(url)
    assert status == 200, body
    doc = json.loads(body)
    assert doc["etag"] == etag and doc["tensors"]
    first = doc["tensors"][0]
    base = 8 + doc["header_size"]  # the length prefix, then the header, then the data
    data = blob[base + first["begin"] : base + first["end"]]
    assert hashlib.sha256(data).hexdigest() == first["sha256"]


def test_metrics_store_size(served: Served) -> None:
    samples = served.server.metrics()
    size = {name: v for (name, _), v in samples.items()}
    public = sum(
        p.stat().st_size for p in served.minilm_dir.rglob("*") if p.is_file()
    )  # at least MiniLM's bytes; the private repo is not counted
    assert size["cmh_mirror_store_bytes"] >= public
    assert size["cmh_mirror_store_repos"] == 3  # MiniLM, the tiny repo, the stamped one


def test_tokens_typo_warned(served: Served) -> None:
    not_for_memory(served, "`cmh mirror ls` runs in another process")
    assert "CMH-test/Tiny" in served.server.stderr_text()
    out = cmh(["mirror", "ls", "--store", served.store, "--tokens", str(served.tokens)], served.env)
    assert "CMH-test/Tiny" in out.stderr and TINY_REPO in out.stderr


def test_mirror_ls(served: Served) -> None:
    not_for_memory(served, "`cmh mirror ls` runs in another process")
    out = cmh(["mirror", "ls", "--store", served.store, "--json"], served.env)
    repos = {r["repo_id"] for r in json.loads(out.stdout)["repos"]}
    assert repos == {MINILM_REPO, TINY_REPO, PRIVATE_REPO, STAMPED_REPO}


def test_scrub(served: Served) -> None:
    not_for_memory(served, "`cmh mirror scrub` runs in another process")
    out = cmh(["mirror", "scrub", "--store", served.store, "--json", "--no-quarantine"], served.env)
    report = json.loads(out.stdout)
    assert report["ok"] and report["blobs"] >= 10 and report["bytes"] > 0


# -- web pages ---------------------------------------------------------------------------


def page(served: Served, path: str, token: str | None = None) -> tuple[int, str]:
    """Status and text of a web page, asked with ``token`` as the login cookie."""
    headers = {"Cookie": f"cmh_token={token}"} if token else {}
    status, _, body = get(f"{served.server.url}{path}", headers)
    return status, body.decode("utf-8", "replace")


def test_page_list(served: Served) -> None:
    status, text = page(served, "/")
    assert status == 200, text
    assert TINY_REPO in text and MINILM_REPO in text
    assert PRIVATE_REPO not in text  # private without a token
    status, text = page(served, "/", PRIVATE_TOKEN)
    assert status == 200 and PRIVATE_REPO in text
    status, text = page(served, "/models?q=tiny")
    assert status == 200 and TINY_REPO in text and MINILM_REPO not in text


def test_page_list_shows_only_repos(served: Served) -> None:
    """A folder holding no commit (only a blob: an import killed before its ref moved,
    or another tool's leftovers) is no repo: neither the list page nor the API lists it."""
    from cmh.hub.mirror.stores.bucket._objectstore import ObjectStore

    stray = "models--cmh-test--nocommit"
    name = f"{stray}/blobs/{'a' * 64}"  # a bad blob too: removed below, before any scrub
    if served.kind == "local":
        path = Path(served.store) / name
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
    elif served.kind == "memory":
        from cmh.hub.mirror.stores import open_store

        memory: Any = open_store(served.store)
        memory._repos[("model", "cmh-test/nocommit")] = type(memory._repos[("model", TINY_REPO)])(
            blobs={"a" * 64: b"x"}
        )
    else:
        with storage_env(served):
            ObjectStore.open(served.store).put(name, b"x")
    try:
        status, text = page(served, "/")
        assert status == 200 and TINY_REPO in text and "cmh-test/nocommit" not in text
        status, _, body = get(f"{served.server.url}/api/models")
        assert status == 200 and "cmh-test/nocommit" not in body.decode()
    finally:
        if served.kind == "local":
            shutil.rmtree(Path(served.store) / stray)
        elif served.kind == "memory":
            del memory._repos[("model", "cmh-test/nocommit")]
        else:
            with storage_env(served):
                ObjectStore.open(served.store).delete(name)


def test_page_repo(served: Served) -> None:
    status, text = page(served, f"/{TINY_REPO}")
    assert status == 200, text
    for name in ("weights.bin", "config.json", "sub", "tiny v1"):  # tree and card
        assert name in text, name
    assert served.commits[TINY_REPO][:12] in text
    side = text.split('id="commits"', 1)[1].split("</ul>", 1)[0]
    assert "no commit record" not in side  # made by `cmh mirror add`: its record is read
    status, text = page(served, f"/{TINY_REPO}/tree/main/sub")
    assert status == 200 and "notes.txt" in text and "deeper" in text
    status, text = page(served, f"/{MINILM_REPO}")
    assert status == 200 and "model.safetensors" in text
    assert page(served, f"/{TINY_REPO}/tree/no-such-branch")[0] == 404


def test_page_file(served: Served) -> None:
    status, text = page(served, f"/{TINY_REPO}/blob/main/sub/notes.txt")
    assert status == 200 and "notes" in text
    status, text = page(served, f"/{MINILM_REPO}/blob/main/model.safetensors")
    assert status == 200, text
    assert 'id="tensor-summary"' in text  # the header, read through the store
    assert "embeddings.word_embeddings.weight" in text


def test_page_verification_reads_through_the_store(served: Served) -> None:
    """The file page's ``cmh.verify`` (what ``?verify=1`` runs) gets the blob through the
    store (a checked copy from a bucket) and says what a verify of the file itself says."""
    from cmh.hub.mirror.stores import open_store
    from cmh.hub.mirror.web._views import StampCache, verify_file

    with storage_env(served):
        store = open_store(Path(served.store) if served.kind == "local" else served.store)
        index = store.resolve("model", MINILM_REPO, "main")
        assert index is not None
        entry = index.files["model.safetensors"]
        got = StampCache().verify(store, index, entry)
        stamp = StampCache().stamp(store, entry)
    want = verify_file(served.minilm_dir / "model.safetensors")
    assert (got.result.ok, got.result.outcome, got.result.mismatched) == (
        want.result.ok,
        want.result.outcome,
        want.result.mismatched,
    )
    assert stamp.tensor_count > 100 and not stamp.stamped


def test_page_commits(served: Served) -> None:
    status, text = page(served, f"/{TINY_REPO}/commits/main")
    assert status == 200, text
    assert served.commits[TINY_REPO][:12] in text


def test_page_private_repo_needs_its_token(served: Served) -> None:
    for path in (f"/{PRIVATE_REPO}", f"/{PRIVATE_REPO}/blob/main/config.json",
                 f"/{PRIVATE_REPO}/commits/main"):  # fmt: skip
        status, text = page(served, path)
        assert status == 404 and "secret" not in text, path
        status, text = page(served, path, PRIVATE_TOKEN)
        assert status == 200, (path, text)
    assert "secret" in page(served, f"/{PRIVATE_REPO}/blob/main/config.json", PRIVATE_TOKEN)[1]


def test_page_operator(served: Served) -> None:
    not_for_memory(served, "`cmh mirror scrub` runs in another process; it is not pruned")
    assert page(served, "/-/operator")[0] == 403
    assert page(served, "/-/operator", PRIVATE_TOKEN)[0] == 403
    cmh(["mirror", "scrub", "--store", served.store, "--json", "--no-quarantine"], served.env)
    status, text = page(served, "/-/operator", ADMIN_TOKEN)
    assert status == 200, text
    assert 'id="size-chart"' in text and "<rect" in text
    sizes = text.split('id="sizes"', 1)[1].split("</table>", 1)[0]
    assert TINY_REPO in sizes and MINILM_REPO in sizes
    prune = text.split('id="prune"', 1)[1].split("</section>", 1)[0]
    assert "would free" in prune  # the dry run of the one planner
    for flags in ((), ("--expired",)):  # the same numbers as `cmh prune --dry-run` gives
        args = ["prune", "--store", served.store, "--dry-run", "--json", *flags]
        dry = json.loads(cmh(args, served.env).stdout)
        command = " ".join(("cmh prune --store STORE", *flags))
        words = re.sub(r"<[^>]+>", "", prune)  # the command's spans break it at its spaces
        assert (f"{command} would free {format_size(dry['freed'])}"
                f": {plural(dry['revisions'], 'revision')}") in words, (flags, dry)  # fmt: skip
    scrub = text.split('id="scrub"', 1)[1].split("</section>", 1)[0]
    assert "all good" in scrub  # the scrub just run, as the store recorded it


def test_mirror_sync(served: Served, tmp_path: Path) -> None:
    """``cmh mirror sync X --store S --from URL`` fills the store (here from the mirror
    itself: it is a Hub), and the synced repo is then served with its files."""
    not_for_memory(served, "`cmh mirror sync` runs in another process")
    target = served.store + "synced/" if served.kind != "local" else served.store + "-synced"
    env = {**served.env, "XDG_CACHE_HOME": str(tmp_path / "xdg")}  # a bucket's sync cache
    out = cmh(["mirror", "sync", TINY_REPO, "--store", target, "--from", served.server.url,
               "--json"], env)  # fmt: skip
    assert json.loads(out.stdout)["repos"][0]["commit"] == served.commits[TINY_REPO]
    listed = cmh(["mirror", "ls", "--store", target, "--json"], served.env)
    (repo,) = json.loads(listed.stdout)["repos"]
    assert repo["repo_id"] == TINY_REPO
    assert {r["name"] for r in repo["refs"]} >= {"main"}


def test_mirror_add_records_its_check(served: Served) -> None:
    """The check ``mirror add`` made is recorded in the store for every server, so the
    first GET does not hash the blob again (local: the file version; bucket: the object
    version)."""
    not_for_memory(served, "it keeps no check records: a blob is checked at each read")
    etag = hashlib.sha256(bytes((i * 7 + 1) % 256 for i in range(300_000))).hexdigest()
    record = _store_file(served, f"models--cmh-test--tiny/.cmh/checked/{etag}")
    assert record is not None
    status, _, body = get(f"{served.server.url}/{TINY_REPO}/resolve/main/weights.bin",
                          {"Range": "bytes=0-0"})  # fmt: skip
    assert status == 206 and body == b"\x01"


def _wait_for(probe: Any, want: Any, within: float) -> Any:
    """``probe()``'s answer once it is ``want``, else the answer of the first probe begun
    more than ``within`` seconds from now. A probe's own time does not count: on a busy
    machine one request can take longer than ``within``, and a probe begun in time may
    be answered from what the server knew before the bound."""
    deadline = time.monotonic() + within
    while True:
        begun = time.monotonic()
        got = probe()
        if got == want or begun > deadline:
            return got
        time.sleep(0.1)


def test_scrub_and_reimport_seen_within_ref_ttl(served: Served, tmp_path: Path) -> None:
    """A blob that scrub quarantined is no longer served (503), and once re-imported it is
    served again, by every replica within ``--ref-ttl`` (2 s here; redirect replicas
    never send a client to the deleted object)."""
    not_for_memory(served, "`cmh mirror scrub` and replicas run in other processes")
    repo = "cmh-test/scrubbed"
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(200_000)
    (src / "weights.bin").write_bytes(data)
    cmh(["mirror", "add", str(src), "--store", served.store, "--repo", repo], served.env)
    replicas = [served.server]
    if served.kind != "local":
        with storage_env(served):
            replicas.append(MirrorServer(served.store, tmp_path / "logs",  # type: ignore[arg-type]
                                         extra_args=("--blob-delivery", "redirect")))  # fmt: skip
    try:
        for replica in replicas:
            assert get(f"{replica.url}/{repo}/resolve/main/weights.bin")[0] in (200, 302)
        etag = hashlib.sha256(data).hexdigest()
        _overwrite(served, f"models--cmh-test--scrubbed/blobs/{etag}", b"\0" * len(data))
        out = cmh(["mirror", "scrub", "--store", served.store, "--json"], served.env, check=False)
        assert out.returncode == 1 and json.loads(out.stdout)["bad"]
        # the operator page shows that scrub and the blob it quarantined, on every kind
        status, text = page(served, "/-/operator", ADMIN_TOKEN)
        scrub = text.split('id="scrub"', 1)[1].split("</section>", 1)[0]
        assert status == 200 and "1 bad" in scrub
        quarantine = scrub.split('id="quarantine"', 1)[1]
        assert etag[:16] in quarantine and repo in quarantine

        def answer(replica: MirrorServer) -> int:
            status, headers, _ = get(f"{replica.url}/{repo}/resolve/main/weights.bin")
            if status == 302:  # where the client would go: it must exist
                return get(headers["Location"])[0]
            return status

        for replica in replicas:
            assert _wait_for(lambda r=replica: answer(r), 503, 2.0 + 1.5) == 503
        cmh(["mirror", "add", str(src), "--store", served.store, "--repo", repo], served.env)

        def body(replica: MirrorServer) -> bytes:
            status, headers, got = get(f"{replica.url}/{repo}/resolve/main/weights.bin")
            if status == 302:
                status, _, got = get(headers["Location"])
            return got if status == 200 else b""

        for replica in replicas:
            assert _wait_for(lambda r=replica: body(r), data, 2.0 + 1.5) == data
    finally:
        for replica in replicas[1:]:
            replica.stop()


def test_redirect_signed_for_the_public_storage_url(served: Served, tmp_path: Path) -> None:
    """``--public-storage-url``: redirects name the storage as clients reach it (here
    ``localhost`` where the replicas use ``127.0.0.1``), and that URL downloads the blob."""
    not_for_memory(served, "`cmh serve` runs in another process")
    if served.kind == "local":
        done = cmh(["serve", "--store", served.store, "--public-storage-url",
                    "http://localhost:1"], served.env, check=False)  # fmt: skip
        assert done.returncode == 2 and "bucket stores" in done.stderr
        return
    endpoint = served.env["AWS_ENDPOINT_URL"]
    public = endpoint.replace("127.0.0.1", "localhost")
    with storage_env(served):
        replica = MirrorServer(served.store, tmp_path / "logs",  # type: ignore[arg-type]
                               extra_args=("--blob-delivery", "redirect",
                                           "--public-storage-url", public))  # fmt: skip
    try:
        status, headers, _ = get(f"{replica.url}/{TINY_REPO}/resolve/main/weights.bin")
        assert status == 302 and headers["Location"].startswith(public + "/")
        status, _, body = get(headers["Location"])
        assert status == 200 and body == bytes((i * 7 + 1) % 256 for i in range(300_000))
    finally:
        replica.stop()


def test_pages_answer_503_while_the_storage_is_down(tmp_path: Path) -> None:
    """A page whose store cannot be read (its storage killed) is a 503 HTML page naming
    the trouble, never a traceback."""
    from motoserver import MotoServer

    moto = MotoServer(tmp_path / "moto.log")
    server = None
    try:
        bucket = S3Bucket(moto.endpoint, BUCKET, "down/")
        env = _aws_env(bucket.aws_env(), tmp_path)
        cmh(["mirror", "add", str(write_tiny_repo(tmp_path / "tiny", 1)), "--store", bucket.url,
             "--repo", TINY_REPO], env)  # fmt: skip
        server = MirrorServer(bucket.url, tmp_path / "logs", env=env)
        status, _, body = get(f"{server.url}/")
        assert status == 200 and TINY_REPO in body.decode()
        moto.process.kill()
        moto.process.wait()
        status, headers, body = get(f"{server.url}/")
        assert status == 503 and headers["Content-Type"].startswith("text/html")
        assert "the store cannot be read now" in body.decode()
        assert "Traceback" not in server.stderr_text()
    finally:
        if server is not None:
            server.stop()
        moto.stop()


def test_a_client_that_drops_mid_body_leaves_no_traceback(served: Served) -> None:
    """Issue 34: the folder path logged a client that left mid-body as ``cut: client went
    away``; the bucket proxy printed a traceback per dropped client. Every kind alike now,
    through one delivery object: the log line has the cut and the bytes sent."""
    import http.client
    import socket

    with open(served.minilm_dir / "model.safetensors", "rb") as f:
        size = os.fstat(f.fileno()).st_size
    assert size > 16 << 20  # far more than the loopback socket buffers hold
    path = f"/{MINILM_REPO}/resolve/main/model.safetensors?drop={uuid.uuid4().hex}"
    server = served.server
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    assert response.status == 200
    assert len(response.read(1 << 20)) == 1 << 20  # the server is mid-body
    assert conn.sock is not None
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()  # a reset, as a killed client's kernel sends
    entries: list[dict[str, Any]] = []
    deadline = time.monotonic() + TEST_DEADLINE
    while True:  # the handler notices at its next write; its log line follows
        entries = [e for e in server.log(route="resolve") if path in e["target"]]
        if entries or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(entries) == 1 and entries[0]["bytes"] < size, entries
    # the bytes the client got, on every kind (a folder's sendfile logged 0)
    assert entries[0]["bytes"] >= 1 << 20, json.dumps(entries)
    assert entries[0].get("cut") == "client went away", entries
    assert "Traceback" not in server.stderr_text(), server.stderr_text()[-3000:]


def test_a_client_that_leaves_before_its_headers_leaves_no_traceback(served: Served) -> None:
    """A client that sends its request and hangs up at once: the headers find the
    connection closing. Every kind logs it as a client that left, with no traceback (it
    printed aiohttp's "Cannot write to closing transport" traceback, and no log line).

    Nearly always the server learns of the close before its headers, and sends nothing.
    On a busy machine the client can be descheduled between its shutdown and its close;
    the server's first write then lands in the client's socket buffer, and the close
    resets the rest: the line then counts those bytes, still a cut short of the file."""
    import socket

    path = f"/{MINILM_REPO}/resolve/main/model.safetensors?early={uuid.uuid4().hex}"
    server = served.server
    with socket.create_connection((server.host, server.port), timeout=60) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        sock.shutdown(socket.SHUT_WR)  # the server reads the request, then the end
    entries: list[dict[str, Any]] = []
    deadline = time.monotonic() + TEST_DEADLINE
    while True:  # its log line follows the handler's end
        entries = [e for e in server.log(route="resolve") if path in e["target"]]
        if entries or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(entries) == 1, entries
    assert entries[0].get("cut") == "client went away", entries
    # 0 unless the client was descheduled before its close (the docstring); never whole
    assert entries[0]["bytes"] < (served.minilm_dir / "model.safetensors").stat().st_size, entries
    assert "Traceback" not in server.stderr_text(), server.stderr_text()[-3000:]


def _add(served: Served, src: Path, repo: str) -> str:
    """Import ``src`` as ``repo`` (``cmh mirror add``; a memory store's own call); its commit."""
    if served.kind == "memory":
        from cmh.hub.mirror.stores import open_store

        return open_store(served.store).add_folder(src, repo).commit
    out = cmh(["mirror", "add", str(src), "--store", served.store, "--repo", repo, "--json"],
              served.env)  # fmt: skip
    return str(json.loads(out.stdout)["commit"])


def test_a_file_name_with_a_control_character_is_refused_at_import(
    served: Served, tmp_path: Path
) -> None:
    """Every kind refuses at import a file name the mirror would refuse to serve (a
    newline in it: served 400, and a cmh pull-through refused the whole repo), naming
    the file and the character, before anything is written."""
    import http.client

    repo = f"cmh-test/control-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "newline\nname.txt").write_text("x")
    if served.kind == "memory":
        from cmh.hub.mirror.stores import open_store

        with pytest.raises(Exception, match="control character") as refused:
            open_store(served.store).add_folder(src, repo)
        said = str(refused.value)
    else:
        done = cmh(["mirror", "add", str(src), "--store", served.store, "--repo", repo],
                   served.env, check=False)  # fmt: skip
        assert done.returncode != 0
        said = done.stderr
    assert "newline\\nname.txt" in said and "U+000A" in said, said
    conn = http.client.HTTPConnection(served.server.host, served.server.port, timeout=60)
    try:
        conn.request("GET", f"/api/models/{repo}")
        assert conn.getresponse().status in (401, 404)  # nothing was imported
    finally:
        conn.close()


def test_a_blob_whose_bytes_went_bad_is_never_sent_whole(served: Served, tmp_path: Path) -> None:
    """Every kind, the in-memory one too, refuses a blob whose stored bytes are not its
    name: a 503 before any byte, or a body cut before its last byte; never the whole."""
    import http.client

    repo = "cmh-test/went-bad"
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(200_000)
    (src / "weights.bin").write_bytes(data)
    _add(served, src, repo)
    name = f"models--cmh-test--went-bad/blobs/{hashlib.sha256(data).hexdigest()}"
    wrong = data[::-1]  # the same size, other bytes
    _overwrite(served, name, wrong)
    try:
        url = f"{served.server.url}/{repo}/resolve/main/weights.bin"
        for _ in range(2):  # the first answer checks the bytes, the second knows them bad
            try:
                with _OPENER.open(Request(url), timeout=60) as r:
                    status, body = r.status, r.read()
            except HTTPError as exc:
                status, body = exc.code, b""
            except http.client.IncompleteRead as exc:
                status, body = -1, exc.partial  # cut before its last byte
            assert status in (503, -1), (status, len(body))
            assert len(body) < len(wrong)
    finally:
        _overwrite(served, name, data)  # the store as it was, for any test after this one


def test_an_empty_file_is_served_whole(served: Served, tmp_path: Path) -> None:
    """Every kind serves an empty file as a 200 with no body (a repo may hold one), a
    range of it as 416, and a HEAD of it as size 0."""
    import http.client
    from urllib.parse import urlsplit

    repo = "cmh-test/empty-file"
    src = tmp_path / "src"
    src.mkdir()
    (src / "empty.txt").write_bytes(b"")
    (src / "config.json").write_text("{}\n")
    _add(served, src, repo)
    path = f"/{repo}/resolve/main/empty.txt"
    for _ in range(2):  # the first GET checks the blob, the second knows it
        status, headers, body = get(served.server.url + path)
        assert (status, body) == (200, b""), (status, headers, body)
        assert len(headers.get("X-Repo-Commit", "")) == 40
    assert get(served.server.url + path, {"Range": "bytes=0-"})[0] == 416
    # RFC 9110 14.1.1: a suffix is the one range an empty file satisfies (answered whole)
    assert get(served.server.url + path, {"Range": "bytes=-5"})[::2] == (200, b"")
    where = urlsplit(served.server.url)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    try:
        conn.request("HEAD", path)
        head = conn.getresponse()
        head.read()
        assert head.status == 200 and head.getheader("Content-Length") == "0"
    finally:
        conn.close()
