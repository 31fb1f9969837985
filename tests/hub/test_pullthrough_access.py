"""Who reads a pulled-through repo, whatever name or revision asks for it.

A real ``cmh serve --upstream`` over a folder and over a moto bucket, in front of
:class:`hostile_upstream.HostileHub` (127.0.0.1, free ports); times from the server's
injected clock. Each test failed on the code before its fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
from deadline_support import TEST_DEADLINE
from hostile_upstream import COMMIT, HostileHub
from mirror_support import MirrorServer, ProcessClock, hf_env, run_python

KINDS = ["folder", "moto"]
TEAM = "team-token-0001"
SECRET = b'{"licensed": "weights only for our team"}\n'


@contextmanager
def _mirror(
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    *args: str,
    tokens: Path | None = None,
    clock: ProcessClock | None = None,
) -> Iterator[MirrorServer]:
    """``cmh serve`` over a folder or a moto bucket prefix, with ``args``."""
    from bucket_support import isolated_aws_env

    store: Path | str = tmp_path / "pull"
    env = dict(os.environ)
    tmp_path.mkdir(parents=True, exist_ok=True)
    if kind == "folder":
        Path(store).mkdir()
    else:
        bucket = request.getfixturevalue(f"{kind}_bucket")
        store, env = bucket.url, {**env, **isolated_aws_env(bucket, tmp_path)}
    with MirrorServer(
        store, tmp_path / "logs", tokens=tokens, clock=clock, env=env, extra_args=args
    ) as server:
        yield server


def _get(url: str, token: str | None = None, **kwargs: object) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.get(url, headers=headers, timeout=TEST_DEADLINE, **kwargs)  # type: ignore[arg-type]


VARIANT_SCRIPT = r"""
import json
from huggingface_hub import hf_hub_download
path = hf_hub_download(sys.argv[1], "config.json")
print(json.dumps({"body": open(path).read()}))
"""


@pytest.mark.parametrize("kind", KINDS)
def test_every_case_of_a_private_repo_is_the_repo_and_private(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Was (F1): the tokens file made ``acme/model`` private, but the upstream (as
    huggingface.co) answers ``ACME/MODEL`` too: the mirror kept it as another, public repo
    and served its bytes to anyone, and listed it. Now every case of a name is one repo:
    a reader it is closed to gets the missing repo's answer; one it opens is sent (307) to
    the upstream's name, and the store holds one copy, under that name."""
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{TEAM} acme/model\n")
    hub = HostileHub(repo_id="acme/model", files={"config.json": SECRET}, any_case=True)
    with hub, _mirror(kind, request, tmp_path, "--upstream", hub.url, tokens=tokens) as s:
        for name in ("ACME/MODEL", "Acme/Model", "acme/MODEL", "acme/model"):
            for target in (f"/{name}/resolve/main/config.json", f"/api/models/{name}"):
                answer = _get(s.url + target)
                assert answer.status_code == 404, (target, answer.status_code)
                assert answer.headers["X-Error-Code"] == "RepoNotFound"
                assert SECRET not in answer.content and b"acme/model" not in answer.content
        assert _get(f"{s.url}/api/models").json() == []
        # The team reads it under any case: sent to the upstream's name, token kept.
        moved = _get(f"{s.url}/ACME/MODEL/resolve/main/config.json?x=1", TEAM)
        assert moved.status_code == 307
        assert moved.headers["Location"] == "/acme/model/resolve/main/config.json?x=1"
        moved = _get(f"{s.url}/api/models/Acme/Model/revision/main", TEAM)
        assert moved.headers["Location"] == "/api/models/acme/model/revision/main"
        read = _get(f"{s.url}/Acme/Model/resolve/main/config.json", TEAM, follow_redirects=True)
        assert read.status_code == 200 and read.content == SECRET
        env = hf_env(s.url, tmp_path / "home", token=TEAM)
        code = VARIANT_SCRIPT.replace("sys.argv[1]", repr("ACME/Model"))
        assert run_python(code, env)["body"] == SECRET.decode()  # the stock client follows
        listed = [m["id"] for m in _get(f"{s.url}/api/models", TEAM).json()]
        assert listed == ["acme/model"]  # one copy, under the upstream's name
        if kind == "folder":
            assert sorted(p.name for p in (tmp_path / "pull").glob("models--*")) == [
                "models--acme--model"
            ]


def test_a_tokens_file_name_in_another_case_keeps_the_upstream_repo_private(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Was: in front of an upstream, a tokens file naming ``Acme/Model`` protected nothing
    of the upstream's ``acme/model``, served to anyone. Names are compared without case
    when an upstream is set (deny by default)."""
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{TEAM} Acme/Model\n")
    hub = HostileHub(repo_id="acme/model", files={"config.json": SECRET}, any_case=True)
    with hub, _mirror("folder", request, tmp_path, "--upstream", hub.url, tokens=tokens) as s:
        url = f"{s.url}/acme/model/resolve/main/config.json"
        assert _get(url).status_code == 404
        assert _get(url, TEAM).content == SECRET
        assert _get(url).status_code == 404  # held now: still closed
        assert _get(f"{s.url}/api/models").json() == []


UPSTREAM_TOKEN = "hf_mirrors_upstream_token_0001"
FILES = {"config.json": b"{}\n", "secret.txt": b"written after the repo went private\n"}


def _upstream_token(tmp_path: Path) -> Path:
    path = tmp_path / "upstream-token"
    path.write_text(UPSTREAM_TOKEN + "\n")
    return path


def _make_private(hub: HostileHub) -> None:
    """The upstream serves the repo to the mirror's token only from now on."""
    hub.token_only = UPSTREAM_TOKEN
    hub.revision_extra = {"private": True}


def _fetched(hub: HostileHub, name: str) -> list[str | None]:
    """The ``Authorization`` of each GET of ``name``'s bytes the upstream saw."""
    return [s.authorization for s in hub.seen if s.method == "GET" and s.path.endswith(name)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_pinned_commit_is_not_served_on_access_older_than_fresh_for(
    kind: str, request: pytest.FixtureRequest, process_clock: ProcessClock, tmp_path: Path
) -> None:
    """Was (F3): a commit pulled while the repo was public was never asked about again:
    after the upstream made the repo private, anonymous requests pinned to the commit still
    read it, its info said ``"private": false``, and a file never held was even fetched
    then with the mirror's upstream token and handed over. Now who may read a held commit
    is asked again once per ``--fresh-for`` (its content never is)."""
    with HostileHub(files=FILES) as hub, _mirror(
        kind, request, tmp_path, "--upstream", hub.url,
        "--upstream-token-file", str(_upstream_token(tmp_path)), "--fresh-for", "30s",
        clock=process_clock,
    ) as s:  # fmt: skip
        pinned = f"{s.url}/{hub.repo_id}/resolve/{COMMIT}"
        assert _get(f"{s.url}/{hub.repo_id}/resolve/main/config.json").status_code == 200
        assert _get(f"{pinned}/config.json").status_code == 200
        _make_private(hub)
        asked = len(hub.seen)
        assert _get(f"{pinned}/config.json").status_code == 200  # within --fresh-for
        assert len(hub.seen) == asked  # nothing asked: at most once per --fresh-for
        process_clock.advance(31.5)  # past it (and the storage clock's 1 s resolution)
        for target in (f"{pinned}/config.json", f"{pinned}/secret.txt"):
            answer = _get(target)
            assert (answer.status_code, answer.headers["X-Error-Code"]) == (404, "RepoNotFound")
        info = _get(f"{s.url}/api/models/{hub.repo_id}/revision/{COMMIT}")
        assert info.status_code == 404
        assert _fetched(hub, "secret.txt") == []  # nothing fetched with the token for them
        assert hub.repo_id not in [m["id"] for m in _get(f"{s.url}/api/models").json()]


@pytest.mark.parametrize("kind", KINDS)
def test_no_file_is_filled_on_access_this_worker_has_not_checked(
    kind: str, request: pytest.FixtureRequest, process_clock: ProcessClock, tmp_path: Path
) -> None:
    """Was (F3): a fresh branch's file the store lacked was fetched with the mirror's
    upstream token for any reader, on the word on access the branch's last validation had
    (here another server's, before the upstream made the repo private). A fill now starts
    only on word this worker had within ``--fresh-for``; else the access is asked first."""
    token = _upstream_token(tmp_path)
    args = ("--upstream", "", "--upstream-token-file", str(token), "--fresh-for", "1h")
    with HostileHub(files=FILES) as hub:
        args = ("--upstream", hub.url, *args[2:])
        with _mirror(kind, request, tmp_path / "a", *args, clock=process_clock) as first:
            assert _get(f"{first.url}/{hub.repo_id}/resolve/main/config.json").status_code == 200
            store = first.store
        _make_private(hub)
        env = dict(os.environ)
        if kind != "folder":
            from bucket_support import isolated_aws_env

            env |= isolated_aws_env(request.getfixturevalue(f"{kind}_bucket"), tmp_path / "a")
        with MirrorServer(
            store, tmp_path / "logs-b", clock=process_clock, env=env, extra_args=args
        ) as second:  # main is fresh from the store's record: no revalidation
            answer = _get(f"{second.url}/{hub.repo_id}/resolve/main/secret.txt")
            assert (answer.status_code, answer.headers["X-Error-Code"]) == (404, "RepoNotFound")
            assert _fetched(hub, "secret.txt") == []


def test_moved_target_names_the_upstreams_repo_where_each_route_names_its_repo() -> None:
    from cmh.hub.mirror._routes import moved_target, parse_target

    cases = {
        "/ACME/Model/resolve/main/a%20b.txt?download=1": (
            "/acme/model/resolve/main/a%20b.txt?download=1"
        ),
        "/datasets/ACME/Data/resolve/v1/x.csv": "/datasets/acme/data/resolve/v1/x.csv",
        "/api/models/ACME/Model/revision/main": "/api/models/acme/model/revision/main",
        "/api/datasets/ACME/Data/tree/main/sub": "/api/datasets/acme/data/tree/main/sub",
        "/api/cmh/manifest/datasets/ACME/Data/resolve/main/w.safetensors": (
            "/api/cmh/manifest/datasets/acme/data/resolve/main/w.safetensors"
        ),
        "/api/cmh/fingerprint/ACME/Model/main": "/api/cmh/fingerprint/acme/model/main",
        "/GPT2/resolve/main/config.json": "/gpt2/resolve/main/config.json",
    }
    for target, expected in cases.items():
        route = parse_target(target)
        canonical = route.repo_id.lower()
        assert moved_target(target, route, canonical) == expected, target
    # A page's /raw/ names the repo where the API does; any other shape is not guessed at.
    route = parse_target("/ACME/Model/resolve/main/config.json")
    assert moved_target("/ACME/Model/raw/main/config.json", route, "acme/model") == (
        "/acme/model/raw/main/config.json"
    )
    assert moved_target("/-/models/ACME/Model", route, "acme/model") is None


def test_a_held_commit_is_answered_stale_while_its_access_check_stalls(
    request: pytest.FixtureRequest, process_clock: ProcessClock, tmp_path: Path
) -> None:
    """A held commit whose access is asked again is not held up by a stalled upstream: it
    is answered after 3 s as its access was last recorded, with the stale ``Warning``
    (as a branch's usable copy is), and no file of it is filled meanwhile."""
    with HostileHub(files=FILES) as hub, _mirror(
        "folder", request, tmp_path, "--upstream", hub.url, "--fresh-for", "30s",
        clock=process_clock,
    ) as s:  # fmt: skip
        pinned = f"{s.url}/{hub.repo_id}/resolve/{COMMIT}"
        assert _get(f"{pinned}/config.json").status_code == 200
        process_clock.advance(31.5)
        hub.revision_delay = 12.0  # past the 3 s a usable copy waits (and the 10 s timeout)
        answer = httpx2.get(f"{pinned}/config.json", timeout=60)  # 60 s: a guard only
        assert answer.status_code == 200 and answer.content == b"{}\n"
        # answered while the check went on (a check that failed would add 111)
        assert answer.headers.get("Warning") == '110 cmh "Response is stale"'
        missing = _get(f"{pinned}/secret.txt")
        assert (missing.status_code, missing.headers["X-Error-Code"]) == (
            503,
            "UpstreamUnavailable",
        )
        assert _fetched(hub, "secret.txt") == []


def test_the_307_is_error_shaped_and_store_alone_routes_read_the_name_asked(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """spec 8.2, as a reader written from it alone found it unstated: the 307 to the
    upstream's name is an error-shaped answer (JSON body, X-Error-Message, no
    X-Error-Code) on every route that prepares a revision, POST included; refs and
    auth-check, answered from the store alone, read the name as asked."""
    hub = HostileHub(repo_id="acme/model", files={"config.json": SECRET}, any_case=True)
    with hub, _mirror("folder", request, tmp_path, "--upstream", hub.url) as s:
        assert _get(f"{s.url}/acme/model/resolve/main/config.json").content == SECRET
        what = "ACME/Model is acme/model at the upstream"
        for method, target in (
            ("GET", "/ACME/Model/resolve/refs%2Fpr%2F1/config.json?a=1&a=2"),
            ("HEAD", "/ACME/Model/resolve/main/config.json"),
            ("POST", "/api/models/ACME/Model/paths-info/main"),
            ("GET", "/api/cmh/fingerprint/ACME/Model/main"),
        ):
            moved = httpx2.request(method, s.url + target, data={"paths": "config.json"},
                                   timeout=TEST_DEADLINE)  # fmt: skip
            assert moved.status_code == 307, target
            assert moved.headers["Location"] == target.replace("ACME/Model", "acme/model")
            assert moved.headers["X-Error-Message"] == what
            assert "X-Error-Code" not in moved.headers
            if method != "HEAD":
                assert moved.json() == {"error": what}
        for target in ("/api/models/ACME/Model/refs", "/api/models/ACME/Model/auth-check"):
            answer = _get(s.url + target)
            assert answer.status_code == 404, target
            assert answer.headers["X-Error-Code"] == "RepoNotFound"
        assert _get(f"{s.url}/api/models/acme/model/refs").status_code == 200
