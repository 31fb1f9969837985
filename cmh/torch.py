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
import errno
import hashlib
import os
import threading
import time
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
from ._libc import libc_function
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
    one SHA-256 pass over each piece, in order, mostly just after it was read while it is
    still in the CPU cache. Threads (both calls release the GIL) take pieces, largest
    tensor first: a tensor's digest is one SHA-256 over its bytes, so one thread at a
    time hashes it, while the others read its next pieces or other tensors; a tensor
    larger than the rest together keeps every core busy to its end. The first failure
    (or an interrupt of the caller) stops every thread at its next piece: a refused load
    reads no further.
    """
    regular = open_regular(path)  # never blocks on a FIFO swapped in since the header
    try:
        # The memory comes from the caller's thread, not the pool's: a pool thread's malloc
        # arena is its own, so memory a previous load freed there would not be reused and
        # every page of every tensor would be faulted in afresh.
        outs = [torch.empty(t.nbytes, dtype=torch.uint8) for t in header.tensors]
        order = sorted(range(len(outs)), key=lambda i: -header.tensors[i].nbytes)
        tensors = [
            _TensorRead(outs[i], header.data_start + header.tensors[i].begin, hash_bytes)
            for i in order
        ]
        job = _Pieces(regular.fileno(), path, tensors)
        workers = max(1, min(threads or default_threads(), sum(t.pieces for t in tensors)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            try:
                futures = [pool.submit(job.work) for _ in range(workers)]
                wait(futures, return_when=FIRST_EXCEPTION)
            finally:  # after a failure or an interrupt, the other reads stop at their next piece
                job.stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
        for future in futures:
            failure = None if future.cancelled() else future.exception()
            if failure is not None and not isinstance(failure, _Stopped):
                raise failure
        digests = {i: t.result() for i, t in zip(order, tensors, strict=True)}
        return [(outs[i], digests[i]) for i in range(len(outs))]
    finally:
        regular.close()


class _Stopped(Exception):
    """Another piece's read failed (or the caller was interrupted): this thread stops."""


class _TensorRead:
    """One tensor being read: which pieces are claimed and read, and its hash's progress."""

    def __init__(self, out: torch.Tensor, offset: int, hash_bytes: bool) -> None:
        nbytes = out.numel()
        self.address = out.data_ptr()
        memory = (ctypes.c_char * nbytes).from_address(self.address) if nbytes else b""
        self.out = out  # the view does not own the memory: a thread left behind still may
        self.view = memoryview(memory).cast("B")
        self.offset = offset
        self.pieces = -(-nbytes // _PIECE)
        self.claimed = 0  # pieces handed to a reader, in order
        self.read = [False] * self.pieces
        self.hashed = 0  # pieces hashed, in order
        self.hashing = False  # a thread is hashing this tensor's next pieces
        self.digest = hashlib.sha256() if hash_bytes else None

    def piece(self, k: int) -> memoryview:
        return self.view[k * _PIECE : (k + 1) * _PIECE]

    def result(self) -> bytes | None:
        return self.digest.digest() if self.digest is not None else None


class _Pieces:
    """The pieces of every tensor, handed to threads in order, largest tensor first.

    Under ``lock``: the next piece to claim, and who hashes. A thread that read the piece
    a tensor's hash waits for, while no thread hashes that tensor, hashes it and every
    following piece already read, then goes back to reading.
    """

    def __init__(self, fd: int, path: str, tensors: list[_TensorRead]) -> None:
        self.fd, self.path, self.tensors = fd, path, tensors
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.open = 0  # tensors before this one have every piece claimed

    def work(self) -> None:
        try:
            while (claim := self._claim()) is not None:
                tensor, k = claim
                with tensor.piece(k) as piece:
                    _populate(tensor.address + k * _PIECE, len(piece))
                    _read_piece(self.fd, piece, tensor.offset + k * _PIECE, self.path)
                if self._takes_hash(tensor, k):
                    self._hash(tensor)
        except BaseException:
            self.stop.set()  # the pieces still unclaimed are not read
            raise

    def _claim(self) -> tuple[_TensorRead, int] | None:
        if self.stop.is_set():
            raise _Stopped
        with self.lock:
            while self.open < len(self.tensors):
                tensor = self.tensors[self.open]
                if tensor.claimed < tensor.pieces:
                    tensor.claimed += 1
                    return tensor, tensor.claimed - 1
                self.open += 1
            return None

    def _takes_hash(self, tensor: _TensorRead, k: int) -> bool:
        with self.lock:
            tensor.read[k] = True
            if tensor.digest is None or tensor.hashing or tensor.hashed != k:
                return False
            tensor.hashing = True
            return True

    def _hash(self, tensor: _TensorRead) -> None:
        digest = tensor.digest
        while digest is not None:
            if self.stop.is_set():
                raise _Stopped
            with tensor.piece(tensor.hashed) as piece:
                digest.update(piece)
            with self.lock:
                tensor.hashed += 1
                if tensor.hashed == tensor.pieces or not tensor.read[tensor.hashed]:
                    tensor.hashing = False
                    return


#: ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14, ``<asm-generic/mman-common.h>``): a piece's
#: pages are faulted in by one call before the read fills them, instead of one trap per
#: 4 KiB page during the copy. 2 GiB in 200 tensors, verified, four rounds each way in
#: fresh processes: 2.36-2.41 CPU-s against 2.50-2.68, 1.20-1.23 s against 1.27-1.37 s.
_MADV_POPULATE_WRITE = 23
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_populate_refused = False  # the kernel has no MADV_POPULATE_WRITE: not asked again


def _populate(address: int, length: int) -> None:
    """Fault in the whole pages of ``[address, address + length)`` for writing, in one call;
    a no-op where the call is missing or refused (the read then faults them one by one)."""
    global _populate_refused
    begin = -(-address // _PAGE) * _PAGE
    end = (address + length) // _PAGE * _PAGE
    if _populate_refused or end <= begin:
        return
    madvise = libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    if madvise is None:
        return
    if (
        madvise(begin, end - begin, _MADV_POPULATE_WRITE) != 0
        and ctypes.get_errno() == errno.EINVAL
    ):
        _populate_refused = True


def _read_piece(fd: int, piece: memoryview, offset: int, path: str) -> None:
    """Fill ``piece`` from ``fd`` at ``offset``."""
    got = 0
    while got < len(piece):
        with piece[got:] as rest:
            n = os.preadv(fd, [rest], offset + got)
        if n == 0:
            raise VerificationError(f"{path}: file was truncated while it was read")
        got += n


def _to_tensor(t: TensorEntry, raw: torch.Tensor) -> torch.Tensor:
    dtype = _TORCH_DTYPES.get(t.dtype)
    if dtype is None:
        raise CMHError(f"dtype {t.dtype} of tensor {t.name!r} has no torch equivalent")
    if t.nbytes == 0:
        return torch.empty(t.shape, dtype=dtype)
    return raw.view(dtype).reshape(t.shape)
