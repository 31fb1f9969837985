"""HTTP details of the mirror: ranges, conditional requests, pagination, workers, CLI."""

from __future__ import annotations

import email.parser
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
from cmh.hub.mirror._ranges import ByteRange, RangeNotSatisfiable, parse_range
from cmh.hub.mirror.stores.local._folder import add_folder
from deadline_support import TEST_DEADLINE
from mirror_support import MINILM_REPO, TINY_REPO, MirrorServer, hf_env, run_python


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 10, None),
        ("bytes=0-0", 10, [(0, 0)]),
        ("bytes=2-", 10, [(2, 9)]),
        ("bytes=-3", 10, [(7, 9)]),
        ("bytes=-30", 10, [(0, 9)]),
        ("bytes=5-100", 10, [(5, 9)]),
        ("bytes=0-1,4-5", 10, [(0, 1), (4, 5)]),
        ("bytes=4-5,0-1", 10, [(4, 5), (0, 1)]),  # order kept when disjoint
        ("bytes=0-3,2-5", 10, [(0, 5)]),  # overlapping ranges merged
        ("bytes=0-1,2-3", 10, [(0, 3)]),  # adjacent ranges merged
        # a merged range takes the place of its first-requested member
        ("bytes=20-25,0-4,3-8", 30, [(20, 25), (0, 8)]),
        ("bytes=6-7,0-2,8-9,3-3", 10, [(6, 9), (0, 3)]),
        ("bytes=7-8,0-1,3-4,2-2", 10, [(7, 8), (0, 4)]),
        ("bytes=0-1,20-30", 10, [(0, 1)]),  # unsatisfiable parts dropped
        (" BYTES = 1-2 ", 10, [(1, 2)]),
        ("items=0-1", 10, None),  # unknown unit: ignored
    ],
)
def test_parse_range(header, size, expected) -> None:
    got = parse_range(header, size)
    assert got == (None if expected is None else [ByteRange(a, b) for a, b in expected])


@pytest.mark.parametrize(
    "header", ["bytes=10-", "bytes=5-2", "bytes=x", "bytes=", "bytes=-0", "bytes=--1", "0-1"]
)
def test_parse_range_refuses(header) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, 10)


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET"):
    try:
        with urlopen(Request(url, headers=headers or {}, method=method), timeout=30) as r:
            return r.status, r.headers, r.read()
    except HTTPError as err:
        return err.code, err.headers, err.read()


def test_ranges_over_http(mirror: MirrorServer, mirror_store) -> None:
    data = (mirror_store.sources[f"{TINY_REPO}@main"] / "weights.bin").read_bytes()
    url = f"{mirror.url}/{TINY_REPO}/resolve/main/weights.bin"
    status, headers, body = _get(url, {"Range": "bytes=100-199"})
    assert (status, body) == (206, data[100:200])
    assert headers["Content-Range"] == f"bytes 100-199/{len(data)}"
    assert headers["X-Linked-Size"] == str(len(data))
    status, _, body = _get(url, {"Range": "bytes=-5"})
    assert (status, body) == (206, data[-5:])
    status, _, body = _get(url, {"Range": f"bytes={len(data) - 3}-"})
    assert (status, body) == (206, data[-3:])
    status, headers, _ = _get(url, {"Range": f"bytes={len(data)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"
    status, headers, body = _get(url, {"Range": "bytes=0-9,1000-1009,-4"})
    assert status == 206 and headers["Content-Type"].startswith("multipart/byteranges")
    message = email.parser.BytesParser().parsebytes(
        b"Content-Type: " + headers["Content-Type"].encode() + b"\r\n\r\n" + body
    )
    parts = [(p["Content-Range"], p.get_payload(decode=True)) for p in message.get_payload()]
    n = len(data)
    assert parts == [
        (f"bytes 0-9/{n}", data[0:10]),
        (f"bytes 1000-1009/{n}", data[1000:1010]),
        (f"bytes {n - 4}-{n - 1}/{n}", data[-4:]),
    ]
    assert int(headers["Content-Length"]) == len(body)
    # merged ranges keep the place of their first-requested member, not the file's order
    status, headers, body = _get(url, {"Range": "bytes=1000-1009,0-4,3-9"})
    assert status == 206 and headers["Content-Type"].startswith("multipart/byteranges")
    message = email.parser.BytesParser().parsebytes(
        b"Content-Type: " + headers["Content-Type"].encode() + b"\r\n\r\n" + body
    )
    parts = [(p["Content-Range"], p.get_payload(decode=True)) for p in message.get_payload()]
    assert parts == [(f"bytes 1000-1009/{n}", data[1000:1010]), (f"bytes 0-9/{n}", data[0:10])]


def test_head_conditional_and_if_range(mirror: MirrorServer, mirror_store) -> None:
    data = (mirror_store.sources[f"{TINY_REPO}@main"] / "weights.bin").read_bytes()
    url = f"{mirror.url}/{TINY_REPO}/resolve/main/weights.bin"
    status, headers, body = _get(url, method="HEAD")
    etag = headers["ETag"]
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(data))
    assert headers["X-Linked-Etag"] == etag and headers["Accept-Ranges"] == "bytes"
    assert not [k for k in headers if k.lower().startswith("x-xet")]
    status, headers, body = _get(url, {"If-None-Match": etag})
    assert status == 304 and body == b"" and headers["X-Repo-Commit"]
    status, _, body = _get(url, {"Range": "bytes=0-3", "If-Range": etag})
    assert (status, body) == (206, data[:4])
    status, _, body = _get(url, {"Range": "bytes=0-3", "If-Range": '"stale-etag"'})
    assert (status, body) == (200, data)
    status, headers, _ = _get(f"{mirror.url}/{TINY_REPO}/resolve/main/nope.txt", method="HEAD")
    assert status == 404 and headers["X-Error-Code"] == "EntryNotFound"
    assert headers["X-Repo-Commit"]


def test_error_headers_are_ascii(mirror: MirrorServer) -> None:
    """A message naming a non-ASCII path stays readable in every client: the header holds
    escapes (raw UTF-8 would be read as Latin-1), the JSON body the path itself."""
    import http.client
    from urllib.parse import quote, urlsplit

    where = urlsplit(mirror.url)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    try:
        conn.request("GET", f"/{TINY_REPO}/resolve/main/{quote('café-€.txt')}")
        answer = conn.getresponse()
        body = json.loads(answer.read())
    finally:
        conn.close()
    assert answer.status == 404 and "café-€.txt" in body["error"]
    message = answer.getheader("X-Error-Message") or ""
    assert message.isascii() and "caf\\xe9-\\u20ac.txt" in message


def test_percent_encoded_revisions_and_commit_ids(mirror: MirrorServer, mirror_store) -> None:
    commit = mirror_store.imports[f"{TINY_REPO}@v1"].commit
    for rev in ("v1", commit):
        status, headers, body = _get(f"{mirror.url}/{TINY_REPO}/resolve/{rev}/sub/deeper/leaf.txt")
        assert (status, body, headers["X-Repo-Commit"]) == (200, b"leaf 1\n", commit)
    status, _, body = _get(f"{mirror.url}/api/models/{TINY_REPO}/revision/{commit}")
    assert status == 200 and json.loads(body)["sha"] == commit
    status, headers, _ = _get(f"{mirror.url}/{TINY_REPO}/resolve/refs%2Fpr%2F9/config.json")
    assert status == 404 and headers["X-Error-Code"] == "RevisionNotFound"


def test_tree_pagination_with_the_stock_client(
    mirror_server_factory, mirror_store, tmp_path: Path
) -> None:
    server = mirror_server_factory(mirror_store.path, extra_args=("--tree-page-size", "2"))
    code = (
        "import json, os; from huggingface_hub import HfApi;"
        "print(json.dumps(sorted(e.path for e in HfApi().list_repo_tree("
        "os.environ['T_REPO'], recursive=True))))"
    )
    env = hf_env(server.url, tmp_path / "home")
    env["T_REPO"] = TINY_REPO
    assert run_python(code, env) == [
        "README.md", "config.json", "empty.txt", "sub", "sub/deeper",
        "sub/deeper/leaf.txt", "sub/notes.txt", "weights.bin",
    ]  # fmt: skip
    assert server.count(route="tree", status="200") == 4  # 8 entries, 2 per page


def test_fingerprint_endpoint(mirror: MirrorServer, mirror_store, minilm_dir: Path) -> None:
    from cmh.semantic import fingerprint

    url = f"{mirror.url}/api/cmh/fingerprint/{MINILM_REPO}/main"
    status, headers, body = _get(url)
    assert status == 200, body
    doc = json.loads(body)
    assert doc["commit"] == mirror_store.imports[f"{MINILM_REPO}@main"].commit
    assert doc["fingerprint"] == json.loads(json.dumps(fingerprint(minilm_dir).to_dict()))
    status, headers, _ = _get(f"{mirror.url}/api/cmh/fingerprint/{TINY_REPO}/main")
    assert status == 422 and headers["X-Error-Code"] == "NotAModel"
    status, headers, _ = _get(f"{mirror.url}/api/cmh/fingerprint/nobody/nothing/main")
    assert status == 404 and headers["X-Error-Code"] == "RepoNotFound"


def test_health_and_metrics(mirror: MirrorServer) -> None:
    status, _, body = _get(f"{mirror.url}/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    _get(f"{mirror.url}/{TINY_REPO}/resolve/main/weights.bin", {"Range": "bytes=0-0"})
    samples = mirror.metrics()
    names = {name for name, _ in samples}
    assert {
        "cmh_mirror_requests_total",
        "cmh_mirror_response_bytes_total",
        "cmh_mirror_range_requests_total",
        "cmh_mirror_request_duration_seconds_bucket",
        "cmh_mirror_store_bytes",
    } <= names
    assert samples[("cmh_mirror_range_requests_total", (("kind", "single"),))] >= 1
    assert samples[("cmh_mirror_store_bytes", ())] > 90_000_000  # MiniLM is in the store


def test_workers_share_the_port_and_stop_on_sigterm(
    mirror_server_factory, mirror_store, tmp_path: Path
) -> None:
    server = mirror_server_factory(mirror_store.path, workers=2)
    for _ in range(40):
        status, _, body = _get(f"{server.url}/{TINY_REPO}/resolve/main/README.md")
        assert (status, body) == (200, b"# tiny v2\n")
    pids = {e["pid"] for e in server.log(route="resolve")}
    assert len(pids) == 2  # both workers answered
    assert server.count(route="resolve", status="200") == 40  # aggregated over workers
    assert server.stop() == 0


def test_cli_add_ls_scrub_and_serve_errors(tmp_path: Path, tiny_src: Path) -> None:
    store = tmp_path / "store"
    cmh = [sys.executable, "-m", "cmh.cli.main"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cmh, *args], capture_output=True, text=True, timeout=60)

    added = run("mirror", "add", str(tiny_src), "--store", str(store), "--repo", "org/t", "--json")
    assert added.returncode == 0, added.stderr
    commit = json.loads(added.stdout)["commit"]
    again = run("mirror", "add", str(tiny_src), "--store", str(store), "--repo", "org/t")
    assert again.returncode == 0 and "no new commit" in again.stdout
    listed = json.loads(run("mirror", "ls", "--store", str(store), "--json").stdout)
    assert listed["repos"][0]["refs"][0]["commit"] == commit
    assert run("mirror", "scrub", "--store", str(store)).returncode == 0
    blob = next(p for p in (store / "models--org--t" / "blobs").iterdir() if len(p.name) == 64)
    os.chmod(blob, 0o644)
    blob.write_bytes(b"x" * blob.stat().st_size)
    scrubbed = run("mirror", "scrub", "--store", str(store), "--json")
    assert scrubbed.returncode == 1 and json.loads(scrubbed.stdout)["bad"][0]["blob"] == blob.name
    bad_repo = run("mirror", "add", str(tiny_src), "--store", str(store), "--repo", "../x")
    assert bad_repo.returncode == 2 and "invalid repo id" in bad_repo.stderr
    assert "Traceback" not in bad_repo.stderr
    tokens = tmp_path / "tokens"
    tokens.write_text("short org/t\n")
    bad_tokens = run("serve", "--store", str(store), "--port", "0", "--tokens", str(tokens))
    assert bad_tokens.returncode == 2 and "token" in bad_tokens.stderr
    missing = run("serve", "--store", str(tmp_path / "nope"), "--port", "0")
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_sigterm_during_a_download_exits_cleanly(
    mirror_server_factory, tmp_path: Path, minilm_dir: Path
) -> None:
    store = tmp_path / "store"
    add_folder(store, minilm_dir, MINILM_REPO)
    server = mirror_server_factory(store)
    with urlopen(f"{server.url}/{MINILM_REPO}/resolve/main/model.safetensors", timeout=30) as r:
        r.read(1024)  # a download is in flight
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=TEST_DEADLINE)
    assert server.process.returncode == 0


def test_a_missing_or_tampered_blob_is_never_served(
    mirror_server_factory, tmp_path: Path, tiny_src: Path
) -> None:
    from cmh.hub.cache import RepoLayout
    from cmh.hub.mirror._index import build_index

    store = tmp_path / "store"
    commit = add_folder(store, tiny_src, "org/t").commit
    files = build_index(RepoLayout(store, "org/t"), commit).files
    server = mirror_server_factory(store)
    files["weights.bin"].source.unlink()  # e.g. quarantined by scrub
    os.chmod(files["README.md"].source, 0o644)
    files["README.md"].source.write_text("longer than before\n")  # size no longer matches
    for name in ("weights.bin", "README.md"):
        for method in ("GET", "HEAD"):
            status, headers, body = _get(f"{server.url}/org/t/resolve/main/{name}", method=method)
            assert status == 503 and headers["X-Error-Code"] == "BlobUnavailable", name
            assert b"longer" not in body
    status, _, body = _get(f"{server.url}/org/t/resolve/main/config.json")
    assert status == 200 and body == (tiny_src / "config.json").read_bytes()
