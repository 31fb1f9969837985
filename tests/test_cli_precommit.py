"""The published pre-commit hooks, run by the real pre-commit in a scratch repository.

The hook repository is a local git repository holding this project's
``.pre-commit-hooks.yaml``; ``cmh-verify-system`` runs the ``cmh`` on PATH, so
nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import flip_tensor_byte, tensors
from safetensors.numpy import save_file

import cmh

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (BIN / "pre-commit").exists(),
    reason="needs git and pre-commit (the dev extra)",
)


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_manifest_is_valid() -> None:
    proc = subprocess.run(
        [str(BIN / "pre-commit"), "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_hook_refuses_commits_of_bad_weights(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    env.pop("CMH_KEY_PASSPHRASE", None)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    assert git(hooks, "init", "-q", env=env).returncode == 0
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", hooks / ".pre-commit-hooks.yaml")
    git(hooks, "add", ".pre-commit-hooks.yaml", env=env)
    assert git(hooks, "commit", "-q", "-m", "hooks", env=env).returncode == 0
    rev = git(hooks, "rev-parse", "HEAD", env=env).stdout.strip()

    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", env=env)
    (work / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hooks}\n    rev: {rev}\n    hooks:\n      - id: cmh-verify-system\n"
    )
    install = subprocess.run(
        [str(BIN / "pre-commit"), "install"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    model = work / "model.safetensors"
    save_file(tensors(11), str(model))
    cmh.stamp(model, "30d")
    (work / "README.md").write_text("weights\n")
    git(work, "add", ".", env=env)
    ok = git(work, "commit", "-q", "-m", "stamped weights", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    head = git(work, "rev-parse", "HEAD", env=env).stdout

    flip_tensor_byte(model, "layer.2.weight")
    git(work, "add", "model.safetensors", env=env)
    refused = git(work, "commit", "-q", "-m", "tampered weights", env=env)
    assert refused.returncode != 0
    report = refused.stdout + refused.stderr
    assert "tensor_mismatch" in report and "'layer.2.weight'" in report
    assert git(work, "rev-parse", "HEAD", env=env).stdout == head

    cmh.stamp(model)  # restamped after the change: accepted again
    unstamped = work / "extra.safetensors"
    save_file(tensors(12), str(unstamped))
    git(work, "add", ".", env=env)
    refused = git(work, "commit", "-q", "-m", "unstamped file", env=env)
    assert refused.returncode != 0 and "unstamped" in refused.stdout + refused.stderr
    cmh.stamp(unstamped)
    git(work, "add", ".", env=env)
    ok = git(work, "commit", "-q", "-m", "all stamped", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
