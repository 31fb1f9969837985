"""The import contracts of ``.importlinter`` hold, and they name every module they must.

``make lint`` runs the same check; the suite runs it too, so CI enforces the layering
that docs/architecture.md states.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_hold() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "lint_imports.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_the_format_contract_names_every_format_module() -> None:
    """A new module of the format is under the "imports nothing of the hub" contract."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    listed = set(config["importlinter:contract:format"]["source_modules"].split())
    modules = {f"cmh.{p.stem}" for p in (ROOT / "cmh").glob("*.py") if p.stem != "__init__"}
    modules -= {"cmh.__main__"}
    assert modules | {"cmh.semantic"} == listed
