"""Run a CMH v1 reader over the conformance vectors and report where it agrees.

In the manner of toml-test: any implementation can be checked, whatever its
language. A *reader* is a command that takes the verification options of
spec section 10 and one path, and prints one JSON object on stdout whose
``outcome`` is a section 9 name (or ``index_inconsistent`` for a directory)::

    READER [--fast] [--key FILE]... [--require-signature] [--allow-unsigned] --at SECONDS PATH

fixtures/vectors/index.json lists every vector and, for each mode, the
options and the outcome a conforming reader reports. Vectors a source tree
cannot hold (a FIFO, a socket, an index over 100,000,000 bytes) list the
steps that build them (``made``, spec section 10): they are built in a
scratch directory first. Usage::

    python tools/conformance.py -- cmh verify --json
    python tools/conformance.py -- python tests/spec_reader.py
    python tools/conformance.py --only basic,signed --mode full,key -- cmh verify --json

Exit status 0 when the reader agrees on every check run, 1 otherwise, 2 on a
usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VECTORS = Path(__file__).resolve().parent.parent / "fixtures" / "vectors"

#: A reader: the argument list (options, then the path) -> the JSON object it printed.
Reader = Callable[[list[str]], dict[str, Any]]


@dataclass(frozen=True)
class Check:
    """One run of a reader on one vector, and the outcome it must report."""

    vector: str
    mode: str
    args: tuple[str, ...]
    expected: str


@dataclass(frozen=True)
class Result:
    check: Check
    found: str  # the reported outcome, or "error: ..." when the reader failed

    @property
    def agrees(self) -> bool:
        return self.found == self.check.expected


def load_checks(
    vectors: Path = VECTORS,
    only: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    scratch: Path | None = None,
) -> list[Check]:
    """Every check of the index, with ``{dir}`` resolved and the vector's path appended.

    Vectors with ``made`` steps are built in ``scratch`` (an empty directory), and left
    out when no scratch directory is given.
    """
    index = json.loads((vectors / "index.json").read_text(encoding="utf-8"))
    wanted = set(only) if only else None
    wanted_modes = set(modes) if modes else None
    checks = []
    for vector in index["vectors"]:
        if wanted is not None and vector["name"] not in wanted:
            continue
        if "made" in vector:
            if scratch is None:
                continue
            build(vector["made"], vectors, scratch)
            path = str(scratch / vector["path"])
        else:
            path = str(vectors / vector["path"])
        for check in vector["checks"]:
            if wanted_modes is not None and check["mode"] not in wanted_modes:
                continue
            args = [a.replace("{dir}", str(vectors)) for a in check["args"]]
            checks.append(Check(vector["name"], check["mode"], (*args, path), check["outcome"]))
    return checks


def build(steps: list[dict[str, Any]], vectors: Path, scratch: Path) -> None:
    """Perform a vector's ``made`` steps (spec section 10) in ``scratch``."""
    for step in steps:
        op = step["op"]
        if op == "copy":
            source, target = vectors / step["from"], scratch / step["to"]
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True)
            else:
                shutil.copyfile(source, target, follow_symlinks=False)
        elif op == "remove":
            (scratch / step["path"]).unlink()
        elif op == "fifo":
            os.mkfifo(scratch / step["path"])
        elif op == "socket":
            _bind_socket(scratch / step["path"])
        elif op == "write":
            _write_padded(scratch / step["path"], step["text"].encode(), step["pad_to"])
        else:
            raise ValueError(f"unknown step {op!r}")


def _bind_socket(path: Path) -> None:
    """A Unix-domain socket file at ``path``; bound through /proc/self/fd, so a long
    scratch path does not meet the 107-byte limit of a socket address."""
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(f"/proc/self/fd/{folder}/{path.name}")
    finally:
        os.close(folder)


def _write_padded(path: Path, text: bytes, size: int) -> None:
    with open(path, "wb") as f:
        f.write(text)
        spaces = b" " * (1 << 20)
        left = size - len(text)
        while left > 0:
            left -= f.write(spaces[: min(left, len(spaces))])


def run_checks(reader: Reader, checks: Iterable[Check]) -> list[Result]:
    """Run ``reader`` on every check; a reader that fails is a disagreement, not a crash."""
    results = []
    for check in checks:
        try:
            document = reader(list(check.args))
            found = str(document["outcome"])
        except Exception as exc:  # any failure of a foreign reader is reported, never raised
            found = f"error: {type(exc).__name__}: {exc}"
        results.append(Result(check, found))
    return results


def command_reader(command: list[str], timeout: float = 120.0) -> Reader:
    """A reader that runs ``command`` plus the check's arguments as a subprocess."""

    def read(args: list[str]) -> dict[str, Any]:
        proc = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        try:
            document = json.loads(proc.stdout)
        except ValueError:
            why = proc.stderr.strip().splitlines()[-1:] or ["no output"]
            raise ValueError(f"exit {proc.returncode}, no JSON on stdout: {why[0]}") from None
        if not isinstance(document, dict):
            raise ValueError(f"printed {type(document).__name__}, not one JSON object")
        return document

    return read


def report(results: list[Result], out: Any = None) -> bool:
    """Print each disagreement and a summary (on stdout by default); True when all agree."""
    out = sys.stdout if out is None else out
    failed = [r for r in results if not r.agrees]
    for r in failed:
        c = r.check
        print(f"FAIL {c.vector} [{c.mode}]: expected {c.expected}, got {r.found}", file=out)
    vectors = len({r.check.vector for r in results})
    print(f"{len(results) - len(failed)}/{len(results)} checks agree ({vectors} vectors)", file=out)
    return not failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="conformance", description="Check a CMH v1 reader against fixtures/vectors."
    )
    parser.add_argument("--vectors", type=Path, default=VECTORS, help="the vectors directory")
    parser.add_argument("--only", default="", help="comma-separated vector names")
    parser.add_argument("--mode", default="", help="comma-separated mode names")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- READER COMMAND...")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the reader command after --")
    with tempfile.TemporaryDirectory(prefix="cmh-vectors-") as scratch:
        # Readers run on a copy: one may write beside what it reads (cmh verify keeps check
        # records beside a Hub-cache layout's blobs), and the vectors must stay as committed.
        vectors = Path(scratch) / "vectors"
        shutil.copytree(args.vectors, vectors, symlinks=True)
        checks = load_checks(
            vectors,
            [n for n in args.only.split(",") if n] or None,
            [m for m in args.mode.split(",") if m] or None,
            Path(scratch),
        )
        if not checks:
            parser.error("no check selected")
        return 0 if report(run_checks(command_reader(command), checks)) else 1


if __name__ == "__main__":
    sys.exit(main())
