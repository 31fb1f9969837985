"""Running ``cmh`` in tests: through click's CliRunner, or as a real subprocess.

Both runners return a :class:`Run`; both fail the test when a traceback would
reach the user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner
from safetensors.numpy import save_file

CMH = Path(sys.executable).parent / "cmh"

Env = Mapping[str, str | None]


@dataclass(frozen=True)
class Run:
    """What one invocation printed and how it exited."""

    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        document = json.loads(self.stdout)
        assert isinstance(document, dict)
        return document


def run_runner(args: list[str], env: Env | None = None, input: str | None = None) -> Run:
    """Invoke the click group in this process."""
    from cmh.cli.main import cli

    result = CliRunner().invoke(cli, [str(a) for a in args], env=dict(env or {}), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"cmh raised {result.exception!r}") from result.exception
    assert "Traceback" not in result.stderr
    return Run(result.exit_code, result.stdout, result.stderr)


def run_subprocess(args: list[str], env: Env | None = None, input: str | None = None) -> Run:
    """Run the installed ``cmh`` console script."""
    full_env = dict(os.environ)
    full_env["HF_HUB_OFFLINE"] = "1"
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    proc = subprocess.run(
        [str(CMH), *[str(a) for a in args]],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return Run(proc.returncode, proc.stdout, proc.stderr)


RUNNERS: dict[str, Callable[..., Run]] = {"runner": run_runner, "subprocess": run_subprocess}


def closed_port() -> int:
    """A loopback port nobody listens on: a connection to it is refused."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unreachable_bucket_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``cmh`` whose bucket storage refuses every connection."""
    none = str(tmp_path / "none")
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}", "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "cmh-test-key", "AWS_SECRET_ACCESS_KEY": "cmh-test-secret",
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": none,
        "AWS_SHARED_CREDENTIALS_FILE": none,
    }  # fmt: skip


def tensors(seed: int, count: int = 6) -> dict[str, np.ndarray]:
    """A small reproducible state dict."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for i in range(count):
        shape = (int(rng.integers(2, 9)), int(rng.integers(2, 17)))
        out[f"layer.{i}.weight"] = rng.standard_normal(shape).astype(np.float32)
    return out


def make_sharded(directory: Path, state: dict[str, np.ndarray], shards: int) -> Path:
    """Write ``state`` as ``shards`` files plus ``model.safetensors.index.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(state)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in part}, str(directory / file), {"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": sum(a.nbytes for a in state.values())}}
    index["weight_map"] = weight_map  # type: ignore[assignment]
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def flip_tensor_byte(path: Path, tensor: str) -> None:
    """Change the first byte of ``tensor``'s data in place (the header is untouched)."""
    from cmh import read_header

    header = read_header(path)
    entry = header.by_name()[tensor]
    offset = header.data_start + entry.begin
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def write_keypair(prefix: Path, passphrase: bytes | None = None) -> tuple[Path, Path, str]:
    """A key pair written with the library (not the CLI): private path, public path, key id."""
    from cmh import generate_keypair

    private_pem, public_pem, kid = generate_keypair(passphrase)
    private, public = prefix.with_suffix(".key"), prefix.with_suffix(".pub")
    private.write_bytes(private_pem)
    public.write_bytes(public_pem)
    return private, public, kid
