"""Pure parts of the mirror: target routing, bearer tokens and the tokens file."""

from __future__ import annotations

from pathlib import Path

import pytest
from cmh.hub.mirror._auth import AccessPolicy, TokensFileError, bearer_token, load_tokens
from cmh.hub.mirror._documents import BadCursor, decode_cursor, encode_cursor
from cmh.hub.mirror._fingerprints import FingerprintCache
from cmh.hub.mirror._routes import BadTarget, NoRoute, Route, parse_target


@pytest.mark.parametrize(
    ("target", "route"),
    [
        ("/org/name/resolve/main/config.json",
         Route("resolve", "model", "org/name", "main", "config.json")),
        ("/name/resolve/v1.0/a/b.txt", Route("resolve", "model", "name", "v1.0", "a/b.txt")),
        ("/org/name/resolve/refs%2Fpr%2F3/x",
         Route("resolve", "model", "org/name", "refs/pr/3", "x")),
        ("/org/name/resolve/refs/pr/3/x", Route("resolve", "model", "org/name", "refs/pr/3", "x")),
        ("/datasets/org/d/resolve/main/t/p.csv",
         Route("resolve", "dataset", "org/d", "main", "t/p.csv")),
        ("/org/name/resolve/main/sp%20ace.txt",
         Route("resolve", "model", "org/name", "main", "sp ace.txt")),
        ("/api/models/org/name", Route("repo_info", "model", "org/name")),
        ("/api/models/org/name?blobs=true",
         Route("repo_info", "model", "org/name", query={"blobs": "true"})),
        ("/api/datasets/org/d/revision/v2", Route("repo_info", "dataset", "org/d", "v2")),
        ("/api/models/org/name/tree/main", Route("tree", "model", "org/name", "main", "")),
        ("/api/models/org/name/tree/main/sub%2Fdeeper",
         Route("tree", "model", "org/name", "main", "sub/deeper")),
        ("/api/models/name/tree/main/", Route("tree", "model", "name", "main", "")),
        ("/api/models/org/name/paths-info/main", Route("paths_info", "model", "org/name", "main")),
        ("/api/cmh/fingerprint/org/name/main", Route("fingerprint", "model", "org/name", "main")),
        ("/api/cmh/fingerprint/datasets/org/d/main",
         Route("fingerprint", "dataset", "org/d", "main")),
        ("/health", Route("health")),
    ],
)  # fmt: skip
def test_routes(target: str, route: Route) -> None:
    assert parse_target(target) == route


@pytest.mark.parametrize(
    "target",
    [
        "org/name/resolve/main/x", "//org/name/resolve/main/x", "/org/name/resolve/main/x#f",
        "/org/name/resolve/main/a/../b", "/org/name/resolve/main/a%2F..%2Fb",
        "/org/name/resolve/main/%2e", "/org/name/resolve/main/a%00", "/org/name/resolve/main/a%5cb",
        "/org/name/resolve/..%2F../x", "/o--rg/name/resolve/main/x", "/.org/name/resolve/main/x",
        "/org/name/resolve/main/%c3%28", "/api/models/org/name/tree/main/a/../..",
        "/org/name/resolve/main/x?a=%ff", "/org/name/resolve/main/" + "a" * 9000,
    ],
)  # fmt: skip
def test_bad_targets(target: str) -> None:
    with pytest.raises(BadTarget):
        parse_target(target)


@pytest.mark.parametrize(
    "target", ["/", "/metrics/x", "/org/name", "/org/name/blob/main/x", "/api/spaces/a/b"]
)
def test_unknown_targets(target: str) -> None:
    with pytest.raises(NoRoute):
        parse_target(target)


def test_bearer_token() -> None:
    assert bearer_token("Bearer hf_abcdefgh") == "hf_abcdefgh"
    assert bearer_token("bearer   hf_abcdefgh ") == "hf_abcdefgh"
    for bad in (None, "", "Basic hf_abcdefgh", "Bearer", "Bearer short", "Bearer a b c d e f g h"):
        assert bearer_token(bad) is None


def test_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(
        "# comment\n\ntoken-alice-1 org/private datasets/org/data  # trailing comment\n"
        "token-bob-22 org/private\n"
    )
    policy = load_tokens(path)
    assert policy.private == {"org/private", "datasets/org/data"}
    assert policy.can_read("model", "org/public", None)
    assert not policy.can_read("model", "org/private", None)
    assert policy.can_read("model", "org/private", "token-bob-22")
    assert not policy.can_read("dataset", "org/data", "token-bob-22")
    assert policy.can_read("dataset", "org/data", "token-alice-1")
    assert not policy.can_read("model", "org/private", "token-alice-")
    assert AccessPolicy().can_read("model", "org/private", None)


@pytest.mark.parametrize(
    "text", ["short org/x\n", "token-without-repos\n", "token-ok-123 ../evil\n", "\udcff"]
)
def test_bad_tokens_files(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tokens"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(TokensFileError):
        load_tokens(path)


def test_fingerprint_cache_computes_once_and_keeps_the_most_recent():
    cache = FingerprintCache(max_entries=2)
    calls: list[str] = []

    def compute(commit: str):
        def run() -> dict[str, str]:
            calls.append(commit)
            return {"commit": commit}

        return run

    key = {c: ("model:org/m", c) for c in "abc"}
    assert cache.get(key["a"], compute("a")) == {"commit": "a"}
    assert cache.get(key["a"], compute("a")) == {"commit": "a"}
    cache.get(key["b"], compute("b"))
    cache.get(key["a"], compute("a"))  # a is now the most recent
    cache.get(key["c"], compute("c"))  # evicts b, the least recent
    assert len(cache) == 2
    cache.get(key["a"], compute("a"))
    cache.get(key["b"], compute("b"))
    assert calls == ["a", "b", "c", "b"]


def test_fingerprint_cache_keeps_nothing_when_compute_fails():
    cache = FingerprintCache()

    def fail() -> dict[str, str]:
        raise OSError("blob gone")

    with pytest.raises(OSError):
        cache.get(("model:org/m", "a"), fail)
    assert len(cache) == 0


def test_cursors_round_trip_and_refuse_other_listings():
    commit, other = "a" * 40, "b" * 40
    cursor = encode_cursor(commit, 1000)
    assert decode_cursor(cursor, commit) == 1000
    with pytest.raises(BadCursor, match="does not belong"):
        decode_cursor(cursor, other)
    with pytest.raises(BadCursor, match="invalid cursor"):
        decode_cursor("!!not base64!!", commit)


def test_a_refused_name_does_the_same_work_as_an_unknown_one(tmp_path, monkeypatch) -> None:
    """Issue 23 (low): names in the tokens file answered ~40 us faster than unknown names
    (``repo_exists`` was skipped for them). Both now look the repo up."""
    from cmh.hub.mirror import _app as app_module
    from cmh.hub.mirror._auth import AccessPolicy
    from cmh.hub.mirror._errors import HubError
    from cmh.hub.mirror._observe import Metrics
    from cmh.hub.mirror._routes import parse_target
    from cmh.hub.mirror._state import MirrorState
    from cmh.hub.mirror.stores import open_store

    backend = open_store(tmp_path)
    state = MirrorState(
        backend, AccessPolicy({"secret-token-1": frozenset({"acme/private"})}), Metrics(None)
    )
    looked: list[str] = []
    real = backend.repo_exists
    monkeypatch.setattr(
        backend, "repo_exists", lambda kind, repo_id: looked.append(repo_id) or real(kind, repo_id)
    )
    for name in ("acme/private", "acme/unknown"):
        route = parse_target(f"/api/models/{name}")
        try:
            app_module._readable(state, route, None)
        except HubError as exc:
            assert exc.status == 404
    assert looked == ["acme/private", "acme/unknown"]


def test_a_query_reads_the_last_value_of_name_and_name_brackets() -> None:
    query = parse_target("/api/models/o/n?blobs=true&expand[]=a&blobs[]=false&expand=b").query
    assert query.get("blobs") == "false" and query.get("expand") == "b"
    assert query.getall("expand") == ["a", "b"]


@pytest.mark.parametrize("limit", ["\u00b2", "\u0661\u0660", "+5", "0"])
def test_a_listing_limit_is_ascii_digits(limit: str) -> None:
    """``?limit=%C2%B2`` answered 500 ("²".isdigit() holds, int("²") raises): a malformed
    request never gets a 5xx (spec 2.7); "١٠" (Arabic-Indic ten) was a limit of 10."""
    from cmh.hub.mirror._catalog import BadQuery, parse_query

    with pytest.raises(BadQuery):
        parse_query([("limit", limit)])
    assert parse_query([("limit", "10")]).limit == 10
