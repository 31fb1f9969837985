"""The import contracts of ``.importlinter`` hold, and they name every module they must.

``make lint`` runs the same check; the suite runs it too, so CI enforces the layering
that docs/architecture.md states.
"""

from __future__ import annotations

import configparser
import re
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


def test_the_layers_the_architecture_page_draws_are_the_contracts() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("<!-- layers:", 1)[1].split("<!-- end layers -->", 1)[0]
    drawn = [line.split("  ")[0].strip() for line in block.splitlines() if line.startswith("cmh.")]
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = config["importlinter:contract:layers"]["layers"].split("\n")
    assert drawn == [layer.strip() for layer in layers if layer.strip()]


def test_no_module_outside_stores_names_a_store_kind() -> None:
    """docs/architecture.md, "Only ``mirror.stores`` knows a store kind": beyond the
    imports the ``kinds`` contract checks, no module of the hub or the CLI outside
    ``stores/`` names a kind's module (a lazy export, ``importlib``, ``sys.modules``)."""
    kinds = re.compile(r"stores[./](bucket|local|memory)\b")
    stores = ROOT / "hub" / "mirror" / "stores"
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted([*(ROOT / "hub").rglob("*.py"), *(ROOT / "cli").rglob("*.py")])
        if stores not in path.parents
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if kinds.search(line)
    ]
    assert found == []


def test_only_the_clock_module_reads_the_time() -> None:
    """docs/architecture.md, "One clock": no direct ``time.time()``/``time.monotonic()``
    anywhere in the hub but the clock module."""
    calls = re.compile(r"time\.(time|monotonic)\(")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "hub").rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if calls.search(line)
    ]
    assert found and all(f.startswith("hub/cache/_clock.py:") for f in found), found


def test_every_module_the_shared_jobs_table_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("## Shared jobs", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(cmh(?:\.[a-z_]+)+)", table))
    assert len(named) >= 12
    mapping = {"cmh.hub.": ROOT / "hub", "cmh.cli.": ROOT / "cli", "cmh.": ROOT / "cmh"}
    missing = []
    for name in named:
        prefix = next(p for p in mapping if name.startswith(p))
        parts = name[len(prefix) :].split(".")
        base = mapping[prefix]
        # the longest prefix of the dotted name that is a module (the rest: an attribute)
        found = any(
            (base.joinpath(*parts[:i]).with_suffix(".py")).is_file()
            or (base.joinpath(*parts[:i]) / "__init__.py").is_file()
            for i in range(len(parts), 0, -1)
        ) or (prefix == "cmh." and (ROOT / "cmh" / "__init__.py").is_file() and len(parts) == 1)
        if not found:
            missing.append(name)
    assert missing == []
