"""The one retry policy of the resolver: backoff with jitter, ``Retry-After`` honoured and capped.

A transfer that fails with :class:`~cmh.hub.resolver.types.HubUnreachableError`
(connection lost, timeout, 429, 5xx) is tried again after a pause. The pause
is the server's ``Retry-After`` when the answer carried one, capped at
:attr:`RetryPolicy.max_retry_after`; otherwise a backoff that doubles per
attempt from :attr:`RetryPolicy.base_delay` up to :attr:`RetryPolicy.max_delay`,
of which a random half is skipped (jitter), so clients that failed together do
not come back together.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from .types import HubUnreachableError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often to try a transfer and how long to wait between tries."""

    attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 1.0
    max_retry_after: float = 10.0
    #: How to wait (``time.sleep``; a test may pass a recorder that also waits).
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

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

    def wait(self, attempt: int, error: BaseException) -> None:
        """Sleep before the next try, unless ``attempt`` was the last one."""
        if attempt + 1 < self.attempts:
            self.sleep(self.delay(attempt, error))

    def run(self, step: Callable[[], T], what: str, deadline: float | None = None) -> T:
        """``step()``, tried again on a transient :class:`HubUnreachableError` until the
        attempts run out (one that is not ``transient`` is raised at once), or, with a
        ``deadline`` (a ``time.monotonic()`` value), until the next try would start past it."""
        last: HubUnreachableError | None = None
        start = time.monotonic()
        for attempt in self.tries():
            try:
                return step()
            except HubUnreachableError as exc:
                if not exc.transient:
                    raise
                last = exc
                if deadline is not None and time.monotonic() + self.delay(attempt, exc) >= deadline:
                    spent = time.monotonic() - start
                    raise HubUnreachableError(
                        f"{what}: gave up after {spent:.1f} s ({attempt + 1} tries): {last}"
                    ) from last
                self.wait(attempt, exc)
        raise HubUnreachableError(f"{what} failed after {self.attempts} attempts: {last}") from last


#: The policy every transfer of the resolver uses.
DEFAULT_RETRY = RetryPolicy()
