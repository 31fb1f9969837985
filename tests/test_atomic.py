"""The durability helpers of ``cmh._atomic``: writeback started early, synced at the end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cmh import _atomic


def _dirty_file(path: Path, size: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, os.urandom(size))
    return fd


@pytest.mark.skipif(sys.platform != "linux", reason="sync_file_range is Linux only")
def test_start_writeback_queues_a_range_and_the_file_keeps_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    fd = _dirty_file(path, 3 << 20)
    try:
        before = os.pread(fd, 3 << 20, 0)
        _atomic.start_writeback(fd, 1 << 20, 1 << 20)
        _atomic.start_writeback(fd)  # the whole file
        assert callable(_atomic._sync_file_range())  # the libc call was found, not skipped
        os.fsync(fd)
        assert os.pread(fd, 3 << 20, 0) == before
    finally:
        os.close(fd)


def test_start_writeback_is_silent_on_a_descriptor_it_cannot_use(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    os.close(_dirty_file(path, 4096))
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)
    _atomic.start_writeback(fd)  # closed: EBADF is ignored (the final fsync reports errors)


def test_start_writeback_is_a_no_op_where_the_call_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_atomic, "_sync_file_range", lambda: None)
    fd = _dirty_file(tmp_path / "data.bin", 4096)
    try:
        _atomic.start_writeback(fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def test_temporary_names_stay_within_name_max_whatever_the_target(tmp_path: Path) -> None:
    """A 255-byte name (legal) got a temporary name over NAME_MAX (ENAMETOOLONG)."""
    short = _atomic.temp_path(tmp_path / "config.json", "link")
    assert os.path.basename(short).startswith(".config.json.cmh-link.")
    names = ["L" * 251 + ".txt", "L" * 250 + ".txt", "é" * 127]  # 255, 254, 254 bytes
    temps = [_atomic.temp_path(tmp_path / n, "incoming", ".tmp") for n in names]
    assert len(set(temps)) == 3  # still one per target
    for name, temp in zip(names, temps, strict=True):
        assert os.path.dirname(temp) == str(tmp_path)
        assert len(os.fsencode(os.path.basename(temp))) <= 64
        _atomic.atomic_write(tmp_path / name, b"x")  # each step works on the real name
        _atomic.atomic_symlink(tmp_path / (name[:-4] + ".lnk"), name)
        assert (tmp_path / (name[:-4] + ".lnk")).read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
