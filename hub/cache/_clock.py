"""The one clock that TTLs, freshness, leases and retry waits are measured on.

Code that decides by elapsed time (a mirror's upstream freshness, a bucket
lease, a negative cache) takes a :class:`Clock` instead of calling
:mod:`time`, so a test passes one that it moves forward itself instead of
sleeping. :data:`SYSTEM_CLOCK` is the real one.

A test cannot hand an object to another process, so :func:`process_clock`
gives a process the real clock shifted by the seconds written in the file
that ``CMH_TEST_CLOCK_FILE`` names (a test writes ``3600`` there to make a
``cmh serve`` it started live an hour later). The file is read only when
``CMH_TEST_HOOKS=1`` is set as well (the test helpers set both): one variable
left in a production environment by mistake moves no clock. Otherwise it is
:data:`SYSTEM_CLOCK`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CLOCK_FILE_ENV = "CMH_TEST_CLOCK_FILE"
#: The switch without which no test hook (:data:`CLOCK_FILE_ENV`) is honoured: ``1``.
TEST_HOOKS_ENV = "CMH_TEST_HOOKS"


class Clock:
    """Wall time, monotonic time and sleep: the real ones (subclass to move them)."""

    def time(self) -> float:
        """Unix seconds, for what is stored (``fresh_until``, a validation's ``at``)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for what one process measures."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = Clock()


class ShiftedClock(Clock):
    """The real clock plus the seconds written in ``path`` (read at every look; 0 if unreadable)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def offset(self) -> float:
        try:
            return float(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def time(self) -> float:
        return time.time() + self.offset()

    def monotonic(self) -> float:
        return time.monotonic() + self.offset()


def process_clock() -> Clock:
    """This process's clock: :data:`SYSTEM_CLOCK`, or shifted as ``CMH_TEST_CLOCK_FILE`` says
    when ``CMH_TEST_HOOKS=1`` is set too."""
    path = os.environ.get(CLOCK_FILE_ENV)
    if not path or os.environ.get(TEST_HOOKS_ENV) != "1":
        return SYSTEM_CLOCK
    return ShiftedClock(Path(path))
