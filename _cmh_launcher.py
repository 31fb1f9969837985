"""The ``cmh`` console script: Ctrl-C is handled before anything heavy is imported.

Importing the command line imports ``cmh`` and click (about half a second on a
cold start, longer on a busy machine); with Python's default handler a Ctrl-C
in that time printed a ``KeyboardInterrupt`` traceback from inside an import
and exited 1. This module lives outside the ``cmh`` package so that importing
it imports nothing of it: it installs a SIGINT handler first, which prints one
line and exits 130 (removing any temporary a file write has open) whenever no
command has installed its own (``cmh.cli._interrupt.stop_on_interrupt``).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any

#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C outside a command's own handling: one line, exit 130."""
    cmh = sys.modules.get("cmh")
    remove = getattr(cmh, "remove_temporaries", None)
    if remove is not None:  # os._exit runs no finally block
        remove()
    try:
        sys.stderr.write("\ninterrupted\n")
        sys.stderr.flush()
    except Exception:  # a closed or broken stderr must not hide the exit status
        pass
    os._exit(EXIT_INTERRUPTED)


def main() -> Any:
    """Install the Ctrl-C handler, then run ``cmh.cli.main.main``."""
    signal.signal(signal.SIGINT, _interrupted)
    from cmh.cli.main import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
