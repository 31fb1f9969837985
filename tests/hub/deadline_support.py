"""The one deadline a test gives a thing it started to answer: a server, a process, a condition.

A deadline in a test exists to end a hang, not to measure speed. On a machine whose load
average is 15-27 on 2 cores (other work beside ``make test``), a step that takes 0.1 s on a
quiet machine can take tens of seconds, and a library's default (httpx: 5 s, a read timeout)
fires on a healthy server. So every wait for a local server, process or condition uses
:data:`TEST_DEADLINE` unless the deadline is the subject of the test, in which case that test
keeps its own bound and says why beside it.
"""

from __future__ import annotations

TEST_DEADLINE = 120.0
"""Seconds: generous, for a hang to end the test with a clear error rather than the suite's
600 s pytest-timeout."""
