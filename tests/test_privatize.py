"""tools/privatize.py: the tree is privatized; a re-run fixes what new code wrote with old names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "privatize.py"
COPIED = ("cmh", "hub", "cli", "tests", "bench", "tools", "docs", "spec")


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "privatize.py"), *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_tree_needs_nothing() -> None:
    """Every module is private, no import crosses a unit into one, no face lacks a name."""
    result = run(ROOT, "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "would change 0 files"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        shutil.copytree(ROOT / name, root / name, ignore=ignore)
    for name in ("README.md", "pyproject.toml", "Makefile"):
        shutil.copy(ROOT / name, root / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=root, check=True)
    return root


def test_a_rerun_fixes_stragglers_and_changes_nothing_else(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    # New code written with the old names, as a branch merged after the rename brings it.
    app = root / "hub/mirror/_app.py"
    app.write_text(app.read_text() + "\nfrom .stores.local.folder import add_folder  # straggler\n")
    common = root / "cli/_common.py"
    common.write_text(common.read_text() + "\nfrom cmh.hub.mirror.auth import load_tokens\n")
    plan = root / "hub/prune/_plan.py"
    plan.write_text(
        plan.read_text() + "\n\ndef _late():\n    from ..mirror.auth import bearer_token\n\n"
        "    return bearer_token\n"
    )
    (root / "hub/mirror/fleet.py").write_text(
        '"""A module added since."""\n\nfrom ..cache.layout import RepoLayout\n\n'
        '__all__ = ["RepoLayout"]\n'
    )
    test = root / "tests/test_cli_help.py"
    late_test = (
        '\n\ndef test_late(monkeypatch):\n    monkeypatch.setattr("cmh.hub.mirror.app.X", 1)\n'
    )
    test.write_text(test.read_text() + late_test)
    doc = root / "docs/mirror.md"
    doc.write_text(doc.read_text() + "\nSee hub/mirror/app.py:12.\n")
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)

    first = run(root)
    assert first.returncode == 1  # bearer_token is not on the mirror's face
    assert "bearer_token (from cmh.hub.mirror._auth) is not in cmh.hub.mirror.__all__" in (
        first.stdout
    )
    assert "note: cmh.hub.mirror.fleet is not in PRIVATE" in first.stdout
    assert "from .stores.local._folder import add_folder  # straggler" in app.read_text()
    assert "from cmh.hub.mirror import load_tokens" in common.read_text()
    assert "from cmh.hub.mirror._auth import bearer_token" in plan.read_text()
    assert not (root / "hub/mirror/fleet.py").exists()
    assert "from cmh.hub.cache import RepoLayout" in (root / "hub/mirror/_fleet.py").read_text()
    assert '"cmh.hub.mirror._app.X"' in test.read_text()
    assert "hub/mirror/_app.py:12" in doc.read_text()

    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    touched = {line[3:].split(" -> ")[-1] for line in status.splitlines()}
    assert touched == {
        "hub/mirror/_app.py",
        "cli/_common.py",
        "hub/prune/_plan.py",
        "hub/mirror/_fleet.py",
        "tests/test_cli_help.py",
        "docs/mirror.md",
    }

    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    second = run(root)
    assert second.returncode == 1  # the missing name is still reported, nothing else
    assert "changed 0 files" in second.stdout
    unstaged = subprocess.run(
        ["git", "diff", "--name-only"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert not unstaged.strip()  # the first run's result staged, the second changed no file
