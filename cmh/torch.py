"""Verified loading into torch: each tensor's bytes are hashed as they are read.

``load_file(path, verify=True)`` reads every tensor once, straight into its own
tensor's memory, hashes each piece as it arrives (SHA-256, in threads that release
the GIL, so hashing overlaps reading on every core) and checks the
digests against the file's manifest and the manifest against the record, so
verification costs no second read. Tensors are returned only when all match.
torch is imported only when this module is.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import torch

from ._carrier import Carrier, read_carrier, user_metadata
from ._digests import default_threads, file_root, root_entries
from ._errors import (
    CarrierError,
    CMHError,
    NotStampedError,
    UnsupportedVersionError,
    VerificationError,
)
from ._header import Header, TensorEntry, read_header
from ._regular import open_regular
from ._verification import Outcome, Problem, VerifyResult

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "U64": torch.uint64,
    "C64": torch.complex64,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3": torch.float8_e4m3fn,
}


def load_file(
    path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    *,
    verify: bool = True,
    allow_expired: bool = False,
    at: float | None = None,
    threads: int | None = None,
) -> dict[str, torch.Tensor]:
    """Load a safetensors file like ``safetensors.torch.load_file``.

    With ``verify`` (the default) the file must be stamped, its tensors must
    match the SHA-256 manifest, the manifest must match the record, and the
    record must be unexpired (unless ``allow_expired``); otherwise
    :class:`~cmh._errors.VerificationError` is raised and nothing is returned.
    A file without a SHA-256 manifest (flags bit0 clear) has its root checked
    from the bytes read instead.
    """
    target = os.fspath(path)
    header = read_header(target)
    carrier = _checked_carrier(target, header, allow_expired, at) if verify else None
    buffers = _read_and_hash(target, header, threads, hash_bytes=verify)
    if carrier is not None and carrier.sha256 is None:
        digests = [d for _, d in buffers if d is not None]
        root = file_root(root_entries(header.tensors, digests), user_metadata(header.metadata))
        if root != carrier.record.fingerprint:
            raise _refusal(
                target, Outcome.ROOT_MISMATCH, "fingerprint root does not match the record"
            )
    if carrier is not None and carrier.sha256 is not None:
        expected = dict(zip((t.name for t in header.tensors), carrier.sha256, strict=True))
        bad = [
            t.name
            for t, (_, d) in zip(header.tensors, buffers, strict=True)
            if d != expected[t.name]
        ]
        if bad:
            shown = ", ".join(repr(n) for n in bad[:10])
            result = VerifyResult(
                target,
                Outcome.TENSOR_MISMATCH,
                (
                    Problem(
                        Outcome.TENSOR_MISMATCH, f"tensor bytes changed since stamping: {shown}"
                    ),
                ),
                mismatched=tuple(bad),
            )
            raise VerificationError(f"{target}: refusing to load: {result.message}", result)
    out: dict[str, torch.Tensor] = {}
    for t, (raw, _) in zip(header.tensors, buffers, strict=True):
        out[t.name] = _to_tensor(t, raw).to(device)
    return out


_ROOT_MISMATCH = "fingerprint root does not match the record"


def _refusal(path: str, outcome: Outcome, message: str) -> VerificationError:
    result = VerifyResult(path, outcome, (Problem(outcome, message),))
    return VerificationError(f"{path}: refusing to load: {message}", result)


def _checked_carrier(path: str, header: Header, allow_expired: bool, at: float | None) -> Carrier:
    """The file's carrier, its manifest root checked against the record, unexpired."""
    try:
        carrier = read_carrier(header.metadata, len(header.tensors))
    except UnsupportedVersionError as exc:
        raise _refusal(path, Outcome.UNSUPPORTED_VERSION, str(exc)) from exc
    except CarrierError as exc:
        raise _refusal(path, Outcome.MANIFEST_INCONSISTENT, str(exc)) from exc
    except CMHError as exc:
        raise _refusal(path, Outcome.CORRUPT_RECORD, str(exc)) from exc
    if carrier is None:
        message = "file carries no CMH record"
        raise _refusal(path, Outcome.UNSTAMPED, message) from NotStampedError(path)
    if carrier.sha256 is not None:
        entries = root_entries(header.tensors, carrier.sha256)
        if file_root(entries, user_metadata(header.metadata)) != carrier.record.fingerprint:
            raise _refusal(
                path, Outcome.ROOT_MISMATCH, "fingerprint root does not match the record"
            )
    now = time.time() if at is None else at
    if carrier.record.is_expired(now) and not allow_expired:
        message = f"expired at Unix time {carrier.record.expires_at}"
        raise _refusal(path, Outcome.EXPIRED, message)
    return carrier


_PIECE = 4 << 20  # read, then hash, a piece at a time: the hash finds it in the CPU cache


def _read_and_hash(
    path: str, header: Header, threads: int | None, *, hash_bytes: bool
) -> list[tuple[torch.Tensor, bytes | None]]:
    """Each tensor's bytes read straight into its own (uninitialised) tensor, hashed as read.

    One kernel copy per byte (``preadv`` into the tensor's memory) and, when verifying,
    one SHA-256 pass over each piece just after it was read, while it is still in the
    CPU cache; tensors are spread over threads (both calls release the GIL), largest
    first, so hashing overlaps reading on every core. The first failure (or an interrupt
    of the caller) stops every thread at its next piece: a refused load reads no further.
    """
    regular = open_regular(path)  # never blocks on a FIFO swapped in since the header
    fd = regular.fileno()
    stop = threading.Event()
    try:
        # The memory comes from the caller's thread, not the pool's: a pool thread's malloc
        # arena is its own, so memory a previous load freed there would not be reused and
        # every page of every tensor would be faulted in afresh.
        outs = [torch.empty(t.nbytes, dtype=torch.uint8) for t in header.tensors]

        def work(index: int) -> bytes | None:
            t, out = header.tensors[index], outs[index]
            digest = hashlib.sha256() if hash_bytes else None
            if t.nbytes:
                memory = (ctypes.c_char * t.nbytes).from_address(out.data_ptr())
                with memoryview(memory).cast("B") as view:
                    update = digest.update if digest is not None else None
                    try:
                        _read_into(fd, view, header.data_start + t.begin, update, stop, path)
                    except BaseException:
                        stop.set()  # the tensors still queued are not read
                        raise
            return digest.digest() if digest is not None else None

        order = sorted(range(len(outs)), key=lambda i: -header.tensors[i].nbytes)
        with ThreadPoolExecutor(max_workers=threads or default_threads()) as pool:
            futures = {i: pool.submit(work, i) for i in order}
            try:
                wait(futures.values(), return_when=FIRST_EXCEPTION)
            finally:  # after a failure or an interrupt, the other reads stop at their next piece
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
        for future in futures.values():
            failure = None if future.cancelled() else future.exception()
            if failure is not None and not isinstance(failure, _Stopped):
                raise failure
        return [(outs[i], futures[i].result()) for i in range(len(outs))]
    finally:
        regular.close()


class _Stopped(Exception):
    """Another tensor's read failed (or the caller was interrupted): this one stops."""


def _read_into(
    fd: int,
    view: memoryview,
    offset: int,
    update: Callable[[memoryview], None] | None,
    stop: threading.Event,
    path: str,
) -> None:
    """Fill ``view`` from ``fd`` at ``offset``, a piece at a time, hashing each piece."""
    done = 0
    while done < len(view):
        if stop.is_set():
            raise _Stopped
        with view[done : done + _PIECE] as piece:
            got = 0
            while got < len(piece):
                with piece[got:] as rest:
                    n = os.preadv(fd, [rest], offset + done + got)
                if n == 0:
                    raise VerificationError(f"{path}: file was truncated while it was read")
                got += n
            if update is not None:
                update(piece)
        done += got


def _to_tensor(t: TensorEntry, raw: torch.Tensor) -> torch.Tensor:
    dtype = _TORCH_DTYPES.get(t.dtype)
    if dtype is None:
        raise CMHError(f"dtype {t.dtype} of tensor {t.name!r} has no torch equivalent")
    if t.nbytes == 0:
        return torch.empty(t.shape, dtype=dtype)
    return raw.view(dtype).reshape(t.shape)
