"""``cmh pull`` says what happened in words, and a repo that is not there gets a hint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli_support import run_subprocess


def pull(mirror: Any, cache: Path, *args: str) -> Any:
    return run_subprocess(
        ["pull", *args, "--cache-dir", cache, "--endpoint", mirror.url],
        env={"HF_HUB_OFFLINE": None},
    )


def test_first_and_second_pull_in_words(mirror: Any, tmp_path: Path) -> None:
    first = pull(mirror, tmp_path / "cache", "cmh-test/tiny")
    assert first.exit_code == 0, first.stderr
    assert "downloaded commit" in first.stderr and "(it was not in the cache)" in first.stderr
    assert "missing" not in first.stderr and "kB downloaded" in first.stderr
    again = pull(mirror, tmp_path / "cache", "cmh-test/tiny", "--revalidate")
    assert again.exit_code == 0 and "up to date: commit" in again.stderr, again.stderr
    assert "the Hub confirmed it; 1 request" in again.stderr


def test_a_repo_that_is_not_there_names_spelling_and_token(mirror: Any, tmp_path: Path) -> None:
    run = pull(mirror, tmp_path / "cache", "cmh-test/tinny")
    assert run.exit_code == 3
    assert "check the spelling" in run.stderr and "HF_TOKEN" in run.stderr
