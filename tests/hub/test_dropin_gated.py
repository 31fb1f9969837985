"""Gated upstream repos through pull-through, as the Hub answers them (issue 36, item 6)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx2
from deadline_support import TEST_DEADLINE
from hublike import running
from mirror_support import PRIVATE_TOKEN, TINY_REPO, MirrorServer, hf_env, run_python

READER = "reader-token-0001"

INFO_SCRIPT = r"""
import json
from huggingface_hub import HfApi
info = HfApi().model_info("cmh-test/tiny")
print(json.dumps({"gated": info.gated, "private": info.private, "sha": info.sha}))
"""


#: A gated repo's listings, public at the Hub: (method, target).
LISTINGS = [
    ("GET", f"/api/models/{TINY_REPO}/tree/main?recursive=true&expand=false"),
    ("POST", f"/api/models/{TINY_REPO}/paths-info/main"),
]
PATHS = {"paths": "config.json", "expand": "false"}

LIST_SCRIPT = r"""
import json
from huggingface_hub import HfApi, HfFileSystem
api = HfApi()
print(json.dumps({
    "files": api.list_repo_files("cmh-test/tiny"),
    "branches": [b.name for b in api.list_repo_refs("cmh-test/tiny").branches],
    "commits": len(api.list_repo_commits("cmh-test/tiny")),
    "ls": HfFileSystem().ls("cmh-test/tiny", detail=False),
}))
"""


def _code(answer: httpx2.Response) -> tuple[int, str | None]:
    return answer.status_code, answer.headers.get("X-Error-Code")


def test_gated_repo_the_tokens_file_names_is_refused_as_the_hub_refuses_a_reader(
    mirror: MirrorServer, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """A gated upstream repo the mirror's token reads, named in ``--tokens`` for one reader:
    no token gives 401 ``GatedRepo``, another token 403 ``GatedRepo`` (it was 404
    ``RepoNotFound``), the granted one the bytes; the info is public, ``gated: manual``."""
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{READER} {TINY_REPO}\n")
    upstream_token = tmp_path / "upstream-token"
    upstream_token.write_text(PRIVATE_TOKEN + "\n")
    with running(mirror.url, xet_listing=False) as hub:
        hub.gate(TINY_REPO, frozenset({f"Bearer {PRIVATE_TOKEN}"}))
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(
            tmp_path / "pull",
            tokens=tokens,
            extra_args=("--upstream", hub.url, "--upstream-token-file", str(upstream_token)),
        )
        url = f"{pull.url}/{TINY_REPO}/resolve/main/config.json"
        for method in ("HEAD", "GET"):  # the first asks the upstream: nothing held yet
            assert _code(httpx2.request(method, url, timeout=TEST_DEADLINE)) == (
                401,
                "GatedRepo",
            ), method
            other = httpx2.request(
                method, url, headers={"Authorization": "Bearer other-0002"}, timeout=TEST_DEADLINE
            )
            assert _code(other) == (403, "GatedRepo"), method
            assert (
                f"Visit {hub.url}/{TINY_REPO} to ask for access."
                in other.headers["X-Error-Message"]
            )
        granted = httpx2.get(
            url, headers={"Authorization": f"Bearer {READER}"}, timeout=TEST_DEADLINE
        )
        assert granted.status_code == 200
        info = httpx2.get(f"{pull.url}/api/models/{TINY_REPO}", timeout=TEST_DEADLINE)
        assert info.status_code == 200, info.text
        assert info.json()["gated"] == "manual" and info.json()["private"] is False
        direct = httpx2.get(f"{hub.url}/api/models/{TINY_REPO}", timeout=TEST_DEADLINE).json()
        assert direct["gated"] == "manual"
        out = run_python(INFO_SCRIPT, hf_env(pull.url, tmp_path / "home"))
        assert out["gated"] == "manual" and out["private"] is False
        # Its listings are public at the Hub too (was: 401 GatedRepo, so list_repo_files,
        # list_repo_refs, HfFileSystem.ls raised GatedRepoError at the mirror only).
        for method, target in LISTINGS:
            at_hub, at_mirror = (
                httpx2.request(method, f"{base}{target}", data=PATHS, timeout=TEST_DEADLINE)
                for base in (hub.url, pull.url)
            )
            assert (at_mirror.status_code, at_hub.status_code) == (200, 200), target
        listed = run_python(LIST_SCRIPT, hf_env(pull.url, tmp_path / "home"))
        at_hub = run_python(LIST_SCRIPT, hf_env(hub.url, tmp_path / "home"))
        # History and refs: the mirror knows what it pulled (main, its commit) only.
        assert "main" in listed.pop("branches") and listed.pop("commits") >= 1
        assert listed == {k: at_hub[k] for k in listed} and "config.json" in listed["files"]
        derived = f"{pull.url}/api/cmh/manifest/{TINY_REPO}/resolve/main/weights.bin"
        assert _code(httpx2.get(derived, timeout=TEST_DEADLINE)) == (401, "GatedRepo")


def test_upstream_without_auth_check_decides_by_a_head_of_a_listed_file(
    mirror: MirrorServer, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """An upstream that has no ``auth-check`` (a bare 404 there): a gated repo is decided by
    a HEAD of one listed file with the mirror's token, not answered 502."""
    upstream_token = tmp_path / "upstream-token"
    upstream_token.write_text(PRIVATE_TOKEN + "\n")
    with running(mirror.url, xet_listing=False) as hub:
        hub.gate(TINY_REPO, frozenset({f"Bearer {PRIVATE_TOKEN}"}))
        hub.fail(404, times=1000, path=r"/auth-check$")
        (tmp_path / "reads").mkdir()
        reads = mirror_server_factory(
            tmp_path / "reads",
            extra_args=("--upstream", hub.url, "--upstream-token-file", str(upstream_token)),
        )
        url = f"{reads.url}/{TINY_REPO}/resolve/main/config.json"
        assert _code(httpx2.get(url, timeout=TEST_DEADLINE)) == (
            401,
            "GatedRepo",
        )  # read by the mirror, not granted
        (tmp_path / "refused").mkdir()
        refused = mirror_server_factory(tmp_path / "refused", extra_args=("--upstream", hub.url))
        answer = httpx2.get(
            f"{refused.url}/{TINY_REPO}/resolve/main/config.json", timeout=TEST_DEADLINE
        )
        assert _code(answer) == (401, "GatedRepo")  # the upstream's refusal of the mirror
        assert "Please log in." in answer.headers["X-Error-Message"]
        assert len(hub.records(path=r"/auth-check$")) >= 2  # asked, and found missing
