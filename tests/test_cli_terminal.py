"""Behaviour that needs a terminal: the progress bar and the passphrase prompt.

The CLI runs in a real pseudo-terminal (``pty``), as a person would run it.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from cli_support import CMH, write_keypair
from safetensors.numpy import save_file

import cmh

pytestmark = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")


def _env_without_passphrase() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CMH_KEY_PASSPHRASE"}
    env["HF_HUB_OFFLINE"] = "1"
    env["COLUMNS"] = "120"
    return env


def _read_all(fd: int, deadline: float) -> bytes:
    out = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        out += chunk
    return out


@pytest.fixture
def big_model(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    rng = np.random.default_rng(0)
    save_file(
        {f"t{i}": rng.standard_normal(1 << 20).astype(np.float32) for i in range(8)}, str(path)
    )
    cmh.stamp(path)
    return path


def test_progress_bar_only_on_a_terminal(big_model: Path) -> None:
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [str(CMH), "verify", str(big_model)],
            stdout=subprocess.PIPE,
            stderr=slave,
            stdin=subprocess.DEVNULL,
            env=_env_without_passphrase(),
        )
        os.close(slave)
        terminal = _read_all(master, time.monotonic() + 60).decode(errors="replace")
        stdout = proc.stdout.read().decode() if proc.stdout else ""
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(master)
    assert "verify model.safetensors" in terminal and "%|" in terminal
    assert "%|" not in stdout and f"ok       {big_model}" in stdout
    # The same command with stderr on a pipe shows no bar at all.
    piped = subprocess.run(
        [str(CMH), "verify", str(big_model)], capture_output=True, text=True, timeout=60
    )
    assert piped.returncode == 0 and piped.stderr == ""


def _converse(argv: list[str], answers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """Run ``argv`` on a pty; when a prompt appears, type its answer."""
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.execve(argv[0], argv, _env_without_passphrase())
    transcript = b""
    deadline = time.monotonic() + 60
    try:
        for prompt, answer in answers:
            while prompt not in transcript and time.monotonic() < deadline:
                ready, _, _ = select.select([fd], [], [], 0.2)
                if ready:
                    try:
                        transcript += os.read(fd, 4096)
                    except OSError:
                        break
            assert prompt in transcript, transcript
            transcript += b"<<typed>>"
            os.write(fd, answer)
        transcript += _read_all(fd, deadline)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), transcript


def test_passphrase_prompt_when_stdin_is_a_terminal(tmp_path: Path) -> None:
    model = tmp_path / "model.safetensors"
    save_file({"w": np.ones((3, 3), dtype=np.float32)}, str(model))
    cmh.stamp(model)
    private, _, kid = write_keypair(tmp_path / "enc", passphrase=b"correct horse")

    code, transcript = _converse(
        [str(CMH), "sign", str(model), "--key", str(private)],
        [(b"Passphrase for", b"correct horse\n")],
    )
    assert code == 0, transcript
    assert b"correct horse" not in transcript  # typed with echo off
    assert f"signed   {model}  by key {kid}".encode() in transcript
    assert cmh.inspect(model).signer_key_id == kid

    code, transcript = _converse(
        [str(CMH), "sign", str(model), "--key", str(private)],
        [(b"Passphrase for", b"wrong\n")],
    )
    assert code == 2 and b"wrong passphrase" in transcript


def test_keygen_prompts_twice_for_a_new_passphrase(tmp_path: Path) -> None:
    prefix = tmp_path / "new"
    code, transcript = _converse(
        [str(CMH), "keygen", "--out", str(prefix), "--encrypt"],
        [(b"Passphrase for the new key", b"pw-1\n"), (b"Repeat", b"pw-1\n")],
    )
    assert code == 0, transcript
    key = cmh._signing.load_private_key(f"{prefix}.key", b"pw-1")
    assert cmh._signing.key_id(key.public_key()).encode() in transcript
