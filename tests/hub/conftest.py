"""Hub-side fixtures: stores built with ``cmh.hub.mirror`` and a real ``cmh serve`` on 127.0.0.1.

Fixtures for every hub-side test (mirror, resolver, pruner):

- ``mirror_server_factory(store, tokens=None, workers=1, extra_args=())`` starts a
  :class:`~mirror_support.MirrorServer` (``.url``, ``.count(route=..., method=...,
  status=...)`` from ``/metrics``, ``.log(**fields)`` from the JSON access log,
  ``.stop()``); every server started is stopped at teardown.
- ``mirror_store``: a session-wide, read-only store holding the real MiniLM model as
  ``sentence-transformers/all-MiniLM-L6-v2``, ``cmh-test/tiny`` (branches ``main``
  and ``v1``, nested folders), the dataset ``cmh-test/data`` and the private
  ``cmh-test/private`` (token :data:`PRIVATE_TOKEN`, in ``mirror_store.tokens``).
- ``mirror``: one session-wide server over ``mirror_store`` (read-only: do not
  change that store; build your own with ``add_folder`` for writes).
- ``web_store`` / ``web_server``: the web pages' store and one server over it
  (tokens, admin tokens, trusted key); see ``web_support``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The fleet fixtures ask for the test module's own ``origin`` (fleet_support.origin).
from fleet_support import any_fleet_fixture, fleet_fixture  # noqa: F401 (fixtures)
from ministackserver import ministack_bucket_fixture, ministack_fixture  # noqa: F401
from mirror_support import (
    MirrorServer,
    MirrorStore,
    ProcessClock,
    build_mirror_store,
    stop_servers,
    write_tiny_repo,
)
from motoserver import moto_bucket_fixture, moto_fixture, no_cas_bucket_fixture  # noqa: F401

# One SeaweedFS for the whole session: defined here once (a module importing the
# fixture itself would get a server of its own, alive until the session ends).
from seaweed import seaweed_bucket_fixture, seaweed_fixture  # noqa: F401 (fixtures)
from web_support import WebStore, build_web_store


@pytest.fixture(scope="session")
def mirror_store(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> MirrorStore:
    """The shared read-only test store."""
    return build_mirror_store(tmp_path_factory.mktemp("mirror"), minilm_dir)


@pytest.fixture(scope="session")
def mirror(
    mirror_store: MirrorStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MirrorServer]:
    """One ``cmh serve`` over ``mirror_store`` for the whole session."""
    logs = tmp_path_factory.mktemp("mirror-logs")
    with MirrorServer(mirror_store.path, logs, tokens=mirror_store.tokens) as server:
        yield server


@pytest.fixture
def mirror_server_factory(tmp_path: Path) -> Iterator[Callable[..., MirrorServer]]:
    """Start ``cmh serve`` processes on 127.0.0.1 (stopped at teardown)."""
    started: list[MirrorServer] = []

    def start(
        store: Path,
        tokens: Path | None = None,
        workers: int = 1,
        extra_args: tuple[str, ...] = (),
        clock: ProcessClock | None = None,
    ) -> MirrorServer:
        server = MirrorServer(
            store, tmp_path / "mirror-logs", tokens=tokens, workers=workers,
            extra_args=extra_args, clock=clock,
        )  # fmt: skip
        started.append(server)
        return server

    yield start
    stop_servers(started)


@pytest.fixture
def process_clock(tmp_path: Path) -> ProcessClock:
    """The clock of the servers a test starts with ``clock=process_clock``: it advances it."""
    return ProcessClock(tmp_path / "process-clock")


@pytest.fixture
def tiny_src(tmp_path: Path) -> Path:
    """A fresh copy of the tiny repo folder (version 1) to import or change."""
    return write_tiny_repo(tmp_path / "tiny-src", 1)


@pytest.fixture
def copy_store(tmp_path: Path) -> Callable[[Path], Path]:
    """Copy a store (keeping its symlinks) to a private writable folder."""

    def copy(store: Path) -> Path:
        dest = tmp_path / f"store-copy-{len(list(tmp_path.glob('store-copy-*')))}"
        shutil.copytree(store, dest, symlinks=True)
        return dest

    return copy


@pytest.fixture(scope="session")
def web_store(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> WebStore:
    """The web pages' test store (see ``web_support``): public, private, expired, hostile card."""
    return build_web_store(tmp_path_factory.mktemp("web"), minilm_dir)


@pytest.fixture(scope="session")
def web_server(
    web_store: WebStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MirrorServer]:
    """One ``cmh serve`` over ``web_store`` with tokens, admin tokens and the signer's key."""
    pages = ("--admin-tokens", str(web_store.admin_tokens), "--key", str(web_store.public_key))
    logs = tmp_path_factory.mktemp("web-logs")
    with MirrorServer(web_store.path, logs, tokens=web_store.tokens, extra_args=pages) as server:
        yield server
