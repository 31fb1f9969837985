"""Random mutations of valid files: only typed errors, no other exception, no hang."""

from __future__ import annotations

import contextlib
import struct
import tempfile
from pathlib import Path

from format_support import synthetic_tensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import cmh


def _seed_files() -> list[bytes]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed, stamp in ((0, False), (1, True)):
            path = Path(tmp) / f"{seed}.safetensors"
            save_file(synthetic_tensors(seed, count=3), str(path), {"format": "pt"})
            if stamp:
                cmh.stamp(path, ttl="30d")
            out.append(path.read_bytes())
    return out


SEEDS = _seed_files()

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.integers(1, 16)),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1), st.just(0)),
    st.tuples(st.just("ascii"), st.integers(0, 10_000), st.sampled_from(b'{}[]",:0123456789-e. ')),
)


def mutate(data: bytes, steps: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for kind, position, value in steps:
        at = position % (len(buf) + 1)
        if kind == "flip" and buf:
            buf[at % len(buf)] ^= value
        elif kind == "truncate":
            del buf[at:]
        elif kind == "insert":
            buf[at:at] = bytes([value])
        elif kind == "delete":
            del buf[at : at + value]
        elif kind == "length" and len(buf) >= 8:
            buf[:8] = struct.pack("<Q", position)
        elif kind == "ascii" and buf:
            buf[at % len(buf)] = value
    return bytes(buf)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.sampled_from(range(len(SEEDS))), steps=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_files_give_typed_errors_only(seed: int, steps: list[tuple[str, int, int]]) -> None:
    data = mutate(SEEDS[seed], steps)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        path.write_bytes(data)
        with contextlib.suppress(cmh.InvalidFileError):
            cmh.read_header(path)
        verdict = cmh.verify(path)  # never raises for a bad file
        assert isinstance(verdict.outcome, cmh.Outcome)
        with contextlib.suppress(cmh.CMHError):
            cmh.inspect(path)
        try:
            cmh.stamp(path)
        except cmh.CMHError:
            assert path.read_bytes() == data  # nothing written on failure
        else:
            assert cmh.verify(path).ok
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["m.safetensors"]
