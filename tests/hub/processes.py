"""Stopping a child process: one way for the test helpers, the benches and the demos."""

from __future__ import annotations

import signal
import subprocess


def stop_process(
    process: subprocess.Popen[str] | subprocess.Popen[bytes], grace: float = 15.0
) -> int:
    """SIGTERM, then SIGKILL after ``grace`` seconds; always reaped. Returns the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
