"""Card rendering in child processes, each render within a total deadline.

markdown-it-py is pure Python, and some card shapes cost tens of microseconds a line
while staying under every count :mod:`~._cards` checks: 512 KiB of a one-column
table took 26 s of CPU, of ``# a`` headings 6.7 s, of ``- a`` items 8.2 s, a highlighted
fenced block 14 s. A thread cannot be stopped, so a card is rendered in a child process
(``spawn``, never a fork of the threaded server) that is ended when its deadline
passes: :data:`RENDER_SECONDS` after the body was handed to it. The card is then shown
as text, and kept so, like any card (one rendering per blob, not one per view).

At most :data:`RENDER_WORKERS` children render at once in one worker, apart from the
compute pool (fingerprints never wait on a card). A page waits at most
:data:`RENDER_SECONDS` for a free child; past that its card is shown as text for that
view only (not kept), so a page waits at most twice :data:`RENDER_SECONDS` for its card.
A child is started on first use and kept for the next card; one ended at its deadline
is replaced on the next use.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._cards import Rendered

#: Seconds a card's rendering may take (its child process is ended then), and seconds a
#: page waits for a child to be free.
RENDER_SECONDS = 2.0
#: Children rendering cards at once in one worker.
RENDER_WORKERS = 1
#: Seconds a child may take to start (a new Python importing markdown-it-py and Pygments).
START_SECONDS = 30.0


class RendererBusy(Exception):
    """No child was free (or could start) in time: the card is not rendered this time."""


#: Seconds between a child's looks at whether its server worker is still there.
ORPHAN_POLL = 0.5


def _end_with_parent(parent: int) -> None:
    """End this child as soon as the worker that started it is gone (a worker ends with
    ``os._exit``, killed or not, so no cleanup of its own reaches a child mid-render)."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL)
    os._exit(0)


def _serve(conn: Connection, target: Callable[[str], Rendered]) -> None:
    """A child's loop: a body in, ``target(body)`` out, until the parent closes the pipe or
    is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle
    threading.Thread(target=_end_with_parent, args=(os.getppid(),), daemon=True).start()
    try:
        conn.send("ready")
        while True:
            body = conn.recv()
            conn.send(target(body))
    except (EOFError, OSError):  # the parent closed the pipe, ended it, or is gone
        return


class _Child:
    """One child process and the parent's end of its pipe."""

    def __init__(self, target: Callable[[str], Rendered]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process: Any = context.Process(
            target=_serve, args=(theirs, target), name="cmh-card", daemon=True
        )
        self.process.start()
        theirs.close()
        try:
            ready = self.conn.poll(START_SECONDS) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.stop()
            raise RendererBusy("a card renderer did not start")

    def ask(self, body: str, seconds: float) -> Rendered | None:
        """``target(body)`` from the child, or ``None`` when ``seconds`` passed first."""
        self.conn.send(body)
        if not self.conn.poll(seconds):
            return None
        result: Rendered = self.conn.recv()
        return result

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.process.kill()
            self.process.join(5)
        self.conn.close()


class CardRenderer:
    """Renders card bodies in child processes (:func:`~._cards.render_card_body`, or
    ``target``, a module-level function), at most ``workers`` at once, each ended after
    ``seconds``. Thread-safe; :meth:`render` blocks the calling thread (a page's). Light
    to make (``cmh serve`` makes one before its workers start): nothing is imported or
    started before the first card."""

    def __init__(
        self,
        workers: int = RENDER_WORKERS,
        seconds: float = RENDER_SECONDS,
        target: Callable[[str], Rendered] | None = None,
    ) -> None:
        self.workers, self.seconds, self.target = workers, seconds, target
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._idle: list[_Child] = []
        self._closed = False
        #: Bodies handed to a child (for tests and benchmarks).
        self.renders = 0

    def render(self, body: str) -> Rendered:
        """``body`` rendered by a child; past the deadline, a :class:`Rendered` without
        HTML that says so. Raises :class:`RendererBusy` when no child is free in time."""
        if not self._slots.acquire(timeout=self.seconds):
            raise RendererBusy("other cards are being rendered")
        try:
            child = self._take()
            with self._lock:
                self.renders += 1
            try:
                result = child.ask(body, self.seconds)
            except (EOFError, OSError):  # the child died mid-render (crashed, was killed)
                child.stop()
                return _rendered_none("the card cannot be rendered")
            if result is None:
                child.stop()
                return _rendered_none(f"the card takes longer than {self.seconds:g} s to render")
            self._give(child)
            return result
        finally:
            self._slots.release()

    def _take(self) -> _Child:
        with self._lock:
            if self._closed:
                raise RendererBusy("the server is stopping")
            if self._idle:
                return self._idle.pop()
        if self.target is None:
            from ._cards import render_card_body

            return _Child(render_card_body)
        return _Child(self.target)

    def _give(self, child: _Child) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(child)
                return
        child.stop()

    def close(self) -> None:
        """End the idle children; one rendering now is ended when its render returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for child in idle:
            child.stop()


def _rendered_none(problem: str) -> Rendered:
    from ._cards import Rendered

    return Rendered(None, problem=problem)
