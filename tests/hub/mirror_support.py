"""A real ``cmh serve`` process on 127.0.0.1 for tests, and helpers to talk to it.

Used through the fixtures of ``tests/hub/conftest.py``::

    def test_x(mirror_server_factory, tmp_path):
        store = tmp_path / "store"
        add_folder(store, some_dir, "org/name")
        server = mirror_server_factory(store)
        ... HF_ENDPOINT=server.url ...
        assert server.count(route="resolve", method="GET") == 3   # from /metrics
        assert [r["target"] for r in server.log(route="resolve")]  # the JSON access log
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import urlopen

from aiohttp import web
from cmh.hub.cache import CLOCK_FILE_ENV, TEST_HOOKS_ENV, Clock
from cmh.hub.mirror.stores.local._folder import ImportResult, add_folder
from deadline_support import TEST_DEADLINE

START_TIMEOUT = TEST_DEADLINE
_SAMPLE_RE = re.compile(r"^(\w+)\{([^}]*)\} ([0-9.e+-]+)$")
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


#: The start of a stock-client script for :func:`run_python`: ``sha256(path)`` of a file.
STOCK_PRELUDE = r"""
import hashlib, json, os

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
"""


def big_store(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    """A store (``tmp_path/upstream-store``) holding ``cmh-test/big``: ``size`` random bytes
    in ``big.bin`` and a small ``config.json``; and those bytes."""
    src = tmp_path / "big-src"
    src.mkdir()
    data = os.urandom(size)
    (src / "big.bin").write_bytes(data)
    (src / "config.json").write_text("{}\n")
    store = tmp_path / "upstream-store"
    add_folder(store, src, "cmh-test/big")
    return store, data


class ManualClock(Clock):
    """A clock of this process that moves only when told (``advance``) or when it sleeps."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now
        self.slept = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ProcessClock:
    """The clock of the processes a test starts with :attr:`env`: ``advance`` moves it.

    Written to the file ``CMH_TEST_CLOCK_FILE`` names (``cmh.hub.cache._clock``), which a
    ``cmh serve`` reads at each look at its clock: a test moves a server past a TTL at once.
    :attr:`env` also sets ``CMH_TEST_HOOKS=1``, without which the file is not read.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0.0
        self.advance(0.0)

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        scratch = self.path.with_suffix(".new")
        scratch.write_text(repr(self.offset))
        os.replace(scratch, self.path)  # a reader never sees a half-written offset

    @property
    def env(self) -> dict[str, str]:
        return {CLOCK_FILE_ENV: str(self.path), TEST_HOOKS_ENV: "1"}


class MirrorServer:
    """A ``cmh serve`` subprocess bound to 127.0.0.1 on a free port (on ``clock`` if given)."""

    def __init__(
        self,
        store: Path | str,  # a folder or a bucket store's s3:// URL
        log_dir: Path,
        *,
        tokens: Path | None = None,
        workers: int = 1,
        extra_args: tuple[str, ...] = (),
        clock: ProcessClock | None = None,
        env: dict[str, str] | None = None,  # the server's environment (else this process's)
    ) -> None:
        self.store = store
        self.workers = workers
        log_dir.mkdir(parents=True, exist_ok=True)
        self.access_log = log_dir / f"access-{uuid.uuid4().hex[:8]}.jsonl"
        self.stderr_path = self.access_log.with_suffix(".stderr")
        args = [
            sys.executable, "-m", "cmh.cli.main", "serve", "--store", str(store),
            "--host", "127.0.0.1", "--port", "0", "--workers", str(workers),
            "--access-log", str(self.access_log), *extra_args,
        ]  # fmt: skip
        if tokens is not None:
            args += ["--tokens", str(tokens)]
        given = os.environ if env is None else env
        env = {k: v for k, v in given.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        env.update(clock.env if clock is not None else {})
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115
        self._terminated = False
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True
        )
        self.url = self._wait_for_url()
        parts = urlsplit(self.url)
        self.host, self.port = parts.hostname or "127.0.0.1", int(parts.port or 80)

    def _wait_for_url(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        line = ""
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line:
                break
            if self.process.poll() is not None:
                break
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not match:
            self.stop()
            raise RuntimeError(f"cmh serve did not start: {line!r} {self.stderr_text()}")
        return match.group(0)

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- observation -------------------------------------------------------------------

    def sync(self) -> None:
        """Return once every request answered before this call is in the log and metrics.

        A worker logs (and counts) a request after its answer's last byte is out, so a
        client can have its answer before the line exists. A marker request logged by a
        worker shows that worker's earlier answers logged; with several workers, markers
        are asked (each on a new connection, which the kernel gives to any worker) until
        every worker has logged one: the one that answered a first marker says nothing of
        a descheduled other (a loaded run found a line missing after 40 requests)."""
        deadline = time.monotonic() + TEST_DEADLINE
        synced: set[int] = set()  # the workers (pids) that logged a marker
        while len(synced) < self.workers:
            marker = uuid.uuid4().hex
            with urlopen(f"{self.url}/health?sync={marker}", timeout=TEST_DEADLINE) as r:
                r.read()
            synced.add(_logged_by(self.access_log, marker, deadline))

    def log(self, **match: Any) -> list[dict[str, Any]]:
        """Access-log entries (one per request, oldest first) whose fields equal ``match``."""
        self.sync()
        out = []
        for line in self.access_log.read_text().splitlines():
            entry = json.loads(line)
            if all(entry.get(k) == v for k, v in match.items()):
                out.append(entry)
        return out

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Prometheus samples as ``{(name, sorted labels): value}``."""
        self.sync()
        with urlopen(f"{self.url}/metrics", timeout=TEST_DEADLINE) as r:
            text = r.read().decode()
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            m = _SAMPLE_RE.match(line)
            if m:
                labels = tuple(sorted(_LABEL_RE.findall(m.group(2))))
                out[(m.group(1), labels)] = float(m.group(3))
            elif line.strip():
                name, _, value = line.rpartition(" ")
                out[(name, ())] = float(value)
        return out

    def count(self, **labels: str) -> int:
        """Requests counted by ``/metrics`` whose route/method/status labels equal ``labels``."""
        total = 0.0
        for (name, sample_labels), value in self.metrics().items():
            if name != "cmh_mirror_requests_total":
                continue
            got = dict(sample_labels)
            if all(got.get(k) == str(v) for k, v in labels.items()):
                total += value
        return int(total)

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> MirrorServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def terminate(self) -> None:
        """SIGTERM the server without waiting (:meth:`stop` then waits): servers stopped
        together with :func:`stop_servers` spend their shutdowns at once."""
        if self.process.poll() is None and not self._terminated:
            self.process.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the server (once: not again after :meth:`terminate`), wait ``timeout``
        seconds, then SIGKILL; returns its exit status."""
        self.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()
        # Shown by pytest only when the test failed (captured output): what the server said.
        said = self.stderr_path.read_text(errors="replace").strip()
        if said:
            where = getattr(self, "url", self.access_log)
            print(f"-- stderr of the mirror at {where}:\n{said[-4000:]}")
        return self.process.returncode


def _logged_by(access_log: Path, marker: str, deadline: float) -> int:
    """The pid of the worker whose line in ``access_log`` carries ``marker`` (waited for
    until ``deadline``, a ``time.monotonic()``)."""
    while time.monotonic() < deadline:
        for line in access_log.read_text(errors="replace").splitlines():
            if marker in line:
                with contextlib.suppress(ValueError):  # a line being written: look again
                    return int(json.loads(line)["pid"])
        time.sleep(0.01)
    raise TimeoutError("access log did not catch up")


def raw_request(
    host: str, port: int, request: bytes, timeout: float = TEST_DEADLINE
) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes as one HTTP/1.1 request (it should say ``Connection: close``)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines and lines[0].startswith("HTTP/") else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


def hf_env(
    url: str, home: Path, token: str | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for a stock-client subprocess pointed at the mirror at ``url`` and
    nowhere else: ``base`` (default ``os.environ``) without its Hugging Face settings,
    the cache in ``home``, no Xet, telemetry or progress bars."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        HF_ENDPOINT=url,
        HF_HOME=str(home),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TRANSFORMERS_VERBOSITY="error",
        TOKENIZERS_PARALLELISM="false",
    )
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def run_python(code: str, env: dict[str, str], timeout: float = 300) -> Any:
    """Run ``code`` in a fresh interpreter; it must print one JSON document last."""
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
TINY_REPO = "cmh-test/tiny"
DATA_REPO = "cmh-test/data"
PRIVATE_REPO = "cmh-test/private"
PRIVATE_TOKEN = "hf_cmh_test_private_token_0001"


@dataclass(frozen=True)
class MirrorStore:
    """A store built for tests and what was imported into it."""

    path: Path
    tokens: Path
    imports: dict[str, ImportResult]  # "repo@revision" -> result
    sources: dict[str, Path]  # "repo@revision" -> the folder imported


def write_tiny_repo(root: Path, version: int) -> Path:
    """A small repo with nested folders, a text file, a JSON file and an LFS-named binary."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(f'{{"model_type": "tiny", "version": {version}}}\n')
    (root / "README.md").write_text(f"# tiny v{version}\n")
    (root / "sub" / "deeper").mkdir(parents=True, exist_ok=True)
    (root / "sub" / "notes.txt").write_text("notes\n" * 50)
    (root / "sub" / "deeper" / "leaf.txt").write_text(f"leaf {version}\n")
    data = bytes((i * 7 + version) % 256 for i in range(300_000))
    (root / "weights.bin").write_bytes(data)
    (root / "empty.txt").write_bytes(b"")
    return root


def build_mirror_store(base: Path, minilm_dir: Path) -> MirrorStore:
    """The shared test store (see module docstring)."""
    store = base / "store"
    imports: dict[str, ImportResult] = {}
    sources: dict[str, Path] = {}

    def add(src: Path, repo: str, revision: str = "main", repo_type: str = "model") -> None:
        key = f"{repo}@{revision}" if repo_type == "model" else f"datasets/{repo}@{revision}"
        imports[key] = add_folder(store, src, repo, revision=revision, repo_type=repo_type)
        sources[key] = src

    add(minilm_dir, MINILM_REPO)
    add(write_tiny_repo(base / "tiny-v1", 1), TINY_REPO, "v1")
    add(write_tiny_repo(base / "tiny-v2", 2), TINY_REPO, "main")
    data = base / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "part-0.csv").write_text("a,b\n1,2\n")
    (data / "README.md").write_text("# data\n")
    add(data, DATA_REPO, repo_type="dataset")
    private = base / "private"
    private.mkdir()
    (private / "config.json").write_text('{"secret": true}\n')
    add(private, PRIVATE_REPO)
    tokens = base / "tokens.txt"
    tokens.write_text(f"# test tokens\n{PRIVATE_TOKEN}  {PRIVATE_REPO}\n")
    return MirrorStore(store, tokens, imports, sources)


def ctrl_c_as_from_a_terminal() -> None:
    """``preexec_fn`` for a child a test stops with Ctrl-C: SIGINT's default action, as a
    shell started from a terminal gives it. A test runner started as a background job
    ignores SIGINT, every child inherits that, and a stock client then ignores its Ctrl-C
    (it ran to its end)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(predicate: Callable[[], Any], what: str = "", timeout: float = TEST_DEADLINE) -> None:
    """Return once ``predicate()`` is true; an AssertionError naming ``what`` after
    ``timeout`` real seconds (a wait on another process, not a bound under test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stop_servers(servers: list[MirrorServer]) -> None:
    """Stop every server: all are sent SIGTERM first, then each is waited for, so their
    shutdowns (up to ``--graceful-timeout`` each) overlap instead of adding up."""
    for server in servers:
        server.terminate()
    for server in servers:
        server.stop()


class InProcessMirror:
    """A pull-through mirror of ``upstream`` on a folder store (or a bucket store's URL),
    in this process (its own thread and loop), so a test can hold a step of a fill;
    ``tails``: its fill readers."""

    def __init__(self, store: Path | str, upstream: str) -> None:
        from cmh.hub.mirror._app import make_app
        from cmh.hub.mirror._auth import AccessPolicy
        from cmh.hub.mirror._filling import Fills
        from cmh.hub.mirror._observe import Metrics
        from cmh.hub.mirror._state import MirrorState
        from cmh.hub.mirror._upstream import Upstream, UpstreamConfig
        from cmh.hub.mirror.stores import open_store

        if isinstance(store, Path):  # else a bucket's URL (its AWS settings in os.environ)
            store.mkdir()
        backend = open_store(store)
        pull = backend.pull_through(3600.0)
        self.tails: list[Any] = []
        reader = pull.reader

        def kept(*args: Any) -> Any:
            tail = reader(*args)
            self.tails.append(tail)
            return tail

        pull.reader = kept
        self.state = MirrorState(backend, AccessPolicy({}), Metrics(None))
        self.state.upstream = Upstream(pull, UpstreamConfig(upstream, fresh_for=3600.0))
        self.state.fills = Fills(self.state.upstream)
        self.app = make_app(self.state)
        self.host, self.port = "127.0.0.1", 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def __enter__(self) -> InProcessMirror:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
