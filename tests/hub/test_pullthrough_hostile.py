"""A hostile upstream behind ``cmh serve --upstream`` and ``cmh pull`` (issue 23).

Each test names the finding it covers; each failed on the code before its fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.mirror.stores.local._folder import add_folder
from deadline_support import TEST_DEADLINE
from hostile_upstream import COMMIT, HostileHub, Recorder, oversized_entry
from hublike import running
from mirror_support import (
    PRIVATE_REPO,
    PRIVATE_TOKEN,
    TINY_REPO,
    MirrorServer,
    ProcessClock,
    big_store,
    hf_env,
    run_python,
    wait_for,
)

FLIP_RESUME_SCRIPT = r"""
import hashlib, json, os
from huggingface_hub import hf_hub_download
path = hf_hub_download("cmh-test/big", "big.bin")
h = hashlib.sha256()
with open(path, "rb") as f:
    h.update(f.read())
print(json.dumps({"sha256": h.hexdigest(), "size": os.path.getsize(path)}))
"""


def test_flip_and_resume_stock_client_ends_with_the_etags_bytes(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """High 1: one byte flipped mid-fill; the stock client's ``Range`` resume must not
    splice the wrong head to the next fill's right tail."""
    store, data = big_store(tmp_path, 24 << 20)  # over two of the client's 10 MB chunks
    etag = hashlib.sha256(data).hexdigest()
    backend = mirror_server_factory(store)
    with running(backend.url, xet_listing=False) as hub:
        hub.flip_byte(etag, offset=1000, times=1)  # the first transfer only
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", hub.url))
        out = run_python(FLIP_RESUME_SCRIPT, hf_env(pull.url, tmp_path / "home"), timeout=120)
        hub.wait_idle()
    assert out == {"sha256": etag, "size": len(data)}
    pull.sync()
    gets = [r for r in pull.log() if r.get("method") == "GET" and "big.bin" in r.get("target", "")]
    assert gets[0].get("cut") == "fill failed"  # the first body was cut...
    assert gets[1]["range"] == f"bytes={20 << 20}-"  # the stock client resumed...
    assert gets[1]["status"] == 200  # ...and was told to start again


def test_private_upstream_repo_is_private_at_the_mirror_unless_granted(
    mirror: MirrorServer, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """High 2: the mirror's upstream token reads a private repo; the mirror must not make
    it public: 404 anonymous, 200 with a token ``--tokens`` grants, absent from listings."""
    token_file = tmp_path / "upstream-token"
    token_file.write_text(PRIVATE_TOKEN + "\n")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"reader-token-0001 {PRIVATE_REPO}\nother-token-0002 {TINY_REPO}\n")
    with running(mirror.url, xet_listing=False) as hub:
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(
            tmp_path / "pull",
            tokens=tokens,
            extra_args=("--upstream", hub.url, "--upstream-token-file", str(token_file)),
        )
        file_url = f"{pull.url}/{PRIVATE_REPO}/resolve/main/config.json"
        granted = {"Authorization": "Bearer reader-token-0001"}
        other = {"Authorization": "Bearer other-token-0002"}
        anonymous = httpx2.get(file_url, timeout=TEST_DEADLINE)
        assert anonymous.status_code == 404
        assert anonymous.headers["X-Error-Code"] == "RepoNotFound"
        assert httpx2.head(file_url, timeout=TEST_DEADLINE).status_code == 404
        assert httpx2.get(file_url, headers=other, timeout=TEST_DEADLINE).status_code == 404
        ok = httpx2.get(file_url, headers=granted, timeout=TEST_DEADLINE)
        assert ok.status_code == 200 and ok.json() == {"secret": True}
        assert (
            httpx2.get(file_url, timeout=TEST_DEADLINE).status_code == 404
        )  # still, once the blob is stored
        info = httpx2.get(
            f"{pull.url}/api/models/{PRIVATE_REPO}", headers=granted, timeout=TEST_DEADLINE
        )
        assert info.status_code == 200 and info.json()["private"] is True
        assert (
            httpx2.get(f"{pull.url}/api/models/{PRIVATE_REPO}", timeout=TEST_DEADLINE).status_code
            == 404
        )
        listed = [
            m["id"] for m in httpx2.get(f"{pull.url}/api/models", timeout=TEST_DEADLINE).json()
        ]
        assert PRIVATE_REPO not in listed
        listed = [
            m["id"]
            for m in httpx2.get(
                f"{pull.url}/api/models", headers=granted, timeout=TEST_DEADLINE
            ).json()
        ]
        assert PRIVATE_REPO in listed
        assert PRIVATE_REPO not in httpx2.get(f"{pull.url}/", timeout=TEST_DEADLINE).text
        assert "private or gated only to tokens that" in pull.stderr_text()

        # The operator's explicit opt-out serves it to anyone, and says so at start.
        (tmp_path / "open").mkdir()
        opened = mirror_server_factory(
            tmp_path / "open",
            extra_args=(
                "--upstream", hub.url, "--upstream-token-file", str(token_file),
                "--public-upstream-repos",
            ),
        )  # fmt: skip
        assert (
            httpx2.get(
                f"{opened.url}/{PRIVATE_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE
            ).status_code
            == 200
        )
        assert "WARNING" in opened.stderr_text()


def test_gated_upstream_repo_named_in_the_tokens_file_gives_the_hubs_refusal_to_a_reader(
    mirror: MirrorServer, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Issue 26 item 2 (and high 2 for gated repos): a gated repo the mirror's upstream
    token cannot read, private at the mirror by its tokens file. Anonymous and a granted
    reader alike: the upstream's own refusal of the mirror (401 ``GatedRepo`` and its
    message) at HEAD and GET alike, never 200 then a cut (issue 36: a gated repo's
    existence is public, it no longer looks missing). With an upstream token that reads
    it: the Hub's 401 ``GatedRepo`` to an anonymous reader, the bytes to a granted one."""
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"reader-token-0001 {TINY_REPO}\n")
    with running(mirror.url, xet_listing=False) as hub:
        hub.gate(TINY_REPO)
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(
            tmp_path / "pull", tokens=tokens, extra_args=("--upstream", hub.url)
        )
        url = f"{pull.url}/{TINY_REPO}/resolve/main/config.json"
        anonymous = httpx2.get(url, timeout=TEST_DEADLINE)
        assert (anonymous.status_code, anonymous.headers["X-Error-Code"]) == (401, "GatedRepo")
        granted = {"Authorization": "Bearer reader-token-0001"}
        for method in ("HEAD", "GET", "HEAD"):
            answer = httpx2.request(method, url, headers=granted, timeout=TEST_DEADLINE)
            assert answer.status_code == 401, (method, answer.status_code)
            assert answer.headers["X-Error-Code"] == "GatedRepo"
            assert answer.headers["X-Error-Message"] == (
                "Access to model cmh-test/tiny is restricted. You must have access to it "
                "and be authenticated to access it. Please log in."
            )
        out = run_python(GATED_SCRIPT, hf_env(pull.url, tmp_path / "home", "reader-token-0001"))
        assert out == {"error": "GatedRepoError"}
        # The upstream grants the mirror's token: the granted reader gets the bytes.
        hub.gate(TINY_REPO, frozenset({f"Bearer {PRIVATE_TOKEN}"}))
        token_file = tmp_path / "upstream-token"
        token_file.write_text(PRIVATE_TOKEN + "\n")
        (tmp_path / "pull-2").mkdir()
        with_token = mirror_server_factory(
            tmp_path / "pull-2",
            tokens=tokens,
            extra_args=("--upstream", hub.url, "--upstream-token-file", str(token_file)),
        )
        url = f"{with_token.url}/{TINY_REPO}/resolve/main/config.json"
        anonymous = httpx2.get(url, timeout=TEST_DEADLINE)
        assert (anonymous.status_code, anonymous.headers["X-Error-Code"]) == (401, "GatedRepo")
        assert httpx2.get(url, headers=granted, timeout=TEST_DEADLINE).status_code == 200


def _refusals(url: str, headers: dict[str, str] | None = None) -> list[tuple[Any, ...]]:
    """Status, error code, message and success of HEAD, GET, HEAD, GET of ``url``."""
    seen = []
    for method in ("HEAD", "GET", "HEAD", "GET"):
        answer = httpx2.request(method, url, headers=headers, timeout=TEST_DEADLINE)
        seen.append(
            (
                answer.status_code,
                answer.headers.get("X-Error-Code"),
                answer.headers.get("X-Error-Message"),
                answer.is_success,
            )
        )
    return seen


def test_gated_upstream_repo_without_an_upstream_token_answers_as_the_hub_does(
    mirror: MirrorServer, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Issue 26 item 2: no upstream token, no tokens file. Every client, every time, HEAD
    and GET alike, gets what the Hub answers the mirror: 401 ``GatedRepo`` and its words
    (the old code answered the first request so and every later one 404)."""
    with running(mirror.url, xet_listing=False) as hub:
        hub.gate(TINY_REPO)
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", hub.url))
        url = f"{pull.url}/{TINY_REPO}/resolve/main/config.json"
        direct = _refusals(f"{hub.url}/{TINY_REPO}/resolve/main/config.json")
        assert direct[0][:2] == (401, "GatedRepo")
        assert _refusals(url) == direct
        assert _refusals(url) == direct  # once the upstream's access is recorded too
        assert _refusals(url, {"Authorization": "Bearer some-client-token"}) == direct
        assert not hub.records(origin="cdn")  # no body was started anywhere
        out = run_python(GATED_SCRIPT, hf_env(pull.url, tmp_path / "home"))
        assert out == {"error": "GatedRepoError"}
        out = run_python(GATED_TRANSFORMERS_SCRIPT, hf_env(pull.url, tmp_path / "home"))
        assert out["error"] == "OSError"
        assert out["message"].startswith("You are trying to access a gated repo.")
        assert "Please log in." in out["message"]


def test_private_upstream_repo_without_an_upstream_token_gives_the_upstreams_status(
    mirror: MirrorServer, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """A private upstream repo the mirror cannot read: the upstream's own status, code and
    words (huggingface.co: 401 ``RepoNotFound`` to an anonymous client), at HEAD and GET
    alike (the old code said 404); RepositoryNotFoundError downstream, as from the Hub."""
    with running(mirror.url, xet_listing=False) as hub:
        hub.hide(TINY_REPO)
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", hub.url))
        url = f"{pull.url}/{TINY_REPO}/resolve/main/config.json"
        seen = _refusals(url)
        assert seen == [(401, "RepoNotFound", "Repository not found", False)] * 4, seen
        assert _refusals(f"{pull.url}/api/models/{TINY_REPO}")[0][:2] == (401, "RepoNotFound")
        out = run_python(GATED_SCRIPT, hf_env(pull.url, tmp_path / "home"))
        assert out == {"error": "RepositoryNotFoundError"}


def test_gated_repo_the_mirror_reads_is_refused_as_the_hub_refuses_a_reader(
    mirror: MirrorServer, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """The mirror's upstream token reads a gated repo; no tokens file grants it. Anonymous:
    the Hub's 401 ``GatedRepo``; a token the mirror does not grant: 403 ``GatedRepo``; never
    the bytes (deny by default, issue 23), HEAD and GET alike."""
    token_file = tmp_path / "upstream-token"
    token_file.write_text(PRIVATE_TOKEN + "\n")
    with running(mirror.url, xet_listing=False) as hub:
        hub.gate(TINY_REPO, frozenset({f"Bearer {PRIVATE_TOKEN}"}))
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(
            tmp_path / "pull",
            extra_args=("--upstream", hub.url, "--upstream-token-file", str(token_file)),
        )
        url = f"{pull.url}/{TINY_REPO}/resolve/main/config.json"
        anonymous = _refusals(url)
        assert {s[:2] for s in anonymous} == {(401, "GatedRepo")}, anonymous
        assert "Please log in." in str(anonymous[0][2])
        other = _refusals(url, {"Authorization": "Bearer other-token-0002"})
        assert {s[:2] for s in other} == {(403, "GatedRepo")}, other
        assert f"Visit {hub.url}/{TINY_REPO} to ask for access." in str(other[0][2])
        assert not any(s[3] for s in anonymous + other)  # never the bytes
        info = httpx2.get(
            f"{pull.url}/api/models/{TINY_REPO}", timeout=TEST_DEADLINE
        )  # public at the Hub (issue 36)
        assert info.status_code == 200 and info.json()["gated"] == "manual"
        out = run_python(GATED_SCRIPT, hf_env(pull.url, tmp_path / "home"))
        assert out == {"error": "GatedRepoError"}


GATED_SCRIPT = r"""
import json
from huggingface_hub import hf_hub_download
try:
    hf_hub_download("cmh-test/tiny", "config.json")
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__}))
"""

GATED_TRANSFORMERS_SCRIPT = r"""
import json
from transformers import AutoConfig
try:
    AutoConfig.from_pretrained("cmh-test/tiny")
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


# -- one rule for credentials (medium: the token goes to other origins; low: any host) ----

SECRET = "hf_secret_token_never_elsewhere_01"


def _pull(hub: HostileHub, tmp_path: Path) -> Any:
    env = {"HF_TOKEN": SECRET, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_XET": "1"}
    args = ["pull", hub.repo_id, "--endpoint", hub.url, "--cache-dir", str(tmp_path / "cache")]
    return CliRunner().invoke(cli, args, env=env)


def _serve(
    factory: Callable[..., MirrorServer], hub: HostileHub, tmp_path: Path, workers: int = 1
) -> MirrorServer:
    tmp_path.mkdir(parents=True, exist_ok=True)
    token_file = tmp_path / "upstream-token"
    token_file.write_text(SECRET + "\n")
    store = tmp_path / "pull-store"
    store.mkdir(exist_ok=True)
    return factory(
        store,
        workers=workers,
        extra_args=("--upstream", hub.url, "--upstream-token-file", str(token_file)),
    )


def test_a_resolve_redirect_to_another_origin_never_carries_the_token(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    with Recorder() as thief, HostileHub() as hub:
        hub.resolve_redirect = lambda method, path: f"{thief.url}/cdn/{path}"
        result = _pull(hub, tmp_path)
        assert result.exit_code == 0, result.output
        pull = _serve(mirror_server_factory, hub, tmp_path)
        answer = httpx2.get(
            f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=TEST_DEADLINE
        )
        assert answer.status_code == 200 and answer.content == b"{}\n"
        # The blob is held now: a second store's confirmation HEAD follows the redirect too.
        assert thief.seen  # the CDN was asked...
        assert all(s.authorization is None for s in thief.seen), thief.seen  # ...never with it
        assert any(s.authorization == f"Bearer {SECRET}" for s in hub.seen)


def test_a_head_redirect_without_etag_does_not_carry_the_token(tmp_path: Path) -> None:
    """The HEAD that confirms a blob (``served``) follows redirects by hand."""
    from cmh.hub.resolver import HubClient

    with Recorder() as thief, HostileHub() as hub:
        hub.resolve_redirect = lambda method, path: f"{thief.url}/cdn/{path}"
        client = HubClient(hub.url, SECRET)
        served = client.served(client.file_url(hub.repo_id, "model", COMMIT, "config.json"))
        assert served.etag is not None
        assert thief.seen and all(s.authorization is None for s in thief.seen), thief.seen


def test_a_next_page_on_another_origin_is_refused(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    with Recorder() as thief, HostileHub(siblings=False) as hub:
        hub.next_link = f"{thief.url}/api/models/{hub.repo_id}/tree/{COMMIT}?cursor=x"
        result = _pull(hub, tmp_path)
        assert result.exit_code == 3, result.output
        assert "another origin refused" in result.output
        assert "Traceback" not in result.output
        pull = _serve(mirror_server_factory, hub, tmp_path)
        answer = httpx2.get(
            f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=TEST_DEADLINE
        )
        assert answer.status_code == 502, answer.status_code
        assert answer.headers["X-Error-Code"] == "UpstreamProtocolError"
        assert thief.seen == []


def test_redirect_loops_and_unconfigured_local_targets_are_refused(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    with Recorder("127.0.0.2") as local, HostileHub() as hub:
        loop = f"{hub.url}/{hub.repo_id}/resolve/{COMMIT}/config.json"
        hub.resolve_redirect = lambda method, path: loop
        result = _pull(hub, tmp_path / "a")
        assert result.exit_code == 3, result.output
        assert "redirects" in result.output and "Traceback" not in result.output
        hub.resolve_redirect = lambda method, path: f"{local.url}/cdn/{path}"
        result = _pull(hub, tmp_path / "b")
        assert result.exit_code == 3, result.output
        assert "local address refused" in result.output
        pull = _serve(mirror_server_factory, hub, tmp_path)
        try:
            answer = httpx2.get(
                f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=TEST_DEADLINE
            )
            assert answer.status_code >= 500, answer.status_code
        except httpx2.HTTPError:
            pass  # headers sent while filling, then cut before the last byte: refused
        assert local.seen == []


def test_the_origin_rule() -> None:
    from cmh.hub.resolver import OriginRule, UnsafeRedirect

    rule = OriginRule("https://hub.example")
    assert rule.carries_token("https://hub.example/api/x")
    assert not rule.carries_token("http://hub.example/api/x")  # another scheme: another origin
    assert not rule.carries_token("https://hub.example:8443/api/x")
    with pytest.raises(UnsafeRedirect, match="HTTPS to HTTP"):
        rule.hop("https://hub.example/m/resolve/c/f", "http://cdn.example/f", True)
    rule.hop("https://hub.example/m/resolve/c/f", "https://cdn.example/f", True)  # a CDN
    rule.hop("https://cdn.example/f", "https://cdn.example/g", False)  # known from now on
    with pytest.raises(UnsafeRedirect, match="another origin"):
        rule.hop("https://hub.example/api/x", "https://elsewhere.example/x", False)
    with pytest.raises(UnsafeRedirect, match="another origin"):
        rule.hop("https://cdn.example/f", "https://elsewhere.example/x", True)
    for local in ("127.0.0.1", "localhost", "169.254.169.254", "[::1]", "0.0.0.0"):
        with pytest.raises(UnsafeRedirect, match="local address"):
            rule.hop("https://hub.example/m/resolve/c/f", f"https://{local}/f", True)
    with pytest.raises(UnsafeRedirect) as refused:  # the hint is a URL the option takes
        rule.hop("https://hub.example/m/resolve/c/f", "https://[::1]:47002/f", True)
    assert "--trust-origin https://[::1]:47002," in str(refused.value)
    with pytest.raises(UnsafeRedirect, match="another origin"):
        rule.link("https://hub.example/api/tree", "https://cdn.example/api/tree?cursor=1")
    with pytest.raises(UnsafeRedirect):
        rule.hop("https://hub.example/m/resolve/c/f", "file:///etc/passwd", True)
    loopback = OriginRule("http://127.0.0.1:8080")  # the operator configured this host
    loopback.hop("http://127.0.0.1:8080/m/resolve/c/f", "http://127.0.0.1:9000/f", True)


# -- bounds on everything remote (medium: nothing bounds what a Hub sends) ---------------


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_body_longer_than_listed_is_stopped_and_refused(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    with HostileHub(files={"config.json": b"thirteen byte"}, overlong=8 << 20) as hub:
        result = _pull(hub, tmp_path)
        assert result.exit_code == 3, result.output
        assert "longer than the listed 13 bytes" in result.output
        assert "Traceback" not in result.output
        leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
        assert all(p.stat().st_size <= 13 for p in leftovers), leftovers
        pull = _serve(mirror_server_factory, hub, tmp_path)
        try:  # never more than the listed bytes; the right ones, or an error / a cut
            answer = httpx2.get(
                f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=TEST_DEADLINE
            )
            assert answer.status_code >= 500 or answer.content == b"thirteen byte"
        except httpx2.HTTPError:
            pass  # cut before the last byte: the fill was refused
        blobs = list((tmp_path / "pull-store").rglob("blobs/*"))
        assert all(p.stat().st_size <= 13 for p in blobs), blobs


def test_a_gzip_bomb_and_a_huge_listing_are_refused_and_memory_returns(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    with HostileHub(gzip_bomb=400 << 20) as hub:  # 400 MiB of spaces, ~0.4 MB on the wire
        result = _pull(hub, tmp_path / "a")
        assert result.exit_code == 3, result.output
        assert "MiB once decoded" in result.output and "Traceback" not in result.output
        pull = _serve(mirror_server_factory, hub, tmp_path)
        # 120 s: the default 5 s client timeout fired first on a loaded machine (the
        # mirror decodes up to its bound before refusing); the subject is the refusal.
        url = f"{pull.url}/{hub.repo_id}/resolve/main/config.json"
        answer = httpx2.get(url, timeout=120)
        assert answer.status_code == 502 and "MiB once decoded" in answer.text
        rss = _rss_mb(pull.process.pid)
        print(f"mirror worker RSS after the gzip bomb: {rss:.0f} MB")
        assert rss < 200

    with HostileHub(siblings=False, tree_pages=(101, 1000)) as hub:  # 101,000 files
        result = _pull(hub, tmp_path / "b")
        assert result.exit_code == 3, result.output
        assert "more than 100000 files" in result.output
        pull = _serve(mirror_server_factory, hub, tmp_path / "c")
        url = f"{pull.url}/{hub.repo_id}/resolve/main/config.json"
        answer = httpx2.get(url, timeout=60)
        assert answer.status_code == 502
        assert answer.headers["X-Error-Code"] == "UpstreamProtocolError"
        rss = _rss_mb(pull.process.pid)
        print(f"mirror worker RSS after the 101,000-entry listing: {rss:.0f} MB")
        assert rss < 200
        assert not list((tmp_path / "c" / "pull-store").rglob("snapshots/*/*"))


HOSTILE_NAMES = [
    "../escape.txt",
    "/etc/absolute.txt",
    "nul\x00byte.txt",
    "back\\slash.txt",
    "empty//segment.txt",
    "x" * 256 + ".txt",
    "lone-\udc80-surrogate.txt",  # JSON "\udc80": no file name can hold it (no UTF-8)
    "high-\ud800.txt",
]


def test_hostile_listing_names_are_a_typed_error_never_a_500(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    cases = [[{"type": "file", "path": n, "oid": "0" * 40, "size": 1}] for n in HOSTILE_NAMES]
    clash = [
        {"type": "file", "path": "a", "oid": "0" * 40, "size": 1},
        {"type": "file", "path": "a/b", "oid": "0" * 40, "size": 1},
    ]
    for i, entries in enumerate([*cases, clash]):
        with HostileHub(siblings=False, tree_entries=entries) as hub:
            result = _pull(hub, tmp_path / f"p{i}")
            assert result.exit_code == 3, (entries, result.output)
            assert "Traceback" not in result.output and "lists" in result.output
            pull = _serve(mirror_server_factory, hub, tmp_path / f"s{i}")
            answer = httpx2.get(
                f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=TEST_DEADLINE
            )
            assert answer.status_code == 502, (entries, answer.status_code, answer.text)
            assert "Traceback" not in pull.stderr_text()


def test_every_answer_of_the_origin_is_nosniff_with_a_csp(mirror: MirrorServer) -> None:
    """Low: API errors echo the path (``<script>``) with no ``nosniff``/CSP."""
    for url in (
        f"{mirror.url}/api/models/%3Cscript%3Ealert(1)%3C%2Fscript%3E/x",
        f"{mirror.url}/{TINY_REPO}/resolve/main/config.json",
        f"{mirror.url}/api/models/{TINY_REPO}",
        f"{mirror.url}/health",
    ):
        answer = httpx2.get(url, timeout=TEST_DEADLINE)
        assert answer.headers.get("X-Content-Type-Options") == "nosniff", url
        assert "default-src 'none'" in answer.headers.get("Content-Security-Policy", ""), url


def test_a_client_dropping_mid_download_leaves_no_traceback(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Low: ``cmh serve`` printed a ``BrokenPipeError`` traceback when a client dropped."""
    import socket

    store, _ = big_store(tmp_path, 32 << 20)
    server = mirror_server_factory(store)
    host, port = server.url.removeprefix("http://").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET /cmh-test/big/resolve/main/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.recv(65536)
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
    server.sync()
    assert "Traceback" not in server.stderr_text(), server.stderr_text()[-3000:]
    assert "BrokenPipe" not in server.stderr_text()


# -- hostile model cards (medium: one card breaks the listing; rendering as CPU DoS) -----


def test_hostile_cards_never_break_listings_info_or_pages(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    from cmh.hub.mirror.web import _cards as cards

    store = tmp_path / "cards-store"
    cases = {
        "digits": "---\nlicense: 1" + "0" * 5000 + "\n---\n# digits\n",
        "nested": "---\nlicense: mit\n---\n" + "[" * 3000 + "x" + "]" * 3000 + "\n",
        "quotes": "> " * 3000 + "deep\n",
        "brackets": "[" * (512 * 1024 - 10) + "\n",
        "deep-yaml": "---\nx: " + "[" * 3000 + "]" * 3000 + "\n---\nbody\n",
    }
    for name, text in cases.items():
        src = tmp_path / f"src-{name}"
        src.mkdir()
        (src / "README.md").write_text(text)
        (src / "config.json").write_text("{}\n")
        add_folder(store, src, f"cards/{name}")
    server = mirror_server_factory(store)
    listing = httpx2.get(f"{server.url}/api/models", params={"full": "true"}, timeout=60)
    assert listing.status_code == 200
    assert {m["id"] for m in listing.json()} == {f"cards/{n}" for n in cases}
    for name in cases:
        info = httpx2.get(f"{server.url}/api/models/cards/{name}", timeout=60)
        assert info.status_code == 200, (name, info.text)
        page = httpx2.get(f"{server.url}/-/models/cards/{name}", timeout=60)
        assert page.status_code == 200, (name, page.status_code)
    page = httpx2.get(f"{server.url}/-/models/cards/brackets", timeout=60)
    assert "shown as text" in page.text
    assert "not valid YAML" in httpx2.get(f"{server.url}/-/models/cards/digits", timeout=60).text
    assert "Traceback" not in server.stderr_text()
    # Rendered once per blob: the second read of a card is the cached object.
    from cmh.hub.mirror.stores.local._store import LocalStore

    backend = LocalStore(store)
    index = backend.resolve("model", "cards/nested", "main")
    assert index is not None
    readme = index.files["README.md"]
    render = cards.render_card_body
    assert cards.read_card(readme, backend.opener, render) is cards.read_card(
        readme, backend.opener, render
    )


# -- upstream trouble is cheap ------------------------------------------------------------


def test_one_retry_cycle_per_revision_shared_by_waiting_clients(
    mirror: MirrorServer, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Was: 4 clients each ran the whole retry cycle, one after the other."""
    import threading

    with running(mirror.url, xet_listing=False) as hub:
        hub.fail(503, times=1000, path=r"/api/models/cmh-test/tiny/revision")
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", hub.url))
        url = f"{pull.url}/{TINY_REPO}/resolve/main/config.json"
        statuses: list[int] = []

        def client() -> None:
            statuses.append(httpx2.get(url, timeout=60).status_code)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert statuses == [503] * 4
        # The negative cache: a fifth client within its time asks nothing.
        before = len(hub.records(path="revision"))
        assert httpx2.get(url, timeout=60).status_code == 503
        hub.wait_idle()
        asked = hub.records(path="revision")
    assert len(asked) == before <= 6  # one cycle (the resolver's 6 tries), not 4 x 6


def test_a_blob_that_failed_its_check_is_not_fetched_again_at_once(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Was: a lying upstream was not remembered: 4 clients caused 10 full transfers."""
    store, data = big_store(tmp_path, 1 << 20)
    etag = hashlib.sha256(data).hexdigest()
    backend = mirror_server_factory(store)
    with running(backend.url, xet_listing=False) as hub:
        hub.corrupt(etag)
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", hub.url))
        url = f"{pull.url}/cmh-test/big/resolve/main/big.bin"
        import contextlib
        import time

        with contextlib.suppress(httpx2.HTTPError):
            httpx2.get(url, timeout=TEST_DEADLINE)  # cut before its last byte

        deadline = time.monotonic() + TEST_DEADLINE
        while len(hub.records(origin="cdn")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the fill's second try
        hub.wait_idle()
        # Until the failure is remembered, a request joins the failing fill (and is cut):
        # none starts a transfer, so ask until one hears the remembered failure.
        while True:
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(url, timeout=TEST_DEADLINE).status_code == 502:
                    break
            assert time.monotonic() < deadline, "the failed fill was never remembered"
        transfers = len(hub.records(origin="cdn"))
        for _ in range(4):
            answer = httpx2.get(url, timeout=TEST_DEADLINE)
            assert answer.status_code == 502, answer.status_code
            assert answer.headers["X-Error-Code"] == "UpstreamProtocolError"
        hub.wait_idle()
        assert len(hub.records(origin="cdn")) == transfers


def test_a_blackholed_hub_is_given_up_on_within_the_metadata_timeout(tmp_path: Path) -> None:
    """Was: ``cmh pull`` waited 61-62 s (six tries of 10 s) in silence. Now one budget of
    ``HF_HUB_ETAG_TIMEOUT`` (10 s) for all tries, and a line on the terminal meanwhile."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []

    def hold() -> None:  # accept, never answer; ends when the listener is closed
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=hold, daemon=True).start()
    port = listener.getsockname()[1]
    import subprocess
    import sys

    env = {**os.environ, "HF_HOME": str(tmp_path / "home"), "HF_HUB_DISABLE_XET": "1"}
    env.pop("HF_HUB_ETAG_TIMEOUT", None)
    cmh = str(Path(sys.executable).parent / "cmh")
    args = [cmh, "pull", "org/model", "--endpoint", f"http://127.0.0.1:{port}"]
    try:  # 120 s: only a guard against a hang (six tries of 10 s would pass it too)
        result = subprocess.run(
            [*args, "--cache-dir", str(tmp_path / "c")],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert result.returncode == 3, result.stderr
    assert "gave up after" in result.stderr and "Traceback" not in result.stderr
    # What shows the one budget, whatever the load: the deadline ended it, not the tries.
    assert "(the deadline comes before the next)" in result.stderr, result.stderr
    assert "no answer yet" in result.stderr  # said while it waited


def test_a_stalled_upstream_does_not_delay_what_a_stale_copy_can_answer(
    mirror_server_factory: Callable[..., MirrorServer], process_clock: ProcessClock, tmp_path: Path
) -> None:
    """Was: every request waited 61 s on a stalled upstream, also those a stale copy
    could answer. Now the stale copy answers after 3 s while the revalidation goes on."""
    with HostileHub() as hub:
        store = tmp_path / "pull"
        store.mkdir()
        pull = mirror_server_factory(
            store, extra_args=("--upstream", hub.url, "--fresh-for", "1h"), clock=process_clock
        )
        url = f"{pull.url}/{hub.repo_id}/resolve/main/config.json"
        assert httpx2.get(url, timeout=TEST_DEADLINE).content == b"{}\n"
        process_clock.advance(3601)  # past --fresh-for
        # The upstream stalls 10 s: past the 3 s the stale copy waits for it. An answer
        # that waited for it would be revalidated (no Warning 110); the client's 60 s are
        # only a guard (the old code's 61 s wait fails it), not a bound on the 3 s.
        hub.revision_delay = 10.0
        answer = httpx2.get(url, timeout=60)
        assert answer.status_code == 200 and answer.content == b"{}\n"
        assert "110" in answer.headers.get("Warning", "")


def test_a_blob_not_held_waits_for_a_slow_revalidation_instead_of_a_503(
    mirror_server_factory: Callable[..., MirrorServer], process_clock: ProcessClock, tmp_path: Path
) -> None:
    """Was: a revalidation slower than 3 s marked the request stale, and a file whose blob
    the store lacked answered ``503 UpstreamUnavailable`` although the upstream was only
    slow (seen for 2 of 8 clients under load). A stale copy without the blob is not
    usable: the request waits for the revalidation, then fills the blob."""
    weights = bytes(range(256)) * 64
    with HostileHub(files={"config.json": b"{}\n", "weights.bin": weights}) as hub:
        store = tmp_path / "pull"
        store.mkdir()
        pull = mirror_server_factory(
            store, extra_args=("--upstream", hub.url, "--fresh-for", "1h"), clock=process_clock
        )
        base = f"{pull.url}/{hub.repo_id}/resolve/main"
        assert httpx2.get(f"{base}/config.json", timeout=TEST_DEADLINE).content == b"{}\n"
        process_clock.advance(3601)  # past --fresh-for
        hub.revision_delay = 5.0  # past the 3 s a stale copy waits; well within the 60 s
        answer = httpx2.get(f"{base}/weights.bin", timeout=60)
        assert answer.status_code == 200, (answer.status_code, answer.text[:300])
        assert answer.content == weights


@pytest.mark.parametrize("kind", ["folder", "moto"])
def test_a_held_repo_the_upstream_stops_serving_becomes_private(
    kind: str, request: pytest.FixtureRequest, process_clock: ProcessClock, tmp_path: Path
) -> None:
    """Was: a public repo held by the mirror stayed public after the upstream stopped
    serving it (made private, or deleted): ``main`` answered the refusal, but its commit,
    tree, listings and pages still served it to anyone. Deny by default: it is now
    private (only a ``--tokens`` grant opens it) until the upstream serves it again."""
    from bucket_support import isolated_aws_env

    store: Path | str = tmp_path / "pull"
    env = dict(os.environ)
    if kind == "folder":
        Path(store).mkdir()
    else:  # the fleet's store: a bucket prefix
        bucket = request.getfixturevalue(f"{kind}_bucket")
        store, env = bucket.url, {**env, **isolated_aws_env(bucket, tmp_path)}
    with HostileHub() as hub, MirrorServer(
        store, tmp_path / "logs", clock=process_clock, env=env,
        extra_args=("--upstream", hub.url, "--fresh-for", "30s"),
    ) as pull:  # fmt: skip
        base, repo = pull.url, hub.repo_id
        main = f"{base}/{repo}/resolve/main/config.json"
        pinned = f"{base}/{repo}/resolve/{COMMIT}/config.json"
        assert httpx2.get(main, timeout=TEST_DEADLINE).content == b"{}\n"
        assert httpx2.get(pinned, timeout=TEST_DEADLINE).status_code == 200
        hub.repo_id = "somewhere/else"  # the upstream answers RepoNotFound for the repo now
        # past --fresh-for by more than the storage clock's resolution (1 s; a bucket's
        # fleet counts freshness on it): main is revalidated
        process_clock.advance(31.5)
        assert httpx2.get(main, timeout=TEST_DEADLINE).headers["X-Error-Code"] == "RepoNotFound"
        for url in (pinned, f"{base}/api/models/{repo}/revision/{COMMIT}", f"{base}/{repo}"):
            assert httpx2.get(url, timeout=TEST_DEADLINE).status_code == 404, url
        listed = [m["id"] for m in httpx2.get(f"{base}/api/models", timeout=TEST_DEADLINE).json()]
        assert repo not in listed
        hub.repo_id = repo  # served again: public again at the next revalidation
        process_clock.advance(31.5)
        assert httpx2.get(main, timeout=TEST_DEADLINE).content == b"{}\n"
        assert httpx2.get(pinned, timeout=TEST_DEADLINE).status_code == 200


# -- legal extremes of a listing ----------------------------------------------------------

#: One path segment of 255 bytes, the most a file system's NAME_MAX allows.
LONG_NAME = "L" * 251 + ".txt"
LONG_BODY = b"a file with the longest legal name\n"

LONG_NAME_SCRIPT = r"""
import json, sys
from huggingface_hub import hf_hub_download
path = hf_hub_download("evil/repo", sys.argv[1])
print(json.dumps({"body": open(path).read(), "name": path.rsplit("/", 1)[1]}))
"""


def test_a_255_byte_file_name_works_end_to_end(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Was: the temporary link ``.{name}.cmh-link.{pid}.{tid}`` beside a 255-byte name was
    over NAME_MAX: ``cmh pull`` and ``cmh mirror sync`` exited 3, the mirror answered 500,
    then 500 for every file of the repo."""
    files = {"config.json": b"{}\n", LONG_NAME: LONG_BODY}
    with HostileHub(files=files) as hub:
        result = _pull(hub, tmp_path)
        assert result.exit_code == 0, result.output
        snapshot = tmp_path / "cache" / "models--evil--repo" / "snapshots" / COMMIT
        assert (snapshot / LONG_NAME).read_bytes() == LONG_BODY
        assert not [p.name for p in snapshot.iterdir() if p.name.startswith(".")]
        args = ["mirror", "sync", hub.repo_id, "--store", str(tmp_path / "synced"),
                "--from", hub.url, "--cache-dir", str(tmp_path / "sync-cache")]  # fmt: skip
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        pull = _serve(mirror_server_factory, hub, tmp_path)
        url = f"{pull.url}/{hub.repo_id}/resolve/main"
        answer = httpx2.get(f"{url}/{LONG_NAME}", timeout=TEST_DEADLINE)
        assert (answer.status_code, answer.content) == (200, LONG_BODY)
        answer = httpx2.get(f"{url}/config.json", timeout=TEST_DEADLINE)
        assert (answer.status_code, answer.content) == (200, b"{}\n")
        code = LONG_NAME_SCRIPT.replace("sys.argv[1]", repr(LONG_NAME))
        out = run_python(code, hf_env(pull.url, tmp_path / "home"), timeout=TEST_DEADLINE)
        assert out == {"body": LONG_BODY.decode(), "name": LONG_NAME}
        assert "Traceback" not in pull.stderr_text()


def test_a_listed_size_over_1_pib_is_refused_never_a_500(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Was: a listed size of 2**63 or more (2**70) reached ``os.pread`` (OverflowError, a
    500 for a ``Range`` request). A size over 2**50 (1 PiB), in the revision's siblings or
    in the tree (an ``lfs.size`` too), makes the listing invalid: ``cmh pull`` exits 3,
    the mirror answers ``502 UpstreamProtocolError`` (the resolver's own check:
    test_resolver_bounds.py)."""
    cases = [(True, oversized_entry(2**70)), (False, oversized_entry((1 << 50) + 1)),
             (False, oversized_entry(2**70, lfs=True))]  # fmt: skip
    for i, (siblings, listed) in enumerate(cases):
        with HostileHub(siblings=siblings, tree_entries=[listed]) as hub:
            result = _pull(hub, tmp_path / f"p{i}")
            assert result.exit_code == 3, result.output
            assert "over 1 PiB" in result.output and "Traceback" not in result.output
            pull = _serve(mirror_server_factory, hub, tmp_path / f"s{i}")
            url = f"{pull.url}/{hub.repo_id}/resolve/main/config.json"
            for headers in ({"Range": "bytes=0-1"}, {}):
                answer = httpx2.get(url, headers=headers, timeout=TEST_DEADLINE)
                assert answer.status_code == 502, (listed, answer.status_code, answer.text)
                assert answer.headers["X-Error-Code"] == "UpstreamProtocolError"
            assert "Traceback" not in pull.stderr_text()


# -- stopping while the upstream holds a revalidation or a fill ----------------------------


def _sigterm_while_busy(pull: MirrorServer, url: str, busy: Callable[[], bool]) -> None:
    """GET ``url`` (in a thread), wait until ``busy()`` (the upstream holds the work the GET
    started), SIGTERM: the server must exit 0. The wait is :data:`TEST_DEADLINE`, a guard
    against a hang: the old code lived on until the upstream let go (hours here)."""
    import subprocess
    import threading

    def get() -> None:
        with contextlib.suppress(httpx2.HTTPError):
            httpx2.get(url, timeout=TEST_DEADLINE)  # cut when the server stops

    client = threading.Thread(target=get, daemon=True)
    client.start()
    wait_for(busy, "the upstream to be asked")
    pull.process.terminate()
    try:
        code = pull.process.wait(TEST_DEADLINE)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {TEST_DEADLINE:.0f} s after SIGTERM") from None
    assert code == 0, pull.stderr_text()[-3000:]
    assert "Traceback" not in pull.stderr_text()
    client.join(TEST_DEADLINE)


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_ends_the_server_while_a_revalidation_walks_an_endless_tree(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path, workers: int
) -> None:
    """Was: SIGTERM closed the listener, then the process waited for its revalidation
    thread (an upstream sending a tree page a second, each with a next page); with
    workers, the parent killed the worker whose request waited for it (exit status 1)."""
    with HostileHub(siblings=False, tree_pages=(1 << 30, 1), tree_delay=1.0) as hub:
        pull = _serve(mirror_server_factory, hub, tmp_path, workers)
        url = f"{pull.url}/{hub.repo_id}/resolve/main/config.json"
        _sigterm_while_busy(pull, url, lambda: any("/tree/" in s.path for s in hub.seen))


def test_sigterm_ends_the_server_while_a_fill_reads_a_dripped_body(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Was: SIGTERM left the process waiting for its fill's download thread (a body of
    8 MiB at 32 KiB/s, slow but never idle: minutes)."""
    files = {"config.json": b"{}\n", "big.bin": b"x" * (8 << 20)}
    with HostileHub(files=files, drip=(8192, 0.25)) as hub:
        pull = _serve(mirror_server_factory, hub, tmp_path)
        url = f"{pull.url}/{hub.repo_id}/resolve/main/big.bin"

        def filling() -> bool:
            return any(s.method == "GET" and s.path.endswith("/big.bin") for s in hub.seen)

        _sigterm_while_busy(pull, url, filling)


def test_a_revalidation_walking_an_endless_tree_ends_at_its_total_deadline(
    mirror_server_factory: Callable[..., MirrorServer], process_clock: ProcessClock, tmp_path: Path
) -> None:
    """Was: an upstream sending tree pages, each with a next page, kept one revalidation
    asking for hours (10,000 pages); each client got 503 after 60 s. Now the walk ends when
    the revalidation's 180 s (on the server's clock, moved here) have passed; its failure is
    the negative cache's, so the next client hears it at once, and nothing more is asked."""
    import threading

    from cmh.hub.mirror._upstream import REVALIDATION_BUDGET

    with HostileHub(siblings=False, tree_pages=(1 << 30, 1), tree_delay=0.2) as hub:
        store = tmp_path / "pull"
        store.mkdir()
        pull = mirror_server_factory(store, extra_args=("--upstream", hub.url), clock=process_clock)
        url = f"{pull.url}/{hub.repo_id}/resolve/main/config.json"

        def pages() -> int:
            return sum("/tree/" in s.path for s in hub.seen)

        answers: list[httpx2.Response] = []
        client = threading.Thread(target=lambda: answers.append(httpx2.get(url, timeout=60)))
        client.start()
        wait_for(lambda: pages() >= 3, "the tree walk")
        process_clock.advance(REVALIDATION_BUDGET + 1)
        client.join(TEST_DEADLINE)
        (answer,) = answers
        assert answer.status_code == 503, answer.text
        assert answer.headers["X-Error-Code"] == "UpstreamUnavailable"
        assert f"not done within {REVALIDATION_BUDGET:g} s" in answer.json()["error"]
        asked = pages()
        again = httpx2.get(url, timeout=TEST_DEADLINE)  # the negative cache's outcome
        assert (again.status_code, again.json()) == (503, answer.json())
        assert pages() == asked  # the walk has ended


# -- JSON nested deeper than any parser goes ----------------------------------------------

DEEP_SCRIPT = r"""
import json, sys
if sys.argv[1:] == ["cmh"]:
    import cmh.hub
    cmh.hub.install()
from huggingface_hub import hf_hub_download
try:
    path = hf_hub_download("evil/repo", "config.json")
    print(json.dumps({"returned": open(path).read()}))
except BaseException as exc:
    print(json.dumps({"raised": type(exc).__module__ + "." + type(exc).__name__}))
"""


@pytest.mark.parametrize("where", ["revision", "tree", "error"])
def test_upstream_json_nested_too_deep_is_a_protocol_error(
    where: str, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Was (F2): a revision or tree answer of valid JSON nested 200,000 deep (400 KB, under
    every size bound) raised an untyped RecursionError: ``cmh pull`` exited 1 with a
    traceback, ``cmh serve`` answered 500 and kept no outcome (each client asked again).
    Now every upstream document goes through one parse (``cmh.hub.cache.json_value``): a
    protocol error (exit 3, ``502 UpstreamProtocolError`` kept 10 s), or an error body whose
    message cannot be read, which is read as none."""
    hub = HostileHub(siblings=where != "tree", deep_json=where)
    with hub:
        result = _pull(hub, tmp_path / "cli")
        assert not isinstance(result.exception, RecursionError), result.exception
        assert "Traceback" not in result.output and "RecursionError" not in result.output
        assert result.exit_code == 3, result.output
        if where != "error":
            assert "did not answer JSON: JSON nested deeper" in result.output, result.output
        pull = _serve(mirror_server_factory, hub, tmp_path / "serve")
        url = f"{pull.url}/{hub.repo_id}/resolve/main/config.json"
        hub.seen.clear()
        answers = [httpx2.get(url, timeout=TEST_DEADLINE) for _ in range(5)]
        expected = (404, "RepoNotFound") if where == "error" else (502, "UpstreamProtocolError")
        assert {(a.status_code, a.headers.get("X-Error-Code")) for a in answers} == {expected}
        assert len([s for s in hub.seen if "/revision/" in s.path]) == 1  # kept 10 s
        assert "RecursionError" not in pull.stderr_text()
        if where == "revision":  # the drop-in returns the file, as the stock client does
            for mode in ("stock", "cmh"):
                env = hf_env(hub.url, tmp_path / f"home-{mode}")
                out = run_python(DEEP_SCRIPT.replace("sys.argv[1:]", repr([mode])), env)
                assert out == {"returned": "{}\n"}, (mode, out)


def test_an_auth_check_nested_too_deep_keeps_the_repo_private(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """Was (F2): with an upstream token, an anonymous ``auth-check`` answer nested 200,000
    deep raised RecursionError (a 500). An answer that cannot be read is no yes: the repo
    is private at the mirror, as for a refusal."""
    with HostileHub(deep_json="auth-check") as hub:
        pull = _serve(mirror_server_factory, hub, tmp_path)
        answer = httpx2.get(f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=60)
        assert (answer.status_code, answer.headers["X-Error-Code"]) == (404, "RepoNotFound")
        assert "RecursionError" not in pull.stderr_text()


def test_a_paths_info_body_nested_too_deep_is_a_bad_request(mirror: MirrorServer) -> None:
    """Was (F2): ``POST paths-info`` with a JSON body nested 200,000 deep answered 500 with a
    RecursionError traceback in the log; it is a malformed body."""
    from hostile_upstream import DEEP_JSON

    answer = httpx2.post(
        f"{mirror.url}/api/models/{TINY_REPO}/paths-info/main",
        content=b'{"paths": ' + DEEP_JSON + b"}",
        headers={"Content-Type": "application/json"},
        timeout=TEST_DEADLINE,
    )
    assert (answer.status_code, answer.headers["X-Error-Code"]) == (400, "BadRequest")
    assert "RecursionError" not in mirror.stderr_text()


def test_json_value_types_every_failure_as_value_error() -> None:
    from cmh.hub.cache import json_value
    from hostile_upstream import DEEP_JSON

    assert json_value(b'{"a": [1]}') == {"a": [1]}
    for bad in (DEEP_JSON, b"{", b"\xff", DEEP_JSON.decode()):
        with pytest.raises(ValueError):
            json_value(bad)


# -- a fill's total time ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "moto"])
def test_a_fill_from_a_dripping_upstream_ends_by_its_total_time(
    kind: str, request: pytest.FixtureRequest, process_clock: ProcessClock, tmp_path: Path
) -> None:
    """Was (F4): a fill from an upstream dripping its body gave up only after ~63 s and 6
    upstream GETs, twice the 30 s spec 8.3 gives a fill: the retry loop's budget wrapped
    the resolver's own tries (about 10 s each), which had no deadline. The fill's time
    for tries now reaches the resolver's: once the server's clock passes it, the try
    under way ends by its own limits and no other starts (the old code made 6)."""
    import threading

    from bucket_support import isolated_aws_env
    from cmh.hub.mirror._upstream import FILL_RETRY_BUDGET

    store: Path | str = tmp_path / "pull"
    env = dict(os.environ)
    if kind == "folder":
        Path(store).mkdir()
    else:
        bucket = request.getfixturevalue(f"{kind}_bucket")
        store, env = bucket.url, {**env, **isolated_aws_env(bucket, tmp_path)}
    data = bytes(range(256)) * 16  # 4 KiB at 2 bytes a second: hours
    with (
        HostileHub(files={"config.json": b"{}\n", "w.bin": data}, drip=(1, 0.5)) as hub,
        (
            MirrorServer(
                store,
                tmp_path / "logs",
                clock=process_clock,
                env=env,
                extra_args=("--upstream", hub.url),
            )
        ) as pull,
    ):
        url = f"{pull.url}/{hub.repo_id}/resolve/main/w.bin"
        outcome: list[str] = []

        def client() -> None:
            try:
                with httpx2.stream("GET", url, timeout=TEST_DEADLINE) as answer:
                    body = b"".join(answer.iter_bytes())
                outcome.append(f"{answer.status_code} {len(body)} bytes")
            except httpx2.HTTPError as exc:
                outcome.append(type(exc).__name__)  # a body cut before its end

        def gets() -> list[Any]:
            return [s for s in hub.seen if s.method == "GET" and s.path.endswith("/w.bin")]

        thread = threading.Thread(target=client)
        thread.start()
        wait_for(lambda: bool(gets()), "the fill's first GET")
        process_clock.advance(FILL_RETRY_BUDGET + 1)  # past the fill's time for tries
        thread.join(TEST_DEADLINE)  # a guard: the old code's tries went on for about 60 s
        assert not thread.is_alive() and outcome, outcome
        assert outcome[0] != f"200 {len(data)} bytes"
        assert len(gets()) == 1, gets()  # no try started past the total time
