"""The wheel holds every module and data file of the source tree (an editable install hides a
package missing from ``pyproject.toml``; an installed wheel then fails at its first import)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Source folder -> the import path it is installed as (``[tool.setuptools.package-dir]``).
SOURCES = {"cmh": "cmh", "hub": "cmh/hub", "cli": "cmh/cli"}
DATA_SUFFIXES = (".py", ".html", ".css", ".js", ".typed")
#: The console script's entry module, top-level so that it imports nothing of ``cmh``.
LAUNCHER = "_cmh_launcher.py"


def _source_files() -> set[str]:
    wanted = set()
    for folder, installed in SOURCES.items():
        for path in (ROOT / folder).rglob("*"):
            relative = path.relative_to(ROOT / folder)
            if path.is_file() and path.suffix in DATA_SUFFIXES and "__pycache__" not in path.parts:
                wanted.add(f"{installed}/{relative.as_posix()}")
    return wanted


def _copy_of_the_project(dest: Path) -> Path:
    """The files a build reads, without the checkout's own ``build/`` (a stale one would
    hand the wheel modules the configuration no longer names)."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", LAUNCHER):
        shutil.copy2(ROOT / name, dest / name)
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_the_wheel_holds_every_module_and_data_file(tmp_path: Path) -> None:
    source = _copy_of_the_project(tmp_path / "src")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    target = tmp_path / "installed"
    with zipfile.ZipFile(wheel) as archive:
        held = {name for name in archive.namelist() if name.startswith("cmh/")}
        assert LAUNCHER in archive.namelist()
        entry_points = next(n for n in archive.namelist() if n.endswith("entry_points.txt"))
        assert "cmh = _cmh_launcher:main" in archive.read(entry_points).decode()
        archive.extractall(target)
    missing = sorted(_source_files() - held)
    assert missing == [], f"not in the wheel (add the package to pyproject.toml): {missing}"
    probe = "import cmh.hub.mirror, cmh.hub.mirror.stores, cmh.hub.mirror.web, cmh.cli.main"
    imported = subprocess.run(
        [sys.executable, "-c", f"{probe}; print(cmh.hub.mirror.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(target)},
        timeout=120,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.startswith(str(target)), imported.stdout
