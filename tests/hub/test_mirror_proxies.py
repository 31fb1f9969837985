"""The per-client compute limit behind a reverse proxy (``cmh serve --trusted-proxy``).

The limit was keyed by the peer's address, so behind nginx every client shared one.
A forwarded client address is believed only from a named proxy (deny by default).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from cmh.hub.mirror._connections import TrustedProxies


@pytest.mark.parametrize(
    ("trusted", "peer", "forwarded", "client"),
    [
        ((), "127.0.0.1", ["198.51.100.1"], "127.0.0.1"),  # deny by default
        (("127.0.0.2",), "127.0.0.1", ["198.51.100.1"], "127.0.0.1"),  # an untrusted peer
        (("127.0.0.1",), "127.0.0.1", [], "127.0.0.1"),  # no header: the proxy itself
        (("127.0.0.1",), "127.0.0.1", ["198.51.100.1"], "198.51.100.1"),
        # what the client claims (left) is not believed: the last untrusted hop is
        (("127.0.0.1",), "127.0.0.1", ["6.6.6.6, 198.51.100.1"], "198.51.100.1"),
        (("127.0.0.1",), "127.0.0.1", ["6.6.6.6", "198.51.100.1"], "198.51.100.1"),
        # two trusted proxies in a row (a network)
        (("127.0.0.1", "10.0.0.0/8"), "127.0.0.1", ["6.6.6.6, 198.51.100.1, 10.1.2.3"],
         "198.51.100.1"),
        (("127.0.0.1", "10.0.0.0/8"), "127.0.0.1", ["10.9.9.9"], "10.9.9.9"),  # all trusted
        (("127.0.0.1",), "127.0.0.1", ["198.51.100.1, junk"], "127.0.0.1"),  # not an address
        (("127.0.0.1",), "::ffff:127.0.0.1", ["2001:db8::1"], "2001:db8::1"),  # mapped peer
    ],
)  # fmt: skip
def test_the_client_is_the_last_untrusted_hop(
    trusted: tuple[str, ...], peer: str, forwarded: list[str], client: str
) -> None:
    assert TrustedProxies.parse(trusted).client(peer, forwarded) == client


def test_a_trusted_proxy_must_be_an_address_or_a_network(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from cmh.cli.main import cli

    with pytest.raises(ValueError, match="not an IP address or network"):
        TrustedProxies.parse(["proxy.example"])
    store = tmp_path / "store"
    store.mkdir()
    result = CliRunner().invoke(
        cli, ["serve", "--store", str(store), "--port", "0", "--trusted-proxy", "nginx"]
    )
    assert result.exit_code == 2, result.output
    assert "--trusted-proxy: 'nginx' is not an IP address" in result.output
    assert "Traceback" not in result.output


def test_serve_passes_its_trusted_proxies_to_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner
    from cmh.cli.main import cli
    from cmh.hub.mirror import _run

    seen: list[Any] = []

    def worker(config: Any, sock: Any, on_ready: Any) -> int:
        sock.close()
        seen.append(_run._proxies(config))
        return 0

    monkeypatch.setattr(_run, "_run_worker", worker)
    store = tmp_path / "store"
    store.mkdir()
    args = ["serve", "--store", str(store), "--port", "0"]
    args += ["--trusted-proxy", "127.0.0.1", "--trusted-proxy", "10.0.0.0/8"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert seen == [TrustedProxies.parse(["127.0.0.1", "10.0.0.0/8"])]


@pytest.mark.parametrize(
    ("trusted", "keys"),
    [
        (("127.0.0.1",), ["198.51.100.1", "198.51.100.2"]),  # two clients, two limits
        ((), ["127.0.0.1"]),  # the header is ignored by default
        (("127.0.0.2",), ["127.0.0.1"]),  # and from a peer that is not a trusted proxy
    ],
)
def test_clients_behind_a_trusted_proxy_get_a_limit_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trusted: tuple[str, ...], keys: list[str]
) -> None:
    """Two fingerprint requests from two clients behind one proxy (the test's connections
    from 127.0.0.1, each with its ``X-Forwarded-For``), one computation per client at
    most: behind a trusted proxy both compute at once; otherwise they are one client,
    and the second waits for the first."""
    import aiohttp
    from aiohttp.test_utils import TestServer
    from cmh.hub.mirror import _fingerprints
    from cmh.hub.mirror._app import MirrorState, make_app
    from cmh.hub.mirror._auth import AccessPolicy
    from cmh.hub.mirror._compute import ComputePool
    from cmh.hub.mirror._observe import Metrics
    from cmh.hub.mirror.stores import open_store
    from cmh.hub.mirror.stores.local._folder import add_folder
    from mirror_support import write_tiny_repo

    import cmh.semantic

    store = tmp_path / "store"
    for i in range(2):
        add_folder(store, write_tiny_repo(tmp_path / f"src{i}", i), f"o/r{i}")
    release = threading.Event()
    started: list[int] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        started.append(1)
        release.wait(60)
        raise cmh.semantic.SemanticError("held")

    monkeypatch.setattr(_fingerprints, "_in_process", held)  # the computation, in-thread
    pool = ComputePool(workers=2, per_client=1, proxies=TrustedProxies.parse(trusted))

    async def until(condition: Any) -> None:
        async with asyncio.timeout(30):
            while not condition():
                await asyncio.sleep(0.01)

    async def run() -> tuple[list[str], int, list[int]]:
        state = MirrorState(open_store(store), AccessPolicy({}), Metrics(None), compute=pool)
        server = TestServer(make_app(state), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                base = str(server.make_url(""))
                asks = [
                    asyncio.ensure_future(
                        session.get(
                            f"{base}/api/cmh/fingerprint/o/r{i}/main",
                            # what the client claims, then what the proxy saw
                            headers={"X-Forwarded-For": f"6.6.6.6, 198.51.100.{i + 1}"},
                        )
                    )
                    for i in range(2)
                ]
                # both requests have asked for their turn (running or waiting)
                await until(lambda: sum(u for _, u in pool._clients.values()) == 2)
                clients = sorted(pool._clients)
                if clients == keys:
                    await until(lambda: len(started) >= len(keys))
                computing = len(started)
                release.set()
                answers = await asyncio.gather(*asks)
                for a in answers:
                    a.release()
                return clients, computing, [a.status for a in answers]
        finally:
            release.set()
            await server.close()
            pool.close()

    clients, computing, statuses = asyncio.run(run())
    assert clients == keys
    # one computation per client at once: as many running as there are clients (when
    # they are one client, the second request is still waiting for its turn)
    assert computing == len(keys)
    assert statuses == [422, 422]
