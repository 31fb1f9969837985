"""A Hub that never answers costs ``cmh pull`` HF_HUB_ETAG_TIMEOUT from the process's
start (interpreter and imports included), not from its first request (issue 35).

The listener that never answers is on 127.0.0.1; time is the injected clock's, or the
budget's own words: no assertion on wall time (bench/bounds.py measures it)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CMH
from mirror_support import ManualClock

from cmh import hub


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A loopback listener that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_the_budget_runs_from_the_process_start_not_the_first_request(
    tmp_path: Path, silent_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process started 9.8 s ago (on the injected clock) with a 10 s budget: the
    silent Hub gets what is left, 0.2 s, and the error says whose budget ran out (the
    old code gave it 10 s from the first request)."""
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "10")
    clock = ManualClock()
    start = clock.now
    policy = hub.Policy(clock=clock, started=start - 9.8)
    with pytest.raises(hub.HubUnreachableError, match="of the process's start") as caught:
        hub.resolve("org/x", endpoint=silent_url, cache_dir=tmp_path / "c", policy=policy)
    assert "HF_HUB_ETAG_TIMEOUT (10 s)" in str(caught.value)
    assert clock.now - start <= 0.2 + 1e-9  # no wait on the clock past the budget
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("snapshots/*"))


def test_cmh_pull_says_the_budget_from_its_start_ran_out(tmp_path: Path, silent_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "home"), HF_ENDPOINT=silent_url, HF_HUB_ETAG_TIMEOUT="3")
    argv = [str(CMH), "pull", "org/x", "--cache-dir", str(tmp_path / "c")]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "no answer within HF_HUB_ETAG_TIMEOUT (3 s) of the process's start" in done.stderr


def test_a_refused_connection_is_told_as_refused_not_as_a_timeout(tmp_path: Path) -> None:
    """A port nobody listens on refuses at once: the error says so, not that the budget
    from the process's start ran out (it did not)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_HOME=str(tmp_path / "home"), HF_ENDPOINT=refused)
        argv = [str(CMH), "pull", "org/x", "--cache-dir", str(tmp_path / "c")]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "Connection refused" in done.stderr, done.stderr
    assert "no answer within" not in done.stderr, done.stderr
