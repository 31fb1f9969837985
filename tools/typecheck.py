"""Run mypy on the package as installed names see it.

``hub/`` and ``cli/`` are mapped to ``cmh.hub`` and ``cmh.cli`` by
pyproject.toml; mypy cannot follow that mapping, so this lays a tree of
symlinks in ``.typecheck/`` with the installed layout and checks it, then
``bench/`` against it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".typecheck"
MAPPING = {"cmh": ROOT / "cmh", "cmh/hub": ROOT / "hub", "cmh/cli": ROOT / "cli"}


def build_tree() -> None:
    shutil.rmtree(TREE, ignore_errors=True)
    for target, source in MAPPING.items():
        dest = TREE / target
        dest.mkdir(parents=True, exist_ok=True)
        for item in source.iterdir():
            if item.name in {"__pycache__"} or (TREE / target / item.name).exists():
                continue
            (dest / item.name).symlink_to(item)


def main() -> int:
    # Several checkouts' tools may run at once: one tree, one run at a time.
    with open(ROOT / ".typecheck.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build_tree()
        mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        status = subprocess.call([*mypy, "cmh"], cwd=TREE)
        # The benches (scripts importing each other by name) against the same tree.
        env = {**os.environ, "MYPYPATH": str(TREE)}
        return status or subprocess.call([*mypy, str(ROOT / "bench")], cwd=TREE, env=env)


if __name__ == "__main__":
    sys.exit(main())
