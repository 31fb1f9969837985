"""Conventions a person expects of a command line (issue 40): colour on status words
only on a terminal and never with ``NO_COLOR``; "did you mean" for every command;
shell completion that installs; help that lists every exit status."""

from __future__ import annotations

import os
import pty
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from cli_support import (
    CMH,
    closed_port,
    run_runner,
    run_subprocess,
    tensors,
    unreachable_bucket_env,
)
from safetensors.numpy import save_file

import cmh

RED = "\x1b[31m"
GREEN = "\x1b[32m"


def _files(tmp_path: Path) -> tuple[Path, Path]:
    good, bad = tmp_path / "good.safetensors", tmp_path / "bad.txt"
    save_file({"w": np.ones((2, 2), np.float32)}, str(good))
    cmh.stamp(good, ttl="30d")
    bad.write_text("not a model\n" * 10)
    return good, bad


def _on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """What ``cmh args`` writes to a pseudo-terminal (stdout and stderr both)."""
    main, child = pty.openpty()
    proc = subprocess.Popen([str(CMH), *args], stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(main)
        proc.wait(timeout=120)
    return out.decode(errors="replace")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_status_words_are_coloured_on_a_terminal_only(tmp_path: Path) -> None:
    good, bad = _files(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    shown = _on_a_terminal(["verify", str(good), str(bad)], env)
    assert f"{GREEN}\x1b[1mok\x1b[0m" in shown and f"{RED}\x1b[1mFAILED\x1b[0m" in shown, shown
    plain = _on_a_terminal(["verify", str(good), str(bad)], {**env, "NO_COLOR": "1"})
    assert "\x1b[" not in plain and "ok       " in plain and "FAILED   " in plain
    piped = run_subprocess(["verify", good, bad], env={"NO_COLOR": None})
    assert "\x1b[" not in piped.stdout + piped.stderr and "FAILED   " in piped.stdout


TYPOS = [("stmp", "stamp"), ("veriy", "verify"), ("mirrror", "mirror"), ("prnue", "prune")]


@pytest.mark.parametrize(("typed", "meant"), TYPOS)
def test_a_mistyped_command_gets_did_you_mean(typed: str, meant: str) -> None:
    run = run_runner([typed])
    assert run.exit_code == 2
    assert f"No such command '{typed}'. Did you mean '{meant}'?" in run.stderr, run.stderr


def test_completion_prints_and_installs_once(tmp_path: Path) -> None:
    printed = run_subprocess(["completion", "bash"])
    assert printed.exit_code == 0 and "_CMH_COMPLETE=bash_complete" in printed.stdout
    home = {"HOME": str(tmp_path)}
    for _ in range(2):
        assert run_subprocess(["completion", "bash", "--install"], env=home).exit_code == 0
    rc = (tmp_path / ".bashrc").read_text()
    assert rc.count('eval "$(_CMH_COMPLETE=bash_source cmh)"') == 1
    completed = subprocess.run(
        [str(CMH)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "_CMH_COMPLETE": "bash_complete", "COMP_WORDS": "cmh st",
             "COMP_CWORD": "1"},
    )  # fmt: skip
    assert "plain,stamp" in completed.stdout.splitlines(), completed.stdout


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["keygen"], "3 the files could not be written"),
        (["mirror", "scrub"], "2 usage error (no such store)"),
        (["serve"], "3 the storage unreachable"),
    ],
)
def test_help_lists_every_exit_status(command: list[str], says: str) -> None:
    run = run_runner([*command, "--help"])
    assert run.exit_code == 0 and says in " ".join(run.stdout.split()), run.stdout


def test_serve_help_does_not_say_both_0_and_130_for_ctrl_c() -> None:
    text = " ".join(run_runner(["serve", "--help"]).stdout.split())
    assert "Ctrl-C" in text and "130" not in text


def test_serve_exits_3_like_mirror_ls_when_the_storage_is_down(tmp_path: Path) -> None:
    env = unreachable_bucket_env(tmp_path)
    listed = run_subprocess(["mirror", "ls", "--store", "s3://models/hub"], env=env)
    served = run_subprocess(["serve", "--store", "s3://models/hub", "--port", "0"], env=env)
    assert listed.exit_code == 3, listed.stderr
    assert served.exit_code == 3, served.stderr
    assert served.stderr.startswith("error: ") and served.stderr.count("\n") == 1, served.stderr


def test_a_storage_error_exits_3_and_a_bad_store_url_2() -> None:
    """``exit_code_for`` tells a storage's errors apart through ``mirror.stores``' face."""
    from cmh.cli._common import exit_code_for
    from cmh.hub.mirror.stores import InvalidLocation, ObjectStoreError

    assert exit_code_for(ObjectStoreError("the storage failed")) == 3
    assert exit_code_for(InvalidLocation("s3:// needs a bucket")) == 2


TOKEN_FILE_OPTIONS = [
    ["mirror", "ls", "--store", "STORE", "--tokens", "FILE"],
    ["serve", "--store", "STORE", "--port", "0", "--tokens", "FILE"],
    ["serve", "--store", "STORE", "--port", "0", "--admin-tokens", "FILE"],
    ["serve", "--store", "STORE", "--upstream", "http://127.0.0.1:9", "--upstream-token-file",
     "FILE"],
    ["serve", "--store", "s3://bkt/p", "--port", "0", "--fleet-key-file", "FILE"],
    ["mirror", "sync", "acme/x", "--store", "STORE", "--from", "http://127.0.0.1:9",
     "--token-file", "FILE"],
]  # fmt: skip


@pytest.mark.parametrize("args", TOKEN_FILE_OPTIONS, ids=lambda a: " ".join(a[:2] + a[-2:-1]))
@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_token_file_that_is_no_small_regular_file_is_a_usage_error(
    tmp_path: Path, args: list[str], kind: str
) -> None:
    """A FIFO never blocks, a device or a huge file is never read whole: exit 2 at once."""
    (tmp_path / "store").mkdir()
    file, says = {
        "fifo": (tmp_path / "tokens", "FIFO"),
        "device": (Path("/dev/zero"), "character device"),
        "huge": (tmp_path / "tokens", "larger than 1 MiB"),
    }[kind]
    if kind == "fifo":
        os.mkfifo(file)
    elif kind == "huge":
        with open(file, "wb") as f:
            f.truncate(64 << 20)  # sparse: 64 MiB of NULs, nothing on disk
    given = [{"STORE": str(tmp_path / "store"), "FILE": str(file)}.get(a, a) for a in args]
    run = run_subprocess(given, env={"CMH_FLEET_KEY_FILE": None})
    assert run.exit_code == 2, run.stderr
    assert run.stdout == "" and run.stderr.startswith("error: "), run.stderr
    assert str(file) in run.stderr and says in run.stderr, run.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["mirror", "add", "SRC", "--repo", "acme/m", "--store", "LONG"],
        ["mirror", "ls", "--store", "LONG"],
        ["mirror", "scrub", "--store", "LONG"],
        ["mirror", "sync", "acme/m", "--from", "http://127.0.0.1:9", "--store", "LONG"],
        ["serve", "--store", "LONG"],
        ["prune", "--dry-run", "--store", "LONG"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_store_path_too_long_for_the_file_system_is_a_usage_error(
    tmp_path: Path, args: list[str]
) -> None:
    long = tmp_path / ("a" * 300)  # a name of 300 bytes: ENAMETOOLONG, not a traceback
    given = [{"SRC": str(tmp_path), "LONG": str(long)}.get(a, a) for a in args]
    run = run_runner(given)
    assert run.exit_code == 2, run.stderr
    assert run.stdout == "" and "--store" in run.stderr, run.stderr
    assert "File name too long" in run.stderr and "255 bytes" in run.stderr, run.stderr


class _NoRepoHub(BaseHTTPRequestHandler):
    """A Hub that knows no repo."""

    def do_GET(self) -> None:
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture(scope="module")
def no_repo_hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoRepoHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


NOWHERE = "/proc/cmh-store"  # a folder not even root can make
FAILURES = [
    ("mirror add", ["mirror", "add", "LINKED", "--repo", "acme/m", "--store", "STORE"], 1),
    ("mirror add", ["mirror", "add", "/dev/null", "--repo", "acme/m", "--store", "STORE"], 1),
    ("mirror add", ["mirror", "add", "FIFO", "--repo", "acme/m", "--store", "STORE"], 1),
    ("mirror add", ["mirror", "add", "SRC", "--repo", "acme/m", "--store", NOWHERE], 3),
    ("mirror sync", ["mirror", "sync", "acme/m", "--from", "CLOSED", "--store", "STORE"], 1),
    ("mirror sync", ["mirror", "sync", "acme/m", "--from", "HUB", "--store", "STORE"], 1),
    ("mirror sync", ["mirror", "sync", "acme/m", "--from", "HUB", "--store", NOWHERE], 3),
    ("mirror ls", ["mirror", "ls", "--store", "s3://bkt/p"], 3),
    ("mirror scrub", ["mirror", "scrub", "--store", "s3://bkt/p"], 3),
    ("prune", ["prune", "--dry-run", "--store", "s3://bkt/p"], 3),
    ("prune", ["prune", "--dry-run", "--cache-dir", "MISSING"], 3),
    ("keygen", ["keygen", "--out", "/proc/cmh-keys/k"], 3),
]


@pytest.mark.parametrize(
    ("command", "args", "status"), FAILURES, ids=lambda v: v if isinstance(v, str) else None
)
def test_json_prints_one_document_when_a_command_fails(
    tmp_path: Path, no_repo_hub: str, command: str, args: list[str], status: int
) -> None:
    """Status 1 or 3 with --json: the common fields, ok false, and the error said on stderr."""
    src, linked = tmp_path / "src", tmp_path / "linked"
    src.mkdir()
    save_file(tensors(1), str(src / "model.safetensors"))
    linked.mkdir()
    (linked / "passwd").symlink_to("/etc/passwd")  # outside the folder
    os.mkfifo(tmp_path / "fifo")
    paths = {
        "SRC": src, "LINKED": linked, "FIFO": tmp_path / "fifo", "STORE": tmp_path / "store",
        "MISSING": tmp_path / "missing", "CLOSED": f"http://127.0.0.1:{closed_port()}",
        "HUB": no_repo_hub,
    }  # fmt: skip
    given = [str(paths.get(a, a)) for a in args]
    run = run_subprocess([*given, "--json"], env=unreachable_bucket_env(tmp_path))
    assert run.exit_code == status, run.stderr
    doc = run.json()
    assert doc == {
        "schema": 1, "command": command, "cmh_version": cmh.__version__, "ok": False,
        "exit_status": status, "error": doc["error"],
    }  # fmt: skip
    assert run.stderr.startswith(f"error: {doc['error']}"), run.stderr


@pytest.mark.parametrize("host", ["", "not a host", "999.1.1.1"])
def test_serve_names_a_host_it_cannot_listen_on(tmp_path: Path, host: str) -> None:
    """Was: exit 3 with only "Name or service not known"."""
    run = run_runner(["serve", "--store", tmp_path, "--port", "0", "--host", host])
    assert run.exit_code == 2, run.stderr
    assert run.stderr.startswith(f"error: --host {host!r} is no address to listen on"), run.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["mirror", "add", "SRC", "--store", "STORE", "--repo", "acme/ok\n"],
        ["pull", "acme/x\n", "--endpoint", "CLOSED"],
        ["pull", "acme/x", "--revision", "a" * 40 + "\n", "--endpoint", "CLOSED"],
        ["mirror", "sync", "acme/x\n", "--store", "STORE", "--from", "CLOSED"],
    ],
    ids=["mirror add", "pull", "pull --revision", "mirror sync"],
)
def test_a_repo_id_or_commit_with_a_trailing_newline_is_a_usage_error(
    tmp_path: Path, args: list[str]
) -> None:
    """Was: ``$`` matched before a final newline: stored as a repo, or an httpx traceback."""
    (tmp_path / "src").mkdir()
    save_file(tensors(1), str(tmp_path / "src" / "model.safetensors"))
    paths = {"SRC": str(tmp_path / "src"), "STORE": str(tmp_path / "store")}
    paths["CLOSED"] = f"http://127.0.0.1:{closed_port()}"
    run = run_runner([paths.get(a, a) for a in args])
    assert run.exit_code == 2, run.stderr
    assert "invalid repo id" in run.stderr or "invalid revision" in run.stderr, run.stderr
    assert not (tmp_path / "store" / "models--acme--ok").exists()


def test_the_name_patterns_end_at_the_end_of_the_text() -> None:
    from cmh.hub.cache import COMMIT_RE, ETAG_RE, REPO_PART_RE

    for pattern, good in ((COMMIT_RE, "a" * 40), (ETAG_RE, "b" * 64), (REPO_PART_RE, "bert")):
        assert pattern.match(good) and not pattern.match(good + "\n")


@pytest.mark.parametrize(
    "args",
    [["verify", "MODEL"], ["verify", "MODEL", "--json"], ["inspect", "MODEL"], ["--help"]],
    ids=["verify", "verify-json", "inspect", "help"],
)
def test_a_closed_stdout_pipe_exits_quietly_with_141(tmp_path: Path, args: list[str]) -> None:
    """``cmh verify model/ | head -1``: the reader goes, the next write fails. cmh stops
    as a tool killed by SIGPIPE does (status 141 = 128 + 13), with nothing on stderr
    (it printed ``error: Broken pipe`` and exited 3)."""
    good, _ = _files(tmp_path)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before cmh writes anything
    try:
        argv = [str(CMH), *(str(good) if a == "MODEL" else a for a in args)]
        done = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write)
    assert done.stderr == b"" and done.returncode == 141, (done.returncode, done.stderr)
