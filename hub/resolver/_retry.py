"""The one retry policy of the resolver: backoff with jitter, ``Retry-After`` honoured and capped.

A transfer that fails with :class:`~cmh.hub.resolver._types.HubUnreachableError`
(connection lost, timeout, 429, 5xx) is tried again after a pause. The pause
is the server's ``Retry-After`` when the answer carried one, capped at
:attr:`RetryPolicy.max_retry_after`; otherwise a backoff that doubles per
attempt from :attr:`RetryPolicy.base_delay` up to :attr:`RetryPolicy.max_delay`,
of which a random half is skipped (jitter), so clients that failed together do
not come back together.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from cmh.hub.cache import SYSTEM_CLOCK, Clock

from ._types import HubUnreachableError

T = TypeVar("T")

_logger = logging.getLogger("cmh.hub")


@dataclass(frozen=True)
class RetryPolicy:
    """How often to try a transfer and how long to wait between tries."""

    attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 1.0
    max_retry_after: float = 10.0
    #: The clock of the deadlines and waits (the policy's: :class:`~cmh.hub.cache.Clock`).
    clock: Clock = field(default=SYSTEM_CLOCK, repr=False, compare=False)
    #: How to wait (``clock.sleep`` when None; a test may pass a recorder that also waits).
    sleep: Callable[[float], None] | None = field(default=None, repr=False, compare=False)

    def delay(self, attempt: int, error: BaseException) -> float:
        """Seconds to wait after failed try number ``attempt`` (0-based) ended with ``error``."""
        retry_after = error.retry_after if isinstance(error, HubUnreachableError) else None
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_retry_after)
        backoff = min(self.max_delay, self.base_delay * 2.0**attempt)
        return backoff / 2 + random.uniform(0.0, backoff / 2)

    def tries(self) -> Iterator[int]:
        """Attempt numbers ``0 .. attempts-1`` for a loop that calls :meth:`wait` on failure."""
        return iter(range(self.attempts))

    def wait(
        self,
        attempt: int,
        error: BaseException,
        what: str = "the Hub",
        pause: float | None = None,
    ) -> None:
        """Sleep before the next try, unless ``attempt`` was the last one: ``pause`` when
        given (the delay a deadline was checked against: one random draw), else a delay."""
        if attempt + 1 < self.attempts:
            pause = self.delay(attempt, error) if pause is None else pause
            seconds = f"{pause:.1f}" if pause < 10 else f"{pause:.0f}"
            _tell_waiting(f"{what}: {error}, retry {attempt + 2} of {self.attempts} in {seconds} s")
            (self.sleep or self.clock.sleep)(pause)

    def run(
        self,
        step: Callable[[], T],
        what: str,
        deadline: float | None = None,
        *,
        notice: bool = True,
    ) -> T:
        """``step()``, tried again on a transient :class:`HubUnreachableError` until the
        attempts run out (one that is not ``transient`` is raised at once), or, with a
        ``deadline`` (a ``clock.monotonic()`` value), until the next try would start past it.
        ``notice``: tell when a try has no answer within seconds (off for a step that
        streams a body, whose length says nothing of an answer)."""
        last: HubUnreachableError | None = None
        start = self.clock.monotonic()
        for attempt in self.tries():
            timer = no_answer_notice(what, attempt, self.attempts) if notice else None
            try:
                return step()
            except HubUnreachableError as exc:
                if not exc.transient:
                    raise
                last = exc
                now = self.clock.monotonic()
                pause = self.delay(attempt, exc)  # drawn once: checked, then slept
                if deadline is not None and now + pause >= deadline:
                    spent = now - start
                    raise HubUnreachableError(
                        f"{what}: gave up after {spent:.1f} s, try {attempt + 1} of "
                        f"{self.attempts} (the deadline comes before the next): {last}"
                    ) from last
                self.wait(attempt, exc, what, pause)
            finally:
                if timer is not None:
                    timer.cancel()
        raise HubUnreachableError(f"{what} failed after {self.attempts} tries: {last}") from last


#: The policy every transfer of the resolver uses.
DEFAULT_RETRY = RetryPolicy()


# -- waiting notices ---------------------------------------------------------------------
# A person at a terminal should hear within seconds that a request has no answer yet
# (``cmh pull`` prints "waiting for ...: no answer yet"). The CLI registers a listener;
# with none registered (the library's default) the no-answer notice goes to the
# ``cmh.hub`` logger as a warning and retry lines are not told.

#: Seconds a try may go without an answer before the listeners hear of it.
NO_ANSWER_NOTICE = 3.0

_listeners: list[Callable[[str], None]] = []


def add_wait_listener(listener: Callable[[str], None]) -> Callable[[], None]:
    """Call ``listener("<what>: <why>, retry N of M in S s")`` on waits; returns a remover."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener) if listener in _listeners else None


def _tell_waiting(message: str) -> None:
    for listener in list(_listeners):
        listener(message)


def no_answer_notice(what: str, attempt: int, attempts: int) -> threading.Timer:
    """A timer telling the listeners (else the ``cmh.hub`` logger) that try ``attempt`` of
    ``what`` has no answer yet."""
    message = (
        f"{what}: no answer yet after {NO_ANSWER_NOTICE:.0f} s (try {attempt + 1} of {attempts})"
    )
    tell = _tell_waiting if _listeners else _logger.warning
    timer = threading.Timer(NO_ANSWER_NOTICE, tell, (message,))
    timer.daemon = True
    timer.start()
    return timer
