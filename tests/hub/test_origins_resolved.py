"""Origins are decided on resolved addresses, not strings (issue 35).

A Hub on 127.0.0.1 (``hostile_upstream.HostileHub``) redirects a file to a listener on
another loopback address (``Recorder``, a working CDN: it serves the file's bytes). Every
spelling of that address is refused by ``cmh pull``, ``cmh serve --upstream`` and
``cmh mirror sync`` alike, with a message naming ``--trust-origin``; a deployment that
names the origin (a local CDN on 127.0.0.2) is followed. Each test failed on the string
comparison before.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner, Result
from cmh.cli.main import cli
from deadline_support import TEST_DEADLINE
from hostile_upstream import BODY, HostileHub, Recorder
from mirror_support import MirrorServer

#: Ways to write 127.0.0.3 in a URL (decimal, shortened, hexadecimal, dotted).
SPELLINGS = ("2130706435", "127.3", "0x7f000003", "127.0.0.3")
ENV = {"CMH_TRUSTED_ORIGINS": None, "HF_TOKEN": "hf_secret_for_the_hub_only_0001"}


def _spelled(recorder: Recorder, spelling: str) -> str:
    return recorder.url.replace("127.0.0.3", spelling)


def _pull(hub: HostileHub, tmp_path: Path, *extra: str) -> Result:
    args = ["pull", hub.repo_id, "--endpoint", hub.url, "--cache-dir", str(tmp_path / "cache")]
    env = {**ENV, "HF_HOME": str(tmp_path / "hf-home")}
    return CliRunner().invoke(cli, [*args, *extra], env=env)


def _sync(hub: HostileHub, tmp_path: Path) -> Result:
    args = ["mirror", "sync", hub.repo_id, "--store", str(tmp_path / "store"), "--from", hub.url]
    return CliRunner().invoke(cli, args, env={**ENV, "HF_HOME": str(tmp_path / "hf-home")})


def test_every_spelling_of_a_loopback_address_is_a_local_address() -> None:
    from cmh.hub.resolver import OriginRule, UnsafeRedirect

    rule = OriginRule("https://hub.example")  # a Hub elsewhere (no name resolves here)
    for spelling in (*SPELLINGS, "0x7f.1", "0177.0.0.1", "[::ffff:127.0.0.1]", "localhost"):
        with pytest.raises(UnsafeRedirect, match="--trust-origin"):
            rule.hop("https://hub.example/m/resolve/c/f", f"https://{spelling}/f", True)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_cmh_pull_refuses_each_spelling_and_names_the_option(spelling: str, tmp_path: Path) -> None:
    with Recorder("127.0.0.3") as local, HostileHub() as hub:
        hub.resolve_redirect = lambda method, path: f"{_spelled(local, spelling)}/cdn/{path}"
        result = _pull(hub, tmp_path)
        assert result.exit_code == 3, result.output
        assert "local address refused" in result.output
        assert "--trust-origin" in result.output and "Traceback" not in result.output
        assert local.seen == []


@pytest.mark.parametrize("path", ["serve", "sync"])
def test_the_mirror_and_mirror_sync_refuse_a_spelled_loopback_address(
    path: str, mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    with Recorder("127.0.0.3") as local, HostileHub() as hub:
        hub.resolve_redirect = lambda method, p: f"{_spelled(local, '2130706435')}/cdn/{p}"
        if path == "sync":
            result = _sync(hub, tmp_path)
            assert result.exit_code != 0, result.output
            assert "--trust-origin" in result.output
        else:
            (tmp_path / "pull").mkdir()
            pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", hub.url))
            answer = httpx2.get(
                f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=TEST_DEADLINE
            )
            assert answer.status_code == 502, answer.status_code
            assert "--trust-origin" in answer.headers.get("X-Error-Message", "")
        assert local.seen == []


def test_a_hub_on_127_0_0_1_and_its_cdn_on_127_0_0_2_with_the_origin_trusted(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    """The CDN is refused until the deployment names it; then ``cmh pull`` and the mirror
    follow the redirect (the token stays on the Hub's origin)."""
    with Recorder("127.0.0.2") as cdn, HostileHub() as hub:
        assert ipaddress.ip_address(cdn.host).is_loopback and cdn.host != "127.0.0.1"
        hub.resolve_redirect = lambda method, path: f"{cdn.url}/cdn/{path}"
        refused = _pull(hub, tmp_path / "a")
        assert refused.exit_code == 3 and f"--trust-origin {cdn.url}" in refused.output
        result = _pull(hub, tmp_path / "b", "--trust-origin", cdn.url)
        assert result.exit_code == 0, result.output
        files = list((tmp_path / "b" / "cache").rglob("snapshots/*/config.json"))
        assert len(files) == 1 and files[0].read_bytes() == BODY
        assert cdn.seen and all(s.authorization is None for s in cdn.seen)
        (tmp_path / "pull").mkdir()
        pull = mirror_server_factory(
            tmp_path / "pull", extra_args=("--upstream", hub.url, "--trust-origin", cdn.url)
        )
        answer = httpx2.get(
            f"{pull.url}/{hub.repo_id}/resolve/main/config.json", timeout=TEST_DEADLINE
        )
        assert answer.status_code == 200 and answer.content == BODY


def test_trust_origin_refuses_what_is_not_an_origin(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["pull", "a/b", "--trust-origin", "127.0.0.2:9000"], env=ENV)
    assert result.exit_code == 2 and "is not an origin" in result.output
