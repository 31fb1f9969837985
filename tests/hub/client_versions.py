"""Older huggingface_hub releases for tests, installed apart from the project's venv.

``client_path(version)`` installs ``huggingface_hub==version`` with its dependencies
(``requests`` for 0.x, ``httpx`` for 1.x) into ``.hf-clients/{version}`` at the repository
root (gitignored) the first time it is asked, with the ordinary ``pip``, and returns that
folder; a subprocess with it first on ``PYTHONPATH`` imports that release and those
dependencies. ``None`` when it cannot be installed (no package index reachable): the
caller skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / ".hf-clients"


def client_path(version: str) -> Path | None:
    """The folder holding ``huggingface_hub==version`` (installed now if missing)."""
    target = ROOT / version
    marker = target / ".installed"
    if marker.is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--target", str(target), f"huggingface_hub=={version}",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        return None
    marker.write_text(version + "\n")
    return target


def client_env(env: dict[str, str], version: str) -> dict[str, str] | None:
    """``env`` with ``huggingface_hub==version`` first on ``PYTHONPATH`` (``None``: unavailable)."""
    path = client_path(version)
    if path is None:
        return None
    rest = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(path), rest) if p)}
