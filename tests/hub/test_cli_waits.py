"""A Hub that never answers is reported at once; a Hub URL without a scheme is a usage error."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import CMH, run_subprocess


@pytest.fixture
def silent_port() -> object:
    """A loopback listener that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def test_a_request_without_answer_is_reported_within_seconds(
    tmp_path: Path, silent_port: int
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(tmp_path / "home")
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{silent_port}"
    started = time.monotonic()
    argv = [str(CMH), "pull", "org/x", "--cache-dir", str(tmp_path / "c")]
    proc = subprocess.Popen(
        argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        seconds = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    assert line.startswith(f"waiting for GET http://127.0.0.1:{silent_port}/api/models/org/x"), line
    assert "no answer yet" in line and "try 1 of 6" in line
    # The notice's 3 s are a real deadline (a person at a terminal); the first line being
    # the notice, not the try's end, is what shows it. The bound only guards, with room
    # for a loaded machine.
    assert seconds < 60, seconds


def test_a_download_without_a_first_byte_is_reported_and_then_goes_on(tmp_path: Path) -> None:
    """The whole-file download loop tells a silent wait too (not only API requests),
    and says nothing once bytes flow."""
    from hostile_upstream import HostileHub

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_XET="1")
    with HostileHub(resolve_delay=4.0) as hub:
        argv = [str(CMH), "pull", hub.repo_id, "--endpoint", hub.url,
                "--cache-dir", str(tmp_path / "c")]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    waits = [line for line in proc.stderr.splitlines() if "no answer yet" in line]
    assert len(waits) == 1, proc.stderr
    assert waits[0].startswith(f"waiting for GET {hub.url}/{hub.repo_id}/resolve/"), waits
    assert "try 1 of 6" in waits[0]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--endpoint", "127.0.0.1:9"], {}, "--endpoint"),
        ([], {"HF_ENDPOINT": "localhost:8080"}, "HF_ENDPOINT"),
        (["--endpoint", "ftp://127.0.0.1:9"], {}, "--endpoint"),
    ],
)
def test_an_endpoint_without_scheme_is_a_usage_error_at_once(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    run = run_subprocess(["pull", "org/x", "--cache-dir", tmp_path, *args],
                         env={"HF_HUB_OFFLINE": None, **env})  # fmt: skip
    assert run.exit_code == 2 and f"error: {named}" in run.stderr and "e.g. http://" in run.stderr
    assert "retry" not in run.stderr and "try 1 of" not in run.stderr  # refused, never tried
