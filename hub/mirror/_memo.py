"""The mirror's one bounded cache: thread-safe, least recently used first out, optionally timed.

Every per-worker cache of the mirror (card fields, parameter counts, rendered
cards, stamp details, check outcomes, fingerprints, bucket refs and trees) is
a :class:`Memo`. The eviction and expiry are ``cachetools``' ``LRUCache`` and
``TTLCache``; this adds the lock they lack and the one access pattern the
callers share: the value kept for a key, else one computed and kept.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from cachetools import Cache, LRUCache, TTLCache
from cmh.hub.cache import SYSTEM_CLOCK

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """At most ``size`` values by key (with ``weight``: values weighing ``size`` in all, a
    value heavier than that alone is not kept); with ``ttl``, each expires ``ttl`` seconds
    of ``timer`` after it was put. Safe to use from several threads."""

    def __init__(
        self,
        size: int,
        ttl: float | None = None,
        timer: Callable[[], float] = SYSTEM_CLOCK.monotonic,
        weight: Callable[[V], int] | None = None,
    ) -> None:
        self.size, self.ttl, self.weight = size, ttl, weight
        self._lock = threading.Lock()
        self._computing = KeyedLocks[K]()
        self._items: Cache[K, V] = (
            LRUCache(size, getsizeof=weight)
            if ttl is None
            else TTLCache(size, ttl, timer=timer, getsizeof=weight)
        )

    def _keep(self, key: K, value: V) -> None:
        """Keep ``value`` (the lock held); one too heavy for the whole memo is not kept."""
        if self.weight is not None and self.weight(value) > self.size:
            self._items.pop(key, None)
            return
        self._items[key] = value

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now most recently used), or ``None``."""
        with self._lock:
            return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key``; the least recently used value goes when full."""
        with self._lock:
            self._keep(key, value)

    def drop(self, key: K) -> None:
        with self._lock:
            self._items.pop(key, None)

    def get_or_compute(self, key: K, compute: Callable[[], V], *, exclusive: bool = False) -> V:
        """The value kept for ``key``, else ``compute()``, kept when it returns (an exception
        keeps nothing). ``compute`` runs outside the lock, so a slow one holds up no other
        key; with ``exclusive``, a key is computed once even when asked for by several
        threads at once (they wait for that key only: other keys go on)."""
        with self._lock:
            if key in self._items:
                return self._items[key]
        if exclusive:
            with self._computing.hold(key):
                with self._lock:
                    if key in self._items:
                        return self._items[key]
                value = compute()
                with self._lock:
                    self._keep(key, value)
                return value
        value = compute()
        with self._lock:
            self._keep(key, value)
        return value

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class KeyedLocks(Generic[K]):
    """One lock per key, kept only while a thread holds or waits for it: the locks never
    outnumber the threads using them, whatever keys a remote party chooses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[K, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: K) -> Iterator[None]:
        """Hold the lock of ``key`` (waiting for another holder of the same key only)."""
        with self._lock:
            lock, users = self._held.get(key, (None, 0))
            if lock is None:
                lock = threading.Lock()
            self._held[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                lock, users = self._held[key]
                if users == 1:
                    del self._held[key]
                else:
                    self._held[key] = (lock, users - 1)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
