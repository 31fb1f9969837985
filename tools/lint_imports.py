"""Check the import contracts of ``.importlinter`` (import-linter) on the installed layout.

``hub/`` and ``cli/`` are ``cmh.hub`` and ``cmh.cli`` only through pyproject.toml's
package mapping, which import-linter cannot follow; this checks the tree of links
that ``tools/typecheck.py`` lays in ``.typecheck/`` (one tree, one run at a time).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from typecheck import ROOT, TREE, build_tree


def main() -> int:
    with open(ROOT / ".typecheck.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build_tree()
        command = [str(Path(sys.executable).parent / "lint-imports"), str(ROOT / ".importlinter")]
        env = {**os.environ, "PYTHONPATH": str(TREE)}
        return subprocess.call(command, cwd=TREE, env=env)


if __name__ == "__main__":
    sys.exit(main())
