"""The CMH v1 conformance vectors (fixtures/vectors/) and their runner (tools/conformance.py).

cmh and the independent spec reader (tests/spec_reader.py, written from the
spec alone) must report the outcome the index declares, in every mode, on
every vector; the vectors must be reproducible byte for byte.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import spec_reader
from click.testing import CliRunner

import cmh
from cmh._verification import Outcome

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "fixtures" / "vectors"
INDEX = json.loads((VECTORS / "index.json").read_text(encoding="utf-8"))
BY_NAME = {v["name"]: v for v in INDEX["vectors"]}


def load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


conformance = load_tool("conformance")


def cmh_reader(args: list[str]) -> dict[str, Any]:
    """``cmh verify --json`` in this process (a subprocess per check would take minutes)."""
    from cmh.cli.main import cli

    result = CliRunner().invoke(cli, ["verify", "--json", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    document = json.loads(result.stdout)
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the vectors with ``made`` steps are built (a FIFO, a socket, a 100 MB index)."""
    return tmp_path_factory.mktemp("made")


@pytest.fixture(scope="module")
def vectors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the vectors to check: ``cmh verify`` writes check records beside the blobs of
    a Hub-cache layout (``cache/models--*/.cmh/``), which must never land in the checkout."""
    copy = tmp_path_factory.mktemp("vectors") / "vectors"
    shutil.copytree(VECTORS, copy, symlinks=True)
    return copy


@pytest.fixture(scope="module")
def checks(vectors: Path, scratch: Path) -> list[Any]:
    return conformance.load_checks(vectors, scratch=scratch)


def _tree(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every file and symbolic link under ``root``: links by their target, never followed."""
    out: dict[str, tuple[str, bytes]] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path).encode())
            else:
                out[rel] = ("file", path.read_bytes())
    return out


def test_vectors_regenerate_byte_for_byte(tmp_path: Path) -> None:
    make_vectors = load_tool("make_vectors")
    make_vectors.write_vectors(tmp_path / "v")
    committed, rebuilt = _tree(VECTORS), _tree(tmp_path / "v")
    assert sorted(rebuilt) == sorted(committed)
    assert [n for n in committed if committed[n] != rebuilt[n]] == []
    assert sum(kind == "link" for kind, _ in committed.values()) >= 20


def test_the_index_covers_every_outcome_and_rule() -> None:
    vectors = INDEX["vectors"]
    assert len(vectors) >= 40
    assert sum(v["negative"] for v in vectors) >= 25
    outcomes = {c["outcome"] for v in vectors for c in v["checks"]}
    assert outcomes == {o.value for o in Outcome} | {"index_inconsistent"}
    # Every outcome other than ok is some vector's outcome in full or fast mode, or with a key.
    primary = {c["outcome"] for v in vectors for c in v["checks"] if c["mode"] in ("full", "key")}
    assert primary >= outcomes - {"ok"}
    modes = {c["mode"] for v in vectors for c in v["checks"]}
    assert modes >= {"full", "fast", "key", "require-signature", "before-expiry", "at-expiry"}
    # Files and directories alike are judged in every mode but the expiry ones (section 10).
    every = modes - {"before-expiry", "at-expiry"}
    assert len(every) == 8
    assert all({c["mode"] for c in v["checks"]} >= every for v in vectors)
    directories = [v for v in vectors if v["kind"] == "directory"]
    assert len(directories) >= 85
    assert all(
        v["fingerprint"] in ("ok", "invalid_file", "index_inconsistent") for v in directories
    )
    # Issue 39: every file type as PATH and inside a directory; the stock cache's layout.
    others = {v["name"] for v in vectors if v["kind"] == "other"}
    assert others >= {"path-fifo", "path-socket", "path-missing", "path-link-loop"}
    assert {v["name"] for v in vectors if "made" in v} >= {"dir-index-over-limit", "dir-shard-fifo"}
    assert sum(v["path"].startswith("cache/models--") for v in vectors) >= 4
    assert {c["outcome"] for v in directories for c in v["checks"]} >= {
        "ok", "invalid_file", "index_inconsistent", "unstamped", "tensor_mismatch",
        "signature_missing", "signature_untrusted",
    }  # fmt: skip
    kept = [v["path"].split("/")[0] for v in vectors if "made" not in v]
    listed = {*kept, "index.json", "signing-key.pub", "other-key.pub"}
    assert {p.name for p in VECTORS.iterdir()} == listed
    # no-metadata really has no __metadata__ entry.
    data = (VECTORS / "no-metadata.safetensors").read_bytes()
    assert b"__metadata__" not in data
    assert cmh.read_header(VECTORS / "no-metadata.safetensors").metadata is None


def test_cmh_agrees_on_every_check(checks: list[Any]) -> None:
    results = conformance.run_checks(cmh_reader, checks)
    disagreements = [(r.check.vector, r.check.mode, r.check.expected, r.found) for r in results]
    assert [d for d in disagreements if d[2] != d[3]] == []
    assert len(results) == sum(len(v["checks"]) for v in INDEX["vectors"])


def test_spec_reader_agrees_on_every_check(checks: list[Any]) -> None:
    results = conformance.run_checks(spec_reader.run, checks)
    disagreements = [(r.check.vector, r.check.mode, r.check.expected, r.found) for r in results]
    assert [d for d in disagreements if d[2] != d[3]] == []
    assert len(results) == sum(len(v["checks"]) for v in INDEX["vectors"])


DIRECTORIES = [v for v in INDEX["vectors"] if v["kind"] == "directory"]


def test_fingerprint_refuses_a_directory_where_verify_does(
    vectors: Path, scratch: Path, checks: Any
) -> None:
    """Section 6: ``cmh fingerprint`` reports the vector's ``fingerprint`` outcome, with the
    exit status verify gives it, and an identity exactly when ``ok``."""
    from cmh.cli.main import cli

    wrong = []
    for vector in DIRECTORIES:
        root = scratch if "made" in vector else vectors
        result = CliRunner().invoke(cli, ["fingerprint", "--json", str(root / vector["path"])])
        document = json.loads(result.stdout)
        want = vector["fingerprint"]
        status = {"ok": 0, "invalid_file": 3, "index_inconsistent": 1}[want]
        got = (document["outcome"], result.exit_code, document.get("fingerprint") is not None)
        if got != (want, status, want == "ok"):
            wrong.append((vector["name"], got))
    assert wrong == []


@pytest.mark.parametrize(
    "command",
    [
        [str(Path(sys.executable).parent / "cmh"), "verify", "--json"],
        [sys.executable, str(ROOT / "tests" / "spec_reader.py")],
    ],
    ids=["cmh", "spec_reader"],
)
def test_the_runner_drives_real_commands(command: list[str], capsys: Any) -> None:
    chosen = "signed,tensor-mismatch,record-version-2-bad-check,dir-stray-shard"
    status = conformance.main(["--only", chosen, "--mode", "full,key", "--", *command])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "8/8 checks agree (4 vectors)" in out


def test_the_runner_reports_a_reader_that_disagrees() -> None:
    checks = conformance.load_checks(VECTORS, only=["basic", "tensor-mismatch"], modes=["full"])

    def always_ok(args: list[str]) -> dict[str, Any]:
        return {"outcome": "ok"}

    def broken(args: list[str]) -> dict[str, Any]:
        raise ValueError("no JSON")

    out = io.StringIO()
    assert conformance.report(conformance.run_checks(always_ok, checks), out) is False
    assert "FAIL tensor-mismatch [full]: expected tensor_mismatch, got ok" in out.getvalue()
    results = conformance.run_checks(broken, checks)
    assert all(r.found.startswith("error: ValueError") for r in results)
    silent = conformance.command_reader([sys.executable, "-c", "import sys; sys.exit(4)"])
    (result,) = conformance.run_checks(silent, checks[:1])
    assert result.found.startswith("error: ValueError: exit 4, no JSON on stdout")


POSITIVE = [v for v in INDEX["vectors"] if v["kind"] == "file" and "details" in v]


@pytest.mark.parametrize("vector", POSITIVE, ids=[v["name"] for v in POSITIVE])
def test_record_root_and_digests_match_the_details(vector: dict[str, Any]) -> None:
    details = vector["details"]
    path = VECTORS / vector["path"]
    parsed = spec_reader.parse(path.read_bytes())
    record = spec_reader.record(parsed.metadata["cmh"])  # type: ignore[index]
    assert record.raw.hex() == details["record_hex"]
    assert spec_reader.root(parsed).hex() == details["root"] == details["record"]["fingerprint"]
    info = cmh.inspect(path)
    assert info.record is not None and info.record.to_hex() == details["record_hex"]
    assert cmh.fingerprint(path).hex == details["root"]
    assert info.signer_key_id == details["signed_by_key_id"]
    sha = dict(zip([t[0] for t in parsed.tensors], spec_reader.sha256_digests(parsed), strict=True))
    digests = {d.name: d for d in cmh.hash_tensors(path, cmh.read_header(path), xxh3=True)}
    for t in details["tensors"]:
        assert sha[t["name"]].hex() == t["sha256"]
        assert digests[t["name"]].sha256.hex() == t["sha256"]  # type: ignore[union-attr]
        assert digests[t["name"]].xxh3.hex() == t["xxh3_128"]  # type: ignore[union-attr]


def test_sharded_identity_matches_single_file_and_spec_reader() -> None:
    identity = BY_NAME["sharded"]["details"]["identity"]
    assert cmh.directory_identity(VECTORS / "sharded").hex == identity
    assert cmh.directory_identity(VECTORS / "unsharded-dir").hex == identity
    shards = [
        spec_reader.parse(p.read_bytes())
        for p in sorted((VECTORS / "sharded").glob("*.safetensors"))
    ]
    assert spec_reader.directory_identity(shards).hex() == identity
