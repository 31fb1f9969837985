"""Ctrl-C at the edges of a command, sent to a real ``cmh`` process.

- During start-up, while ``cmh`` is still being imported: one line and exit 130,
  never a ``KeyboardInterrupt`` traceback from inside an import.
- During a first stamp, whose temporary is a full-size copy of the file: no
  hidden ``.NAME.cmh-stamp.*.tmp`` is left beside it, also when the process ends
  at once (a second Ctrl-C) while the copy still runs.
- Just before or just after a stamp's last step (a SIGINT raised in this process at
  that point): the ``interrupted:`` line says what became of the file in progress.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_support import CMH, flip_tensor_byte, run_runner, tensors
from safetensors.numpy import save_file

import cmh

F_SETPIPE_SZ = 1031  # <linux/fcntl.h>
#: Any test step that waits on the child gives up after this many seconds.
DEADLINE = 120.0

pytestmark = pytest.mark.skipif(not hasattr(fcntl, "F_GETFL"), reason="needs POSIX pipes")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CMH_"))}
    env.update(HF_HOME=str(tmp / "hf-home"), HF_HUB_OFFLINE="1", **extra)
    return env


def _read_all(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 65536):
        out += chunk
    return out


def test_ctrl_c_while_cmh_is_imported_exits_130_with_one_line(tmp_path: Path) -> None:
    """The child writes a line per finished import (``PYTHONPROFILEIMPORTTIME``) into a
    one-page pipe: once ``cmh._atomic`` is imported the test stops reading, so the child
    blocks within its next few imports, and SIGINT arrives while ``cmh`` is half imported."""
    save_file({"w": np.zeros((4, 4), np.float32)}, str(tmp_path / "m.safetensors"))
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(read_end, F_SETPIPE_SZ, 4096)
    except OSError:
        pytest.skip("cannot shrink a pipe here")
    proc = subprocess.Popen(
        [str(CMH), "verify", str(tmp_path / "m.safetensors")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=write_end,
        env=_env(tmp_path, PYTHONPROFILEIMPORTTIME="1"),
    )
    os.close(write_end)
    try:
        seen = b""
        while b"cmh._atomic" not in seen:
            chunk = os.read(read_end, 4096)
            assert chunk, f"cmh ended before cmh was imported: {seen.decode()[-2000:]}"
            seen += chunk
        proc.send_signal(signal.SIGINT)
        rest = _read_all(read_end).decode(errors="replace")
        code = proc.wait(timeout=DEADLINE)
    finally:
        os.close(read_end)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest[-3000:]
    assert code == 130, rest[-3000:]
    said = [line for line in rest.splitlines() if not line.startswith("import time:") and line]
    assert said == ["interrupted"], said


def _big_unstamped(path: Path, megabytes: int) -> Path:
    rows = megabytes * 1024 * 1024 // (4 * 1024)
    tensors = {f"layer.{i}.weight": np.ones((rows // 4, 1024), np.float32) for i in range(4)}
    save_file(tensors, str(path))
    return path


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.cmh-stamp.*.tmp"))


@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_an_interrupted_first_stamp_leaves_no_temporary(tmp_path: Path, presses: int) -> None:
    """The first press raises in the main thread while the kernel still copies the
    buffer into the temporary; a second one ends the process at once (``os._exit``,
    which runs no ``finally``). Either way the temporary is gone and the file is whole."""
    folder = tmp_path / "model"
    folder.mkdir()
    model = _big_unstamped(folder / "model.safetensors", 128)
    original = model.read_bytes()
    proc = subprocess.Popen(
        [str(CMH), "stamp", str(model)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
    )
    assert proc.stderr is not None
    try:
        give_up = time.monotonic() + DEADLINE
        while not _temporaries(folder):  # the stamp has started its copy
            assert proc.poll() is None, "the stamp ended before it could be interrupted"
            assert time.monotonic() < give_up
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        said = b""
        if presses == 2:
            while b"interrupted" not in said:
                chunk = os.read(proc.stderr.fileno(), 4096)
                if not chunk:
                    break
                said += chunk
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        said += proc.stderr.read()
        code = proc.wait(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = said.decode(errors="replace")
    assert "Traceback" not in text, text
    if code == 0:
        pytest.skip("the stamp finished before the Ctrl-C arrived (a very fast disk)")
    assert code == 130, text
    assert _temporaries(folder) == []
    assert model.read_bytes() == original  # the original untouched


def test_the_next_stamp_sweeps_a_dead_stamps_temporary(tmp_path: Path) -> None:
    """A temporary of a stamp whose process died (a ``kill -9``) goes with the next stamp."""
    model = _big_unstamped(tmp_path / "model.safetensors", 1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".model.safetensors.cmh-stamp.{dead.pid}.1.tmp"
    stale.write_bytes(b"x" * 1000)
    proc = subprocess.run(
        [str(CMH), "stamp", str(model)], capture_output=True, text=True, env=_env(tmp_path),
        timeout=DEADLINE,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _temporaries(tmp_path) == []


@pytest.fixture
def ctrl_c_ends_with_system_exit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After Ctrl-C, the command ends with ``SystemExit(130)`` where it would ``os._exit``."""

    def exit_now() -> None:
        if threading.current_thread() is threading.main_thread():  # not the grace timer
            raise SystemExit(130)

    monkeypatch.setattr("cmh.cli._interrupt._exit_now", exit_now)
    yield
    from cmh.cli._common import BARS_STOPPED

    BARS_STOPPED.clear()


def _ctrl_c_at(
    monkeypatch: pytest.MonkeyPatch, name: str, when: Callable[..., bool], *, before: bool = False
) -> None:
    """A real SIGINT in this process right after (``before``: right before) the first call
    ``os.NAME(...)`` that ``when`` accepts; the handler runs at once, in this thread."""
    real = getattr(os, name)
    fired = threading.Event()

    def hooked(*args: Any) -> Any:
        chosen = not fired.is_set() and when(*args)
        if chosen:
            fired.set()
            if before:
                signal.raise_signal(signal.SIGINT)
        result = real(*args)
        if chosen:
            signal.raise_signal(signal.SIGINT)
        return result

    monkeypatch.setattr(os, name, hooked)


@pytest.mark.usefixtures("ctrl_c_ends_with_system_exit")
@pytest.mark.parametrize("moment", ["before", "after"])
def test_ctrl_c_at_a_first_stamps_rename_says_what_became_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """Was: "the file in progress is unchanged" also when the rename had just happened."""
    model = tmp_path / "model.safetensors"
    save_file(tensors(1), str(model))
    original = model.read_bytes()

    def at_rename(source: str, target: str) -> bool:
        return target == str(model)

    _ctrl_c_at(monkeypatch, "replace", at_rename, before=moment == "before")
    run = run_runner(["stamp", model])
    assert run.exit_code == 130, run.stderr
    assert "interrupted: files reported stamped are complete" in run.stderr, run.stderr
    if moment == "before":
        assert f"{model} (in progress) is unchanged" in run.stderr, run.stderr
        assert model.read_bytes() == original
    else:
        assert f"and so is {model}: it was stamped as Ctrl-C came" in run.stderr, run.stderr
        assert "unchanged" not in run.stderr and cmh.verify(model).ok
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temporary


@pytest.mark.usefixtures("ctrl_c_ends_with_system_exit")
def test_ctrl_c_between_an_in_place_restamps_writes_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An in-place restamp writes the manifests, then the record: stopped between, the
    file is neither unchanged nor stamped, and the line says so; a rerun finishes it."""
    model = tmp_path / "model.safetensors"
    save_file(tensors(1), str(model))
    cmh.stamp(model, ttl="30d")
    flip_tensor_byte(model, "layer.0.weight")  # new manifests to write
    inode = model.stat().st_ino

    def at_manifests(fd: int, data: bytes, offset: int) -> bool:
        return os.fstat(fd).st_ino == inode

    _ctrl_c_at(monkeypatch, "pwrite", at_manifests)
    run = run_runner(["stamp", model])
    assert run.exit_code == 130, run.stderr
    assert f"{model} (in progress) has its new manifests but not yet its new record" in run.stderr
    assert not cmh.verify(model).ok
    monkeypatch.undo()
    assert run_runner(["stamp", model]).exit_code == 0 and cmh.verify(model).ok
