# ruff: noqa: E501  (one hostile request per line)
"""Hostile requests: every one is refused with a 4xx and no byte from outside the store.

The store is planted with traps: snapshot links to a secret file outside the
store (absolute and relative), a blob that is itself a link outside, a linked
folder, a repo folder that is a link to another store, and a ref that is a link.
Every response body and header is searched for the secret's marker.
"""

from __future__ import annotations

import os
import uuid

import pytest
from cmh.hub.cache import RepoLayout
from cmh.hub.mirror.stores.local._folder import add_folder
from mirror_support import MirrorServer, raw_request, write_tiny_repo

CANARY = f"CANARY-{uuid.uuid4().hex}"
TINY = "cmh-test/tiny"
PRIVATE = "cmh-test/private"
TOKEN = "hf_hostile_test_token_0001"
FAKE_BLOB = "f" * 64


@pytest.fixture(scope="module")
def trapped(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("hostile")
    outside = base / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text(CANARY * 10)
    store = base / "store"
    commit = add_folder(store, write_tiny_repo(base / "tiny", 1), TINY).commit
    private_src = base / "private"
    private_src.mkdir()
    (private_src / "config.json").write_text("{}\n")
    add_folder(store, private_src, PRIVATE)
    repo = RepoLayout(store, TINY)
    snap = repo.snapshot_dir(commit)
    os.symlink(secret, snap / "evil-abs.txt")
    os.symlink(os.path.relpath(secret, snap), snap / "evil-rel.txt")
    os.symlink(secret, repo.blobs / FAKE_BLOB)
    os.symlink(f"../../blobs/{FAKE_BLOB}", snap / "evil-blob.bin")
    os.symlink(outside, snap / "dirlink")
    os.symlink(secret, repo.refs / "evil")
    other = base / "other-store"
    secret_repo = base / "secret-repo"
    secret_repo.mkdir()
    (secret_repo / "secret.txt").write_text(CANARY)
    add_folder(other, secret_repo, "evil/repo")
    os.symlink(other / "models--evil--repo", store / "models--evil--repo")
    tokens = base / "tokens.txt"
    tokens.write_text(f"{TOKEN} {PRIVATE}\n")
    server = MirrorServer(store, base / "logs", tokens=tokens)
    yield server, commit
    server.stop()


def _req(target: str | bytes, method: str = "GET", headers: str = "", body: bytes = b"") -> bytes:
    t = target.encode("latin-1") if isinstance(target, str) else target
    head = f"{method} ".encode() + t + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if body:
        head += f"Content-Length: {len(body)}\r\n".encode()
    return head + headers.encode("latin-1") + b"\r\n" + body


R = f"/{TINY}/resolve/main"
CASES: list[tuple[str, bytes]] = [
    ("dotdot raw", _req(f"{R}/../../../../outside/secret.txt")),
    ("dotdot encoded", _req(f"{R}/%2e%2e/%2e%2e/%2e%2e/%2e%2e/outside/secret.txt")),
    ("dotdot encoded upper", _req(f"{R}/%2E%2E/%2E%2E/outside/secret.txt")),
    ("dotdot encoded slashes", _req(f"{R}/..%2f..%2f..%2f..%2foutside%2fsecret.txt")),
    ("dotdot double encoded", _req(f"{R}/%252e%252e%252f%252e%252e%252fsecret.txt")),
    ("absolute path", _req(f"{R}//etc/passwd")),
    ("absolute path encoded", _req(f"{R}/%2Fetc%2Fpasswd")),
    ("backslash raw", _req(f"{R}/..\\..\\outside\\secret.txt")),
    ("backslash encoded", _req(f"{R}/..%5c..%5coutside%5csecret.txt")),
    ("nul encoded", _req(f"{R}/config.json%00.txt")),
    ("nul raw", _req(f"{R}/config.json\x00.txt".encode("latin-1"))),
    ("crlf injection", _req(f"{R}/config.json%0d%0aX-Injected:%201")),
    ("invalid utf-8", _req(f"{R}/%ff%fe.json")),
    ("snapshot link absolute", _req(f"{R}/evil-abs.txt")),
    ("snapshot link relative", _req(f"{R}/evil-rel.txt")),
    ("linked folder", _req(f"{R}/dirlink/secret.txt")),
    ("repo folder that is a link", _req("/evil/repo/resolve/main/secret.txt")),
    ("ref that is a link", _req(f"/{TINY}/resolve/evil/config.json")),
    ("revision dotdot", _req(f"/{TINY}/resolve/../config.json")),
    ("revision dotdot encoded", _req(f"/{TINY}/resolve/%2e%2e%2f%2e%2e/config.json")),
    ("repo id with --", _req("/cmh-test--tiny/x/resolve/main/config.json")),
    ("repo id dotdot", _req("/../models--cmh-test--tiny/resolve/main/config.json")),
    ("dataset prefix traversal", _req("/datasets/../cmh-test/tiny/resolve/main/config.json")),
    ("absolute-form target", _req(f"http://127.0.0.1{R}/config.json")),
    ("store internals", _req(f"/models--cmh-test--tiny/blobs/{FAKE_BLOB}")),
    ("blobs through resolve", _req(f"{R}/../blobs/{FAKE_BLOB}")),
    ("tree traversal", _req(f"/api/models/{TINY}/tree/main/..%2F..%2Foutside")),
    ("tree traversal raw", _req(f"/api/models/{TINY}/tree/main/sub/../../..")),
    ("tree of a link", _req(f"/api/models/{TINY}/tree/main/dirlink")),
    (
        "paths-info traversal",
        _req(
            f"/api/models/{TINY}/paths-info/main",
            "POST",
            "Content-Type: application/x-www-form-urlencoded\r\n",
            b"paths=..%2F..%2Foutside%2Fsecret.txt",
        ),
    ),
    ("tree bad cursor", _req(f"/api/models/{TINY}/tree/main?cursor=!!!")),
    ("tree foreign cursor", _req(f"/api/models/{TINY}/tree/main?cursor=YWJjOjE")),
    ("fingerprint traversal", _req("/api/cmh/fingerprint/cmh-test/..%2F..%2Foutside/main")),
    ("info of a linked repo", _req("/api/models/evil/repo")),
    ("range past the end", _req(f"{R}/config.json", headers="Range: bytes=999999999-\r\n")),
    ("range garbage", _req(f"{R}/config.json", headers="Range: bytes=abc\r\n")),
    ("range reversed", _req(f"{R}/config.json", headers="Range: bytes=5-1\r\n")),
    ("range empty suffix", _req(f"{R}/config.json", headers="Range: bytes=-0\r\n")),
    ("range flood", _req(f"{R}/weights.bin", headers="Range: bytes=" + ",".join(f"{i * 10}-{i * 10 + 1}" for i in range(200)) + "\r\n")),
    ("range no unit separator", _req(f"{R}/config.json", headers="Range: 0-10\r\n")),
    ("private without token", _req(f"/{PRIVATE}/resolve/main/config.json")),
    ("private wrong token", _req(f"/{PRIVATE}/resolve/main/config.json", headers="Authorization: Bearer hf_wrong_token_0000\r\n")),
    ("private basic auth", _req(f"/{PRIVATE}/resolve/main/config.json", headers=f"Authorization: Basic {TOKEN}\r\n")),
    ("private huge token", _req(f"/{PRIVATE}/resolve/main/config.json", headers="Authorization: Bearer " + "A" * 4000 + "\r\n")),
    ("private token prefix", _req(f"/{PRIVATE}/resolve/main/config.json", headers=f"Authorization: Bearer {TOKEN[:-1]}\r\n")),
    ("private info", _req(f"/api/models/{PRIVATE}")),
    ("private tree", _req(f"/api/models/{PRIVATE}/tree/main")),
    ("method DELETE", _req(f"{R}/config.json", "DELETE")),
    ("method PUT", _req(f"{R}/config.json", "PUT", body=b"x")),
    ("huge header", _req(f"{R}/config.json", headers="X-Big: " + "b" * 20000 + "\r\n")),
    ("huge target", _req(f"{R}/" + "a" * 12000)),
]  # fmt: skip


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({name for name, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("name", "request_bytes"), CASES, ids=[c[0] for c in CASES])
def test_hostile_request_is_refused(trapped, name: str, request_bytes: bytes) -> None:
    server, _ = trapped
    status, headers, body = raw_request(server.host, server.port, request_bytes)
    assert 400 <= status < 500, (name, status, body[:200])
    assert CANARY.encode() not in body
    assert CANARY not in " ".join(headers.values())
    assert not any(k.lower().startswith("x-xet") for k in headers)


def test_a_blob_that_is_a_link_outside_is_unavailable_never_followed(trapped) -> None:
    """A snapshot link to a blob that is itself a link answers as an absent blob does
    (spec 1.3: 503, not the 404 a client would cache), without a byte of the target."""
    server, _ = trapped
    for method in ("GET", "HEAD"):
        status, headers, body = raw_request(
            server.host, server.port, _req(f"{R}/evil-blob.bin", method)
        )
        assert (status, headers.get("x-error-code")) == (503, "BlobUnavailable")
        assert CANARY.encode() not in body
        assert CANARY not in " ".join(headers.values())


def test_server_survived_and_never_answered_5xx(trapped) -> None:
    server, commit = trapped
    status, headers, _body = raw_request(server.host, server.port, _req(f"{R}/config.json"))
    assert status == 200 and headers["x-repo-commit"] == commit
    unavailable = f"{R}/evil-blob.bin"  # an absent blob's 503 (spec 1.3), asked on purpose
    assert not [e for e in server.log() if e["status"] >= 500 and e["target"] != unavailable]


def test_private_repo_looks_exactly_like_a_missing_one(trapped) -> None:
    server, _ = trapped

    def answer(repo: str, auth: str = "") -> tuple[int, dict[str, str], bytes]:
        status, headers, body = raw_request(
            server.host, server.port, _req(f"/{repo}/resolve/main/config.json", headers=auth)
        )
        headers.pop("date", None)
        return status, headers, body

    missing = answer("cmh-test/no-such-repo")
    assert missing[0] == 404 and missing[1]["x-error-code"] == "RepoNotFound"
    assert answer(PRIVATE) == missing
    assert answer(PRIVATE, "Authorization: Bearer hf_wrong_token_0000\r\n") == missing
    status, _, body = answer(PRIVATE, f"Authorization: Bearer {TOKEN}\r\n")
    assert status == 200 and body == b"{}\n"


def test_trap_entries_are_not_listed(trapped) -> None:
    server, _ = trapped
    status, _, body = raw_request(
        server.host, server.port, _req(f"/api/models/{TINY}/tree/main?recursive=true")
    )
    assert status == 200
    for name in (b"evil-abs", b"evil-rel", b"evil-blob", b"dirlink"):
        assert name not in body
