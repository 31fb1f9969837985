"""Older huggingface_hub releases for tests, installed apart from the project's venv.

``client_path(version)`` installs ``huggingface_hub==version`` with its dependencies
(``requests`` for 0.x, ``httpx`` for 1.x) into ``.hf-clients/{version}`` at the repository
root (gitignored) the first time it is asked, with the ordinary ``pip``, and returns that
folder; a subprocess with it first on ``PYTHONPATH`` imports that release and those
dependencies. ``None`` when it cannot be installed (no package index reachable): the
caller skips. :func:`install_apart` is that install for any requirement, under a file
lock (the suite's workers may ask for one folder at once); ministack uses it too.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / ".hf-clients"


def install_apart(requirement: str, target: Path) -> Path | None:
    """``target``, holding ``requirement`` and its dependencies (``pip install --target``
    the first time, under a file lock beside it: the suite's workers may ask at once);
    ``None`` when pip cannot install it."""
    marker = target / ".installed"
    if marker.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer; the others find its marker
        if marker.is_file():
            return target
        done = subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--no-warn-conflicts", "--target", str(target), requirement,
            ],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            return None
        marker.write_text(requirement + "\n")
    return target


def client_path(version: str) -> Path | None:
    """The folder holding ``huggingface_hub==version`` (installed now if missing)."""
    return install_apart(f"huggingface_hub=={version}", ROOT / version)


def client_env(env: dict[str, str], version: str) -> dict[str, str] | None:
    """``env`` with ``huggingface_hub==version`` first on ``PYTHONPATH`` (``None``: unavailable)."""
    path = client_path(version)
    if path is None:
        return None
    rest = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(path), rest) if p)}
