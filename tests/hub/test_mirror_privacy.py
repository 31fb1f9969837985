"""Private means private on every path (issue 35): pull-through access, ``mirror sync``.

The upstream is ``tests/hub/hublike.py`` in front of the session's ``cmh serve``; it
serves ``cmh-test/tiny`` only to the mirror's upstream token while its JSON says
``"private": false`` (or nothing of access). Each test failed on the code before its fix.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bucket_support import use_bucket
from click.testing import CliRunner
from cmh.cli.main import cli
from deadline_support import TEST_DEADLINE
from hublike import HubLike, running
from mirror_support import TINY_REPO, MirrorServer, stop_servers

UPSTREAM_TOKEN = "hf_upstream_only_token_for_the_mirror_01"
#: Text of ``cmh-test/tiny`` no anonymous answer may hold (its config, README, file names);
#: a listing or a page about other things must not even name it.
SECRETS = ('"model_type": "tiny"', "# tiny v", "notes.txt", "leaf.txt")


def _drop_private(kind: str, path: str, doc: Any) -> Any:
    if kind == "repo_info" and isinstance(doc, dict):
        doc.pop("private", None)
    return doc


@contextlib.contextmanager
def _hidden_upstream(backend: str, says: str) -> Iterator[HubLike]:
    """The Hub-like upstream: TINY_REPO answers only ``Bearer UPSTREAM_TOKEN`` (else 401),
    its JSON saying ``"private": false`` (``says="false"``) or nothing of it (``"absent"``)."""
    with running(backend, xet_listing=False) as hub:
        hub.hide(TINY_REPO, frozenset({f"Bearer {UPSTREAM_TOKEN}"}))
        if says == "absent":
            hub.edit_json = _drop_private
        yield hub


def _request(
    server: MirrorServer, method: str, target: str, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if body else {}
    try:
        conn.request(method, target, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


#: (method, target, form body, whether the answer is about the repo itself: any 2xx leaks).
PROBES: list[tuple[str, str, bytes | None, bool]] = [
    ("GET", f"/{TINY_REPO}/resolve/main/config.json", None, True),
    ("HEAD", f"/{TINY_REPO}/resolve/main/config.json", None, True),
    ("GET", f"/{TINY_REPO}/resolve/main/README.md", None, True),
    ("GET", f"/api/models/{TINY_REPO}", None, True),
    ("GET", f"/api/models/{TINY_REPO}/revision/main", None, True),
    ("GET", f"/api/models/{TINY_REPO}/tree/main", None, True),
    ("GET", f"/api/models/{TINY_REPO}/tree/main/sub?recursive=true", None, True),
    ("POST", f"/api/models/{TINY_REPO}/paths-info/main", b"paths=config.json", True),
    ("GET", f"/api/models/{TINY_REPO}/refs", None, True),
    ("GET", f"/{TINY_REPO}", None, True),
    ("GET", f"/{TINY_REPO}/tree/main", None, True),
    ("GET", f"/{TINY_REPO}/blob/main/config.json", None, True),
    ("GET", f"/-/models/{TINY_REPO}", None, True),
    ("GET", "/api/models", None, False),
    ("GET", "/api/models?search=tiny", None, False),
    ("GET", "/api/models?author=cmh-test", None, False),
    ("GET", "/", None, False),
    ("GET", "/?search=tiny", None, False),
]


def leaks(server: MirrorServer) -> list[str]:
    """Every anonymous answer of ``server`` that shows something of TINY_REPO."""
    found = []
    for method, target, body, own in PROBES:
        status, headers, data = _request(server, method, target, body)
        text = data.decode("utf-8", "replace")
        if own and status < 400:
            found.append(f"{method} {target}: {status}")
        elif "x-linked-etag" in headers or "x-repo-commit" in headers:
            found.append(f"{method} {target}: {status} with {headers}")
        elif any(s in text for s in SECRETS) or (not own and TINY_REPO in text):
            found.append(f"{method} {target}: {status} shows {text[:200]!r}")
    _, _, data = _request(server, "GET", "/metrics")
    samples = {
        line.split()[0]: float(line.split()[1])
        for line in data.decode().splitlines()
        if line.startswith("cmh_mirror_store_")
    }
    if samples.get("cmh_mirror_store_repos") or samples.get("cmh_mirror_store_bytes"):
        found.append(f"/metrics counts it: {samples}")
    return found


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Path | str:
    """A folder, or a moto bucket prefix (its settings in this process's environment)."""
    if kind == "folder":
        (tmp_path / "store").mkdir()
        return tmp_path / "store"
    bucket = request.getfixturevalue("moto_bucket")
    use_bucket(bucket, tmp_path, request.getfixturevalue("monkeypatch"))
    return str(bucket.url)


@contextlib.contextmanager
def _servers(
    store: Path | str, count: int, tmp_path: Path, *args: str
) -> Iterator[list[MirrorServer]]:
    started: list[MirrorServer] = []
    try:
        for _ in range(count):
            started.append(MirrorServer(store, tmp_path / "logs", extra_args=args))  # type: ignore[arg-type]
        yield started
    finally:
        stop_servers(started)


def _token_file(tmp_path: Path) -> Path:
    token = tmp_path / "upstream-token"
    token.write_text(UPSTREAM_TOKEN + "\n")
    return token


@pytest.mark.parametrize(
    ("kind", "says"),
    [("folder", "false"), ("bucket", "absent"), ("fleet", "false")],
)
def test_a_repo_only_the_upstream_token_reads_is_private_on_every_path(
    kind: str, says: str, mirror: MirrorServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The upstream serves the repo only with the mirror's token, its JSON saying nothing
    of access: every anonymous answer (resolve, HEAD, api, tree, paths-info, pages,
    listings, metrics) on every replica shows nothing of it (the old code served it)."""
    store = _store("folder" if kind == "folder" else "bucket", tmp_path, request)
    with (
        _hidden_upstream(mirror.url, says) as upstream,
        _servers(
            store, 2 if kind == "fleet" else 1, tmp_path,
            "--upstream", upstream.url, "--upstream-token-file", str(_token_file(tmp_path)),
        ) as servers,
    ):  # fmt: skip
        for server in servers:
            assert leaks(server) == []
        # The repo is held now (its listing was kept): still nothing, asked again.
        for server in servers:
            assert leaks(server) == []
        assert not upstream.records(origin="cdn")  # no body was ever started
        # The same mirror serves a public repo of the same upstream to anyone.
        status, _, data = _request(
            servers[-1], "GET", "/sentence-transformers/all-MiniLM-L6-v2/resolve/main/config.json"
        )
        assert status == 200 and json.loads(data)


def _sync(store: Path | str, upstream: HubLike, tmp_path: Path, *extra: str) -> tuple[dict, str]:
    args = ["mirror", "sync", TINY_REPO, "--store", str(store), "--from", upstream.url,
            "--token-file", str(_token_file(tmp_path)), *extra]  # fmt: skip
    words = CliRunner().invoke(cli, args)
    assert words.exit_code == 0, words.output
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["repos"][0], words.output


@pytest.mark.parametrize(("kind", "says"), [("folder", "false"), ("bucket", "absent")])
def test_mirror_sync_keeps_what_the_upstream_token_reads_private_and_says_so(
    kind: str, says: str, mirror: MirrorServer, tmp_path: Path, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``cmh mirror sync --token-file`` of a repo the upstream serves only with the token:
    an access record keeps it private at ``cmh serve`` (no ``--tokens``, no upstream), the
    output says so; ``--public-upstream-repos`` serves it to anyone, and says that (the
    old code made it public with no record and no word)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # a bucket's sync cache
    store = _store(kind, tmp_path, request)
    with _hidden_upstream(mirror.url, says) as upstream:
        doc, words = _sync(store, upstream, tmp_path)
        assert (doc["needs_token"], doc["private"]) == (True, True)
        assert f"{TINY_REPO}: kept private: the upstream serves it only with the token" in words
        assert "--public-upstream-repos" in words
        with _servers(store, 1, tmp_path, "--ref-ttl", "0.1") as (server,):
            assert leaks(server) == []
            doc, words = _sync(store, upstream, tmp_path, "--public-upstream-repos")
            assert (doc["needs_token"], doc["private"]) == (True, False)
            assert "served to anyone (--public-upstream-repos)" in words
            target = f"/{TINY_REPO}/resolve/main/config.json"
            # A bucket's access record is re-read each 0.1 s.
            deadline = time.monotonic() + TEST_DEADLINE
            while _request(server, "GET", target)[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            status, _, data = _request(server, "GET", target)
            assert status == 200 and b'"model_type": "tiny"' in data


# -- refusals take the same steps whether the repo exists or not --------------------------


class _Spy:
    """The real ``target``, each method call it answers noted in ``steps`` (by name)."""

    def __init__(self, target: Any, label: str, steps: list[str]) -> None:
        self._target, self._label, self._steps = target, label, steps

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._steps.append(f"{self._label}.{name}")
            return attr(*args, **kwargs)

        return call


def test_a_refused_repo_takes_the_steps_of_a_missing_one(tmp_path: Path) -> None:
    """A repo named in the tokens file, one an access record keeps private and a name
    the store lacks: the same store, policy and record look-ups, for no token, a wrong
    one and (the private ones) a token of another repo; the same answer (the old code
    skipped the access records for a named repo and the gated record for a missing
    one)."""
    from cmh.hub.mirror import AccessPolicy, UpstreamConfig, add_folder, load_tokens
    from cmh.hub.mirror import _app as app_module
    from cmh.hub.mirror._errors import HubError
    from cmh.hub.mirror._observe import Metrics
    from cmh.hub.mirror._routes import parse_target
    from cmh.hub.mirror._upstream import Upstream
    from cmh.hub.mirror.stores import open_store
    from mirror_support import write_tiny_repo

    store = tmp_path / "store"
    for name in ("acme/named", "acme/recorded", "acme/public"):
        add_folder(store, write_tiny_repo(tmp_path / name.replace("/", "-"), 1), name)
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("token-of-named-1 acme/named\ntoken-of-public-1 acme/public\n")
    backend = open_store(store)
    backend.pull_through(300.0).record_access("model", "acme/recorded", True, False)
    steps: list[str] = []
    pull = _Spy(backend.pull_through(300.0), "records", steps)
    policy: AccessPolicy = load_tokens(tokens)
    policy = AccessPolicy(policy.grants, restricted=pull.restricted)
    state = app_module.MirrorState(_Spy(backend, "store", steps), policy, Metrics(None))
    state.upstream = Upstream(pull, UpstreamConfig("http://127.0.0.1:9"))

    def refusal(name: str, token: str | None) -> tuple[list[str], tuple[int, str, str]]:
        steps.clear()
        with pytest.raises(HubError) as caught:
            app_module._readable(state, parse_target(f"/api/models/{name}"), token)
        exc = caught.value
        return list(steps), (exc.status, exc.code, exc.message)

    for token in (None, "wrong-token-0001", "token-of-public-1"):
        missing = refusal("acme/nothing-here", token)
        assert missing[1] == (404, "RepoNotFound", "Repository not found")
        for name in ("acme/named", "acme/recorded"):
            assert refusal(name, token) == missing, (name, token)
