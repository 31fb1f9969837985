"""The client-version matrix (issue 36): huggingface_hub releases a cluster runs, each in
its own interpreter (``client_versions.py``), against ``cmh serve`` on a folder and on a
bucket (SeaweedFS), as a pull-through mirror (folder store) in front of a Hub-like
front, and as a 2-replica pull-through fleet over a bucket (with a fleet key).

Phases on one cache per cell: cold, fresh (again, online), offline
(``HF_HUB_OFFLINE=1``); through pull-through also Ctrl-C mid-download during the
mirror's fill, then a rerun (in the fleet, the rerun goes to the other replica). Every
cell must hold the source's bytes, raise nothing, and leave a cache whose every blob's
content is its name (SHA-256, or the git blob SHA-1 of a small file). The pinned 2.x
is the project venv's own.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from bucket_support import use_bucket
from client_versions import client_env
from cmh.hub.mirror import BucketStore, ObjectNotFound, add_folder, open_store
from hublike import running
from mirror_support import MirrorServer, ctrl_c_as_from_a_terminal, hf_env, stop_servers, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = "versions/model"
BIG = 12 << 20
VERSIONS = ["0.26.5", "0.36.0", "1.33.0", "pinned"]

SCRIPT = r"""
import hashlib, json, os
import huggingface_hub
from huggingface_hub import hf_hub_download, snapshot_download
repo = os.environ["T_REPO"]
path = snapshot_download(repo)
files = {}
for root, _, names in os.walk(path):
    for name in names:
        full = os.path.join(root, name)
        rel = os.path.relpath(full, path).replace(os.sep, "/")
        files[rel] = hashlib.sha256(open(full, "rb").read()).hexdigest()
one = hf_hub_download(repo, "weights.bin")
files["one:weights.bin"] = hashlib.sha256(open(one, "rb").read()).hexdigest()
print(json.dumps({"version": huggingface_hub.__version__, "files": files}))
"""

INTERRUPTED = r"""
import os
from huggingface_hub import hf_hub_download
hf_hub_download(os.environ["T_REPO"], "weights.bin")
"""


def _pattern(size: int) -> bytes:
    block = hashlib.sha256(b"versions").digest() * (1 << 15)
    return b"".join(bytes([i & 0xFF]) + block[1:] for i in range(size // len(block) + 1))[:size]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("versions")
    src = base / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "versions"}\n')
    (src / "sub" / "notes.txt").write_text("notes\n" * 50)
    (src / "weights.bin").write_bytes(_pattern(BIG))
    add_folder(base / "store", src, REPO)
    truth = {
        p.relative_to(src).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in src.rglob("*")
        if p.is_file()
    }
    truth["one:weights.bin"] = truth["weights.bin"]
    origin = MirrorServer(base / "store", base / "logs")
    try:
        with running(origin.url, xet_listing=False) as front:
            yield {"origin": origin, "front": front, "truth": truth, "base": base}
    finally:
        origin.stop()


def _env(url: str, home: Path, version: str) -> dict[str, str]:
    env = dict(hf_env(url, home), T_REPO=REPO)
    if version == "pinned":
        return env
    got = client_env(env, version)
    if got is None:
        pytest.skip(f"huggingface_hub {version} cannot be installed here (no package index)")
    return got


def _run(code: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _blobs_are_their_names(home: Path) -> list[str]:
    """Blobs whose content is not their name (SHA-256, or git blob SHA-1)."""
    bad = []
    for blob in home.rglob("blobs/*"):
        if not blob.is_file() or blob.name.endswith(".incomplete"):
            continue
        data = blob.read_bytes()
        if len(blob.name) == 64:
            good = hashlib.sha256(data).hexdigest() == blob.name
        else:
            good = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob.name
        if not good:
            bad.append(str(blob))
    return bad


def _phases(url: str, home: Path, version: str, truth: dict[str, str]) -> None:
    env = _env(url, home, version)
    for phase, extra in (("cold", {}), ("fresh", {}), ("offline", {"HF_HUB_OFFLINE": "1"})):
        got = _run(SCRIPT, {**env, **extra})
        if version != "pinned":
            assert got["version"] == version
        assert got["files"] == truth, (version, phase)
    assert _blobs_are_their_names(home) == [], version


@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_against_cmh_serve(
    servers: dict[str, Any], version: str, tmp_path: Path
) -> None:
    _phases(servers["origin"].url, tmp_path / "home", version, servers["truth"])


def _incomplete(home: Path) -> int:
    return max((p.stat().st_size for p in home.rglob("blobs/*.incomplete")), default=0)


#: Releases ``cmh.hub.install()`` does not support (older than 2.0): 0.17.3 has not even
#: ``constants.HF_HUB_CACHE``; 1.33.0 is the newest 1.x (no client factory hook).
UNSUPPORTED = ["0.17.3", "1.33.0"]

INSTALLING = r"""
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import cmh.hub
    installed = cmh.hub.install()
"""

REPORT = r"""
print(json.dumps({"installed": installed, "warned": [str(w.message) for w in caught]}))
"""


@pytest.mark.parametrize("version", UNSUPPORTED)
def test_install_leaves_a_release_it_does_not_support_to_itself(
    servers: dict[str, Any], tmp_path: Path, version: str
) -> None:
    """Was: ``install()`` on 0.17.3 patched the download functions and returned True, and
    every download then failed (``constants`` has no ``HF_HUB_CACHE``). It now patches
    nothing, says so, returns False, and the stock client downloads as without it."""
    home = tmp_path / "home"
    env = _env(servers["origin"].url, home, version)
    for phase, extra in (("cold", {}), ("offline", {"HF_HUB_OFFLINE": "1"})):
        proc = subprocess.run(
            [sys.executable, "-c", INSTALLING + SCRIPT + REPORT],
            env={**env, **extra}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        *_, files, report = (json.loads(line) for line in proc.stdout.strip().splitlines())
        assert files == {"version": version, "files": servers["truth"]}, phase
        assert report["installed"] is False
        assert [w for w in report["warned"] if "cmh.hub.install" in w] == [
            f"cmh.hub.install: huggingface_hub {version} is not supported (cmh needs 2.0 "
            "or later): nothing patched, downloads go to the stock client unchanged"
        ]
    assert _blobs_are_their_names(home) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_against_cmh_serve_on_a_bucket(
    servers: dict[str, Any],
    version: str,
    tmp_path: Path,
    seaweed_bucket: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_bucket(seaweed_bucket, tmp_path, monkeypatch)
    open_store(seaweed_bucket.url).add_folder(servers["base"] / "src", REPO)
    server = MirrorServer(seaweed_bucket.url, tmp_path / "logs")
    try:
        _phases(server.url, tmp_path / "home", version, servers["truth"])
    finally:
        server.stop()


def _interrupt_during_fill(
    servers: dict[str, Any],
    url: str,
    home: Path,
    version: str,
    ready: Callable[[], bool] | None = None,
) -> None:
    """A client of ``url`` stopped with Ctrl-C while the mirror fills the big file (the
    upstream pauses for 3 s near its end), once it holds a partial download (or once
    ``ready()``)."""
    servers["front"].stall(
        after_bytes=BIG - (1 << 20), seconds=3.0, path=servers["truth"]["weights.bin"]
    )
    first = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED],
        env=_env(url, home, version),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=ctrl_c_as_from_a_terminal,
    )
    try:
        wait_for(ready or (lambda: _incomplete(home) >= 1 << 20), "a partial download")
        first.send_signal(signal.SIGINT)  # Ctrl-C
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_through_pull_through_with_a_ctrl_c(
    servers: dict[str, Any], version: str, tmp_path: Path
) -> None:
    front = servers["front"]
    front.clear_faults()
    (tmp_path / "store").mkdir()
    pull = MirrorServer(tmp_path / "store", tmp_path / "logs", extra_args=("--upstream", front.url))
    try:
        home = tmp_path / "home"
        _interrupt_during_fill(servers, pull.url, home, version)
        _phases(pull.url, home, version, servers["truth"])
    finally:
        pull.stop()
        front.clear_faults()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_through_a_two_replica_fleet_with_a_ctrl_c(
    servers: dict[str, Any],
    version: str,
    tmp_path: Path,
    seaweed_bucket: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C against one replica during its fill; the rerun and every later phase go to
    the other replica (its answers come from the fleet's records and parts)."""
    front = servers["front"]
    front.clear_faults()
    use_bucket(seaweed_bucket, tmp_path, monkeypatch)
    key = tmp_path / "fleet.key"
    key.write_text("5a" * 32 + "\n")
    args = ("--upstream", front.url, "--fill-lease-ttl", "3", "--fleet-key-file", str(key))
    replicas = [
        MirrorServer(seaweed_bucket.url, tmp_path / f"logs-{i}", extra_args=args) for i in range(2)
    ]
    part = f"models--versions--model/.cmh/fills/{servers['truth']['weights.bin']}/part-000000"
    objects = BucketStore.open(seaweed_bucket.url).objects

    def ready() -> bool:
        """The first 8 MiB part is stored (the upstream pauses 3 MiB later) and the client
        has its partial file: a client writing 10 MiB at a time (1.x) holds nothing yet."""
        try:
            objects.head(part)
        except ObjectNotFound:
            return False
        return any(home.rglob("blobs/*.incomplete"))

    try:
        home = tmp_path / "home"
        _interrupt_during_fill(servers, replicas[0].url, home, version, ready)
        _phases(replicas[1].url, home, version, servers["truth"])
    finally:
        stop_servers(replicas)
        front.clear_faults()
