"""Helpers for the resolver tests: stamped checkpoints and a fault-injecting proxy.

``write_checkpoint_repo(folder, version, ...)`` writes a small model repo whose
``model.safetensors`` is stamped; ``version`` changes a chosen set of tensors
only, so a new revision differs by a known number of tensor bytes.

``FaultProxy(upstream)`` is a loopback aiohttp proxy in front of a mirror that
forwards every request and, on ``GET .../resolve/...`` answers, can drop the
connection after N bytes, truncate the body (a shorter, well-framed answer),
or replace bytes (same length). It counts what it forwarded.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import ClientSession, web
from loop_server import LoopServer
from safetensors.numpy import save_file

import cmh


def tensors_for(version: int, count: int = 8, elems: int = 96_000, changed: tuple[int, ...] = (3,)):
    """``count`` float32 tensors of ``elems`` each; tensors in ``changed`` depend on ``version``."""
    out: dict[str, np.ndarray] = {}
    for i in range(count):
        seed = 1000 * version + i if i in changed else i
        rng = np.random.default_rng(seed)
        out[f"layer.{i}.weight"] = rng.standard_normal(elems).astype(np.float32)
    return out


def write_checkpoint_repo(
    folder: Path,
    version: int,
    *,
    count: int = 8,
    elems: int = 96_000,
    changed: tuple[int, ...] = (3,),
    ttl: str | None = "30d",
    stamp: bool = True,
) -> Path:
    """A model folder: config.json, README.md and a (stamped) model.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "toy", "count": count}) + "\n")
    (folder / "README.md").write_text(f"# toy v{version}\n")
    path = folder / "model.safetensors"
    save_file(tensors_for(version, count, elems, changed), str(path), {"format": "np"})
    if stamp:
        cmh.stamp(path, ttl=ttl, now=1_700_000_000 if ttl is None else None)
    return folder


@dataclass
class Fault:
    """What to do to matching answers: ``kind`` is drop, truncate, corrupt or status.

    ``status``: answer ``status_code`` (with ``Retry-After: retry_after`` when set)
    instead of the upstream's answer.
    """

    kind: str
    times: int = 1  # how many answers to damage
    at: int | None = None  # byte offset in the body (random if None)
    path_contains: str = "model.safetensors"
    seed: int = 0
    applied: int = 0
    status_code: int = 503
    retry_after: str | None = None
    multi_range: bool = False  # only requests that ask several ranges (multipart answers)


@dataclass
class ProxyStats:
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, range
    arrived: list[float] = field(default_factory=list)  # time.monotonic() of each request
    body_bytes: int = 0

    def count(self, contains: str = "", method: str | None = None) -> int:
        return sum(
            1 for m, p, _ in self.requests if contains in p and (method is None or m == method)
        )


class FaultProxy(LoopServer):
    """A loopback HTTP proxy in its own thread (``url``; ``stop()``)."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.faults: list[Fault] = []
        self.delay = 0.0  # seconds slept per 64 KiB of file body (slows downloads down)
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self.start()

    async def on_start(self) -> None:
        self._session = ClientSession(auto_decompress=False)

    async def on_stop(self) -> None:
        await self._session.close()

    def _take_fault(self, method: str, path: str, ranges: str | None = None) -> Fault | None:
        with self._lock:
            for f in self.faults:
                wanted = method == "GET" and "/resolve/" in path and f.path_contains in path
                if f.multi_range and "," not in (ranges or ""):
                    continue
                if wanted and f.applied < f.times:
                    f.applied += 1
                    return f
        return None

    async def handler(self, request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        with self._lock:
            self.stats.requests.append((request.method, request.path, request.headers.get("Range")))
            self.stats.arrived.append(time.monotonic())
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "content-length", "transfer-encoding", "connection")
        }
        body = await request.read()
        async with self._session.request(
            request.method, self.upstream + path, headers=headers, data=body or None,
            allow_redirects=False,
        ) as up:  # fmt: skip
            payload = await up.read()
            out_headers = {
                k: v
                for k, v in up.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection")
            }
            fault = (
                self._take_fault(request.method, request.path, request.headers.get("Range"))
                if up.status < 300
                else None
            )
            with self._lock:
                self.stats.body_bytes += len(payload)
            if fault is None and self.delay and "/resolve/" in request.path and payload:
                response = web.StreamResponse(status=up.status, headers=out_headers)
                response.content_length = len(payload)
                await response.prepare(request)
                for i in range(0, len(payload), 1 << 16):
                    await response.write(payload[i : i + (1 << 16)])
                    await asyncio.sleep(self.delay)  # a slow link, not a wait
                await response.write_eof()
                return response
            if fault is not None and fault.kind == "status":
                extra = {} if fault.retry_after is None else {"Retry-After": fault.retry_after}
                return web.Response(status=fault.status_code, headers=extra, text="busy")
            if fault is None or not payload:
                return web.Response(status=up.status, headers=out_headers, body=payload)
            rng = random.Random(fault.seed + fault.applied)
            at = fault.at if fault.at is not None else rng.randrange(1, len(payload))
            at = max(0, min(at, len(payload) - 1))
            if fault.kind == "corrupt":
                damaged = bytearray(payload)
                for i in range(at, min(len(payload), at + 64)):
                    damaged[i] ^= 0xFF
                return web.Response(status=up.status, headers=out_headers, body=bytes(damaged))
            if fault.kind == "truncate":
                out_headers.pop("Content-Range", None)
                return web.Response(status=up.status, headers=out_headers, body=payload[:at])
            # drop: announce the full length, send part of it, then cut the connection
            response = web.StreamResponse(status=up.status, headers=out_headers)
            response.content_length = len(payload)
            await response.prepare(request)
            await response.write(payload[:at])
            transport = request.transport
            if transport is not None:
                transport.close()  # flush what was written, then end the connection early
            return response


def blob_files(cache: Path) -> dict[str, Any]:
    """Every blob under a cache: name -> size."""
    return {p.name: p.stat().st_size for p in cache.rglob("blobs/*") if p.is_file()}
