"""The resolver's lifetime and revalidation window pass on ``Policy.clock`` (issue 34).

One clock per process, passed down: a test moves it instead of sleeping.
"""

from __future__ import annotations

from pathlib import Path

import cmh.hub as hub
from cmh.hub.mirror import add_folder
from cmh.hub.resolver import _window
from mirror_support import ManualClock
from resolver_support import write_checkpoint_repo

REPO = "org/toy"
COMMIT = "a" * 40


def test_resolver_lifetime_passes_on_the_policys_clock(tmp_path: Path, mirror_server_factory):
    store = tmp_path / "store"
    add_folder(store, write_checkpoint_repo(tmp_path / "v1", 1, stamp=False), REPO)
    server = mirror_server_factory(store)
    clock = ManualClock()
    policy = hub.Policy(default_lifetime=60, clock=clock)
    cache = tmp_path / "cache"
    first = hub.resolve(REPO, cache_dir=cache, endpoint=server.url, policy=policy)
    assert first.state is hub.State.MISSING and first.expires_at == clock.now + 60
    clock.advance(59)
    kept = hub.resolve(REPO, cache_dir=cache, endpoint=server.url, policy=policy)
    assert kept.state is hub.State.LOCAL_ONLY and kept.requests == 0
    clock.advance(2)  # the lifetime passed on the policy's clock, not on the wall's
    again = hub.resolve(REPO, cache_dir=cache, endpoint=server.url, policy=policy)
    assert again.state is not hub.State.LOCAL_ONLY and again.requests >= 1


def test_revalidation_window_is_measured_on_the_installed_policys_clock() -> None:
    clock = ManualClock()
    root = Path("/nonexistent/cache")
    _window.configure(10.0, hub.Policy(clock=clock))
    try:
        where = _window.Asked(root, "http://127.0.0.1:9", "model", REPO, "main")
        _window.remember_commit(where, COMMIT, credential="")
        clock.advance(9.5)
        assert _window.recent_commit(where, credential="") == COMMIT
        assert _window.recent_commit(where, credential="sha256:other") is None  # its own
        clock.advance(1.0)
        assert _window.recent_commit(where, credential="") is None
    finally:
        _window.configure(_window.DEFAULT_WINDOW, None)
        _window.forget()
