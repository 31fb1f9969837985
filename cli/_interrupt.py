"""Ctrl-C for long commands: stop at once, keep what is finished, say how to resume, exit 130.

Python's default answer to Ctrl-C is a ``KeyboardInterrupt`` in the main
thread only: worker threads (parallel range connections, hashing threads)
carry on, and the interpreter waits for them before it exits, so a download
went on for tens of seconds after the bar froze. :func:`stop_on_interrupt`
replaces that for the span of a command:

- the first Ctrl-C (SIGINT) prints ``interrupted: <what is kept and how to
  resume>`` on stderr and raises ``KeyboardInterrupt`` in the main thread,
  so ``finally`` blocks there run (temporary files are removed);
- whatever still runs after :data:`GRACE` seconds is ended with
  ``os._exit(130)``: every transfer stops within a second. That is safe
  because everything the commands keep is already crash-safe on disk (the
  resolver logs a chunk only once it is written, blobs and stamped files are
  installed by an atomic rename), which a ``kill -9`` relies on too;
- a second Ctrl-C exits 130 at once.

In-process callers that are not the main thread (click's test runner in a
worker thread) get no handler; the command runs as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130
#: Seconds the main thread gets to clean up before the process ends.
GRACE = 0.5


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit_now() -> None:
    from cmh import remove_temporaries

    remove_temporaries()  # os._exit runs no finally: a first stamp's copy would stay
    _flush()
    os._exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def stop_on_interrupt(resume: str | Callable[[], str]) -> Iterator[None]:
    """Within the block, Ctrl-C ends the process with 130 within :data:`GRACE` s.

    ``resume`` says what is kept and how to go on, e.g. ``"finished chunks are
    kept; run the same command again to resume"``; a callable is asked when Ctrl-C
    comes (in the main thread, whose work stops there), so it can look at what is kept.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = threading.Event()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if fired.is_set():
            _exit_now()
        fired.set()
        from ._common import BARS_STOPPED

        BARS_STOPPED.set()  # before the line: no bar is drawn over or after it
        with contextlib.suppress(Exception):
            sys.stderr.write(f"\ninterrupted: {resume() if callable(resume) else resume}\n")
        _flush()
        timer = threading.Timer(GRACE, _exit_now)
        timer.daemon = True
        timer.start()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except BaseException:
        # Once Ctrl-C fired, whatever ends the block ends the process with 130: the
        # interrupt itself, or an error its unwinding raised instead (an mmap closed while
        # a hashing thread still holds a view of it raises BufferError). Else it is not ours
        # (a test, a nested handler, a plain error): raised on.
        if not fired.is_set():
            raise
        _exit_now()
    finally:
        signal.signal(signal.SIGINT, previous)
