"""Ctrl-C during long commands, pressed on a real pseudo-terminal as a person would.

Each test runs ``cmh`` as the session leader of a pty, waits until some of the work
is on disk, types Ctrl-C (``\\x03``: the terminal sends SIGINT to the foreground
process group) and checks: exit 130 within 2 s, a message saying what can be
resumed, and that what was finished is kept and reused by a rerun.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bucket_support import S3_KINDS, use_bucket
from cli_support import CMH, run_subprocess
from cmh.hub.mirror import BucketStore, add_folder
from resolver_support import FaultProxy, write_checkpoint_repo
from safetensors.numpy import save_file

import cmh

pytestmark = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")

#: Ctrl-C must end the command within this many seconds. A real deadline (a person waits
#: on it), so a wall-clock bound, but generous: on a quiet machine they stop in 0.1-0.9 s;
#: a loaded one (load 15-27 on 2 cores) took over 2 s. A command that went on with its
#: work instead finishes it (the tests check that it did not: exit 130, work left undone).
STOP_WITHIN = 10.0


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CMH_"))}
    env.update(HF_HOME=str(tmp / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1", COLUMNS="100")
    return env


def interrupt_when(
    argv: list[str], env: dict[str, str], ready: Callable[[], bool]
) -> tuple[int, float, str]:
    """Run ``cmh argv`` on a pty, press Ctrl-C once ``ready()``; (exit status, seconds, output)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: session leader, the pty is its controlling terminal
        os.execve(str(CMH), [str(CMH), *argv], env)
    transcript = b""
    pressed_at: float | None = None
    deadline = time.monotonic() + 120
    status: int | None = None
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select([fd], [], [], 0.05)
            if readable:
                with contextlib.suppress(OSError):  # EIO: the child is gone
                    transcript += os.read(fd, 65536)
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
                break
            if pressed_at is None and ready():
                os.write(fd, b"\x03")
                pressed_at = time.monotonic()
    finally:
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    assert pressed_at is not None, "the command ended before it could be interrupted"
    assert status is not None, transcript.decode(errors="replace")
    return status, time.monotonic() - pressed_at, transcript.decode(errors="replace")


def _slow_hub(tmp_path: Path, mirror_server_factory: Any) -> tuple[Path, str, FaultProxy]:
    """``org/big`` (32 MiB) behind a proxy that slows it to about 2 s per 4 MiB chunk and
    connection: its source folder, its commit, the proxy."""
    store = tmp_path / "store"
    src = write_checkpoint_repo(tmp_path / "src", 1, count=8, elems=1 << 20)
    commit = add_folder(store, src, "org/big").commit
    proxy = FaultProxy(mirror_server_factory(store).url)
    proxy.delay = 0.03
    return src, commit, proxy


def _chunks_logged(cache: Path) -> int:
    """Chunks of ``org/big`` finished in ``cache`` (its transfer logs)."""
    partial = cache / "models--org--big" / ".cmh" / "partial"
    logs = list(partial.glob("*.chunks.log")) if partial.is_dir() else []
    return sum(line.startswith("chunk ") for p in logs for line in p.read_text().splitlines())


def test_ctrl_c_stops_pull_at_once_and_the_rerun_resumes(
    tmp_path: Path, mirror_server_factory: Any
) -> None:
    cache = tmp_path / "cache"
    src, _, proxy = _slow_hub(tmp_path, mirror_server_factory)
    try:
        argv = ["pull", "org/big", "--cache-dir", str(cache), "--endpoint", proxy.url,
                "--connections", "2"]  # fmt: skip
        code, seconds, output = interrupt_when(
            argv, _env(tmp_path), lambda: _chunks_logged(cache) >= 1
        )
        assert code == 130, output
        assert seconds < STOP_WITHIN, (seconds, output)
        assert "interrupted:" in output and "run the same command again to resume" in output
        assert "Aborted!" not in output and "Traceback" not in output
        assert "B/" in output.split("interrupted:")[0]  # a bar was shown ...
        assert "B/" not in output.split("interrupted:")[1]  # ... and not drawn again after
        kept = _chunks_logged(cache)
        assert 1 <= kept < 8, kept  # finished chunks are kept, the rest was not fetched

        proxy.delay = 0.0
        rerun = run_subprocess([*argv, "--json"], env={"HF_HUB_OFFLINE": None})
        assert rerun.exit_code == 0, rerun.stderr
        size = (src / "model.safetensors").stat().st_size
        weights = next(f for f in rerun.json()["files"] if f["path"] == "model.safetensors")
        assert weights["bytes_transferred"] <= size - kept * (4 << 20)  # only what was missing
        pulled = Path(rerun.json()["path"]) / "model.safetensors"
        assert pulled.read_bytes() == (src / "model.safetensors").read_bytes()
    finally:
        proxy.stop()


@pytest.mark.parametrize("kind", S3_KINDS)
def test_ctrl_c_stops_a_sync_into_a_bucket_and_the_rerun_resumes(
    tmp_path: Path,
    mirror_server_factory: Any,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """A bucket store's sync resolves into a cache kept between runs: the chunks finished
    before Ctrl-C are not fetched again, and the rerun completes the import."""
    bucket = request.getfixturevalue(f"{kind}_bucket")
    env = {**_env(tmp_path), **use_bucket(bucket, tmp_path, monkeypatch)}
    env.update(CMH_DOWNLOAD_CONNECTIONS="2", XDG_CACHE_HOME=str(tmp_path / "xdg"))
    cache = tmp_path / "cache"
    src, commit, proxy = _slow_hub(tmp_path, mirror_server_factory)
    try:
        argv = ["mirror", "sync", "org/big", "--store", bucket.url, "--from", proxy.url,
                "--cache-dir", str(cache)]  # fmt: skip
        code, seconds, output = interrupt_when(argv, env, lambda: _chunks_logged(cache) >= 1)
        assert code == 130, output
        assert seconds < STOP_WITHIN, (seconds, output)
        assert "interrupted:" in output and "run the same command again to resume" in output
        assert "Traceback" not in output
        kept = _chunks_logged(cache)
        assert 1 <= kept < 8, kept
        target = BucketStore.open(bucket.url)
        assert target.read_ref("models--org--big", "main") is None  # nothing half-done

        proxy.delay = 0.0
        rerun = run_subprocess([*argv, "--json"], env={**env, "HF_HUB_OFFLINE": None})
        assert rerun.exit_code == 0, rerun.stderr
        (doc,) = rerun.json()["repos"]
        size = (src / "model.safetensors").stat().st_size
        weights = next(f for f in doc["files"] if f["path"] == "model.safetensors")
        assert weights["action"] == "resumed"
        assert weights["bytes_transferred"] <= size - kept * (4 << 20)  # only what was missing
        assert doc["commit"] == commit and doc["store"]["state"] == "updated"
        ref = target.read_ref("models--org--big", "main")
        assert ref is not None and ref.commit == commit
        blob = target.objects.get(target.blob_name("models--org--big", weights["etag"]))
        assert blob == (src / "model.safetensors").read_bytes()
    finally:
        proxy.stop()


def test_ctrl_c_stops_mirror_add_and_the_rerun_keeps_stored_blobs(tmp_path: Path) -> None:
    src, store = tmp_path / "src", tmp_path / "store"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(160):
        (src / f"shard-{i:03}.bin").write_bytes(rng.bytes(1 << 20))
    blobs = store / "models--org--many" / "blobs"

    def some_stored() -> bool:
        return blobs.is_dir() and sum(1 for p in blobs.iterdir() if not p.name.startswith(".")) > 2

    argv = ["mirror", "add", str(src), "--store", str(store), "--repo", "org/many"]
    code, seconds, output = interrupt_when(argv, _env(tmp_path), some_stored)
    assert code == 130, output
    assert seconds < STOP_WITHIN, (seconds, output)
    assert "blobs stored so far are kept" in output and "Traceback" not in output
    kept = sum(1 for p in blobs.iterdir() if not p.name.startswith("."))
    assert 0 < kept < 160
    assert not (store / "models--org--many" / "refs" / "main").exists()  # no half commit

    rerun = run_subprocess([*argv, "--json"])
    assert rerun.exit_code == 0, rerun.stderr
    document = rerun.json()
    assert document["command"] == "mirror add" and document["ok"] is True
    assert document["new_blobs"] <= 160 - kept and document["files"] == 160


def test_ctrl_c_stops_stamp_and_leaves_every_file_whole(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    originals: dict[Path, bytes] = {}
    for i in range(24):
        path = tmp_path / f"model-{i:02}.safetensors"
        save_file({f"t{j}": rng.standard_normal(1 << 19).astype(np.float32) for j in range(4)},
                  str(path))  # fmt: skip
        originals[path] = path.read_bytes()

    def stamped() -> int:
        return sum(p.read_bytes() != data for p, data in originals.items())

    argv = ["stamp", *map(str, originals)]
    code, seconds, output = interrupt_when(argv, _env(tmp_path), lambda: stamped() >= 2)
    assert code == 130, output
    assert seconds < STOP_WITHIN, (seconds, output)
    assert "files reported stamped are complete" in output and "Traceback" not in output
    done = [p for p, data in originals.items() if p.read_bytes() != data]
    assert 2 <= len(done) < 24
    for path in done:  # every changed file is completely stamped; the others untouched
        assert cmh.verify(path).ok
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers  # the temporary copy of the file in progress is gone
    rerun = run_subprocess(["verify", *map(str, originals)])
    assert rerun.exit_code == 1 and f"{len(done)} ok" in rerun.stdout


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_stops_on_ctrl_c_within_the_graceful_timeout(
    tmp_path: Path, mirror_server_factory: Any, workers: int
) -> None:
    """Was: a download in flight to a client that does not read held the server for twice
    --graceful-timeout (aiohttp waits the timeout, cancels the handler, waits it again),
    and the request was never logged. Now its connection is shut down at the timeout: its
    handler ends, the access log has it ("client went away"), and the server exits 0."""
    import json

    store = tmp_path / "store"
    src = write_checkpoint_repo(tmp_path / "src", 1, count=8, elems=1 << 20)  # 32 MiB
    add_folder(store, src, "org/big")
    server = mirror_server_factory(store, workers=workers, extra_args=("--graceful-timeout", "1"))
    with socket.create_connection((server.host, server.port)) as client:
        # A download in flight that never reads: the server cannot finish it.
        client.sendall(b"GET /org/big/resolve/main/model.safetensors HTTP/1.1\r\n"
                       b"Host: 127.0.0.1\r\n\r\n")  # fmt: skip
        assert client.recv(12).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        code = server.process.wait(60)
        seconds = time.monotonic() - started
    said = server.stderr_text()
    assert "Traceback" not in said and "Exception" not in said, said
    assert said.count("stopping: no new connections; requests in flight get up to 1 s") == 1
    entries = [json.loads(line) for line in server.access_log.read_text().splitlines()]
    (cut,) = [e for e in entries if e["route"] == "resolve"]
    assert cut["status"] == 200 and cut["cut"] == "client went away", cut
    assert cut["duration_ms"] >= 1000  # it had its graceful second
    # With workers the parent kills one still running a second past the timeout (exit 1):
    # a loaded machine may get there; one worker exits 0.
    assert code == 0 if workers == 1 else code in (0, 1), (code, said)
    # A guard, not the subject: the old code took 2 s here; the access log tells them apart.
    assert seconds < 1 + 20, seconds


def test_serve_upstream_creates_a_store_folder_that_does_not_exist(
    tmp_path: Path, mirror_server_factory: Any
) -> None:
    store = tmp_path / "new" / "store"
    server = mirror_server_factory(store, extra_args=("--upstream", "http://127.0.0.1:9"))
    assert store.is_dir() and server.process.poll() is None


def test_an_error_raised_while_a_ctrl_c_unwinds_still_exits_130() -> None:
    """Under load, a Ctrl-C during ``cmh stamp`` raised ``KeyboardInterrupt`` while a hashing
    thread still held a view of the file's mmap; closing the mmap then raised
    ``BufferError`` instead, which escaped as a traceback and exit 1. Whatever ends the
    block once Ctrl-C fired ends the process with 130, and nothing more is printed."""
    import subprocess
    import sys

    script = (
        "import os, signal\n"
        "from cmh.cli._interrupt import stop_on_interrupt\n"
        "with stop_on_interrupt('nothing is kept'):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        signal.pause()\n"
        "    finally:\n"
        "        raise BufferError('cannot close exported pointers exist')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 130, done.stderr
    assert "interrupted: nothing is kept" in done.stderr
    assert "Traceback" not in done.stderr and "BufferError" not in done.stderr


def test_ctrl_c_of_serve_with_a_fingerprint_computing_prints_no_child_traceback(
    tmp_path: Path,
) -> None:
    """Fingerprints run in the compute pool's processes, in the server's process group: a
    Ctrl-C reaches them too. They ignore it (else each printed a KeyboardInterrupt
    traceback, or one computing sent it back as its outcome and the server exited 130 with
    "error: interrupted"); the server's graceful shutdown stays as it is."""
    import threading
    import urllib.request

    src, store = tmp_path / "src", tmp_path / "store"
    src.mkdir()
    # 12,000 tiny tensors: a fingerprint takes 0.3-0.4 s of Python work
    tensors = {f"t.{i}": np.full(2, i, np.float32) for i in range(12_000)}
    save_file(tensors, str(src / "m.safetensors"))
    commits = []
    for i in range(3):
        (src / "config.json").write_text(f'{{"model_type": "bert", "version": {i}}}\n')
        commits.append(add_folder(store, src, "org/tiny", revision=f"v{i}").commit)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}/api/cmh/fingerprint/org/tiny"
    answered: list[int] = []

    def fingerprint(commit: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/{commit}", timeout=60) as r:
                    answered.append(r.status)
                    return
            except OSError:  # not listening yet; or the server stopped mid-request
                if answered:
                    return
                time.sleep(0.05)

    first = threading.Thread(target=fingerprint, args=(commits[0],), daemon=True)
    first.start()
    later: list[float] = []

    def computing() -> bool:  # the processes run (one answer), and two more are asked for
        if not answered:
            return False
        if not later:
            for commit in commits[1:]:
                threading.Thread(target=fingerprint, args=(commit,), daemon=True).start()
            later.append(time.monotonic())
        return time.monotonic() - later[0] > 0.15  # the next computation is under way

    argv = ["serve", "--store", str(store), "--host", "127.0.0.1", "--port", str(port)]
    code, seconds, output = interrupt_when(argv, _env(tmp_path), computing)
    assert answered[0] == 200, output
    # a child's KeyboardInterrupt came back as the computation's outcome: "error: interrupted"
    assert "Traceback" not in output and "interrupted" not in output, output
    assert code == 0, (code, output)  # the graceful shutdown, as without fingerprints
    assert seconds < STOP_WITHIN, (seconds, output)
