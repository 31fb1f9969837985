"""Compatibility promise: stock loaders load stamped files with bit-identical tensors."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from format_support import synthetic_tensors
from safetensors import safe_open

import cmh
import cmh.torch

MakeFile = Callable[..., Path]


def _save_and_stamp(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` as a safetensors file at ``path`` and stamp it."""
    safetensors.torch.save_file(tensors, str(path))
    cmh.stamp(path)


def test_numpy_torch_and_safe_open_load_stamped_files(make_file: MakeFile, tmp_path: Path) -> None:
    original = make_file(metadata={"format": "pt"})
    stamped = tmp_path / "stamped.safetensors"
    shutil.copyfile(original, stamped)
    cmh.stamp(stamped, ttl="30d")
    expected = safetensors.numpy.load_file(str(original))
    got = safetensors.numpy.load_file(str(stamped))
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].tobytes() == expected[name].tobytes()
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape
    expected_t = safetensors.torch.load_file(str(original))
    got_t = safetensors.torch.load_file(str(stamped))
    for name in expected_t:
        assert torch.equal(got_t[name], expected_t[name])
    with safe_open(str(stamped), framework="pt") as f:
        metadata = f.metadata()
        assert metadata["format"] == "pt" and len(metadata["cmh"]) == 128
        for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            assert torch.equal(f.get_tensor(name), expected_t[name])


def test_torch_dtypes_survive_stamping(tmp_path: Path) -> None:
    tensors = {
        "bf16": torch.randn(4, 3).to(torch.bfloat16),
        "f8": torch.randn(8).to(torch.float8_e4m3fn),
        "f8b": torch.randn(8).to(torch.float8_e5m2),
        "bool": torch.tensor([True, False, True]),
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
    }
    path = tmp_path / "t.safetensors"
    _save_and_stamp(path, tensors)
    loaded = safetensors.torch.load_file(str(path))
    verified = cmh.torch.load_file(path)
    for name, value in tensors.items():
        assert torch.equal(loaded[name].view(torch.uint8), value.view(torch.uint8))
        assert torch.equal(verified[name].view(torch.uint8), value.view(torch.uint8))
        assert verified[name].dtype == value.dtype


def test_verified_loading_refuses_tampered_and_unstamped(make_file: MakeFile) -> None:
    path = make_file(tensors={k: v for k, v in synthetic_tensors(2).items() if v.dtype != np.int8})
    with pytest.raises(cmh.VerificationError, match="no CMH record"):
        cmh.torch.load_file(path)
    assert cmh.torch.load_file(path, verify=False).keys()
    cmh.stamp(path, ttl="1h", now=1_000)
    with pytest.raises(cmh.VerificationError, match="expired"):
        cmh.torch.load_file(path)
    assert cmh.torch.load_file(path, at=1_001)
    header = cmh.read_header(path)
    entry = header.by_name()["layer.1.weight"]
    with open(path, "r+b") as f:
        f.seek(header.data_start + entry.begin)
        f.write(b"\x00\x00")
    with pytest.raises(cmh.VerificationError, match=r"layer\.1\.weight") as info:
        cmh.torch.load_file(path, at=1_001)
    assert info.value.result.mismatched == ("layer.1.weight",)  # type: ignore[attr-defined]


@pytest.mark.heavy
def test_transformers_loads_the_stamped_minilm_bit_identically(
    minilm_dir: Path, minilm_copy: Path
) -> None:
    from transformers import AutoModel, AutoTokenizer

    weights = minilm_copy / "model.safetensors"
    cmh.stamp(weights, ttl="30d")
    assert cmh.verify(weights).ok
    assert weights.read_bytes() != (minilm_dir / "model.safetensors").read_bytes()

    original = safetensors.torch.load_file(str(minilm_dir / "model.safetensors"))
    stamped = safetensors.torch.load_file(str(weights))
    verified = cmh.torch.load_file(weights)
    assert original.keys() == stamped.keys() == verified.keys()
    for name in original:
        assert torch.equal(original[name], stamped[name])
        assert torch.equal(original[name], verified[name])

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    batch = tokenizer(["Stamped weights load everywhere."], return_tensors="pt")
    embeddings = []
    for folder in (minilm_dir, minilm_copy):
        model = AutoModel.from_pretrained(str(folder))
        model.eval()
        with torch.no_grad():
            embeddings.append(model(**batch).last_hidden_state.mean(dim=1))
    assert torch.equal(embeddings[0], embeddings[1])


def test_verified_load_of_a_file_without_sha256_manifest_checks_the_root_from_bytes(
    tmp_path: Path,
) -> None:
    """Spec section 4: flags bit0 clear is valid; the root is then checked from the bytes."""
    from cmh._errors import VerificationError
    from cmh._verification import Outcome
    from cmh.torch import load_file

    vectors = Path(__file__).resolve().parent.parent / "fixtures" / "vectors"
    good = load_file(vectors / "no-sha256-manifest.safetensors", allow_expired=True)
    assert sorted(good) == ["bias", "weight"]
    bad = tmp_path / "bad.safetensors"
    shutil.copyfile(vectors / "root-mismatch-no-sha256.safetensors", bad)
    with pytest.raises(VerificationError) as caught:
        load_file(bad, allow_expired=True)
    assert caught.value.result.outcome is Outcome.ROOT_MISMATCH  # type: ignore[attr-defined]
    with pytest.raises(VerificationError) as unsupported:
        load_file(vectors / "record-version-2.safetensors", allow_expired=True)
    assert unsupported.value.result.outcome is Outcome.UNSUPPORTED_VERSION  # type: ignore[attr-defined]


def test_verified_load_owns_its_memory_and_reads_large_tensors_in_pieces(tmp_path: Path) -> None:
    # Larger than one read piece (4 MiB), an odd size, and an empty and a scalar tensor.
    big = torch.arange((9 << 20) // 4 + 3, dtype=torch.int32)
    tensors = {"big": big, "empty": torch.empty(0, 5), "scalar": torch.tensor(2.5)}
    path = tmp_path / "m.safetensors"
    _save_and_stamp(path, tensors)
    loaded = cmh.torch.load_file(path)
    for name, value in tensors.items():
        assert loaded[name].shape == value.shape and torch.equal(loaded[name], value)
    # The tensors are the loader's own memory, not a view of the file: a later
    # change to the file does not reach them, and writing to them leaves the file alone.
    header = cmh.read_header(path)
    entry = next(t for t in header.tensors if t.name == "big")
    with open(path, "r+b") as f:
        f.seek(header.data_start + entry.begin)
        f.write(b"\xff" * 64)
    assert torch.equal(loaded["big"], big)
    loaded["big"][0] = 7
    with pytest.raises(cmh.VerificationError):
        cmh.torch.load_file(path)


def test_a_tensors_pages_are_faulted_in_by_one_call_before_its_read() -> None:
    """``_populate`` (``madvise(MADV_POPULATE_WRITE)``) makes a fresh tensor's whole pages
    resident before ``preadv`` fills them: the process's resident memory grows by them at
    once. Where the kernel lacks the call it is a no-op, and so is this check."""
    from cmh.torch import _populate

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    size = 64 << 20
    fresh = torch.empty(size, dtype=torch.uint8)  # mapped, not yet touched
    before = resident()
    _populate(fresh.data_ptr() + 1, size - 1)  # whole pages only: the first is left alone
    grown = resident() - before
    if cmh.torch._populate_refused:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
    assert size - 2 * os.sysconf("SC_PAGE_SIZE") <= grown <= size + (1 << 20)
    del fresh


def test_verified_load_refuses_a_file_cut_while_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    _save_and_stamp(path, {"w": torch.ones(1 << 20)})
    header = cmh.read_header(path)
    from cmh.torch import _read_and_hash

    with open(path, "r+b") as f:
        f.truncate(header.data_start + 1000)
    with pytest.raises(cmh.VerificationError, match="truncated"):
        _read_and_hash(str(path), header, 2, hash_bytes=True)


def test_verified_load_takes_tensor_memory_in_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool thread's malloc arena is its own: memory taken there is never the memory an
    # earlier load freed, so each load would fault every page in afresh (issue 37).
    path = tmp_path / "m.safetensors"
    _save_and_stamp(path, {f"t{i}": torch.ones(1000 + i) for i in range(6)})
    threads: list[int] = []
    real_empty = torch.empty

    def empty(*args: object, **kwargs: object) -> torch.Tensor:
        threads.append(threading.get_ident())
        return real_empty(*args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(torch, "empty", empty)
    loaded = cmh.torch.load_file(path, threads=3)
    assert len(loaded) == 6 and torch.equal(loaded["t5"], torch.ones(1005))
    assert threads and set(threads) == {threading.get_ident()}


def test_a_refused_load_reads_nothing_after_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One thread, largest tensor first: the cut one fails first, and the small tensors
    # still queued are never read (the old loader read them all before refusing).
    path = tmp_path / "m.safetensors"
    small = {f"a{i:02d}": torch.ones(1 << 14) for i in range(20)}
    _save_and_stamp(path, {**small, "z_big": torch.ones(3 << 20)})
    header = cmh.read_header(path)
    big = header.by_name()["z_big"]
    assert all(t.end <= big.begin for t in header.tensors if t.name != "z_big")
    with open(path, "r+b") as f:
        f.truncate(header.data_start + big.begin + 4096)
    reads: list[int] = []
    real_preadv = os.preadv

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        reads.append(offset)
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", preadv)
    from cmh.torch import _read_and_hash

    with pytest.raises(cmh.VerificationError, match="truncated"):
        _read_and_hash(str(path), header, 1, hash_bytes=True)
    assert reads and min(reads) >= header.data_start + big.begin


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_piecewise_reading_hashes_every_tensor_in_order(tmp_path: Path, threads: int) -> None:
    # Tensors of 0, 1, 2 and 3 pieces and odd sizes (a piece is 4 MiB): whichever thread
    # reads a piece, each tensor's digest is the SHA-256 of its bytes in order.
    from cmh.torch import _read_and_hash

    rng = np.random.default_rng(threads)
    sizes = [0, 3, (4 << 20) - 1, 4 << 20, (4 << 20) + 5, (9 << 20) + 7, 12 << 20, 1000]
    tensors = {
        f"t{i}": torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
        for i, n in enumerate(sizes)
    }
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    header = cmh.read_header(path)
    got = _read_and_hash(str(path), header, threads, hash_bytes=True)
    for entry, (raw, digest) in zip(header.tensors, got, strict=True):
        expected = tensors[entry.name].numpy().tobytes()
        assert raw.numpy().tobytes() == expected
        assert digest == hashlib.sha256(expected).digest()


def test_one_large_tensor_is_read_by_every_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its digest is one SHA-256, hashed by one thread at a time, but its pieces are read by
    # any: two threads must both be reading it at once (the barrier), else this times out.
    path = tmp_path / "m.safetensors"
    _save_and_stamp(path, {"w": torch.ones(4 << 20)})  # 16 MiB, 4 pieces
    both = threading.Barrier(2, timeout=10)
    waited: set[int] = set()
    real_preadv = os.preadv

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        if threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            both.wait()
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", preadv)
    loaded = cmh.torch.load_file(path, threads=2)
    assert torch.equal(loaded["w"], torch.ones(4 << 20)) and len(waited) == 2


def test_ctrl_c_during_a_load_stops_every_reading_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C reaches the caller while it waits for the reading threads, one of them in its
    # first read; every read is let go only once the caller shuts the pool down. The old
    # loader then read all 8 pieces before the interrupt reached the caller's caller.
    import concurrent.futures
    import signal
    import sys
    import time

    path = tmp_path / "m.safetensors"
    _save_and_stamp(path, {"w": torch.ones(8 << 20)})  # 32 MiB, 8 pieces
    shut_down = threading.Event()
    reads: list[int] = []
    real_preadv, real_shutdown = os.preadv, concurrent.futures.ThreadPoolExecutor.shutdown

    caller = threading.main_thread().ident or 0

    def caller_waits_for_the_pool() -> bool:
        frame = sys._current_frames().get(caller)
        if frame is None or frame.f_code.co_name != "wait":
            return False
        while frame is not None:
            if frame.f_code.co_filename.endswith(os.path.join("concurrent", "futures", "_base.py")):
                return True
            frame = frame.f_back
        return False

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        reads.append(offset)
        if len(reads) == 1:
            deadline = time.monotonic() + 10
            while not caller_waits_for_the_pool() and time.monotonic() < deadline:
                time.sleep(0.001)
            signal.pthread_kill(caller, signal.SIGINT)
        shut_down.wait(10)
        return real_preadv(fd, buffers, offset)

    def shutdown(self: concurrent.futures.ThreadPoolExecutor, *args: Any, **kwargs: Any) -> None:
        shut_down.set()
        real_shutdown(self, *args, **kwargs)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(concurrent.futures.ThreadPoolExecutor, "shutdown", shutdown)
    running = set(threading.enumerate())
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            cmh.torch.load_file(path, threads=2)
    finally:
        signal.signal(signal.SIGINT, before)
    for thread in set(threading.enumerate()) - running:  # a thread left reading counts too
        thread.join(10)
    assert 1 <= len(reads) <= 2
