"""The test hook of the injected clock (docs/testing.md, "Time"): the file that
``CMH_TEST_CLOCK_FILE`` names moves a process's clock only with ``CMH_TEST_HOOKS=1``.

Was: the variable alone was honoured by every hub command, so one left in a production
environment (here: 60 days) made ``cmh prune --expired`` delete a snapshot whose stamp
has 30 days to go.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.cache import CLOCK_FILE_ENV, SYSTEM_CLOCK, TEST_HOOKS_ENV, process_clock
from mirror_support import ProcessClock
from prune_support import CacheBuilder
from safetensors.numpy import save_file

from cmh import stamp

SIXTY_DAYS = 60 * 86400


@pytest.mark.parametrize("switch", [None, "", "0", "true", "yes"])
def test_the_clock_file_without_the_switch_moves_no_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str | None
) -> None:
    clock_file = tmp_path / "clock"
    clock_file.write_text(str(SIXTY_DAYS))
    monkeypatch.setenv(CLOCK_FILE_ENV, str(clock_file))
    if switch is None:
        monkeypatch.delenv(TEST_HOOKS_ENV, raising=False)
    else:
        monkeypatch.setenv(TEST_HOOKS_ENV, switch)
    assert process_clock() is SYSTEM_CLOCK
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    assert process_clock().time() - time.time() > SIXTY_DAYS - 60


def test_a_stray_clock_file_makes_no_command_delete_a_fresh_snapshot(tmp_path: Path) -> None:
    """``cmh prune --expired`` with the clock file alone keeps a snapshot stamped for 30
    days; with the test helpers' environment (both variables) it is 60 days later."""
    weights = tmp_path / "model.safetensors"
    save_file({"w": np.arange(16, dtype=np.float32)}, str(weights))
    stamp(weights, ttl="30d")
    root = tmp_path / "cache"
    commit = CacheBuilder(root).revision(
        "org/stamped", {"model.safetensors": weights.read_bytes()}, fetched=time.time()
    )
    snapshot = root / "models--org--stamped" / "snapshots" / commit
    clock = ProcessClock(tmp_path / "clock")
    clock.advance(SIXTY_DAYS)
    prune = ["prune", "--cache-dir", str(root), "--expired", "--include-referenced", "--yes"]
    stray = CliRunner(env={CLOCK_FILE_ENV: str(clock.path), TEST_HOOKS_ENV: None})
    kept = stray.invoke(cli, prune)
    assert kept.exit_code == 0, kept.output
    assert snapshot.is_dir()
    gone = CliRunner(env=clock.env).invoke(cli, prune)
    assert gone.exit_code == 0, gone.output
    assert not snapshot.exists()
