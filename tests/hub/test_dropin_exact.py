"""Drop-in exactness, part two (issue 26): what a stock client sees under ``install()``.

Each test reproduces one way the hook differed from the stock client: the cache
folder a caller names, offline errors, the agent harness registry, requests
wasted, warnings and labels.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mirror_support import MirrorServer, hf_env, run_python

REGISTRY = {"standardEnvVars": ["AI_AGENT"], "harnesses": {"cmh-test": {"envVars": {"T": "*"}}}}


@pytest.fixture
def registry_upstream() -> Iterator[tuple[str, list[str]]]:
    """A loopback upstream answering only ``/api/agent-harnesses`` (and the paths it saw)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.path)
            body = json.dumps(REGISTRY if self.path == "/api/agent-harnesses" else {}).encode()
            self.send_response(200 if self.path == "/api/agent-harnesses" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- item 4: /api/agent-harnesses ------------------------------------------------------------

HARNESS_SCRIPT = r"""
import json
from huggingface_hub import constants
from huggingface_hub.utils._detect_agent import detect_agent
agent = detect_agent()
print(json.dumps({"agent": agent, "cached": json.load(open(constants.AGENT_HARNESSES_PATH))}))
"""


def test_mirror_answers_an_empty_agent_registry_that_the_stock_client_caches(
    mirror: MirrorServer, tmp_path: Path
) -> None:
    answer = httpx2.get(f"{mirror.url}/api/agent-harnesses", timeout=10)
    assert answer.status_code == 200
    assert answer.json() == {"standardEnvVars": [], "harnesses": {}}
    env = dict(hf_env(mirror.url, tmp_path / "home"), AI_AGENT="1")
    mark = len(mirror.log())
    first = run_python(HARNESS_SCRIPT, env)
    second = run_python(HARNESS_SCRIPT, env)
    assert first["cached"] == second["cached"] == {"standardEnvVars": [], "harnesses": {}}
    asked = [e for e in mirror.log()[mark:] if "agent-harnesses" in (e.get("target") or "")]
    assert len(asked) == 1, asked  # the second process read the cached answer


def test_pullthrough_mirror_answers_the_upstreams_agent_registry(
    registry_upstream: tuple[str, list[str]],
    mirror_server_factory: Callable[..., MirrorServer],
    tmp_path: Path,
) -> None:
    upstream, seen = registry_upstream
    (tmp_path / "pull").mkdir()
    pull = mirror_server_factory(tmp_path / "pull", extra_args=("--upstream", upstream))
    env = dict(hf_env(pull.url, tmp_path / "home"), AI_AGENT="cmh-test")
    got = run_python(HARNESS_SCRIPT, env)
    assert got == {"agent": "cmh-test", "cached": REGISTRY}
    assert seen == ["/api/agent-harnesses"]


def test_pullthrough_registry_of_a_failing_upstream_is_a_typed_503(
    mirror_server_factory: Callable[..., MirrorServer], tmp_path: Path
) -> None:
    import socket

    with socket.socket() as silent:  # a loopback port that refuses connections
        silent.bind(("127.0.0.1", 0))
        port = silent.getsockname()[1]
    (tmp_path / "pull").mkdir()
    pull = mirror_server_factory(
        tmp_path / "pull", extra_args=("--upstream", f"http://127.0.0.1:{port}")
    )
    answer = httpx2.get(f"{pull.url}/api/agent-harnesses", timeout=60)
    assert answer.status_code == 503
    assert answer.headers["X-Error-Code"] == "UpstreamUnavailable"
