"""Starting the CLI imports neither torch nor transformers nor the hub code.

Each case runs ``cmh`` in a fresh interpreter and lists the heavy modules left
in ``sys.modules``; a control case shows the listing does see them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import save_file

import cmh

PROBE = """
import sys
{preamble}
from cmh.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("torch", "transformers", "tqdm")
    or m == "cmh.hub" or m.startswith("cmh.hub.")
)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


def heavy_modules(args: list[str], preamble: str = "") -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(preamble=preamble), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = [x for x in proc.stderr.splitlines() if x.startswith("HEAVY=")]
    assert line, proc.stderr
    value = line[-1].removeprefix("HEAVY=")
    return value.split(",") if value else []


@pytest.mark.parametrize(
    "args", [["--version"], ["--help"], ["verify", "--help"], ["stamp", "--help"]]
)
def test_startup_imports_nothing_heavy(args: list[str]) -> None:
    assert heavy_modules(args) == []


def test_verify_run_imports_nothing_heavy(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    import numpy as np

    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(path))
    cmh.stamp(path)
    assert heavy_modules(["verify", str(path)]) == []
    assert heavy_modules(["inspect", str(path)]) == []


def test_probe_sees_heavy_modules() -> None:
    assert "cmh.hub" in heavy_modules(["--version"], preamble="import cmh.hub")
