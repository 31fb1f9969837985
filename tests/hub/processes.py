"""Child processes of the tests: one way for the test helpers, the benches and the demos
to stop one (:func:`stop_process`), and for the helpers to pick a free port, start a
server that dies with the test process and wait until it answers."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


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


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when its parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class ExitedAtStart(RuntimeError):
    """A server ended before it answered (its port taken since it was picked, say)."""


def start_server(
    argv: Sequence[str],
    log: Path,
    ready: Callable[[], object],
    deadline: float,
    **popen: object,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (output appended to ``log``; dies with this process) and return once
    ``ready()`` returns without an ``OSError`` while the process runs. :class:`RuntimeError`
    with the log's tail when ``deadline`` seconds pass (the process is stopped), and
    :class:`ExitedAtStart` when the process exits first (a ``ready()`` that succeeded then
    may have reached another process on that port)."""
    with open(log, "ab") as out:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent, **popen,  # type: ignore[call-overload]
        )  # fmt: skip
    until = time.monotonic() + deadline
    while True:
        try:
            ready()
            if process.poll() is None:
                return process
            problem: OSError | None = None
        except OSError as exc:
            problem = exc
        if process.poll() is not None or time.monotonic() > until:
            stop_process(process, grace=5)
            tail = log.read_text(errors="replace")[-2000:]
            ended = ExitedAtStart if process.returncode is not None else RuntimeError
            raise ended(f"{argv[0]} did not start: {tail}") from problem
        time.sleep(0.2)


def on_a_free_port(start: Callable[[int], T], tries: int = 3) -> T:
    """``start(port)`` on a port free on 127.0.0.1 now; on another one when the server
    exited at start (:class:`ExitedAtStart`): a port is free only when it is picked, and
    another process may bind it before the server does (``bind(0)`` of the tests' other
    servers on a busy machine, during the seconds an interpreter takes to start)."""
    for attempt in range(1, tries + 1):
        try:
            return start(free_port())
        except ExitedAtStart:
            if attempt == tries:
                raise
    raise AssertionError("not reached")
