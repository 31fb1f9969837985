"""``/{repo}/raw/{rev}/{path}`` answers the file's bytes, as the Hub's ``/raw/`` does (issue
40; it answered a 302 to ``/resolve/``): through the API's resolve route, so the same path
checks, the same access rule (a private repo needs its token, as a header or the pages'
cookie) and the same delivery, on a folder and on a bucket store. A real ``cmh serve``
per store kind."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from bucket_support import use_bucket
from cmh.hub.mirror import BucketStore, add_folder
from mirror_support import MirrorServer
from motoserver import BUCKET, S3Bucket

PUBLIC = "acme/raw-public"
PRIVATE = "acme/raw-private"
TOKEN = "hf_raw_private_token_0001"
WEIGHTS = os.urandom(3000) + b"\x00\xff"  # not text
CONFIG = b'{"architectures": ["BertModel"]}\n'
NOTES = "notes \u00e9t\u00e9\n".encode()
SECRET = b'{"secret": "raw-private-bytes"}\n'


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    public, private = tmp_path / "public", tmp_path / "private"
    (public / "docs").mkdir(parents=True)
    (public / "config.json").write_bytes(CONFIG)
    (public / "weights.bin").write_bytes(WEIGHTS)
    (public / "docs" / "notes.md").write_bytes(NOTES)
    private.mkdir()
    (private / "secret.json").write_bytes(SECRET)
    return public, private


@pytest.fixture(scope="module", params=["folder", "moto"])
def raw_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MirrorServer]:
    """One ``cmh serve`` per store kind for the module (no test changes the store)."""
    tmp = tmp_path_factory.mktemp(f"raw-{request.param}")
    public, private = _folders(tmp)
    tokens = tmp / "tokens.txt"
    tokens.write_text(f"{TOKEN} {PRIVATE}\n")
    with pytest.MonkeyPatch.context() as monkeypatch:
        if request.param == "folder":
            store: Path | str = tmp / "store"
            for src, repo in ((public, PUBLIC), (private, PRIVATE)):
                add_folder(store, src, repo)
        else:
            moto = request.getfixturevalue("moto")
            bucket = S3Bucket(moto.endpoint, BUCKET, f"raw-{uuid.uuid4().hex[:12]}/")
            use_bucket(bucket, tmp, monkeypatch)  # the server inherits these settings
            store = str(bucket.url)
            target = BucketStore.open(store)
            for src, repo in ((public, PUBLIC), (private, PRIVATE)):
                target.add_folder(src, repo)
        with MirrorServer(store, tmp / "logs", tokens=tokens) as server:
            yield server


def _get(server: MirrorServer, path: str, **headers: str) -> httpx2.Response:
    return httpx2.get(server.url + path, headers=headers, timeout=60, follow_redirects=False)


def test_raw_answers_the_bytes_text_inline(raw_server: MirrorServer) -> None:
    for path, body, kind in (
        ("config.json", CONFIG, "text/plain; charset=utf-8"),
        ("docs/notes.md", NOTES, "text/plain; charset=utf-8"),
        ("weights.bin", WEIGHTS, "application/octet-stream"),
    ):
        answer = _get(raw_server, f"/{PUBLIC}/raw/main/{path}")
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
        assert answer.content == body, path
        assert answer.headers["content-type"] == kind, path
        assert answer.headers["content-disposition"].startswith("inline;"), path
        assert answer.headers["x-content-type-options"] == "nosniff"  # text is never run
        resolved = _get(raw_server, f"/{PUBLIC}/resolve/main/{path}")
        assert resolved.headers["etag"] == answer.headers["etag"]  # the same file, same path
    ranged = _get(raw_server, f"/{PUBLIC}/raw/main/weights.bin", Range="bytes=10-19")
    assert ranged.status_code == 206 and ranged.content == WEIGHTS[10:20]
    head = httpx2.head(f"{raw_server.url}/{PUBLIC}/raw/main/config.json", timeout=60)
    assert head.status_code == 200 and head.headers["content-length"] == str(len(CONFIG))


def test_raw_of_a_private_repo_needs_its_token(raw_server: MirrorServer) -> None:
    url = f"/{PRIVATE}/raw/main/secret.json"
    anonymous = _get(raw_server, url)
    resolved = _get(raw_server, f"/{PRIVATE}/resolve/main/secret.json")
    assert anonymous.status_code == resolved.status_code  # the API's own answer
    assert anonymous.status_code in (401, 404) and b"raw-private-bytes" not in anonymous.content
    wrong = _get(raw_server, url, Authorization="Bearer hf_not_a_known_token_000")
    assert wrong.status_code in (401, 404) and b"raw-private-bytes" not in wrong.content
    assert _get(raw_server, url, Authorization=f"Bearer {TOKEN}").content == SECRET
    assert _get(raw_server, url, Cookie=f"cmh_token={TOKEN}").content == SECRET  # the pages'


@pytest.mark.parametrize(
    "path",
    [
        "..%2F..%2F..%2Fetc%2Fpasswd",
        "docs/..%2F..%2Fconfig.json",
        "%2Fetc%2Fpasswd",
        "docs/%2E%2E/%2E%2E/x",
        "no-such-file.json",
    ],
)
def test_raw_never_answers_bytes_outside_the_repo(raw_server: MirrorServer, path: str) -> None:
    answer = _get(raw_server, f"/{PUBLIC}/raw/main/{path}")
    assert answer.status_code in (400, 404), (answer.status_code, answer.text[:300])
    assert b"root:" not in answer.content and CONFIG not in answer.content
