"""The mirror's web pages over HTTP: access rules shared with the API, login, safety, content.

Every test talks to a real ``cmh serve`` (``web_server``) over the store of
``web_support`` (browser tests are in ``test_web_browser.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import HTTPRedirectHandler, Request, build_opener

import pytest
from cmh.hub.mirror.web._card_worker import CardRenderer
from cmh.hub.mirror.web._cards import card_tags, render_markdown, safe_link, split_front_matter
from cmh.hub.mirror.web._session import AdminTokensError, csrf_ok, load_admin_tokens
from deadline_support import TEST_DEADLINE
from loop_server import LoopServer
from mirror_support import ManualClock, MirrorServer, wait_for
from web_support import (
    ADMIN_TOKEN,
    DATA,
    EVIL,
    EVIL_CARD,
    MINILM,
    PRIVATE,
    PRIVATE_TOKEN,
    TINY,
    WebStore,
    held_render,
)

REPOS = [("model", MINILM), ("model", TINY), ("model", PRIVATE), ("model", EVIL), ("dataset", DATA)]


class _NoRedirect(HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None


def fetch(
    server: MirrorServer | _ServedHere,
    path: str,
    *,
    cookie: str | None = None,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
) -> tuple[int, dict[str, str], str]:
    """``(status, headers, body)`` of one request; redirects are not followed."""
    all_headers = dict(headers or {})
    if cookie is not None:
        all_headers["Cookie"] = cookie
    request = Request(server.url + path, data=data, headers=all_headers)
    try:
        with build_opener(_NoRedirect).open(request, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except HTTPError as exc:
        hdrs = {k.lower(): v for k, v in exc.headers.items()}
        return exc.code, hdrs, exc.read().decode()


def listed(body: str) -> set[str]:
    """Repo ids on a list page."""
    return set(
        re.findall(
            r'<tr data-name="[^"]*">\s*<td class="name"><a href="/(?:datasets/)?([^"]+)"', body
        )
    )


def hub_pages(repo_type: str, repo_id: str) -> list[str]:
    """Every Hub-style page URL of a repo (its README exists on ``main``)."""
    home = f"/{repo_id}" if repo_type == "model" else f"/datasets/{repo_id}"
    return [home, f"{home}/", f"{home}/tree/main", f"{home}/blob/main/README.md",
            f"{home}/commits/main"]  # fmt: skip


def api_status(server: MirrorServer, repo_type: str, repo_id: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return fetch(server, f"/api/{repo_type}s/{repo_id}", headers=headers)[0]


@pytest.mark.parametrize("token", [None, PRIVATE_TOKEN, ADMIN_TOKEN, "not-a-known-token"])
def test_pages_and_api_agree_on_every_repo(web_server: MirrorServer, token: str | None) -> None:
    cookie = f"cmh_token={token}" if token else None
    _, _, body = fetch(web_server, "/", cookie=cookie)
    shown = listed(body)
    for repo_type, repo_id in REPOS:
        api = api_status(web_server, repo_type, repo_id, token)
        page = fetch(web_server, f"/-/{repo_type}s/{repo_id}", cookie=cookie)[0]
        assert page == api, (repo_id, token)
        for hub_style in hub_pages(repo_type, repo_id):
            assert fetch(web_server, hub_style, cookie=cookie)[0] == api, (hub_style, token)
        assert (repo_id in shown) == (api == 200), (repo_id, token)
    assert (PRIVATE in shown) == (token == PRIVATE_TOKEN)


def test_private_repo_answers_like_a_missing_one(web_server: MirrorServer) -> None:
    private = fetch(web_server, f"/-/models/{PRIVATE}")
    missing = fetch(web_server, "/-/models/acme/no-such-model")
    assert private[0] == missing[0] == 404
    assert private[2] == missing[2]
    file_page = fetch(web_server, f"/-/files/models/{PRIVATE}?path=README.md")
    assert file_page[0] == 404
    for page, other in zip(
        hub_pages("model", PRIVATE), hub_pages("model", "acme/no-such-model"), strict=True
    ):
        answer, gone = fetch(web_server, page), fetch(web_server, other)
        assert answer[0] == gone[0] == 404, page
        assert answer[2] == gone[2], page
    for facet in ("license=acme-secret-license", "task=acme-secret-task"):
        _, _, body = fetch(web_server, f"/?{facet}")
        counts = body.split('id="facets"', 1)[1].split('id="count"', 1)[0]
        counts = re.sub(r'<p class="chosen".*?</p>', "", counts, flags=re.DOTALL)
        assert "acme-secret" not in counts, facet  # only the filter asked is echoed
        assert listed(body) == set()
    _, _, body = fetch(web_server, "/")
    assert "acme-secret" not in body
    _, _, body = fetch(web_server, "/", cookie=f"cmh_token={PRIVATE_TOKEN}")
    assert "acme-secret-license" in body  # the facet shows for the token that opens the repo


def _login_form(server: MirrorServer | _ServedHere) -> tuple[str, str]:
    status, headers, body = fetch(server, "/-/login")
    assert status == 200
    match = re.search(r"cmh_csrf=([^;]+)", headers["set-cookie"])
    field = re.search(r'name="csrf" value="([^"]+)"', body)
    assert match and field
    return match.group(1), field.group(1)


def _post_login(
    server: MirrorServer, token: str, csrf_cookie: str, csrf_field: str, origin: str | None
) -> tuple[int, dict[str, str], str]:
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if origin is not None:
        headers["Origin"] = origin
    data = urlencode({"token": token, "csrf": csrf_field}).encode()
    return fetch(server, "/-/login", cookie=f"cmh_csrf={csrf_cookie}", headers=headers, data=data)


def test_login_sets_an_httponly_strict_cookie(web_server: MirrorServer) -> None:
    cookie, field = _login_form(web_server)
    status, headers, _ = _post_login(web_server, PRIVATE_TOKEN, cookie, field, web_server.url)
    assert status == 303 and headers["location"] == "/"
    set_cookie = headers["set-cookie"]
    assert set_cookie.startswith(f"cmh_token={PRIVATE_TOKEN};")
    assert "HttpOnly" in set_cookie
    assert "SameSite=Strict" in set_cookie
    assert "Secure" not in set_cookie  # served over plain http here
    _, _, body = fetch(web_server, "/", cookie=f"cmh_token={PRIVATE_TOKEN}")
    assert PRIVATE in listed(body)


def test_login_behind_a_tls_proxy_sets_a_secure_cookie(web_server: MirrorServer) -> None:
    cookie, field = _login_form(web_server)
    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Forwarded-Proto": "https",
               "Origin": web_server.url.replace("http://", "https://")}  # fmt: skip
    data = urlencode({"token": ADMIN_TOKEN, "csrf": field}).encode()
    status, answer, _ = fetch(
        web_server, "/-/login", cookie=f"cmh_csrf={cookie}", headers=headers, data=data
    )
    assert status == 303
    assert "Secure" in answer["set-cookie"] and "SameSite=Strict" in answer["set-cookie"]


@pytest.mark.parametrize(
    "case", ["no form token", "wrong form token", "foreign origin", "null origin"]
)
def test_login_cannot_be_posted_cross_site(web_server: MirrorServer, case: str) -> None:
    cookie, field = _login_form(web_server)
    origin: str | None = web_server.url
    if case == "no form token":
        field = ""
    elif case == "wrong form token":
        field = field[::-1]
    elif case == "foreign origin":
        origin = "http://evil.example"
    else:
        origin = "null"
    status, headers, body = _post_login(web_server, PRIVATE_TOKEN, cookie, field, origin)
    assert status == 403
    assert "cmh_token" not in headers.get("set-cookie", "")
    assert "not sent from this site" in body


@pytest.mark.parametrize(
    ("content_type", "body"),
    [("multipart/form-data; boundary=zz", b"garbage"),
     ("application/x-www-form-urlencoded", b"token=\xff\xfe&csrf=\x89")],
)  # fmt: skip
def test_malformed_login_forms_are_refused(
    web_server: MirrorServer, content_type: str, body: bytes
) -> None:
    for target in ("/-/login", "/-/logout"):
        status, _, page = fetch(
            web_server, target, headers={"Content-Type": content_type}, data=body
        )
        assert status == 400 and "malformed form" in page


def test_csrf_check() -> None:
    assert csrf_ok("t", "t", None, "h:1")
    assert csrf_ok("t", "t", "https://h:1", "h:1") and csrf_ok("t", "t", "http://h:1", "h:1")
    assert not csrf_ok("t", "t", "http://h:2", "h:1")
    assert not csrf_ok("t", "t", "http://", "")
    assert not csrf_ok("t", "u", None, "h:1") and not csrf_ok(None, None, None, "h:1")


def test_login_refuses_an_unknown_token(web_server: MirrorServer) -> None:
    cookie, field = _login_form(web_server)
    status, headers, body = _post_login(web_server, "hf_unknown_token_x", cookie, field, None)
    assert status == 403
    assert "cmh_token=" not in headers.get("set-cookie", "")
    assert "unknown token" in body


def test_operator_page_only_for_an_admin_token(web_server: MirrorServer) -> None:
    assert fetch(web_server, "/-/operator")[0] == 403
    assert fetch(web_server, "/-/operator", cookie=f"cmh_token={PRIVATE_TOKEN}")[0] == 403
    status, _, body = fetch(web_server, "/-/operator", cookie=f"cmh_token={ADMIN_TOKEN}")
    assert status == 200
    assert 'id="size-chart"' in body and "<rect" in body


def test_operator_page_shows_expired_stale_prune_and_scrub(
    web_server: MirrorServer, web_store: WebStore
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "mirror", "scrub", "--store", str(web_store.path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for _ in range(3):
        fetch(web_server, f"/{TINY}/resolve/main/config.json")
    _, _, body = fetch(web_server, "/-/operator", cookie=f"cmh_token={ADMIN_TOKEN}")
    expired = body.split('id="expired"', 1)[1].split("</table>", 1)[0]
    assert web_store.commits[f"{TINY}@main"][:12] in expired
    stale = body.split('id="stale"', 1)[1].split("</table>", 1)[0]
    assert web_store.commits[f"{TINY}@first"][:12] in stale
    prune = body.split('id="prune"', 1)[1].split("</section>", 1)[0]
    assert "cmh prune --store STORE would free" in re.sub(r"<[^>]+>", "", prune)
    assert "Nothing is removed from this page" in prune
    scrub = body.split('id="scrub"', 1)[1].split("</section>", 1)[0]
    assert "all good" in scrub
    traffic = body.split('id="traffic"', 1)[1].split("</section>", 1)[0]
    assert TINY in traffic.split('id="busiest"', 1)[1]
    requests = int(re.search(r'id="requests">(\d+)<', traffic).group(1))  # type: ignore[union-attr]
    assert requests >= 3
    assert web_store.path.joinpath(".quarantine", "last-scrub.json").is_file()


def test_repo_page_shows_card_tags_tree_refs_snippet_fingerprint(
    web_server: MirrorServer, web_store: WebStore
) -> None:
    status, _, body = fetch(web_server, f"/-/models/{MINILM}")
    assert status == 200
    assert "license: apache-2.0" in body and "task: sentence-similarity" in body
    assert '<article class="card" id="card">' in body
    assert web_store.commits[f"{MINILM}@main"] in body
    assert 'class="badge lfs">LFS' in body
    assert f"export HF_ENDPOINT={web_server.url}" in body
    assert f"cmh pull {MINILM} --revision main" in body
    fingerprint = body.split('id="fingerprint"', 1)[1].split("</dl>", 1)[0]
    assert "bert" in fingerprint and "weights key" in fingerprint
    _, _, api = fetch(web_server, f"/api/cmh/fingerprint/{MINILM}/main")
    weights_key = json.loads(api)["fingerprint"]["keys"]["weights"]
    assert weights_key in fingerprint  # the same computation as the API's


def test_snippet_names_the_public_url_never_the_host_header(web_server: MirrorServer) -> None:
    for host in ("mirror.example:8080", 'a"b<c>'):
        _, _, body = fetch(web_server, f"/-/models/{TINY}", headers={"Host": host})
        assert f"export HF_ENDPOINT={web_server.url}\n" in body
        assert "mirror.example" not in body and "a&#34;b" not in body


def test_tree_folders_revisions_and_datasets(web_server: MirrorServer, web_store: WebStore) -> None:
    status, _, body = fetch(web_server, f"/-/models/{TINY}?path=docs")
    assert status == 200 and "notes.md" in body and "model.safetensors" not in body
    first = web_store.commits[f"{TINY}@first"]
    status, _, body = fetch(web_server, f"/-/models/{TINY}?rev={first}")
    assert status == 200 and "version 1" in body
    status, _, body = fetch(web_server, f"/-/datasets/{DATA}")
    assert status == 200 and "train.csv" in body and "--repo-type dataset" in body
    assert fetch(web_server, f"/-/models/{TINY}?rev=no-such-branch")[0] == 404
    assert fetch(web_server, f"/-/models/{TINY}?path=nowhere")[0] == 404


def test_file_page_stamp_details_and_verification(
    web_server: MirrorServer, web_store: WebStore
) -> None:
    # Each stamped blob is verified by one test only (the outcome is kept per blob):
    # MiniLM's by the browser test, tiny's main here; tiny's first commit by nobody.
    status, _, body = fetch(web_server, f"/-/files/models/{MINILM}?path=model.safetensors")
    assert status == 200
    assert f'id="signer">{web_store.key_id}<' in body
    assert "valid (trusted key)" in body
    assert "104 tensors" in body
    first = web_store.commits[f"{TINY}@first"]
    _, _, body = fetch(web_server, f"/-/files/models/{TINY}?rev={first}&path=model.safetensors")
    assert 'id="stamp-state"><span class="badge good">stamped' in body
    assert 'id="verify"' in body  # not verified yet: a link to do it
    path = f"/-/files/models/{TINY}?path=model.safetensors"
    _, _, body = fetch(web_server, path)
    assert 'id="stamp-state"><span class="badge bad">expired' in body
    _, _, body = fetch(web_server, path + "&verify=1")
    verified = body.split('id="verified">', 1)[1].split("</dd>", 1)[0]
    assert "verified</span> every tensor matches the manifest" in verified
    assert "signature is valid" not in verified  # not signed
    _, _, body = fetch(web_server, f"/-/files/models/{EVIL}?path=model.safetensors")
    assert 'id="stamp-state">unstamped' in body


def test_hub_api_paths_unchanged_and_pages_refuse_hostile_targets(
    web_server: MirrorServer,
) -> None:
    status, headers, body = fetch(web_server, f"/api/models/{TINY}")
    assert status == 200 and json.loads(body)["id"] == TINY
    status, headers, _ = fetch(web_server, f"/{TINY}/resolve/main/config.json")
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    status, headers, _ = fetch(web_server, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    for target in (
        "/-/models/..%2F..%2Fetc/passwd",
        f"/-/files/models/{TINY}?path=../../../etc/passwd",
        f"/-/files/models/{TINY}?path=%00",
        f"/-/models/{TINY}?rev=..%2F..",
        "/-/static/..%2Fpages.py",
        "/-/static/%2e%2e",
        "/-/models/a/b/c",
        "/-/%ff",
        "/-/nowhere",
    ):
        status = fetch(web_server, target)[0]
        assert 400 <= status < 500, target


def test_pages_send_a_strict_content_security_policy(web_server: MirrorServer) -> None:
    _, headers, _ = fetch(web_server, f"/-/models/{EVIL}")
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store"


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def test_hostile_card_renders_to_inert_html() -> None:
    front, body, problem = split_front_matter(EVIL_CARD)
    assert problem is None and front["license"] == "mit"
    parser = _Collect()
    parser.feed(render_markdown(body))
    names = {tag for tag, _ in parser.tags}
    assert "script" not in names and "img" not in names
    for _, attrs in parser.tags:
        for key, value in attrs:
            assert not key.startswith("on")
            if key in ("href", "src"):
                assert value is not None and value.startswith("https://"), value
    assert ("a", [("href", "https://example.org/docs")]) in parser.tags


@pytest.mark.parametrize(
    ("url", "ok"),
    [("https://x.org", True), ("http://x", True), ("mailto:a@b.c", True), ("docs/a.md", True),
     ("#top", True), ("javascript:alert(1)", False), (" JavaScript:alert(1)", False),
     ("vbscript:x", False), ("data:text/html,x", False), ("file:///etc/passwd", False)],
)  # fmt: skip
def test_safe_link(url: str, ok: bool) -> None:
    assert safe_link(url) is ok


def test_front_matter_tags_and_broken_front_matter() -> None:
    front, body, problem = split_front_matter("---\nlicense: mit\ntags: [a, b]\n---\n# T\n")
    assert card_tags(front) == ("license: mit", "a", "b") and body == "# T\n" and problem is None
    _, body, problem = split_front_matter("---\n: : [\n---\n# T\n")
    assert problem is not None and body == "# T\n"
    assert split_front_matter("# no front matter\n") == ({}, "# no front matter\n", None)


def test_admin_tokens_file(tmp_path: Path) -> None:
    good = tmp_path / "admin"
    good.write_text("# ops\nadmin-token-0001  # alice\n\n")
    assert load_admin_tokens(good) == frozenset({"admin-token-0001"})
    for text in ("short\n", "# nothing\n"):
        good.write_text(text)
        with pytest.raises(AdminTokensError):
            load_admin_tokens(good)


def test_serve_refuses_a_bad_admin_tokens_file(tmp_path: Path, web_store: WebStore) -> None:
    bad = tmp_path / "admin"
    bad.write_text("x\n")
    proc = subprocess.run(
        [sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(web_store.path),
         "--port", "0", "--admin-tokens", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "a token is 8-512 printable characters" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_grafana_dashboard_queries_metrics_the_mirror_exports(web_server: MirrorServer) -> None:
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana-mirror.json").read_text())
    fetch(web_server, f"/{TINY}/resolve/main/config.json", headers={"Range": "bytes=0-3"})
    fetch(web_server, "/")
    samples = web_server.metrics()
    labels_of: dict[str, set[str]] = {}
    for name, labels in samples:
        labels_of.setdefault(name, set()).update(k for k, _ in labels)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 8
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for expr in exprs:
        names = re.findall(r"\bcmh_mirror_[a-z_]+", expr)
        assert names, expr
        for name in names:
            assert name in labels_of, (name, sorted(labels_of))
            for group in re.findall(r"by \(([^)]*)\)", expr):
                for label in (g.strip() for g in group.split(",")):
                    assert label in labels_of[name], (label, name)


def test_reading_the_web_options_imports_no_server_stack(web_store: WebStore) -> None:
    """cmh serve reads them before the workers' shared metrics are set up."""
    code = (
        "import sys; from pathlib import Path; "
        "from cmh.hub.mirror.web._options import web_options; "
        f"web_options(Path({str(web_store.admin_tokens)!r}), "
        f"(Path({str(web_store.public_key)!r}),)); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'aiohttp', 'prometheus_client', 'jinja2', 'markdown_it', 'yaml'}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_list_sees_a_snapshot_added_to_a_repo_it_read_before(tmp_path: Path) -> None:
    """The list reads the store on every request: a change shows at once."""
    import os

    from cmh.hub.mirror._auth import AccessPolicy
    from cmh.hub.mirror.stores.local._store import LocalStore
    from cmh.hub.mirror.web import _views as views
    from cmh.hub.mirror.web._session import Viewer

    store = tmp_path / "store"
    snapshots = store / "models--org--late" / "snapshots"
    snapshots.mkdir(parents=True)
    old = 1_000_000_000  # long before now: an mtime that says nothing changed
    os.utime(snapshots, (old, old))
    anyone = Viewer(token=None, known=False, admin=False)
    backend = LocalStore(store)

    def listed() -> list[str]:
        return [r.repo_id for r in views.visible_repos(backend, AccessPolicy(), anyone)]

    assert listed() == []
    assert listed() == []
    (snapshots / ("a" * 40)).mkdir()  # the first snapshot
    assert listed() == ["org/late"]
    (snapshots / ("a" * 40)).rmdir()
    assert listed() == []


# -- Hub-style page URLs, previews, facets, chips, parameters, commits ---------------------


def test_hub_style_urls_open_the_pages(web_server: MirrorServer, web_store: WebStore) -> None:
    commit = web_store.commits[f"{TINY}@main"]
    pages = {
        f"/{MINILM}": "all-MiniLM-L6-v2",
        f"/{MINILM}/tree/main/1_Pooling": "1_Pooling/config.json",
        f"/{TINY}/tree/main/docs/": "notes.md",
        f"/{TINY}/tree/{commit}": commit,
        f"/{TINY}/commit/{commit}": commit,
        f"/{TINY}/blob/main/docs/notes.md": "notes",
        f"/{TINY}/commits/main": "cmh mirror add",
        f"/datasets/{DATA}": "train.csv",
        f"/datasets/{DATA}/blob/main/train.csv": "hello,1",
        "/models": MINILM,
        "/datasets": DATA,
    }
    for target, text in pages.items():
        status, headers, body = fetch(web_server, target)
        assert status == 200, target
        assert headers["content-type"].startswith("text/html"), target
        assert headers["content-security-policy"].startswith("default-src 'none'"), target
        assert text in body, target
    _, _, body = fetch(web_server, "/datasets")
    assert listed(body) == {DATA}
    head = Request(web_server.url + f"/{TINY}/tree/main", method="HEAD")
    with build_opener(_NoRedirect).open(head, timeout=60) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        assert r.read() == b""
    for target, status in {
        f"/{TINY}/tree/no-such-branch": 404,
        f"/{TINY}/blob/main/nowhere.txt": 404,
        f"/{TINY}/tree/main/config.json": 404,  # a file, not a folder
        f"/{TINY}/blob/main/..%2F..%2Fetc%2Fpasswd": 400,
        "/acme/no-such-model": 404,
    }.items():
        answer, headers, _ = fetch(web_server, target)
        assert answer == status, target
        assert headers["content-type"].startswith("text/html"), target


#: API targets of every route kind (routes.py) and the content type each answers.
API_TARGETS = {
    "/api/models": "application/json",
    f"/api/models/{TINY}": "application/json",
    f"/api/models/{TINY}/revision/main": "application/json",
    f"/api/models/{TINY}/tree/main": "application/json",
    f"/api/models/{TINY}/tree/main/docs": "application/json",
    f"/api/models/{TINY}/refs": "application/json",
    f"/api/models/{TINY}/commits/main": "application/json",
    f"/api/models/{TINY}/auth-check": "application/json",
    f"/api/datasets/{DATA}": "application/json",
    f"/api/datasets/{DATA}/tree/main": "application/json",
    f"/api/cmh/fingerprint/{TINY}/main": "application/json",
    f"/{TINY}/resolve/main/config.json": "application/octet-stream",
    f"/datasets/{DATA}/resolve/main/train.csv": "application/octet-stream",
    "/health": "application/json",
    "/metrics": "text/plain",
}
#: Targets neither the API nor a page serves: the API's JSON 404, as before.
API_MISSES = ["/api/nowhere", f"/api/models/{TINY}/blob/main/config.json",
              f"/{TINY}/resolve/main", "/api", f"/{MINILM}/extra/segments/here"]  # fmt: skip


def test_every_api_path_keeps_answering_as_the_api(web_server: MirrorServer) -> None:
    from cmh.hub.mirror._routes import parse_target
    from cmh.hub.mirror.web._urls import hub_target

    for target, kind in API_TARGETS.items():
        parse_target(target)  # the API routes it, so no page is ever asked
        status, headers, _ = fetch(web_server, target)
        assert status == 200, target
        assert headers["content-type"].startswith(kind), (target, headers["content-type"])
    for target in API_MISSES:
        status, headers, body = fetch(web_server, target)
        assert status == 404 and headers["content-type"].startswith("application/json"), target
        assert json.loads(body)["error"], target
    assert hub_target(["api", "models", "x"]) is None and hub_target(["-", "x"]) is None
    status, headers, _ = fetch(web_server, f"/{TINY}", data=b"x")  # POST: not a page
    assert status == 404 and headers["content-type"].startswith("application/json")


def test_hub_target_parsing() -> None:
    from cmh.hub.mirror.web._urls import HubTarget, RepoUrls, hub_target

    assert hub_target(["org", "name"]) == HubTarget("repo", "model", "org/name")
    assert hub_target(["gpt2"]) == HubTarget("repo", "model", "gpt2")
    assert hub_target(["org", "name", "tree", "main", "a", "b"]) == HubTarget(
        "tree", "model", "org/name", "main", "a/b"
    )
    assert hub_target(["org", "name", "tree", "refs/pr/1"]) == HubTarget(
        "tree", "model", "org/name", "refs/pr/1"
    )
    assert hub_target(["org", "name", "blob", "refs", "pr", "2", "x.json"]) == HubTarget(
        "blob", "model", "org/name", "refs/pr/2", "x.json"
    )
    assert hub_target(["datasets", "o", "d", "commits", "v1"]) == HubTarget(
        "commits", "dataset", "o/d", "v1"
    )
    assert hub_target(["gpt2", "tree", "main"]) == HubTarget("tree", "model", "gpt2", "main")
    assert hub_target(["datasets"]) == HubTarget("list", "dataset")
    for segs in (["org", "name", "blob", "main"], ["org", "name", "commits", "main", "x"],
                 ["a", "b", "c"], ["", "x"], ["api"], ["datasets", "api", "x"]):  # fmt: skip
        assert hub_target(segs) is None, segs
    urls = RepoUrls("dataset", "o/d")
    assert urls.tree("refs/pr/1", "a b/c") == "/datasets/o/d/tree/refs%2Fpr%2F1/a%20b/c"
    assert urls.blob("main", "x.json", verify="1") == "/datasets/o/d/blob/main/x.json?verify=1"


def test_text_previews_are_highlighted_and_bounded(web_server: MirrorServer) -> None:
    _, _, body = fetch(web_server, f"/{MINILM}/blob/main/config.json")
    preview = body.split('id="preview"', 1)[1].split("</div>", 1)[0]
    assert '<span class="nt">"model_type"</span>' in preview  # a JSON key token
    assert 'style="' not in preview  # classes only: the CSP allows no inline style
    _, _, body = fetch(web_server, f"/{MINILM}/blob/main/README.md")
    assert 'id="preview-note">Markdown' in body
    rendered = body.split('id="rendered">', 1)[1].split("</article>", 1)[0]
    assert "<h1>all-MiniLM-L6-v2</h1>" in rendered and "datasets:" not in rendered
    _, _, body = fetch(web_server, f"/{EVIL}/blob/main/README.md")  # rendered as safely as a card
    rendered = body.split('id="rendered">', 1)[1].split("</article>", 1)[0]
    assert "<script" not in rendered and "&lt;script&gt;" in rendered
    _, _, body = fetch(web_server, f"/{TINY}/blob/main/README.md")
    assert "This file shows 1 image from other sites (images.example.org)" in body
    _, _, body = fetch(web_server, f"/{MINILM}/blob/main/model.safetensors")
    assert 'id="preview"' not in body and 'id="tensors"' in body
    status, headers, css = fetch(web_server, "/-/static/highlight.css")
    assert status == 200 and headers["content-type"].startswith("text/css")
    assert ".highlight .nt" in css and "prefers-color-scheme: dark" in css


def test_text_preview_unit() -> None:
    from cmh.hub.mirror.web._preview import MAX_PREVIEW_BYTES, text_preview

    yaml_preview = text_preview("a/conf.yaml", io.BytesIO(b"key: <script>x</script>\n"))
    assert yaml_preview.language == "YAML" and not yaml_preview.cut
    assert "<script>" not in (yaml_preview.html or "") and "&lt;script&gt;" in (
        yaml_preview.html or ""
    )
    big = b'{"k": "' + "é".encode() * MAX_PREVIEW_BYTES + b'"}'
    cut = text_preview("big.json", io.BytesIO(big))
    assert cut.cut and cut.html is not None and cut.language == "JSON"
    assert len(cut.html) < 40 * MAX_PREVIEW_BYTES
    assert text_preview("w.bin", io.BytesIO(b"ab\x00cd")).reason == "binary file: no preview"
    assert text_preview("l1.txt", io.BytesIO(b"\xff\xfe")).html is None
    unknown = text_preview("LICENSE-weird.zzz", io.BytesIO(b"plain words"))
    assert unknown.language == "Text only" and "plain words" in (unknown.html or "")
    html = text_preview("page.html", io.BytesIO(b"<b>x</b>"))  # a lexer not picked: plain text
    assert html.language == "Text only" and "&lt;b&gt;" in (html.html or "")
    fenced = text_preview("README.md", io.BytesIO(b"# T\n\n```python\nimport os\n```\n"))
    assert fenced.language == "Markdown" and 'class="kn"' not in (fenced.html or "")


def test_a_files_preview_is_lexed_once_per_blob_version_not_per_view() -> None:
    """A file page's preview is kept per blob version and name: a second view reads and
    lexes nothing; another name (another lexer) or another version is its own preview, and
    a read that fails keeps nothing."""
    from cmh.hub.mirror._index import FileEntry
    from cmh.hub.mirror.web._preview import file_preview

    opened: list[str] = []
    body = b"| a |\n|---|\n" + b"| x |\n" * 100

    def opener(entry: FileEntry) -> io.BytesIO:
        opened.append(entry.path)
        if entry.path == "gone.md":
            raise OSError("the blob cannot be read")
        return io.BytesIO(body)

    def entry(path: str, etag: str) -> FileEntry:
        return FileEntry(path, len(body), etag, etag, None, Path("/store") / etag)

    first = file_preview(entry("table.md", "1" * 40), opener)
    again = file_preview(entry("table.md", "1" * 40), opener)
    assert again is first and first.language == "Markdown" and opened == ["table.md"]
    as_text = file_preview(entry("table.txt", "1" * 40), opener)
    assert as_text.language != "Markdown" and opened == ["table.md", "table.txt"]
    file_preview(entry("table.md", "2" * 40), opener)
    assert opened == ["table.md", "table.txt", "table.md"]
    for _ in range(2):
        with pytest.raises(OSError):
            file_preview(entry("gone.md", "3" * 40), opener)
    assert opened.count("gone.md") == 2


def test_download_buttons_fetch_the_file(web_server: MirrorServer) -> None:
    _, _, body = fetch(web_server, f"/{TINY}/blob/main/config.json")
    href = re.search(r'id="download" href="([^"]+)"', body).group(1)  # type: ignore[union-attr]
    status, _, data = fetch(web_server, href.replace("&amp;", "&"))
    assert status == 200 and json.loads(data)["model_type"] == "tiny"
    _, _, body = fetch(web_server, f"/{TINY}")
    links = re.findall(r'class="download" href="([^"]+)"', body)
    assert len(links) == 3  # every file of the root, not the folder
    for link in links:
        with build_opener(_NoRedirect).open(web_server.url + link.replace("&amp;", "&")) as r:
            assert r.status == 200 and r.read()
    assert 'data-copy="#snippet"' in body


def test_a_logged_in_viewers_download_links_open_a_private_file(
    web_server: MirrorServer,
) -> None:
    """The pages' file links carry the viewer's login (its cookie), as the page does: a
    private file's Download and Raw buttons fetch it for its viewer, and for nobody else."""
    cookie = f"cmh_token={PRIVATE_TOKEN}"
    status, _, body = fetch(web_server, f"/{PRIVATE}/blob/main/README.md", cookie=cookie)
    assert status == 200
    hrefs = [re.search(rf'id="{name}" href="([^"]+)"', body).group(1)  # type: ignore[union-attr]
             for name in ("download", "raw")]  # fmt: skip
    _, _, listing = fetch(web_server, f"/{PRIVATE}", cookie=cookie)
    hrefs += re.findall(r'class="download" href="([^"]+)"', listing)
    assert len(hrefs) > 2
    for href in (h.replace("&amp;", "&") for h in hrefs):
        request = Request(web_server.url + href, headers={"Cookie": cookie})
        with build_opener(_NoRedirect).open(request, timeout=60) as r:
            assert r.status == 200 and r.read(), href
            if "download=true" in href:
                assert r.headers["Content-Disposition"].startswith("attachment;"), href
        assert fetch(web_server, href)[0] == 404, href  # no login: as a missing repo


def test_facets_filter_the_list(web_server: MirrorServer) -> None:
    _, _, body = fetch(web_server, "/")
    task = body.split('id="facet-task"', 1)[1].split("</p>", 1)[0]
    assert "sentence-similarity" in task
    lic = body.split('id="facet-license"', 1)[1].split("</p>", 1)[0]
    assert "apache-2.0" in lic and "mit" in lic
    cases = {
        "task=sentence-similarity": {MINILM},
        "library=sentence-transformers": {MINILM},
        "license=mit": {EVIL},
        "tag=safe-tag": {EVIL},
        "tag=dataset:ms_marco": {MINILM},
        "license=mit&task=sentence-similarity": set(),
        "type=dataset&license=apache-2.0": set(),
        "q=mini&license=apache-2.0": {MINILM},
    }
    for query, repos in cases.items():
        _, _, body = fetch(web_server, f"/?{query}")
        assert listed(body) == repos, query
    _, _, body = fetch(web_server, "/?license=mit")
    assert 'class="chip on"' in body and 'href="/"' in body  # the chosen filter, removable
    _, _, api = fetch(web_server, "/api/models?pipeline_tag=sentence-similarity")
    assert [m["id"] for m in json.loads(api)] == [MINILM]  # the API's filter agrees


def test_repo_page_chips_link_to_facets_and_fold_long_lists(web_server: MirrorServer) -> None:
    _, _, body = fetch(web_server, f"/{MINILM}")
    tags = body.split('id="tags"', 1)[1].split("</ul>", 1)[0]
    assert '<a href="/?task=sentence-similarity"' in tags
    assert '<a href="/?license=apache-2.0"' in tags
    assert '<a href="/?tag=feature-extraction"' in tags
    assert "ms_marco" not in tags  # the 21 datasets are not chips of the header
    datasets = body.split('id="datasets"', 1)[1].split("</details>", 1)[0]
    assert "and 19 more" in datasets and datasets.count("<li>") == 21
    assert datasets.startswith(">") and "open" not in datasets.split(">", 1)[0]  # folded


def test_repo_page_shows_the_api_parameter_count(web_server: MirrorServer) -> None:
    from cmh.hub.mirror.web._facets import human_count

    _, _, api = fetch(web_server, f"/api/models/{MINILM}?expand[]=safetensors")
    total = json.loads(api)["safetensors"]["total"]
    _, _, body = fetch(web_server, f"/{MINILM}")
    assert f">{human_count(total)} params</span>" in body
    assert human_count(total) == "22.7M"
    assert [human_count(n) for n in (950, 1000, 1_250_000, 7_000_000_000)] == [
        "950", "1K", "1.2M", "7B"
    ]  # fmt: skip


def test_commits_show_message_author_and_date(
    web_server: MirrorServer, web_store: WebStore
) -> None:
    _, _, body = fetch(web_server, f"/{TINY}/commits/main")
    history = body.split('id="history"', 1)[1].split("</ol>", 1)[0]
    assert history.count("<li>") == 2  # main and its parent, the first import
    assert history.count("cmh mirror add") == 2 and 'class="author">cmh mirror<' in history
    assert web_store.commits[f"{TINY}@main"][:12] in history
    assert web_store.commits[f"{TINY}@first"][:12] in history
    _, _, api = fetch(web_server, f"/api/models/{TINY}/commits/main")
    assert [c["title"] for c in json.loads(api)] == ["cmh mirror add"] * 2
    _, _, side = fetch(web_server, f"/{TINY}")
    commits = side.split('id="commits"', 1)[1].split("</ul>", 1)[0]
    assert "cmh mirror add · cmh mirror" in commits


def test_card_images_from_other_sites_are_explained(web_server: MirrorServer) -> None:
    from web_support import FOREIGN_IMAGE

    _, headers, body = fetch(web_server, f"/{TINY}")
    assert "img-src 'self' data:" in headers["content-security-policy"]
    note = body.split('id="foreign-images"', 1)[1].split("</p>", 1)[0]
    assert "images.example.org" in note and "Content-Security-Policy" in note
    assert f'href="{FOREIGN_IMAGE}"' in note
    _, _, body = fetch(web_server, f"/{MINILM}")
    assert 'id="foreign-images"' not in body


# -- hostile cards: a render budget, one path for cards and .md files, bounded bytes ---------


@contextlib.asynccontextmanager
async def _in_process(
    store: Path, cards: CardRenderer | None = None, compute_workers: int = 1
) -> AsyncIterator[Callable[..., Awaitable[tuple[int, str]]]]:
    """A server over ``store`` in this process with the card renderer ``cards`` (else the
    default one) and one compute thread (as on 2 cores); yields ``get(path)`` -> (status,
    body)."""
    import aiohttp
    from aiohttp.test_utils import TestServer
    from cmh.hub.mirror._app import MirrorState, make_app
    from cmh.hub.mirror._auth import AccessPolicy
    from cmh.hub.mirror._compute import ComputePool
    from cmh.hub.mirror._observe import Metrics
    from cmh.hub.mirror.stores import open_store
    from cmh.hub.mirror.web import WebOptions

    pool = ComputePool(workers=compute_workers)
    state = MirrorState(open_store(store), AccessPolicy({}), Metrics(None), compute=pool)
    options = WebOptions() if cards is None else WebOptions(cards=cards)
    server = TestServer(make_app(state, options), host="127.0.0.1")
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")

    async def get(path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(base + path) as r:
            return r.status, await r.text()

    get.app = server.app  # type: ignore[attr-defined]
    try:
        yield get
    finally:
        await server.close()
        pool.close()
        if cards is not None:
            cards.close()


def _add(store: Path, tmp: Path, repo: str, files: dict[str, str]) -> None:
    from cmh.hub.mirror import add_folder

    src = tmp / "src" / repo.replace("/", "__")
    src.mkdir(parents=True)
    for name, text in files.items():
        (src / name).write_text(text, encoding="utf-8")
    add_folder(store, src, repo)


def _wait_for(path: Path) -> None:
    """Until ``path`` exists (a held render has started in the renderer's child)."""
    for _ in range(6000):
        if path.exists():
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


def test_a_repo_page_is_answered_while_another_repos_card_renders(tmp_path: Path) -> None:
    """One hostile card (a one-column table: 26 s) held every model repo page of every
    client: cards and fingerprints shared the one compute thread. Here a card's render is
    held (``held_render``) while another repo's page, with its fingerprint, is asked."""
    store, hold = tmp_path / "store", tmp_path / "hold"
    hold.mkdir()
    _add(store, tmp_path, "evil/table", {"README.md": f"HOLD {hold}\n\n|a|\n|-|\n" + "x\n" * 50})
    _add(store, tmp_path, "good/model", {"README.md": "# an honest card\n", "config.json": "{}"})
    renderer = CardRenderer(seconds=120, target=held_render)

    async def run() -> None:
        async with _in_process(store, renderer) as get:
            assert (await get("/good/model"))[0] == 200  # its card is rendered and kept
            evil = asyncio.ensure_future(get("/evil/table"))
            await asyncio.get_running_loop().run_in_executor(None, _wait_for, hold / "started")
            status, body = await get("/good/model/tree/main")
            assert status == 200 and "an honest card" in body and 'id="fingerprint"' in body
            assert not evil.done()  # answered while the other card was being rendered
            (hold / "release").touch()
            status, body = await evil
            assert status == 200 and "<table>" in body

    asyncio.run(run())


def test_pages_build_on_threads_of_their_own_so_the_api_never_waits_on_them(
    tmp_path: Path,
) -> None:
    """Pages waiting on card renderers (from many clients) filled the default executor the
    API and file routes use: a download waited behind them. Pages build on threads of
    their own; here every one is held, and the API and a file answer meanwhile."""
    import threading

    from cmh.hub.mirror.web._pages import PAGE_THREADS, PAGES_KEY

    store = tmp_path / "store"
    _add(store, tmp_path, "good/model", {"README.md": "# a card\n", "config.json": "{}"})

    async def run() -> None:
        async with _in_process(store) as get:
            gate = threading.Event()
            pages = get.app[PAGES_KEY]  # type: ignore[attr-defined]
            for _ in range(PAGE_THREADS):
                pages.submit(gate.wait, TEST_DEADLINE)
            try:
                page = asyncio.ensure_future(get("/good/model"))
                status, body = await get("/api/models/good/model")
                assert status == 200 and json.loads(body)["id"] == "good/model"
                assert (await get("/good/model/resolve/main/config.json")) == (200, "{}")
                assert not page.done()  # it waits for a page thread
            finally:
                gate.set()
            assert (await page)[0] == 200

    asyncio.run(run())


_ORPHAN_SCRIPT = """
import os, sys, threading, multiprocessing
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from web_support import held_render
from cmh.hub.mirror.web._card_worker import CardRenderer

if __name__ == "__main__":
    hold = Path(sys.argv[1])
    renderer = CardRenderer(seconds=120, target=held_render)
    threading.Thread(target=renderer.render, args=(f"HOLD {hold}\\n",), daemon=True).start()
    while not (hold / "started").exists():
        threading.Event().wait(0.01)
    print(*[c.pid for c in multiprocessing.active_children()], flush=True)
    os._exit(0)  # as a server worker ends: no cleanup reaches its children
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")  # ended (a zombie waits for its new parent to reap it)


def test_a_card_child_ends_when_its_worker_is_gone(tmp_path: Path) -> None:
    """A worker ends with ``os._exit`` (killed or at its deadline), so no cleanup reaches
    a card child mid-render: the child ends by itself once its worker is gone, rather than
    render on (a hostile card: up to 26 s) and write a traceback after the server."""
    hold = tmp_path / "hold"
    hold.mkdir()
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(hold), here],
        capture_output=True, text=True, timeout=TEST_DEADLINE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert pids, done.stdout
    wait_for(lambda: all(_gone(p) for p in pids), "the card child to end with its worker")
    assert "Traceback" not in done.stderr, done.stderr


def test_a_card_past_its_render_deadline_is_text_once_on_every_page(tmp_path: Path) -> None:
    """A card whose rendering does not end in time is shown as text with a note, kept so
    (one rendering, not one per view), and a ``.md`` file page takes the same path (its
    limits, its deadline, its cache) rather than rendering the file again per view."""
    store, hold = tmp_path / "store", tmp_path / "hold"
    hold.mkdir()  # never released: the render is ended at its deadline
    _add(store, tmp_path, "evil/slow", {
        "README.md": f"HOLD {hold}\n\n# slow <b>card</b>\n",
        "fine.md": "# fine\n\n![logo](https://cdn.example.org/logo.png)\n",
    })  # fmt: skip
    renderer = CardRenderer(seconds=0.5, target=held_render)

    async def run() -> None:
        async with _in_process(store, renderer) as get:
            for path in ("/evil/slow", "/evil/slow", "/evil/slow/blob/main/README.md"):
                status, body = await get(path)
                assert status == 200, path
                assert "the card takes longer than 0.5 s to render: shown as text" in body
                assert f"<pre>HOLD {hold}\n\n# slow &lt;b&gt;card&lt;/b&gt;" in body, path
            assert renderer.renders == 1
            for _ in range(2):
                status, body = await get("/evil/slow/blob/main/fine.md")
                assert status == 200 and "<h1>fine</h1>" in body and "cdn.example.org" in body
            assert renderer.renders == 2

    asyncio.run(run())


def test_a_md_file_page_keeps_a_cards_limits(tmp_path: Path) -> None:
    """A ``.md`` file page called the renderer itself: 128 KiB of ``[`` that a README's
    card shows as text (its bracket limit) took 1.2-1.9 s a view there."""
    store = tmp_path / "store"
    _add(store, tmp_path, "evil/md", {"notes.md": "[" * 3000 + "\n", "ok.md": "# ok *md*\n"})

    async def run() -> None:
        async with _in_process(store) as get:
            status, body = await get("/evil/md/blob/main/notes.md")
            assert status == 200 and "more than 2000 &#39;[&#39;: shown as text" in body
            status, body = await get("/evil/md/blob/main/ok.md")
            assert status == 200 and "<h1>ok <em>md</em></h1>" in body

    asyncio.run(run())


def test_a_cards_foreign_images_are_read_once_when_it_is_rendered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every view parsed the whole rendered card again for its images (a 12.6 MB card:
    4-5 s a view). They are read in the renderer's child, once, and kept with the card."""
    from cmh.hub.mirror.web import _card_images

    parsed: list[int] = []
    feed = _card_images._Images.feed

    def counted(self: Any, data: str) -> None:
        parsed.append(len(data))
        feed(self, data)

    monkeypatch.setattr(_card_images._Images, "feed", counted)
    store = tmp_path / "store"
    card = "# logo\n\n![l](https://cdn.example.org/l.png)\n"
    _add(store, tmp_path, "acme/logo", {"README.md": card})

    async def run() -> None:
        async with _in_process(store) as get:
            for _ in range(3):
                status, body = await get("/acme/logo")
                assert status == 200 and 'id="foreign-images"' in body and "cdn.example.org" in body

    asyncio.run(run())
    assert parsed == []  # none in this process: once, in the renderer's child


def test_a_card_that_renders_to_too_much_html_is_text_and_the_cache_counts_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 512 KiB fenced Python block highlighted to 12.6 MB of HTML, and 256 such cards were
    kept per worker (3-4 GB). Past MAX_CARD_HTML_BYTES the card is text; the cache is
    bounded by the bytes of its cards, not their count."""
    from cmh.hub.mirror.web import _cards

    body = "```python\n" + "a, " * 2000 + "\n```\n"
    full = _cards.render_markdown(body)
    html_bytes = len(full.encode())
    monkeypatch.setattr(_cards, "MAX_CARD_HTML_BYTES", html_bytes - 1, raising=False)
    card = _cards._read_card(body.encode())
    assert card.html.startswith("<pre>") and len(card.html) < html_bytes
    assert any("renders to more than" in n and "shown as text" in n for n in card.notes)
    monkeypatch.setattr(_cards, "MAX_CARD_HTML_BYTES", html_bytes)
    card = _cards._read_card(body.encode())
    assert card.html == full and card.weight >= html_bytes + len(body)
    assert _cards._cards.weight is not None and _cards._cards.size == _cards.CARD_CACHE_BYTES


def test_a_page_is_answered_when_no_renderer_is_free(tmp_path: Path) -> None:
    """No child free in time (here: none at all): the card is shown as text for that view,
    with a note, and not kept (the next view renders it)."""
    store = tmp_path / "store"
    _add(store, tmp_path, "acme/busy", {"README.md": "# busy *card*\n"})

    async def run(renderer: CardRenderer) -> str:
        async with _in_process(store, renderer) as get:
            status, body = await get("/acme/busy")
            assert status == 200
            return body

    body = asyncio.run(run(CardRenderer(workers=0, seconds=0.1)))
    assert "other cards are being rendered: shown as text for now" in body
    assert "<pre># busy *card*" in body
    assert "<em>card</em>" in asyncio.run(run(CardRenderer()))


@pytest.mark.parametrize("page", ["%C2%B2", "%E2%91%A0", "%D9%A3", "9" * 5000, "0", "-1", "x"])
def test_a_list_page_number_that_is_not_one_shows_page_one(
    web_server: MirrorServer, page: str
) -> None:
    """``str.isdigit`` holds for ``²``, ``①``, ``٣`` and 5,000 nines, which ``int`` refuses:
    a bare 500 and a traceback. Any value that is not a page number shows page 1."""
    for path in ("/", "/models", f"/{MINILM.split('/')[0]}"):
        status, _, body = fetch(web_server, f"{path}?page={page}")
        assert status == 200 and "<!doctype html>" in body, (path, page, status)


def test_file_names_show_bidi_and_invisible_characters_as_code_points(tmp_path: Path) -> None:
    """``U+202E gnp.exe`` read as ``exe.png`` in the file list, title and download name.
    The pages write such characters as ``[U+202E]``; the API's names are unchanged."""
    store = tmp_path / "store"
    _add(store, tmp_path, "acme/bidi", {"\u202egnp.exe": "MZ", "zero\u200bwidth.txt": "x"})

    async def run() -> None:
        async with _in_process(store, CardRenderer()) as get:
            for path in ("/acme/bidi", "/acme/bidi/blob/main/%E2%80%AEgnp.exe"):
                status, body = await get(path)
                assert status == 200 and "\u202e" not in body and "\u200b" not in body
                assert "[U+202E]gnp.exe" in body
            assert "zero[U+200B]width.txt" in (await get("/acme/bidi"))[1]
            status, body = await get("/api/models/acme/bidi/tree/main")
            assert status == 200 and {f["path"] for f in json.loads(body)} >= {"\u202egnp.exe"}

    asyncio.run(run())
    from cmh.hub.mirror.web._render import visible

    assert visible("\u202egnp.exe") == "[U+202E]gnp.exe" and visible("zéro.md") == "zéro.md"


class _ServedHere(LoopServer):
    """The mirror's app over ``store`` with ``tokens``, in this process on ``clock`` (its
    own thread and loop): a clock that moves only when the test says, where a ``cmh
    serve``'s clock file adds to real time."""

    def __init__(self, store: Path, tokens: Path, clock: ManualClock) -> None:
        super().__init__()
        self.store, self.tokens, self.clock = store, tokens, clock
        self.host, self.port = "127.0.0.1", 0

    async def _start(self) -> None:
        from aiohttp import web
        from cmh.hub.mirror._app import MirrorState, make_app
        from cmh.hub.mirror._auth import load_tokens
        from cmh.hub.mirror._observe import Metrics
        from cmh.hub.mirror.stores import open_store

        state = MirrorState(
            open_store(self.store), load_tokens(self.tokens), Metrics(None), clock=self.clock
        )
        self._runner = web.AppRunner(make_app(state), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{self.port}"


def _login_from(
    server: MirrorServer | _ServedHere, source: str, token: str, csrf: tuple[str, str]
) -> tuple[int, str | None]:
    """POST a login from the client address ``source``: the status and ``Retry-After``."""
    import http.client

    conn = http.client.HTTPConnection(
        server.host, server.port, timeout=TEST_DEADLINE, source_address=(source, 0)
    )
    try:
        body = urlencode({"token": token, "csrf": csrf[1]})
        conn.request("POST", "/-/login", body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", "Origin": server.url,
            "Cookie": f"cmh_csrf={csrf[0]}"})  # fmt: skip
        r = conn.getresponse()
        r.read()
        return r.status, r.getheader("Retry-After")
    finally:
        conn.close()


def test_token_guesses_are_throttled_per_client_address(tmp_path: Path, tiny_src: Path) -> None:
    """Five unknown tokens from one address are answered; then each further failure makes
    that address wait (1 s, doubling, up to 60 s, on the server's clock), and a try while
    it waits gets ``429`` with ``Retry-After`` unchecked, a right token too. Another
    address is not held back; a good login clears the address.

    The server runs here on a clock that real time does not move: two requests can be
    more than the first wait (1 s) apart on a busy machine, and a ``cmh serve``'s
    clock is real time plus the offset the test writes."""
    from cmh.hub.mirror import _auth
    from cmh.hub.mirror.stores.local._folder import add_folder

    store = tmp_path / "store"
    add_folder(store, tiny_src, "acme/secret")
    tokens = tmp_path / "tokens.txt"
    good = "right-token-0123456789"
    tokens.write_text(f"{good} acme/secret\n")
    clock = ManualClock()
    with _ServedHere(store, tokens, clock) as server:
        csrf = _login_form(server)
        here, there = "127.0.0.1", "127.0.0.2"
        free = _auth.LOGIN_FREE_FAILURES
        assert [_login_from(server, here, f"wrong-{i:08}", csrf) for i in range(free)] == [
            (403, None)
        ] * free
        assert _login_from(server, here, "wrong-again1", csrf) == (403, None)  # waits 1 s now
        assert _login_from(server, here, good, csrf) == (429, "1")
        assert _login_from(server, there, good, csrf)[0] == 303  # another address
        clock.advance(1)
        assert _login_from(server, here, "wrong-again2", csrf) == (403, None)  # waits 2 s now
        assert _login_from(server, here, "wrong-again3", csrf) == (429, "2")
        for _ in range(10):  # each failure doubles the wait, up to its bound
            clock.advance(_auth.LOGIN_MAX_WAIT)
            assert _login_from(server, here, "wrong-again4", csrf)[0] == 403
        assert _login_from(server, here, good, csrf) == (429, str(int(_auth.LOGIN_MAX_WAIT)))
        clock.advance(_auth.LOGIN_MAX_WAIT)
        assert _login_from(server, here, good, csrf)[0] == 303  # a good login clears it
        assert _login_from(server, here, "wrong-again5", csrf) == (403, None)
