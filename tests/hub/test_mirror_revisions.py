"""Which commit a revision names (spec 1.3), the same for every route and store kind.

A store keeps refs by name (``refs/{name}``) and does not tell branches from tags; the
refs route advertises a plain name ``X`` as branch ``refs/heads/X`` and ``refs/tags/X``
as tag ``X`` (2.10). Each of those names must work as a revision, as on the Hub: the
name as given first, then ``refs/heads/X`` and ``refs/tags/X`` for a plain name, and
``X`` for ``refs/heads/X``. Served by ``cmh serve`` over a folder and a SeaweedFS bucket.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.error import HTTPError
from urllib.parse import quote
from urllib.request import Request, urlopen

import pytest
from bucket_support import use_bucket
from cmh.hub.mirror.stores import open_store
from deadline_support import TEST_DEADLINE
from mirror_support import MirrorServer

REPO = "org/revs"


def _get(url: str, data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"} if data is not None else {}
    try:
        with urlopen(Request(url, data=data, headers=headers), timeout=TEST_DEADLINE) as r:
            return r.status, dict(r.headers), r.read()
    except HTTPError as err:
        return err.code, dict(err.headers), err.read()


@pytest.fixture(params=["folder", "seaweed"])
def served(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[MirrorServer, dict[str, str]]:
    """A store whose refs are ``main``, ``refs/tags/t1``, ``refs/heads/dev``,
    ``refs/tags/dev`` and ``refs/tags/main``, each on its own commit; the commit of each."""
    if request.param == "folder":
        location = str(tmp_path / "store")
        store = open_store(Path(location))
    else:
        bucket = request.getfixturevalue("seaweed_bucket")
        use_bucket(bucket, tmp_path, monkeypatch)
        location = bucket.url
        store = open_store(location)
    commits = {}
    for n, ref in enumerate(("main", "refs/tags/t1", "refs/heads/dev", "refs/tags/dev",
                             "refs/tags/main")):  # fmt: skip
        src = tmp_path / f"src{n}"
        src.mkdir()
        (src / "config.json").write_text(json.dumps({"n": n}))
        commits[ref] = store.add_folder(src, REPO, revision=ref).commit
    assert len(set(commits.values())) == 5
    server = MirrorServer(location, tmp_path / "logs")
    yield server, commits
    server.stop()


def test_every_advertised_ref_and_its_short_name_is_a_revision(served) -> None:
    server, commits = served
    url = server.url
    expected = {
        "main": commits["main"],  # the name as given before refs/tags/main
        "refs/heads/main": commits["main"],  # a plain name is a branch
        "refs/tags/main": commits["refs/tags/main"],
        "t1": commits["refs/tags/t1"],
        "refs/tags/t1": commits["refs/tags/t1"],
        "dev": commits["refs/heads/dev"],  # branch before tag
        "refs/heads/dev": commits["refs/heads/dev"],
        "refs/tags/dev": commits["refs/tags/dev"],
    }
    for revision, commit in expected.items():
        rev = quote(revision, safe="")
        status, headers, _ = _get(f"{url}/{REPO}/resolve/{rev}/config.json")
        assert (status, headers.get("X-Repo-Commit")) == (200, commit), revision
        status, _, body = _get(f"{url}/api/models/{REPO}/revision/{rev}")
        assert (status, json.loads(body).get("sha")) == (200, commit), revision
        status, _, body = _get(f"{url}/api/models/{REPO}/commits/{rev}")
        assert (status, json.loads(body)[0]["id"]) == (200, commit), revision
        status, _, body = _get(f"{url}/api/models/{REPO}/tree/{rev}")
        assert status == 200 and [e["path"] for e in json.loads(body)] == ["config.json"]
        asked = json.dumps({"paths": ["config.json"]}).encode()
        status, _, body = _get(f"{url}/api/models/{REPO}/paths-info/{rev}", asked)
        assert status == 200 and len(json.loads(body)) == 1, revision
    status, _, body = _get(f"{url}/api/models/{REPO}/refs")
    refs = json.loads(body)
    for item in refs["branches"] + refs["tags"]:  # what the refs route advertises resolves
        status, _, body = _get(f"{url}/api/models/{REPO}/revision/{quote(item['ref'], safe='')}")
        assert (status, json.loads(body)["sha"]) == (200, item["targetCommit"]), item
    for missing in ("nosuch", "refs/heads/nosuch", "refs/tags/nosuch", "heads/main", "tags/t1"):
        status, headers, _ = _get(f"{url}/{REPO}/resolve/{quote(missing, safe='')}/config.json")
        assert (status, headers.get("X-Error-Code")) == (404, "RevisionNotFound"), missing


def test_a_ref_file_reads_alike_in_a_folder_and_a_bucket(
    seaweed_bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ref is 40 lowercase hex; ASCII whitespace around it is ignored, anything else
    (other whitespace, other text, more than 4 KiB) makes it name no commit, in both kinds."""
    from cmh.hub.cache import RepoLayout
    from cmh.hub.mirror.stores.bucket._bucket import BucketStore

    commit = "0123456789abcdef0123456789abcdef01234567"
    cases = {
        "bare": (commit.encode(), commit),
        "newline": (f"{commit}\n".encode(), commit),
        "spaces": (f" \t{commit} \r\n\x0b\x0c".encode(), commit),
        "two-newlines": (f"{commit}\n\n".encode(), commit),
        "no-break-space": (f"{commit}\u00a0".encode(), None),
        "upper": (commit.upper().encode(), None),
        "words": (f"{commit} main".encode(), None),
        "padded-5000": (commit.encode() + b" " * 5000, None),
    }
    repo = RepoLayout(tmp_path / "store", REPO)
    repo.refs.mkdir(parents=True)
    use_bucket(seaweed_bucket, tmp_path, monkeypatch)
    bucket = BucketStore.open(seaweed_bucket.url)
    folder = repo.folder_name
    for name, (data, expected) in cases.items():
        (repo.refs / name).write_bytes(data)
        bucket.objects.put(bucket.ref_name(folder, name), data)
        state = bucket.read_ref(folder, name)
        assert repo.read_ref(name) == expected, name
        assert state is not None and (state.commit or None) == expected, name
